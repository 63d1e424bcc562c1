//! The commands the state task takes, and what they carry and answer: an
//! agent's report of an attempt, and each id's outcome of a cancel.

use super::{words, AgentConn, CheckpointOutcome, JobUpdate, NewToken, ReservationChange};
use crate::error::Error;
use gpool_core::auth::token::TokenRecord;
use gpool_core::auth::Caller;
use gpool_core::job_state::{ExitStatus, JobState};
use gpool_core::model::{JobSpec, Node};
use gpool_core::sched::{Preemption, Start};
use gpool_core::{Epoch, JobId};
use gpool_proto::pb;
use std::sync::Arc;
use tokio::sync::oneshot;

pub(super) type Reply<T> = oneshot::Sender<Result<T, Error>>;

/// The closed set of changes.
pub enum Command {
    Submit {
        caller: Caller,
        /// Alike jobs one after another share one spec.
        specs: Vec<Arc<JobSpec>>,
        reply: Reply<Vec<JobId>>,
    },
    /// Cancel jobs, or signal, hold, release or requeue them (`mode`).
    Cancel {
        caller: Caller,
        ids: Vec<JobId>,
        mode: CancelMode,
        reply: Reply<Vec<CancelOutcome>>,
    },
    /// Change pending jobs.
    Update {
        caller: Caller,
        ids: Vec<JobId>,
        change: JobUpdate,
        reply: Reply<Vec<CancelOutcome>>,
    },
    Drain {
        caller: Caller,
        node: String,
        reason: String,
        /// Requeue its running jobs now instead of letting them finish.
        at_once: bool,
        /// Only this GPU of the node.
        gpu: Option<u32>,
        reply: Reply<Node>,
    },
    Resume {
        caller: Caller,
        node: String,
        gpu: Option<u32>,
        reply: Reply<Node>,
    },
    /// Forgets a node that runs nothing.
    RemoveNode {
        caller: Caller,
        node: String,
        reply: Reply<String>,
    },
    Reservation {
        caller: Caller,
        change: ReservationChange,
        reply: Reply<gpool_core::sched::reservations::Reservation>,
    },
    /// The scheduling loop's latest reasons, hints and priorities for
    /// pending jobs.
    Planned(Box<words::Words>),
    /// The scheduling loop's starts, re-checked against the state.
    Start {
        starts: Vec<Start>,
    },
    /// The loop's preemptions, the GPUs each job that waits on them will
    /// get (`Plan::holds`) and the victims no job needs (`Plan::rescinds`).
    Preempt {
        preemptions: Vec<Preemption>,
        holds: Vec<(JobId, Vec<gpool_core::model::NodePlacement>)>,
        rescinds: Vec<(JobId, gpool_core::Epoch)>,
    },
    /// A re-read gpoold.toml: its policy and admins replace the old ones,
    /// and links of agents whose certificates are now `revoked` end.
    /// `caller` must be an admin unless the reload came from SIGHUP.
    Reload {
        caller: Option<Caller>,
        config: Box<crate::config::Config>,
        revoked: std::collections::HashSet<String>,
        reply: Reply<String>,
    },
    CreateToken {
        caller: Caller,
        request: NewToken,
        reply: Reply<(TokenRecord, String)>,
    },
    RevokeToken {
        caller: Caller,
        id: u64,
        reply: Reply<TokenRecord>,
    },
    /// A job reports a finished checkpoint of its attempt `attempt`.
    Checkpoint {
        caller: Caller,
        job: JobId,
        attempt: u32,
        reply: Reply<CheckpointOutcome>,
    },
    /// An agent (re)connected; `running` lists the attempts it runs.
    AgentRegister {
        node: Node,
        running: Vec<(JobId, Epoch)>,
        /// Attempts that ended while the link was down.
        ended: Vec<AgentEvent>,
        conn: AgentConn,
        reply: Reply<()>,
    },
    AgentHeartbeat {
        node: String,
        conn_id: u64,
        samples: Vec<pb::GpuSample>,
        /// Answered with a Lease of the same number.
        seq: u64,
        xids: Vec<pb::XidEvent>,
        /// GPUs whose MPS daemon failed.
        mps_faults: Vec<pb::MpsFault>,
        health_check: Option<pb::HealthCheck>,
        /// Why the node's spool is short of space; empty while it has room.
        spool_short: String,
        /// Why its GPU readings stopped; empty while they come.
        readings_stuck: String,
    },
    AgentJobEvent {
        node: String,
        conn_id: u64,
        event: AgentEvent,
    },
    AgentGone {
        node: String,
        conn_id: u64,
    },
    /// Marks nodes whose agents went silent as down, and kills preempted
    /// attempts whose grace ran out.
    Tick,
    /// A power tick: what the `[[power]]` groups' programs should do now.
    PowerTick {
        reply: Reply<Vec<super::PowerAction>>,
    },
    /// A group's program (`resume`, `suspend`, `resume_failed`) failed
    /// for these nodes.
    PowerFailed {
        program: &'static str,
        nodes: Vec<String>,
        why: String,
    },
    /// A group's `suspend` program ended (whatever its outcome) for these
    /// nodes.
    PowerSuspended {
        nodes: Vec<String>,
    },
    /// Sends `message` to `node`'s agent now (nothing to make durable).
    ToAgent {
        node: String,
        message: pb::ControllerMessage,
        reply: Reply<()>,
    },
}

/// What an agent reports about one attempt.
#[derive(Debug, Clone)]
pub struct AgentEvent {
    pub job: JobId,
    pub epoch: Epoch,
    pub outcome: AttemptOutcome,
}

#[derive(Debug, Clone)]
pub enum AttemptOutcome {
    Started,
    Exited(ExitStatus),
    FailedToStart(String),
    /// It ended after the agent killed it, or vanished without a record:
    /// not a result of its own.
    Stopped(ExitStatus),
    /// The node's supervisor ended it at its time limit.
    TimedOut,
    /// Its cgroup's OOM killer ended it.
    OutOfMemory,
    /// The node stopped it when its lease from this controller ran out.
    Fenced,
    /// The node would not start it for a reason of the node's own (its
    /// spool is full): nothing ran, and the job goes back to the queue.
    Refused(String),
    /// The node ended it when its output passed the node's max_output.
    OutputLimit,
}

/// What `Command::Cancel` does to each job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelMode {
    Cancel,
    /// Cancel only what is pending; running jobs (an array's running
    /// tasks) run on.
    CancelPending,
    /// Only send this signal to its running processes.
    Signal(i32),
    /// Hold (true) or release (false) a pending job.
    Hold(bool),
    /// Stop its running attempt (checkpoint signal and grace, as a
    /// preemption) and put it back in the queue.
    Requeue,
}

#[derive(Debug, Default)]
pub struct CancelOutcome {
    pub id: JobId,
    /// `None` for an id left alone (see `refused`).
    pub state: Option<JobState>,
    pub cancelled: bool,
    pub signalled: bool,
    pub held: bool,
    pub requeued: bool,
    pub updated: bool,
    /// Why the id was left alone: it names no job, or the caller may not.
    pub refused: Option<Error>,
}
