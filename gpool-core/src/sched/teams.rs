//! The teams of one cycle: what running work holds of each and under
//! which guarantee, the classes of waiting jobs, and the order they are
//! tried in (the pipeline's first steps, `pipeline.rs`).

use super::{ClusterView, FastHash, PendingJob, Policy, Reject, RunningJob};
use crate::ids::{JobId, Timestamp};
use crate::model::GpuModel;
use crate::policy::{PriorityInputs, Sharing};
use std::collections::{BTreeMap, HashMap, HashSet};

/// GPUs a team holds now, counting this cycle's starts and reclaims.
#[derive(Debug, Clone, Default)]
pub(super) struct TeamUse {
    pub(super) in_use: u64,
    /// Guaranteed GPUs under the team's general guarantee...
    pub(super) guaranteed_in_use: u64,
    /// ...and under each `guaranteed_in` entry (a pool or a GPU model).
    pub(super) guaranteed_in: BTreeMap<String, u64>,
    /// Guaranteed GPU-seconds this period, running attempts included.
    pub(super) guaranteed_secs: f64,
    /// The latest LAS queue (`Sharing::las`) of its running jobs that are
    /// not being preempted: its waiting jobs of earlier queues may take
    /// them back.
    pub(super) las_top: usize,
}

/// Which guarantee covers a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cover {
    /// The team's `guaranteed_in` entry for the job's pool or its one GPU model.
    Entry(String),
    General,
}

impl TeamUse {
    pub(super) fn add(&mut self, cover: &Cover, gpus: u64) {
        match cover {
            Cover::Entry(key) => *self.guaranteed_in.entry(key.clone()).or_default() += gpus,
            Cover::General => self.guaranteed_in_use += gpus,
        }
    }
}

/// Pending jobs alike in all but shape, size and age.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct ClassKey<'a> {
    pub(super) team: &'a str,
    pub(super) qos: &'a str,
    pub(super) pool: &'a str,
    pub(super) gpu_types: &'a [GpuModel],
}

/// What the jobs of one class share within a cycle.
pub(super) struct Class<'a> {
    /// Its row in `Teams`.
    pub(super) team: usize,
    pub(super) qos_priority: u32,
    pub(super) preempt_lower: bool,
    /// The pool's name (empty: no such pool).
    pub(super) pool: &'a str,
    pub(super) gpu_types: &'a [GpuModel],
    pub(super) fair_share: f64,
}

impl Class<'_> {
    /// The guarantee `job` of this class would run under, if any.
    pub(super) fn coverage(&self, team: &crate::policy::Team, used: &TeamUse, job: &PendingJob) -> Option<Cover> {
        coverage(team, used, job.total_gpus(), self.pool, self.gpu_types, false)
    }
}

/// Each team seen this cycle: its terms and what it holds.
#[derive(Default)]
pub(super) struct Teams<'a> {
    pub(super) names: HashMap<&'a str, usize, FastHash>,
    pub(super) rows: Vec<TeamRow>,
}

pub(super) struct TeamRow {
    pub(super) terms: crate::policy::Team,
    pub(super) used: TeamUse,
}

impl<'a> Teams<'a> {
    pub(super) fn index(&mut self, name: &'a str, sharing: &Sharing) -> usize {
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
pub(super) fn order_key(covered: bool, priority: f64, job: &PendingJob) -> (u128, u64) {
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
pub(super) fn coverage(
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

pub(super) fn burst_reason(team: &crate::policy::Team, used: &TeamUse, gpus: u64) -> Reject {
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

/// Running work charged to its teams: their usage up to `now`, and their
/// guaranteed GPUs in start order.
pub(super) fn charge_running<'v>(
    view: &'v ClusterView,
    policy: &'v Policy,
    now: Timestamp,
) -> (Teams<'v>, BTreeMap<String, crate::policy::Ledger>) {
    let sharing = &policy.sharing;
    let period_start = sharing.period.start(now, &sharing.time_zone);
    let mut teams = Teams::default();
    let mut usage_now = view.usage.clone();
    let mut running: Vec<&RunningJob> = view.running.iter().collect();
    running.sort_by_key(|r| (r.started_at, r.id));
    for job in running {
        let charge = |ledger: &mut crate::policy::Ledger| {
            ledger.charge_in(
                period_start,
                job.charged_gpus(),
                (job.started_at, now),
                job.burst,
                sharing.half_life_secs,
            )
        };
        // Most teams have a ledger already: a name is copied for a new one.
        match usage_now.get_mut(&job.team) {
            Some(ledger) => charge(ledger),
            None => charge(usage_now.entry(job.team.clone()).or_default()),
        }
        let team = teams.index(&job.team, sharing);
        let TeamRow { terms, used } = &mut teams.rows[team];
        used.in_use += job.gpus();
        if let Some(las) = sharing.las.as_ref().filter(|_| !job.preempting) {
            used.las_top = used.las_top.max(las.running_queue(job, now));
        }
        if !job.burst {
            let pool = policy.pool(&job.pool).map_or("", |pool| pool.name.as_str());
            let cover = coverage(terms, used, job.gpus(), pool, &job.gpu_types, true).unwrap_or(Cover::General);
            used.add(&cover, job.gpus());
            let from = job.started_at.max(period_start);
            used.guaranteed_secs += (now.0 - from.0).max(0) as f64 / 1000.0 * job.charged_gpus();
        }
    }
    (teams, usage_now)
}

/// Each waiting job's class (its index in the classes returned), looked up
/// once per job; what a class needs (its team, QoS, pool, fair share), once
/// per class. Jobs come in runs of one class (a team's batch): the last
/// one's class is tried before the table.
pub(super) fn classify<'v>(
    view: &'v ClusterView,
    policy: &'v Policy,
    teams: &mut Teams<'v>,
    fair: &BTreeMap<String, f64>,
) -> (Vec<Class<'v>>, Vec<u32>) {
    let sharing = &policy.sharing;
    let mut classes: Vec<Class> = Vec::new();
    let mut class_of: HashMap<ClassKey, u32, FastHash> = HashMap::default();
    let mut last: Option<(ClassKey, u32)> = None;
    // Jobs that share a shape (a batch, or alike jobs) share its class;
    // the view lists each shape's jobs together, so the last job's shape
    // is tried before the table.
    let mut by_shape: HashMap<*const super::JobShape, u32, FastHash> = HashMap::default();
    let mut last_shape: Option<(*const super::JobShape, u32)> = None;
    let job_class = view
        .pending
        .iter()
        .map(|job| {
            let shape = std::sync::Arc::as_ptr(&job.shape);
            match last_shape {
                Some((last, class)) if last == shape => return class,
                _ => {}
            }
            let class = match by_shape.get(&shape) {
                Some(class) => *class,
                None => {
                    let key = ClassKey {
                        team: &job.shape.team,
                        qos: &job.shape.qos,
                        pool: &job.shape.pool,
                        gpu_types: &job.shape.gpu_types,
                    };
                    let class = match &last {
                        Some((last_key, class)) if *last_key == key => *class,
                        _ => *class_of.entry(key).or_insert_with(|| {
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
                        }),
                    };
                    last = Some((key, class));
                    by_shape.insert(shape, class);
                    class
                }
            };
            last_shape = Some((shape, class));
            class
        })
        .collect();
    (classes, job_class)
}

/// A waiting job in the cycle's order, with its class.
pub(super) type Ordered<'v, 'c> = ((u128, u64), &'v PendingJob, &'c Class<'v>);

/// The waiting jobs in the order they are tried, and each one's priority.
pub(super) fn order<'v, 'c>(
    view: &'v ClusterView,
    policy: &Policy,
    now: Timestamp,
    (classes, job_class): (&'c [Class<'v>], &[u32]),
    teams: &Teams,
) -> (Vec<Ordered<'v, 'c>>, Vec<(JobId, crate::policy::Priority)>) {
    let sharing = &policy.sharing;
    let max_qos = sharing.max_qos_priority();
    let max_gpus = view.pending.iter().map(|job| job.total_gpus()).max().unwrap_or(0);
    let mut priorities = Vec::with_capacity(view.pending.len());
    // Jobs come in runs of one class and size: the last one's coverage
    // (teams' use does not change while the order is made) is reused.
    let mut last_cover: Option<((u32, u64), bool)> = None;
    let mut order: Vec<Ordered> = view
        .pending
        .iter()
        .map(|job| &**job)
        .zip(job_class)
        .map(|(job, class_idx)| {
            let class = &classes[*class_idx as usize];
            let gpus = job.total_gpus();
            let inputs = PriorityInputs {
                qos_priority: class.qos_priority,
                max_qos_priority: max_qos,
                fair_share: class.fair_share,
                submitted_at: job.submitted_at,
                now,
                gpus,
                max_gpus,
                nice: job.shape.priority,
            };
            let priority = crate::policy::priority(&sharing.weights, &inputs);
            priorities.push((job.id, priority));
            let covered = match last_cover {
                Some((key, covered)) if key == (*class_idx, gpus) => covered,
                _ => {
                    let TeamRow { terms, used } = &teams.rows[class.team];
                    let covered = class.coverage(terms, used, job).is_some();
                    last_cover = Some(((*class_idx, gpus), covered));
                    covered
                }
            };
            (order_key(covered, priority.total, job), job, class)
        })
        .collect();
    // Keys are unique (the id is in them), so a stable sort gives the
    // same order; it merges runs already in order, and a view that lists
    // each shape's jobs together, oldest first (`Queue::iter`), is a run
    // per shape: a queue of thousands sorts in a few passes.
    order.sort_by_key(|(key, _, _)| *key);
    // Where no waiting job ran before, every one is in queue 0.
    if let Some(las) = sharing
        .las
        .as_ref()
        .filter(|_| view.pending.iter().any(|job| job.service_gpu_secs > 0))
    {
        least_served_first(&mut order, |job| las.waiting_queue(job, now));
    }
    (order, priorities)
}

/// Within each team, its jobs in LAS queue order (then as they were):
/// each team keeps the places in `order` its jobs held, so the order
/// between teams is the priority order's. A counting sort: queues are
/// few, and a team's places go in turn to its jobs of queue 0, then of
/// queue 1, and so on.
pub(super) fn least_served_first(order: &mut [Ordered], queue: impl Fn(&PendingJob) -> usize) {
    // Each place's team and its job's queue, read once.
    let tagged: Vec<(usize, usize)> = order.iter().map(|(_, job, class)| (class.team, queue(job))).collect();
    let n_teams = tagged.iter().map(|(team, _)| team + 1).max().unwrap_or(0);
    let n_queues = tagged.iter().map(|(_, queue)| queue + 1).max().unwrap_or(0);
    // Per team: the highest queue so far, and whether a later job of the
    // team is in a lower one (else its jobs are in queue order already).
    let mut top = vec![0; n_teams];
    let mut unsorted = vec![false; n_teams];
    for &(team, queue) in &tagged {
        unsorted[team] |= queue < top[team];
        top[team] = top[team].max(queue);
    }
    if !unsorted.contains(&true) {
        return;
    }
    // Per team and queue, how many of the team's jobs wait there, then
    // the rank among the team's places that its next job of that queue
    // takes; and where each team's places begin in `places`.
    let mut next = vec![0usize; n_teams * n_queues];
    let mut begins = vec![0usize; n_teams + 1];
    for &(team, queue) in tagged.iter().filter(|(team, _)| unsorted[*team]) {
        next[team * n_queues + queue] += 1;
        begins[team + 1] += 1;
    }
    for team in 0..n_teams {
        begins[team + 1] += begins[team];
        let mut rank = 0;
        for count in &mut next[team * n_queues..(team + 1) * n_queues] {
            rank += std::mem::replace(count, rank);
        }
    }
    // Each unsorted team's places, in order.
    let mut places = vec![0usize; begins[n_teams]];
    let mut filled = begins.clone();
    for (place, &(team, _)) in tagged.iter().enumerate().filter(|(_, (team, _))| unsorted[*team]) {
        places[filled[team]] = place;
        filled[team] += 1;
    }
    // The unsorted teams' jobs, each with the place it goes to.
    let moved: Vec<(usize, Ordered)> = order
        .iter()
        .zip(&tagged)
        .filter(|(_, (team, _))| unsorted[*team])
        .map(|(entry, &(team, queue))| {
            let rank = &mut next[team * n_queues + queue];
            let place = places[begins[team] + *rank];
            *rank += 1;
            (place, *entry)
        })
        .collect();
    for (place, entry) in moved {
        order[place] = entry;
    }
}

/// What is being freed for a waiting job stays its while it may still
/// reclaim GPUs (within its guarantee, or of a class that preempts); one
/// that lost that standing leaves its victims to whoever needs them.
pub(super) fn entitled<S: std::hash::BuildHasher>(
    claimants: &HashSet<JobId, S>,
    order: &[Ordered],
    takes_back: impl Fn(&PendingJob, &Class) -> bool,
) -> HashSet<JobId, FastHash> {
    if claimants.is_empty() {
        return HashSet::default();
    }
    order
        .iter()
        .filter(|(key, job, class)| {
            let covered = key.0 >> 127 == 0;
            claimants.contains(&job.id) && (covered || class.preempt_lower || takes_back(job, class))
        })
        .map(|(_, job, _)| job.id)
        .collect()
}

/// Under LAS order (`Sharing::las`), whether `job` may take GPUs back
/// from running jobs of its own team (`row`) in a later queue.
pub(super) fn las_takes_back(sharing: &Sharing, row: &TeamRow, job: &PendingJob, now: Timestamp) -> bool {
    sharing
        .las
        .as_ref()
        .is_some_and(|las| row.used.las_top > 0 && las.waiting_queue(job, now) < row.used.las_top)
}
