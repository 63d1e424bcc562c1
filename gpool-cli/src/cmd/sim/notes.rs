//! Why a policy's GPUs sat idle while jobs waited: one line under the
//! policy table where allocation is low and waits are long, from figures
//! the replay measured (never a guess).

use super::tables::human;
use gpool_core::sim::Outcome;

/// Allocation under this share is low...
const LOW_ALLOCATION: f64 = 0.75;
/// ...while a mean queueing delay of at least this many seconds is long.
const LONG_MEAN_WAIT_SECS: f64 = 3600.0;

/// Where a policy's idle GPU-hours fell, as shares of them all. The three
/// add up to 1, and each is exact: `nothing_waiting` counts the time
/// slices of the charts in which no job waited at all; `fitting` the time
/// in which some waiting job fitted the free GPUs of its pool;
/// `fitting_nowhere` the rest, in slices in which jobs waited, at moments
/// when none of them fitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct IdleSplit {
    pub idle_gpu_hours: f64,
    pub nothing_waiting: f64,
    pub fitting: f64,
    pub fitting_nowhere: f64,
}

/// Splits `outcome`'s idle GPU-hours by what waited meanwhile; `None`
/// where nothing was idle.
pub(super) fn idle_split(outcome: &Outcome) -> Option<IdleSplit> {
    let gpus = outcome.gpus as f64;
    let idle = gpus * outcome.span_hours * (1.0 - outcome.allocation);
    if idle <= 1e-9 || gpus == 0.0 {
        return None;
    }
    let series = &outcome.series;
    let slice_hours = series.bucket_secs as f64 / 3600.0;
    // Each slice's idle GPU-hours: its length (the last one ends with the
    // replay) less what was allocated, as a share of a whole slice.
    let idle_nothing_waiting: f64 = series
        .allocation
        .iter()
        .zip(&series.queued_jobs)
        .enumerate()
        .filter(|(_, (_, queued))| **queued == 0.0)
        .map(|(slice_idx, (allocated, _))| {
            let length = slice_hours.min(outcome.span_hours - slice_idx as f64 * slice_hours);
            gpus * (length - allocated * slice_hours).max(0.0)
        })
        .sum();
    let idle_fitting = outcome
        .allocation_while_startable
        .map_or(0.0, |allocated| gpus * outcome.hours_startable * (1.0 - allocated));
    let nothing_waiting = (idle_nothing_waiting / idle).clamp(0.0, 1.0);
    let fitting = (idle_fitting / idle).clamp(0.0, 1.0 - nothing_waiting);
    Some(IdleSplit {
        idle_gpu_hours: idle,
        nothing_waiting,
        fitting,
        fitting_nowhere: 1.0 - nothing_waiting - fitting,
    })
}

/// The note for `outcome`, where its allocation is low while its jobs
/// waited long: the largest share of its idle GPU-hours, and what it
/// says. `arrivals_hours`: from the trace's first submission to its last.
/// None for a replay with power groups (their sleeping GPUs are idle by
/// design).
pub(super) fn note(outcome: &Outcome, arrivals_hours: f64) -> Option<String> {
    if outcome.allocation >= LOW_ALLOCATION || outcome.queue_delay.mean < LONG_MEAN_WAIT_SECS || outcome.power.is_some()
    {
        return None;
    }
    let split = idle_split(outcome)?;
    let pct = |share: f64| format!("{:.0}%", share * 100.0);
    let head = format!(
        "note: {}: {:.1}% allocated while jobs waited {} on average:",
        outcome.policy,
        outcome.allocation * 100.0,
        human(outcome.queue_delay.mean)
    );
    let IdleSplit {
        nothing_waiting,
        fitting,
        fitting_nowhere,
        ..
    } = split;
    let why = if nothing_waiting >= fitting && nothing_waiting >= fitting_nowhere {
        let drain_hours = outcome.span_hours - arrivals_hours;
        let drain = if drain_hours >= 0.1 * outcome.span_hours {
            format!(
                "; {} of the {} replayed come after the last arrival, while the last jobs run",
                human(drain_hours * 3600.0),
                human(outcome.span_hours * 3600.0)
            )
        } else {
            String::new()
        };
        format!(
            " demand came and went: {} of the idle GPU-hours fell in time slices in which no job waited{drain}",
            pct(nothing_waiting)
        )
    } else if fitting_nowhere >= fitting {
        // Dedicated partitions are pools of their own, one per team.
        let pool = if outcome.policy == "dedicated" {
            "its team's partition"
        } else {
            "its pool (GPUs per node, nodes or model)"
        };
        let never = match outcome.never_started {
            0 => String::new(),
            n => format!("; {n} jobs never started"),
        };
        format!(
            " the waiting jobs did not fit the idle GPUs: {} of the idle GPU-hours fell in time slices in which jobs waited, when none of them fitted the free GPUs of {pool}{never}",
            pct(fitting_nowhere)
        )
    } else {
        format!(
            " the policy held back jobs that fitted: {} of the idle GPU-hours fell while a waiting job fitted the free GPUs of its pool and was not started",
            pct(fitting)
        )
    };
    Some(head + &why)
}
