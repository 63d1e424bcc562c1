//! Promises on the controller's side: the state task keeps what is freed
//! for a waiting job in `gpool_core::sched::Promises`, the ledger
//! `gpool sim` keeps, fed from its durable job records and its agents'
//! reports (`ClusterView::promised`).

use super::State;
use gpool_core::job_state::JobState;
use gpool_core::model::{Job, NodePlacement};
use gpool_core::sched::RunningJob;
use gpool_core::{JobId, Timestamp};

/// Whether a job (or an array's task, which becomes a job only when it
/// starts) may still be waiting: promises to it hold. The scheduler honours
/// a promise only to a job its view holds as waiting.
fn is_pending(job: Option<&Job>) -> bool {
    job.is_none_or(|job| job.state == JobState::Pending)
}

impl State {
    /// Drops the promises (and claims) past their time, and those to jobs
    /// that no longer wait.
    pub(super) fn expire_promises(&mut self, now: Timestamp) {
        let jobs = &self.jobs;
        self.promises
            .expire(now, |id| is_pending(jobs.get(&id).map(|job| &**job)));
    }

    /// Attempt `placement` of `id` ended: where it was preempted for a job
    /// that still waits, its GPUs are promised to that job.
    /// `for_job`: the job it was preempted for, if any.
    pub(super) fn keep_promise(
        &mut self,
        id: JobId,
        for_job: Option<JobId>,
        placement: &[NodePlacement],
        now: Timestamp,
    ) {
        let Some(for_job) = for_job else {
            return;
        };
        if is_pending(self.jobs.get(&for_job).map(|job| &**job)) {
            self.promises.victim_ended(id, for_job, placement, now);
        }
    }

    /// Job `id` started: what was being freed for it is no longer its.
    pub(super) fn claims_met(&mut self, id: JobId) {
        self.promises.claims_met(id);
    }

    /// The promises the scheduler honours now: their job waits, and their
    /// GPUs are free on a node that takes work.
    pub(super) fn promised(&self, nodes: &[gpool_core::sched::NodeView]) -> Vec<RunningJob> {
        let jobs = &self.jobs;
        self.promises
            .in_force(nodes, |id| is_pending(jobs.get(&id).map(|job| &**job)))
    }
}
