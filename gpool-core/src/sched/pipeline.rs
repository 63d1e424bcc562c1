//! One cycle's plan as a pipeline of named steps: charge what runs to the
//! teams, classify the waiting jobs, order them, try each in turn (its
//! caps, its size and standing, a place, else GPUs to reclaim, else why
//! it waits), and finish the plan.

use super::index::FreeIndex;
use super::teams::{burst_reason, charge_running, classify, entitled, las_takes_back, order, Class, Cover, TeamRow};
use super::{
    backfill, lent, limits, preempt, ClusterView, FastHash, HostAsk, PendingJob, Plan, Policy, Reasons, Reject, Start,
};
use crate::ids::{JobId, Timestamp};
use crate::model::{GpuModel, NodePlacement};
use std::collections::{BTreeMap, HashMap, HashSet};

mod alike;
mod shares;

/// The plan for `view` (the whole queue's reasons where `explain_all`).
pub(super) fn plan_view(view: &ClusterView, policy: &Policy, now: Timestamp, explain_all: bool) -> Plan {
    debug_assert!(!(explain_all && view.windowed), "a whole plan of a windowed view");
    let (mut teams, usage_now) = charge_running(view, policy, now);
    let fair = policy.sharing.fair_shares(&usage_now, now);
    let (classes, job_class) = classify(view, policy, &mut teams, &fair);
    for (name, ledger) in &view.usage {
        if let Some(team) = teams.names.get(name.as_str()) {
            teams.rows[*team].used.guaranteed_secs += ledger.guaranteed_in_period(now, &policy.sharing);
        }
    }
    let (order, priorities) = order(view, policy, now, (&classes, &job_class), &teams);
    let claimants = preempt::claimants(view);
    let entitled = entitled(&claimants, &order, |job, class| {
        las_takes_back(&policy.sharing, &teams.rows[class.team], job, now)
    });
    let mut cycle = Cycle::new(view, policy, (now, explain_all), &fair, &entitled);
    cycle.plan.priorities = priorities;
    cycle.plan.released_claims = order
        .iter()
        .map(|(_, job, _)| job.id)
        .filter(|id| claimants.contains(id) && !entitled.contains(id))
        .collect();
    for (_, job, class) in order {
        // Free GPUs and possible reclaims only shrink within a cycle: once
        // both are gone, no later job starts or preempts.
        if cycle.out_of_room() {
            return cycle.plan;
        }
        let row = &mut teams.rows[class.team];
        if let Some(ask) = job.shape.share {
            // Not reused for alike jobs: whose jobs a shared GPU holds
            // decides whether it takes another.
            if !cycle.capped(job, row) {
                let (mut attempt, shape) = cycle.size_up(job, class, row);
                // Its shape's key does not say it is a fraction.
                attempt.cacheable = false;
                cycle.try_share(&attempt, row, shape, ask);
            }
            continue;
        }
        let alike = cycle.alike_key(job, row);
        if let Some(list) = cycle.failed_alike(alike) {
            cycle.plan.pending.push((job.id, list));
            continue;
        }
        if cycle.capped(job, row) {
            continue;
        }
        let (attempt, shape) = cycle.size_up(job, class, row);
        if attempt.cacheable && !attempt.into_reserve {
            if let Some(list) = cycle.failed.get(&shape).copied() {
                cycle.fails_alike(alike, list);
                cycle.plan.pending.push((job.id, list));
                continue;
            }
        }
        match cycle.place(&attempt) {
            Ok(placement) => cycle.start(&attempt, row, placement),
            Err(reasons) => {
                if let Some(reasons) = cycle.reclaim_for(&attempt, row, reasons) {
                    cycle.explain(&attempt, shape, row, reasons);
                }
            }
        }
    }
    cycle.finish()
}

/// What a cycle keeps while it tries the jobs in turn.
struct Cycle<'v> {
    view: &'v ClusterView,
    policy: &'v Policy,
    now: Timestamp,
    explain_all: bool,
    plan: Plan,
    index: FreeIndex<'v>,
    reclaim: preempt::Reclaimer<'v>,
    lent: lent::Lent,
    /// Backfill: the first job that cannot start (nor reclaim GPUs) gets a
    /// reservation, from when running jobs' time limits free enough GPUs;
    /// later jobs start ahead only if they end by then or stay off its
    /// GPUs (`masked`: the free GPUs minus the reserved ones). One job per
    /// cycle is tried for one (EASY backfill).
    reservation: Option<backfill::Reservation>,
    reservation_tried: bool,
    masked: Option<FreeIndex<'v>>,
    /// This cycle's starts and holds, with when each ends (if it has a
    /// time limit), for the reservation's estimate.
    ends: Vec<(Option<Timestamp>, Vec<NodePlacement>)>,
    /// The QoS classes that keep GPUs free for themselves (and above),
    /// each in some pool (`Qos::reserve_in_pool`). Burst work never takes
    /// them.
    reserves: Vec<&'v crate::policy::Qos>,
    /// Free GPUs, and running jobs that may still be preempted, only
    /// shrink within a cycle, so a job shape that found no room (nor GPUs
    /// to reclaim) fails again: later jobs of that shape reuse its reasons
    /// (a queue of thousands of alike jobs costs one placement attempt).
    /// Not where GPUs are kept for QoS reserves: what a job may take of
    /// them depends on what is free in its pool.
    failed: HashMap<ShapeKey<'v>, u32, FastHash>,
    /// In a windowed view, the jobs that would have taken kept GPUs: each
    /// must still fit once the cycle is done (see `window_gpus`).
    kept_from: Vec<&'v PendingJob>,
    /// Reasons no shape cache covers (jobs held off kept GPUs, or that may
    /// preempt where GPUs are kept): each list once in the plan, alike
    /// lists shared by their place there.
    alike_reasons: HashMap<Vec<Reject>, u32, FastHash>,
    user_use: limits::UserUse,
    /// The cached reasons (`failed`) a job of one shape (by address) and
    /// LAS standing met, and the cycle's `Stamp` then: while the stamp
    /// holds, a job of that shape and standing sizes up the same (its
    /// class, team row, caps, the free GPUs, the reservation are as they
    /// were) and meets them too, without being sized up.
    failed_by_shape: HashMap<(*const super::JobShape, bool), (alike::Stamp, u32), FastHash>,
    /// GPUs shared by fractions, and what each holds.
    shares: shares::Shares,
}

/// What decides whether a job fits and why not, within one cycle: its
/// class (by address: one `Class` per class), shape and standing.
#[derive(PartialEq, Eq, Hash)]
struct ShapeKey<'v> {
    class: usize,
    /// Jobs with requirements are alike only if they have the same.
    requires: Option<&'v crate::model::Requirements>,
    /// And the same CPU and memory asks, exclusivity and limits to have
    /// enforced.
    host: Option<HostAsk>,
    exclusive: bool,
    limits: crate::enforce::LimitSet,
    gpus_per_node: u32,
    nodes: u32,
    covered: bool,
    goes_around: bool,
    /// It may take back its team's jobs of later LAS queues.
    takes_back: bool,
}

/// One job as the cycle tries it: its size and standing now.
struct Attempt<'v> {
    job: &'v PendingJob,
    gpus: u64,
    /// The guarantee it would run under (`None`: burst work).
    cover: Option<Cover>,
    /// GPUs kept from it for higher (or, for burst work, any) QoS classes,
    /// less those lent GPUs back.
    kept_now: u64,
    /// The class that may take every kept GPU, if changing to it helps.
    higher_class: Option<String>,
    /// Where the reserves asked for more than half the pool: what they
    /// asked, the pool's GPUs and its name.
    capped: Option<(u64, u64, String)>,
    keep: Option<preempt::Keep>,
    may_preempt: bool,
    /// It fits only by taking GPUs kept for others.
    into_reserve: bool,
    ends_at: Option<Timestamp>,
    /// It would end after the backfill reservation's start.
    goes_around: bool,
    /// Its reasons may be reused for its shape.
    cacheable: bool,
}

impl Attempt<'_> {
    fn covered(&self) -> bool {
        self.cover.is_some()
    }

    fn host(&self) -> (Option<HostAsk>, bool) {
        (self.job.shape.host, self.job.shape.exclusive)
    }
}

impl<'v> Cycle<'v> {
    fn new(
        view: &'v ClusterView,
        policy: &'v Policy,
        (now, explain_all): (Timestamp, bool),
        fair: &'v BTreeMap<String, f64>,
        entitled: &HashSet<JobId, FastHash>,
    ) -> Cycle<'v> {
        let mut index = FreeIndex::build(&view.nodes, policy).with_demand(&named_demand(view));
        let reclaim = preempt::Reclaimer::new(view, policy, fair, now, entitled);
        // GPUs promised to a waiting job are not free to others (CPUs: `hold`).
        for promise in view
            .promised
            .iter()
            .filter(|p| p.preempted_for.is_some_and(|j| reclaim.has_claim(j)))
        {
            let exclusive = view
                .pending
                .iter()
                .any(|j| Some(j.id) == promise.preempted_for && j.shape.exclusive);
            index.remove(&promise.placement, (None, exclusive));
        }
        let plan = Plan {
            complete: !view.windowed,
            ..Plan::default()
        };
        Cycle {
            view,
            policy,
            now,
            explain_all,
            plan,
            index,
            reclaim,
            lent: lent::Lent::of(view, policy, now),
            reservation: None,
            reservation_tried: false,
            masked: None,
            ends: Vec::new(),
            reserves: policy.sharing.qos.iter().filter(|qos| qos.reserves_any()).collect(),
            failed: HashMap::default(),
            kept_from: Vec::new(),
            alike_reasons: HashMap::default(),
            user_use: limits::UserUse::of(&policy.sharing, &view.running),
            failed_by_shape: HashMap::default(),
            shares: shares::Shares::of(view),
        }
    }

    fn still_fit(&self) -> bool {
        self.kept_from.iter().all(|job| self.index.fits(job, self.policy))
    }

    /// Nothing is free and nothing may be reclaimed: in a starts-only
    /// plan, the rest of the queue is left unexplained.
    fn out_of_room(&mut self) -> bool {
        if self.explain_all || self.index.any_free() || self.reclaim.may_act() || self.shares.may_take(self.view) {
            return false;
        }
        self.plan.complete = false;
        self.plan.reservation = None;
        self.plan.needs_whole = !self.still_fit();
        true
    }

    /// Its team's or user's cap holds it back (and it says so).
    fn capped(&mut self, job: &PendingJob, row: &TeamRow) -> bool {
        let (team, used) = (&row.terms, &row.used);
        let gpus = job.total_gpus();
        let sharing = &self.policy.sharing;
        let cap = match team.max_gpus {
            Some(max_gpus) if used.in_use + gpus > u64::from(max_gpus) => Some(Reject::TeamCap {
                team: team.name.clone(),
                max_gpus,
                in_use: used.in_use,
            }),
            _ => self
                .user_use
                .check(sharing, &job.user, &job.shape.team, &job.shape.qos, gpus),
        };
        let capped = cap.is_some();
        if let Some(cap) = cap {
            self.plan.wait(job.id, Reasons::from([cap]));
        }
        capped
    }

    /// The job's size and standing now, and the key of its shape.
    fn size_up(&self, job: &'v PendingJob, class: &Class, row: &TeamRow) -> (Attempt<'v>, ShapeKey<'v>) {
        let gpus = job.total_gpus();
        let cover = class.coverage(&row.terms, &row.used, job);
        let covered = cover.is_some();
        let qos_priority = class.qos_priority;
        // What each class keeps in the job's pool: (priority, GPUs, name).
        let reserves = self.reserves.iter().map(|qos| {
            (
                qos.priority,
                u64::from(qos.reserve_in_pool(class.pool)),
                qos.name.as_str(),
            )
        });
        let asked: u64 = reserves
            .clone()
            .filter(|(priority, _, _)| *priority > qos_priority || !covered)
            .map(|(_, n, _)| n)
            .sum();
        // The pool's size matters only where something is kept (most
        // pools, most cycles: nothing).
        let pool_gpus = if asked > 0 {
            self.index.pool_gpus(job, self.policy)
        } else {
            0
        };
        let kept = super::limits::capped_reserve(asked, pool_gpus);
        let capped = (kept < asked).then(|| (asked, pool_gpus, class.pool.to_string()));
        // The class that may take every kept GPU, if changing to it helps:
        // burst work never takes kept GPUs, whatever its class.
        let higher = reserves
            .filter(|(priority, n, _)| covered && *priority > qos_priority && *n > 0)
            .max_by_key(|(priority, _, _)| *priority);
        // Guaranteed work may take kept GPUs that lent ones back (`lent`);
        // a reclaiming job leaves them all, as its victims lend no more.
        let kept_now = higher.map_or(kept, |(top, _, _)| self.lent.unbacked(job, self.policy, kept, top));
        let keep = (kept > 0).then(|| preempt::Keep {
            pool_free_now: self.index.pool_free(job, self.policy),
            kept,
        });
        let takes_back = las_takes_back(&self.policy.sharing, row, job, self.now);
        let may_preempt = covered || class.preempt_lower || takes_back;
        let ends_at = job
            .shape
            .time_limit_secs
            .map(|secs| Timestamp(self.now.0 + secs as i64 * 1000));
        let goes_around = match &self.reservation {
            Some(reserved) => ends_at.is_none_or(|end| end > reserved.at),
            None => false,
        };
        let shape = ShapeKey {
            class: std::ptr::from_ref(class) as usize,
            requires: job.shape.requires.as_deref(),
            host: job.shape.host,
            exclusive: job.shape.exclusive,
            limits: job.shape.limits,
            gpus_per_node: job.shape.gpus_per_node,
            nodes: job.shape.nodes,
            covered,
            goes_around,
            takes_back,
        };
        let attempt = Attempt {
            job,
            gpus,
            cover,
            kept_now,
            higher_class: higher.map(|(_, _, name)| name.to_string()),
            capped,
            keep,
            may_preempt,
            // It may reclaim burst GPUs instead, if it may preempt, and
            // holds no reservation.
            into_reserve: keep.is_some_and(|keep| keep.pool_free_now < gpus + kept_now)
                && self.index.fits(job, self.policy),
            ends_at,
            goes_around,
            cacheable: !may_preempt || keep.is_none(),
        };
        (attempt, shape)
    }

    /// Free GPUs for it (around the backfill reservation's, where it
    /// would end after that starts), or why not.
    fn place(&mut self, attempt: &Attempt) -> Result<Vec<NodePlacement>, Vec<Reject>> {
        let (job, policy, host) = (attempt.job, self.policy, attempt.host());
        match self.masked.as_mut() {
            _ if attempt.into_reserve => Err(vec![Reject::Reserved {
                gpus: attempt.kept_now,
                higher_class: attempt.higher_class.clone(),
                burst: attempt.cover.is_none(),
                capped: attempt.capped.clone(),
            }]),
            Some(masked) if attempt.goes_around => masked
                .place(job, policy)
                .inspect(|placement| self.index.remove(placement, host)),
            Some(masked) => self
                .index
                .place(job, policy)
                .inspect(|placement| masked.remove(placement, host)),
            None => self.index.place(job, policy),
        }
    }

    /// What its GPUs count against: its team, its user, its guarantee.
    fn charge(&mut self, attempt: &Attempt, row: &mut TeamRow, gpus: u64) {
        let shape = &attempt.job.shape;
        row.used.in_use += gpus;
        self.user_use
            .add(&self.policy.sharing, &attempt.job.user, &shape.team, &shape.qos, gpus);
        if let Some(cover) = &attempt.cover {
            row.used.add(cover, gpus);
        }
    }

    /// It starts on `placement`.
    fn start(&mut self, attempt: &Attempt, row: &mut TeamRow, placement: Vec<NodePlacement>) {
        self.reclaim.taken(&placement, attempt.job.shape.host);
        // An exclusive job holds every GPU of its nodes.
        let gpus = placement
            .iter()
            .map(|p| p.gpu_indices.len() as u64)
            .sum::<u64>()
            .max(attempt.gpus);
        self.charge(attempt, row, gpus);
        self.launch(attempt, placement);
    }

    fn launch(&mut self, attempt: &Attempt, placement: Vec<NodePlacement>) {
        self.ends.push((attempt.ends_at, placement.clone()));
        self.plan.starts.push(Start {
            job: attempt.job.id,
            placement,
            burst: !attempt.covered(),
            share: None,
        });
    }

    /// A job that may preempt (or still has a claim) and found no room
    /// takes GPUs back: it waits on its victims (`Reclaiming`), or starts
    /// on the GPUs of victims that ended (`None`). Otherwise its reasons
    /// stand.
    fn reclaim_for(&mut self, attempt: &Attempt, row: &mut TeamRow, mut reasons: Vec<Reject>) -> Option<Vec<Reject>> {
        let job = attempt.job;
        for reason in &mut reasons {
            if let Reject::Resources { kept: of_free, .. } = reason {
                *of_free = attempt.kept_now;
            }
        }
        if !(attempt.may_preempt || self.reclaim.has_claim(job.id)) {
            return Some(reasons);
        }
        let victims_before = self.plan.preemptions.len();
        let planned = self.reclaim.plan(
            job,
            attempt.covered(),
            attempt.may_preempt,
            attempt.keep,
            &mut self.plan.preemptions,
        );
        self.lent.preempted(&self.plan.preemptions[victims_before..]);
        let Some((n_jobs, placement)) = planned else {
            return Some(reasons);
        };
        preempt::hold(
            (&placement, attempt.host()),
            &mut self.index,
            self.masked.as_mut(),
            &mut self.reclaim,
        );
        self.charge(attempt, row, attempt.gpus);
        if n_jobs == 0 {
            // Its victims have ended: it starts on their GPUs.
            self.launch(attempt, placement);
            return None;
        }
        self.plan.holds.push((job.id, placement));
        Some(vec![Reject::Reclaiming { n_jobs }])
    }

    /// Why it waits: its reasons, behind the backfill reservation (which it
    /// may become), beyond its guarantee; kept for its shape where alike
    /// jobs would fail alike.
    fn explain(&mut self, attempt: &Attempt<'v>, shape: ShapeKey<'v>, row: &TeamRow, mut reasons: Vec<Reject>) {
        let job = attempt.job;
        if attempt.into_reserve {
            if self.view.windowed {
                self.kept_from.push(job);
            }
            let list = self.shared(reasons);
            self.plan.pending.push((job.id, list));
            return;
        }
        let reclaiming = matches!(reasons.first(), Some(Reject::Reclaiming { .. }));
        if let Some(reserved) = self.reservation.as_ref().filter(|_| attempt.goes_around && !reclaiming) {
            if self.index.fits(job, self.policy) {
                reasons = vec![Reject::BehindReservation {
                    job: reserved.job,
                    in_secs: (reserved.at.0 - self.now.0).max(0) as u64 / 1000,
                }];
            }
        }
        let blocked = matches!(reasons.first(), Some(Reject::Resources { .. }));
        let no_estimate = !self.reservation_tried && blocked && !self.reserve_for(job);
        if !attempt.covered() {
            reasons.push(burst_reason(&row.terms, &row.used, attempt.gpus));
        }
        let cacheable = attempt.cacheable && !reclaiming;
        if no_estimate {
            if cacheable {
                let list = self.plan.list(Reasons::from(reasons.as_slice()));
                self.failed.insert(shape, list);
            }
            // Only the first blocked job's own: not cached for its shape.
            reasons.push(Reject::NoEstimate);
            self.plan.wait(job.id, reasons.into());
            return;
        }
        let list = if cacheable {
            let list = self.plan.list(Reasons::from(reasons.as_slice()));
            self.failed.insert(shape, list);
            list
        } else {
            self.shared(reasons)
        };
        self.plan.pending.push((job.id, list));
    }

    /// The first blocked job gets the backfill reservation, if running
    /// jobs' time limits ever free room for it; returns whether it did.
    fn reserve_for(&mut self, job: &PendingJob) -> bool {
        self.reservation_tried = true;
        let releases: Vec<backfill::Release> = self
            .view
            .running
            .iter()
            .map(|r| backfill::Release {
                ends_at: r.ends_at,
                placement: &r.placement,
            })
            .chain(self.ends.iter().map(|(ends_at, placement)| backfill::Release {
                ends_at: *ends_at,
                placement,
            }))
            .collect();
        let Some((at, placement)) = backfill::earliest_start(job, self.reclaim.nodes(), releases, self.policy) else {
            return false;
        };
        // The index holds what is free now (the nodes less this cycle's
        // starts and holds), as `reclaim.nodes()` does.
        let mut without_reserved = self.index.clone();
        without_reserved.remove(&placement, (job.shape.host, job.shape.exclusive));
        self.masked = Some(without_reserved);
        self.reservation = Some(backfill::Reservation {
            job: job.id,
            at,
            placement,
        });
        true
    }

    /// `reasons` as one list of the plan's, alike lists once.
    fn shared(&mut self, reasons: Vec<Reject>) -> u32 {
        let plan = &mut self.plan;
        *self
            .alike_reasons
            .entry(reasons)
            .or_insert_with_key(|reasons| plan.list(Reasons::from(reasons.as_slice())))
    }

    fn finish(mut self) -> Plan {
        self.plan.reservation = self.reservation.take().map(|r| (r.job, r.at, r.placement));
        self.plan.needs_whole = !self.still_fit();
        self.plan.rescinds = self.reclaim.unneeded();
        self.plan
    }
}

/// GPUs that waiting and running jobs ask for by model, for placement to
/// leave the scarce models to the jobs that need them.
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
