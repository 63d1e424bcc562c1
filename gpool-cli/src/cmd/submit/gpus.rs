//! The job's GPUs from -G, --gpus-per-node or --gres (Slurm's forms), or a
//! fraction of one from --gres mps:PERCENT.

use super::SubmitArgs;
use crate::CliError;
use gpool_core::spec::gpus::GpuRequest;

/// GPUs per node from -G, --gpus-per-node or --gres, and the model they
/// name (which must agree with --gpu-type).
pub(super) fn gpus_and_model(args: &mut SubmitArgs) -> Result<(Option<i64>, Option<String>), CliError> {
    let per_node = gpool_core::spec::gpus::per_node(
        args.gpus.as_ref(),
        args.gpus_per_node.clone().or(args.gres.clone()).as_ref(),
        args.nodes,
    )
    .map_err(CliError::Usage)?;
    let (gpus, model) = match per_node {
        // Slurm's MPS share: that part of one GPU's memory and compute.
        Some(GpuRequest { mps_pct: Some(pct), .. }) => {
            args.share.gpu_fraction = Some(format!("{pct}%"));
            args.share.gpu_share.get_or_insert(format!("{pct}%"));
            (None, None)
        }
        Some(GpuRequest { model, count, .. }) => (Some(count), model),
        None => (None, None),
    };
    let gpu_type = match (args.gpu_type.take(), model) {
        (Some(types), Some(model)) if types != model => {
            return Err(CliError::Usage(format!(
                "--gpu-type {types} and the GPU model {model} of --gpus: give the model once"
            )))
        }
        (types, model) => types.or(model),
    };
    Ok((gpus, gpu_type))
}
