//! The scheduler's output: which jobs start where, and why the others wait.

use crate::ids::JobId;
use crate::model::{GpuModel, NodePlacement};
use std::fmt;

/// What one scheduling cycle decided. Pure data: gpoold turns it into
/// commands, the simulator into events, tests into snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub starts: Vec<Start>,
    /// Every pending job that does not start, with at least one reason.
    pub pending: Vec<(JobId, Vec<Reject>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub job: JobId,
    /// One entry per node, in rank order (rank 0 first).
    pub placement: Vec<NodePlacement>,
}

/// Why a job did not start, with what was wanted and what there was.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reject {
    UnknownPool {
        pool: String,
    },
    /// The pool has no known node at all (no agent registered yet).
    NoNodes {
        pool: String,
    },
    /// Nodes exist but none takes new work.
    NodesUnavailable {
        pool: String,
        n_down: usize,
        n_draining: usize,
    },
    /// Reported beside another reason: some nodes of the pool are out.
    SomeNodesUnavailable {
        pool: String,
        n_down: usize,
        n_draining: usize,
    },
    /// No schedulable node of the pool has a GPU of an acceptable model.
    NoGpuModel {
        pool: String,
        wanted: Vec<GpuModel>,
        available: Vec<GpuModel>,
    },
    /// The models exist but not enough of them are free right now.
    Resources {
        gpus_per_node: u32,
        nodes: u32,
        total_free: u64,
        max_free_on_one_node: u32,
        n_nodes_with_enough: usize,
    },
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for start in &self.starts {
            write!(f, "start j{}", start.job)?;
            for node in &start.placement {
                write!(f, " {node}")?;
            }
            writeln!(f)?;
        }
        for (job, reasons) in &self.pending {
            let words: Vec<String> = reasons.iter().map(Reject::to_string).collect();
            writeln!(f, "pending j{job}: {}", words.join("; "))?;
        }
        Ok(())
    }
}

fn models(list: &[GpuModel]) -> String {
    let names: Vec<&str> = list.iter().map(GpuModel::as_str).collect();
    names.join(", ")
}

fn plural(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reject::UnknownPool { pool } => write!(f, "unknown pool {pool:?}"),
            Reject::NoNodes { pool } => write!(f, "no nodes: pool {pool:?} has no known node yet"),
            Reject::NodesUnavailable {
                pool,
                n_down,
                n_draining,
            } => write!(
                f,
                "no node of pool {pool:?} takes new work ({n_down} down, {n_draining} draining or drained)"
            ),
            Reject::SomeNodesUnavailable {
                pool,
                n_down,
                n_draining,
            } => write!(
                f,
                "pool {pool:?} has {n_down} down and {n_draining} draining or drained"
            ),
            Reject::NoGpuModel {
                pool,
                wanted,
                available,
            } => write!(
                f,
                "no GPU of model {} on an available node of pool {pool:?} (it has: {})",
                if wanted.is_empty() {
                    "any".to_string()
                } else {
                    models(wanted)
                },
                if available.is_empty() {
                    "none".to_string()
                } else {
                    models(available)
                }
            ),
            Reject::Resources {
                gpus_per_node,
                nodes: 1,
                total_free,
                max_free_on_one_node,
                ..
            } => write!(
                f,
                "wants {} on one node; {} free in total but at most {max_free_on_one_node} on one node",
                plural(u64::from(*gpus_per_node), "GPU", "GPUs"),
                *total_free
            ),
            Reject::Resources {
                gpus_per_node,
                nodes,
                total_free,
                n_nodes_with_enough,
                ..
            } => write!(
                f,
                "wants {} on each of {nodes} nodes; {} that many free ({} free in total)",
                plural(u64::from(*gpus_per_node), "GPU", "GPUs"),
                plural(*n_nodes_with_enough as u64, "node has", "nodes have"),
                *total_free
            ),
        }
    }
}
