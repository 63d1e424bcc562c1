//! `schedule(&ClusterView, &Policy, now) -> Plan`: the whole placement decision.
//!
//! Pending jobs go in priority order, then submit order (job id). Each job
//! gets the best-fitting GPUs there are: the node group (GPUs of one model on
//! one node) with the fewest free GPUs that still fit, so large holes stay
//! open for large jobs; within the node, the best-connected GPUs (NVLink
//! before PCIe, `Topology::choose`). A gang (`nodes > 1`) gets `gpus_per_node` GPUs on
//! each of `nodes` distinct nodes of one model, or nothing. A job that does
//! not fit is skipped and the next one is tried (greedy; reservations for
//! blocked jobs come with backfill).

mod index;
mod plan;

pub use plan::{Plan, Reject, Start};

use crate::ids::{JobId, Timestamp};
use crate::model::{GpuModel, Node, PoolDef};
use crate::topology::Topology;
use index::FreeIndex;
use std::collections::BTreeMap;

/// What the scheduler sees: nodes with their free GPUs, and the queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub nodes: Vec<NodeView>,
    pub pending: Vec<PendingJob>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    Up,
    Draining,
    Down,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub availability: Availability,
    pub gpus: Vec<GpuView>,
    pub topology: Topology,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuView {
    pub index: u32,
    pub model: GpuModel,
    /// Held by a running attempt.
    pub busy: bool,
}

/// The part of a pending job the scheduler needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingJob {
    pub id: JobId,
    pub priority: i32,
    pub gpus_per_node: u32,
    pub nodes: u32,
    /// Acceptable models; empty means any.
    pub gpu_types: Vec<GpuModel>,
    /// Empty means the policy's default pool.
    pub pool: String,
}

/// The operator's rules. Teams, QoS and fair share extend this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub pools: Vec<PoolDef>,
    pub default_pool: String,
}

impl Default for Policy {
    /// One pool, `default`, holding every node.
    fn default() -> Policy {
        Policy {
            pools: vec![PoolDef {
                name: "default".into(),
                selector: BTreeMap::new(),
            }],
            default_pool: "default".into(),
        }
    }
}

impl Policy {
    /// The pool a job named (empty: the default pool).
    pub fn pool(&self, name: &str) -> Option<&PoolDef> {
        let name = if name.is_empty() {
            self.default_pool.as_str()
        } else {
            name
        };
        self.pools.iter().find(|pool| pool.name == name)
    }
}

impl NodeView {
    /// The scheduler's view of a node; `busy` lists the GPU indices running
    /// attempts hold.
    pub fn from_node(node: &Node, busy: &[u32]) -> NodeView {
        let availability = if !node.alive {
            Availability::Down
        } else if node.drain_reason.is_some() {
            Availability::Draining
        } else {
            Availability::Up
        };
        NodeView {
            name: node.name.clone(),
            labels: node.labels.clone(),
            availability,
            gpus: node
                .gpus
                .iter()
                .map(|gpu| GpuView {
                    index: gpu.index,
                    model: gpu.model.clone(),
                    busy: busy.contains(&gpu.index),
                })
                .collect(),
            topology: node.topology.clone(),
        }
    }
}

/// Decides which pending jobs start now and where. `now` is unused until
/// time-based policy (ages, reservations) arrives, and is taken so that every
/// caller already passes the one clock reading the decision may use.
pub fn schedule(view: &ClusterView, policy: &Policy, _now: Timestamp) -> Plan {
    let mut index = FreeIndex::build(&view.nodes, policy);
    let mut order: Vec<&PendingJob> = view.pending.iter().collect();
    order.sort_by_key(|job| (std::cmp::Reverse(job.priority), job.id));
    let mut plan = Plan::default();
    for job in order {
        match index.place(job, policy) {
            Ok(placement) => plan.starts.push(Start { job: job.id, placement }),
            Err(reasons) => plan.pending.push((job.id, reasons)),
        }
    }
    plan
}

#[cfg(test)]
mod tests;
