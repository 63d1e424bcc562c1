//! Attempt events from agents: a start, an exit, a failure or refusal to
//! start, a fence; and a lost attempt's late report of how it ended.

use super::kill_message;
use crate::state::{AgentEvent, AttemptOutcome, Batch, State};
use gpool_core::job_state::{ExitStatus, JobEvent, JobState};
use gpool_core::{Epoch, JobId, Timestamp};

impl State {
    /// An attempt's report. Reports from attempts that are not the job's
    /// current one are refused (and a stale attempt that started is killed).
    pub(in crate::state) fn agent_event(
        &mut self,
        node: &str,
        conn_id: u64,
        event: AgentEvent,
        now: Timestamp,
        out: &mut Batch,
    ) {
        // Only the node's current link speaks for it (not one that was
        // replaced, or ended because its certificate was revoked).
        if !self.is_current_link(node, conn_id) {
            tracing::warn!(node, job = %event.job, "event from a link that no longer speaks for the node ignored");
            return;
        }
        self.heartbeat(node, conn_id);
        let current = self.attempt_on(event.job, node);
        if current != Some(event.epoch) {
            self.stale_event(node, &event, now, out);
            return;
        }
        let Some(job) = self.jobs.get(&event.job) else {
            return;
        };
        let n_nodes = job.spec.nodes;
        // A preempted attempt ends at its first rank's exit.
        let preempted = matches!(
            job.state,
            JobState::Running {
                preempted_at: Some(_),
                ..
            }
        );
        let (id, epoch) = (event.job, event.epoch);
        let Some((job_event, note)) = self.job_event_of(node, event, (n_nodes, preempted), now, out) else {
            return;
        };
        let placement = match self.jobs.get(&id).map(|job| &job.state) {
            Some(JobState::Running { placement, .. }) => placement.clone(),
            _ => Vec::new(),
        };
        if let (Some(note), Some(job)) = (note, self.jobs.get_mut(&id)) {
            job.record_event(now, note);
        }
        if self.apply_event(id, &job_event, now, out) {
            // One rank failing ends the whole gang.
            for part in placement.into_iter().filter(|part| part.node != node) {
                out.messages.push((part.node, kill_message(id, epoch)));
            }
        }
    }

    /// Handles a report from an attempt that is not the job's current one:
    /// a stale attempt that started is killed, a late exit recorded.
    fn stale_event(&mut self, node: &str, event: &AgentEvent, now: Timestamp, out: &mut Batch) {
        match &event.outcome {
            AttemptOutcome::Started => out
                .messages
                .push((node.to_string(), kill_message(event.job, event.epoch))),
            // Only an exit code is surely the job's own end: a signal
            // may have come from the node going away.
            AttemptOutcome::Exited(status @ ExitStatus::Code(_)) => {
                self.late_exit(event.job, event.epoch, *status, now, out)
            }
            AttemptOutcome::Exited(ExitStatus::Signal(_))
            | AttemptOutcome::Stopped(_)
            | AttemptOutcome::TimedOut
            | AttemptOutcome::OutOfMemory
            | AttemptOutcome::FailedToStart(_)
            | AttemptOutcome::Refused(_)
            | AttemptOutcome::OutputLimit
            | AttemptOutcome::Fenced => {
                tracing::debug!(job = %event.job, epoch = %event.epoch, "stale attempt event ignored")
            }
        }
    }

    /// The job event an attempt's report makes, with a note for the job's
    /// record; `None` where it makes none (yet).
    fn job_event_of(
        &mut self,
        node: &str,
        event: AgentEvent,
        (n_nodes, preempted): (u32, bool),
        now: Timestamp,
        out: &mut Batch,
    ) -> Option<(JobEvent, Option<String>)> {
        let mut note = None;
        let job_event = match event.outcome {
            AttemptOutcome::Started => return None,
            AttemptOutcome::Exited(ExitStatus::Code(0)) if !preempted => {
                // Counted per node: one node reporting twice ends nothing.
                let done = &mut self.attempt_mut(event.job).gang_exits;
                done.insert(node.to_string());
                if (done.len() as u32) < n_nodes {
                    return None;
                }
                JobEvent::Exited {
                    epoch: event.epoch,
                    status: ExitStatus::Code(0),
                    now,
                }
            }
            AttemptOutcome::Exited(status) | AttemptOutcome::Stopped(status) => JobEvent::Exited {
                epoch: event.epoch,
                status,
                now,
            },
            AttemptOutcome::FailedToStart(reason) => JobEvent::FailedToStart {
                epoch: event.epoch,
                reason: format!("on {node}: {reason}"),
                now,
            },
            AttemptOutcome::Refused(reason) => {
                self.refused_launch(event.job, event.epoch, &reason, now, out);
                return None;
            }
            AttemptOutcome::OutputLimit => {
                note = Some(format!(
                    "on {node}: its output passed the node's max_output, and the node ended it"
                ));
                JobEvent::Exited {
                    epoch: event.epoch,
                    status: ExitStatus::Signal(9),
                    now,
                }
            }
            AttemptOutcome::TimedOut => JobEvent::TimedOut {
                epoch: event.epoch,
                now,
            },
            AttemptOutcome::OutOfMemory => JobEvent::OutOfMemory {
                epoch: event.epoch,
                now,
            },
            // The node lost this controller for longer than its lease (and
            // came back before the node timeout): the job goes back to the
            // queue, as it would have after the timeout, and says why.
            AttemptOutcome::Fenced => {
                let why = format!(
                    "on {node}: the node heard from no controller for longer than its lease, and stopped the attempt"
                );
                let cause = (gpool_core::model::RequeueCause::NodeLost, why);
                self.end_lost(event.job, event.epoch, (Some(true), false), cause, now, out);
                return None;
            }
        };
        Some((job_event, note))
    }

    /// A lost attempt of `job` (its node was given up, the job requeued)
    /// reports how it ended while away. A single-node job ends with that
    /// result; a newer attempt it runs is stopped. A gang's late rank is
    /// not enough to know how the gang ended, so it is ignored.
    fn late_exit(&mut self, job_id: JobId, epoch: Epoch, status: ExitStatus, now: Timestamp, out: &mut Batch) {
        let Some(job) = self.jobs.get(&job_id) else { return };
        if job.spec.nodes != 1 || !job.lost_attempts.iter().any(|lost| lost.epoch == epoch) {
            tracing::debug!(job = %job_id, %epoch, "stale attempt event ignored");
            return;
        }
        let newer = match &job.state {
            JobState::Running { epoch, placement, .. } => Some((*epoch, placement.clone())),
            _ => None,
        };
        let event = JobEvent::LateExit { epoch, status, now };
        if self.apply_event(job_id, &event, now, out) {
            tracing::info!(job = %job_id, %epoch, "a lost attempt reported its end late: the job ends with it");
            if let Some((newer_epoch, placement)) = newer {
                for part in placement {
                    out.messages.push((part.node, kill_message(job_id, newer_epoch)));
                }
            }
        }
    }
}
