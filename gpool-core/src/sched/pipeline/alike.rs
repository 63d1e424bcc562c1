//! Reasons reused for alike jobs: a waiting job of the same shape (the
//! same `Arc`) and LAS standing as one that met the shape cache's reasons
//! meets them too while the cycle has changed nothing since, so it is not
//! sized up (a queue of thousands of one batch costs a lookup a job).

use super::{Cycle, PendingJob, TeamRow};
use crate::sched::teams::las_takes_back;
use crate::sched::JobShape;

/// A waiting job's shape, by address, and whether it may take GPUs back
/// from its team's more served jobs (`None`: per-user caps are set, so
/// jobs of one shape may differ in the caps they meet).
pub(super) type AlikeKey = Option<(*const JobShape, bool)>;

/// What a cycle has changed so far: starts, preemptions, holds, and the
/// backfill reservation tried. Each only grows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp(usize, usize, usize, bool);

impl Cycle<'_> {
    fn stamp(&self) -> Stamp {
        let plan = &self.plan;
        Stamp(
            plan.starts.len(),
            plan.preemptions.len(),
            plan.holds.len(),
            self.reservation_tried,
        )
    }

    pub(super) fn alike_key(&self, job: &PendingJob, row: &TeamRow) -> AlikeKey {
        let takes_back = las_takes_back(&self.policy.sharing, row, job, self.now);
        (!self.user_use.any_caps()).then_some((std::sync::Arc::as_ptr(&job.shape), takes_back))
    }

    /// The list of reasons (the plan's) a job alike to this one met, if
    /// nothing changed since.
    pub(super) fn failed_alike(&self, key: AlikeKey) -> Option<u32> {
        let (stamp, list) = self.failed_by_shape.get(&key?)?;
        (*stamp == self.stamp()).then_some(*list)
    }

    /// A job sized up as `key` met the cached list `list`, as of now.
    pub(super) fn fails_alike(&mut self, key: AlikeKey, list: u32) {
        if let Some(key) = key {
            let stamp = self.stamp();
            self.failed_by_shape.insert(key, (stamp, list));
        }
    }
}
