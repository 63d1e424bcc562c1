//! The hour's waste budget: GPU-seconds that preemptions stand to throw
//! away (a victim's work since its last checkpoint) may not pass
//! `Sharing::waste_cap_gpu_hours_per_hour` in any hour. gpoold's state task
//! and `gpool sim` charge it in this one ledger; the view's
//! `ClusterView::waste_budget_gpu_secs` is what is left of it.

use crate::ids::Timestamp;
use std::collections::VecDeque;

const HOUR_MS: i64 = 3_600_000;

/// A victim signalled at a time, and the GPU-seconds it stands to lose.
pub type Waste = (Timestamp, f64);

/// The charges of the last hour, oldest first.
#[derive(Debug, Clone, Default)]
pub struct WasteBudget {
    charged: VecDeque<Waste>,
}

impl WasteBudget {
    /// A victim is signalled: what it stands to lose counts for an hour
    /// (charges more than an hour older than it are dropped).
    pub fn charge(&mut self, waste: Waste) {
        while self.charged.front().is_some_and(|(at, _)| waste.0 .0 - at.0 > HOUR_MS) {
            self.charged.pop_front();
        }
        self.charged.push_back(waste);
    }

    /// A preemption withdrawn in its grace: its charge goes back.
    pub fn give_back(&mut self, waste: Waste) {
        if let Some(charged) = self.charged.iter().position(|w| *w == waste) {
            self.charged.remove(charged);
        }
    }

    /// GPU-seconds preemption may still throw away in the hour up to
    /// `now`, under a cap of `cap_gpu_hours_per_hour`.
    pub fn left(&self, now: Timestamp, cap_gpu_hours_per_hour: f64) -> f64 {
        let lost: f64 = self
            .charged
            .iter()
            .filter(|(at, _)| now.0 - at.0 <= HOUR_MS)
            .map(|(_, lost)| lost)
            .sum();
        cap_gpu_hours_per_hour * 3600.0 - lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Charges count for an hour; one given back counts no more, and
    /// charged again it counts again.
    #[test]
    fn charges_count_for_an_hour_and_a_withdrawn_one_not_at_all() {
        let mut budget = WasteBudget::default();
        let first = (Timestamp(0), 1_000.0);
        let second = (Timestamp(1_800_000), 500.0);
        budget.charge(first);
        budget.charge(second);
        assert_eq!(budget.left(Timestamp(1_800_000), 1.0), 3_600.0 - 1_500.0);
        assert_eq!(budget.left(Timestamp(HOUR_MS + 1), 1.0), 3_600.0 - 500.0);
        budget.give_back(second);
        assert_eq!(budget.left(Timestamp(1_800_000), 1.0), 3_600.0 - 1_000.0);
        budget.charge(second);
        assert_eq!(budget.left(Timestamp(1_800_000), 1.0), 3_600.0 - 1_500.0);
        // A charge past the hour drops the old ones.
        budget.charge((Timestamp(HOUR_MS + 1), 0.0));
        assert_eq!(budget.charged.len(), 2);
    }
}
