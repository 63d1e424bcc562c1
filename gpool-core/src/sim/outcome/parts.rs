//! The parts of an outcome: distributions of waits, each team's figures,
//! the time series for charts (a bounded number of points, whatever the
//! replay's length), and the rows `--jobs-out` and `--events-out` write.

use crate::ids::Timestamp;
use serde::Serialize;
use std::collections::BTreeMap;

/// The most points a series keeps: past it, its buckets double in width
/// (two neighbours merged, exactly), so that a long replay gives charts
/// of a few thousand points per line, bucketed by the replay's own span.
pub const MAX_SERIES_POINTS: usize = 2400;

/// A distribution of durations, in seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Dist {
    pub n: usize,
    pub mean: f64,
    pub median: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Dist {
    /// Nearest-rank percentiles of `values` (seconds).
    pub fn of(mut values: Vec<f64>) -> Dist {
        if values.is_empty() {
            return Dist::default();
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let rank = |p: f64| values[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        Dist {
            n,
            mean: values.iter().sum::<f64>() / n as f64,
            median: rank(0.5),
            p95: rank(0.95),
            p99: rank(0.99),
            max: values[n - 1],
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TeamOutcome {
    pub team: String,
    pub guaranteed_gpus: u32,
    pub jobs: usize,
    pub never_started: usize,
    pub queue_delay: Dist,
    pub completion_time: Dist,
    pub guaranteed_gpu_hours: f64,
    pub burst_gpu_hours: f64,
    pub lost_gpu_hours: f64,
    pub preemptions: u64,
    /// GPU-hours of its guarantee it asked for and could be given: over
    /// time, its running GPUs (up to its guarantee) and the waiting jobs
    /// that fit in what is left of it (smallest first; a job larger than
    /// what is left is not owed)...
    pub asked_guarantee_gpu_hours: f64,
    /// ...and of those, how many it held.
    pub received_guarantee_gpu_hours: f64,
    /// `received / asked`; `None` when it never asked.
    pub guarantee_met: Option<f64>,
    /// The measure before: its whole demand (running and waiting GPUs) up
    /// to its guarantee, shapes that cannot fit in it included...
    pub asked_demand_gpu_hours: f64,
    /// ...and `received / asked_demand`.
    pub guarantee_met_by_demand: Option<f64>,
}

/// Time series, one point per `bucket_secs`, each a time-weighted mean.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Series {
    pub start: Timestamp,
    pub bucket_secs: u64,
    /// Allocated GPUs over all GPUs.
    pub allocation: Vec<f64>,
    /// Jobs waiting.
    pub queued_jobs: Vec<f64>,
    /// GPUs each team holds.
    pub team_gpus: BTreeMap<String, Vec<f64>>,
}

impl Series {
    pub(crate) fn new(start: Timestamp, bucket_secs: u64, teams: &[String]) -> Series {
        Series {
            start,
            bucket_secs: bucket_secs.max(1),
            allocation: Vec::new(),
            queued_jobs: Vec::new(),
            team_gpus: teams.iter().map(|t| (t.clone(), Vec::new())).collect(),
        }
    }

    fn bucket_ms(&self) -> i64 {
        self.bucket_secs as i64 * 1000
    }

    /// Adds `busy` GPUs, `queued` jobs and each team's `running` GPUs over
    /// `from..to`, as time-weighted sums (divided by `as_shares`).
    pub(crate) fn add(&mut self, (from, to): (Timestamp, Timestamp), busy: u64, queued: u64, running: &[u64]) {
        let mut at = from.0;
        while at < to.0 {
            let mut bucket = ((at - self.start.0) / self.bucket_ms()).max(0) as usize;
            while bucket >= MAX_SERIES_POINTS {
                self.widen();
                bucket = ((at - self.start.0) / self.bucket_ms()).max(0) as usize;
            }
            let bucket_end = self.start.0 + (bucket as i64 + 1) * self.bucket_ms();
            let piece = (to.0.min(bucket_end) - at) as f64;
            if self.allocation.len() <= bucket {
                self.allocation.resize(bucket + 1, 0.0);
                self.queued_jobs.resize(bucket + 1, 0.0);
                for values in self.team_gpus.values_mut() {
                    values.resize(bucket + 1, 0.0);
                }
            }
            self.allocation[bucket] += busy as f64 * piece;
            self.queued_jobs[bucket] += queued as f64 * piece;
            for (team, values) in self.team_gpus.values_mut().enumerate() {
                values[bucket] += running[team] as f64 * piece;
            }
            at = to.0.min(bucket_end);
        }
    }

    /// Buckets twice as wide: each pair of neighbours summed.
    fn widen(&mut self) {
        let pairs = |values: &mut Vec<f64>| {
            *values = values.chunks(2).map(|pair| pair.iter().sum()).collect();
        };
        pairs(&mut self.allocation);
        pairs(&mut self.queued_jobs);
        for values in self.team_gpus.values_mut() {
            pairs(values);
        }
        self.bucket_secs *= 2;
    }

    /// The sums as shares: of the GPUs (allocation) and of each bucket.
    pub(crate) fn as_shares(&mut self, gpus: f64) {
        let bucket_ms = self.bucket_ms() as f64;
        for value in &mut self.allocation {
            *value /= bucket_ms * gpus;
        }
        for value in &mut self.queued_jobs {
            *value /= bucket_ms;
        }
        for values in self.team_gpus.values_mut() {
            for value in values.iter_mut() {
                *value /= bucket_ms;
            }
        }
    }
}

/// How an attempt ended (or that its job never started).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndState {
    Completed,
    TimedOut,
    Preempted,
    /// Still running when the replay ended (never, unless it was cut).
    Running,
    /// The job never started: no attempt, one row all the same.
    NeverStarted,
}

impl EndState {
    pub fn as_str(self) -> &'static str {
        match self {
            EndState::Completed => "completed",
            EndState::TimedOut => "timed_out",
            EndState::Preempted => "preempted",
            EndState::Running => "running",
            EndState::NeverStarted => "never_started",
        }
    }
}

/// One attempt of a job: a row of `--jobs-out`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptRecord {
    /// The job's number in the trace (from 1, in submit order).
    pub job: u64,
    /// Its attempt, from 1 (0 for a job that never started).
    pub attempt: u32,
    pub team: String,
    pub submit: Timestamp,
    pub start: Option<Timestamp>,
    pub end: Option<Timestamp>,
    /// Each node with the indices of its GPUs the attempt held.
    pub placement: Vec<(String, Vec<u32>)>,
    /// The models of those GPUs (one per model, in order).
    pub gpu_models: Vec<String>,
    pub gpus: u64,
    pub end_state: EndState,
    /// The waiting job a preempted attempt was taken for.
    pub preempted_for: Option<u64>,
}

/// What happened to a running attempt besides its own end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Signalled to give its GPUs to a waiting job.
    Preempted,
    /// Its preemption was withdrawn in its grace.
    Rescinded,
}

/// A preemption or a rescind: a row of `--events-out`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRecord {
    pub at: Timestamp,
    pub kind: EventKind,
    pub job: u64,
    pub attempt: u32,
    /// The waiting job the victim was taken for.
    pub for_job: u64,
    /// Why, in words (what the claimant is owed, what the victim is).
    pub reason: String,
}

/// Jobs that never started, of one requirement shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShapeCount {
    /// `4 GPU(s) x 2 node(s) of a100|h100`, `1 GPU(s) x 1 node(s) of any model`.
    pub shape: String,
    pub jobs: usize,
}
