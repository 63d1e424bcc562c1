//! gpoold's errors, and their one mapping onto gRPC statuses.

use gpool_core::auth::Denied;
use gpool_core::feasibility::Infeasible;
use gpool_core::spec::SpecError;
use gpool_core::JobId;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("job {0} not found")]
    UnknownJob(JobId),
    #[error("node {0:?} not found (known nodes come from registered agents)")]
    UnknownNode(String),
    #[error("{}{source}", spec_position(*index, *of))]
    InvalidSpec { index: usize, of: usize, source: SpecError },
    #[error("{}{source}", spec_position(*index, *of))]
    Infeasible {
        index: usize,
        of: usize,
        source: Infeasible,
    },
    #[error("{field}: {reason}")]
    InvalidRequest { field: &'static str, reason: String },
    #[error("{0}")]
    Denied(#[from] Denied),
    #[error("{}{source}", spec_position(*index, *of))]
    SubmitDenied { index: usize, of: usize, source: Denied },
    /// A per-user cap (`max_submit_per_user`) refuses the request.
    #[error("{0}")]
    OverLimit(String),
    #[error("token {0} does not exist")]
    UnknownToken(u64),
    #[error("node {node:?} still runs {jobs}: cancel them, or drain it with --now, before removing it")]
    NodeBusy { node: String, jobs: String },
    #[error("node {0:?} has no connected agent right now")]
    NodeNotLinked(String),
    #[error("job {0} has not started, so it has no output yet")]
    NotStarted(JobId),
    #[error("job {0} is not running")]
    NotRunning(JobId),
    #[error("job {0} was submitted with --discard-output: it has no output to show")]
    OutputDiscarded(JobId),
    #[error("missing or invalid caller identity: {0}")]
    Unauthenticated(String),
    #[error("the state store failed: {0}")]
    Storage(String),
    #[error("record {key} in tree {tree:?} cannot be read: {reason}")]
    CorruptRecord {
        tree: &'static str,
        key: String,
        reason: String,
    },
    #[error("history file {file} cannot be read: {reason}")]
    CorruptHistory { file: String, reason: String },
    #[error("redo log {file} cannot be read: {reason}")]
    CorruptRedo { file: String, reason: String },
    #[error("state dir has schema version {found}; this gpoold reads up to version {supported}")]
    SchemaTooNew { found: u32, supported: u32 },
    #[error("gpoold is shutting down")]
    ShuttingDown,
}

/// Which spec of a request an error is about: nothing for a request of one
/// (the user knows which), "job 3 of 12 in the request: " in a batch.
fn spec_position(index: usize, of: usize) -> String {
    if of <= 1 {
        String::new()
    } else {
        format!("job {index} of {of} in the request: ")
    }
}

impl From<sled::Error> for Error {
    fn from(err: sled::Error) -> Error {
        Error::Storage(err.to_string())
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        let code = match &err {
            Error::UnknownJob(_) | Error::UnknownNode(_) | Error::UnknownToken(_) => Code::NotFound,
            Error::InvalidSpec { .. } | Error::InvalidRequest { .. } => Code::InvalidArgument,
            Error::Infeasible { .. } => Code::FailedPrecondition,
            Error::Denied(_) | Error::SubmitDenied { .. } => Code::PermissionDenied,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::OverLimit(_) => Code::ResourceExhausted,
            Error::ShuttingDown => Code::Unavailable,
            Error::NodeBusy { .. }
            | Error::NodeNotLinked(_)
            | Error::NotStarted(_)
            | Error::OutputDiscarded(_)
            | Error::NotRunning(_) => Code::FailedPrecondition,
            Error::Storage(_)
            | Error::CorruptRecord { .. }
            | Error::CorruptHistory { .. }
            | Error::CorruptRedo { .. }
            | Error::SchemaTooNew { .. } => Code::Internal,
        };
        Status::new(code, err.to_string())
    }
}
