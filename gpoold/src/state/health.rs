//! The state task's side of GPU health: each heartbeat's readings through
//! `gpool_core::health`, GPUs and nodes out of service and back, their jobs
//! requeued, and the operator's per-GPU drain.

use super::{Batch, State, Write};
use crate::error::Error;
use gpool_core::auth::Caller;
use gpool_core::health::{self, Change, GpuReading, HealthEvent, OutOfService, TakenBy, Transition};
use gpool_core::job_state::JobState;
use gpool_core::model::Node;
use gpool_core::{Epoch, JobId, Timestamp};
use gpool_proto::pb;

/// How a drain for a full spool begins, which tells it from an operator's.
pub const SPOOL_DRAIN: &str = "spool full: ";
/// How a drain for stuck GPU readings begins.
pub const READINGS_DRAIN: &str = "GPU readings stuck: ";

/// GPU `index`'s reading in a heartbeat: its (or, for a MIG slice, its
/// parent's) `sample` and Xids, and its MPS daemon's failures.
fn reading_of(
    sample: &pb::GpuSample,
    (index, physical): (u32, u32),
    (xids, mps_faults): (&[pb::XidEvent], &[pb::MpsFault]),
) -> GpuReading {
    GpuReading {
        temperature_c: sample.temperature_c,
        ecc_uncorrected: sample.ecc_uncorrected,
        remap_failure: sample.remap_failure,
        remap_pending: sample.remap_pending,
        xids: xids.iter().filter(|x| x.index == physical).map(|x| x.xid).collect(),
        mps_fault: (mps_faults.iter())
            .filter(|fault| fault.index == index)
            .map(|fault| fault.why.as_str())
            .collect::<Vec<_>>()
            .join("; "),
    }
}

impl State {
    /// Reads one heartbeat of `node` for faults: GPUs (or the node) with a
    /// fault leave service and their attempts are requeued; those quiet for
    /// the quiet period, with a passing health program, come back.
    pub(super) fn assess_health(
        &mut self,
        node: &str,
        samples: &[pb::GpuSample],
        (xids, mps_faults): (&[pb::XidEvent], &[pb::MpsFault]),
        check: Option<pb::HealthCheck>,
        now: Timestamp,
        out: &mut Batch,
    ) {
        let Some(known) = self.nodes.get(node) else { return };
        // A MIG slice reads as the GPU it is carved from.
        let indices: Vec<(u32, u32)> = known
            .gpus
            .iter()
            .map(|gpu| (gpu.index, gpu.mig_parent.unwrap_or(gpu.index)))
            .collect();
        if let Some(check) = &check {
            self.health_checks.insert(node.to_string(), check.clone());
        }
        // Without a health program, a re-read of the counters is the probe
        // for a GPU. A node its program drained returns only on a passing
        // run (not on a heartbeat from before the first run, after a reboot).
        let probe_passed = check.as_ref().is_none_or(|check| check.passed);
        let node_probe_passed = check.as_ref().is_some_and(|check| check.passed);
        let node_faults: Vec<String> = match &check {
            Some(check) if !check.passed => vec![format!("health program failed: {}", check.message)],
            _ => Vec::new(),
        };
        let node_change = health::decide(
            known.health_drain.as_ref(),
            &node_faults,
            node_probe_passed,
            &self.health_policy,
            now,
        );
        self.apply_node_change(node, node_change, now, out);
        // A heartbeat with no readings at all says nothing of each GPU (the
        // agent could not read any); missing GPUs are those left out of
        // readings of others.
        if samples.is_empty() && xids.is_empty() {
            return;
        }

        for (index, physical) in indices {
            let reading = (samples.iter())
                .find(|sample| sample.index == physical)
                .map(|sample| reading_of(sample, (index, physical), (xids, mps_faults)));
            let assessment = self.gpu_watch.entry((node.to_string(), index)).or_default().assess(
                reading.as_ref(),
                &self.health_policy,
                now,
            );
            for fault in &assessment.job_faults {
                self.record_job_fault(node, index, fault, now, out);
            }
            for note in assessment.notes {
                self.log_health(node, Some(index), Transition::Note, note, now, out);
            }
            let current = self.nodes.get(node).and_then(|n| n.gpus_out.get(&index));
            let change = health::decide(current, &assessment.faults, probe_passed, &self.health_policy, now);
            self.apply_gpu_change(
                node,
                index,
                change,
                (&assessment.faults, assessment.needs_reset),
                now,
                out,
            );
        }
    }

    /// The node's agent says something keeps new work off it (its spool
    /// is short of space, its GPU readings are stuck), or that it is over:
    /// the node is drained with that reason while it lasts (its jobs run
    /// on; only new work is kept off), and the drain is lifted once it is
    /// over, unless an operator drained the node meanwhile.
    pub(super) fn assess_agent_drain(&mut self, name: &str, prefix: &str, why: &str, now: Timestamp, out: &mut Batch) {
        let Some(node) = self.nodes.get_mut(name) else { return };
        let Some(reason) = health::agent_drain(node.drain_reason.as_deref(), prefix, why) else {
            return;
        };
        let note = match &reason {
            Some(_) => format!("drained: {why}"),
            None => format!("{prefix}over: drain lifted"),
        };
        tracing::info!(node = name, "{note}");
        node.drain_reason = reason;
        out.writes.push(Write::Node(name.to_string()));
        self.log_health(name, None, Transition::Note, note, now, out);
    }

    fn apply_node_change(&mut self, name: &str, change: Change, now: Timestamp, out: &mut Batch) {
        let Some(node) = self.nodes.get_mut(name) else { return };
        match change {
            Change::Keep => {}
            Change::TakeOut(reason) => {
                tracing::warn!(node = name, %reason, "node out of service");
                // An operator's drain stays the node's reason.
                if node.drain_reason.is_none() {
                    node.drain_reason = Some(reason.clone());
                }
                node.health_drain = Some(OutOfService {
                    reason: reason.clone(),
                    since: now,
                    by: TakenBy::Health,
                    last_fault_at: now,
                });
                let why = format!("{name} left service: {reason}");
                self.log_health(name, None, Transition::Failed, reason, now, out);
                self.requeue_jobs_on(name, (gpool_core::model::RequeueCause::NodeFault, &why), now, out);
            }
            Change::StillFaulty => {
                if let Some(drain) = node.health_drain.as_mut() {
                    drain.last_fault_at = now;
                    out.writes.push(Write::NodeFaultSeen(name.to_string()));
                }
            }
            Change::Return => {
                let Some(drain) = node.health_drain.take() else { return };
                if node.drain_reason.as_deref() == Some(drain.reason.as_str()) {
                    node.drain_reason = None;
                }
                tracing::info!(node = name, "node back in service");
                let reason = "quiet for the quiet period, health program passing".to_string();
                self.log_health(name, None, Transition::Returned, reason, now, out);
            }
        }
    }

    fn apply_gpu_change(
        &mut self,
        name: &str,
        index: u32,
        change: Change,
        (faults, needs_reset): (&[String], bool),
        now: Timestamp,
        out: &mut Batch,
    ) {
        let Some(node) = self.nodes.get_mut(name) else { return };
        // A fault only a GPU reset clears keeps it out until resumed.
        let (by, until) = if needs_reset && !self.health_policy.reset_faults_return {
            (
                TakenBy::UntilReset,
                "; out until an operator resets it and runs `gpool resume`",
            )
        } else {
            (TakenBy::Health, "")
        };
        match change {
            Change::Keep => {}
            Change::TakeOut(reason) => {
                let reason = format!("{reason}{until}");
                tracing::warn!(node = name, gpu = index, %reason, "GPU out of service");
                node.gpus_out.insert(
                    index,
                    OutOfService {
                        reason: reason.clone(),
                        since: now,
                        by,
                        last_fault_at: now,
                    },
                );
                self.log_health(name, Some(index), Transition::Failed, reason, now, out);
                self.requeue_jobs_on_gpu(name, index, now, out);
            }
            Change::StillFaulty => {
                let Some(gpu) = node.gpus_out.get_mut(&index) else {
                    return;
                };
                // The first fault of a pinned GPU is logged (it would have
                // taken the GPU out); later ones only keep it quiet-less.
                let first_while_pinned = gpu.by == TakenBy::Operator && gpu.last_fault_at == gpu.since;
                gpu.last_fault_at = now;
                // Out for a fault that passes, and now one that does not.
                if gpu.by == TakenBy::Health && by == TakenBy::UntilReset {
                    gpu.by = by;
                    gpu.reason = format!("{}{until}", faults.join("; "));
                }
                out.writes.push(Write::NodeFaultSeen(name.to_string()));
                if first_while_pinned {
                    let reason = format!("{} (while drained)", faults.join("; "));
                    self.log_health(name, Some(index), Transition::Failed, reason, now, out);
                }
            }
            Change::Return => {
                node.gpus_out.remove(&index);
                tracing::info!(node = name, gpu = index, "GPU back in service");
                let reason = "quiet for the quiet period, probe passing".to_string();
                self.log_health(name, Some(index), Transition::Returned, reason, now, out);
            }
        }
    }

    /// Keeps `reason` in the node's health log (and writes the node).
    pub(super) fn log_health(
        &mut self,
        name: &str,
        gpu: Option<u32>,
        transition: Transition,
        reason: String,
        now: Timestamp,
        out: &mut Batch,
    ) {
        let Some(node) = self.nodes.get_mut(name) else { return };
        health::record(
            &mut node.health_log,
            HealthEvent {
                at: now,
                gpu,
                transition,
                reason,
            },
        );
        out.writes.push(Write::Node(name.to_string()));
    }

    /// The node's inventory changed: each change goes in its health log,
    /// and the attempt on a GPU that left is requeued (the node's capacity
    /// changes; the node stays in service).
    pub(super) fn apply_drift(&mut self, node: &str, drift: Vec<health::Drift>, now: Timestamp, out: &mut Batch) {
        for change in drift {
            tracing::warn!(node, "{change}");
            let index = match change {
                health::Drift::Gone { index, .. } => {
                    self.requeue_jobs_on_gpu(node, index, now, out);
                    // Whatever comes at this index is another device.
                    self.gpu_watch.remove(&(node.to_string(), index));
                    index
                }
                health::Drift::Joined { index, .. } => index,
            };
            self.log_health(node, Some(index), Transition::Inventory, change.to_string(), now, out);
        }
    }

    /// The running attempt holding GPU `index` of `node`, if any.
    fn attempt_on_gpu(&self, node: &str, index: u32) -> Option<(JobId, Epoch)> {
        self.running_on
            .get(node)?
            .iter()
            .find_map(|id| match &self.jobs.get(id)?.state {
                JobState::Running { epoch, placement, .. }
                    if placement
                        .iter()
                        .any(|part| part.node == node && part.gpu_indices.contains(&index)) =>
                {
                    Some((*id, *epoch))
                }
                _ => None,
            })
    }

    /// Requeues the attempt on GPU `index` of `node` (all its ranks), as a
    /// lost node's: not the job's fault.
    fn requeue_jobs_on_gpu(&mut self, node: &str, index: u32, now: Timestamp, out: &mut Batch) {
        if let Some((job, epoch)) = self.attempt_on_gpu(node, index) {
            tracing::warn!(%job, node, gpu = index, "requeueing the attempt on a GPU out of service");
            let why = match self.nodes.get(node).and_then(|n| n.gpus_out.get(&index)) {
                Some(out_of_service) => format!("GPU {index} of {node} left service: {}", out_of_service.reason),
                None => format!("GPU {index} of {node} left service"),
            };
            let cause = (gpool_core::model::RequeueCause::GpuFault, why);
            self.lose_attempt(job, epoch, false, cause, now, out);
        }
    }

    /// An application Xid: kept in the history of the job on the GPU, and
    /// in the node's log.
    fn record_job_fault(&mut self, node: &str, index: u32, fault: &str, now: Timestamp, out: &mut Batch) {
        let holder = self.attempt_on_gpu(node, index).map(|(job, _)| job);
        if let Some(job) = holder.and_then(|id| self.jobs.get_mut(&id)) {
            job.record_event(now, format!("{fault} on GPU {index} of {node}"));
            out.writes.push(Write::Job(job.id));
        }
        let reason = match holder {
            Some(job) => format!("{fault}, job {job}"),
            None => fault.to_string(),
        };
        self.log_health(node, Some(index), Transition::JobFault, reason, now, out);
    }

    /// `gpool drain NODE --gpu IDX` (a pin: it never returns by itself), with
    /// `drain` its reason and whether the attempt on the GPU is requeued now
    /// (else it runs to its end); or `gpool resume NODE --gpu IDX` (`drain`
    /// `None`).
    pub(super) fn set_gpu_drain(
        &mut self,
        caller: &Caller,
        name: &str,
        index: u32,
        drain: Option<(String, bool)>,
        now: Timestamp,
        out: &mut Batch,
    ) -> Result<Node, Error> {
        let node = self.node_to_drain(caller, name, drain.is_some())?;
        if !node.gpus.iter().any(|gpu| gpu.index == index) {
            return Err(Error::InvalidRequest {
                field: "gpu",
                reason: format!(
                    "node {name} has no GPU {index} (its GPUs: {})",
                    node.gpus
                        .iter()
                        .map(|gpu| gpu.index.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        match drain {
            Some((reason, at_once)) => {
                node.gpus_out.insert(
                    index,
                    OutOfService {
                        reason: reason.clone(),
                        since: now,
                        by: TakenBy::Operator,
                        last_fault_at: now,
                    },
                );
                let text = format!("{reason} (by {})", caller.user);
                self.log_health(name, Some(index), Transition::Drained, text, now, out);
                if at_once {
                    self.requeue_jobs_on_gpu(name, index, now, out);
                }
            }
            None => match node.gpus_out.remove(&index) {
                // It faulted while pinned: it stays out until it is quiet.
                Some(pin) if pin.by == TakenBy::Operator && pin.last_fault_at != pin.since => {
                    node.gpus_out.insert(
                        index,
                        OutOfService {
                            reason: "a fault while it was drained; back once quiet".into(),
                            since: now,
                            by: TakenBy::Health,
                            last_fault_at: pin.last_fault_at,
                        },
                    );
                    let text = format!("resumed by {}, but it faulted while drained", caller.user);
                    self.log_health(name, Some(index), Transition::Failed, text, now, out);
                }
                Some(_) => {
                    let text = format!("resumed by {}", caller.user);
                    self.log_health(name, Some(index), Transition::Returned, text, now, out);
                }
                None => {}
            },
        }
        out.writes.push(Write::Node(name.to_string()));
        Ok(self.nodes[name].clone())
    }
}
