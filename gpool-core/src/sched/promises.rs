//! What is kept for a waiting job that takes GPUs back, from the plan
//! that preempts for it until it starts: its claims (until its victims'
//! grace is over, and `PROMISE_MS` more), the free GPUs it holds while
//! they end, and the GPUs of each victim that ended. gpoold's state task
//! and `gpool sim` keep them in this one ledger, and a cycle's
//! `ClusterView::promised` is what it honours (`Promises::in_force`).

use super::{Availability, NodeView, Preemption, RunningJob};
use crate::ids::{JobId, Timestamp};
use crate::model::NodePlacement;
use std::collections::HashMap;

/// The claims and promises to waiting jobs.
#[derive(Debug, Clone, Default)]
pub struct Promises {
    /// GPUs kept for a job (`RunningJob::promise`: `preempted_for` names
    /// it), and until when.
    kept: Vec<(RunningJob, Timestamp)>,
    /// Until when what is freed for each job stays its.
    claim_until: HashMap<JobId, Timestamp>,
}

impl Promises {
    /// A plan's holds, once its preemptions were carried out: each job
    /// that waits on victims signalled now (`grace_of`: the grace of each
    /// preemption that was, `None` for one that was not) claims what they
    /// free until the longest grace is over, and keeps the GPUs of its
    /// placement that are free now (`free_now`) and kept for nobody else.
    pub fn hold(
        &mut self,
        holds: &[(JobId, Vec<NodePlacement>)],
        (preemptions, grace_of): (&[Preemption], impl Fn(&Preemption) -> Option<u64>),
        now: Timestamp,
        free_now: impl Fn(&str, u32) -> bool,
    ) {
        for (job, placement) in holds {
            let grace_secs = preemptions
                .iter()
                .filter(|p| p.for_job == *job)
                .filter_map(&grace_of)
                .max();
            let Some(grace_secs) = grace_secs else {
                continue;
            };
            let until = claim_until(now, grace_secs);
            let claim = self.claim_until.entry(*job).or_default();
            *claim = (*claim).max(until);
            let promised: Vec<&RunningJob> = self.kept.iter().map(|(p, _)| p).collect();
            let free = held_free(placement, |node, gpu| {
                free_now(node, gpu) && !is_promised(&promised, node, gpu)
            });
            if !free.is_empty() {
                self.kept.push((RunningJob::promise(*job, *job, free), until));
            }
        }
    }

    /// Victim `victim`, preempted for `for_job`, ended and freed
    /// `placement`: its GPUs are kept for that job while its claims hold
    /// (and `PROMISE_MS` at least).
    pub fn victim_ended(&mut self, victim: JobId, for_job: JobId, placement: &[NodePlacement], now: Timestamp) {
        let until = promise_until(now, self.claim_until.get(&for_job).copied());
        self.kept
            .push((RunningJob::promise(victim, for_job, placement.to_vec()), until));
    }

    /// `job` started: nothing is kept for it any more. Its victims still
    /// in their grace keep its name, a job that no longer waits: the next
    /// plan rescinds them unless another job counts on them.
    pub fn claims_met(&mut self, job: JobId) {
        self.kept.retain(|(p, _)| p.preempted_for != Some(job));
        self.claim_until.remove(&job);
    }

    /// Drops the claims and promises past their time, and the promises to
    /// jobs that no longer wait.
    pub fn expire(&mut self, now: Timestamp, waits: impl Fn(JobId) -> bool) {
        self.claim_until.retain(|_, until| *until > now);
        self.kept
            .retain(|(p, until)| *until > now && p.preempted_for.is_some_and(&waits));
    }

    /// The promises a cycle honours (`ClusterView::promised`): their job
    /// waits, and their GPUs are free on a node of `nodes` that takes work.
    pub fn in_force(&self, nodes: &[NodeView], waits: impl Fn(JobId) -> bool) -> Vec<RunningJob> {
        self.kept
            .iter()
            .map(|(p, _)| p)
            .filter(|p| p.preempted_for.is_some_and(&waits) && promise_holds(nodes, p))
            .cloned()
            .collect()
    }

    /// Nothing is kept for anyone.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

/// How long what is freed for a waiting job stays its past its last
/// victim's grace (and a victim's GPUs at least, once it ended): it starts
/// at the next cycle, within milliseconds, unless its standing changed.
pub const PROMISE_MS: i64 = 30_000;

/// Until when a job's claims hold once a victim with `grace_secs` of grace
/// is signalled at `now`.
fn claim_until(now: Timestamp, grace_secs: u64) -> Timestamp {
    Timestamp(now.0 + grace_secs as i64 * 1000 + PROMISE_MS)
}

/// Until when the GPUs of a victim that ended at `now` are promised: its
/// job's claims (`claim_until`), and at least `PROMISE_MS`.
fn promise_until(now: Timestamp, claims_until: Option<Timestamp>) -> Timestamp {
    claims_until.unwrap_or_default().max(Timestamp(now.0 + PROMISE_MS))
}

/// The GPUs of a reclaiming job's placement that a hold promises it (those
/// `takeable`: free, and promised to nobody yet), by node.
fn held_free(placement: &[NodePlacement], takeable: impl Fn(&str, u32) -> bool) -> Vec<NodePlacement> {
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

/// Whether the GPUs of a victim that ended stay promised to its waiting
/// job in a view of `nodes`: each is still free, on a node that takes
/// work.
fn promise_holds(nodes: &[NodeView], promise: &RunningJob) -> bool {
    promise.placement.iter().all(|part| {
        nodes.iter().find(|node| node.name == part.node).is_some_and(|node| {
            node.availability == Availability::Up
                && part
                    .gpu_indices
                    .iter()
                    .all(|idx| node.gpus.iter().any(|gpu| gpu.index == *idx && !gpu.busy))
        })
    })
}

/// Whether GPU `gpu` of `node` is in one of `promised`'s placements.
fn is_promised(promised: &[&RunningJob], node: &str, gpu: u32) -> bool {
    promised.iter().any(|promise| {
        promise
            .placement
            .iter()
            .any(|part| part.node == node && part.gpu_indices.contains(&gpu))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Epoch;
    use crate::testing::cluster_view_with;

    const NOW: Timestamp = Timestamp(1_000_000);

    fn on(node: &str, gpus: &[u32]) -> Vec<NodePlacement> {
        vec![NodePlacement {
            node: node.into(),
            gpu_indices: gpus.to_vec(),
        }]
    }

    fn preemption(victim: u64, for_job: u64) -> Preemption {
        Preemption {
            victim: JobId(victim),
            epoch: Epoch(1),
            for_job: JobId(for_job),
            lost_gpu_secs: 0.0,
        }
    }

    /// A hold keeps the free GPUs of its placement, not those kept for
    /// another job, until its longest signalled grace and `PROMISE_MS`;
    /// a job none of whose victims was signalled holds nothing.
    #[test]
    fn a_hold_keeps_what_is_free_and_kept_for_no_one_until_the_longest_grace() {
        let view = cluster_view_with("n1 4xh100", "r1 on=n1:0", "j2\nj3");
        let mut promises = Promises::default();
        promises.victim_ended(JobId(5), JobId(3), &on("n1", &[3]), NOW);
        let preemptions = [preemption(1, 2), preemption(4, 2), preemption(6, 9)];
        let grace_of = |p: &Preemption| {
            [(1, 30), (4, 90)]
                .into_iter()
                .find(|(v, _)| p.victim.0 == *v)
                .map(|(_, g)| g)
        };
        let free_now = |_: &str, gpu: u32| gpu != 0;
        let holds = [(JobId(2), on("n1", &[0, 1, 2, 3])), (JobId(9), on("n1", &[1]))];
        promises.hold(&holds, (&preemptions, grace_of), NOW, free_now);
        let waits = |_| true;
        let kept: Vec<(JobId, Vec<NodePlacement>)> = promises
            .in_force(&view.nodes, waits)
            .into_iter()
            .map(|p| (p.preempted_for.unwrap(), p.placement))
            .collect();
        assert_eq!(kept, [(JobId(3), on("n1", &[3])), (JobId(2), on("n1", &[1, 2]))]);
        // Kept until the grace of 90 s and PROMISE_MS are over (job 3's,
        // with no claim, for PROMISE_MS).
        let until = NOW.0 + 90_000 + PROMISE_MS;
        promises.expire(Timestamp(until - 1), waits);
        let kept: Vec<Option<JobId>> = promises
            .in_force(&view.nodes, waits)
            .iter()
            .map(|p| p.preempted_for)
            .collect();
        assert_eq!(kept, [Some(JobId(2))]);
        promises.expire(Timestamp(until), waits);
        assert!(promises.in_force(&view.nodes, waits).is_empty());
        assert!(promises.is_empty());
    }

    /// An ended victim's GPUs are kept for its job while the job's claims
    /// hold (at least `PROMISE_MS`), honoured only while the job waits and
    /// the GPUs are free on a node that takes work; a start ends them.
    #[test]
    fn an_ended_victims_gpus_are_kept_while_its_job_waits_and_they_are_free() {
        let mut promises = Promises::default();
        let grace_of = |_: &Preemption| Some(300);
        promises.hold(
            &[(JobId(2), Vec::new())],
            (&[preemption(1, 2)], grace_of),
            NOW,
            |_, _| true,
        );
        let later = Timestamp(NOW.0 + 200_000);
        promises.victim_ended(JobId(1), JobId(2), &on("n1", &[0, 1]), later);
        let free = cluster_view_with("n1 4xh100", "", "").nodes;
        let busy = cluster_view_with("n1 4xh100", "r7 on=n1:1", "").nodes;
        let down = cluster_view_with("n1 4xh100 drain", "", "").nodes;
        assert_eq!(promises.in_force(&free, |_| true).len(), 1);
        assert!(promises.in_force(&free, |_| false).is_empty());
        assert!(promises.in_force(&busy, |_| true).is_empty());
        assert!(promises.in_force(&down, |_| true).is_empty());
        // Until the claim's end (300 s of grace from NOW), past PROMISE_MS.
        promises.expire(Timestamp(NOW.0 + 300_000 + PROMISE_MS - 1), |_| true);
        assert_eq!(promises.in_force(&free, |_| true).len(), 1);
        promises.claims_met(JobId(2));
        assert!(promises.is_empty());
        // No claim: PROMISE_MS from its end.
        promises.victim_ended(JobId(1), JobId(2), &on("n1", &[0]), later);
        promises.expire(Timestamp(later.0 + PROMISE_MS), |_| true);
        assert!(promises.is_empty());
        // A job that no longer waits loses its promises.
        promises.victim_ended(JobId(1), JobId(2), &on("n1", &[0]), later);
        promises.expire(later, |_| false);
        assert!(promises.is_empty());
    }
}
