//! What fractions of a GPU held in a replay: the GPUs they occupied (a
//! shared GPU once, however many fractions it holds; a fraction rounded up
//! to a whole GPU, that GPU) against the parts they asked for.

use super::Collector;
use crate::ids::Timestamp;
use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FractionOutcome {
    /// Jobs of the trace that ask for a fraction of one GPU.
    pub jobs: usize,
    /// Their parts of a GPU times how long they ran, in GPU-hours.
    pub asked_gpu_hours: f64,
    /// The GPUs they held times how long, in GPU-hours.
    pub held_gpu_hours: f64,
}

/// Gathers `FractionOutcome` as the replay runs.
#[derive(Default)]
pub(super) struct Fractions {
    pub(super) jobs: usize,
    /// GPUs fractions hold now.
    pub(super) gpus_now: u64,
    pub(super) held_gpu_ms: f64,
    pub(super) asked_gpu_ms: f64,
}

impl Fractions {
    pub(super) fn advance(&mut self, dt_ms: f64) {
        self.held_gpu_ms += self.gpus_now as f64 * dt_ms;
    }

    /// A fraction of `milli` thousandths ran `ms`.
    pub(super) fn ran(&mut self, milli: u32, ms: i64) {
        self.asked_gpu_ms += f64::from(milli) / 1000.0 * ms.max(0) as f64;
    }

    pub(super) fn outcome(&self) -> Option<FractionOutcome> {
        (self.jobs > 0).then(|| FractionOutcome {
            jobs: self.jobs,
            asked_gpu_hours: self.asked_gpu_ms / 3_600_000.0,
            held_gpu_hours: self.held_gpu_ms / 3_600_000.0,
        })
    }
}

impl Collector {
    /// A GPU fractions hold opened (`true`: the first fraction on it) or
    /// closed at `now`. `whole`: a fraction rounded up to a whole GPU,
    /// which its start holds (and its end frees) as any job's: only the
    /// fractions' count changes.
    pub(in crate::sim) fn fraction_gpu(&mut self, opened: bool, whole: bool, now: Timestamp) {
        match (opened, whole) {
            (true, false) => self.held(1, now),
            (false, false) => self.busy -= 1,
            _ => {}
        }
        if opened {
            self.fractions.gpus_now += 1;
        } else {
            self.fractions.gpus_now -= 1;
        }
    }

    /// A fraction of `milli` thousandths of a GPU ran `ms`.
    pub(in crate::sim) fn fraction_ran(&mut self, milli: u32, ms: i64) {
        self.fractions.ran(milli, ms);
    }
}
