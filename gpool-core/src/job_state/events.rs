//! What each event is called, when it happened, and which attempt it reports on.

use super::JobEvent;
use crate::ids::{Epoch, Timestamp};

impl JobEvent {
    pub fn name(&self) -> &'static str {
        match self {
            JobEvent::Start { .. } => "start",
            JobEvent::Exited { .. } => "exited",
            JobEvent::FailedToStart { .. } => "failed-to-start",
            JobEvent::Lost { .. } => "lost",
            JobEvent::Cancel { .. } => "cancel",
            JobEvent::Preempt { .. } => "preempt",
            JobEvent::Rescind { .. } => "rescind",
            JobEvent::Checkpointed { .. } => "checkpointed",
            JobEvent::TimedOut { .. } => "timed-out",
            JobEvent::OutOfMemory { .. } => "out-of-memory",
            JobEvent::LateExit { .. } => "late-exit",
            JobEvent::DependencyNeverMet { .. } => "dependency-never-met",
            JobEvent::Hold { .. } => "hold",
            JobEvent::ArrayEnded { .. } => "array-ended",
        }
    }

    /// When it happened, for the events that say.
    pub fn now(&self) -> Option<Timestamp> {
        match self {
            JobEvent::Start { now, .. }
            | JobEvent::Preempt { now, .. }
            | JobEvent::Rescind { now, .. }
            | JobEvent::Checkpointed { now, .. }
            | JobEvent::Exited { now, .. }
            | JobEvent::FailedToStart { now, .. }
            | JobEvent::TimedOut { now, .. }
            | JobEvent::OutOfMemory { now, .. }
            | JobEvent::LateExit { now, .. }
            | JobEvent::Lost { now, .. }
            | JobEvent::Cancel { now, .. }
            | JobEvent::DependencyNeverMet { now, .. }
            | JobEvent::ArrayEnded { now, .. } => Some(*now),
            JobEvent::Hold { .. } => None,
        }
    }

    /// The attempt an event reports on; `None` for events from users and the
    /// scheduler.
    pub fn epoch(&self) -> Option<Epoch> {
        match self {
            JobEvent::Exited { epoch, .. }
            | JobEvent::FailedToStart { epoch, .. }
            | JobEvent::Lost { epoch, .. }
            | JobEvent::Preempt { epoch, .. }
            | JobEvent::Rescind { epoch, .. }
            | JobEvent::Checkpointed { epoch, .. }
            | JobEvent::TimedOut { epoch, .. }
            | JobEvent::OutOfMemory { epoch, .. } => Some(*epoch),
            // Not the running attempt's: `Job::apply` matches it against
            // the lost ones.
            JobEvent::Start { .. }
            | JobEvent::Cancel { .. }
            | JobEvent::LateExit { .. }
            | JobEvent::Hold { .. }
            | JobEvent::ArrayEnded { .. }
            | JobEvent::DependencyNeverMet { .. } => None,
        }
    }
}
