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

pub(super) mod backfill;
pub mod cycle;
pub use cycle::{cycle_needed, words_interval, LastCycle, RESTATE_IDLE_AFTER, WORDS_EVERY, WORDS_SHARE};
pub mod estimate;
pub mod gates;
mod index;
pub mod invariants;
mod lent;
pub mod limits;
mod node_view;
pub use node_view::{Availability, GpuView, HostAsk, HostHold, HostView, NodeView};
mod plan;
mod preempt;
mod queue;
pub mod reservations;

pub use plan::{Plan, Preemption, Reasons, Reject, Start};
pub use queue::{window_gpus, Queue};

use crate::ids::{JobId, Timestamp};
use crate::model::{GpuModel, NodePlacement, PoolDef};
use crate::policy::{Ledger, PriorityInputs, Sharing};
use crate::topology::Topology;
use compact_str::CompactString;
use index::FreeIndex;
use std::collections::{BTreeMap, HashMap};
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
        }
    }

    pub fn gpus(&self) -> u64 {
        self.placement.iter().map(|p| p.gpu_indices.len() as u64).sum()
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

    /// Its requirements or its CPU and memory asks narrow the nodes and
    /// GPUs it may have.
    pub fn narrowed(&self) -> bool {
        self.shape.requires.is_some() || self.shape.host.is_some() || self.shape.exclusive
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

/// GPUs a team holds now, counting this cycle's starts and reclaims.
#[derive(Debug, Clone, Default)]
struct TeamUse {
    in_use: u64,
    /// Guaranteed GPUs under the team's general guarantee...
    guaranteed_in_use: u64,
    /// ...and under each `guaranteed_in` entry (a pool or a GPU model).
    guaranteed_in: BTreeMap<String, u64>,
    /// Guaranteed GPU-seconds this period, running attempts included.
    guaranteed_secs: f64,
}

/// Which guarantee covers a job.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cover {
    /// The team's `guaranteed_in` entry for the job's pool or its one GPU model.
    Entry(String),
    General,
}

impl TeamUse {
    fn add(&mut self, cover: &Cover, gpus: u64) {
        match cover {
            Cover::Entry(key) => *self.guaranteed_in.entry(key.clone()).or_default() += gpus,
            Cover::General => self.guaranteed_in_use += gpus,
        }
    }
}

/// Whether a cycle over `nodes` and `running` could start or preempt
/// anything, whatever waits: some GPU is free on a node that takes work,
/// or some running job could be a victim (burst work; any job, where a QoS
/// preempts lower classes). Where it could not, a cycle would only restate
/// why jobs wait, at a cost that grows with the queue.
pub fn could_act(nodes: &[NodeView], running: &[RunningJob], policy: &Policy) -> bool {
    let free = nodes
        .iter()
        .any(|node| node.availability == Availability::Up && node.gpus.iter().any(|gpu| !gpu.busy));
    free || running.iter().any(|job| job.burst) || policy.sharing.qos.iter().any(|qos| qos.preempt_lower)
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
    for (id, reasons) in &mut plan.pending {
        if let Some(kept_off) = applied.kept_off.get(id) {
            *reasons = std::iter::once(kept_off.clone())
                .chain(reasons.iter().cloned())
                .collect();
        }
    }
    // Always said: a starts-only plan that is complete gives the words.
    plan.pending.extend(
        applied
            .closed
            .into_iter()
            .map(|(id, reason)| (id, Reasons::from([reason]))),
    );
    plan
}

fn plan_view(view: &ClusterView, policy: &Policy, now: Timestamp, explain_all: bool) -> Plan {
    debug_assert!(!(explain_all && view.windowed), "a whole plan of a windowed view");
    let sharing = &policy.sharing;
    let period_start = sharing.period.start(now, &sharing.time_zone);
    let mut teams = Teams::default();
    let mut usage_now = view.usage.clone();
    // Running guaranteed work counts against the guarantees in start order.
    let mut running: Vec<&RunningJob> = view.running.iter().collect();
    running.sort_by_key(|r| (r.started_at, r.id));
    for job in running {
        usage_now
            .entry(job.team.clone())
            .or_default()
            .charge(job.gpus(), job.started_at, now, job.burst, sharing);
        let team = teams.index(&job.team, sharing);
        let TeamRow { terms, used } = &mut teams.rows[team];
        used.in_use += job.gpus();
        if !job.burst {
            let pool = policy.pool(&job.pool).map_or("", |pool| pool.name.as_str());
            let cover = coverage(terms, used, job.gpus(), pool, &job.gpu_types, true).unwrap_or(Cover::General);
            used.add(&cover, job.gpus());
            let from = job.started_at.max(period_start);
            used.guaranteed_secs += (now.0 - from.0).max(0) as f64 / 1000.0 * job.gpus() as f64;
        }
    }
    let fair = sharing.fair_shares(&usage_now, now);
    // Each job's class, looked up once per job; what a class needs (its
    // team, QoS, pool, fair share), once per class.
    let mut classes: Vec<Class> = Vec::new();
    let mut class_of: HashMap<ClassKey, u32, FastHash> = HashMap::default();
    // Jobs come in runs of one class (a team's batch): the last one's class
    // is tried before the table.
    let mut last: Option<(ClassKey, u32)> = None;
    let job_class: Vec<u32> = view
        .pending
        .iter()
        .map(|job| {
            let key = ClassKey {
                team: &job.shape.team,
                qos: &job.shape.qos,
                pool: &job.shape.pool,
                gpu_types: &job.shape.gpu_types,
            };
            if let Some((last_key, class)) = &last {
                if *last_key == key {
                    return *class;
                }
            }
            let class = *class_of.entry(key).or_insert_with(|| {
                let qos = sharing.qos(&job.shape.qos);
                classes.push(Class {
                    team: teams.index(&job.shape.team, sharing),
                    qos_priority: qos.map_or(0, |qos| qos.priority),
                    preempt_lower: qos.is_some_and(|qos| qos.preempt_lower),
                    pool: policy.pool(&job.shape.pool).map_or("", |pool| pool.name.as_str()),
                    gpu_types: &job.shape.gpu_types,
                    fair_share: fair.get(job.shape.team.as_str()).copied().unwrap_or(1.0),
                });
                classes.len() as u32 - 1
            });
            last = Some((key, class));
            class
        })
        .collect();
    for (name, ledger) in &view.usage {
        if let Some(team) = teams.names.get(name.as_str()) {
            teams.rows[*team].used.guaranteed_secs += ledger.guaranteed_in_period(now, sharing);
        }
    }

    let mut plan = Plan::default();
    let max_qos = sharing.max_qos_priority();
    let max_gpus = view.pending.iter().map(|job| job.total_gpus()).max().unwrap_or(0);
    let mut priorities: Vec<(JobId, crate::policy::Priority)> = Vec::with_capacity(view.pending.len());
    let mut order: Vec<((u128, u64), &PendingJob, &Class)> = view
        .pending
        .iter()
        .map(|job| &**job)
        .zip(&job_class)
        .map(|(job, class)| {
            let class = &classes[*class as usize];
            let inputs = PriorityInputs {
                qos_priority: class.qos_priority,
                max_qos_priority: max_qos,
                fair_share: class.fair_share,
                submitted_at: job.submitted_at,
                now,
                gpus: job.total_gpus(),
                max_gpus,
                nice: job.shape.priority,
            };
            let priority = crate::policy::priority(&sharing.weights, &inputs);
            priorities.push((job.id, priority));
            let TeamRow { terms, used } = &teams.rows[class.team];
            let covered = class.coverage(terms, used, job).is_some();
            (order_key(covered, priority.total, job), job, class)
        })
        .collect();
    plan.priorities = priorities;
    order.sort_unstable_by_key(|(key, _, _)| *key);

    let mut index = FreeIndex::build(&view.nodes, policy).with_demand(&named_demand(view));
    // What is being freed for a waiting job stays its while it may still
    // reclaim GPUs (within its guarantee, or of a class that preempts);
    // one that lost that standing leaves its victims to whoever needs them.
    let claimants = preempt::claimants(view);
    let entitled: std::collections::HashSet<JobId, FastHash> = order
        .iter()
        .filter(|(key, job, class)| {
            let covered = key.0 >> 127 == 0;
            !claimants.is_empty() && claimants.contains(&job.id) && (covered || class.preempt_lower)
        })
        .map(|(_, job, _)| job.id)
        .collect();
    plan.released_claims = order
        .iter()
        .map(|(_, job, _)| job.id)
        .filter(|id| claimants.contains(id) && !entitled.contains(id))
        .collect();
    let mut reclaim = preempt::Reclaimer::new(view, policy, &fair, now, &entitled);
    let mut lent = lent::Lent::of(view, policy, now);
    // GPUs promised to a waiting job are not free to others (CPUs: `hold`).
    for promise in view
        .promised
        .iter()
        .filter(|p| p.preempted_for.is_some_and(|j| reclaim.has_claim(j)))
    {
        let excl = view
            .pending
            .iter()
            .any(|j| Some(j.id) == promise.preempted_for && j.shape.exclusive);
        index.remove(&promise.placement, (None, excl));
    }
    // Backfill: the first job that cannot start (nor reclaim GPUs) gets a
    // reservation, from when running jobs' time limits free enough GPUs;
    // later jobs start ahead only if they end by then or stay off its GPUs
    // (`masked`: the free GPUs minus the reserved ones).
    let mut reservation: Option<backfill::Reservation> = None;
    // One job per cycle is tried for a reservation (EASY backfill).
    let mut reservation_tried = false;
    let mut masked: Option<FreeIndex> = None;
    let mut ends: Vec<(Option<Timestamp>, Vec<NodePlacement>)> = Vec::new();
    // GPUs kept free for QoS classes (and above); burst work never takes them.
    let reserves: Vec<(u32, u64, &str)> = sharing
        .qos
        .iter()
        .map(|qos| (qos.priority, u64::from(qos.reserve_gpus), qos.name.as_str()))
        .collect();
    // Free GPUs, and running jobs that may still be preempted, only shrink
    // within a cycle, so a job shape that found no room (nor GPUs to
    // reclaim) fails again: later jobs of that shape reuse its reasons (a
    // queue of thousands of alike jobs costs one placement attempt). Not
    // where GPUs are kept for QoS reserves: what a job may take of them
    // depends on what is free in its pool.
    let mut failed: HashMap<ShapeKey, Reasons, FastHash> = HashMap::default();
    plan.complete = !view.windowed;
    // In a windowed view, the jobs that would have taken kept GPUs: each
    // must still fit once the cycle is done (see `window_gpus`).
    let mut kept_from: Vec<&PendingJob> = Vec::new();
    // Reasons no shape cache covers (jobs held off kept GPUs, or that may
    // preempt where GPUs are kept): each list once, alike lists shared, as
    // words keep each list once by its address.
    let mut alike_reasons: HashMap<Vec<Reject>, Reasons, FastHash> = HashMap::default();
    let still_fit = |kept_from: &[&PendingJob], index: &FreeIndex| kept_from.iter().all(|job| index.fits(job, policy));
    let mut user_use = limits::UserUse::of(sharing, &view.running);
    for (_, job, class) in order {
        // Free GPUs and possible reclaims only shrink within a cycle: once
        // both are gone, no later job starts or preempts.
        if !explain_all && !index.any_free() && !reclaim.may_act() {
            plan.complete = false;
            plan.reservation = None;
            plan.needs_whole = !still_fit(&kept_from, &index);
            return plan;
        }
        let TeamRow { terms: team, used } = &mut teams.rows[class.team];
        let gpus = job.total_gpus();
        if let Some(max_gpus) = team.max_gpus {
            if used.in_use + gpus > u64::from(max_gpus) {
                let cap = Reject::TeamCap {
                    team: team.name.clone(),
                    max_gpus,
                    in_use: used.in_use,
                };
                plan.pending.push((job.id, Reasons::from([cap])));
                continue;
            }
        }
        let asks = &job.shape;
        if let Some(cap) = user_use.check(sharing, &job.user, &asks.team, &asks.qos, gpus) {
            plan.pending.push((job.id, Reasons::from([cap])));
            continue;
        }
        let cover = class.coverage(team, used, job);
        let covered = cover.is_some();
        let qos_priority = class.qos_priority;
        let kept: u64 = reserves
            .iter()
            .filter(|(priority, _, _)| *priority > qos_priority || !covered)
            .map(|(_, n, _)| n)
            .sum();
        // The class that may take every kept GPU, if changing to it helps:
        // burst work never takes kept GPUs, whatever its class.
        let higher = reserves
            .iter()
            .filter(|(priority, n, _)| covered && *priority > qos_priority && *n > 0)
            .max_by_key(|(priority, _, _)| *priority);
        let higher_class = higher.map(|(_, _, name)| name.to_string());
        // Guaranteed work may take kept GPUs that lent ones back (`lent`);
        // a reclaiming job leaves them all, as its victims lend no more.
        let kept_now = higher.map_or(kept, |(top, _, _)| lent.unbacked(job, policy, kept, *top));
        let keep = (kept > 0).then(|| preempt::Keep {
            pool_free_now: index.pool_free(job, policy),
            kept,
        });
        let may_preempt = covered || class.preempt_lower;
        // It fits only by taking GPUs kept for others: it may reclaim burst
        // GPUs instead, if it may preempt, and holds no reservation.
        let into_reserve = keep.is_some_and(|keep| keep.pool_free_now < gpus + kept_now) && index.fits(job, policy);
        let ends_at = job
            .shape
            .time_limit_secs
            .map(|secs| Timestamp(now.0 + secs as i64 * 1000));
        let goes_around = match &reservation {
            Some(reserved) => ends_at.is_none_or(|end| end > reserved.at),
            None => false,
        };
        let shape = ShapeKey {
            class: std::ptr::from_ref(class) as usize,
            requires: job.shape.requires.as_deref(),
            host: job.shape.host,
            exclusive: job.shape.exclusive,
            gpus_per_node: job.shape.gpus_per_node,
            nodes: job.shape.nodes,
            covered,
            goes_around,
        };
        let cacheable = !may_preempt || keep.is_none();
        if cacheable && !into_reserve {
            if let Some(reasons) = failed.get(&shape) {
                plan.pending.push((job.id, reasons.clone()));
                continue;
            }
        }
        let placed = match masked.as_mut() {
            _ if into_reserve => Err(vec![Reject::Reserved {
                gpus: kept_now,
                higher_class: higher_class.clone(),
            }]),
            Some(masked) if goes_around => masked
                .place(job, policy)
                .inspect(|placement| index.remove(placement, (job.shape.host, job.shape.exclusive))),
            Some(masked) => index
                .place(job, policy)
                .inspect(|placement| masked.remove(placement, (job.shape.host, job.shape.exclusive))),
            None => index.place(job, policy),
        };
        match placed {
            Ok(placement) => {
                reclaim.taken(&placement, job.shape.host);
                // An exclusive job holds every GPU of its nodes.
                let gpus = placement
                    .iter()
                    .map(|p| p.gpu_indices.len() as u64)
                    .sum::<u64>()
                    .max(gpus);
                ends.push((ends_at, placement.clone()));
                used.in_use += gpus;
                user_use.add(sharing, &job.user, &asks.team, &asks.qos, gpus);
                if let Some(cover) = &cover {
                    used.add(cover, gpus);
                }
                plan.starts.push(Start {
                    job: job.id,
                    placement,
                    burst: !covered,
                });
            }
            Err(mut reasons) => {
                for reason in &mut reasons {
                    if let Reject::Resources { kept: of_free, .. } = reason {
                        *of_free = kept_now;
                    }
                }
                if may_preempt || reclaim.has_claim(job.id) {
                    let victims_before = plan.preemptions.len();
                    let planned = reclaim.plan(job, covered, may_preempt, keep, &mut plan.preemptions);
                    lent.preempted(&plan.preemptions[victims_before..]);
                    if let Some((n_jobs, placement)) = planned {
                        preempt::hold(
                            (&placement, (job.shape.host, job.shape.exclusive)),
                            &mut index,
                            masked.as_mut(),
                            &mut reclaim,
                        );
                        used.in_use += gpus;
                        user_use.add(sharing, &job.user, &asks.team, &asks.qos, gpus);
                        if let Some(cover) = &cover {
                            used.add(cover, gpus);
                        }
                        if n_jobs == 0 {
                            // Its victims have ended: it starts on their GPUs.
                            ends.push((ends_at, placement.clone()));
                            plan.starts.push(Start {
                                job: job.id,
                                placement,
                                burst: !covered,
                            });
                            continue;
                        }
                        plan.holds.push((job.id, placement));
                        reasons = vec![Reject::Reclaiming { n_jobs }];
                    }
                }
                if into_reserve {
                    if view.windowed {
                        kept_from.push(job);
                    }
                    let shared = alike_reasons
                        .entry(reasons)
                        .or_insert_with_key(|reasons| Reasons::from(reasons.as_slice()))
                        .clone();
                    plan.pending.push((job.id, shared));
                    continue;
                }
                let reclaiming = matches!(reasons.first(), Some(Reject::Reclaiming { .. }));
                if let Some(reserved) = reservation.as_ref().filter(|_| goes_around && !reclaiming) {
                    if index.fits(job, policy) {
                        reasons = vec![Reject::BehindReservation {
                            job: reserved.job,
                            in_secs: (reserved.at.0 - now.0).max(0) as u64 / 1000,
                        }];
                    }
                }
                let mut no_estimate = false;
                let blocked = matches!(reasons.first(), Some(Reject::Resources { .. }));
                if !reservation_tried && blocked {
                    reservation_tried = true;
                    let releases: Vec<backfill::Release> = view
                        .running
                        .iter()
                        .map(|r| backfill::Release {
                            ends_at: r.ends_at,
                            placement: &r.placement,
                        })
                        .chain(ends.iter().map(|(ends_at, placement)| backfill::Release {
                            ends_at: *ends_at,
                            placement,
                        }))
                        .collect();
                    let earliest = backfill::earliest_start(job, reclaim.nodes(), releases, policy);
                    no_estimate = earliest.is_none();
                    if let Some((at, placement)) = earliest {
                        // The index holds what is free now (the nodes
                        // less this cycle's starts and holds), as
                        // `reclaim.nodes()` does.
                        let mut without_reserved = index.clone();
                        without_reserved.remove(&placement, (job.shape.host, job.shape.exclusive));
                        masked = Some(without_reserved);
                        reservation = Some(backfill::Reservation {
                            job: job.id,
                            at,
                            placement,
                        });
                    }
                }
                if !covered {
                    reasons.push(burst_reason(team, used, gpus));
                }
                if no_estimate {
                    if cacheable && !reclaiming {
                        failed.insert(shape, Reasons::from(reasons.as_slice()));
                    }
                    // Only the first blocked job's own: not cached for its shape.
                    reasons.push(Reject::NoEstimate);
                    plan.pending.push((job.id, reasons.into()));
                    continue;
                }
                let shared = if cacheable && !reclaiming {
                    let shared = Reasons::from(reasons.as_slice());
                    failed.insert(shape, shared.clone());
                    shared
                } else {
                    alike_reasons
                        .entry(reasons)
                        .or_insert_with_key(|reasons| Reasons::from(reasons.as_slice()))
                        .clone()
                };
                plan.pending.push((job.id, shared));
            }
        }
    }
    plan.reservation = reservation.map(|r| (r.job, r.at, r.placement));
    (plan.needs_whole, plan.rescinds) = (!still_fit(&kept_from, &index), reclaim.unneeded());
    plan
}

/// How long what is freed for a waiting job stays its past its last
/// victim's grace (and a victim's GPUs at least, once it ended): it starts
/// at the next cycle, within milliseconds, unless its standing changed.
pub const PROMISE_MS: i64 = 30_000;

/// Until when a job's claims hold once a victim with `grace_secs` of grace
/// is signalled at `now`.
pub fn claim_until(now: Timestamp, grace_secs: u64) -> Timestamp {
    Timestamp(now.0 + grace_secs as i64 * 1000 + PROMISE_MS)
}

/// Until when the GPUs of a victim that ended at `now` are promised: its
/// job's claims (`claim_until`), and at least `PROMISE_MS`.
pub fn promise_until(now: Timestamp, claims_until: Option<Timestamp>) -> Timestamp {
    claims_until.unwrap_or_default().max(Timestamp(now.0 + PROMISE_MS))
}

/// The GPUs of a reclaiming job's placement that a hold promises it (those
/// `takeable`: free, and promised to nobody yet), by node; the state task
/// and the simulator record them alike.
pub fn held_free(placement: &[NodePlacement], takeable: impl Fn(&str, u32) -> bool) -> Vec<NodePlacement> {
    placement
        .iter()
        .filter_map(|part| {
            let gpu_indices: Vec<u32> = part
                .gpu_indices
                .iter()
                .copied()
                .filter(|gpu| takeable(&part.node, *gpu))
                .collect();
            (!gpu_indices.is_empty()).then(|| NodePlacement {
                node: part.node.clone(),
                gpu_indices,
            })
        })
        .collect()
}

/// Whether GPU `gpu` of `node` is in one of `promised`'s placements.
pub fn is_promised(promised: &[&RunningJob], node: &str, gpu: u32) -> bool {
    promised.iter().any(|promise| {
        promise
            .placement
            .iter()
            .any(|part| part.node == node && part.gpu_indices.contains(&gpu))
    })
}

/// GPUs wanted (waiting) or held (running) by jobs that name their models,
/// by model: what jobs that may take any model should leave alone.
fn named_demand(view: &ClusterView) -> HashMap<&GpuModel, u64, FastHash> {
    let mut demand: HashMap<&GpuModel, u64, FastHash> = HashMap::default();
    let waiting = view.pending.iter().map(|job| (&job.shape.gpu_types, job.total_gpus()));
    let running = view.running.iter().map(|job| (&job.gpu_types, job.gpus()));
    for (models, gpus) in waiting.chain(running) {
        for model in models.iter() {
            *demand.entry(model).or_default() += gpus;
        }
    }
    demand
}

/// Hashes the scheduler's own keys, which no caller chooses: fast, and
/// seeded per process all the same.
pub(super) type FastHash = foldhash::fast::RandomState;

/// What decides whether a job fits and why not, within one cycle: its
/// class (by address: one `Class` per class), shape and standing.
#[derive(PartialEq, Eq, Hash)]
struct ShapeKey<'v> {
    class: usize,
    /// Jobs with requirements are alike only if they have the same.
    requires: Option<&'v crate::model::Requirements>,
    /// And the same CPU and memory asks, and exclusivity.
    host: Option<HostAsk>,
    exclusive: bool,
    gpus_per_node: u32,
    nodes: u32,
    covered: bool,
    goes_around: bool,
}

/// Pending jobs alike in all but shape, size and age.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ClassKey<'a> {
    team: &'a str,
    qos: &'a str,
    pool: &'a str,
    gpu_types: &'a [GpuModel],
}

/// What the jobs of one class share within a cycle.
struct Class<'a> {
    /// Its row in `Teams`.
    team: usize,
    qos_priority: u32,
    preempt_lower: bool,
    /// The pool's name (empty: no such pool).
    pool: &'a str,
    gpu_types: &'a [GpuModel],
    fair_share: f64,
}

impl Class<'_> {
    /// The guarantee `job` of this class would run under, if any.
    fn coverage(&self, team: &crate::policy::Team, used: &TeamUse, job: &PendingJob) -> Option<Cover> {
        coverage(team, used, job.total_gpus(), self.pool, self.gpu_types, false)
    }
}

/// Each team seen this cycle: its terms and what it holds.
#[derive(Default)]
struct Teams<'a> {
    names: HashMap<&'a str, usize, FastHash>,
    rows: Vec<TeamRow>,
}

struct TeamRow {
    terms: crate::policy::Team,
    used: TeamUse,
}

impl<'a> Teams<'a> {
    fn index(&mut self, name: &'a str, sharing: &Sharing) -> usize {
        *self.names.entry(name).or_insert_with(|| {
            self.rows.push(TeamRow {
                terms: sharing.team(name),
                used: TeamUse::default(),
            });
            self.rows.len() - 1
        })
    }
}

/// Where a job goes in the cycle's order, as integers (sorting a queue of
/// 100,000 compares nothing else): guaranteed jobs first, then the higher
/// priority, then the earlier submitted, then the lower id. (Among jobs
/// of one shape the earlier submitted never has the lower priority, so
/// their order is by age and id alone, as `Queue` keeps them.)
fn order_key(covered: bool, priority: f64, job: &PendingJob) -> (u128, u64) {
    // An f64's bits, made to sort as `f64::total_cmp` does, then reversed.
    let bits = priority.to_bits();
    let ascending = if bits >> 63 == 1 { !bits } else { bits | 1 << 63 };
    // A timestamp's bits, made to sort as the signed number does.
    let submitted = (job.submitted_at.0 as u64) ^ (1 << 63);
    (
        (u128::from(!covered) << 127) | (u128::from(!ascending) << 63) | u128::from(submitted >> 1),
        (submitted << 63) | (job.id.0 & (u64::MAX >> 1)),
    )
}

/// Which guarantee `gpus` more GPUs of `team` in `pool`, of `gpu_types`,
/// run under: the `guaranteed_in` entry of the pool (else of the job's one
/// GPU model) while it has room, else the general `guaranteed_gpus`; `None`
/// means burst work (no room, or the GPU-hour budget is spent, unless
/// `running`: work already started keeps its place).
fn coverage(
    team: &crate::policy::Team,
    used: &TeamUse,
    gpus: u64,
    pool: &str,
    gpu_types: &[GpuModel],
    running: bool,
) -> Option<Cover> {
    let under_budget = team
        .gpu_hours
        .is_none_or(|hours| used.guaranteed_secs < hours as f64 * 3600.0);
    if !under_budget && !running {
        return None;
    }
    let entry = match gpu_types {
        [model] if !team.guaranteed_in.contains_key(pool) => Some(model.as_str()),
        _ => Some(pool),
    }
    .filter(|key| team.guaranteed_in.contains_key(*key));
    if let Some(key) = entry {
        let in_use = used.guaranteed_in.get(key).copied().unwrap_or(0);
        if in_use + gpus <= u64::from(team.guaranteed_in[key]) {
            return Some(Cover::Entry(key.to_string()));
        }
    }
    (used.guaranteed_in_use + gpus <= u64::from(team.guaranteed_gpus)).then_some(Cover::General)
}

fn burst_reason(team: &crate::policy::Team, used: &TeamUse, gpus: u64) -> Reject {
    match team.gpu_hours {
        Some(hours) if used.guaranteed_secs >= hours as f64 * 3600.0 => Reject::OverBudget {
            team: team.name.clone(),
            gpu_hours: hours,
        },
        _ => Reject::BeyondGuarantee {
            team: team.name.clone(),
            guaranteed_gpus: team.guaranteed_gpus,
            in_use: used.guaranteed_in_use,
            wanted: gpus,
        },
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod sharing_tests;
