//! Nodes for the Pool service: nodes as the API shows them, and draining and
//! resuming them (a whole node, or one of its GPUs).

use super::PoolService;
use crate::api::Identity;
use crate::error::Error;
use crate::state::{Command, State};
use gpool_core::model::Node;
use gpool_proto::convert::node_to_wire;
use gpool_proto::pb;
use tonic::{Response, Status};

impl PoolService {
    /// Drains a node, or one of its GPUs, for `who` (`DrainNode`).
    pub(super) async fn drain(
        &self,
        who: &Identity,
        request: pb::DrainNodeRequest,
    ) -> Result<Response<pb::Node>, Status> {
        let caller = who.caller.clone();
        let pb::DrainNodeRequest { name, reason, now, gpu } = request;
        if reason.trim().is_empty() {
            return Err(Error::InvalidRequest {
                field: "reason",
                reason: "say why the node is drained".into(),
            }
            .into());
        }
        let object = match gpu {
            Some(gpu) => format!("node {name} GPU {gpu}"),
            None => format!("node {name}"),
        };
        let result = self
            .state
            .call(|reply| Command::Drain {
                caller,
                node: name,
                reason,
                at_once: now,
                gpu,
                reply,
            })
            .await
            .map_err(Status::from);
        self.audit(who, "drain", &object, true, &result);
        let node = result?;
        Ok(Response::new(self.node_to_wire(&node)))
    }

    /// Resumes a drained node, or one of its GPUs, for `who` (`ResumeNode`).
    pub(super) async fn resume(
        &self,
        who: &Identity,
        request: pb::ResumeNodeRequest,
    ) -> Result<Response<pb::Node>, Status> {
        let caller = who.caller.clone();
        let pb::ResumeNodeRequest { name, gpu } = request;
        let object = match gpu {
            Some(gpu) => format!("node {name} GPU {gpu}"),
            None => format!("node {name}"),
        };
        let result = self
            .state
            .call(|reply| Command::Resume {
                caller,
                node: name,
                gpu,
                reply,
            })
            .await
            .map_err(Status::from);
        self.audit(who, "resume", &object, true, &result);
        let node = result?;
        Ok(Response::new(self.node_to_wire(&node)))
    }

    fn node_to_wire(&self, node: &Node) -> pb::Node {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        nodes_to_wire(&state, std::iter::once(node)).remove(0)
    }
}

/// Nodes as the API shows them: which job holds each GPU, and its latest
/// heartbeat sample.
pub(super) fn nodes_to_wire<'a>(state: &State, nodes: impl Iterator<Item = &'a Node>) -> Vec<pb::Node> {
    let holders = state.gpu_holders();
    let shares = state.gpu_shares();
    nodes
        .map(|node| {
            let mut wire = node_to_wire(node, |gpu_idx| {
                holders.get(&(node.name.as_str(), gpu_idx)).map(|id| id.0)
            });
            wire.health_check = state.health_checks.get(&node.name).cloned();
            let samples = state.gpu_samples.get(&node.name).map_or(&[][..], Vec::as_slice);
            for gpu in &mut wire.gpus {
                // A MIG slice's readings are its parent's.
                let physical = gpu.mig_parent.unwrap_or(gpu.index);
                gpu.sample = samples.iter().find(|sample| sample.index == physical).copied();
                if let Some(shared) = shares.get(&(node.name.as_str(), gpu.index)) {
                    (gpu.shared_used_mib, gpu.shared_jobs) = (shared.used_mib, shared.jobs);
                }
            }
            wire.pools = state
                .policy
                .pools
                .iter()
                .filter(|pool| pool.selects(&node.labels))
                .map(|pool| pool.name.clone())
                .collect();
            let now = crate::wall_clock();
            wire.reservations = state
                .policy
                .reservations
                .iter()
                .filter(|r| r.end > now && r.nodes.contains(&node.name))
                .map(|r| pb::NodeReservation {
                    name: r.name.clone(),
                    start_ms: r.start.0,
                    end_ms: r.end.0,
                })
                .collect();
            power_to_wire(state, &mut wire, now);
            wire
        })
        .collect()
}

/// A node of a `[[power]]` group: its power state, and down while it is
/// not up.
fn power_to_wire(state: &State, wire: &mut pb::Node, now: gpool_core::Timestamp) {
    let Some(power) = state.power.nodes.get(&wire.name) else {
        return;
    };
    let group = &state.power.groups[power.group];
    wire.power_group = group.name.clone();
    wire.power_state = power.state.as_str().to_string();
    wire.power_since_ms = power.since.0;
    wire.power_reason = power.reason.clone().unwrap_or_default();
    wire.power_group_paused = state.power.paused(power.group, now).unwrap_or_default();
    if power.state != gpool_core::power::PowerState::Up {
        wire.state = pb::NodeState::Down as i32;
    }
}
