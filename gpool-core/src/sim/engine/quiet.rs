//! When the replay may jump over its ticks to the next event: the last
//! cycle did nothing, and no cycle before the next arrival, end or window
//! could do anything either, whatever the clock says. Each condition is one
//! the scheduler cannot get past with time alone, so the decisions (and
//! every figure but the count of cycles) are those of a replay that ticks.

use super::*;
use crate::sched::{Availability, GpuView};

/// A pool and the GPU models a job allows in it.
type PoolModels<'a> = (&'a str, &'a [crate::model::GpuModel]);

impl Sim<'_> {
    /// Whether a tick now would start, preempt and rescind nothing, and
    /// neither would any later tick before something happens: no waiting
    /// job has as many free GPUs of the models it allows in its pool, on
    /// nodes that take work, as it needs in all (so none starts, and none
    /// is blocked by fragmentation); no running job can be taken (no QoS
    /// preempts lower classes, and burst work runs only where no waiting
    /// job is owed GPUs by its team's guarantee); no victim is in its
    /// grace and no GPUs are promised; no power group or reservation
    /// changes what the nodes take.
    pub(super) fn quiet(&self) -> bool {
        self.quiet_but_for_room() && !self.some_job_has_room()
    }

    /// `quiet`, but for the free GPUs: nothing can be taken, no victim is
    /// in its grace, nothing is promised, and the nodes take work as they
    /// did.
    fn quiet_but_for_room(&self) -> bool {
        let policy = &self.setup.policy;
        self.power.is_none()
            && policy.reservations.is_empty()
            && self.promises.is_empty()
            && !policy.sharing.qos.iter().any(|qos| qos.preempt_lower)
            && !self.view.running.iter().any(|r| r.preempting)
            && (!self.view.running.iter().any(|r| r.burst) || !self.some_job_may_be_owed())
    }

    /// Whether some waiting job's pool has, on nodes that take work, as
    /// many free GPUs of the models it allows as it needs in all (the
    /// fewest any waiting job of its pool and models needs).
    fn some_job_has_room(&self) -> bool {
        // Fewer free GPUs in all than the smallest waiting job needs: none.
        let free_anywhere: u64 = self
            .view
            .nodes
            .iter()
            .filter(|node| node.availability == Availability::Up)
            .map(|node| node.gpus.iter().filter(|gpu| !gpu.busy).count() as u64)
            .sum();
        if self
            .out
            .smallest_waiting()
            .is_none_or(|smallest| free_anywhere < smallest)
        {
            return false;
        }
        let mut fewest: HashMap<(&str, &[crate::model::GpuModel]), u64, foldhash::fast::RandomState> =
            HashMap::default();
        // The view lists each shape's jobs together: one look per run.
        let mut last_shape = None;
        for job in &self.view.pending {
            let shape = Arc::as_ptr(&job.shape);
            if last_shape == Some(shape) {
                continue;
            }
            last_shape = Some(shape);
            let need = fewest
                .entry((job.shape.pool.as_str(), &job.shape.gpu_types))
                .or_insert(u64::MAX);
            *need = (*need).min(job.total_gpus());
        }
        let policy = &self.setup.policy;
        fewest.into_iter().any(|((pool, gpu_types), need)| {
            policy
                .pool(pool)
                .is_some_and(|pool| self.free_for(pool, gpu_types) >= need)
        })
    }

    /// Free GPUs of the models `gpu_types` allows, on nodes of `pool` that
    /// take work.
    pub(super) fn free_for(&self, pool: &crate::model::PoolDef, gpu_types: &[crate::model::GpuModel]) -> u64 {
        self.view
            .nodes
            .iter()
            .filter(|node| node.availability == Availability::Up && pool.selects(&node.labels))
            .map(|node| {
                node.gpus
                    .iter()
                    .filter(|gpu| !gpu.busy && gpu.model.accepted_by(gpu_types))
                    .count() as u64
            })
            .sum()
    }

    /// Whether a waiting job could run under its team's guarantee (and so
    /// take burst work back): its team's guaranteed GPUs in use and its own
    /// fit within `guaranteed_gpus`, or the team has guarantees per pool or
    /// model (taken to allow it).
    fn some_job_may_be_owed(&self) -> bool {
        let sharing = &self.setup.policy.sharing;
        if sharing
            .teams
            .iter()
            .all(|team| team.guaranteed_gpus == 0 && team.guaranteed_in.is_empty())
        {
            return false;
        }
        let mut held: HashMap<&str, u64> = HashMap::new();
        for running in self.view.running.iter().filter(|r| !r.burst) {
            *held.entry(running.team.as_str()).or_default() += running.gpus();
        }
        // Its smallest waiting job fits if any of its jobs does.
        sharing.teams.iter().any(|team| {
            self.out.smallest_waiting_in(&team.name).is_some_and(|gpus| {
                !team.guaranteed_in.is_empty()
                    || held.get(team.name.as_str()).copied().unwrap_or(0) + gpus <= u64::from(team.guaranteed_gpus)
            })
        })
    }

    /// A scheduling cycle, or none where it would start, preempt and
    /// rescind nothing, and its reasons would add to no figure: after an
    /// arrival or end nothing can be taken (`quiet_but_for_room`), no job
    /// of a team can be taken back now, no GPU that fractions share has
    /// room for another (`quiet` counts free GPUs only: after a cycle that
    /// did nothing, a fraction had no room either; an arrival or an end
    /// may change that), and no waiting job has as many free GPUs as it
    /// needs in all (then none is blocked by fragmentation) or, where some
    /// has, none fits node by node and every such job is counted as
    /// blocked already. Whether anything started or was preempted.
    pub(super) fn cycle_unless_quiet(&mut self, observer: &mut dyn Observer, pause_ms: i64) -> bool {
        let quiet = pause_ms == 0
            && !self.every_tick
            && !self.shared_gpu_has_room()
            && self.quiet_but_for_room()
            && (!self.some_job_has_room() || !self.some_job_fits_or_is_news())
            && self.next_take_back().is_none_or(|at| at > self.now);
        if !quiet {
            return self.cycle(observer);
        }
        // What the cycle would have left behind.
        if self.words_due() {
            self.explained_at = Some(self.now);
        }
        if !self.view.pending.is_empty() {
            self.out.rejected(self.now);
        }
        false
    }

    /// Whether some waiting job fits the free GPUs node by node: `nodes`
    /// nodes of its pool that take work, each with `gpus_per_node` free
    /// GPUs of the models it allows (a start needs at least that; host
    /// asks, topology and reserves only narrow it). Or, where the replay
    /// keeps the words, whether one with as many free GPUs in all as it
    /// needs is not yet counted as blocked by fragmentation: every cycle's
    /// plan says why the jobs it reaches wait, due or not (with GPUs free
    /// it reaches them all), and may count it; the reasons of a job
    /// counted already add nothing.
    fn some_job_fits_or_is_news(&self) -> bool {
        let stating = self.words;
        let policy = &self.setup.policy;
        // Each pool and models' free GPUs per node, most first, and in all.
        let mut free: HashMap<PoolModels, (Vec<u32>, u64), foldhash::fast::RandomState> = HashMap::default();
        // The view lists each shape's jobs together: one look per run.
        for run in self.view.pending.chunk_by(|a, b| Arc::ptr_eq(&a.shape, &b.shape)) {
            let shape = &run[0].shape;
            let Some(pool) = policy.pool(&shape.pool) else {
                continue;
            };
            let (per_node, total) = free.entry((shape.pool.as_str(), &shape.gpu_types)).or_insert_with(|| {
                let mut per_node: Vec<u32> = self
                    .view
                    .nodes
                    .iter()
                    .filter(|node| node.availability == Availability::Up && pool.selects(&node.labels))
                    .map(|node| {
                        let free = node
                            .gpus
                            .iter()
                            .filter(|gpu| !gpu.busy && gpu.model.accepted_by(&shape.gpu_types));
                        free.count() as u32
                    })
                    .collect();
                per_node.sort_unstable_by(|a, b| b.cmp(a));
                let total = per_node.iter().map(|n| u64::from(*n)).sum();
                (per_node, total)
            });
            let nodes = shape.nodes.max(1) as usize;
            if per_node.get(nodes - 1).is_some_and(|free| *free >= shape.gpus_per_node) {
                return true;
            }
            if stating && *total >= run[0].total_gpus() && run.iter().any(|job| !self.out.is_fragmented(job.id)) {
                return true;
            }
        }
        false
    }

    /// Whether a GPU that fractions share, on a node that takes work, has
    /// memory left for another.
    fn shared_gpu_has_room(&self) -> bool {
        self.view
            .nodes
            .iter()
            .any(|node| node.availability == Availability::Up && node.gpus.iter().any(GpuView::has_shared_room))
    }

    /// Whether the cycle now states why jobs wait (one does every
    /// `WORDS_EVERY`).
    pub(super) fn words_due(&self) -> bool {
        self.words_due_at(self.now.0)
    }

    /// Whether a cycle at `at_ms` states why jobs wait.
    fn words_due_at(&self, at_ms: i64) -> bool {
        let every_ms = crate::sched::WORDS_EVERY.as_millis() as i64;
        self.explained_at
            .is_none_or(|explained| at_ms - explained.0 >= every_ms)
    }

    /// The cycles the replay skips between `last_cycle` and `next` (one
    /// every `tick_ms`, strictly before `next`) would each have explained
    /// every waiting job when it was time to: the next cycle explains
    /// when it would have.
    pub(super) fn skip_ticks(&mut self, last_cycle: Timestamp, next: Timestamp, tick_ms: i64) {
        let mut at = last_cycle.0 + tick_ms;
        while at < next.0 {
            if self.words_due_at(at) {
                self.explained_at = Some(Timestamp(at));
            }
            at += tick_ms;
        }
    }
}
