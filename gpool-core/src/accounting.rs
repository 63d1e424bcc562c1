//! Accounting: one record per ended attempt, reports of GPU-hours grouped
//! and priced, and what pooling saved against dedicated GPUs per team.
//!
//! gpoold appends an `AttemptRecord` when an attempt ends and reads them
//! back for a window; everything here works on the records alone.

use crate::auth::Caller;
use crate::ids::{Epoch, JobId, Timestamp};
use crate::model::{GpuModel, GpuUse};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One attempt of one job: what it held, for how long, and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub job: JobId,
    /// `123`, or `123_4` for a task of an array.
    pub display_id: String,
    pub attempt: u32,
    pub epoch: Epoch,
    pub user: String,
    pub team: String,
    pub project: String,
    pub workload_type: String,
    pub qos: String,
    pub pool: String,
    /// The GPUs it held, by model.
    pub gpus: BTreeMap<GpuModel, u32>,
    pub nodes: Vec<String>,
    pub started_at: Timestamp,
    pub ended_at: Timestamp,
    /// It ran on its team's burst ledger (beyond the guarantee).
    pub burst: bool,
    /// `completed`, `failed`, `cancelled`, `timeout`, `node_fail`,
    /// `out_of_memory`, `preempted` (requeued after its grace), `requeued`
    /// (its node was lost or drained), or `running` for an attempt a
    /// report counts up to now.
    pub end: String,
    /// Work since its last checkpoint that its end threw away (preemption
    /// or a lost node), GPU-seconds.
    pub lost_gpu_secs: f64,
    /// Its GPUs' samples while it ran.
    pub gpu_use: GpuUse,
    /// A fraction of its one GPU, in thousandths (`share::Share::milli`):
    /// its GPU-seconds count this part of its time. `None`: whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_milli: Option<u32>,
}

impl AttemptRecord {
    /// What each GPU-second of it counts: a fraction's part, else 1.
    pub fn gpu_weight(&self) -> f64 {
        self.share_milli.map_or(1.0, |milli| f64::from(milli) / 1000.0)
    }

    pub fn total_gpus(&self) -> u32 {
        self.gpus.values().sum()
    }

    /// Seconds of it inside `[since, until)`.
    pub fn secs_within(&self, since: Timestamp, until: Timestamp) -> f64 {
        let start = self.started_at.max(since);
        let end = self.ended_at.min(until);
        (end.0 - start.0).max(0) as f64 / 1000.0
    }
}

/// What a report groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dimension {
    Team,
    Project,
    WorkloadType,
    User,
    GpuModel,
    Pool,
    CostCenter,
    Qos,
    Ledger,
    /// `owned`, or the `[[power]]` group (a cloud) its nodes belong to.
    Source,
}

pub const DIMENSIONS: [Dimension; 10] = [
    Dimension::Team,
    Dimension::Project,
    Dimension::WorkloadType,
    Dimension::User,
    Dimension::GpuModel,
    Dimension::Pool,
    Dimension::CostCenter,
    Dimension::Qos,
    Dimension::Ledger,
    Dimension::Source,
];

impl Dimension {
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Team => "team",
            Dimension::Project => "project",
            Dimension::WorkloadType => "workload-type",
            Dimension::User => "user",
            Dimension::GpuModel => "gpu-model",
            Dimension::Pool => "pool",
            Dimension::CostCenter => "cost-center",
            Dimension::Qos => "qos",
            Dimension::Ledger => "ledger",
            Dimension::Source => "source",
        }
    }

    pub fn parse(text: &str) -> Result<Dimension, String> {
        let text = text.trim().to_ascii_lowercase().replace('_', "-");
        DIMENSIONS.into_iter().find(|d| d.name() == text).ok_or_else(|| {
            let names: Vec<&str> = DIMENSIONS.iter().map(|d| d.name()).collect();
            format!("{text:?} is not something to report by ({})", names.join(", "))
        })
    }

    /// A comma-separated list, each once.
    pub fn parse_list(text: &str) -> Result<Vec<Dimension>, String> {
        let mut list = Vec::new();
        for part in text.split(',').filter(|part| !part.trim().is_empty()) {
            let dimension = Dimension::parse(part)?;
            if list.contains(&dimension) {
                return Err(format!("{} is given twice", dimension.name()));
            }
            list.push(dimension);
        }
        Ok(list)
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Prices per GPU-hour by model, and who pays for which team or project.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pricing {
    pub currency: String,
    pub per_gpu_hour: BTreeMap<GpuModel, f64>,
    /// Team name to cost centre.
    pub team_centers: BTreeMap<String, String>,
    /// Project name to cost centre; a project's centre wins over its
    /// team's.
    pub project_centers: BTreeMap<String, String>,
    /// Nodes of `[[power]]` groups: the group, and its price per GPU-hour
    /// (which their GPU-hours cost instead of their model's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_groups: BTreeMap<String, (String, f64)>,
}

/// What a record of no power group's nodes is reported under by `source`.
pub const OWNED: &str = "owned";

/// What a record of no cost centre is reported under.
pub const NO_COST_CENTER: &str = "-";

impl Pricing {
    pub fn cost_center<'a>(&'a self, team: &str, project: &str) -> &'a str {
        self.project_centers
            .get(project)
            .or_else(|| self.team_centers.get(team))
            .map_or(NO_COST_CENTER, String::as_str)
    }

    pub fn price(&self, model: &GpuModel) -> Option<f64> {
        self.per_gpu_hour.get(model).copied()
    }

    /// The power group whose nodes `record` ran on, where it ran on one.
    pub fn group_of(&self, record: &AttemptRecord) -> Option<&(String, f64)> {
        record.nodes.iter().find_map(|node| self.node_groups.get(node))
    }
}

/// Whether `caller` may see `record` in a report: admins all, team leads
/// their teams' and their own, users their own.
pub fn may_see(caller: &Caller, record: &AttemptRecord) -> bool {
    caller.admin || record.user == caller.user || caller.led_teams.contains(&record.team)
}

/// One row of a report: the totals of the records whose values of the
/// report's dimensions are `key`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportRow {
    /// One value for each of the report's dimensions, in their order.
    pub key: Vec<String>,
    pub attempts: u64,
    pub gpu_seconds: f64,
    pub guaranteed_gpu_seconds: f64,
    pub burst_gpu_seconds: f64,
    /// Thrown away by preemption or lost nodes.
    pub lost_gpu_seconds: f64,
    /// Held by attempts whose GPUs sat idle (`model::is_idle_allocation`).
    pub idle_gpu_seconds: f64,
    /// Mean utilisation of the samples taken, percent; `None` without any.
    pub mean_utilization_pct: Option<f64>,
    pub peak_memory_used_mib: u64,
    /// `None` when some of its GPU-hours are on a model without a price.
    pub cost: Option<f64>,
    /// GPU-seconds on models without a price.
    pub unpriced_gpu_seconds: f64,
    #[serde(skip)]
    utilization_sum: f64,
    #[serde(skip)]
    samples: u64,
}

/// A whole report: its rows, ordered by key, and their total.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub since: Timestamp,
    pub until: Timestamp,
    pub by: Vec<Dimension>,
    pub currency: String,
    pub rows: Vec<ReportRow>,
    pub total: ReportRow,
}

/// Accumulates records into a report for `[since, until)`: each record
/// counts only its part inside the window.
pub struct ReportBuilder<'a> {
    since: Timestamp,
    until: Timestamp,
    by: Vec<Dimension>,
    pricing: &'a Pricing,
    rows: BTreeMap<Vec<String>, ReportRow>,
    total: ReportRow,
}

impl<'a> ReportBuilder<'a> {
    pub fn new(since: Timestamp, until: Timestamp, by: &[Dimension], pricing: &'a Pricing) -> ReportBuilder<'a> {
        ReportBuilder {
            since,
            until,
            by: by.to_vec(),
            pricing,
            rows: BTreeMap::new(),
            total: ReportRow {
                cost: Some(0.0),
                ..ReportRow::default()
            },
        }
    }

    pub fn add(&mut self, record: &AttemptRecord) {
        let secs = record.secs_within(self.since, self.until);
        if secs <= 0.0 {
            return;
        }
        let total_gpus = f64::from(record.total_gpus().max(1));
        let whole = record.ended_at.millis_since(record.started_at).max(1) as f64 / 1000.0;
        // The share of the attempt inside the window, for what is not
        // spread over time (lost work, samples).
        let share = (secs / whole).min(1.0);
        let idle = crate::model::is_idle_allocation(
            record.gpu_use.samples,
            record.gpu_use.mean_utilization_pct().unwrap_or(100.0),
        );
        let mut keys_seen = std::collections::BTreeSet::new();
        for (model, &count) in &record.gpus {
            let gpu_seconds = f64::from(count) * secs * record.gpu_weight();
            let fraction = f64::from(count) / total_gpus;
            let key: Vec<String> = self.by.iter().map(|d| self.value(*d, record, model)).collect();
            let mut part = Part {
                gpu_seconds,
                burst: record.burst,
                lost: record.lost_gpu_secs * share * fraction,
                idle,
                utilization_sum: record.gpu_use.utilization_pct_sum as f64 * share * fraction,
                samples: (record.gpu_use.samples as f64 * share * fraction).round() as u64,
                peak_memory: record.gpu_use.memory_used_mib_peak,
                price: match self.pricing.group_of(record) {
                    Some((_, price)) => Some(*price),
                    None => self.pricing.price(model),
                },
                new_attempt: keys_seen.insert(key.clone()),
            };
            let row = self.rows.entry(key.clone()).or_insert_with(|| ReportRow {
                key,
                cost: Some(0.0),
                ..ReportRow::default()
            });
            part.add_to(row);
            part.new_attempt = false;
            part.add_to(&mut self.total);
        }
        // The total counts an attempt once whatever its models.
        self.total.attempts += 1;
    }

    fn value(&self, dimension: Dimension, record: &AttemptRecord, model: &GpuModel) -> String {
        let text = match dimension {
            Dimension::Team => record.team.as_str(),
            Dimension::Project => record.project.as_str(),
            Dimension::WorkloadType => record.workload_type.as_str(),
            Dimension::User => record.user.as_str(),
            Dimension::GpuModel => model.as_str(),
            Dimension::Pool => record.pool.as_str(),
            Dimension::CostCenter => self.pricing.cost_center(&record.team, &record.project),
            Dimension::Qos => record.qos.as_str(),
            Dimension::Ledger => {
                if record.burst {
                    "burst"
                } else {
                    "guaranteed"
                }
            }
            Dimension::Source => self.pricing.group_of(record).map_or(OWNED, |(group, _)| group.as_str()),
        };
        if text.is_empty() {
            "-".to_string()
        } else {
            text.to_string()
        }
    }

    pub fn finish(self) -> Report {
        let finish_row = |mut row: ReportRow| {
            row.mean_utilization_pct = (row.samples > 0).then(|| row.utilization_sum / row.samples as f64);
            row
        };
        Report {
            since: self.since,
            until: self.until,
            by: self.by,
            currency: self.pricing.currency.clone(),
            rows: self.rows.into_values().map(finish_row).collect(),
            total: finish_row(self.total),
        }
    }
}

/// One model's share of one attempt, as it is added to a row.
struct Part {
    gpu_seconds: f64,
    burst: bool,
    lost: f64,
    idle: bool,
    utilization_sum: f64,
    samples: u64,
    peak_memory: u64,
    price: Option<f64>,
    new_attempt: bool,
}

impl Part {
    fn add_to(&self, row: &mut ReportRow) {
        if self.new_attempt {
            row.attempts += 1;
        }
        row.gpu_seconds += self.gpu_seconds;
        if self.burst {
            row.burst_gpu_seconds += self.gpu_seconds;
        } else {
            row.guaranteed_gpu_seconds += self.gpu_seconds;
        }
        row.lost_gpu_seconds += self.lost;
        if self.idle {
            row.idle_gpu_seconds += self.gpu_seconds;
        }
        row.utilization_sum += self.utilization_sum;
        row.samples += self.samples;
        row.peak_memory_used_mib = row.peak_memory_used_mib.max(self.peak_memory);
        match self.price {
            Some(price) => {
                if let Some(cost) = &mut row.cost {
                    *cost += self.gpu_seconds / 3600.0 * price;
                }
            }
            None => {
                row.unpriced_gpu_seconds += self.gpu_seconds;
                row.cost = None;
            }
        }
    }
}

/// The mean number of GPUs the records held in each of `buckets` equal
/// slices of `[since, until)` (a chart of the pool's allocation).
pub fn allocation_series(records: &[AttemptRecord], since: Timestamp, until: Timestamp, buckets: usize) -> Vec<f64> {
    let mut series = vec![0.0; buckets];
    let span = (until.0 - since.0) as f64;
    if buckets == 0 || span <= 0.0 {
        return series;
    }
    let width = span / buckets as f64;
    for record in records {
        let start = (record.started_at.max(since).0 - since.0) as f64;
        let end = (record.ended_at.min(until).0 - since.0) as f64;
        if end <= start {
            continue;
        }
        let gpus = f64::from(record.total_gpus());
        let first = ((start / width) as usize).min(buckets - 1);
        let last = ((end / width).ceil() as usize).clamp(first + 1, buckets);
        for (bucket, value) in series.iter_mut().enumerate().take(last).skip(first) {
            let (lo, hi) = (bucket as f64 * width, (bucket + 1) as f64 * width);
            let overlap = end.min(hi) - start.max(lo);
            if overlap > 0.0 {
                *value += gpus * overlap / width;
            }
        }
    }
    series
}

/// How a savings report sizes each team's dedicated GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SavingsRule {
    /// The team's concurrent use that covers this share of the window
    /// (time-weighted), in percent: 100 is its peak.
    pub percentile: f64,
}

impl Default for SavingsRule {
    fn default() -> SavingsRule {
        SavingsRule { percentile: 100.0 }
    }
}

/// What one team would have needed on GPUs of its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TeamSavings {
    pub team: String,
    /// Dedicated GPUs by model.
    pub gpus: BTreeMap<GpuModel, u32>,
    pub used_gpu_seconds: f64,
    /// Their cost over the window; `None` when a model has no price.
    pub dedicated_cost: Option<f64>,
    /// Used over dedicated GPU-seconds.
    pub dedicated_utilization: f64,
}

/// The pool's GPUs against a dedicated allocation per team, over a window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Savings {
    pub since: Timestamp,
    pub until: Timestamp,
    pub currency: String,
    pub percentile: f64,
    pub teams: Vec<TeamSavings>,
    pub dedicated_gpus: BTreeMap<GpuModel, u32>,
    pub dedicated_cost: Option<f64>,
    pub dedicated_utilization: f64,
    pub pool_gpus: BTreeMap<GpuModel, u32>,
    pub pool_cost: Option<f64>,
    pub pool_utilization: f64,
    pub used_gpu_seconds: f64,
    /// Dedicated GPUs minus the pool's (may be negative).
    pub gpus_saved: i64,
    /// Dedicated cost minus the pool's, where both are priced.
    pub cost_saved: Option<f64>,
}

/// Sizes a dedicated allocation per team and model from the records of
/// `[since, until)` (each team's concurrent use held to `rule`), and sets
/// it against the pool's GPUs (`pool_gpus`, by model) over the same window.
pub fn savings(
    records: &[AttemptRecord],
    since: Timestamp,
    until: Timestamp,
    pool_gpus: &BTreeMap<GpuModel, u32>,
    pricing: &Pricing,
    rule: SavingsRule,
) -> Savings {
    let window_secs = (until.0 - since.0).max(0) as f64 / 1000.0;
    // Each team's and model's changes in concurrent GPUs over time.
    let mut steps: BTreeMap<(&str, &GpuModel), Vec<(i64, i64)>> = BTreeMap::new();
    let mut used: BTreeMap<&str, f64> = BTreeMap::new();
    for record in records {
        let start = record.started_at.max(since).0;
        let end = record.ended_at.min(until).0;
        if end <= start {
            continue;
        }
        for (model, &count) in &record.gpus {
            let changes = steps.entry((record.team.as_str(), model)).or_default();
            changes.push((start, i64::from(count)));
            changes.push((end, -i64::from(count)));
            *used.entry(record.team.as_str()).or_default() +=
                f64::from(count) * record.gpu_weight() * (end - start) as f64 / 1000.0;
        }
    }
    let cost_of = |gpus: &BTreeMap<GpuModel, u32>| -> Option<f64> {
        gpus.iter().try_fold(0.0, |sum, (model, &count)| {
            Some(sum + pricing.price(model)? * f64::from(count) * window_secs / 3600.0)
        })
    };
    let mut teams: BTreeMap<&str, TeamSavings> = BTreeMap::new();
    for ((team, model), mut changes) in steps {
        let need = level_at_percentile(&mut changes, since.0, until.0, rule.percentile);
        let entry = teams.entry(team).or_insert_with(|| TeamSavings {
            team: team.to_string(),
            ..TeamSavings::default()
        });
        if need > 0 {
            entry.gpus.insert(model.clone(), need);
        }
    }
    let utilization = |used: f64, gpus: &BTreeMap<GpuModel, u32>| {
        let capacity = f64::from(gpus.values().sum::<u32>()) * window_secs;
        if capacity > 0.0 {
            used / capacity
        } else {
            0.0
        }
    };
    let mut dedicated_gpus: BTreeMap<GpuModel, u32> = BTreeMap::new();
    for team in teams.values_mut() {
        team.used_gpu_seconds = used.get(team.team.as_str()).copied().unwrap_or(0.0);
        team.dedicated_cost = cost_of(&team.gpus);
        team.dedicated_utilization = utilization(team.used_gpu_seconds, &team.gpus);
        for (model, count) in &team.gpus {
            *dedicated_gpus.entry(model.clone()).or_default() += count;
        }
    }
    let used_gpu_seconds: f64 = used.values().sum();
    let dedicated_cost = cost_of(&dedicated_gpus);
    let pool_cost = cost_of(pool_gpus);
    let total = |gpus: &BTreeMap<GpuModel, u32>| i64::from(gpus.values().sum::<u32>());
    Savings {
        since,
        until,
        currency: pricing.currency.clone(),
        percentile: rule.percentile,
        teams: teams.into_values().collect(),
        dedicated_utilization: utilization(used_gpu_seconds, &dedicated_gpus),
        pool_utilization: utilization(used_gpu_seconds, pool_gpus),
        gpus_saved: total(&dedicated_gpus) - total(pool_gpus),
        cost_saved: dedicated_cost.zip(pool_cost).map(|(dedicated, pool)| dedicated - pool),
        dedicated_gpus,
        dedicated_cost,
        pool_gpus: pool_gpus.clone(),
        pool_cost,
        used_gpu_seconds,
    }
}

/// The smallest level of the step function given by `changes` (time,
/// change) that it stays at or under for `percentile`% of `[since, until)`.
fn level_at_percentile(changes: &mut [(i64, i64)], since: i64, until: i64, percentile: f64) -> u32 {
    changes.sort_unstable();
    let mut time_at: BTreeMap<i64, i64> = BTreeMap::new();
    let (mut level, mut at) = (0i64, since);
    for &(time, change) in changes.iter() {
        if time > at {
            *time_at.entry(level).or_default() += time - at;
            at = time;
        }
        level += change;
    }
    if until > at {
        *time_at.entry(level).or_default() += until - at;
    }
    let window = (until - since).max(1) as f64;
    let wanted = window * percentile.clamp(0.0, 100.0) / 100.0;
    let mut covered = 0.0;
    for (&level, &time) in &time_at {
        covered += time as f64;
        if covered + 1e-9 >= wanted {
            return u32::try_from(level.max(0)).unwrap_or(u32::MAX);
        }
    }
    time_at
        .keys()
        .next_back()
        .map_or(0, |&level| u32::try_from(level.max(0)).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests;
