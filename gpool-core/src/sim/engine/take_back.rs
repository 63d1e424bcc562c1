//! When time alone may let a waiting job take GPUs back from a more
//! served running job of its own team (`sched::Las`): the replay jumps
//! over quiet stretches to the first such moment, and no further.

use super::*;
use crate::sched::{GpuView, Las, NodeView};

impl Sim<'_> {
    /// Under LAS order, when a running job may next be taken back by a
    /// waiting job of its own team, of those whose team waits with a job
    /// at least their size. Its chance (`Las::next_chance`: past queue 0
    /// and near a checkpoint) must have come, and some waiting job must
    /// have as many GPUs as it needs from the free ones it may use and
    /// those of the running jobs within their chance that it may take
    /// (`Las::takes_back`: more served than it, no larger). Time alone
    /// opens chances, crosses thresholds and promotes waiting jobs, so a
    /// quiet stretch ends at the first of those that could make one
    /// possible. `None`: none comes before something else happens.
    pub(super) fn next_take_back(&self) -> Option<Timestamp> {
        let las = self.setup.policy.sharing.las.as_ref()?;
        let now = self.now;
        let mut soonest: Option<Timestamp> = None;
        let mut due: Vec<&RunningJob> = Vec::new();
        let may_be_wanted = |r: &&RunningJob| {
            self.out
                .largest_waiting_in(&r.team)
                .is_some_and(|gpus| gpus >= r.gpus())
        };
        for r in self.view.running.iter().filter(may_be_wanted) {
            let every = self.attempts.get(&r.id).and_then(|a| a.checkpoint_every_ms);
            match las.next_chance(r, every, now) {
                Some(at) if at > now => soonest = Some(soonest.map_or(at, |s| s.min(at))),
                Some(_) => {
                    due.push(r);
                    soonest = las.take_back_changes(r, every, now).into_iter().chain(soonest).min();
                }
                None => {}
            }
        }
        if due.is_empty() {
            return soonest;
        }
        match self.take_back_possible(las, &due) {
            Ok(()) => Some(now),
            Err(promoted) => promoted.into_iter().chain(soonest).min(),
        }
    }

    /// `Ok` where a waiting job could take GPUs back now from `due`
    /// (running jobs within their chance): the free GPUs it may use, and
    /// those it may use of the ones of its team that it may take, are as
    /// many as it needs. Else the first promotion of a waiting job that
    /// could take one of them, were it less served.
    fn take_back_possible(&self, las: &Las, due: &[&RunningJob]) -> Result<(), Option<Timestamp>> {
        let (policy, now) = (&self.setup.policy, self.now);
        let node_of: HashMap<&str, &NodeView> = self.view.nodes.iter().map(|node| (node.name.as_str(), node)).collect();
        let mut promoted: Option<Timestamp> = None;
        // The view lists each shape's jobs together: one look per run.
        for run in self.view.pending.chunk_by(|a, b| Arc::ptr_eq(&a.shape, &b.shape)) {
            let (shape, need) = (&run[0].shape, run[0].total_gpus());
            let mut of_team = due
                .iter()
                .filter(|r| r.team == shape.team && r.gpus() <= need)
                .peekable();
            let Some(pool) = of_team.peek().and_then(|_| policy.pool(&shape.pool)) else {
                continue;
            };
            let usable =
                |node: &NodeView, gpu: &GpuView| pool.selects(&node.labels) && gpu.model.accepted_by(&shape.gpu_types);
            // What each running job it may take frees that it may use.
            let frees = |r: &RunningJob| -> u64 {
                r.placement
                    .iter()
                    .filter_map(|part| Some((*node_of.get(part.node.as_str())?, &part.gpu_indices)))
                    .map(|(node, indices)| {
                        let held = node.gpus.iter().filter(|gpu| indices.contains(&gpu.index));
                        held.filter(|gpu| usable(node, gpu)).count() as u64
                    })
                    .sum()
            };
            let takable: Vec<(usize, u64)> = of_team.map(|r| (las.running_queue(r, now), frees(r))).collect();
            let free = self.free_for(pool, &shape.gpu_types);
            for job in run {
                let queue = las.waiting_queue(job, now);
                let taken: u64 = takable
                    .iter()
                    .filter(|(top, _)| *top > queue)
                    .map(|(_, gpus)| gpus)
                    .sum();
                if taken > 0 && free + taken >= need {
                    return Ok(());
                }
                promoted = las.promoted_at(job, now).into_iter().chain(promoted).min();
            }
        }
        Err(promoted)
    }
}

/// The first tick after `last_cycle` (one every `tick_ms`) at or after
/// `at`; saturating, so a moment far off stays far off.
pub(super) fn first_tick_from(last_cycle: Timestamp, at: Timestamp, tick_ms: i64) -> Timestamp {
    let ahead = at.0.saturating_sub(last_cycle.0).max(1);
    Timestamp(
        last_cycle
            .0
            .saturating_add(((ahead - 1) / tick_ms + 1).saturating_mul(tick_ms)),
    )
}
