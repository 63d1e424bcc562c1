//! Job states on the wire: from the core's, and by name.

use crate::pb;
use gpool_core::job_state::JobState;

pub fn state_to_wire(state: &JobState) -> pb::JobState {
    match state {
        JobState::Pending => pb::JobState::Pending,
        JobState::Running { .. } => pb::JobState::Running,
        JobState::Completed { .. } => pb::JobState::Completed,
        JobState::Failed { .. } => pb::JobState::Failed,
        JobState::Cancelled { .. } => pb::JobState::Cancelled,
        JobState::Timeout { .. } => pb::JobState::Timeout,
        JobState::NodeFail { .. } => pb::JobState::NodeFail,
        JobState::OutOfMemory { .. } => pb::JobState::OutOfMemory,
    }
}

/// Whether a job in `state` has ended (for good, whatever how).
pub fn is_ended(state: pb::JobState) -> bool {
    matches!(
        state,
        pb::JobState::Completed
            | pb::JobState::Failed
            | pb::JobState::Cancelled
            | pb::JobState::Timeout
            | pb::JobState::NodeFail
            | pb::JobState::OutOfMemory
    )
}

/// The lowercase name the CLI prints and its JSON carries.
pub fn state_name(state: pb::JobState) -> &'static str {
    match state {
        pb::JobState::Unspecified => "unknown",
        pb::JobState::Pending => "pending",
        pb::JobState::Running => "running",
        pb::JobState::Completed => "completed",
        pb::JobState::Failed => "failed",
        pb::JobState::Cancelled => "cancelled",
        pb::JobState::Timeout => "timeout",
        pb::JobState::NodeFail => "node_fail",
        pb::JobState::OutOfMemory => "out_of_memory",
    }
}

/// Parses a state name as users type it (`--state running`).
pub fn state_from_name(name: &str) -> Option<pb::JobState> {
    [
        pb::JobState::Pending,
        pb::JobState::Running,
        pb::JobState::Completed,
        pb::JobState::Failed,
        pb::JobState::Cancelled,
        pb::JobState::Timeout,
        pb::JobState::NodeFail,
        pb::JobState::OutOfMemory,
    ]
    .into_iter()
    .find(|state| state_name(*state) == name.to_ascii_lowercase())
}
