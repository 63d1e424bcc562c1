//! What narrows where a job may run, in the words of its pending reasons:
//! its requirements, its CPUs and memory per node, and the limits it asks
//! nodes to enforce.

use super::{NodeView, PendingJob, Reject};
use crate::enforce::{EnforceLimits, LimitSet};
use crate::model::NvlinkNeed;

/// `GPUs of at least 40960 MiB, NVLink required, labels rack=r1, only on
/// n1,n2, not on n3`.
/// What narrows where a job may run, in words: its requirements, and its
/// CPUs and memory per node.
/// Node lists name only nodes of the job's pool (`in_pool`, by node name):
/// others are no part of why it waits there.
pub(super) fn narrowing_words(job: &PendingJob, in_pool: &dyn Fn(&str) -> bool) -> String {
    let mut words: Vec<String> = job
        .shape
        .requires
        .as_deref()
        .map(|requires| requirement_words(requires, in_pool))
        .into_iter()
        .collect();
    if let Some(ask) = job.shape.host {
        let mut host = Vec::new();
        if ask.cpus > 0 {
            host.push(format!("{} free CPUs", ask.cpus));
        }
        if ask.memory_bytes > 0 {
            host.push(format!(
                "{:.1} GiB of free memory",
                ask.memory_bytes as f64 / (1u64 << 30) as f64
            ));
        }
        if !host.is_empty() {
            words.push(format!("{} on each node", host.join(" and ")));
        }
    }
    if job.shape.exclusive {
        words.push("nodes with nothing else running (--exclusive)".into());
    }
    words.retain(|w| !w.is_empty());
    words.join(", ")
}

fn requirement_words(requires: &crate::model::Requirements, in_pool: &dyn Fn(&str) -> bool) -> String {
    let mut words = Vec::new();
    if requires.min_gpu_memory_mib > 0 {
        words.push(format!("GPUs of at least {} MiB", requires.min_gpu_memory_mib));
    }
    if requires.nvlink != NvlinkNeed::Any {
        words.push(format!("NVLink {}", requires.nvlink.as_str()));
    }
    if !requires.constraints.is_empty() {
        let pairs: Vec<String> = requires.constraints.iter().map(|(k, v)| format!("{k}={v}")).collect();
        words.push(format!("labels {}", pairs.join(",")));
    }
    if !requires.nodelist.is_empty() {
        words.push(format!("only on {}", requires.nodelist.join(",")));
    }
    let excluded: Vec<&str> = requires
        .exclude
        .iter()
        .map(String::as_str)
        .filter(|name| in_pool(name))
        .collect();
    if !excluded.is_empty() {
        words.push(format!("not on {}", excluded.join(",")));
    }
    words.join(", ")
}

/// Most nodes a reason names of those that do not enforce a job's limits.
const MOST_NAMED: usize = 3;

/// Under `refuse`, where some of `nodes` (those of its pool with GPUs of
/// a model it takes) would be its but for the limits it asks for, which
/// they do not enforce: those limits, and those nodes (each once, by
/// name). `None` where every node its requirements allow enforces them.
pub(super) fn unenforced<'n>(
    job: &PendingJob,
    nodes: impl Iterator<Item = &'n NodeView>,
    mode: EnforceLimits,
) -> Option<Reject> {
    if mode == EnforceLimits::Warn || job.shape.limits.is_empty() {
        return None;
    }
    let mut missing = LimitSet::NONE;
    let mut names = std::collections::BTreeSet::new();
    for node in nodes.filter(|node| job.allows_node(node)) {
        let lacking = crate::enforce::unenforced(job.shape.limits, Some(node.enforces));
        if !lacking.is_empty() {
            missing = missing.union(lacking);
            names.insert(node.name.as_str());
        }
    }
    (!names.is_empty()).then(|| Reject::Unenforced {
        limits: missing,
        n_nodes: names.len(),
        nodes: names.into_iter().take(MOST_NAMED).map(String::from).collect(),
    })
}
