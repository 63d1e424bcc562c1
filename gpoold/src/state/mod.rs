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
mod launch_wire;
mod nodes;
mod outbox;
mod promises;
mod redo;
mod reservations;
pub use reservations::ReservationChange;
mod sharing;
pub mod store;
mod submit;
mod task;
mod update;
mod view;
pub mod words;

pub use access::NewToken;
pub use agents::{kill_message, signal_message};
pub use outbox::{Outbox, WeakOutbox, OUTBOX_CAPACITY};
use sharing::running_view;
pub use sharing::CheckpointOutcome;
pub use task::{run_flusher, run_state_task, Notifiers, StateHandle};
pub use update::JobUpdate;

use crate::error::Error;
use gpool_core::auth::token::{Key, TokenRecord};
use gpool_core::auth::{authorize, Action, Caller};
use gpool_core::deps::{dependency_state, DepState, DepTarget};
use gpool_core::feasibility::check_feasible;
use gpool_core::job_state::{ExitStatus, JobEvent, JobState};
use gpool_core::model::{Job, JobSpec, Node};
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
    /// Preempted attempts and when their grace ends; rebuilt on start.
    preempt_deadlines: BTreeMap<JobId, (Epoch, Timestamp)>,
    /// Preempted attempts whose preemption was withdrawn in their grace
    /// (`State::rescind`): not killed when it ends; not durable.
    withdrawn: std::collections::HashSet<JobId>,
    /// Reservations made at run time; `policy` holds them too.
    created_reservations: Vec<gpool_core::sched::reservations::Reservation>,
    /// The job each preempted attempt in its grace was preempted for; not
    /// durable (after a restart its GPUs go to whoever needs them first).
    preempted_for: HashMap<JobId, JobId>,
    /// GPUs of preempted attempts that ended while their job still waits:
    /// promised to it until it starts or the promise runs out; not durable.
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
            created_reservations: loaded.reservations,
            withdrawn: Default::default(),
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
        state.add_created_reservations();
        state
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
        self.add_created_reservations();
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
