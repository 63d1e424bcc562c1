//! The state task's side of agents: registration and reconciliation, starts
//! and their Launch messages, attempt events, and nodes that go silent.

mod events;

use super::{AgentConn, AgentEvent, Batch, PendingReply, State, Write};
use crate::error::Error;
use gpool_core::job_state::{JobEvent, JobState};
use gpool_core::model::Node;
use gpool_core::model::RequeueCause;
use gpool_core::sched::Start;
use gpool_core::share::SharedGpu;
use gpool_core::{Epoch, JobId, Timestamp};
use gpool_proto::pb;
use std::collections::{HashMap, HashSet};

/// The largest Launch gpoold sends: what any agent decodes (a spec within
/// `gpool_core::spec` limits is far smaller).
const MAX_LAUNCH_BYTES: usize = gpool_proto::MAX_MESSAGE_BYTES / 2;

/// Seconds between SIGTERM and SIGKILL when gpoold ends an attempt.
const KILL_GRACE_SECS: u32 = 10;

pub fn kill_message(job: JobId, epoch: Epoch) -> pb::ControllerMessage {
    pb::ControllerMessage {
        term: 0,
        msg: Some(pb::controller_message::Msg::Kill(pb::Kill {
            job_id: job.0,
            epoch: epoch.0,
            grace_seconds: KILL_GRACE_SECS,
        })),
    }
}

pub fn signal_message(job: JobId, epoch: Epoch, signal: i32) -> pb::ControllerMessage {
    pb::ControllerMessage {
        term: 0,
        msg: Some(pb::controller_message::Msg::Signal(pb::Signal {
            job_id: job.0,
            epoch: epoch.0,
            signal,
        })),
    }
}

/// GPUs held as a batch of starts is applied: whole, or shared by
/// fractions (each shared GPU's book, as the scheduler keeps it).
struct Taken {
    whole: HashSet<(String, u32)>,
    shared: HashMap<(String, u32), SharedGpu>,
}

impl State {
    /// Applies the scheduler's starts that still fit the state as it is now
    /// (the view they came from may be stale), and queues their Launches.
    pub(super) fn start(&mut self, starts: Vec<Start>, now: Timestamp, out: &mut Batch) {
        let mut busy = self.taken_gpus();
        for start in starts {
            // A task of an array becomes a job as it starts, within the
            // array's %N.
            if let Some((array, _)) = self.array_of(start.job).filter(|_| !self.jobs.contains_key(&start.job)) {
                let array_ready = self.jobs.get(&array).is_some_and(|array| {
                    array.state == JobState::Pending
                        && !array.held
                        && self.dependency_state_of(array) == gpool_core::deps::DepState::Met
                });
                if !array_ready
                    || !self.array_may_start(array)
                    || !self.still_free(&start, &busy)
                    || !self.materialize(start.job, out)
                {
                    continue;
                }
            }
            let array_full = self
                .jobs
                .get(&start.job)
                .and_then(|job| job.array_task)
                .is_some_and(|task| !self.array_may_start(task.array));
            if array_full || !self.still_fits(&start, &busy) {
                continue;
            }
            let epoch = Epoch(self.next_epoch);
            let event = JobEvent::Start {
                epoch,
                placement: start.placement.clone(),
                burst: start.burst,
                now,
            };
            if !self.apply_event(start.job, &event, now, out) {
                continue;
            }
            self.next_epoch += 1;
            self.claims_met(start.job);
            self.warn_unenforced(start.job, &start.placement, now, out);
            if let Some(job) = self.jobs.get(&start.job) {
                let waited = (now.0 - job.submitted_at.0).max(0) as f64 / 1000.0;
                self.metrics
                    .queue_wait_seconds
                    .get_or_create(&vec![("team", job.spec.team.to_string())])
                    .observe(waited);
            }
            self.take(&mut busy, &start);
            out.writes.push(Write::NextEpoch);
            let launches = self.launch_messages(start.job, epoch, &start.placement);
            // A spec from before today's limits may not fit in a message an
            // agent takes: the job fails alone, its node is never cut off.
            if let Some(size) = launches
                .iter()
                .map(|(_, message)| prost::Message::encoded_len(message))
                .find(|size| *size > MAX_LAUNCH_BYTES)
            {
                let event = JobEvent::FailedToStart {
                    epoch,
                    reason: format!(
                        "its Launch message is {size} bytes, more than an agent takes ({MAX_LAUNCH_BYTES})"
                    ),
                    now,
                };
                self.apply_event(start.job, &event, now, out);
                continue;
            }
            out.messages.extend(launches);
        }
    }

    fn still_fits(&self, start: &Start, busy: &Taken) -> bool {
        // Held, or waiting for a dependency, since the plan's snapshot.
        let pending = self.jobs.get(&start.job).is_some_and(|job| {
            job.state == JobState::Pending
                && !job.held
                && self.dependency_state_of(job) == gpool_core::deps::DepState::Met
        });
        pending && self.still_free(start, busy) && self.enforcement_allows(start.job, &start.placement)
    }

    /// Its nodes take work and its GPUs are free (or, for a fraction,
    /// shared by fractions only, with room for it).
    fn still_free(&self, start: &Start, busy: &Taken) -> bool {
        start.placement.iter().all(|part| {
            let Some(node) = self.nodes.get(&part.node).filter(|node| node.schedulable()) else {
                return false;
            };
            self.links.contains_key(&part.node)
                && self.power.takes_work(&part.node)
                && part.gpu_indices.iter().all(|index| {
                    let key = (part.node.clone(), *index);
                    let room = match (&start.share, busy.shared.get(&key)) {
                        (None, shared) => shared.is_none(),
                        (Some(share), shared) => {
                            let user = self.start_user(start.job).unwrap_or_default();
                            let fresh = || SharedGpu::new(self.usable_mib(&part.node, *index).unwrap_or(0));
                            let gpu = shared.cloned().unwrap_or_else(fresh);
                            gpu.takes(share, &user, &self.policy.sharing.shares)
                        }
                    };
                    room && !busy.whole.contains(&key) && !node.gpus_out.contains_key(index)
                })
        })
    }

    /// Who a start runs for (an array task's user is its array's).
    fn start_user(&self, id: JobId) -> Option<String> {
        let job = match self.jobs.get(&id) {
            Some(job) => job,
            None => self.jobs.get(&self.array_of(id)?.0)?,
        };
        Some(job.user.to_string())
    }

    /// `start`'s GPUs are held from now on.
    fn take(&self, busy: &mut Taken, start: &Start) {
        for part in &start.placement {
            for index in &part.gpu_indices {
                let key = (part.node.clone(), *index);
                match &start.share {
                    Some(share) => {
                        let usable = self.usable_mib(&part.node, *index).unwrap_or(0);
                        let user = self.start_user(start.job).unwrap_or_default();
                        (busy.shared.entry(key).or_insert_with(|| SharedGpu::new(usable))).add(share, &user);
                    }
                    None => {
                        busy.whole.insert(key);
                    }
                }
            }
        }
    }

    /// The GPUs running attempts hold: whole, or shared by fractions.
    fn taken_gpus(&self) -> Taken {
        let shared: HashMap<(String, u32), SharedGpu> = (self.gpu_shares().into_iter())
            .map(|((node, gpu), book)| ((node.to_string(), gpu), book))
            .collect();
        let whole = (self.gpu_holders().into_keys())
            .map(|(node, gpu)| (node.to_string(), gpu))
            .filter(|key| !shared.contains_key(key))
            .collect();
        Taken { whole, shared }
    }

    /// An agent (re)connected: record its node, apply what ended while it was
    /// away, then reconcile. Attempts it runs that are not wanted are killed;
    /// attempts this controller thinks run there but the agent neither runs
    /// nor reported ended are lost and requeued.
    pub(super) fn register_agent(
        &mut self,
        mut node: Node,
        running: Vec<(JobId, Epoch)>,
        ended: Vec<AgentEvent>,
        conn: AgentConn,
        now: Timestamp,
        out: &mut Batch,
    ) -> Result<(), Error> {
        let name = node.name.clone();
        self.check_takeover(&name, &node)?;
        self.power.registered(&name, now);
        // GPUs that left or joined since the node's last registration.
        let drift = self
            .nodes
            .get(&name)
            .map(|known| gpool_core::health::drift(&known.gpus, &node.gpus))
            .unwrap_or_default();
        let reset_by_reboot = self.carry_over_known(&name, &mut node);
        node.alive = true;
        self.nodes.insert(name.clone(), node);
        out.writes.push(Write::Node(name.clone()));
        for gpu in reset_by_reboot {
            let note = "the node rebooted, which reset this GPU: back in service".to_string();
            self.log_health(
                &name,
                Some(gpu),
                gpool_core::health::Transition::Returned,
                note,
                now,
                out,
            );
        }
        let conn_id = conn.id;
        self.links.insert(name.clone(), conn);
        self.last_seen.insert(name.clone(), std::time::Instant::now());
        self.down_since.remove(&name);
        // The Register counts as heartbeat 0; its lease goes out before any
        // Launch (the link's messages keep their order).
        self.grant_lease(&name, 0);
        // What ended while the link was down counts before reconciling.
        for event in ended {
            self.agent_event(&name, conn_id, event, now, out);
        }

        self.reconcile_running(&name, running, now, out);
        self.apply_drift(&name, drift, now, out);
        Ok(())
    }

    /// Refuses a registration that may not take the node over from the
    /// link that holds it.
    fn check_takeover(&self, name: &str, node: &Node) -> Result<(), Error> {
        let silent_ms = self
            .links
            .contains_key(name)
            .then(|| self.last_seen.get(name).map(|seen| seen.elapsed().as_millis() as i64))
            .flatten();
        let held_by = self.nodes.get(name).map_or("", |known| known.boot_id.as_str());
        gpool_core::fencing::may_take_over(silent_ms, held_by, &node.boot_id, self.node_timeout_ms).map_err(|reason| {
            tracing::warn!(node = %name, "refusing an agent's registration: {reason}");
            Error::InvalidRequest {
                field: "node",
                reason: format!("node {name}: {reason}"),
            }
        })
    }

    /// Keeps what the state knew of a registering node (drains, health, GPUs
    /// out of service): the GPUs its reboot reset.
    fn carry_over_known(&self, name: &str, node: &mut Node) -> Vec<u32> {
        let Some(known) = self.nodes.get(name) else {
            return Vec::new();
        };
        node.drain_reason = known.drain_reason.clone();
        node.drained_by = known.drained_by.clone();
        node.health_drain = known.health_drain.clone();
        node.health_log = known.health_log.clone();
        // GPUs still there (same index, same device) stay out of
        // service; one gone from the inventory is forgotten.
        let same_device = |index: u32| {
            let uuid_of = |gpus: &[gpool_core::model::Gpu]| {
                gpus.iter().find(|gpu| gpu.index == index).map(|gpu| gpu.uuid.clone())
            };
            uuid_of(&node.gpus).is_some_and(|uuid| uuid_of(&known.gpus) == Some(uuid))
        };
        // A reboot resets the GPUs: faults that waited for a reset are
        // over (the next readings tell whether the GPU is sound).
        let reset = gpool_core::health::reset_by_reboot(&known.boot_id, &node.boot_id, &known.gpus_out);
        node.gpus_out = known
            .gpus_out
            .iter()
            .filter(|(index, _)| same_device(**index) && !reset.contains(index))
            .map(|(index, out)| (*index, out.clone()))
            .collect();
        reset
    }

    /// Kills the attempts a registering agent runs that are not wanted, and
    /// requeues those it should run but does not.
    fn reconcile_running(&mut self, name: &str, running: Vec<(JobId, Epoch)>, now: Timestamp, out: &mut Batch) {
        let reported: HashSet<(JobId, Epoch)> = running.iter().copied().collect();
        for (job_id, epoch) in running {
            if self.attempt_on(job_id, name) != Some(epoch) {
                tracing::info!(job = %job_id, %epoch, node = %name, "agent runs an attempt that is not wanted; killing it");
                out.messages.push((name.to_string(), kill_message(job_id, epoch)));
            }
        }
        let vanished: Vec<(JobId, Epoch)> = self
            .active_jobs()
            .filter_map(|job| match &job.state {
                JobState::Running { epoch, placement, .. } if placement.iter().any(|p| p.node == *name) => {
                    Some((job.id, *epoch))
                }
                _ => None,
            })
            .filter(|attempt| !reported.contains(attempt))
            .collect();
        for (job_id, epoch) in vanished {
            tracing::warn!(job = %job_id, node = %name, "attempt is gone from its node; requeueing");
            let why = format!("its attempt was gone from {name} when the agent came back");
            self.lose_attempt(job_id, epoch, false, (RequeueCause::NodeLost, why), now, out);
        }
    }

    /// The epoch of `job`'s running attempt if it has a part on `node`.
    fn attempt_on(&self, job: JobId, node: &str) -> Option<Epoch> {
        match &self.jobs.get(&job)?.state {
            JobState::Running { epoch, placement, .. } if placement.iter().any(|p| p.node == node) => Some(*epoch),
            _ => None,
        }
    }

    /// Ends a running attempt whose node was lost or drained at once: the job
    /// goes back to the queue (or fails, if it asked not to be requeued) and
    /// all the attempt's ranks are killed.
    /// `silent`: its node stopped answering (the attempt may still report
    /// its end), rather than this controller ending it.
    /// Ends attempt `epoch` of `job_id` for a reason not its own (`cause`,
    /// and `why` in words for its events) and requeues it where it allows.
    pub(super) fn lose_attempt(
        &mut self,
        job_id: JobId,
        epoch: Epoch,
        silent: bool,
        (cause, why): (RequeueCause, String),
        now: Timestamp,
        out: &mut Batch,
    ) {
        self.end_lost(job_id, epoch, (None, silent), (cause, why), now, out);
    }

    /// `node` would not start attempt `epoch` of `job_id` (its spool is
    /// full): nothing of it ran, so it goes back to the queue whether or
    /// not it may be requeued, and its other ranks are stopped.
    fn refused_launch(&mut self, job_id: JobId, epoch: Epoch, reason: &str, now: Timestamp, out: &mut Batch) {
        let why = (RequeueCause::NodeFault, reason.to_string());
        self.end_lost(job_id, epoch, (Some(true), false), why, now, out);
    }

    /// Ends a lost attempt: requeued as `requeue` says (`None`: as the job
    /// allows), its ranks stopped.
    fn end_lost(
        &mut self,
        job_id: JobId,
        epoch: Epoch,
        (requeue, silent): (Option<bool>, bool),
        (cause, why): (RequeueCause, String),
        now: Timestamp,
        out: &mut Batch,
    ) {
        let Some(job) = self.jobs.get(&job_id) else { return };
        let placement = match &job.state {
            JobState::Running { placement, .. } => placement.clone(),
            _ => return,
        };
        let event = JobEvent::Lost {
            epoch,
            requeue: requeue.unwrap_or(job.spec.requeue),
            silent,
            now,
        };
        if self.apply_event(job_id, &event, now, out) {
            if let Some(job) = self.jobs.get_mut(&job_id) {
                let requeued = job.state == JobState::Pending;
                if requeued {
                    job.requeue_cause = Some(cause);
                }
                job.record_event(now, if requeued { format!("{why}; requeued") } else { why });
            }
            for part in placement {
                out.messages.push((part.node, kill_message(job_id, epoch)));
            }
        }
    }

    /// Ends every attempt with a part on `node` (its node is down, or drained
    /// at once) and requeues their jobs.
    pub(super) fn requeue_jobs_on(
        &mut self,
        node: &str,
        (cause, why): (RequeueCause, &str),
        now: Timestamp,
        out: &mut Batch,
    ) {
        let attempts: Vec<(JobId, Epoch)> = self
            .active_jobs()
            .filter_map(|job| self.attempt_on(job.id, node).map(|epoch| (job.id, epoch)))
            .collect();
        for (job_id, epoch) in attempts {
            self.lose_attempt(job_id, epoch, false, (cause, why.to_string()), now, out);
        }
    }

    /// Whether `conn_id` is the link that speaks for `node` now.
    pub(super) fn is_current_link(&self, node: &str, conn_id: u64) -> bool {
        self.links.get(node).is_some_and(|conn| conn.id == conn_id)
    }

    pub(super) fn heartbeat(&mut self, node: &str, conn_id: u64) {
        if self.is_current_link(node, conn_id) {
            self.last_seen.insert(node.to_string(), std::time::Instant::now());
        }
    }

    /// Answers heartbeat `seq` of `node`'s agent: its requeueable attempts
    /// may run until half the node timeout after it sent that heartbeat,
    /// then get a quarter of it to end. A quarter stays as margin for
    /// delays in delivering, scheduling and killing, so the attempts are
    /// gone before this controller gives the node up and requeues them.
    pub(super) fn grant_lease(&self, node: &str, seq: u64) {
        let Some(conn) = self.links.get(node) else { return };
        let terms = gpool_core::fencing::lease_terms(self.node_timeout_ms);
        let lease = pb::Lease {
            heartbeat_seq: seq,
            fence_after_ms: terms.fence_after_ms,
            fence_grace_ms: terms.grace_ms,
        };
        let _ = conn.outbox.send(pb::ControllerMessage {
            term: 0,
            msg: Some(pb::controller_message::Msg::Lease(lease)),
        });
    }

    pub(super) fn agent_gone(&mut self, node: &str, conn_id: u64, now: Timestamp) {
        if self.links.get(node).is_some_and(|conn| conn.id == conn_id) {
            self.links.remove(node);
            self.power.gone(node, now);
        }
    }

    /// Nodes not heard from for the node timeout become down. Their
    /// requeueable attempts are lost and requeued (the node stopped them
    /// itself when its lease ran out); the others keep their GPUs until the
    /// node returns and says how they fared, or is removed. Nodes down for
    /// longer than `forget_nodes_after` are forgotten.
    pub(super) fn mark_silent_nodes_down(&mut self, now: Timestamp, out: &mut Batch) {
        let silent: std::collections::BTreeSet<String> = self
            .nodes
            .values()
            .filter(|node| node.alive)
            .filter(|node| {
                self.last_seen
                    .get(&node.name)
                    .is_none_or(|last| last.elapsed().as_millis() as i64 > self.node_timeout_ms)
            })
            .map(|node| node.name.clone())
            .collect();
        if !silent.is_empty() {
            for name in &silent {
                tracing::warn!(node = %name, "no heartbeat for {} ms: node is down", self.node_timeout_ms);
                if let Some(node) = self.nodes.get_mut(name) {
                    node.alive = false;
                }
                self.links.remove(name);
                self.down_since.insert(name.clone(), std::time::Instant::now());
                out.writes.push(Write::Node(name.clone()));
            }
            // One pass over the jobs, however many nodes went down at once.
            let lost: Vec<(JobId, Epoch)> = self
                .active_jobs()
                .filter(|job| job.spec.requeue)
                .filter_map(|job| match &job.state {
                    JobState::Running { epoch, placement, .. }
                        if placement.iter().any(|p| silent.contains(&p.node)) =>
                    {
                        Some((job.id, *epoch))
                    }
                    _ => None,
                })
                .collect();
            for (job_id, epoch) in lost {
                let why = format!("no heartbeat from its node for {} ms", self.node_timeout_ms);
                self.lose_attempt(job_id, epoch, true, (RequeueCause::NodeLost, why), now, out);
            }
        }
        let Some(forget_after) = self.forget_nodes_after else {
            return;
        };
        let forgotten: Vec<String> = self
            .down_since
            .iter()
            .filter(|(_, since)| since.elapsed() > forget_after)
            .map(|(name, _)| name.clone())
            .collect();
        for name in forgotten {
            // Kept until the attempts that hold its GPUs end.
            if self.node_holds_attempts(&name) {
                continue;
            }
            tracing::info!(node = %name, "down for longer than forget_nodes_after: node forgotten");
            self.forget_node(&name, out);
        }
    }

    /// Whether an attempt that has not ended holds GPUs of `node`.
    pub(super) fn node_holds_attempts(&self, node: &str) -> bool {
        self.active_jobs().any(|job| self.attempt_on(job.id, node).is_some())
    }

    /// Removes `node` from memory and disk.
    pub(super) fn forget_node(&mut self, node: &str, out: &mut Batch) {
        self.nodes.remove(node);
        self.links.remove(node);
        self.last_seen.remove(node);
        self.down_since.remove(node);
        self.gpu_samples.remove(node);
        out.writes.push(Write::ForgetNode(node.to_string()));
    }

    /// A reply for the flusher that hands Launch and Kill messages to the
    /// agents' links once their batch is durable.
    pub(super) fn deliver_after_flush(&self, messages: Vec<(String, pb::ControllerMessage)>) -> PendingReply {
        let outboxes: HashMap<String, super::Outbox> = messages
            .iter()
            .filter_map(|(node, _)| self.links.get(node).map(|conn| (node.clone(), conn.outbox.clone())))
            .collect();
        Box::new(move |flushed| {
            if flushed.is_err() {
                return;
            }
            for (node, message) in messages {
                if let Some(outbox) = outboxes.get(&node) {
                    let _ = outbox.send(message);
                }
            }
        })
    }

    /// Sends a message that changes no state to `node`'s agent at once.
    pub(super) fn send_now(&self, node: &str, message: pb::ControllerMessage) -> Result<(), crate::error::Error> {
        let conn = self
            .links
            .get(node)
            .ok_or_else(|| crate::error::Error::NodeNotLinked(node.to_string()))?;
        conn.outbox.try_send(message).map_err(|not_sent| match not_sent {
            super::outbox::NotSent::Gone => crate::error::Error::NodeNotLinked(node.to_string()),
            super::outbox::NotSent::InputFull => crate::error::Error::OverLimit(format!(
                "node {node} has {} messages of terminal input waiting for it: type again in a moment",
                super::outbox::INPUT_CAPACITY
            )),
        })
    }

    /// Whether `node` has a connected agent.
    pub fn is_linked(&self, node: &str) -> bool {
        self.links.contains_key(node)
    }
}
