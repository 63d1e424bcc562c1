//! Least-attained-service order within each team (Tiresias's discrete
//! LAS, NSDI '19): a job's service is the GPU-seconds its attempts have
//! used; thresholds cut service into queues, queue 0 the least served. A
//! team's waiting jobs are tried in queue order (the places its jobs hold
//! in the cycle's order stay theirs: between teams nothing changes), and
//! a waiting job may take GPUs back from a running job of its own team in
//! a later queue. A job is demoted only when its service crosses a
//! threshold, so it is not taken back again and again by jobs of its own
//! queue; a job that has waited `promote_factor` times as long as it has
//! run goes back to queue 0, so nothing starves.

use super::{PendingJob, RunningJob};
use crate::ids::Timestamp;

/// The order within a team: `None` in `Sharing::las` keeps the priority
/// order alone.
#[derive(Debug, Clone, PartialEq)]
pub struct Las {
    /// Service (GPU-seconds) at which a job leaves each queue, ascending:
    /// `n` thresholds make `n + 1` queues.
    pub thresholds_gpu_secs: Vec<u64>,
    /// A waiting job goes back to queue 0 once it has waited this many
    /// times as long as it has run (its service over its GPUs); 0: never.
    pub promote_factor: f64,
    /// A running job is taken back for a less served one only within
    /// this long of its last checkpoint: what it loses stays small, and
    /// a job that never checkpoints is past it once its QoS's
    /// `min_runtime` is over, so it is never taken back this way.
    pub max_lost_secs: u64,
}

impl Default for Las {
    /// Thresholds at 1 and 10 GPU-hours, promotion after waiting 32 times
    /// as long as the job has run, taken back within 2 minutes of a
    /// checkpoint: chosen on the Philly trace (README, "Shorter waits").
    fn default() -> Las {
        Las {
            thresholds_gpu_secs: vec![3600, 36_000],
            promote_factor: 32.0,
            max_lost_secs: 120,
        }
    }
}

impl Las {
    /// The queue of a job with `service_gpu_secs` of service.
    pub fn queue_of(&self, service_gpu_secs: u64) -> usize {
        self.thresholds_gpu_secs
            .iter()
            .take_while(|threshold| service_gpu_secs >= **threshold)
            .count()
    }

    /// A waiting job's queue now: by its service, or 0 once it has waited
    /// (since its last attempt ended, else since its submit) at least
    /// `promote_factor` times its run time.
    pub fn waiting_queue(&self, job: &PendingJob, now: Timestamp) -> usize {
        self.queue_waiting(job.service_gpu_secs, job.total_gpus(), job.waiting_since, now)
    }

    /// `waiting_queue` of a job of `gpus` GPUs with `service_gpu_secs`,
    /// waiting since `since`.
    fn queue_waiting(&self, service_gpu_secs: u64, gpus: u64, since: Timestamp, now: Timestamp) -> usize {
        let queue = self.queue_of(service_gpu_secs);
        if queue == 0 || self.promote_factor <= 0.0 {
            return queue;
        }
        let ran_secs = service_gpu_secs as f64 / gpus.max(1) as f64;
        let waited_secs = (now.0 - since.0).max(0) as f64 / 1000.0;
        if waited_secs >= self.promote_factor * ran_secs {
            0
        } else {
            queue
        }
    }

    /// A running job's queue now: its earlier attempts' service and this
    /// one's so far.
    pub fn running_queue(&self, job: &RunningJob, now: Timestamp) -> usize {
        self.queue_of(job.service_now(now))
    }

    /// `running` checkpointed (or started) within `max_lost_secs`: it may
    /// be taken back for a less served job of its team now. (Only then:
    /// a cycle where none may is not made to by time alone.)
    pub fn may_lose(&self, running: &RunningJob, now: Timestamp) -> bool {
        let since = running
            .last_checkpoint_at
            .unwrap_or(running.started_at)
            .max(running.started_at);
        !running.preempting && now.0 - since.0 <= self.max_lost_secs as i64 * 1000
    }

    /// `running` may be taken back now by some job of its team: near its
    /// checkpoint, and past queue 0 (no queue comes before that).
    pub fn may_be_taken(&self, running: &RunningJob, now: Timestamp) -> bool {
        self.may_lose(running, now) && self.running_queue(running, now) > 0
    }

    /// The first time from `now` on at which `running` (which checkpoints
    /// every `every_ms` from its start, or never) may be taken back
    /// (`may_be_taken`): where it is past queue 0 and within `max_lost_secs`
    /// of its start or a checkpoint. `None`: never.
    pub fn next_chance(&self, running: &RunningJob, every_ms: Option<i64>, now: Timestamp) -> Option<Timestamp> {
        if running.preempting {
            return None;
        }
        let start = running.started_at.0;
        let crossed = crossing_at(running, *self.thresholds_gpu_secs.first()?)?.0;
        let max_lost = self.max_lost_secs as i64 * 1000;
        let mut at = crossed.max(now.0);
        loop {
            // The start or checkpoint at or before `at`, and the next one.
            let (last, next) = match every_ms.filter(|every| *every > 0) {
                Some(every) => {
                    let last = start + (at - start).max(0) / every * every;
                    (last, Some(last + every))
                }
                None => (start, None),
            };
            if at - last <= max_lost {
                return Some(Timestamp(at));
            }
            at = next?;
        }
    }

    /// The first moment after `now` at which time alone could change which
    /// waiting jobs may take `running` back, as far as `running` goes: its
    /// service crosses the next threshold, or its next chance after the
    /// one `now` is in comes. (A waiting job's own moment is its
    /// promotion, `promoted_at`.) `None`: neither ever comes.
    pub fn take_back_changes(&self, running: &RunningJob, every_ms: Option<i64>, now: Timestamp) -> Option<Timestamp> {
        let service = running.service_now(now);
        let next_threshold = self.thresholds_gpu_secs.iter().find(|threshold| **threshold > service);
        let crossing = next_threshold.and_then(|threshold| crossing_at(running, *threshold));
        crossing
            .into_iter()
            .chain(self.chance_after_this(running, every_ms, now))
            .min()
            .map(|at| Timestamp(at.0.max(now.0 + 1)))
    }

    /// The next chance of `running` after the one (of checkpoint and
    /// `max_lost_secs`) that `now` is in.
    fn chance_after_this(&self, running: &RunningJob, every_ms: Option<i64>, now: Timestamp) -> Option<Timestamp> {
        let every = every_ms.filter(|every| *every > 0)?;
        let start = running.started_at.0;
        let last = start + (now.0 - start).max(0) / every * every;
        let past = last.saturating_add(self.max_lost_secs as i64 * 1000 + 1);
        self.next_chance(running, Some(every), Timestamp(past.max(now.0 + 1)))
    }

    /// A moment after `now`, and no later than the one, at which waiting
    /// `job`, in a queue past 0 at `now`, is promoted to queue 0 (`None`:
    /// it is in queue 0, or is never promoted). A moment early only wakes
    /// the replay for nothing.
    pub fn promoted_at(&self, job: &PendingJob, now: Timestamp) -> Option<Timestamp> {
        if self.waiting_queue(job, now) == 0 || self.promote_factor <= 0.0 {
            return None;
        }
        let ran_secs = job.service_gpu_secs as f64 / job.total_gpus().max(1) as f64;
        let wait_ms = self.promote_factor * ran_secs * 1000.0;
        // A wait past any replay's span (or an infinite factor): never.
        if !wait_ms.is_finite() || wait_ms > NEVER_MS {
            return None;
        }
        // Floored, and a millisecond early, against rounding.
        let at = job
            .waiting_since
            .0
            .saturating_add(wait_ms.floor() as i64)
            .saturating_sub(1);
        Some(Timestamp(at.max(now.0 + 1)))
    }

    /// `job` may take `victim`'s GPUs back: a job of its own team in a
    /// later queue (more served) than its own, that checkpointed within
    /// `max_lost_secs`, and holds no more GPUs than `job` asks (all it
    /// frees goes to `job`: taking a large job for a small one would
    /// leave the rest to whoever comes, and lose more work).
    pub fn takes_back(&self, victim: &RunningJob, job: &PendingJob, now: Timestamp) -> bool {
        self.may_lose(victim, now)
            && victim.gpus() <= job.total_gpus()
            && victim.team == job.shape.team.as_str()
            && self.running_queue(victim, now) > self.waiting_queue(job, now)
    }
}

/// When the service of `running` reaches `threshold` GPU-seconds (whole
/// seconds, as `service_after` counts them); `None` past any clock.
fn crossing_at(running: &RunningJob, threshold: u64) -> Option<Timestamp> {
    let short = threshold.saturating_sub(running.service_before_gpu_secs);
    let secs = i64::try_from(short.div_ceil(running.gpus().max(1))).ok()?;
    Some(Timestamp(
        running.started_at.0.saturating_add(secs.saturating_mul(1000)),
    ))
}

/// A wait no replay reaches (some 30,000 years): `promoted_at` says never.
const NEVER_MS: f64 = 1e15;

/// GPU-seconds of service after `before`, once `gpus` GPUs were held
/// from `from` to `to` (whole seconds: a second begun is not counted).
pub fn service_after(before: u64, gpus: u64, from: Timestamp, to: Timestamp) -> u64 {
    let secs = ((to.0 - from.0).max(0) / 1000) as u64;
    before.saturating_add(secs.saturating_mul(gpus))
}

/// What `gpool why` shows of `job` at `now`: its service (the running
/// attempt's so far included) and, under `las`, its queue; `None` for an
/// ended job.
pub fn standing(las: Option<&Las>, job: &crate::model::Job, now: Timestamp) -> (u64, Option<usize>) {
    use crate::job_state::JobState;
    match &job.state {
        JobState::Running {
            started_at, placement, ..
        } => {
            let gpus: u64 = placement.iter().map(|part| part.gpu_indices.len() as u64).sum();
            let service = service_after(job.service_gpu_secs, gpus, *started_at, now);
            (service, las.map(|las| las.queue_of(service)))
        }
        JobState::Pending => {
            let gpus = u64::from(job.spec.gpus_per_node) * u64::from(job.spec.nodes);
            let since = job.requeued_at.unwrap_or(job.submitted_at);
            let queue = las.map(|las| las.queue_waiting(job.service_gpu_secs, gpus, since, now));
            (job.service_gpu_secs, queue)
        }
        _ => (job.service_gpu_secs, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn las() -> Las {
        Las {
            thresholds_gpu_secs: vec![3600, 36_000],
            promote_factor: 2.0,
            max_lost_secs: 300,
        }
    }

    #[test]
    fn service_falls_into_the_queue_of_the_thresholds_it_has_passed() {
        let las = las();
        assert_eq!(las.queue_of(0), 0);
        assert_eq!(las.queue_of(3599), 0);
        assert_eq!(las.queue_of(3600), 1);
        assert_eq!(las.queue_of(36_000), 2);
        assert_eq!(Las::default().queue_of(10_000_000), 2);
    }

    /// A 4-GPU job that ran 1,000 s (4,000 GPU-seconds: queue 1) goes
    /// back to queue 0 after waiting 2,000 s, twice its run.
    #[test]
    fn a_served_job_that_waited_long_enough_is_promoted() {
        let las = las();
        let mut job = crate::testing::pending_job("j1 gpus=4");
        job.service_gpu_secs = 4000;
        job.waiting_since = Timestamp(1_000_000);
        assert_eq!(las.waiting_queue(&job, Timestamp(1_000_000 + 1_999_000)), 1);
        assert_eq!(las.waiting_queue(&job, Timestamp(1_000_000 + 2_000_000)), 0);
        let never = Las {
            promote_factor: 0.0,
            ..las
        };
        assert_eq!(never.waiting_queue(&job, Timestamp(i64::MAX / 2)), 1);
    }

    #[test]
    fn a_running_job_counts_its_attempt_so_far() {
        let las = las();
        let mut job = crate::testing::running_job("r1 on=n1:0,1");
        job.started_at = Timestamp(0);
        job.service_before_gpu_secs = 1000;
        assert_eq!(las.running_queue(&job, Timestamp(1_299_000)), 0);
        assert_eq!(las.running_queue(&job, Timestamp(1_300_000)), 1);
    }

    /// A 2-GPU job started at 0 with 1,000 GPU-seconds before crosses 1
    /// GPU-hour at 1,300 s; checkpointing every 1,000 s, it may be taken
    /// back from its checkpoint at 2,000 s (the one at 1,000 s came before
    /// the crossing, and 300 s past it is more than the 120 s allowed).
    #[test]
    fn the_next_chance_is_the_first_checkpoint_window_past_queue_0() {
        let las = Las {
            max_lost_secs: 120,
            ..las()
        };
        let mut job = crate::testing::running_job("r1 on=n1:0,1");
        job.service_before_gpu_secs = 1000;
        assert_eq!(
            las.next_chance(&job, Some(1_000_000), Timestamp(0)),
            Some(Timestamp(2_000_000))
        );
        assert_eq!(
            las.next_chance(&job, Some(1_000_000), Timestamp(2_050_000)),
            Some(Timestamp(2_050_000))
        );
        assert_eq!(
            las.next_chance(&job, Some(1_000_000), Timestamp(2_200_000)),
            Some(Timestamp(3_000_000))
        );
        // Crossing within a window: at the crossing itself.
        assert_eq!(
            las.next_chance(&job, Some(1_250_000), Timestamp(0)),
            Some(Timestamp(1_300_000))
        );
        // Never checkpointing: only near its start, which it is not.
        assert_eq!(las.next_chance(&job, None, Timestamp(0)), None);
        job.service_before_gpu_secs = 7200;
        assert_eq!(las.next_chance(&job, None, Timestamp(0)), Some(Timestamp(0)));
        assert_eq!(las.next_chance(&job, None, Timestamp(121_000)), None);
    }

    /// A 2-GPU job in queue 1 within its chance: taken back by a waiting
    /// job of 2 GPUs in queue 0, never by one of 1 GPU; a served one may
    /// once it is promoted; and nothing changes for it before its next
    /// checkpoint.
    #[test]
    fn a_take_back_needs_a_less_served_job_of_its_size() {
        let las = Las {
            max_lost_secs: 120,
            ..las()
        };
        let mut job = crate::testing::running_job("r1 on=n1:0,1");
        job.service_before_gpu_secs = 7200;
        job.last_checkpoint_at = Some(Timestamp(0));
        let now = Timestamp(60_000);
        assert_eq!(las.next_chance(&job, Some(1_000_000), now), Some(now));
        let fresh = crate::testing::pending_job("j1 gpus=2");
        let small = crate::testing::pending_job("j2 gpus=1");
        assert!(las.takes_back(&job, &fresh, now));
        assert!(!las.takes_back(&job, &small, now));
        // Ran 1,800 s on 2 GPUs (queue 1, as the running job): promoted
        // after 3,600 s of waiting, and then it may.
        let mut served = crate::testing::pending_job("j3 gpus=2");
        served.service_gpu_secs = 3600;
        served.waiting_since = Timestamp(-3_500_000);
        assert!(!las.takes_back(&job, &served, now));
        assert_eq!(las.promoted_at(&served, now), Some(Timestamp(99_999)));
        assert_eq!(las.waiting_queue(&served, Timestamp(99_999)), 1);
        assert!(las.takes_back(&job, &served, Timestamp(100_000)));
        // Its own moments: crossing 10 GPU-hours at 14,400 s, or its next
        // checkpoint at 1,000 s, whichever comes first.
        assert_eq!(
            las.take_back_changes(&job, Some(1_000_000), now),
            Some(Timestamp(1_000_000))
        );
        assert_eq!(las.take_back_changes(&job, None, now), Some(Timestamp(14_400_000)));
        assert_eq!(las.promoted_at(&fresh, now), None);
        // A factor no wait reaches: never, and no overflow.
        let never = Las {
            promote_factor: f64::INFINITY,
            ..las.clone()
        };
        assert_eq!(never.promoted_at(&served, now), None);
    }

    proptest! {
        /// `next_chance` is the first whole second from which the job may
        /// be taken back: it may at that time, and at no earlier second.
        #[test]
        fn the_next_chance_is_the_first_moment_it_may_be_taken(
            before in 0u64..8000, gpus in 1u32..4, every in prop::option::of(60i64..3000), from in 0i64..6000,
        ) {
            let las = Las { max_lost_secs: 120, ..las() };
            let indices: Vec<String> = (0..gpus).map(|i| i.to_string()).collect();
            let mut job = crate::testing::running_job(&format!("r1 on=n1:{}", indices.join(",")));
            job.service_before_gpu_secs = before;
            let checkpoint_at = |t: i64| every.map(|every| every * 1000 * (t / (every * 1000))).filter(|at| *at > 0);
            let may = |t: i64| {
                let mut at_t = job.clone();
                at_t.last_checkpoint_at = checkpoint_at(t).map(Timestamp);
                las.may_be_taken(&at_t, Timestamp(t))
            };
            let chance = las.next_chance(&job, every.map(|e| e * 1000), Timestamp(from * 1000));
            let first = (from..20_000).map(|secs| secs * 1000).find(|t| may(*t));
            match (chance, first) {
                (Some(at), Some(t)) => {
                    prop_assert!(may(at.0), "it may not at {}", at.0);
                    prop_assert!(at.0 <= t && t - at.0 < 1000, "{} against the first second {}", at.0, t);
                }
                (None, Some(t)) => prop_assert!(false, "none, but it may at {}", t),
                (Some(at), None) => prop_assert!(at.0 >= 19_999_000, "{} but never within the range", at.0),
                (None, None) => {}
            }
        }

        /// Where no waiting job may take a running job back now, none may
        /// before the first of its `take_back_changes` and their
        /// promotions: the replay may sleep until then.
        #[test]
        fn no_take_back_is_possible_before_the_one_named(
            before in 0u64..8000, gpus in 1u32..4, every in prop::option::of(60i64..3000), from in 0i64..6000,
            waiting in prop::collection::vec((0u64..20_000, 1u64..5, -4000i64..4000), 0..4),
        ) {
            let las = Las { max_lost_secs: 120, ..las() };
            let indices: Vec<String> = (0..gpus).map(|i| i.to_string()).collect();
            let mut job = crate::testing::running_job(&format!("r1 on=n1:{}", indices.join(",")));
            job.service_before_gpu_secs = before;
            let every_ms = every.map(|e| e * 1000);
            let Some(now) = las.next_chance(&job, every_ms, Timestamp(from * 1000)) else {
                return Ok(());
            };
            let jobs: Vec<PendingJob> = waiting
                .iter()
                .enumerate()
                .map(|(i, (service, job_gpus, since))| {
                    let mut pending = crate::testing::pending_job(&format!("j{} gpus={job_gpus}", i + 1));
                    pending.service_gpu_secs = *service;
                    pending.waiting_since = Timestamp(since * 1000);
                    pending
                })
                .collect();
            let checkpoint_at = |t: i64| every.map(|every| every * 1000 * (t / (every * 1000))).filter(|at| *at > 0);
            let possible = |t: i64| {
                let mut at_t = job.clone();
                at_t.last_checkpoint_at = checkpoint_at(t).map(Timestamp);
                las.may_be_taken(&at_t, Timestamp(t))
                    && jobs.iter().any(|pending| las.takes_back(&at_t, pending, Timestamp(t)))
            };
            if !possible(now.0) {
                let promotions = jobs
                    .iter()
                    .filter(|pending| pending.total_gpus() >= job.gpus())
                    .filter_map(|pending| las.promoted_at(pending, now));
                let due = promotions.chain(las.take_back_changes(&job, every_ms, now)).min();
                let until = due.map_or(now.0 + 20_000_000, |at| at.0.min(now.0 + 20_000_000));
                prop_assert!(due.is_none_or(|at| at > now));
                let first_second = (now.0 + 999) / 1000 * 1000;
                if let Some(t) = (first_second..until).step_by(1000).find(|t| possible(*t)) {
                    prop_assert!(false, "possible at {} before {:?}", t, due);
                }
            }
        }

        /// More service never means an earlier queue.
        #[test]
        fn queues_never_fall_as_service_grows(a in 0u64..100_000, b in 0u64..100_000) {
            let las = las();
            let (low, high) = (a.min(b), a.max(b));
            prop_assert!(las.queue_of(low) <= las.queue_of(high));
            prop_assert!(las.queue_of(high) <= las.thresholds_gpu_secs.len());
        }
    }
}
