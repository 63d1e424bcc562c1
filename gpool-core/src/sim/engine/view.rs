//! What a cycle sees besides the waiting jobs' queue: the running jobs'
//! last checkpoints, the hour's waste budget, the GPUs promised to waiting
//! jobs; and the one shape alike jobs share.

use super::*;

impl Sim<'_> {
    /// What a cycle sees besides the queue, as of now: the running jobs'
    /// last checkpoints, the waste budget of the last hour, and the GPUs
    /// promised to waiting jobs.
    pub(super) fn refresh_view(&mut self) {
        let now = self.now;
        for running in &mut self.view.running {
            if let Some(every) = self.attempts.get(&running.id).and_then(|a| a.checkpoint_every_ms) {
                let checkpoints = (now.0 - running.started_at.0) / every;
                running.last_checkpoint_at =
                    (checkpoints > 0).then(|| Timestamp(running.started_at.0 + checkpoints * every));
            }
        }
        self.view.waste_budget_gpu_secs = self
            .waste
            .left(now, self.setup.policy.sharing.waste_cap_gpu_hours_per_hour);
        self.view.promised = self.promised();
    }

    /// The shared `Arc` of `shape`.
    pub(super) fn shape(&mut self, shape: JobShape) -> Arc<JobShape> {
        if let Some(shared) = self.shapes.get(&shape) {
            return shared.clone();
        }
        let shared = Arc::new(shape);
        self.shapes.insert(shared.clone());
        shared
    }

    /// The promises that still hold (those past their time, or to jobs
    /// that no longer wait, are dropped), as the cycle honours them.
    fn promised(&mut self) -> Vec<RunningJob> {
        let pending = &self.view.pending;
        let waits = |id: JobId| pending.iter().any(|job| job.id == id);
        self.promises.expire(self.now, waits);
        self.promises.in_force(&self.view.nodes, waits)
    }
}
