//! GPU counts as Slurm users write them: `--gpus [MODEL:]N` (the job's
//! total), `--gpus-per-node [MODEL:]N`, and `--gres gpu[:MODEL]:N` (per
//! node). gpool keeps GPUs per node; these turn the one into the other.

/// One GPU request: how many, and of which model if named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRequest {
    pub model: Option<String>,
    pub count: i64,
    /// `--gres mps:N`: N percent of one GPU (its memory and compute), as
    /// Slurm's MPS shares count a GPU as 100; `None`: whole GPUs.
    pub mps_pct: Option<u8>,
}

impl GpuRequest {
    /// `N` or `MODEL:N`, as `--gpus` and `--gpus-per-node` take them.
    pub fn parse(text: &str) -> Result<GpuRequest, String> {
        let (model, count) = match text.rsplit_once(':') {
            Some((model, count)) => (Some(model), count),
            None => (None, text),
        };
        let count = count
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("{text:?} is not a GPU count: give N or MODEL:N (h100:2)"))?;
        let model = match model.map(str::trim) {
            Some("") => return Err(format!("{text:?}: the GPU model before ':' is empty")),
            Some(model) if model.contains(':') => {
                return Err(format!("{text:?}: give N or MODEL:N (h100:2)"));
            }
            model => model.map(str::to_string),
        };
        Ok(GpuRequest {
            model,
            count,
            mps_pct: None,
        })
    }

    /// `gpu:N` or `gpu:MODEL:N`, as Slurm's `--gres` takes GPUs, or
    /// `mps:N`, N percent of one GPU (a fraction of it, `--gpu-fraction`
    /// with `--gpu-share`). Other generic resources are refused: gpool
    /// schedules GPUs.
    pub fn parse_gres(text: &str) -> Result<GpuRequest, String> {
        match text.split_once(':') {
            Some(("gpu", rest)) => GpuRequest::parse(rest),
            _ if text == "gpu" => Ok(GpuRequest {
                model: None,
                count: 1,
                mps_pct: None,
            }),
            Some(("mps", pct)) => match pct.trim().parse::<u8>() {
                Ok(pct @ 1..=99) => Ok(GpuRequest {
                    model: None,
                    count: 1,
                    mps_pct: Some(pct),
                }),
                _ => Err(format!(
                    "{text:?}: mps:N is N percent of one GPU, 1 to 99 (a whole GPU is gpu:1)"
                )),
            },
            Some(("shard", _)) => Err(format!(
                "{text:?}: gpool has no shards; ask for a part of a GPU with --gpu-fraction or --gres mps:PERCENT"
            )),
            _ => Err(format!(
                "{text:?}: gpool schedules GPUs only: give gpu:N, gpu:MODEL:N or mps:PERCENT"
            )),
        }
    }
}

/// GPUs per node, and the model if one was named, from `--gpus` (the job's
/// total, spread evenly over its nodes) or a per-node count. Refuses a total
/// that does not divide evenly, as gpool gives each node of a gang the same
/// share.
pub fn per_node(
    total: Option<&GpuRequest>,
    per_node: Option<&GpuRequest>,
    nodes: Option<i64>,
) -> Result<Option<GpuRequest>, String> {
    match (total, per_node) {
        (Some(_), Some(_)) => Err("--gpus is the job's total and --gpus-per-node each node's: give one".into()),
        (None, per_node) => Ok(per_node.cloned()),
        (Some(total), None) => {
            let nodes = nodes.unwrap_or(1);
            if nodes <= 1 || total.count <= 0 {
                return Ok(Some(total.clone()));
            }
            if total.count % nodes != 0 {
                return Err(format!(
                    "--gpus {} over {nodes} nodes: each node of a gang gets the same number; \
                     give a multiple of {nodes}, or --gpus-per-node",
                    total.count
                ));
            }
            Ok(Some(GpuRequest {
                model: total.model.clone(),
                count: total.count / nodes,
                mps_pct: None,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(model: Option<&str>, count: i64) -> GpuRequest {
        GpuRequest {
            mps_pct: None,
            model: model.map(str::to_string),
            count,
        }
    }

    #[test]
    fn slurm_forms_parse() {
        assert_eq!(GpuRequest::parse("4"), Ok(request(None, 4)));
        assert_eq!(GpuRequest::parse("h100:2"), Ok(request(Some("h100"), 2)));
        assert_eq!(GpuRequest::parse_gres("gpu:2"), Ok(request(None, 2)));
        assert_eq!(
            GpuRequest::parse_gres("gpu:a100-80gb:8"),
            Ok(request(Some("a100-80gb"), 8))
        );
        assert_eq!(GpuRequest::parse_gres("gpu"), Ok(request(None, 1)));
        for bad in ["", "two", ":2", "a:b:2", "h100:"] {
            assert!(GpuRequest::parse(bad).is_err(), "{bad}");
        }
        let err = GpuRequest::parse_gres("nvme:1").unwrap_err();
        assert!(err.contains("GPUs only"), "{err}");
        let mps = GpuRequest::parse_gres("mps:25").unwrap();
        assert_eq!((mps.count, mps.mps_pct), (1, Some(25)));
        for bad in ["mps:0", "mps:100", "mps:half"] {
            assert!(
                GpuRequest::parse_gres(bad).unwrap_err().contains("percent of one GPU"),
                "{bad}"
            );
        }
        assert!(GpuRequest::parse_gres("shard:2")
            .unwrap_err()
            .contains("--gpu-fraction"));
    }

    #[test]
    fn the_total_is_spread_evenly_over_the_nodes() {
        let total = request(Some("h100"), 16);
        assert_eq!(
            per_node(Some(&total), None, Some(2)),
            Ok(Some(request(Some("h100"), 8)))
        );
        assert_eq!(per_node(Some(&total), None, None), Ok(Some(total.clone())));
        let err = per_node(Some(&request(None, 6)), None, Some(4)).unwrap_err();
        assert!(err.contains("multiple of 4"), "{err}");
        let each = request(None, 4);
        assert_eq!(per_node(None, Some(&each), Some(3)), Ok(Some(each.clone())));
        assert!(per_node(Some(&total), Some(&each), None).is_err());
        assert_eq!(per_node(None, None, Some(2)), Ok(None));
        // Nonsense counts pass through, for the spec's own check to name.
        assert_eq!(
            per_node(Some(&request(None, -1)), None, Some(2)),
            Ok(Some(request(None, -1)))
        );
    }
}
