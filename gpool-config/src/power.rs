//! `[[power]]`: groups of nodes that sleep when idle, or are created in a
//! cloud on demand, and the programs that wake and suspend them.

use super::*;
use gpool_core::power::{
    hostlist, Group, DEFAULT_PAUSE_AFTER_FAILURES, DEFAULT_PAUSE_SECS, DEFAULT_RESUME_TIMEOUT_SECS,
    DEFAULT_SUSPEND_AFTER_SECS, DEFAULT_SUSPEND_TIMEOUT_SECS,
};

/// `[[power]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PowerFile {
    name: String,
    /// `cloud-h100-[1-16]`, or a list of names (each may be a pattern).
    nodes: NodesFile,
    model: String,
    gpus: u32,
    gpu_memory: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    price_per_gpu_hour: Option<f64>,
    resume: PathBuf,
    suspend: PathBuf,
    resume_failed: Option<PathBuf>,
    suspend_after: Option<String>,
    resume_timeout: Option<String>,
    suspend_timeout: Option<String>,
    resume_rate: Option<u32>,
    suspend_rate: Option<u32>,
    max_nodes: Option<u32>,
    max_gpu_hours: Option<f64>,
    max_nodes_per_team: Option<u32>,
    max_gpu_hours_per_team: Option<f64>,
    pause_after_failures: Option<u32>,
    pause: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NodesFile {
    Pattern(String),
    List(Vec<String>),
}

/// A group, and the programs gpoold runs for it: each gets the node names
/// (comma-separated) as its first argument; `resume` also gets a JSON file
/// of the jobs that wanted them as its second.
#[derive(Debug, Clone, PartialEq)]
pub struct PowerGroup {
    pub group: Group,
    pub resume: PathBuf,
    pub suspend: PathBuf,
    pub resume_failed: Option<PathBuf>,
}

/// The most GPUs a node of a group may have.
pub const MAX_GPUS: u32 = 1024;

pub(crate) fn power_of(
    groups: Vec<toml::Spanned<PowerFile>>,
    accounting: &Accounting,
    pools: &Policy,
    invalid: from_file::Invalid,
) -> Result<Vec<PowerGroup>, ConfigError> {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut out: Vec<PowerGroup> = Vec::new();
    for spanned in groups {
        let offset = spanned.span().start;
        let file = spanned.into_inner();
        let name_ok = !file.name.is_empty()
            && file
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok || out.iter().any(|group| group.group.name == file.name) {
            return Err(invalid(
                offset,
                format!(
                    "power: name {:?} is used twice, or is not letters, digits, '-', '_' and '.'",
                    file.name
                ),
            ));
        }
        let name = file.name.clone();
        let named = |field: &str, reason: String| invalid(offset, format!("power {name:?}: {field}: {reason}"));
        let per_team = [
            ("max_nodes_per_team", file.max_nodes_per_team.is_some()),
            ("max_gpu_hours_per_team", file.max_gpu_hours_per_team.is_some()),
        ];
        if let Some((field, _)) = per_team
            .iter()
            .find(|(_, set)| *set)
            .filter(|_| pools.sharing.teams.is_empty())
        {
            return Err(named(
                field,
                "needs [[team]] tables: without them any user may name any team, so a per-team budget binds \
                 nobody; cap the whole group with max_nodes instead"
                    .into(),
            ));
        }
        let nodes = nodes_of(&file, &mut seen).map_err(|reason| named("nodes", reason))?;
        out.push(group_of(file, nodes, accounting, pools, &named)?);
    }
    Ok(out)
}

/// The group's node names, each in no other group.
fn nodes_of(file: &PowerFile, seen: &mut BTreeMap<String, String>) -> Result<Vec<String>, String> {
    let patterns = match &file.nodes {
        NodesFile::Pattern(pattern) => std::slice::from_ref(pattern),
        NodesFile::List(list) => list.as_slice(),
    };
    let mut nodes = Vec::new();
    for pattern in patterns {
        nodes.extend(hostlist::expand(pattern)?);
    }
    if nodes.is_empty() {
        return Err("name at least one node".into());
    }
    for node in &nodes {
        if let Some(other) = seen.insert(node.clone(), file.name.clone()) {
            return Err(format!("{node} is in power group {other:?} too"));
        }
    }
    Ok(nodes)
}

/// The rest of a group's table, checked field by field.
fn group_of(
    file: PowerFile,
    nodes: Vec<String>,
    accounting: &Accounting,
    pools: &Policy,
    named: &dyn Fn(&str, String) -> ConfigError,
) -> Result<PowerGroup, ConfigError> {
    if file.gpus == 0 || file.gpus > MAX_GPUS {
        return Err(named("gpus", format!("{} is not from 1 to {MAX_GPUS}", file.gpus)));
    }
    let model = GpuModel::new(&file.model);
    let duration = |field: &str, text: &Option<String>, default: u64| -> Result<u64, ConfigError> {
        match text {
            None => Ok(default),
            Some(text) => parse_duration(text).map_err(|reason| named(field, reason)),
        }
    };
    let suspend_after_secs = match file.suspend_after.as_deref() {
        Some("never") => None,
        _ => Some(duration(
            "suspend_after",
            &file.suspend_after,
            DEFAULT_SUSPEND_AFTER_SECS,
        )?),
    };
    let resume_timeout_secs = duration("resume_timeout", &file.resume_timeout, DEFAULT_RESUME_TIMEOUT_SECS)?;
    if resume_timeout_secs == 0 {
        return Err(named("resume_timeout", "must be at least 1s".into()));
    }
    let gpu_memory_mib = match &file.gpu_memory {
        None => None,
        Some(text) => {
            Some(gpool_core::spec::parse_size(text).map_err(|reason| named("gpu_memory", reason))? / (1024 * 1024))
        }
    };
    let price_per_gpu_hour = match file.price_per_gpu_hour {
        Some(price) if !(price >= 0.0 && price.is_finite()) => {
            return Err(named("price_per_gpu_hour", format!("{price} is not a price")))
        }
        Some(price) => price,
        None => accounting.pricing.per_gpu_hour.get(&model).copied().unwrap_or(0.0),
    };
    let hours = |field: &str, value: Option<f64>| match value {
        Some(hours) if !(hours >= 0.0 && hours.is_finite()) => {
            Err(named(field, format!("{hours} is not a number of GPU-hours")))
        }
        other => Ok(other),
    };
    if !pools.pools.iter().any(|pool| pool.selects(&file.labels)) {
        return Err(named(
            "labels",
            "no [[pool]] selects these labels, so no job could run there".into(),
        ));
    }
    Ok(PowerGroup {
        group: Group {
            name: file.name,
            nodes,
            model,
            gpus: file.gpus,
            gpu_memory_mib,
            labels: file.labels,
            price_per_gpu_hour,
            suspend_after_secs,
            resume_timeout_secs,
            suspend_timeout_secs: duration("suspend_timeout", &file.suspend_timeout, DEFAULT_SUSPEND_TIMEOUT_SECS)?,
            resume_rate: file.resume_rate.unwrap_or(0),
            suspend_rate: file.suspend_rate.unwrap_or(0),
            max_nodes: file.max_nodes,
            max_gpu_hours: hours("max_gpu_hours", file.max_gpu_hours)?,
            max_nodes_per_team: file.max_nodes_per_team,
            max_gpu_hours_per_team: hours("max_gpu_hours_per_team", file.max_gpu_hours_per_team)?,
            pause_after_failures: file.pause_after_failures.unwrap_or(DEFAULT_PAUSE_AFTER_FAILURES),
            pause_secs: duration("pause", &file.pause, DEFAULT_PAUSE_SECS)?,
        },
        resume: file.resume,
        suspend: file.suspend,
        resume_failed: file.resume_failed,
    })
}
