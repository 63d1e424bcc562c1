//! Promises: the GPUs of preempted attempts that ended, and the free GPUs
//! a reclaiming job holds, kept for the job they were taken for until it
//! starts or its victims' grace is long over (`gpool_core::sched`'s
//! `ClusterView::promised`).

use super::State;
use gpool_core::job_state::JobState;
use gpool_core::model::Job;
use gpool_core::sched::RunningJob;
use gpool_core::{JobId, Timestamp};

/// GPUs a preempted attempt freed, promised to the job it was preempted for.
#[derive(Debug, Clone)]
pub struct Promise {
    /// The ended attempt as the scheduler sees a victim: its placement, and
    /// `preempted_for` the job they are promised to.
    pub view: RunningJob,
    pub until: Timestamp,
}

/// Whether a job (or an array's task, which becomes a job only when it
/// starts) may still be waiting: promises to it hold. The scheduler honours
/// a promise only to a job its view holds as waiting.
fn is_pending(job: Option<&Job>) -> bool {
    job.is_none_or(|job| job.state == JobState::Pending)
}

impl State {
    /// The free GPUs of `placement`, which job `id` will get once its
    /// victims end, are promised to it until `until`: no other job takes
    /// them meanwhile, so it never needs another victim for them.
    pub(super) fn hold_free_gpus(
        &mut self,
        id: JobId,
        placement: &[gpool_core::model::NodePlacement],
        until: Timestamp,
    ) {
        let holders = self.gpu_holders();
        let promised: Vec<&RunningJob> = self.promises.iter().map(|promise| &promise.view).collect();
        let free = gpool_core::sched::held_free(placement, |node, gpu| {
            !holders.contains_key(&(node, gpu)) && !gpool_core::sched::is_promised(&promised, node, gpu)
        });
        if !free.is_empty() {
            self.promises.push(Promise {
                view: RunningJob::promise(id, id, free),
                until,
            });
        }
    }

    /// Drops the promises (and claims) past their time, and those to jobs
    /// that no longer wait.
    pub(super) fn expire_promises(&mut self, now: Timestamp) {
        self.claim_until.retain(|_, until| *until > now);
        let jobs = &self.jobs;
        self.promises.retain(|promise| {
            promise.until > now
                && is_pending(
                    jobs.get(&promise.view.preempted_for.unwrap_or_default())
                        .map(|job| &**job),
                )
        });
    }

    /// Attempt `placement` of `id` ended: where it was preempted for a job
    /// that still waits, its GPUs are promised to that job.
    /// `for_job`: the job it was preempted for, if any.
    pub(super) fn keep_promise(
        &mut self,
        id: JobId,
        for_job: Option<JobId>,
        placement: &[gpool_core::model::NodePlacement],
        now: Timestamp,
    ) {
        let Some(for_job) = for_job else {
            return;
        };
        if !is_pending(self.jobs.get(&for_job).map(|job| &**job)) {
            return;
        }
        let until = gpool_core::sched::promise_until(now, self.claim_until.get(&for_job).copied());
        self.promises.push(Promise {
            view: RunningJob::promise(id, for_job, placement.to_vec()),
            until,
        });
    }

    /// Job `id` started: what was being freed for it is no longer its. Its
    /// victims still in their grace keep its name, a job that no longer
    /// waits: the next plan rescinds them unless another job counts on
    /// them.
    pub(super) fn claims_met(&mut self, id: JobId) {
        self.promises.retain(|promise| promise.view.preempted_for != Some(id));
        self.claim_until.remove(&id);
    }

    /// The promises the scheduler honours now: their job waits, and their
    /// GPUs are free on a node that takes work.
    pub(super) fn promised(&self, nodes: &[gpool_core::sched::NodeView]) -> Vec<RunningJob> {
        self.promises
            .iter()
            .filter(|promise| {
                is_pending(
                    self.jobs
                        .get(&promise.view.preempted_for.unwrap_or_default())
                        .map(|job| &**job),
                )
            })
            .filter(|promise| gpool_core::sched::promise_holds(nodes, &promise.view))
            .map(|promise| promise.view.clone())
            .collect()
    }
}
