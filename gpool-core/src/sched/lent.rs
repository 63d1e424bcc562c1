//! Lent GPUs back a QoS reserve.
//!
//! A reserve keeps GPUs free so that guaranteed work of its class starts
//! without waiting out a victim's grace. Guaranteed work of a lower class
//! may still take kept GPUs, as long as at least as many GPUs of its pool
//! are lent out as burst work that the reserving class takes back: then the
//! reserve is there now or after one grace. Taking a kept GPU this way never
//! costs more preemptions than leaving it free and taking a burst GPU back
//! for the guaranteed job now (the reserving class, when it comes, takes
//! back one burst GPU per kept GPU it finds taken), and costs none when that
//! class does not come. Burst work itself never takes kept GPUs.

use super::{ClusterView, FastHash, PendingJob, Policy, Preemption};
use crate::ids::{JobId, Timestamp};
use std::collections::HashMap;

/// Burst GPUs by pool and QoS priority, less this cycle's victims.
pub(super) struct Lent {
    /// Pool name, QoS priority, GPUs.
    by_pool: Vec<(String, u32, u64)>,
    /// The burst jobs' pool, QoS priority and GPUs, for their preemption.
    jobs: HashMap<JobId, (String, u32, u64), FastHash>,
}

impl Lent {
    /// What `view` lends out at `now`: burst work not already being
    /// preempted and past its QoS `min_runtime` (younger work cannot be
    /// taken back yet). Empty where no QoS keeps GPUs (nothing to back).
    pub(super) fn of(view: &ClusterView, policy: &Policy, now: Timestamp) -> Lent {
        let mut lent = Lent {
            by_pool: Vec::new(),
            jobs: HashMap::default(),
        };
        if !policy.sharing.qos.iter().any(|qos| qos.reserves_any()) {
            return lent;
        }
        for running in view.running.iter().filter(|r| r.burst && !r.preempting) {
            let Some(pool) = policy.pool(&running.pool) else {
                continue;
            };
            let qos = policy.sharing.qos(&running.qos);
            if qos.is_some_and(|qos| qos.min_runtime_secs as i64 * 1000 > now.0 - running.started_at.0) {
                continue;
            }
            let priority = qos.map_or(0, |qos| qos.priority);
            let gpus = running.gpus();
            lent.add(&pool.name, priority, gpus as i64);
            lent.jobs.insert(running.id, (pool.name.clone(), priority, gpus));
        }
        lent
    }

    fn add(&mut self, pool: &str, priority: u32, gpus: i64) {
        match self.by_pool.iter_mut().find(|(p, q, _)| p == pool && *q == priority) {
            Some((_, _, n)) => *n = n.saturating_add_signed(gpus),
            None => self.by_pool.push((pool.to_string(), priority, gpus.max(0) as u64)),
        }
    }

    /// Of `kept` GPUs the reserves of classes up to `top_priority` keep in
    /// `job`'s pool, those still to be left free: what lent GPUs of
    /// classes no higher than `top_priority` do not back.
    pub(super) fn unbacked(&self, job: &PendingJob, policy: &Policy, kept: u64, top_priority: u32) -> u64 {
        let Some(pool) = policy.pool(&job.shape.pool) else {
            return kept;
        };
        let backing: u64 = self
            .by_pool
            .iter()
            .filter(|(p, q, _)| *p == pool.name && *q <= top_priority)
            .map(|(_, _, n)| n)
            .sum();
        kept.saturating_sub(backing)
    }

    /// This cycle's new victims lend nothing any more.
    pub(super) fn preempted(&mut self, victims: &[Preemption]) {
        for victim in victims {
            if let Some((pool, priority, gpus)) = self.jobs.remove(&victim.victim) {
                self.add(&pool, priority, -(gpus as i64));
            }
        }
    }
}
