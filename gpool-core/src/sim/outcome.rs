//! What a simulation measured: allocation, waits, each team's share against
//! its guarantee, preemption losses, fragmentation, and time series for
//! charts.

use super::trace::TraceJob;
use super::Setup;
use crate::ids::{JobId, Timestamp};
use crate::sched::{Availability, ClusterView, PendingJob, Policy, RunningJob};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

mod fractions;
pub use fractions::FractionOutcome;
mod parts;
pub use parts::{
    AttemptRecord, Dist, EndState, EventKind, EventRecord, Series, ShapeCount, TeamOutcome, MAX_SERIES_POINTS,
};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Outcome {
    pub policy: String,
    pub nodes: usize,
    pub gpus: u64,
    pub jobs: usize,
    pub completed: usize,
    pub timed_out: usize,
    /// Still waiting when nothing else could happen (no place could ever
    /// hold them: larger than their partition, or than the cluster).
    pub never_started: usize,
    pub span_hours: f64,
    /// Allocated GPU-time over GPU-time, from the first arrival to the last end.
    pub allocation: f64,
    /// The same, only over the time some waiting job's shape fitted the
    /// free GPUs of its pool (`None`: that never happened).
    pub allocation_while_startable: Option<f64>,
    pub hours_startable: f64,
    /// From submit to first start, of the jobs that started.
    pub queue_delay: Dist,
    /// From submit to end, of the jobs that ended.
    pub completion_time: Dist,
    pub delivered_gpu_hours: f64,
    pub guaranteed_gpu_hours: f64,
    pub burst_gpu_hours: f64,
    /// Attempts ended by preemption, and the GPU-hours of work since their
    /// last checkpoint they lost.
    pub preemptions: u64,
    pub lost_gpu_hours: f64,
    /// Jobs that waited at least once with enough free GPUs in their pool
    /// in total, but not enough in one place (read from the words on why
    /// jobs wait: 0 where the replay stated none, `Options::words`).
    pub fragmentation_blocked_jobs: usize,
    pub cycles: u64,
    /// Starts placed on a GPU that was taken or out of service (always 0:
    /// a check of the scheduler).
    pub overcommits: u64,
    /// Plans that broke a scheduling invariant (`sched::invariants`,
    /// checked in debug and test builds; always 0), and the first, in words.
    pub invariant_violations: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_violation: Option<String>,
    /// GPUs held right after the first cycle that left a job waiting, and
    /// when (hours since the first arrival); `None`: no job ever waited.
    pub held_at_first_rejection: Option<u64>,
    pub first_rejection_hours: Option<f64>,
    /// The most GPUs held at once, and when that was first reached.
    pub peak_held: u64,
    pub peak_hours: f64,
    /// From the first arrival to the last, and the allocation over it
    /// (`None`: all jobs arrived at once).
    pub arrival_hours: f64,
    pub allocation_during_arrivals: Option<f64>,
    /// The jobs that never started, by requirement shape (most first).
    pub never_started_by_shape: Vec<ShapeCount>,
    pub teams: Vec<TeamOutcome>,
    /// Where the setup has power groups: what they cost and saved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<super::engine::PowerOutcome>,
    /// Where the trace asks for fractions of a GPU: what they held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fractions: Option<FractionOutcome>,
    #[serde(skip)]
    pub series: Series,
    /// Every attempt, and every job that never started (where
    /// `Options::record`), in the order they ended.
    #[serde(skip)]
    pub attempts: Vec<AttemptRecord>,
    /// Every preemption and rescind (where `Options::record`).
    #[serde(skip)]
    pub events: Vec<EventRecord>,
}

/// A job that takes any GPU: its node's free count says whether it fits
/// (nodes of one model each, without MIG slices, as most are).
fn plain(job: &PendingJob) -> bool {
    job.shape.gpu_types.is_empty() && job.shape.requires.is_none()
}

/// Whether `job` could have its GPUs of one node on `node` now: free GPUs
/// of one model it accepts (MIG slices only where named), with the memory
/// and on a node its requirements allow.
fn fits_node(job: &PendingJob, node: &crate::sched::NodeView) -> bool {
    if !job.allows_node(node) {
        return false;
    }
    let mut by_model: HashMap<&crate::model::GpuModel, u32, foldhash::fast::RandomState> = HashMap::default();
    for gpu in node.gpus.iter().filter(|gpu| !gpu.busy) {
        let named = !job.shape.gpu_types.is_empty();
        if gpu.model.accepted_by(&job.shape.gpu_types)
            && (named || !gpu.model.is_mig_slice())
            && job.allows_memory(gpu.memory_mib)
        {
            *by_model.entry(&gpu.model).or_default() += 1;
        }
    }
    by_model.values().any(|n| *n >= job.shape.gpus_per_node)
}

/// GPUs of waiting jobs (by size: how many) that fit together in `room`,
/// smallest first.
fn fitting(sizes: &BTreeMap<u64, u64>, room: u64) -> u64 {
    let mut left = room;
    for (size, count) in sizes {
        if *size > left {
            break;
        }
        let n = (*count).min(left / size);
        left -= n * size;
    }
    room - left
}

/// Gathers the figures as the simulation runs.
pub(super) struct Collector {
    policy_name: String,
    nodes: usize,
    total_gpus: u64,
    teams: Vec<String>,
    team_of: HashMap<String, usize>,
    guarantees: Vec<u64>,
    job_team: Vec<usize>,
    submitted: Vec<Timestamp>,
    first_start: Vec<Option<Timestamp>>,
    ended: Vec<Option<(Timestamp, bool)>>,
    busy: u64,
    running: Vec<u64>,
    waiting: Vec<u64>,
    queued_jobs: u64,
    startable: bool,
    busy_gpu_ms: f64,
    startable_ms: f64,
    startable_busy_gpu_ms: f64,
    asked_gpu_ms: Vec<f64>,
    asked_demand_gpu_ms: Vec<f64>,
    received_gpu_ms: Vec<f64>,
    /// Per team: the sizes (GPUs) of its waiting jobs, and how many of each.
    waiting_sizes: Vec<BTreeMap<u64, u64>>,
    guaranteed_gpu_secs: Vec<f64>,
    burst_gpu_secs: Vec<f64>,
    lost_gpu_secs: Vec<f64>,
    preemptions: Vec<u64>,
    /// By job index: blocked by fragmentation at least once.
    fragmented: Vec<bool>,
    n_fragmented: usize,
    cycles: u64,
    overcommits: u64,
    violations: u64,
    first_violation: Option<String>,
    first: Option<Timestamp>,
    last_arrival: Timestamp,
    busy_gpu_ms_arrivals: f64,
    peak: (u64, Timestamp),
    first_rejection: Option<(u64, Timestamp)>,
    series: Series,
    /// Node indices each pool selects (built at the first snapshot).
    pools: Option<Vec<(String, Vec<usize>)>>,
    fractions: fractions::Fractions,
}

impl Collector {
    pub(super) fn new(setup: &Setup, jobs: &[TraceJob], bucket_secs: u64) -> Collector {
        let mut teams: Vec<String> = setup.guarantees.keys().cloned().collect();
        teams.extend(jobs.iter().map(|job| job.team.clone()));
        teams.sort();
        teams.dedup();
        let team_of: HashMap<String, usize> = teams.iter().enumerate().map(|(i, t)| (t.clone(), i)).collect();
        let n = teams.len();
        let start = jobs.first().map_or(Timestamp(0), |job| job.submit);
        Collector {
            policy_name: setup.name.clone(),
            nodes: setup.nodes.len(),
            total_gpus: setup.nodes.iter().map(|node| node.gpus.len() as u64).sum(),
            guarantees: teams
                .iter()
                .map(|t| u64::from(setup.guarantees.get(t).copied().unwrap_or(0)))
                .collect(),
            job_team: jobs.iter().map(|job| team_of[&job.team]).collect(),
            submitted: jobs.iter().map(|job| job.submit).collect(),
            first_start: vec![None; jobs.len()],
            ended: vec![None; jobs.len()],
            busy: 0,
            running: vec![0; n],
            waiting: vec![0; n],
            queued_jobs: 0,
            startable: false,
            busy_gpu_ms: 0.0,
            startable_ms: 0.0,
            startable_busy_gpu_ms: 0.0,
            asked_gpu_ms: vec![0.0; n],
            asked_demand_gpu_ms: vec![0.0; n],
            received_gpu_ms: vec![0.0; n],
            waiting_sizes: vec![BTreeMap::new(); n],
            guaranteed_gpu_secs: vec![0.0; n],
            burst_gpu_secs: vec![0.0; n],
            lost_gpu_secs: vec![0.0; n],
            preemptions: vec![0; n],
            fragmented: vec![false; jobs.len()],
            n_fragmented: 0,
            cycles: 0,
            overcommits: 0,
            violations: 0,
            first_violation: None,
            first: None,
            last_arrival: jobs.last().map_or(start, |job| job.submit),
            busy_gpu_ms_arrivals: 0.0,
            peak: (0, start),
            first_rejection: None,
            series: Series::new(start, bucket_secs, &teams),
            team_of,
            teams,
            pools: None,
            fractions: fractions::Fractions {
                jobs: jobs.iter().filter(|job| job.gpu_milli.is_some()).count(),
                ..Default::default()
            },
        }
    }

    fn team(&self, name: &str) -> usize {
        self.team_of[name]
    }

    pub(super) fn queued(&mut self, job: &PendingJob) {
        let team = self.team(&job.shape.team);
        self.waiting[team] += job.total_gpus();
        *self.waiting_sizes[team].entry(job.total_gpus()).or_default() += 1;
        self.queued_jobs += 1;
    }

    pub(super) fn started(&mut self, job: &PendingJob, running: &RunningJob, now: Timestamp) {
        let team = self.team(&job.shape.team);
        self.waiting[team] -= job.total_gpus();
        if let Some(n) = self.waiting_sizes[team].get_mut(&job.total_gpus()) {
            *n -= 1;
            if *n == 0 {
                self.waiting_sizes[team].remove(&job.total_gpus());
            }
        }
        self.queued_jobs -= 1;
        // A fraction's GPU counts as its GPU opens (`fraction_gpu`).
        let gpus = if running.share.is_some() { 0 } else { running.gpus() };
        self.running[team] += gpus;
        self.held(gpus, now);
        self.first_start[job.id.0 as usize - 1].get_or_insert(now);
    }

    /// `gpus` more are held from `now`.
    fn held(&mut self, gpus: u64, now: Timestamp) {
        self.busy += gpus;
        if self.busy > self.peak.0 {
            self.peak = (self.busy, now);
        }
    }

    fn stopped(&mut self, running: &RunningJob, now: Timestamp) -> usize {
        let team = self.team(&running.team);
        let gpus = if running.share.is_some() { 0 } else { running.gpus() };
        self.running[team] -= gpus;
        self.busy -= gpus;
        let gpu_secs = (now.0 - running.started_at.0) as f64 / 1000.0 * running.charged_gpus();
        if running.burst {
            self.burst_gpu_secs[team] += gpu_secs;
        } else {
            self.guaranteed_gpu_secs[team] += gpu_secs;
        }
        team
    }

    pub(super) fn ended(&mut self, running: &RunningJob, now: Timestamp, timeout: bool) {
        self.stopped(running, now);
        self.ended[running.id.0 as usize - 1] = Some((now, timeout));
    }

    pub(super) fn preempted(&mut self, running: &RunningJob, now: Timestamp, lost_gpu_secs: f64) {
        let team = self.stopped(running, now);
        self.preemptions[team] += 1;
        self.lost_gpu_secs[team] += lost_gpu_secs;
    }

    pub(super) fn fragmented(&mut self, job: JobId) {
        if let Some(seen) = self.fragmented.get_mut(job.0 as usize - 1) {
            self.n_fragmented += usize::from(!std::mem::replace(seen, true));
        }
    }

    /// Whether `job` was counted as blocked by fragmentation.
    pub(super) fn is_fragmented(&self, job: JobId) -> bool {
        self.fragmented.get(job.0 as usize - 1).is_some_and(|seen| *seen)
    }

    pub(super) fn overcommitted(&mut self) {
        self.overcommits += 1;
    }

    /// A plan broke an invariant.
    pub(super) fn broke(&mut self, at: Timestamp, broken: String) {
        self.violations += 1;
        self.first_violation
            .get_or_insert_with(|| format!("at {} ms: {broken}", at.0));
    }

    pub(super) fn cycle(&mut self) {
        self.cycles += 1;
    }

    /// The fewest GPUs a waiting job needs in all (`None`: none waits).
    pub(super) fn smallest_waiting(&self) -> Option<u64> {
        self.waiting_sizes
            .iter()
            .filter_map(|sizes| sizes.keys().next().copied())
            .min()
    }

    /// The most GPUs a waiting job of `team` needs (`None`: none waits).
    pub(super) fn largest_waiting_in(&self, team: &str) -> Option<u64> {
        let sizes = &self.waiting_sizes[*self.team_of.get(team)?];
        sizes.keys().next_back().copied()
    }

    /// The fewest GPUs a waiting job of `team` needs (`None`: none waits).
    pub(super) fn smallest_waiting_in(&self, team: &str) -> Option<u64> {
        let sizes = &self.waiting_sizes[*self.team_of.get(team)?];
        sizes.keys().next().copied()
    }

    /// A cycle left a job waiting: the first one marks how full the
    /// cluster was when it first said no.
    pub(super) fn rejected(&mut self, now: Timestamp) {
        self.first_rejection.get_or_insert((self.busy, now));
    }

    /// After a cycle: whether some waiting job's shape fits the free GPUs
    /// of its pool (it could use them, and yet it waits). `queue`: the
    /// waiting jobs by shape, the same as the view's.
    pub(super) fn snapshot(&mut self, view: &ClusterView, queue: &crate::sched::Queue, policy: &Policy) {
        if view.pending.is_empty() {
            self.startable = false;
            return;
        }
        let pools = self.pools.get_or_insert_with(|| {
            policy
                .pools
                .iter()
                .map(|pool| {
                    let nodes = (0..view.nodes.len())
                        .filter(|i| pool.selects(&view.nodes[*i].labels))
                        .collect();
                    (pool.name.clone(), nodes)
                })
                .collect()
        });
        let free: Vec<u32> = view
            .nodes
            .iter()
            .map(|node| match node.availability {
                Availability::Up => node.gpus.iter().filter(|gpu| !gpu.busy).count() as u32,
                _ => 0,
            })
            .collect();
        if free.iter().all(|n| *n == 0) {
            // Nothing free: nothing fits (the common case in a busy pool).
            self.startable = false;
            return;
        }
        // One job of each shape: it fits where its pool has enough nodes
        // with enough free GPUs of a model it accepts (and its memory and
        // node requirements allow).
        self.startable = queue.firsts().any(|job| {
            let pool = policy.pool(&job.shape.pool).map(|pool| pool.name.as_str());
            pools
                .iter()
                .find(|(name, _)| Some(name.as_str()) == pool)
                .is_some_and(|(_, members)| {
                    let fitting = members
                        .iter()
                        .filter(|i| free[**i] >= job.shape.gpus_per_node)
                        .filter(|i| plain(job) || fits_node(job, &view.nodes[**i]))
                        .count();
                    fitting >= job.shape.nodes as usize
                })
        });
    }

    /// Time passes from `from` to `to` with nothing changing.
    pub(super) fn advance(&mut self, from: Timestamp, to: Timestamp) {
        let dt = (to.0 - from.0) as f64;
        if dt <= 0.0 {
            return;
        }
        self.first.get_or_insert(from);
        self.busy_gpu_ms += self.busy as f64 * dt;
        self.fractions.advance(dt);
        if self.startable {
            self.startable_ms += dt;
            self.startable_busy_gpu_ms += self.busy as f64 * dt;
        }
        for team in 0..self.teams.len() {
            let guarantee = self.guarantees[team];
            let demand = self.running[team] + self.waiting[team];
            let held = self.running[team].min(guarantee);
            self.asked_demand_gpu_ms[team] += demand.min(guarantee) as f64 * dt;
            self.asked_gpu_ms[team] += (held + fitting(&self.waiting_sizes[team], guarantee - held)) as f64 * dt;
            self.received_gpu_ms[team] += held as f64 * dt;
        }
        let arrivals_end = to.0.min(self.last_arrival.0);
        if arrivals_end > from.0 {
            self.busy_gpu_ms_arrivals += self.busy as f64 * (arrivals_end - from.0) as f64;
        }
        self.series.add((from, to), self.busy, self.queued_jobs, &self.running);
    }

    /// Each team's waits and completion times, jobs and jobs never
    /// started (of those still waiting, `never`), and the jobs that ended.
    fn times(&self, never: &HashSet<JobId>) -> Times {
        let secs = |a: Timestamp, b: Timestamp| (b.0 - a.0) as f64 / 1000.0;
        let n_teams = self.teams.len();
        let mut times = Times {
            delays: vec![Vec::new(); n_teams],
            completions: vec![Vec::new(); n_teams],
            jobs: vec![0; n_teams],
            never_started: vec![0; n_teams],
            completed: 0,
            timed_out: 0,
        };
        for (i, submitted) in self.submitted.iter().enumerate() {
            let team = self.job_team[i];
            times.jobs[team] += 1;
            if never.contains(&JobId(i as u64 + 1)) && self.first_start[i].is_none() {
                times.never_started[team] += 1;
            }
            if let Some(started) = self.first_start[i] {
                times.delays[team].push(secs(*submitted, started));
            }
            if let Some((ended, timeout)) = self.ended[i] {
                times.completions[team].push(secs(*submitted, ended));
                if timeout {
                    times.timed_out += 1;
                } else {
                    times.completed += 1;
                }
            }
        }
        times
    }

    /// Each team's figures.
    fn team_outcomes(&self, times: &Times) -> Vec<TeamOutcome> {
        let hours = |gpu_secs: f64| gpu_secs / 3600.0;
        let Times {
            delays,
            completions,
            jobs,
            never_started,
            ..
        } = times;
        (0..self.teams.len())
            .map(|t| {
                let asked = self.asked_gpu_ms[t] / 3_600_000.0;
                let asked_demand = self.asked_demand_gpu_ms[t] / 3_600_000.0;
                let received = self.received_gpu_ms[t] / 3_600_000.0;
                TeamOutcome {
                    team: self.teams[t].clone(),
                    guaranteed_gpus: self.guarantees[t] as u32,
                    jobs: jobs[t],
                    never_started: never_started[t],
                    queue_delay: Dist::of(delays[t].clone()),
                    completion_time: Dist::of(completions[t].clone()),
                    guaranteed_gpu_hours: hours(self.guaranteed_gpu_secs[t]),
                    burst_gpu_hours: hours(self.burst_gpu_secs[t]),
                    lost_gpu_hours: hours(self.lost_gpu_secs[t]),
                    preemptions: self.preemptions[t],
                    asked_guarantee_gpu_hours: asked,
                    received_guarantee_gpu_hours: received,
                    guarantee_met: (asked > 0.0).then(|| (received / asked).min(1.0)),
                    asked_demand_gpu_hours: asked_demand,
                    guarantee_met_by_demand: (asked_demand > 0.0).then(|| received / asked_demand),
                }
            })
            .collect()
    }

    pub(super) fn finish(mut self, end: Timestamp, waiting: impl Iterator<Item = JobId>) -> Outcome {
        let never: HashSet<JobId> = waiting.collect();
        let start = self.first.unwrap_or(end);
        let span_ms = (end.0 - start.0).max(1) as f64;
        let gpus = self.total_gpus.max(1) as f64;
        self.series.as_shares(gpus);
        let times = self.times(&never);
        let teams = self.team_outcomes(&times);
        let guaranteed: f64 = teams.iter().map(|t| t.guaranteed_gpu_hours).sum();
        let burst: f64 = teams.iter().map(|t| t.burst_gpu_hours).sum();
        let Times {
            delays,
            completions,
            never_started,
            completed,
            timed_out,
            ..
        } = times;
        Outcome {
            policy: self.policy_name,
            nodes: self.nodes,
            gpus: self.total_gpus,
            jobs: self.submitted.len(),
            completed,
            timed_out,
            never_started: never_started.iter().sum(),
            span_hours: span_ms / 3_600_000.0,
            allocation: self.busy_gpu_ms / (span_ms * gpus),
            allocation_while_startable: (self.startable_ms > 0.0)
                .then(|| self.startable_busy_gpu_ms / (self.startable_ms * gpus)),
            hours_startable: self.startable_ms / 3_600_000.0,
            queue_delay: Dist::of(delays.concat()),
            completion_time: Dist::of(completions.concat()),
            delivered_gpu_hours: guaranteed + burst,
            guaranteed_gpu_hours: guaranteed,
            burst_gpu_hours: burst,
            preemptions: teams.iter().map(|t| t.preemptions).sum(),
            lost_gpu_hours: teams.iter().map(|t| t.lost_gpu_hours).sum(),
            fragmentation_blocked_jobs: self.n_fragmented,
            cycles: self.cycles,
            overcommits: self.overcommits,
            invariant_violations: self.violations,
            first_violation: self.first_violation,
            held_at_first_rejection: self.first_rejection.map(|(held, _)| held),
            first_rejection_hours: self.first_rejection.map(|(_, at)| hours_between(start, at)),
            peak_held: self.peak.0,
            peak_hours: hours_between(start, self.peak.1),
            arrival_hours: hours_between(start, self.last_arrival),
            allocation_during_arrivals: (self.last_arrival > start)
                .then(|| self.busy_gpu_ms_arrivals / ((self.last_arrival.0 - start.0) as f64 * gpus)),
            never_started_by_shape: Vec::new(),
            teams,
            power: None,
            fractions: self.fractions.outcome(),
            series: self.series,
            attempts: Vec::new(),
            events: Vec::new(),
        }
    }
}

/// Hours from `from` to `to` (0 where `to` is earlier).
fn hours_between(from: Timestamp, to: Timestamp) -> f64 {
    (to.0 - from.0).max(0) as f64 / 3_600_000.0
}

/// What became of each team's jobs, and of all that ended.
struct Times {
    delays: Vec<Vec<f64>>,
    completions: Vec<Vec<f64>>,
    jobs: Vec<usize>,
    never_started: Vec<usize>,
    completed: usize,
    timed_out: usize,
}
