//! The waiting jobs grouped by shape, so that a cycle that only starts jobs
//! looks at the first few of each group instead of the whole queue.
//!
//! Jobs of one shape (`JobShape`: team, QoS, pool, models, size, nice, time
//! limit, requirements) differ to a cycle in age and id alone, and a
//! cycle's order puts the older (then the lower id) first. Free GPUs and
//! the victims a job may take only shrink within a cycle, so once a job of
//! a shape neither fits nor reclaims GPUs, no later job of that shape
//! does: the jobs of a shape that start (or reclaim) come first in it, at
//! most as many as the GPUs they could have (`window_gpus`) allow; the
//! next job is the first that waits (which may become the backfill
//! reservation), and the rest wait the way it does. `Queue::window` keeps
//! those jobs of each shape: `schedule_starts` on it starts and preempts
//! what it would on the whole queue. With one exception: a reclaim stops
//! at the first set of victims that makes the job fit and fails if their
//! lost work is over the hour's waste budget, so a later job of the shape
//! that tries again (its standing changed: behind the backfill
//! reservation, or no longer covered where its QoS preempts lower
//! classes) may find a cheaper set once other jobs claimed some victims.
//! A job past the window then reclaims at the next whole cycle (when the
//! words are due, within seconds) instead.

use super::{Availability, JobShape, NodeView, PendingJob, Policy, RunningJob};
use crate::ids::{JobId, Timestamp};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Jobs of one shape by age, then id.
type ByAge = BTreeMap<(Timestamp, JobId), Arc<PendingJob>>;

/// Waiting jobs by shape, each shape's oldest first (then the lower id).
#[derive(Debug, Clone, Default)]
pub struct Queue {
    shapes: BTreeMap<Arc<JobShape>, ByAge>,
    len: usize,
    /// Jobs that ran before (`PendingJob::service_gpu_secs` > 0).
    served: usize,
}

impl Queue {
    pub fn insert(&mut self, job: Arc<PendingJob>) {
        let key = (job.submitted_at, job.id);
        let jobs = self.shapes.entry(job.shape.clone()).or_default();
        let served = job.service_gpu_secs > 0;
        if jobs.insert(key, job).is_none() {
            self.len += 1;
            self.served += usize::from(served);
        }
    }

    /// Removes the job `job` is a view of (as inserted: same shape, age and
    /// id); false if it is not here.
    pub fn remove(&mut self, job: &PendingJob) -> bool {
        let Some(jobs) = self.shapes.get_mut(&job.shape) else {
            return false;
        };
        let removed = jobs.remove(&(job.submitted_at, job.id));
        if jobs.is_empty() {
            self.shapes.remove(&job.shape);
        }
        if let Some(removed) = &removed {
            self.len -= 1;
            self.served -= usize::from(removed.service_gpu_secs > 0);
        }
        removed.is_some()
    }

    /// The shape equal to `shape` that jobs here share, if any: a job of
    /// that shape takes it instead of a copy of its own.
    pub fn shape(&self, shape: &JobShape) -> Option<&Arc<JobShape>> {
        self.shapes.get_key_value(shape).map(|(shared, _)| shared)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, job: &PendingJob) -> bool {
        self.shapes
            .get(&job.shape)
            .is_some_and(|jobs| jobs.contains_key(&(job.submitted_at, job.id)))
    }

    /// Where `job` is (or would be) in `iter`'s order.
    pub fn position(&self, job: &PendingJob) -> usize {
        let before: usize = self
            .shapes
            .range::<Arc<JobShape>, _>(..&job.shape)
            .map(|(_, jobs)| jobs.len())
            .sum();
        let key = (job.submitted_at, job.id);
        let within = match self.shapes.get(&job.shape) {
            None => 0,
            // Arrivals are mostly the newest of their shape.
            Some(jobs) if jobs.last_key_value().is_some_and(|(last, _)| *last < key) => jobs.len(),
            Some(jobs) => jobs.range(..key).count(),
        };
        before + within
    }

    /// Every job, shape by shape, each shape's oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<PendingJob>> {
        self.shapes.values().flat_map(|jobs| jobs.values())
    }

    /// The jobs of each shape a starts-only cycle that can hand out `gpus`
    /// GPUs looks at: as many as could take them, and one more.
    /// The oldest waiting job of each shape.
    pub fn firsts(&self) -> impl Iterator<Item = &Arc<PendingJob>> {
        self.shapes.values().filter_map(|jobs| jobs.values().next())
    }

    pub fn window(&self, gpus: u64) -> impl Iterator<Item = &Arc<PendingJob>> {
        self.shapes.iter().flat_map(move |(shape, jobs)| {
            let job_gpus = u64::from(shape.gpus_per_node) * u64::from(shape.nodes);
            let n = gpus / job_gpus.max(1) + 1;
            jobs.values().take(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }
}

/// The most GPUs a starts-only cycle could hand out: those free on nodes
/// that take work, and where jobs may be preempted, those held there too.
/// `n_others`: the jobs the cycle sees beside the queue's window (held,
/// gated, arrays' tasks). `None` where a window would not give the whole
/// queue's starts:
/// - preemption is possible and the cycle's failed tries to reclaim GPUs
///   could reach their cap (`MAX_FAILED_RECLAIMS_PER_CYCLE`): past its
///   window a shape's jobs may still try, and fail, where their standing
///   changed (no longer covered by the team's guarantee, or behind the
///   backfill reservation), which is at most 4 tries a shape, and each
///   other job once;
/// - a QoS keeps GPUs free and jobs may be preempted (a reclaim must leave
///   what is kept, which depends on what the job's pool has free);
/// - the age weight is negative (older jobs would come last);
/// - per-user caps on running jobs or GPUs are set;
/// - under LAS order (`Las`), a job that ran before waits: a team's fresh
///   jobs go first, and a served one may be promoted, which the window's
///   oldest-first cut does not follow. (A running job past queue 0 near
///   its checkpoint may be a victim then, `Las::may_be_taken`.)
///
/// Without victims, a window where a QoS keeps GPUs free gives the whole
/// queue's starts unless a job that would have taken kept GPUs no longer
/// fits at all once the cycle is done: a later job of its shape, however
/// far past the window, then fails to fit instead and may claim the
/// backfill reservation, which moves where later jobs go. The plan says so
/// (`Plan::needs_whole`). Otherwise the later jobs of its shape would take
/// kept GPUs too (the free GPUs they see only shrink, and they still fit),
/// and wait without a trace.
pub fn window_gpus(
    nodes: &[NodeView],
    running: &[RunningJob],
    (policy, now): (&Policy, Timestamp),
    queue: &Queue,
    n_others: usize,
) -> Option<u64> {
    let sharing = &policy.sharing;
    let las = sharing.las.as_ref();
    if las.is_some() && queue.served > 0 {
        return None;
    }
    if sharing.weights.age.is_nan() || sharing.weights.age < 0.0 {
        return None;
    }
    // Jobs of one shape differ by user, and a capped user's may fill the
    // window while another's past it could start.
    if sharing.has_running_caps() {
        return None;
    }
    // So may fractions: a shared GPU takes only its own user's (unless
    // users mix), and fractions do not count in whole GPUs.
    if queue.shapes.keys().any(|shape| shape.share.is_some()) {
        return None;
    }
    let victims = sharing.qos.iter().any(|qos| qos.preempt_lower)
        || running
            .iter()
            .any(|job| job.burst || job.preempting || las.is_some_and(|las| las.may_be_taken(job, now)));
    let reserves = sharing.qos.iter().any(|qos| qos.reserves_any());
    let failed_tries = 4 * queue.shapes.len() + n_others;
    if victims && (reserves || failed_tries >= super::preempt::MAX_FAILED_RECLAIMS_PER_CYCLE) {
        return None;
    }
    let up = nodes.iter().filter(|node| node.availability == Availability::Up);
    let gpus = if victims {
        up.map(|node| node.gpus.len() as u64).sum()
    } else {
        up.map(|node| node.gpus.iter().filter(|gpu| !gpu.busy).count() as u64)
            .sum()
    };
    Some(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A list kept by putting each arrival at its `position`, and
        /// taking jobs out as they start, lists the queue's jobs in
        /// `iter`'s order, whatever the shapes, ages and order of arrival.
        #[test]
        fn a_list_kept_by_position_is_the_queues_order(
            steps in proptest::collection::vec((0u8..3, 1u8..3, 0i64..20, any::<bool>(), any::<prop::sample::Index>()), 0..60)
        ) {
            let mut queue = Queue::default();
            let mut list: Vec<Arc<PendingJob>> = Vec::new();
            for (id, (team, gpus, at, arrives, which)) in steps.into_iter().enumerate() {
                if arrives || list.is_empty() {
                    let job = Arc::new(PendingJob {
                        submitted_at: Timestamp(at),
                        ..crate::testing::pending_job(&format!("j{} team=t{team} gpus={gpus}", id + 1))
                    });
                    let place = queue.position(&job);
                    queue.insert(job.clone());
                    list.insert(place, job);
                } else {
                    let job = list.remove(which.index(list.len()));
                    prop_assert!(queue.remove(&job));
                }
                let listed: Vec<JobId> = list.iter().map(|job| job.id).collect();
                let queued: Vec<JobId> = queue.iter().map(|job| job.id).collect();
                prop_assert_eq!(listed, queued);
            }
        }
    }
}
