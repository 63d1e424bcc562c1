//! The cluster state and its single owner, the state task.
//!
//! Every change is a `Command` sent to the state task: it applies the change
//! in memory, writes the touched records to sled, and hands the replies to
//! the flusher thread, which answers them once one `flush` covers them (group
//! commit). Readers share the in-memory state through a read lock.

pub mod store;

use crate::error::Error;
use gpool_core::feasibility::check_feasible;
use gpool_core::job_state::{JobEvent, JobState};
use gpool_core::model::{Job, JobSpec, Node};
use gpool_core::sched::{ClusterView, NodeView, PendingJob, Policy};
use gpool_core::{JobId, Timestamp};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use store::Store;
use tokio::sync::{broadcast, mpsc, oneshot, Notify};

/// Team a job goes to when it names none.
pub const DEFAULT_TEAM: &str = "default";

/// What the controller knows, in memory.
pub struct State {
    pub jobs: BTreeMap<JobId, Job>,
    pub nodes: BTreeMap<String, Node>,
    next_job_id: u64,
    /// Why each pending job waits, in words, from the latest scheduling
    /// cycle (shared between jobs with the same reasons); not durable.
    pub pending_reasons: HashMap<JobId, Arc<[String]>>,
    pub policy: Policy,
    admins: Vec<String>,
}

pub type SharedState = Arc<RwLock<State>>;

type Reply<T> = oneshot::Sender<Result<T, Error>>;

/// The closed set of changes.
pub enum Command {
    Submit {
        user: String,
        specs: Vec<JobSpec>,
        reply: Reply<Vec<JobId>>,
    },
    Cancel {
        user: String,
        ids: Vec<JobId>,
        reply: Reply<Vec<CancelOutcome>>,
    },
    Drain {
        user: String,
        node: String,
        reason: String,
        reply: Reply<Node>,
    },
    Resume {
        user: String,
        node: String,
        reply: Reply<Node>,
    },
    /// The scheduling loop's latest reasons for pending jobs.
    Planned { reasons: HashMap<JobId, Arc<[String]>> },
}

#[derive(Debug, Clone)]
pub struct CancelOutcome {
    pub id: JobId,
    pub state: JobState,
    pub cancelled: bool,
}

/// Records a command touched, to be written before its reply goes out.
enum Write {
    Job(JobId),
    Node(String),
    NextJobId,
}

/// An answer waiting for the flush that makes its change durable.
type PendingReply = Box<dyn FnOnce(Result<(), Error>) + Send>;

fn deferred<T: Send + 'static>(reply: Reply<T>, value: T) -> PendingReply {
    Box::new(move |flushed: Result<(), Error>| {
        let _ = reply.send(flushed.map(|()| value));
    })
}

impl State {
    pub fn new(loaded: store::Loaded, policy: Policy, admins: Vec<String>) -> State {
        State {
            jobs: loaded.jobs.into_iter().map(|job| (job.id, job)).collect(),
            nodes: loaded.nodes.into_iter().map(|node| (node.name.clone(), node)).collect(),
            next_job_id: loaded.next_job_id,
            pending_reasons: HashMap::new(),
            policy,
            admins,
        }
    }

    fn submit(&mut self, user: String, specs: Vec<JobSpec>, now: Timestamp) -> Result<(Vec<JobId>, Vec<Write>), Error> {
        if specs.is_empty() {
            return Err(Error::InvalidRequest {
                field: "specs",
                reason: "no job in the request".into(),
            });
        }
        let nodes: Vec<Node> = self.nodes.values().cloned().collect();
        let mut checked = Vec::with_capacity(specs.len());
        for (spec_idx, mut spec) in specs.into_iter().enumerate() {
            let index = spec_idx + 1;
            if spec.team.is_empty() {
                spec.team = DEFAULT_TEAM.to_string();
            }
            spec.validate().map_err(|source| Error::InvalidSpec { index, source })?;
            check_feasible(&spec, &self.policy, &nodes).map_err(|source| Error::Infeasible { index, source })?;
            checked.push(spec);
        }
        let mut ids = Vec::with_capacity(checked.len());
        let mut writes = Vec::with_capacity(checked.len() + 1);
        for spec in checked {
            let id = JobId(self.next_job_id);
            self.next_job_id += 1;
            let job = Job {
                id,
                spec,
                user: user.clone(),
                submitted_at: now,
                state: JobState::Pending,
                n_attempts: 0,
            };
            self.jobs.insert(id, job);
            ids.push(id);
            writes.push(Write::Job(id));
        }
        writes.push(Write::NextJobId);
        Ok((ids, writes))
    }

    fn cancel(&mut self, user: &str, ids: &[JobId], now: Timestamp) -> Result<(Vec<CancelOutcome>, Vec<Write>), Error> {
        if ids.is_empty() {
            return Err(Error::InvalidRequest {
                field: "ids",
                reason: "no job id given".into(),
            });
        }
        for id in ids {
            let job = self.jobs.get(id).ok_or(Error::UnknownJob(*id))?;
            if job.user != user && !self.is_admin(user) {
                return Err(Error::NotOwner {
                    user: user.into(),
                    job: *id,
                    owner: job.user.clone(),
                });
            }
        }
        let mut outcomes = Vec::with_capacity(ids.len());
        let mut writes = Vec::new();
        for id in ids {
            let job = self.jobs.get_mut(id).ok_or(Error::UnknownJob(*id))?;
            let cancelled = !job.state.is_finished();
            if cancelled {
                job.apply(&JobEvent::Cancel {
                    by: user.to_string(),
                    now,
                })
                .map_err(|err| Error::InvalidRequest {
                    field: "ids",
                    reason: format!("job {id}: {err}"),
                })?;
                writes.push(Write::Job(*id));
            }
            outcomes.push(CancelOutcome {
                id: *id,
                state: job.state.clone(),
                cancelled,
            });
        }
        Ok((outcomes, writes))
    }

    fn set_drain(&mut self, user: &str, name: &str, reason: Option<String>) -> Result<(Node, Vec<Write>), Error> {
        if !self.is_admin(user) {
            return Err(Error::InvalidRequest {
                field: "user",
                reason: format!("{user:?} is not an admin; only admins drain and resume nodes"),
            });
        }
        let node = self
            .nodes
            .get_mut(name)
            .ok_or_else(|| Error::UnknownNode(name.to_string()))?;
        node.drain_reason = reason;
        Ok((node.clone(), vec![Write::Node(name.to_string())]))
    }

    /// Dev mode makes every caller an admin (there is one user).
    fn is_admin(&self, user: &str) -> bool {
        self.admins.iter().any(|admin| admin == user || admin == "*")
    }

    /// The scheduler's input: nodes with busy GPUs marked, and the queue.
    pub fn cluster_view(&self) -> ClusterView {
        let mut busy: HashMap<&str, Vec<u32>> = HashMap::new();
        let mut pending = Vec::new();
        for job in self.jobs.values() {
            match &job.state {
                JobState::Pending => pending.push(PendingJob {
                    id: job.id,
                    priority: job.spec.priority,
                    gpus_per_node: job.spec.gpus_per_node,
                    nodes: job.spec.nodes,
                    gpu_types: job.spec.gpu_types.clone(),
                    pool: job.spec.pool.clone(),
                }),
                JobState::Running { placement, .. } => {
                    for part in placement {
                        busy.entry(part.node.as_str()).or_default().extend(&part.gpu_indices);
                    }
                }
                _ => {}
            }
        }
        let nodes = self
            .nodes
            .values()
            .map(|node| NodeView::from_node(node, busy.get(node.name.as_str()).map_or(&[], Vec::as_slice)))
            .collect();
        ClusterView { nodes, pending }
    }

    /// Which job holds each busy GPU, by (node, GPU index).
    pub fn gpu_holders(&self) -> HashMap<(&str, u32), JobId> {
        let mut holders = HashMap::new();
        for job in self.jobs.values() {
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
    mut inbox: mpsc::Receiver<Command>,
    flusher: std::sync::mpsc::Sender<Vec<PendingReply>>,
    clock: fn() -> Timestamp,
) {
    let mut notifiers = notifiers;
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut closed = false;
    loop {
        let n_received = tokio::select! {
            n_received = inbox.recv_many(&mut batch, MAX_BATCH) => n_received,
            _ = notifiers.stop.wait_for(|stop| *stop), if !closed => {
                inbox.close();
                closed = true;
                continue;
            }
        };
        if n_received == 0 {
            return;
        }
        let now = clock();
        let mut replies: Vec<PendingReply> = Vec::with_capacity(batch.len());
        let mut writes = Vec::new();
        let mut changed = Vec::new();
        let mut state = shared.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        for command in batch.drain(..) {
            apply_command(&mut state, command, now, &mut writes, &mut replies, &mut changed);
        }
        let written = write_all(&store, &state, &writes);
        drop(state);
        if let Err(err) = written {
            for reply in replies {
                reply(Err(Error::Storage(err.to_string())));
            }
            tracing::error!("writing to the state store failed, stopping: {err}");
            return;
        }
        for id in changed {
            let _ = notifiers.job_changes.send(id);
        }
        if !writes.is_empty() {
            notifiers.sched_wakeup.notify_one();
        }
        if !replies.is_empty() && flusher.send(replies).is_err() {
            return;
        }
    }
}

fn apply_command(
    state: &mut State,
    command: Command,
    now: Timestamp,
    writes: &mut Vec<Write>,
    replies: &mut Vec<PendingReply>,
    changed: &mut Vec<JobId>,
) {
    match command {
        Command::Submit { user, specs, reply } => match state.submit(user, specs, now) {
            Ok((ids, new_writes)) => {
                writes.extend(new_writes);
                replies.push(deferred(reply, ids));
            }
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Cancel { user, ids, reply } => match state.cancel(&user, &ids, now) {
            Ok((outcomes, new_writes)) => {
                changed.extend(outcomes.iter().filter(|o| o.cancelled).map(|o| o.id));
                writes.extend(new_writes);
                replies.push(deferred(reply, outcomes));
            }
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Drain {
            user,
            node,
            reason,
            reply,
        } => node_reply(state.set_drain(&user, &node, Some(reason)), reply, writes, replies),
        Command::Resume { user, node, reply } => {
            node_reply(state.set_drain(&user, &node, None), reply, writes, replies)
        }
        Command::Planned { reasons } => state.pending_reasons = reasons,
    }
}

fn node_reply(
    result: Result<(Node, Vec<Write>), Error>,
    reply: Reply<Node>,
    writes: &mut Vec<Write>,
    replies: &mut Vec<PendingReply>,
) {
    match result {
        Ok((node, new_writes)) => {
            writes.extend(new_writes);
            replies.push(deferred(reply, node));
        }
        Err(err) => drop(reply.send(Err(err))),
    }
}

fn write_all(store: &Store, state: &State, writes: &[Write]) -> Result<(), Error> {
    for write in writes {
        match write {
            Write::Job(id) => {
                if let Some(job) = state.jobs.get(id) {
                    store.put_job(job)?;
                }
            }
            Write::Node(name) => {
                if let Some(node) = state.nodes.get(name) {
                    store.put_node(node)?;
                }
            }
            Write::NextJobId => store.put_next_job_id(state.next_job_id)?,
        }
    }
    Ok(())
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
