//! `schedule(&ClusterView, &Policy, now) -> Plan`: the whole placement decision.
//!
//! Pending jobs that their team's guarantee covers go first, then the rest
//! (burst work); within each, by multi-factor priority (QoS, fair share,
//! age, size, the job's own `--priority`), then submit order. A guaranteed
//! job that does not fit reclaims GPUs from burst work by preemption
//! (`preempt.rs`), as does a job whose QoS may preempt lower classes. Each job
//! gets the best-fitting GPUs there are: the node group (GPUs of one model on
//! one node) with the fewest free GPUs that still fit, so large holes stay
//! open for large jobs; within the node, the best-connected GPUs (NVLink
//! before PCIe, `Topology::choose`). A gang (`nodes > 1`) gets `gpus_per_node` GPUs on
//! each of `nodes` distinct nodes of one model, or nothing. A job that does
//! not fit is skipped and the next one is tried (greedy, with backfill).

pub mod apply;
pub(super) mod backfill;
pub mod cycle;
pub use cycle::{cycle_needed, words_interval, LastCycle, RESTATE_IDLE_AFTER, WORDS_EVERY, WORDS_SHARE};
pub mod estimate;
pub mod gates;
mod index;
pub mod invariants;
pub mod las;
pub use las::Las;
mod lent;
pub mod limits;
mod narrowing;
mod node_view;
pub use node_view::{Availability, GpuView, HostAsk, HostHold, HostView, NodeView};
mod pipeline;
mod plan;
mod preempt;
pub mod promises;
pub use promises::{Promises, PROMISE_MS};
mod queue;
mod reason;
pub mod reservations;
pub mod waste;
pub use waste::WasteBudget;
mod teams;

pub use plan::{Plan, Preemption, Reasons, Reject, Start};
pub use queue::{window_gpus, Queue};
pub use reason::{Reason, ReasonFacts};

use crate::ids::{JobId, Timestamp};
use crate::model::{GpuModel, NodePlacement, PoolDef};
use crate::policy::{Ledger, Sharing};
use crate::topology::Topology;
use compact_str::CompactString;
use pipeline::plan_view;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the scheduler sees: nodes with their free GPUs, the queue, the
/// running jobs, and the teams' metered usage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterView {
    pub nodes: Vec<NodeView>,
    /// Shared with the daemon's own copy of each waiting job's view: a
    /// cycle's view of 100,000 waiting jobs costs a reference each, not
    /// a copy.
    pub pending: Vec<Arc<PendingJob>>,
    pub running: Vec<RunningJob>,
    /// Preempted attempts that ended (their GPUs free now) while the job
    /// they were preempted for (`preempted_for`) still waits: their GPUs
    /// are that job's, for a short while, and nobody else's.
    pub promised: Vec<RunningJob>,
    /// Per team; attempts still running are not in it.
    pub usage: BTreeMap<String, Ledger>,
    /// GPU-seconds of work preemption may still throw away this hour.
    pub waste_budget_gpu_secs: f64,
    /// `pending` holds only the jobs of each shape a starts-only cycle
    /// needs (`Queue::window`): a plan of it is never complete.
    pub windowed: bool,
}

/// A running job, as preemption and the teams' counts need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    pub id: JobId,
    /// The running attempt's epoch (a preemption names it, so a later
    /// attempt is never the one preempted).
    pub epoch: crate::ids::Epoch,
    pub user: String,
    pub team: String,
    pub qos: String,
    /// Its pool (empty: the default pool) and acceptable GPU models, which
    /// decide which of its team's guarantees it counts against.
    pub pool: String,
    pub gpu_types: Vec<GpuModel>,
    /// Started beyond its team's guarantee: preemptible.
    pub burst: bool,
    pub placement: Vec<NodePlacement>,
    pub started_at: Timestamp,
    pub last_checkpoint_at: Option<Timestamp>,
    /// Already told to checkpoint and end.
    pub preempting: bool,
    /// The pending job it is being preempted for: while that job waits,
    /// the GPUs this one frees are its, and nobody else's (so no new victim
    /// is taken for it while these end).
    pub preempted_for: Option<JobId>,
    /// When its time limit runs out; `None` if it has none.
    pub ends_at: Option<Timestamp>,
    /// GPU-seconds its earlier attempts used (`las`).
    pub service_before_gpu_secs: u64,
    /// A fraction of its one GPU (`NodeView::take_share`); `None`: whole.
    pub share: Option<crate::share::Share>,
}

impl RunningJob {
    /// `job` as it runs from `at` on `placement` (its limit ends it, if it
    /// has one): how the simulator and the start estimates see a start.
    pub fn started(
        job: &PendingJob,
        epoch: crate::ids::Epoch,
        burst: bool,
        placement: Vec<NodePlacement>,
        at: Timestamp,
    ) -> RunningJob {
        RunningJob {
            id: job.id,
            epoch,
            user: job.user.to_string(),
            team: job.shape.team.to_string(),
            qos: job.shape.qos.to_string(),
            pool: job.shape.pool.to_string(),
            gpu_types: job.shape.gpu_types.clone(),
            burst,
            placement,
            started_at: at,
            last_checkpoint_at: None,
            preempting: false,
            preempted_for: None,
            ends_at: job
                .shape
                .time_limit_secs
                .map(|secs| Timestamp(at.0.saturating_add(secs as i64 * 1000))),
            service_before_gpu_secs: job.service_gpu_secs,
            share: None,
        }
    }

    /// GPUs promised to `for_job` (`ClusterView::promised`): free now,
    /// freed for it by `id` (a victim that ended), or held for it while
    /// its victims end.
    pub fn promise(id: JobId, for_job: JobId, placement: Vec<NodePlacement>) -> RunningJob {
        RunningJob {
            id,
            epoch: crate::ids::Epoch(0),
            user: String::new(),
            team: String::new(),
            qos: String::new(),
            pool: String::new(),
            gpu_types: Vec::new(),
            burst: true,
            placement,
            started_at: Timestamp(0),
            last_checkpoint_at: None,
            preempting: true,
            preempted_for: Some(for_job),
            ends_at: None,
            service_before_gpu_secs: 0,
            share: None,
        }
    }

    pub fn gpus(&self) -> u64 {
        self.placement.iter().map(|p| p.gpu_indices.len() as u64).sum()
    }

    /// The GPUs it is charged for: a fraction's part of its GPU.
    pub fn charged_gpus(&self) -> f64 {
        match &self.share {
            Some(share) => share.part(),
            None => self.gpus() as f64,
        }
    }

    /// GPU-seconds it has used by `now`: its earlier attempts' and this
    /// one's so far.
    pub fn service_now(&self, now: Timestamp) -> u64 {
        las::service_after(self.service_before_gpu_secs, self.gpus(), self.started_at, now)
    }

    /// GPU-seconds a preemption now would throw away: since the last
    /// checkpoint, else since the start.
    pub fn lost_gpu_secs(&self, now: Timestamp) -> f64 {
        let since = self.last_checkpoint_at.unwrap_or(self.started_at).max(self.started_at);
        (now.0 - since.0).max(0) as f64 / 1000.0 * self.gpus() as f64
    }
}

/// The part of a pending job the scheduler needs: its id and age, and its
/// shape, which jobs submitted alike may share (gpoold's queue of jobs that
/// wait on GPUs alone holds one for a batch of 100,000 identical jobs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingJob {
    pub id: JobId,
    pub submitted_at: Timestamp,
    pub shape: Arc<JobShape>,
    /// Who submitted it (per-user caps count by it). Not part of its
    /// shape: a queue of many users' alike jobs stays one shape.
    pub user: CompactString,
    /// GPU-seconds its earlier attempts used (`las`), and since when it
    /// waits: its last attempt's end, else its submit.
    pub service_gpu_secs: u64,
    pub waiting_since: Timestamp,
}

/// What a pending job asks for. Jobs of one shape differ to a cycle in age
/// and id alone (the order of the fields is the queue's order of shapes).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobShape {
    /// Names are kept inline (up to 24 bytes): a cycle reads every pending
    /// job's, and a name on the heap is a cache miss each.
    pub team: CompactString,
    /// The reservation it runs in (`--reservation`); empty: none.
    pub reservation: CompactString,
    /// Empty means the default QoS.
    pub qos: CompactString,
    /// Empty means the policy's default pool.
    pub pool: CompactString,
    /// Acceptable models; empty means any.
    pub gpu_types: Vec<GpuModel>,
    pub gpus_per_node: u32,
    pub nodes: u32,
    /// The job's own `--priority` (nice).
    pub priority: i32,
    /// `None`: no limit (then it never runs ahead of a reservation).
    pub time_limit_secs: Option<u64>,
    /// Its requirements on nodes and GPUs; `None`: none.
    pub requires: Option<Arc<crate::model::Requirements>>,
    /// CPUs and memory it takes on each node; `None`: none asked.
    pub host: Option<HostAsk>,
    /// Only idle nodes, and every GPU of each (`--exclusive`).
    pub exclusive: bool,
    /// The limits it asks its nodes to enforce (`enforce::asked_by`).
    pub limits: crate::enforce::LimitSet,
    /// A fraction of one GPU (`crate::share`); `None`: whole GPUs.
    pub share: Option<crate::share::ShareAsk>,
}

impl JobShape {
    /// The shape of a job that asks for `spec`.
    pub fn of(spec: &crate::model::JobSpec) -> JobShape {
        JobShape {
            team: spec.team.clone(),
            reservation: spec.reservation.as_str().into(),
            qos: spec.qos.clone(),
            pool: spec.pool.clone(),
            gpu_types: spec.gpu_types.clone(),
            gpus_per_node: spec.gpus_per_node,
            nodes: spec.nodes,
            priority: spec.priority,
            time_limit_secs: spec.time_limit_secs,
            requires: (!spec.requires.is_empty()).then(|| Arc::new(spec.requires.clone())),
            host: HostAsk::of(spec),
            exclusive: spec.exclusive,
            limits: crate::enforce::asked_by(spec),
            share: spec.gpu_share,
        }
    }
}

impl PendingJob {
    pub fn total_gpus(&self) -> u64 {
        u64::from(self.shape.gpus_per_node) * u64::from(self.shape.nodes)
    }

    /// Its requirements let it run on `node` (name and labels).
    pub fn allows_node(&self, node: &NodeView) -> bool {
        self.shape
            .requires
            .as_deref()
            .is_none_or(|requires| requires.allows_node(&node.name, &node.labels))
    }

    /// `node` holds it to the limits it asks for, or `mode` lets it run
    /// where they are not held (with a warning gpoold keeps on it).
    pub fn enforced_on(&self, node: &NodeView, mode: crate::enforce::EnforceLimits) -> bool {
        mode == crate::enforce::EnforceLimits::Warn || self.shape.limits.is_subset(node.enforces)
    }

    /// Its requirements, its CPU and memory asks or the limits it asks
    /// to have enforced narrow the nodes and GPUs it may have.
    pub fn narrowed(&self) -> bool {
        self.shape.requires.is_some()
            || self.shape.share.is_some()
            || self.shape.host.is_some()
            || self.shape.exclusive
            || !self.shape.limits.is_empty()
    }

    /// Its CPU and memory asks fit what `free` leaves (`None`: a node
    /// that reports neither).
    pub fn allows_host(&self, free: Option<HostAsk>) -> bool {
        match (self.shape.host, free) {
            (Some(ask), Some(free)) => ask.fits_in(free),
            _ => true,
        }
    }

    /// Its requirements let it have a GPU with `memory_mib` of memory.
    pub fn allows_memory(&self, memory_mib: u64) -> bool {
        self.shape
            .requires
            .as_deref()
            .is_none_or(|requires| requires.allows_memory(memory_mib))
            && self
                .shape
                .share
                .is_none_or(|ask| ask.memory_mib == 0 || ask.memory_mib <= memory_mib)
    }

    pub fn nvlink(&self) -> crate::model::NvlinkNeed {
        self.shape
            .requires
            .as_deref()
            .map(|requires| requires.nvlink)
            .unwrap_or_default()
    }
}

/// Whether `n` of the `free` GPUs of a node can be all joined by NVLink.
pub(crate) fn nvlink_set_in(topology: &Topology, free: &[u32], n: usize) -> bool {
    n <= 1 || (free.len() >= n && topology.worst_link(&topology.choose(free, n)) == crate::topology::Link::Nvlink)
}

/// The operator's rules: pools, and how teams share them.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub pools: Vec<PoolDef>,
    pub default_pool: String,
    pub sharing: Sharing,
    /// Nodes kept for a window (`[[reservation]]`).
    pub reservations: Vec<reservations::Reservation>,
    /// Whether a node that cannot enforce a job's limits is no candidate
    /// for it (`refuse`) or takes it with a warning (`warn`).
    pub enforce_limits: crate::enforce::EnforceLimits,
}

impl Default for Policy {
    /// One pool, `default`, holding every node.
    fn default() -> Policy {
        Policy {
            pools: vec![PoolDef {
                name: "default".into(),
                selector: BTreeMap::new(),
                defaults: Default::default(),
            }],
            default_pool: "default".into(),
            sharing: Sharing::default(),
            reservations: Vec::new(),
            enforce_limits: Default::default(),
        }
    }
}

impl Policy {
    /// The pool a job named (empty: the default pool).
    pub fn pool(&self, name: &str) -> Option<&PoolDef> {
        let name = if name.is_empty() {
            self.default_pool.as_str()
        } else {
            name
        };
        self.pools.iter().find(|pool| pool.name == name)
    }
}

/// Whether a cycle over `nodes` and `running` at `now` could start or
/// preempt anything, whatever waits: some GPU is free on a node that takes
/// work, or some running job could be a victim (burst work; any job, where
/// a QoS preempts lower classes; under LAS order, a job past queue 0 near
/// its last checkpoint, `Las::may_be_taken`). Where it could not, a cycle would only
/// restate why jobs wait, at a cost that grows with the queue.
pub fn could_act(nodes: &[NodeView], running: &[RunningJob], policy: &Policy, now: Timestamp) -> bool {
    // A GPU fractions share with memory left may take another.
    let free = nodes.iter().any(|node| {
        node.availability == Availability::Up && node.gpus.iter().any(|gpu| !gpu.busy || gpu.has_shared_room())
    });
    let las = policy.sharing.las.as_ref();
    free || running
        .iter()
        .any(|job| job.burst || las.is_some_and(|las| las.may_be_taken(job, now)))
        || policy.sharing.qos.iter().any(|qos| qos.preempt_lower)
}

/// Decides which pending jobs start now and where, and which running jobs
/// to preempt for them, and why each other job waits. The same inputs give
/// the same plan.
pub fn schedule(view: &ClusterView, policy: &Policy, now: Timestamp) -> Plan {
    plan_cycle(view, policy, now, true)
}

/// As `schedule`, for the starts and preemptions alone (the same ones): it
/// stops once no GPU is free and no job could reclaim any, so the jobs
/// after that point get no reasons and the plan no reservation
/// (`Plan::complete` says whether it went through the whole queue). A
/// long queue then costs its ordering, not a look at every job.
pub fn schedule_starts(view: &ClusterView, policy: &Policy, now: Timestamp) -> Plan {
    plan_cycle(view, policy, now, false)
}

fn plan_cycle(view: &ClusterView, policy: &Policy, now: Timestamp, explain_all: bool) -> Plan {
    let Some(applied) = reservations::apply(view, &policy.reservations, now) else {
        return plan_view(view, policy, now, explain_all);
    };
    let mut plan = plan_view(&applied.view, policy, now, explain_all);
    // Jobs kept off reserved nodes say so first; those whose reservation
    // is closed wait for it.
    for at in 0..plan.pending.len() {
        let (id, list) = plan.pending[at];
        if let Some(kept_off) = applied.kept_off.get(&id) {
            let reasons = std::iter::once(kept_off.clone())
                .chain(plan.lists[list as usize].iter().cloned())
                .collect();
            plan.pending[at].1 = plan.list(reasons);
        }
    }
    // Always said: a starts-only plan that is complete gives the words.
    for (id, reason) in applied.closed {
        plan.wait(id, Reasons::from([reason]));
    }
    plan
}

/// GPUs wanted (waiting) or held (running) by jobs that name their models,
/// by model: what jobs that may take any model should leave alone.
/// Hashes the scheduler's own keys, which no caller chooses: fast, and
/// seeded per process all the same.
pub(super) type FastHash = foldhash::fast::RandomState;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod las_tests;
#[cfg(test)]
mod share_tests;
#[cfg(test)]
mod sharing_tests;

#[cfg(test)]
mod enforce_tests;
