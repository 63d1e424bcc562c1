//! The job state machine: one enum, one transition function.
//!
//! `Job::apply` is the only code that writes a job's state. An event for an
//! attempt the job no longer runs (another epoch) is an `IllegalTransition`,
//! which is how stale reports from fenced attempts are refused.

use crate::ids::{Epoch, Timestamp};
use crate::model::{Job, NodePlacement};
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Running {
        epoch: Epoch,
        placement: Vec<NodePlacement>,
        started_at: Timestamp,
        /// Started beyond its team's guarantee: preemptible.
        #[serde(default)]
        burst: bool,
        /// The job reported a finished checkpoint at this time.
        #[serde(default)]
        last_checkpoint_at: Option<Timestamp>,
        /// Told to checkpoint and end at this time: however the attempt
        /// ends now, the job goes back to the queue.
        #[serde(default)]
        preempted_at: Option<Timestamp>,
    },
    Completed {
        started_at: Timestamp,
        ended_at: Timestamp,
    },
    Failed {
        started_at: Option<Timestamp>,
        ended_at: Timestamp,
        exit_code: Option<i32>,
        reason: String,
    },
    Cancelled {
        started_at: Option<Timestamp>,
        ended_at: Timestamp,
        by: String,
    },
    /// Its time limit ran out; `ended_at` is when its processes were gone.
    Timeout {
        started_at: Timestamp,
        ended_at: Timestamp,
    },
    /// Its node was lost (or drained at once) and it asked not to be
    /// requeued.
    NodeFail {
        started_at: Timestamp,
        ended_at: Timestamp,
    },
    /// Its memory limit's OOM killer ended it (its cgroup says so).
    OutOfMemory {
        started_at: Timestamp,
        ended_at: Timestamp,
    },
}

/// How an attempt's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobEvent {
    Start {
        epoch: Epoch,
        placement: Vec<NodePlacement>,
        burst: bool,
        now: Timestamp,
    },
    /// The scheduler reclaims the attempt's GPUs: it gets its checkpoint
    /// signal and grace, and the job is requeued when it ends.
    Preempt {
        epoch: Epoch,
        now: Timestamp,
        /// An operator's `gpool requeue`, not the scheduler: not counted
        /// as a preemption.
        by_operator: bool,
    },
    /// The scheduler no longer needs a preempted attempt's GPUs (the job
    /// they were taken for started elsewhere): it runs on as before, and
    /// the preemption is not counted.
    Rescind {
        epoch: Epoch,
        now: Timestamp,
    },
    /// The attempt reported a finished checkpoint.
    Checkpointed {
        epoch: Epoch,
        now: Timestamp,
    },
    Exited {
        epoch: Epoch,
        status: ExitStatus,
        now: Timestamp,
    },
    FailedToStart {
        epoch: Epoch,
        reason: String,
        now: Timestamp,
    },
    /// The attempt's time limit ran out and its node ended it.
    TimedOut {
        epoch: Epoch,
        now: Timestamp,
    },
    /// The OOM killer of the attempt's memory limit ended it.
    OutOfMemory {
        epoch: Epoch,
        now: Timestamp,
    },
    /// An attempt given up for lost (the job was requeued, and may run a
    /// newer attempt) reports that it ended while its node was away. Its
    /// end is the job's: a finished run is never run again.
    LateExit {
        epoch: Epoch,
        status: ExitStatus,
        now: Timestamp,
    },
    /// The attempt's node went away; the job goes back to the queue unless
    /// it asked not to be requeued.
    Lost {
        epoch: Epoch,
        requeue: bool,
        /// Its node went silent: the attempt may still run there and
        /// report its end later (rather than being killed by gpoold).
        silent: bool,
        now: Timestamp,
    },
    Cancel {
        by: String,
        now: Timestamp,
    },
    /// A pending job is held (not scheduled) or released.
    Hold {
        held: bool,
    },
    /// A pending job's dependency can never be met: it ends, saying why.
    DependencyNeverMet {
        reason: String,
        now: Timestamp,
    },
    /// Every task of an array ended: the array's record ends with them,
    /// completed only if every task completed.
    ArrayEnded {
        tasks: u32,
        not_completed: u32,
        first_started_at: Option<Timestamp>,
        now: Timestamp,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a {state} job cannot take the event {event}")]
pub struct IllegalTransition {
    pub state: &'static str,
    pub event: &'static str,
}

impl JobState {
    /// Lowercase name, as the CLI and its JSON print it.
    pub fn name(&self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running { .. } => "running",
            JobState::Completed { .. } => "completed",
            JobState::Failed { .. } => "failed",
            JobState::Cancelled { .. } => "cancelled",
            JobState::Timeout { .. } => "timeout",
            JobState::NodeFail { .. } => "node_fail",
            JobState::OutOfMemory { .. } => "out_of_memory",
        }
    }

    pub fn is_finished(&self) -> bool {
        matches!(
            self,
            JobState::Completed { .. }
                | JobState::Failed { .. }
                | JobState::Cancelled { .. }
                | JobState::Timeout { .. }
                | JobState::NodeFail { .. }
                | JobState::OutOfMemory { .. }
        )
    }

    pub fn started_at(&self) -> Option<Timestamp> {
        match self {
            JobState::Pending => None,
            JobState::Running { started_at, .. }
            | JobState::Completed { started_at, .. }
            | JobState::Timeout { started_at, .. }
            | JobState::NodeFail { started_at, .. }
            | JobState::OutOfMemory { started_at, .. } => Some(*started_at),
            JobState::Failed { started_at, .. } | JobState::Cancelled { started_at, .. } => *started_at,
        }
    }

    /// GPU-seconds a running attempt did since its last checkpoint (or its
    /// start): what ending it now would throw away.
    pub fn work_since_checkpoint(&self, now: Timestamp) -> f64 {
        match self {
            JobState::Running {
                placement,
                started_at,
                last_checkpoint_at,
                ..
            } => {
                let since = last_checkpoint_at.unwrap_or(*started_at).max(*started_at);
                let gpus: usize = placement.iter().map(|p| p.gpu_indices.len()).sum();
                (now.0 - since.0).max(0) as f64 / 1000.0 * gpus as f64
            }
            _ => 0.0,
        }
    }

    pub fn ended_at(&self) -> Option<Timestamp> {
        match self {
            JobState::Pending | JobState::Running { .. } => None,
            JobState::Completed { ended_at, .. }
            | JobState::Failed { ended_at, .. }
            | JobState::Cancelled { ended_at, .. }
            | JobState::Timeout { ended_at, .. }
            | JobState::NodeFail { ended_at, .. }
            | JobState::OutOfMemory { ended_at, .. } => Some(*ended_at),
        }
    }

    /// The transition function: the next state, or why there is none.
    pub fn apply(&self, event: &JobEvent) -> Result<JobState, IllegalTransition> {
        let illegal = || IllegalTransition {
            state: self.name(),
            event: event.name(),
        };
        match (self, event) {
            (
                JobState::Pending,
                JobEvent::Start {
                    epoch,
                    placement,
                    burst,
                    now,
                },
            ) => Ok(JobState::Running {
                epoch: *epoch,
                placement: placement.clone(),
                started_at: *now,
                burst: *burst,
                last_checkpoint_at: None,
                preempted_at: None,
            }),
            (running @ JobState::Running { epoch, .. }, event) if event.epoch() == Some(*epoch) => {
                running_changed(running, event).ok_or_else(illegal)
            }
            (JobState::Pending, JobEvent::DependencyNeverMet { reason, now }) => Ok(JobState::Failed {
                started_at: None,
                ended_at: *now,
                exit_code: None,
                reason: format!("its dependency can never be met: {reason}"),
            }),
            (
                JobState::Pending,
                JobEvent::ArrayEnded {
                    tasks,
                    not_completed,
                    first_started_at,
                    now,
                },
            ) => Ok(match (*not_completed, first_started_at) {
                (0, Some(started_at)) => JobState::Completed {
                    started_at: *started_at,
                    ended_at: *now,
                },
                _ => JobState::Failed {
                    started_at: *first_started_at,
                    ended_at: *now,
                    exit_code: None,
                    reason: format!("{not_completed} of its {tasks} tasks did not complete"),
                },
            }),
            (JobState::Pending, JobEvent::Cancel { by, now }) => Ok(JobState::Cancelled {
                started_at: None,
                ended_at: *now,
                by: by.clone(),
            }),
            (JobState::Running { started_at, .. }, JobEvent::Cancel { by, now }) => Ok(JobState::Cancelled {
                started_at: Some(*started_at),
                ended_at: *now,
                by: by.clone(),
            }),
            _ => Err(illegal()),
        }
    }
}

/// The state after an event of the running attempt itself.
// Long by design: the transition table of a running attempt, one arm per
// event, kept in one place so that every transition can be read at once.
fn running_changed(running: &JobState, event: &JobEvent) -> Option<JobState> {
    let JobState::Running {
        started_at,
        preempted_at,
        ..
    } = running
    else {
        return None;
    };
    let started_at = *started_at;
    let next = match event {
        JobEvent::Preempt { now, .. } if preempted_at.is_none() => {
            let mut next = running.clone();
            if let JobState::Running { preempted_at, .. } = &mut next {
                *preempted_at = Some(*now);
            }
            next
        }
        JobEvent::Rescind { .. } if preempted_at.is_some() => {
            let mut next = running.clone();
            if let JobState::Running { preempted_at, .. } = &mut next {
                *preempted_at = None;
            }
            next
        }
        JobEvent::Checkpointed { now, .. } => {
            let mut next = running.clone();
            if let JobState::Running { last_checkpoint_at, .. } = &mut next {
                *last_checkpoint_at = Some(*now);
            }
            next
        }
        // A preempted attempt, however it ends, sends the job back.
        JobEvent::Exited { .. }
        | JobEvent::TimedOut { .. }
        | JobEvent::OutOfMemory { .. }
        | JobEvent::FailedToStart { .. }
        | JobEvent::Lost { .. }
            if preempted_at.is_some() =>
        {
            JobState::Pending
        }
        JobEvent::Exited {
            status: ExitStatus::Code(0),
            now,
            ..
        } => JobState::Completed {
            started_at,
            ended_at: *now,
        },
        JobEvent::Exited {
            status: ExitStatus::Code(code),
            now,
            ..
        } => JobState::Failed {
            started_at: Some(started_at),
            ended_at: *now,
            exit_code: Some(*code),
            reason: format!("exited with code {code}"),
        },
        JobEvent::Exited {
            status: ExitStatus::Signal(signal),
            now,
            ..
        } => JobState::Failed {
            started_at: Some(started_at),
            ended_at: *now,
            exit_code: Some(128 + signal),
            reason: format!("killed by signal {signal}"),
        },
        JobEvent::TimedOut { now, .. } => JobState::Timeout {
            started_at,
            ended_at: *now,
        },
        JobEvent::OutOfMemory { now, .. } => JobState::OutOfMemory {
            started_at,
            ended_at: *now,
        },
        JobEvent::FailedToStart { reason, now, .. } => JobState::Failed {
            started_at: Some(started_at),
            ended_at: *now,
            exit_code: None,
            reason: format!("failed to start: {reason}"),
        },
        JobEvent::Lost { requeue: true, .. } => JobState::Pending,
        JobEvent::Lost {
            requeue: false, now, ..
        } => JobState::NodeFail {
            started_at,
            ended_at: *now,
        },
        JobEvent::Start { .. }
        | JobEvent::Cancel { .. }
        | JobEvent::Preempt { .. }
        | JobEvent::Rescind { .. }
        | JobEvent::LateExit { .. }
        | JobEvent::Hold { .. }
        | JobEvent::ArrayEnded { .. }
        | JobEvent::DependencyNeverMet { .. } => return None,
    };
    Some(next)
}

impl Job {
    /// The only writer of `Job::state`.
    // Long by design: the job's transition table, one arm per state and
    // event, kept whole as the one writer.
    pub fn apply(&mut self, event: &JobEvent) -> Result<(), IllegalTransition> {
        if let JobEvent::LateExit { epoch, status, now } = event {
            return self.apply_late_exit(*epoch, *status, *now);
        }
        if let JobEvent::Hold { held } = event {
            if self.state != JobState::Pending {
                return Err(IllegalTransition {
                    state: self.state.name(),
                    event: event.name(),
                });
            }
            self.held = *held;
            return Ok(());
        }
        let mut next = self.state.apply(event)?;
        if let (
            JobState::Running {
                started_at, placement, ..
            },
            JobState::Pending,
            Some(now),
        ) = (&self.state, &next, event.now())
        {
            let ran_ms = (now.0 - started_at.0).max(0) as u64;
            let gpus: u64 = placement.iter().map(|part| part.gpu_indices.len() as u64).sum();
            self.service_gpu_secs = crate::sched::las::service_after(self.service_gpu_secs, gpus, *started_at, now);
            self.requeued_at = Some(now);
            match self.time_left_secs() {
                // Its limit ran out before it was lost or taken back: it
                // would have been ended for it, so it ends so, and is not
                // run again.
                Some(left) if ran_ms >= left.saturating_mul(1000) => {
                    next = JobState::Timeout {
                        started_at: *started_at,
                        ended_at: now,
                    }
                }
                // A job that checkpoints resumes: its next attempt gets
                // what is left. One that does not starts over, with its
                // whole limit.
                // A second begun is a second spent.
                _ if self.spec.checkpoint_signal.is_some() => self.used_secs += ran_ms.div_ceil(1000),
                _ => {}
            }
        }
        // A preemption counts once it takes effect: the attempt ended and
        // the job waits again. The work since its last checkpoint before
        // the signal is lost (none if it checkpointed in its grace).
        if let (
            JobState::Running {
                preempted_at: Some(at), ..
            },
            JobState::Pending,
        ) = (&self.state, &next)
        {
            if self.requeue_cause == Some(crate::model::RequeueCause::Preempted) {
                self.n_preemptions += 1;
                self.lost_gpu_secs += self.state.work_since_checkpoint(*at).round() as u64;
            }
        }
        // An interactive session is not run again: its terminal and the
        // user at it ended with its attempt (Slurm requeues no interactive
        // job either). Taken back or lost, it ends.
        if let (JobState::Running { started_at, .. }, JobState::Pending, Some(now), Some(_)) =
            (&self.state, &next, event.now(), self.spec.pty)
        {
            next = JobState::Failed {
                started_at: Some(*started_at),
                ended_at: now,
                exit_code: None,
                reason:
                    "its interactive session ended with its attempt (preempted or its node lost); it is not run again"
                        .into(),
            };
        }
        match event {
            JobEvent::Start { placement, .. } => {
                if self.n_attempts > 0 && !self.last_nodes.is_empty() {
                    self.past_attempts.push(crate::model::PastAttempt {
                        attempt: self.n_attempts,
                        nodes: std::mem::take(&mut self.last_nodes).into_iter().collect(),
                    });
                    let excess = self.past_attempts.len().saturating_sub(crate::model::MAX_PAST_ATTEMPTS);
                    self.past_attempts.drain(..excess);
                }
                self.n_attempts += 1;
                self.last_nodes = placement.iter().map(|part| part.node.clone()).collect();
            }
            JobEvent::Preempt { by_operator: false, .. } => {
                self.requeue_cause = Some(crate::model::RequeueCause::Preempted);
            }
            JobEvent::Rescind { .. } => self.requeue_cause = None,
            JobEvent::Preempt { by_operator: true, .. } => {
                self.requeue_cause = Some(crate::model::RequeueCause::Requeued);
            }
            JobEvent::Lost {
                requeue: true,
                silent: true,
                ..
            } if next == JobState::Pending => {
                if let JobState::Running {
                    epoch,
                    started_at,
                    preempted_at: None,
                    ..
                } = &self.state
                {
                    self.lost_attempts.push(crate::model::LostAttempt {
                        epoch: *epoch,
                        started_at: *started_at,
                    });
                    let excess = self.lost_attempts.len().saturating_sub(crate::model::MAX_LOST_ATTEMPTS);
                    self.lost_attempts.drain(..excess);
                }
            }
            _ => {}
        }
        self.state = next;
        if self.state.is_finished() {
            self.lost_attempts.clear();
        }
        Ok(())
    }

    /// What is left of its time limit for its next (or current) attempt.
    pub fn time_left_secs(&self) -> Option<u64> {
        self.spec
            .time_limit_secs
            .map(|limit| limit.saturating_sub(self.used_secs))
    }

    /// A lost attempt's own end becomes the job's, whether the job waits
    /// in the queue or runs a newer attempt (which the caller then stops).
    fn apply_late_exit(&mut self, epoch: Epoch, status: ExitStatus, now: Timestamp) -> Result<(), IllegalTransition> {
        let illegal = IllegalTransition {
            state: self.state.name(),
            event: "late-exit",
        };
        let lost = self
            .lost_attempts
            .iter()
            .find(|lost| lost.epoch == epoch)
            .cloned()
            .ok_or(illegal.clone())?;
        if self.state.is_finished() {
            return Err(illegal);
        }
        let as_running = JobState::Running {
            epoch,
            placement: Vec::new(),
            started_at: lost.started_at,
            burst: false,
            last_checkpoint_at: None,
            preempted_at: None,
        };
        self.state = running_changed(&as_running, &JobEvent::Exited { epoch, status, now }).ok_or(illegal)?;
        self.lost_attempts.clear();
        Ok(())
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod events;
#[cfg(test)]
mod tests;
