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
mod health;
mod history;
mod outbox;
mod promises;
mod redo;
mod sharing;
pub mod store;
mod update;
pub mod words;

pub use access::NewToken;
pub use agents::{kill_message, signal_message};
pub use outbox::{Outbox, WeakOutbox, OUTBOX_CAPACITY};
use sharing::running_view;
pub use sharing::CheckpointOutcome;
pub use update::JobUpdate;

use crate::error::Error;
use gpool_core::auth::token::{Key, TokenRecord};
use gpool_core::auth::{authorize, Action, Caller};
use gpool_core::deps::{dependency_state, DepState, DepTarget};
use gpool_core::feasibility::check_feasible;
use gpool_core::job_state::{ExitStatus, JobEvent, JobState};
use gpool_core::model::{Job, JobSpec, Node, ThinVec};
use gpool_core::policy::{Ledger, Refusal};
use gpool_core::sched::{ClusterView, JobShape, NodeView, PendingJob, Policy, Preemption, Queue, Start};
use gpool_core::{Epoch, JobId, Timestamp};
use gpool_proto::pb;
use std::collections::{BTreeMap, HashMap, VecDeque};
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
    /// Nodes of running gangs whose rank already exited 0; not durable.
    gang_exits: HashMap<JobId, std::collections::HashSet<String>>,
    node_timeout_ms: i64,
    /// When each down node went down (since this controller started); not
    /// durable.
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
    /// Preempted attempts and when their grace ends; rebuilt on start.
    preempt_deadlines: BTreeMap<JobId, (Epoch, Timestamp)>,
    /// The job each preempted attempt in its grace was preempted for; not
    /// durable (after a restart its GPUs go to whoever needs them first).
    preempted_for: HashMap<JobId, JobId>,
    /// GPUs of preempted attempts that ended while the job they were taken
    /// for still waits: promised to it until it starts or the promise runs
    /// out; not durable.
    promises: Vec<promises::Promise>,
    /// Until when what is freed for each waiting job stays its: the end of
    /// its last victim's grace, and a little more; not durable.
    claim_until: HashMap<JobId, Timestamp>,
    /// GPU-seconds lost to preemptions in the last hour; not durable.
    recent_waste: VecDeque<(Timestamp, f64)>,
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
    /// GPU use of running attempts so far (folded into the job when the
    /// attempt ends); not durable.
    pub gpu_use_live: HashMap<JobId, gpool_core::model::GpuUse>,
    /// For each running job on several GPUs: since when each of its GPUs
    /// has lagged behind the others; not durable.
    pub lagging_since: HashMap<JobId, BTreeMap<gpool_core::stragglers::GpuKey, Timestamp>>,
    /// Each running job's stragglers now: the GPU, its utilisation, the
    /// job's median, and since when.
    pub stragglers: HashMap<JobId, Vec<Straggler>>,
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
}

/// A GPU that has lagged behind its job's others for `straggler_after`.
#[derive(Debug, Clone)]
pub struct Straggler {
    pub gpu: gpool_core::stragglers::GpuKey,
    pub utilization_pct: u32,
    pub median_pct: u32,
    pub since: Timestamp,
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

type Reply<T> = oneshot::Sender<Result<T, Error>>;

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
    /// The scheduling loop's latest reasons, hints and priorities for
    /// pending jobs.
    Planned(Box<words::Words>),
    /// The scheduling loop's starts, re-checked against the state.
    Start {
        starts: Vec<Start>,
    },
    /// The scheduling loop's preemptions, and the GPUs each job that waits
    /// on them will get (`Plan::holds`).
    Preempt {
        preemptions: Vec<Preemption>,
        holds: Vec<(JobId, Vec<gpool_core::model::NodePlacement>)>,
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

/// Records a command touched, to be written before its reply goes out.
enum Write {
    Job(JobId),
    Node(String),
    /// A node record whose only change is when a fault was last seen on
    /// something out of service (a heartbeat's news), which no scheduling
    /// cycle reads.
    NodeFaultSeen(String),
    ForgetNode(String),
    /// A new job's environment, kept apart from its record.
    JobEnv(JobId),
    /// Removes an ended job's record (which ended then).
    ForgetJob(JobId, Timestamp),
    NextJobId,
    NextEpoch,
    Usage(String),
    Token(u64),
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
    pub fn new(loaded: store::Loaded, config: &crate::config::Config, token_key: Key) -> State {
        let nodes: BTreeMap<String, Node> = loaded.nodes.into_iter().map(|node| (node.name.clone(), node)).collect();
        // Known nodes get a full timeout from this start to reconnect.
        let started = std::time::Instant::now();
        let last_seen = nodes.keys().map(|name| (name.clone(), started)).collect();
        // Nodes already down count from this start towards being forgotten.
        let down_since = nodes
            .values()
            .filter(|node| !node.alive)
            .map(|node| (node.name.clone(), started))
            .collect();
        let mut state = State {
            jobs: loaded.jobs.into_iter().map(|job| (job.id, Box::new(job))).collect(),
            nodes,
            next_job_id: loaded.next_job_id,
            words: words::Words::default(),
            policy: config.policy.clone(),
            notify_rules: config.notify.clone(),
            admins: config.admins.clone(),
            next_epoch: loaded.next_epoch,
            links: HashMap::new(),
            last_seen,
            gpu_samples: HashMap::new(),
            gang_exits: HashMap::new(),
            node_timeout_ms: config.node_timeout.as_millis() as i64,
            down_since,
            forget_nodes_after: config.forget_nodes_after,
            keep_ended_jobs: config.keep_ended_jobs,
            accounting: config.accounting.clone(),
            last_compaction: None,
            usage: loaded.usage,
            preempt_deadlines: BTreeMap::new(),
            preempted_for: HashMap::new(),
            promises: Vec::new(),
            claim_until: HashMap::new(),
            recent_waste: VecDeque::new(),
            tokens: loaded.tokens,
            token_key,
            envs: std::collections::HashSet::new(),
            last_spec: None,
            arrays: BTreeMap::new(),
            array_running: HashMap::new(),
            active: std::collections::BTreeSet::new(),
            waiting: BTreeMap::new(),
            queue: Queue::default(),
            not_plain: std::collections::BTreeSet::new(),
            ended: loaded.ended,
            dep_targets: HashMap::new(),
            to_evict: Vec::new(),
            evicted_since_prune: 0,
            metrics: Arc::new(crate::metrics::Metrics::default()),
            sched_generation: 0,
            gpu_use_live: HashMap::new(),
            lagging_since: HashMap::new(),
            stragglers: HashMap::new(),
            straggler_after: config.straggler_after,
            health_policy: config.health.clone(),
            gpu_watch: HashMap::new(),
            health_checks: HashMap::new(),
            running_on: HashMap::new(),
        };
        let mut jobs = std::mem::take(&mut state.jobs);
        for job in jobs.values_mut() {
            let env = state.intern_env(&job.spec.env);
            Arc::make_mut(&mut job.spec).env = env;
            job.spec = state.share_spec(job.spec.clone());
        }
        state.jobs = jobs;
        state.active = state
            .jobs
            .values()
            .filter(|job| !job.state.is_finished())
            .map(|job| job.id)
            .collect();
        let active: Vec<JobId> = state.active.iter().copied().collect();
        for id in active {
            state.count_dep_targets(id, true);
            state.refresh_waiting(id);
        }
        state.count_running_tasks();
        let running: Vec<(JobId, Vec<String>)> = state
            .active_jobs()
            .filter_map(|job| match &job.state {
                JobState::Running { placement, .. } => {
                    Some((job.id, placement.iter().map(|part| part.node.clone()).collect()))
                }
                _ => None,
            })
            .collect();
        for (id, nodes) in running {
            for node in nodes {
                state.running_on.entry(node).or_default().insert(id);
            }
        }
        state.restore_preempt_deadlines();
        state
    }

    /// Why `caller` may not submit `spec` into its reservation, if so: it
    /// names none that is still to come or open, or one whose users and
    /// teams leave them out (admins too: a maintenance window names none).
    fn admit_into_reservation(&self, spec: &JobSpec, caller: &Caller, now: Timestamp) -> Result<(), String> {
        let name = &spec.reservation;
        let Some(reservation) = self.policy.reservations.iter().find(|r| &r.name == name) else {
            let known: Vec<&str> = self.policy.reservations.iter().map(|r| r.name.as_str()).collect();
            return Err(match known.as_slice() {
                [] => format!("no reservation is named {name:?} (gpoold.toml has none)"),
                known => format!("no reservation is named {name:?} ({})", known.join(", ")),
            });
        };
        if reservation.end <= now {
            return Err(format!("reservation {name} has ended"));
        }
        if !reservation.admits(&caller.user, &spec.team, &self.policy.sharing) {
            return Err(format!(
                "user {} (team {}) is neither among reservation {name}'s users nor a member of its teams",
                caller.user, spec.team
            ));
        }
        Ok(())
    }

    /// Refuses a submit that would take `user` past a `max_submit_per_user`:
    /// their jobs pending or running (each task of an array) and `adding`.
    fn check_submit_caps(&self, user: &str, adding: &[Arc<JobSpec>]) -> Result<(), Error> {
        let n_jobs = |spec: &JobSpec| spec.array.as_ref().map_or(1, |array| u64::from(array.len()));
        let adding: Vec<(&str, &str, u64)> = adding
            .iter()
            .map(|spec| (spec.team.as_str(), spec.qos.as_str(), n_jobs(spec)))
            .collect();
        let held = self
            .jobs
            .values()
            .filter(|job| job.user == user && !job.state.is_finished())
            .map(|job| {
                // An array's tasks not yet jobs of their own; those that
                // are count as the jobs they are.
                let n = match &job.array {
                    Some(progress) => n_jobs(&job.spec).saturating_sub(u64::from(progress.materialized)),
                    None => 1,
                };
                (job.spec.team.as_str(), job.spec.qos.as_str(), n)
            });
        match gpool_core::sched::limits::submit_refusal(&self.policy.sharing, user, held, &adding) {
            Some(reason) => Err(Error::OverLimit(reason)),
            None => Ok(()),
        }
    }

    fn submit(
        &mut self,
        caller: &Caller,
        specs: Vec<Arc<JobSpec>>,
        now: Timestamp,
    ) -> Result<(Vec<JobId>, Vec<Write>), Error> {
        if specs.is_empty() {
            return Err(Error::InvalidRequest {
                field: "specs",
                reason: "no job in the request".into(),
            });
        }
        let nodes: Vec<Node> = self.nodes.values().cloned().collect();
        let of = specs.len();
        let mut checked = Vec::with_capacity(specs.len());
        // The id each job of the request gets: an array's tasks take the
        // ids after its own.
        let mut request_ids: Vec<JobId> = Vec::with_capacity(specs.len());
        let mut next_id = self.next_job_id;
        // The last spec as given, and as checked: the same spec again (a
        // batch of alike jobs) is checked once, unless it names other jobs.
        let mut last: Option<(Arc<JobSpec>, Arc<JobSpec>)> = None;
        for (spec_idx, given) in specs.into_iter().enumerate() {
            let index = spec_idx + 1;
            if let Some((_, checked_spec)) = last
                .as_ref()
                .filter(|(last_given, _)| Arc::ptr_eq(last_given, &given) && given.dependencies.is_empty())
            {
                request_ids.push(JobId(next_id));
                next_id += 1 + checked_spec.array.as_ref().map_or(0, |array| u64::from(array.len()));
                checked.push(checked_spec.clone());
                continue;
            }
            let mut spec = (*given).clone();
            self.policy
                .sharing
                .admit(&mut spec, caller, DEFAULT_TEAM)
                .map_err(|refusal| match refusal {
                    Refusal::Spec(source) => Error::InvalidSpec { index, of, source },
                    Refusal::Denied(source) => Error::SubmitDenied { index, of, source },
                })?;
            spec.validate()
                .map_err(|source| Error::InvalidSpec { index, of, source })?;
            if let Some(reason) = gpool_core::sched::limits::never_within_caps(
                &self.policy.sharing,
                &spec.team,
                &spec.qos,
                spec.total_gpus(),
            ) {
                return Err(Error::InvalidSpec {
                    index,
                    of,
                    source: gpool_core::spec::spec_error("gpus", reason),
                });
            }
            if !spec.reservation.is_empty() {
                self.admit_into_reservation(&spec, caller, now)
                    .map_err(|reason| Error::InvalidSpec {
                        index,
                        of,
                        source: gpool_core::spec::spec_error("reservation", reason),
                    })?;
            }
            if let Some(notify) = &spec.notify {
                self.notify_rules.admit(notify).map_err(|reason| Error::InvalidSpec {
                    index,
                    of,
                    source: gpool_core::spec::spec_error("notify", reason),
                })?;
            }
            // Dependencies name jobs that exist, or earlier jobs of this
            // request (whose ids are known from here on).
            for dependency in &mut spec.dependencies {
                let target = match dependency.target {
                    DepTarget::InRequest(position) if (1..index).contains(&position) => request_ids[position - 1],
                    DepTarget::InRequest(position) => {
                        return Err(Error::InvalidSpec {
                            index,
                            of,
                            source: gpool_core::spec::spec_error(
                                "dependency",
                                format!("job {position} of the request is not an earlier job of it"),
                            ),
                        })
                    }
                    DepTarget::Job(id) if self.bring_back(id)? => id,
                    DepTarget::Job(id) => {
                        return Err(Error::InvalidSpec {
                            index,
                            of,
                            source: gpool_core::spec::spec_error("dependency", format!("job {id} does not exist")),
                        })
                    }
                };
                dependency.target = DepTarget::Job(target);
            }
            check_feasible(&spec, &self.policy, &nodes).map_err(|source| Error::Infeasible { index, of, source })?;
            request_ids.push(JobId(next_id));
            next_id += 1 + spec.array.as_ref().map_or(0, |array| u64::from(array.len()));
            spec.env = self.intern_env(&spec.env);
            let spec = self.share_spec(Arc::new(spec));
            last = Some((given, spec.clone()));
            checked.push(spec);
        }
        self.check_submit_caps(&caller.user, &checked)?;
        let mut ids = Vec::with_capacity(checked.len());
        let mut writes = Vec::with_capacity(checked.len() + 1);
        for spec in checked {
            let id = JobId(self.next_job_id);
            let n_tasks = spec.array.as_ref().map(|array| array.len());
            self.next_job_id += 1 + n_tasks.map_or(0, u64::from);
            if let Some(n_tasks) = n_tasks {
                self.arrays.insert(id, n_tasks);
            }
            let job = Job {
                id,
                spec,
                user: caller.user.as_str().into(),
                submitted_at: now,
                state: JobState::Pending,
                n_attempts: 0,
                last_nodes: ThinVec::new(),
                n_preemptions: 0,
                requeue_cause: None,
                lost_gpu_secs: 0,
                used_secs: 0,
                lost_attempts: ThinVec::new(),
                held: false,
                array: n_tasks.map(|_| Default::default()),
                array_task: None,
                past_attempts: ThinVec::new(),
                gpu_use: None,
                events: ThinVec::new(),
            };
            self.jobs.insert(id, Box::new(job));
            self.active.insert(id);
            self.count_dep_targets(id, true);
            self.refresh_waiting(id);
            ids.push(id);
            writes.push(Write::Job(id));
            writes.push(Write::JobEnv(id));
        }
        writes.push(Write::NextJobId);
        Ok((ids, writes))
    }

    fn cancel(
        &mut self,
        caller: &Caller,
        ids: &[JobId],
        mode: CancelMode,
        now: Timestamp,
        out: &mut Batch,
    ) -> Result<Vec<CancelOutcome>, Error> {
        if ids.is_empty() {
            return Err(Error::InvalidRequest {
                field: "ids",
                reason: "no job id given".into(),
            });
        }
        // Each id on its own: one that names no job, or a job the caller
        // may not touch, is reported and the others go ahead.
        let mut outcomes = Vec::with_capacity(ids.len());
        for id in ids {
            let found = match self.find_job(*id) {
                Ok(found) => found.map(std::borrow::Cow::into_owned),
                Err(err) => {
                    outcomes.push(CancelOutcome {
                        id: *id,
                        refused: Some(err),
                        ..CancelOutcome::default()
                    });
                    continue;
                }
            };
            let refused = match &found {
                None => Some(Error::UnknownJob(*id)),
                Some(job) => {
                    let job = job.auth_ref();
                    let action = match mode {
                        CancelMode::Signal(_) => Action::SignalJob(job),
                        _ => Action::CancelJob(job),
                    };
                    authorize(caller, &action).err().map(Error::from)
                }
            };
            if let Some(refused) = refused {
                outcomes.push(CancelOutcome {
                    id: *id,
                    state: found.map(|job| job.state),
                    refused: Some(refused),
                    ..CancelOutcome::default()
                });
                continue;
            }
            // A task that is not a job yet becomes one when it is cancelled,
            // held or released alone (a signal or requeue has nothing to
            // do to it); an array takes the request with its tasks.
            if matches!(
                mode,
                CancelMode::Cancel | CancelMode::CancelPending | CancelMode::Hold(_)
            ) {
                self.materialize(*id, out);
            }
            let mut targets = vec![*id];
            if let Some(array) = self.jobs.get(id).filter(|job| job.array.is_some()) {
                targets.extend(self.array_task_ids(array));
            }
            let mut outcome = CancelOutcome {
                id: *id,
                ..CancelOutcome::default()
            };
            for target in targets {
                let applied = self.cancel_one(caller, target, mode, now, out);
                outcome.cancelled |= applied.cancelled;
                outcome.signalled |= applied.signalled;
                outcome.requeued |= applied.requeued;
                if target == *id {
                    outcome.held = applied.held;
                    outcome.updated = applied.updated;
                }
            }
            outcome.state = self.state_of(*id);
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// `cancel` for one job the caller may act on.
    fn cancel_one(
        &mut self,
        caller: &Caller,
        id: JobId,
        mode: CancelMode,
        now: Timestamp,
        out: &mut Batch,
    ) -> CancelOutcome {
        let mut outcome = CancelOutcome {
            id,
            ..CancelOutcome::default()
        };
        let Some(job) = self.jobs.get(&id) else {
            return outcome;
        };
        let running = match &job.state {
            JobState::Running { epoch, placement, .. } => Some((*epoch, placement.clone())),
            _ => None,
        };
        match (mode, &running) {
            (CancelMode::Hold(hold), _) => {
                // Only a pending job is held or released; others as they are.
                let before = job.held;
                self.apply_event(id, &JobEvent::Hold { held: hold }, now, out);
                outcome.held = self.jobs.get(&id).is_some_and(|job| job.held);
                outcome.updated = outcome.held != before;
            }
            (CancelMode::Signal(signal), Some((epoch, placement))) => {
                for part in placement {
                    out.messages
                        .push((part.node.clone(), signal_message(id, *epoch, signal)));
                }
                outcome.signalled = true;
            }
            (CancelMode::Requeue, Some((epoch, _))) => {
                outcome.requeued = self.requeue_attempt(id, *epoch, &caller.user, now, out);
            }
            (CancelMode::CancelPending, None) | (CancelMode::Cancel, _) if !job.state.is_finished() => {
                let event = JobEvent::Cancel {
                    by: caller.user.clone(),
                    now,
                };
                // Pending and running jobs always take a cancel.
                self.apply_event(id, &event, now, out);
                if let Some((epoch, placement)) = running {
                    self.gang_exits.remove(&id);
                    for part in placement {
                        out.messages.push((part.node, kill_message(id, epoch)));
                    }
                }
                outcome.cancelled = true;
            }
            _ => {}
        }
        outcome
    }

    /// Node `name`, once `caller` may drain it (`draining`) or resume it.
    fn node_to_drain(&mut self, caller: &Caller, name: &str, draining: bool) -> Result<&mut Node, Error> {
        let action = if draining {
            Action::DrainNode(name)
        } else {
            Action::ResumeNode(name)
        };
        authorize(caller, &action)?;
        self.nodes
            .get_mut(name)
            .ok_or_else(|| Error::UnknownNode(name.to_string()))
    }

    fn set_drain(
        &mut self,
        caller: &Caller,
        name: &str,
        reason: Option<String>,
        now: Timestamp,
    ) -> Result<(Node, Vec<Write>), Error> {
        let node = self.node_to_drain(caller, name, reason.is_some())?;
        if reason.is_none() {
            // A resume also ends a drain by the node's health program (it
            // drains again if the program still fails).
            node.health_drain = None;
        }
        node.drained_by = reason.is_some().then(|| (caller.user.clone(), now));
        node.drain_reason = reason;
        Ok((node.clone(), vec![Write::Node(name.to_string())]))
    }

    /// Forgets `name`, refused while attempts hold its GPUs. An agent that
    /// registers again brings the node back.
    fn remove_node(&mut self, caller: &Caller, name: &str, out: &mut Batch) -> Result<(), Error> {
        authorize(caller, &Action::RemoveNode(name))?;
        if !self.nodes.contains_key(name) {
            return Err(Error::UnknownNode(name.to_string()));
        }
        let holding: Vec<String> = self
            .jobs
            .values()
            .filter(|job| match &job.state {
                JobState::Running { placement, .. } => placement.iter().any(|part| part.node == name),
                _ => false,
            })
            .map(|job| job.id.to_string())
            .collect();
        if !holding.is_empty() {
            let jobs = if holding.len() == 1 {
                format!("job {}", holding[0])
            } else {
                format!("jobs {}", holding.join(", "))
            };
            return Err(Error::NodeBusy {
                node: name.to_string(),
                jobs,
            });
        }
        self.forget_node(name, out);
        tracing::info!(node = name, by = %caller.user, "node removed");
        Ok(())
    }

    /// Takes the policy and admins of a re-read config (listen address and
    /// state dir need a restart and are left alone), and ends the links of
    /// agents whose certificates are revoked.
    fn reload(
        &mut self,
        caller: Option<&Caller>,
        config: crate::config::Config,
        revoked: &std::collections::HashSet<String>,
    ) -> Result<String, Error> {
        if let Some(caller) = caller {
            authorize(caller, &Action::ReloadPolicy)?;
        }
        self.links.retain(|node, conn| {
            let keep = !conn.cert_serial.as_ref().is_some_and(|serial| revoked.contains(serial));
            if !keep {
                tracing::warn!(node, "agent link ended: its certificate is revoked");
            }
            keep
        });
        let sharing = &config.policy.sharing;
        let summary = format!(
            "{} pools, {} teams, {} QoS classes",
            config.policy.pools.len(),
            sharing.teams.len(),
            sharing.qos.len()
        );
        tracing::info!("policy reloaded: {summary}");
        self.policy = config.policy;
        self.notify_rules = config.notify;
        self.admins = config.admins;
        self.keep_ended_jobs = config.keep_ended_jobs;
        self.health_policy = config.health.clone();
        self.accounting = config.accounting;
        self.restore_preempt_deadlines();
        Ok(summary)
    }

    /// Dev mode makes every caller an admin (there is one user).
    fn is_admin(&self, user: &str) -> bool {
        self.admins.iter().any(|admin| admin == user || admin == "*")
    }

    /// The scheduler's input: nodes with busy GPUs marked, the queue, the
    /// running jobs, the teams' usage and the hour's waste budget. For a
    /// cycle that only starts and preempts jobs (`starts_only`: no words on
    /// why jobs wait), of the jobs that wait on GPUs alone only those of
    /// each shape it could start, where that gives the same starts and
    /// preemptions (`gpool_core::sched::window_gpus`); the view then says
    /// it is `windowed`.
    pub fn cluster_view(&self, now: Timestamp, starts_only: bool) -> ClusterView {
        #[cfg(debug_assertions)]
        self.check_waiting();
        // Jobs with dependencies or singletons are looked at each cycle
        // (their state depends on others'); the rest only by their view.
        let gated: Vec<&Job> = self
            .not_plain
            .iter()
            .filter(|id| self.waiting.get(id).is_some_and(|waiting| waiting.gated))
            .filter_map(|id| self.job(*id))
            .collect();
        let singletons = self.singleton_holders(&gated);
        let running: Vec<&Job> = self.running().collect();
        let nodes = self.node_views(&running);
        let running: Vec<_> = running
            .into_iter()
            .filter_map(running_view)
            .map(|mut view| {
                view.preempted_for = self.preempted_for.get(&view.id).copied().filter(|_| view.preempting);
                view
            })
            .collect();
        let promised = self.promised(&nodes);
        // The jobs beside those that wait on GPUs alone: held, gated,
        // arrays and their tasks.
        let mut others: Vec<Arc<PendingJob>> = Vec::new();
        let mut arrays: Vec<(&Job, bool)> = Vec::new();
        let mut pending_tasks: HashMap<JobId, Vec<Arc<PendingJob>>> = HashMap::new();
        for (id, waiting) in self.not_plain.iter().filter_map(|id| self.waiting.get_key_value(id)) {
            let ready = !waiting.held
                && (!waiting.gated
                    || self
                        .job(*id)
                        .is_some_and(|job| begun(job, now) && self.dependencies_met(job, &singletons)));
            match (waiting.array, waiting.task_of) {
                (true, _) => arrays.extend(self.job(*id).map(|job| (job, ready))),
                (false, _) if !ready => {}
                (false, Some(array)) => pending_tasks.entry(array).or_default().push(waiting.view.clone()),
                (false, None) => others.push(waiting.view.clone()),
            }
        }
        // Tasks that are not jobs yet, for all arrays together, at most
        // `ARRAY_VIEW_BUDGET`, shared out evenly: the cycle's cost stays
        // bounded however many arrays wait, and every array is seen.
        let n_ready = arrays.iter().filter(|(_, ready)| *ready).count().max(1);
        let window = (arrays::ARRAY_VIEW_BUDGET / n_ready).clamp(arrays::ARRAY_VIEW_MIN, arrays::ARRAY_VIEW_WINDOW);
        for (array, ready) in arrays {
            let tasks = pending_tasks.remove(&array.id).unwrap_or_default();
            self.array_view(array, ready, tasks, window, &mut others);
        }
        // Tasks of arrays that ended on their own terms (none, normally).
        others.extend(pending_tasks.into_values().flatten());
        let windowed = gpool_core::sched::cycle::window_for(
            &nodes,
            &running,
            &self.policy,
            &self.queue,
            others.len(),
            !starts_only,
        );
        let mut pending: Vec<Arc<PendingJob>> = match windowed {
            Some(gpus) => self.queue.window(gpus).cloned().collect(),
            None => {
                let mut all = Vec::with_capacity(self.waiting.len());
                all.extend(
                    self.waiting
                        .values()
                        .filter(|waiting| waiting.plain())
                        .map(|waiting| waiting.view.clone()),
                );
                all
            }
        };
        pending.append(&mut others);
        ClusterView {
            nodes,
            pending,
            running,
            promised,
            usage: self.usage.clone(),
            waste_budget_gpu_secs: self.waste_budget(now),
            windowed: windowed.is_some(),
        }
    }

    /// Brings job `id`'s entry in `waiting` up to date: after anything
    /// that may change a pending job's view, hold or state.
    fn refresh_waiting(&mut self, id: JobId) {
        let old = match self.jobs.get(&id).filter(|job| job.state == JobState::Pending) {
            Some(job) => self.waiting.insert(id, Waiting::of(job, &self.queue)),
            None => self.waiting.remove(&id),
        };
        if let Some(old) = old {
            if old.plain() {
                self.queue.remove(&old.view);
            } else {
                self.not_plain.remove(&id);
            }
        }
        if let Some(new) = self.waiting.get(&id) {
            if new.plain() {
                self.queue.insert(new.view.clone());
            } else {
                self.not_plain.insert(id);
            }
        }
    }

    /// In debug builds (every test's gpoold), each cycle checks `waiting`
    /// against the jobs themselves.
    #[cfg(debug_assertions)]
    fn check_waiting(&self) {
        let expected: BTreeMap<JobId, Waiting> = self
            .active_jobs()
            .filter(|job| job.state == JobState::Pending)
            .map(|job| (job.id, Waiting::of(job, &self.queue)))
            .collect();
        let ids = expected.keys().chain(self.waiting.keys());
        if let Some(id) = ids.into_iter().find(|id| expected.get(id) != self.waiting.get(id)) {
            panic!(
                "the scheduler's copy of pending job {id} is stale: {:?}, the job gives {:?}",
                self.waiting.get(id),
                expected.get(id)
            );
        }
        for (id, waiting) in &self.waiting {
            let filed = if waiting.plain() {
                self.queue.contains(&waiting.view)
            } else {
                self.not_plain.contains(id)
            };
            assert!(filed, "waiting job {id} is missing from the scheduler's queue");
        }
        assert_eq!(
            self.queue.len() + self.not_plain.len(),
            self.waiting.len(),
            "the scheduler's queue holds jobs that do not wait"
        );
    }

    /// The nodes as the scheduler sees them, with the GPUs of `running`
    /// busy; nothing is launched where no agent is linked right now.
    fn node_views(&self, running: &[&Job]) -> Vec<NodeView> {
        let mut busy: HashMap<&str, Vec<u32>> = HashMap::new();
        for job in running {
            if let JobState::Running { placement, .. } = &job.state {
                for part in placement {
                    busy.entry(part.node.as_str()).or_default().extend(&part.gpu_indices);
                }
            }
        }
        self.nodes
            .values()
            .map(|node| {
                let mut view = NodeView::from_node(node, busy.get(node.name.as_str()).map_or(&[], Vec::as_slice));
                if !self.is_linked(&node.name) {
                    view.availability = gpool_core::sched::Availability::Down;
                }
                view
            })
            .collect()
    }

    /// Whether a scheduling cycle could start or preempt anything now
    /// (`gpool_core::sched::could_act`), looking at nodes and running jobs
    /// only: the pending queue is not read.
    pub fn cycle_could_act(&self) -> bool {
        let running: Vec<&Job> = self.running().collect();
        let running_views: Vec<_> = running.iter().copied().filter_map(running_view).collect();
        gpool_core::sched::could_act(&self.node_views(&running), &running_views, &self.policy)
    }

    /// Whether the newest job waits with no word yet on why (it was just
    /// submitted): then a cycle runs even where it could start nothing.
    /// Held jobs and jobs that wait on others are passed over (back to
    /// `UNEXPLAINED_LOOK_BACK` jobs): a cycle does not see them, so it
    /// never gives them words (they are their hold and their dependencies),
    /// and one such job last in line would make every cycle a whole one.
    pub fn newest_waits_unexplained(&self) -> bool {
        self.active
            .iter()
            .rev()
            .take(UNEXPLAINED_LOOK_BACK)
            .find(|id| {
                !self
                    .waiting
                    .get(id)
                    .is_some_and(|waiting| waiting.held || waiting.gated)
            })
            .and_then(|id| self.jobs.get(id))
            .is_some_and(|job| job.state == JobState::Pending && self.words.reasons(job.id).is_none())
    }

    /// Adds `node`'s samples to the GPU use of the attempts running there.
    fn count_gpu_use(&mut self, node: &str, samples: &[pb::GpuSample]) {
        let mut counted = Vec::new();
        for job in self.running_jobs_on(node) {
            let JobState::Running { placement, .. } = &job.state else {
                continue;
            };
            for part in placement.iter().filter(|part| part.node == node) {
                for sample in samples.iter().filter(|sample| part.gpu_indices.contains(&sample.index)) {
                    counted.push((job.id, sample.utilization_pct, sample.memory_used_mib));
                }
            }
        }
        for (id, utilization, memory) in counted {
            self.gpu_use_live.entry(id).or_default().add_sample(utilization, memory);
        }
    }

    /// For the running jobs on several GPUs with GPUs on `node`: which of
    /// their GPUs lag behind the others (latest samples of all their
    /// nodes), and which have for `straggler_after`.
    fn find_stragglers(&mut self, node: &str, now: Timestamp, out: &mut Batch) {
        use gpool_core::stragglers::{lagging, stragglers, GpuKey};
        let mut found = Vec::new();
        for job in self.running_jobs_on(node) {
            let JobState::Running { placement, .. } = &job.state else {
                continue;
            };
            let n_gpus: usize = placement.iter().map(|part| part.gpu_indices.len()).sum();
            if n_gpus < 2 || !placement.iter().any(|part| part.node == node) {
                continue;
            }
            let readings: Vec<(GpuKey, u32)> = placement
                .iter()
                .flat_map(|part| {
                    let samples = self.gpu_samples.get(&part.node).map_or(&[][..], Vec::as_slice);
                    samples
                        .iter()
                        .filter(|sample| part.gpu_indices.contains(&sample.index))
                        .map(|sample| {
                            let key = GpuKey {
                                node: part.node.clone(),
                                index: sample.index,
                            };
                            (key, sample.utilization_pct)
                        })
                })
                .collect();
            found.push((job.id, readings));
        }
        let after_ms = self.straggler_after.as_millis().min(i64::MAX as u128) as i64;
        for (id, readings) in found {
            let (median, lagging_now) = lagging(&readings);
            let since = self.lagging_since.entry(id).or_default();
            let now_straggling: Vec<Straggler> = stragglers(since, &lagging_now, now, after_ms)
                .into_iter()
                .map(|(gpu, began)| Straggler {
                    utilization_pct: readings.iter().find(|(key, _)| *key == gpu).map_or(0, |(_, pct)| *pct),
                    median_pct: median,
                    since: began,
                    gpu,
                })
                .collect();
            // Each GPU flagged, and each back in step, is an event in the
            // job's history.
            let before: Vec<Straggler> = self.stragglers.remove(&id).unwrap_or_default();
            let mut events = Vec::new();
            for straggler in &now_straggling {
                if !before.iter().any(|old| old.gpu == straggler.gpu) {
                    events.push(format!(
                        "straggler: {} GPU {} at {}% while the job's median is {}%, since {}",
                        straggler.gpu.node,
                        straggler.gpu.index,
                        straggler.utilization_pct,
                        straggler.median_pct,
                        straggler.since
                    ));
                }
            }
            for old in &before {
                if !now_straggling.iter().any(|straggler| straggler.gpu == old.gpu) {
                    events.push(format!(
                        "{} GPU {} is back in step with the job's others",
                        old.gpu.node, old.gpu.index
                    ));
                }
            }
            if !now_straggling.is_empty() {
                self.stragglers.insert(id, now_straggling);
            }
            if !events.is_empty() {
                let Some(job) = self.jobs.get_mut(&id) else { continue };
                for text in events {
                    tracing::warn!(job = %id, "{text}");
                    job.record_event(now, text);
                }
                out.writes.push(Write::Job(id));
            }
        }
    }

    /// The running jobs with GPUs on `node`.
    fn running_jobs_on(&self, node: &str) -> impl Iterator<Item = &Job> {
        self.running_on
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|id| self.job(*id))
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
            Some(last) if **last == *spec => last.clone(),
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

    /// For `singleton`: by (user, name), the job that runs, else the
    /// earliest pending singleton (which may start first). `waiting`: the
    /// pending jobs, by id.
    pub fn singleton_holders<'a>(&'a self, waiting: &[&'a Job]) -> HashMap<(&'a str, &'a str), JobId> {
        // Only the names of waiting singletons matter (usually none): the
        // running jobs are not hashed each cycle for nothing.
        let wanted: std::collections::HashSet<(&str, &str)> = waiting
            .iter()
            .filter(|job| job.spec.singleton && !job.held)
            .map(|job| (job.user.as_str(), job.spec.name.as_str()))
            .collect();
        let mut holders: HashMap<(&str, &str), JobId> = HashMap::new();
        if wanted.is_empty() {
            return holders;
        }
        for job in self.running() {
            let key = (job.user.as_str(), job.spec.name.as_str());
            if wanted.contains(&key) {
                holders.insert(key, job.id);
            }
        }
        for job in waiting.iter().filter(|job| job.spec.singleton && !job.held) {
            holders
                .entry((job.user.as_str(), job.spec.name.as_str()))
                .or_insert(job.id);
        }
        holders
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

    /// Where a pending job stands with its dependencies.
    pub fn dependency_state(&self, job: &Job, singletons: &HashMap<(&str, &str), JobId>) -> DepState {
        if job.spec.dependencies.is_empty() && !job.spec.singleton {
            return DepState::Met;
        }
        let holder = singletons
            .get(&(job.user.as_str(), job.spec.name.as_str()))
            .copied()
            .filter(|holder| *holder != job.id);
        dependency_state(job, |id| self.job(id), holder)
    }

    /// As `dependency_state`, for one job (the singleton scan only for a
    /// singleton).
    pub fn dependency_state_of(&self, job: &Job) -> DepState {
        if job.spec.dependencies.is_empty() && !job.spec.singleton {
            return DepState::Met;
        }
        let holder = job.spec.singleton.then(|| {
            self.active_jobs().find(|other| {
                other.id != job.id
                    && other.user == job.user
                    && other.spec.name == job.spec.name
                    && match other.state {
                        JobState::Running { .. } => true,
                        JobState::Pending => other.spec.singleton && !other.held && other.id < job.id,
                        _ => false,
                    }
            })
        });
        dependency_state(job, |id| self.job(id), holder.flatten().map(|other| other.id))
    }

    fn dependencies_met(&self, job: &Job, singletons: &HashMap<(&str, &str), JobId>) -> bool {
        self.dependency_state(job, singletons) == DepState::Met
    }

    /// Pending jobs whose dependency can never be met end, saying why.
    fn end_unmeetable_dependencies(&mut self, now: Timestamp, out: &mut Batch) {
        // A singleton only ever waits, so no holder is needed to see "never".
        let never: Vec<(JobId, String)> = self
            .active_jobs()
            .filter(|job| job.state == JobState::Pending && !job.spec.dependencies.is_empty())
            .filter_map(|job| match dependency_state(job, |id| self.job(id), None) {
                DepState::Never(reason) => Some((job.id, reason)),
                _ => None,
            })
            .collect();
        for (id, reason) in never {
            tracing::info!(job = %id, "its dependency can never be met: {reason}");
            self.apply_event(id, &JobEvent::DependencyNeverMet { reason, now }, now, out);
        }
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

/// Handles the API and the scheduling loop use to reach the state task.
#[derive(Clone)]
pub struct StateHandle {
    pub shared: SharedState,
    pub commands: mpsc::Sender<Command>,
    /// For agents' links: what comes this way is applied ahead of
    /// `commands`.
    pub agent_commands: mpsc::Sender<Command>,
    /// Ids of jobs whose state changed.
    pub job_changes: broadcast::Sender<JobId>,
    /// Woken when something happened that the scheduler should look at.
    pub sched_wakeup: Arc<Notify>,
}

impl StateHandle {
    pub async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, Error> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(make(reply)).await.map_err(|_| Error::ShuttingDown)?;
        answer.await.map_err(|_| Error::ShuttingDown)?
    }
}

impl Command {
    /// Whether applying it may change what a scheduling cycle sees, beside
    /// what it writes (`Write::seen_by_scheduler`): not so for the
    /// scheduler's own words, heartbeats, tokens, messages to agents, and
    /// ticks (a heartbeat or tick that changes anything writes it).
    fn may_change_schedule(&self) -> bool {
        !matches!(
            self,
            Command::Planned(_)
                | Command::AgentHeartbeat { .. }
                | Command::CreateToken { .. }
                | Command::RevokeToken { .. }
                | Command::Tick
                | Command::ToAgent { .. }
        )
    }
}

/// Most commands applied between two flushes.
const MAX_BATCH: usize = 4096;

/// How the state task talks to the rest besides replies. It holds no sender
/// of its own inbox: it ends once every `StateHandle` is gone, or once `stop`
/// turns true (then it refuses new commands and finishes the queued ones).
pub struct Notifiers {
    pub job_changes: broadcast::Sender<JobId>,
    pub sched_wakeup: Arc<Notify>,
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// The state task: applies commands in batches, writes them to sled, and
/// hands replies to the flusher. Returns when every sender is gone.
pub async fn run_state_task(
    shared: SharedState,
    notifiers: Notifiers,
    store: Store,
    (mut agent_inbox, mut inbox): (mpsc::Receiver<Command>, mpsc::Receiver<Command>),
    flusher: std::sync::mpsc::Sender<Vec<PendingReply>>,
    clock: fn() -> Timestamp,
) -> Result<(), Error> {
    let mut notifiers = notifiers;
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut closed = false;
    let (mut agents_gone, mut callers_gone) = (false, false);
    let mut evict_due = false;
    loop {
        // What agents said goes first (heartbeats keep nodes alive, and
        // their leases; job events free GPUs), then API work to fill the
        // batch: a queue of API commands never holds a heartbeat up.
        while batch.len() < MAX_BATCH {
            match agent_inbox.try_recv() {
                Ok(command) => batch.push(command),
                Err(_) => break,
            }
        }
        while batch.len() < MAX_BATCH {
            match inbox.try_recv() {
                Ok(command) => batch.push(command),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            if agents_gone && callers_gone {
                return Ok(());
            }
            tokio::select! {
                biased;
                command = agent_inbox.recv(), if !agents_gone => match command {
                    Some(command) => batch.push(command),
                    None => agents_gone = true,
                },
                command = inbox.recv(), if !callers_gone => match command {
                    Some(command) => batch.push(command),
                    None => callers_gone = true,
                },
                _ = notifiers.stop.wait_for(|stop| *stop), if !closed => {
                    inbox.close();
                    agent_inbox.close();
                    closed = true;
                }
            }
            continue;
        }
        let now = clock();
        let mut out = Batch::default();
        let mut state = shared.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Ended jobs leave memory once their records are written: those of
        // the batch before (a reader finds each in one place or the other).
        if evict_due {
            state.evict_ended();
        }
        let mut may_change_schedule = false;
        for command in batch.drain(..) {
            may_change_schedule |= command.may_change_schedule();
            apply_command(&mut state, command, now, &mut out);
        }
        let schedule_changed = may_change_schedule || out.writes.iter().any(Write::seen_by_scheduler);
        if schedule_changed {
            state.sched_generation += 1;
        }
        drop(state);
        // Records are encoded and written under a read lock: API readers go
        // on meanwhile, and nothing else writes the state (this task is its
        // only writer).
        let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let written = write_all(&store, &state, &out.writes);
        evict_due = written.is_ok();
        if !out.messages.is_empty() {
            out.replies
                .push(state.deliver_after_flush(std::mem::take(&mut out.messages)));
        }
        drop(state);
        if let Err(err) = written {
            for reply in out.replies {
                reply(Err(Error::Storage(err.to_string())));
            }
            return Err(err);
        }
        if !out.changed.is_empty() {
            // Watchers hear of a change only once it is durable.
            let job_changes = notifiers.job_changes.clone();
            let changed = std::mem::take(&mut out.changed);
            out.replies.push(Box::new(move |flushed: Result<(), Error>| {
                if flushed.is_ok() {
                    changed.into_iter().for_each(|id| drop(job_changes.send(id)));
                }
            }));
        }
        if schedule_changed {
            notifiers.sched_wakeup.notify_one();
        }
        if !out.replies.is_empty() && flusher.send(out.replies).is_err() {
            return Err(Error::Storage("the flusher stopped".into()));
        }
    }
}

fn apply_command(state: &mut State, command: Command, now: Timestamp, out: &mut Batch) {
    match command {
        Command::Submit { caller, specs, reply } => match state.submit(&caller, specs, now) {
            Ok((ids, writes)) => {
                out.writes.extend(writes);
                out.replies.push(deferred(reply, ids));
            }
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Cancel {
            caller,
            ids,
            mode,
            reply,
        } => match state.cancel(&caller, &ids, mode, now, out) {
            Ok(outcomes) => out.replies.push(deferred(reply, outcomes)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Update {
            caller,
            ids,
            change,
            reply,
        } => match state.update(&caller, &ids, change, out) {
            Ok(outcomes) => out.replies.push(deferred(reply, outcomes)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Drain {
            caller,
            node,
            reason,
            at_once,
            gpu: Some(gpu),
            reply,
        } => match state.set_gpu_drain(&caller, &node, gpu, Some((reason, at_once)), now, out) {
            Ok(node) => out.replies.push(deferred(reply, node)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Drain {
            caller,
            node,
            reason,
            at_once,
            gpu: None,
            reply,
        } => {
            let drained = state.set_drain(&caller, &node, Some(reason), now);
            if at_once && drained.is_ok() {
                let why = format!("{node} was drained at once");
                state.requeue_jobs_on(&node, (gpool_core::model::RequeueCause::Requeued, &why), now, out);
            }
            node_reply(drained, reply, out)
        }
        Command::RemoveNode { caller, node, reply } => match state.remove_node(&caller, &node, out) {
            Ok(()) => out.replies.push(deferred(reply, node)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Resume {
            caller,
            node,
            gpu: Some(gpu),
            reply,
        } => match state.set_gpu_drain(&caller, &node, gpu, None, now, out) {
            Ok(node) => out.replies.push(deferred(reply, node)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Resume {
            caller,
            node,
            gpu: None,
            reply,
        } => node_reply(state.set_drain(&caller, &node, None, now), reply, out),
        Command::Planned(words) => {
            state.words = *words;
            state.lend_task_reasons_to_arrays();
        }
        Command::Start { starts } => state.start(starts, now, out),
        Command::Preempt { preemptions, holds } => state.preempt(preemptions, holds, now, out),
        Command::Reload {
            caller,
            config,
            revoked,
            reply,
        } => drop(reply.send(state.reload(caller.as_ref(), *config, &revoked))),
        Command::CreateToken { caller, request, reply } => match state.create_token(&caller, request, now) {
            Ok((record, text, writes)) => {
                out.writes.extend(writes);
                out.replies.push(deferred(reply, (record, text)));
            }
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::RevokeToken { caller, id, reply } => match state.revoke_token(&caller, id, now) {
            Ok((record, writes)) => {
                out.writes.extend(writes);
                out.replies.push(deferred(reply, record));
            }
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Checkpoint {
            caller,
            job,
            attempt,
            reply,
        } => match state.checkpoint(&caller, job, attempt, now, out) {
            Ok(outcome) => out.replies.push(deferred(reply, outcome)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::AgentRegister {
            node,
            running,
            ended,
            conn,
            reply,
        } => {
            state.register_agent(node, running, ended, conn, now, out);
            out.replies.push(deferred(reply, ()));
        }
        Command::AgentHeartbeat {
            node,
            conn_id,
            samples,
            seq,
            xids,
            health_check,
            spool_short,
            readings_stuck,
        } => {
            if state.is_current_link(&node, conn_id) {
                state.heartbeat(&node, conn_id);
                state.grant_lease(&node, seq);
                state.assess_health(&node, &samples, &xids, health_check, now, out);
                state.assess_agent_drain(&node, health::SPOOL_DRAIN, &spool_short, now, out);
                state.assess_agent_drain(&node, health::READINGS_DRAIN, &readings_stuck, now, out);
                state.count_gpu_use(&node, &samples);
                state.gpu_samples.insert(node.clone(), samples);
                state.find_stragglers(&node, now, out);
            }
        }
        Command::AgentJobEvent { node, conn_id, event } => state.agent_event(&node, conn_id, event, now, out),
        Command::AgentGone { node, conn_id } => state.agent_gone(&node, conn_id),
        Command::Tick => {
            state.end_unmeetable_dependencies(now, out);
            state.mark_silent_nodes_down(now, out);
            state.enforce_preemption_grace(now, out);
            state.remove_old_ended_jobs(now, out);
        }
        Command::ToAgent { node, message, reply } => drop(reply.send(state.send_now(&node, message))),
    }
}

fn node_reply(result: Result<(Node, Vec<Write>), Error>, reply: Reply<Node>, out: &mut Batch) {
    match result {
        Ok((node, writes)) => {
            out.writes.extend(writes);
            out.replies.push(deferred(reply, node));
        }
        Err(err) => drop(reply.send(Err(err))),
    }
}

fn write_all(store: &Store, state: &State, writes: &[Write]) -> Result<(), Error> {
    // Encoded a part at a time: a large batch goes on to its redo log as
    // it is encoded.
    let mut commit = store.begin();
    // A job touched many times in a batch (an array's record as its tasks
    // end) is encoded once.
    let mut jobs_written = std::collections::HashSet::new();
    for write in writes {
        let records = &mut commit.records;
        match write {
            Write::Job(id) if !jobs_written.insert(*id) => {}
            Write::Job(id) => state.jobs.get(id).into_iter().for_each(|job| records.job(job)),
            Write::JobEnv(id) => state.jobs.get(id).into_iter().for_each(|job| records.job_env(job)),
            Write::Node(name) | Write::NodeFaultSeen(name) => {
                state.nodes.get(name).into_iter().for_each(|node| records.node(node))
            }
            Write::ForgetNode(name) => records.remove_node(name),
            // Brought back into memory since (a new dependency): kept.
            Write::ForgetJob(id, _) if state.jobs.contains_key(id) => {}
            Write::ForgetJob(id, ended_at) => records.remove_job(*id, *ended_at),
            Write::NextJobId => records.next_job_id(state.next_job_id),
            Write::NextEpoch => records.next_epoch(state.next_epoch),
            Write::Usage(team) => state
                .usage
                .get(team)
                .into_iter()
                .for_each(|ledger| records.usage(team, ledger)),
            Write::Token(id) => state
                .tokens
                .get(id)
                .into_iter()
                .for_each(|record| records.token(record)),
            Write::Attempt(record) => records.attempt(record),
        }
        commit.spill_if_full()?;
    }
    commit.finish()
}

/// The flusher: one blocking thread that makes a batch durable with one
/// `flush`, then answers it. Returns the error that stopped it, if any.
pub fn run_flusher(db: sled::Db, batches: std::sync::mpsc::Receiver<Vec<PendingReply>>) -> Result<(), Error> {
    while let Ok(first) = batches.recv() {
        let mut replies = first;
        while let Ok(more) = batches.try_recv() {
            replies.extend(more);
        }
        match db.flush() {
            Ok(_) => replies.into_iter().for_each(|reply| reply(Ok(()))),
            Err(err) => {
                let message = err.to_string();
                replies
                    .into_iter()
                    .for_each(|reply| reply(Err(Error::Storage(message.clone()))));
                return Err(Error::Storage(message));
            }
        }
    }
    Ok(())
}
