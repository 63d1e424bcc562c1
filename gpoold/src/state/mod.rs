//! The cluster state and its single owner, the state task.
//!
//! Every change is a `Command` sent to the state task: it applies the change
//! in memory, writes the touched records to sled, and hands the replies to
//! the flusher thread, which answers them once one `flush` covers them (group
//! commit). Readers share the in-memory state through a read lock.

mod access;
mod agents;
pub mod archive;
mod arrays;
mod attempt;
mod commands;
mod deps;
mod enforce;
mod gpu_use;
mod health;
mod history;
mod launch_wire;
mod nodes;
mod outbox;
mod power;
pub use power::PowerAction;
mod promises;
mod redo;
mod reservations;
pub use reservations::ReservationChange;
mod setup;
mod sharing;
pub mod store;
mod submit;
mod task;
mod update;
mod view;
pub mod words;

pub use access::NewToken;
pub use agents::{kill_message, signal_message};
pub use attempt::{Attempt, Preempting};
use commands::Reply;
pub use commands::{AgentEvent, AttemptOutcome, CancelMode, CancelOutcome, Command};
pub use gpu_use::Straggler;
pub use outbox::{Outbox, WeakOutbox, MAX_INPUT_BYTES, OUTBOX_CAPACITY};
pub use sharing::CheckpointOutcome;
pub use task::{run_flusher, run_state_task, Notifiers, StateHandle};
pub use update::JobUpdate;

use crate::error::Error;
use gpool_core::auth::token::{Key, TokenRecord};
use gpool_core::auth::{authorize, Action, Caller};
use gpool_core::deps::{dependency_state, DepState, DepTarget};
use gpool_core::feasibility::check_feasible;
use gpool_core::job_state::{JobEvent, JobState};
use gpool_core::model::{Job, JobSpec, Node};
use gpool_core::policy::{Ledger, Refusal};
use gpool_core::sched::{ClusterView, JobShape, NodeView, PendingJob, Policy, Queue};
use gpool_core::{JobId, Timestamp};
use gpool_proto::pb;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use store::Store;
use tokio::sync::{broadcast, mpsc, oneshot, Notify};

/// Team a job goes to when it names none.
pub const DEFAULT_TEAM: &str = "default";

/// What the controller knows, in memory.
pub struct State {
    /// Boxed: a B-tree node holds eleven of them, about half full. A
    /// change to a pending job here must be followed by `refresh_waiting`.
    pub jobs: BTreeMap<JobId, Box<Job>>,
    pub nodes: BTreeMap<String, Node>,
    next_job_id: u64,
    /// What the latest scheduling cycle said of the jobs that wait.
    pub words: words::Words,
    pub policy: Policy,
    /// Where `--notify` may post or mail.
    pub notify_rules: gpool_core::model::NotifyRules,
    admins: Vec<String>,
    /// The epoch the next attempt gets.
    next_epoch: u64,
    /// Connected agents by node name; not durable.
    links: HashMap<String, AgentConn>,
    /// When each node's agent was last heard from; not durable.
    /// (Monotonic: a step of the wall clock never makes nodes silent.)
    last_seen: HashMap<String, std::time::Instant>,
    /// Each node's latest per-GPU heartbeat samples; not durable.
    pub gpu_samples: HashMap<String, Vec<pb::GpuSample>>,
    /// What is known of each running attempt beside its job's record
    /// (GPU use, stragglers, gang exits, its preemption); not durable.
    attempts: HashMap<JobId, Attempt>,
    node_timeout_ms: i64,
    /// When each down node went down (since this controller started); not durable.
    down_since: HashMap<String, std::time::Instant>,
    forget_nodes_after: Option<std::time::Duration>,
    /// Ended jobs are removed this long after they ended; `None`: never.
    keep_ended_jobs: Option<std::time::Duration>,
    /// Prices, cost centres and the accounting records' retention.
    pub accounting: crate::config::Accounting,
    /// When ended jobs were last looked at for removal.
    last_compaction: Option<std::time::Instant>,
    /// Each team's metered GPU time (attempts that ended).
    pub usage: BTreeMap<String, Ledger>,
    /// Reservations made at run time; `policy` holds them too.
    created_reservations: Vec<gpool_core::sched::reservations::Reservation>,
    /// What is freed for waiting jobs that take GPUs back (their claims,
    /// the GPUs they hold, their ended victims'), until they start or it
    /// runs out; not durable.
    promises: gpool_core::sched::Promises,
    /// GPU-seconds lost to preemptions in the last hour; not durable.
    waste: gpool_core::sched::WasteBudget,
    /// User token records by id.
    pub tokens: BTreeMap<u64, TokenRecord>,
    /// Hashes token secrets and signs job tokens.
    token_key: Key,
    /// Each distinct job environment once, shared by the jobs that have it.
    /// The spec of the job submitted last, shared by the next ones alike.
    last_spec: Option<Arc<JobSpec>>,
    envs: std::collections::HashSet<Arc<[(String, String)]>>,
    /// Every array's record id and its number of tasks (whose ids follow
    /// it).
    arrays: BTreeMap<JobId, u32>,
    /// Running tasks of each array; rebuilt on start.
    array_running: HashMap<JobId, u32>,
    /// Jobs that have not ended: what each cycle looks at.
    active: std::collections::BTreeSet<JobId>,
    /// Each pending job as the scheduler sees it, kept up to date with the
    /// job (`refresh_waiting`): a cycle copies these, packed together,
    /// instead of reading every job's record.
    waiting: BTreeMap<JobId, Waiting>,
    /// The waiting jobs that wait on nothing but GPUs (`Waiting::plain`),
    /// by shape: a cycle that only starts jobs looks at the first few of
    /// each (`Queue::window`), however long the queue...
    queue: Queue,
    /// ...and at every other waiting job (held, gated, arrays, tasks).
    not_plain: std::collections::BTreeSet<JobId>,
    /// Ended jobs on disk (those that left `jobs`).
    ended: store::EndedJobs,
    /// Each dependency target of jobs that have not ended, and how many
    /// name it: an ended target stays in memory while it is named.
    dep_targets: HashMap<JobId, u32>,
    /// Ended jobs that may leave memory once written (`evict_ended`).
    to_evict: Vec<JobId>,
    evicted_since_prune: usize,
    /// Counters and histograms for `/metrics`.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Bumped by every batch of commands that may change what a scheduling
    /// cycle sees (`Command::may_change_schedule`, or anything written);
    /// not durable.
    pub sched_generation: u64,
    straggler_after: std::time::Duration,
    /// The running jobs with GPUs on each node (what a heartbeat's samples
    /// are about).
    running_on: HashMap<String, std::collections::BTreeSet<JobId>>,
    /// When a GPU's readings are a fault, and how long it stays out.
    health_policy: gpool_core::health::HealthPolicy,
    /// What each GPU's earlier readings were; not durable.
    gpu_watch: HashMap<(String, u32), gpool_core::health::GpuWatch>,
    /// Each node's latest health program run; not durable.
    pub health_checks: HashMap<String, pb::HealthCheck>,
    /// `[[power]]` groups: where each of their nodes stands; not durable.
    pub power: gpool_core::power::Book,
    /// Each group's programs.
    power_programs: Vec<crate::config::PowerGroup>,
}

/// One agent's open link: where to send it Launch and Kill.
#[derive(Debug, Clone)]
pub struct AgentConn {
    pub id: u64,
    pub outbox: Outbox,
    /// The agent's IP as this controller sees it (MASTER_ADDR of gangs).
    pub ip: String,
    /// The serial of its client certificate (TLS links), so that a
    /// revocation ends the link at once.
    pub cert_serial: Option<String>,
}

pub type SharedState = Arc<RwLock<State>>;

/// Records a command touched, to be written before its reply goes out.
enum Write {
    Job(JobId),
    Node(String),
    /// A node record whose only change is when a fault was last seen on
    /// something out of service (a heartbeat's news), which no scheduling
    /// cycle reads.
    NodeFaultSeen(String),
    ForgetNode(String),
    /// Removes an ended job's record (which ended then).
    ForgetJob(JobId, Timestamp),
    NextJobId,
    NextEpoch,
    Usage(String),
    Token(u64),
    /// The reservations made at run time, as one record.
    Reservations,
    /// An attempt's accounting record (appended, never changed).
    Attempt(Box<gpool_core::accounting::AttemptRecord>),
}

impl Write {
    /// Whether it changes what a scheduling cycle sees: not so for tokens,
    /// accounting records, faults seen again on what is out of service,
    /// and removing ended jobs' records.
    fn seen_by_scheduler(&self) -> bool {
        !matches!(
            self,
            Write::NodeFaultSeen(_) | Write::Token(_) | Write::Attempt(_) | Write::ForgetJob(..)
        )
    }
}

/// How many of the newest jobs `State::newest_waits_unexplained` looks
/// through for one a cycle would say something of.
const UNEXPLAINED_LOOK_BACK: usize = 64;

/// A pending job as a cycle sees it (`State::waiting`).
#[derive(Debug, Clone, PartialEq)]
struct Waiting {
    /// Shared with the views of the cycles that see it.
    view: Arc<PendingJob>,
    held: bool,
    /// An array's record (its tasks are seen through it).
    array: bool,
    /// The array of a task that is a job.
    task_of: Option<JobId>,
    /// It has dependencies or is a singleton: whether it may start depends
    /// on other jobs, looked at each cycle.
    gated: bool,
}

impl Waiting {
    /// Not held, gated, an array or a task: whether it starts depends on
    /// GPUs alone.
    fn plain(&self) -> bool {
        !self.held && !self.array && self.task_of.is_none() && !self.gated
    }

    /// `queue`: where the job finds its shape if jobs there share it.
    fn of(job: &Job, queue: &Queue) -> Waiting {
        let shape = JobShape::of(&job.spec);
        let shape = queue.shape(&shape).cloned().unwrap_or_else(|| Arc::new(shape));
        Waiting {
            view: Arc::new(arrays::pending_view(job.id, job, shape)),
            held: job.held,
            array: job.array.is_some(),
            task_of: job.array_task.map(|task| task.array),
            gated: !job.spec.dependencies.is_empty() || job.spec.singleton || job.spec.begin.is_some(),
        }
    }
}

/// Its `--begin` (if any) has come.
pub fn begun(job: &Job, now: Timestamp) -> bool {
    job.spec.begin.is_none_or(|begin| begin.at(job.submitted_at) <= now)
}

/// Everything one batch of commands produced.
#[derive(Default)]
struct Batch {
    writes: Vec<Write>,
    replies: Vec<PendingReply>,
    changed: Vec<JobId>,
    /// Launch and Kill messages, sent once the batch is durable.
    messages: Vec<(String, pb::ControllerMessage)>,
}

/// An answer waiting for the flush that makes its change durable.
type PendingReply = Box<dyn FnOnce(Result<(), Error>) + Send>;

fn deferred<T: Send + 'static>(reply: Reply<T>, value: T) -> PendingReply {
    Box::new(move |flushed: Result<(), Error>| {
        let _ = reply.send(flushed.map(|()| value));
    })
}

impl State {
    /// Dev mode makes every caller an admin (there is one user).
    fn is_admin(&self, user: &str) -> bool {
        self.admins.iter().any(|admin| admin == user || admin == "*")
    }

    /// Job `id` if it is in memory (not ended, or ended and still needed;
    /// `find_job` looks on disk too).
    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id).map(Box::as_ref)
    }

    /// Jobs that have not ended, by id.
    pub fn active_jobs(&self) -> impl Iterator<Item = &Job> {
        self.active_jobs_from(JobId(0))
    }

    /// As `active_jobs`, from id `first` on. Every cycle reads them: where
    /// most of `jobs` has not ended, one walk of the map that skips the
    /// ended ones is cheaper than a lookup per id of `active`; where ended
    /// jobs are kept in numbers (the done tasks of a large array), the
    /// lookups are.
    pub fn active_jobs_from(&self, first: JobId) -> impl Iterator<Item = &Job> {
        let walk = self.jobs.len() <= 2 * self.active.len();
        let walked = walk.then(|| {
            self.jobs
                .range(first..)
                .map(|(_, job)| job.as_ref())
                .filter(|job| !job.state.is_finished())
        });
        let looked_up = (!walk).then(|| self.active.range(first..).filter_map(|id| self.job(*id)));
        walked.into_iter().flatten().chain(looked_up.into_iter().flatten())
    }

    /// The shared copy of `env`.
    /// `spec`, or the last spec shared where it is the same: jobs submitted
    /// (or stored) one after another alike share one.
    fn share_spec(&mut self, spec: Arc<JobSpec>) -> Arc<JobSpec> {
        match &self.last_spec {
            Some(last) if Arc::ptr_eq(last, &spec) || **last == *spec => last.clone(),
            _ => {
                self.last_spec = Some(spec.clone());
                spec
            }
        }
    }

    fn intern_env(&mut self, env: &Arc<[(String, String)]>) -> Arc<[(String, String)]> {
        if let Some(shared) = self.envs.get(env) {
            return shared.clone();
        }
        self.envs.insert(env.clone());
        env.clone()
    }

    /// The running jobs (a gang once), by id, from the index by node.
    /// The id the next submitted job gets: no job has one as high.
    pub fn next_job_id(&self) -> u64 {
        self.next_job_id
    }

    /// The next moment ahead of `now` when waiting jobs may start though
    /// nothing else changes: the earliest `--begin` among them, or a
    /// reservation opening or closing. The scheduler wakes then.
    pub fn next_timed_change(&self, now: Timestamp) -> Option<Timestamp> {
        let begin = self
            .not_plain
            .iter()
            .filter(|id| {
                self.waiting
                    .get(id)
                    .is_some_and(|waiting| waiting.gated && !waiting.held)
            })
            .filter_map(|id| self.job(*id))
            .filter_map(|job| job.spec.begin.map(|begin| begin.at(job.submitted_at)))
            .filter(|at| *at > now)
            .min();
        let window = (!self.waiting.is_empty())
            .then(|| {
                self.policy
                    .reservations
                    .iter()
                    .flat_map(|r| [r.start, r.end])
                    .filter(|at| *at > now)
                    .min()
            })
            .flatten();
        begin.into_iter().chain(window).min()
    }

    pub fn running(&self) -> impl Iterator<Item = &Job> {
        let ids: std::collections::BTreeSet<JobId> = self.running_on.values().flatten().copied().collect();
        ids.into_iter().filter_map(|id| self.job(id))
    }

    /// Removes jobs that ended longer than `keep_ended_jobs` ago from sled,
    /// but not those a job that has not ended still needs (looked for at
    /// most once a minute, or twice per retention when it is shorter).
    fn remove_old_ended_jobs(&mut self, now: Timestamp, out: &mut Batch) {
        let Some(keep) = self.keep_ended_jobs else {
            return;
        };
        let every = (keep / 2).min(std::time::Duration::from_secs(60));
        if self.last_compaction.is_some_and(|last| last.elapsed() < every) {
            return;
        }
        self.last_compaction = Some(std::time::Instant::now());
        let before = Timestamp(now.0.saturating_sub(keep.as_millis().min(i64::MAX as u128) as i64));
        match self.forget_ended_before(before, out) {
            Ok(0) => {}
            Ok(n_removed) => tracing::info!(
                "{n_removed} jobs that ended more than {} ago removed",
                humantime::format_duration(keep)
            ),
            Err(err) => tracing::warn!("cannot look for jobs past their retention: {err}"),
        }
    }

    /// Which job holds each busy GPU, by (node, GPU index).
    pub fn gpu_holders(&self) -> HashMap<(&str, u32), JobId> {
        let mut holders = HashMap::new();
        for job in self.running() {
            if let JobState::Running { placement, .. } = &job.state {
                for part in placement {
                    for gpu_idx in &part.gpu_indices {
                        holders.insert((part.node.as_str(), *gpu_idx), job.id);
                    }
                }
            }
        }
        holders
    }
}
