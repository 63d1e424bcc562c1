//! What the controller keeps of each running attempt beside the job's
//! record: one record per attempt, made when something is first learned of
//! it and dropped when the attempt ends (`State::apply_event`), so nothing
//! of an attempt outlives it. Not durable: a restart learns it again from
//! heartbeats, and a preemption's deadline from the job's `preempted_at`.

use super::gpu_use::Straggler;
use gpool_core::model::GpuUse;
use gpool_core::stragglers::GpuKey;
use gpool_core::{Epoch, JobId, Timestamp};
use std::collections::{BTreeMap, HashSet};

#[derive(Debug, Default)]
pub struct Attempt {
    /// Its GPU use so far, from its nodes' samples (folded into the job's
    /// record when it ends).
    pub gpu_use: GpuUse,
    /// For an attempt on several GPUs: since when each of its GPUs has
    /// lagged behind the others.
    pub lagging_since: BTreeMap<GpuKey, Timestamp>,
    /// Its stragglers now: the GPU, its utilisation, the median, and since
    /// when.
    pub stragglers: Vec<Straggler>,
    /// The nodes of a gang whose rank already exited 0.
    pub gang_exits: HashSet<String>,
    /// Set from its checkpoint signal until it ends (or its withdrawn
    /// preemption's grace is over).
    pub preemption: Option<Preempting>,
}

/// A preempted attempt in its grace (or past it, being killed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preempting {
    /// The attempt the signal went to.
    pub epoch: Epoch,
    /// When it is next due: the end of its grace, then each resent kill.
    pub deadline: Timestamp,
    /// The waiting job it was preempted for, while that job still wants
    /// its GPUs (the scheduler's preemptions; after a restart its GPUs go to
    /// whoever needs them first).
    pub for_job: Option<JobId>,
    /// Withdrawn in its grace (`State::rescind`): not killed when the grace
    /// ends.
    pub withdrawn: bool,
    /// What the scheduler's preemption charged the hour's waste budget
    /// (none for an operator's requeue, or after a restart).
    pub charged: Option<gpool_core::sched::waste::Waste>,
}

impl Preempting {
    pub fn new(epoch: Epoch, deadline: Timestamp) -> Preempting {
        Preempting {
            epoch,
            deadline,
            for_job: None,
            withdrawn: false,
            charged: None,
        }
    }
}

impl super::State {
    /// What is known of job `id`'s running attempt beside its record.
    pub fn attempt(&self, id: JobId) -> Option<&Attempt> {
        self.attempts.get(&id)
    }

    /// Each running attempt's record, by job.
    pub fn attempts(&self) -> impl Iterator<Item = (JobId, &Attempt)> {
        self.attempts.iter().map(|(id, attempt)| (*id, attempt))
    }

    /// Job `id`'s running attempt's record, made if there is none yet.
    pub(super) fn attempt_mut(&mut self, id: JobId) -> &mut Attempt {
        self.attempts.entry(id).or_default()
    }

    /// The preemption of job `id`'s running attempt, if it is preempted.
    pub(super) fn preemption(&self, id: JobId) -> Option<&Preempting> {
        self.attempts.get(&id)?.preemption.as_ref()
    }

    pub(super) fn preemption_mut(&mut self, id: JobId) -> Option<&mut Preempting> {
        self.attempts.get_mut(&id)?.preemption.as_mut()
    }

    /// Drops what was known of job `id`'s attempt that ended.
    pub(super) fn attempt_ended(&mut self, id: JobId) -> Option<Attempt> {
        self.attempts.remove(&id)
    }
}
