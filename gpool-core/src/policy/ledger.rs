//! A team's metered GPU time, charged attempt by attempt.

use super::{decay, Sharing};
use crate::ids::Timestamp;
use serde::{Deserialize, Serialize};

/// A team's metered GPU time: decayed usage for fair share, and this
/// period's guaranteed and burst GPU-seconds for budgets and reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// Decayed GPU-seconds, as of `decayed_at`.
    pub decayed: f64,
    pub decayed_at: Timestamp,
    /// Start of the period the two counters below belong to.
    pub period_start: Timestamp,
    pub guaranteed_gpu_secs: f64,
    pub burst_gpu_secs: f64,
}

impl Ledger {
    /// Charges `gpus` GPUs from `from` to `to` (an attempt's run, or the part
    /// of it since it was last charged).
    pub fn charge(&mut self, gpus: f64, from: Timestamp, to: Timestamp, burst: bool, sharing: &Sharing) {
        let period_start = sharing.period.start(to, &sharing.time_zone);
        self.charge_in(period_start, gpus, (from, to), burst, sharing.half_life_secs);
    }

    /// `charge`, where the period holding `to` starts at `period_start`
    /// (a cycle charges every running job to one instant).
    pub fn charge_in(
        &mut self,
        period_start: Timestamp,
        gpus: f64,
        (from, to): (Timestamp, Timestamp),
        burst: bool,
        half_life_secs: f64,
    ) {
        if period_start != self.period_start {
            self.period_start = period_start;
            self.guaranteed_gpu_secs = 0.0;
            self.burst_gpu_secs = 0.0;
        }
        let this_period = (to.0 - from.0.max(period_start.0)).max(0) as f64 / 1000.0 * gpus;
        if burst {
            self.burst_gpu_secs += this_period;
        } else {
            self.guaranteed_gpu_secs += this_period;
        }
        let all = (to.0 - from.0).max(0) as f64 / 1000.0 * gpus;
        self.decayed = self.decayed_as_of(to, half_life_secs) + all;
        self.decayed_at = to;
    }

    pub fn decayed_as_of(&self, now: Timestamp, half_life_secs: f64) -> f64 {
        decay(
            self.decayed,
            (now.0 - self.decayed_at.0) as f64 / 1000.0,
            half_life_secs,
        )
    }

    /// This period's guaranteed GPU-seconds as of `now` (0 once a new
    /// period began).
    pub fn guaranteed_in_period(&self, now: Timestamp, sharing: &Sharing) -> f64 {
        if sharing.period.start(now, &sharing.time_zone) == self.period_start {
            self.guaranteed_gpu_secs
        } else {
            0.0
        }
    }

    pub fn burst_in_period(&self, now: Timestamp, sharing: &Sharing) -> f64 {
        if sharing.period.start(now, &sharing.time_zone) == self.period_start {
            self.burst_gpu_secs
        } else {
            0.0
        }
    }
}
