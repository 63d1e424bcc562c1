//! Traces: the jobs a simulation replays, read from Philly's per-job CSV or
//! gpool's own CSV / JSON Lines format (which `gpool history --export-trace`
//! writes).

use crate::ids::Timestamp;
use crate::model::GpuModel;
use serde::{Deserialize, Serialize};

/// One job of a trace: when it arrived, how long it runs, what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceJob {
    pub submit: Timestamp,
    /// Run time in milliseconds, when it runs undisturbed.
    pub duration_ms: i64,
    pub gpus_per_node: u32,
    pub nodes: u32,
    pub team: String,
    pub project: String,
    pub user: String,
    /// Acceptable models; empty means any.
    pub gpu_types: Vec<GpuModel>,
    pub time_limit_secs: Option<u64>,
    /// It writes a checkpoint this often; a preemption loses the work since.
    pub checkpoint_every_secs: Option<u64>,
    /// Its QoS class (empty: the policy's default).
    pub qos: String,
    /// What it does when preempted; `None`: the trace does not say, and
    /// it does what a process with no handler for its checkpoint signal
    /// does ([`OnSignal::Exit`]).
    pub on_signal: Option<OnSignal>,
    /// CPUs and memory on each node (`cpus_per_gpu` and `mem_per_gpu`
    /// times its GPUs there); `None`: none asked.
    pub host: Option<crate::sched::HostAsk>,
    /// A fraction of one GPU, in thousandths (the `gpu_milli` of Alibaba's
    /// traces), 1 to 999; `None`: whole GPUs.
    pub gpu_milli: Option<u32>,
}

/// What a preempted job does when gpool sends it its checkpoint signal
/// (SIGUSR1 unless it asks for another) to the whole attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnSignal {
    /// It ends at once, as a process that does not handle the signal does
    /// (the default action of SIGUSR1 and SIGTERM): the work since its
    /// last periodic checkpoint is lost, and its GPUs are free at once.
    #[default]
    Exit,
    /// It writes a checkpoint and exits: nothing is lost.
    Checkpoint,
    /// It catches the signal and works on until its grace is over (or it
    /// ends): the work since its last periodic checkpoint is lost then.
    WorkOn,
}

impl OnSignal {
    pub const WORDS: &'static str = "exit, checkpoint or work_on";

    pub fn parse(text: &str) -> Option<OnSignal> {
        match text.trim() {
            "exit" => Some(OnSignal::Exit),
            "checkpoint" => Some(OnSignal::Checkpoint),
            "work_on" | "work-on" => Some(OnSignal::WorkOn),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OnSignal::Exit => "exit",
            OnSignal::Checkpoint => "checkpoint",
            OnSignal::WorkOn => "work_on",
        }
    }
}

impl TraceJob {
    pub fn total_gpus(&self) -> u64 {
        u64::from(self.gpus_per_node) * u64::from(self.nodes)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `timestamp,duration,num_gpus,gpu_time,cluster`; the virtual cluster
    /// is the team.
    Philly,
    /// gpool's CSV (a header line naming the columns of `GpoolRow`).
    GpoolCsv,
    /// gpool's JSON Lines: one `GpoolRow` object per line.
    GpoolJsonl,
}

impl Format {
    /// `philly` or `gpool` (CSV, or JSON Lines when `file` ends in `.jsonl`).
    pub fn parse(name: &str, file: &str) -> Result<Format, String> {
        match name {
            "philly" => Ok(Format::Philly),
            "gpool" if file.ends_with(".jsonl") => Ok(Format::GpoolJsonl),
            "gpool" => Ok(Format::GpoolCsv),
            other => Err(format!("--format: {other:?} is not philly or gpool")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct TraceError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

/// One row of gpool's trace format. Times are RFC 3339 (or seconds since
/// the epoch); durations are seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpoolRow {
    pub submit: String,
    pub duration: f64,
    #[serde(default = "one")]
    pub gpus_per_node: u32,
    #[serde(default = "one")]
    pub nodes: u32,
    pub team: String,
    #[serde(default)]
    pub project: String,
    #[serde(default)]
    pub user: String,
    /// Models separated by `|`; empty means any.
    #[serde(default)]
    pub gpu_types: String,
    #[serde(default, deserialize_with = "empty_is_none")]
    pub time_limit: Option<u64>,
    #[serde(default, deserialize_with = "empty_is_none")]
    pub checkpoint_every: Option<u64>,
    /// Its QoS class; empty: the policy's default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub qos: String,
    /// What it does when preempted: `exit`, `checkpoint` or `work_on`;
    /// empty: the trace does not say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub on_signal: String,
    /// The older spelling of `on_signal = checkpoint` (true/false, 1/0).
    #[serde(default, skip_serializing_if = "is_false", deserialize_with = "flag")]
    pub checkpoint_on_signal: bool,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "empty_is_none")]
    pub cpus_per_gpu: Option<u64>,
    /// Bytes.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "empty_is_none")]
    pub mem_per_gpu: Option<u64>,
    /// A fraction of one GPU in thousandths (1 to 999; 1000 or empty: whole
    /// GPUs), as Alibaba's GPU traces give it.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "empty_is_none")]
    pub gpu_milli: Option<u64>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn flag<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Field {
        Bool(bool),
        Number(u64),
        Text(String),
    }
    match Option::<Field>::deserialize(deserializer)? {
        None => Ok(false),
        Some(Field::Bool(value)) => Ok(value),
        Some(Field::Number(n)) if n <= 1 => Ok(n == 1),
        Some(Field::Text(text)) => match text.trim() {
            "" | "0" | "false" => Ok(false),
            "1" | "true" => Ok(true),
            other => Err(serde::de::Error::custom(format!("{other:?} is not true or false"))),
        },
        Some(Field::Number(n)) => Err(serde::de::Error::custom(format!("{n} is not true or false"))),
    }
}

fn one() -> u32 {
    1
}

fn empty_is_none<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Field {
        Number(u64),
        Text(String),
    }
    match Option::<Field>::deserialize(deserializer)? {
        None => Ok(None),
        Some(Field::Number(n)) => Ok(Some(n)),
        Some(Field::Text(text)) if text.trim().is_empty() => Ok(None),
        Some(Field::Text(text)) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{text:?} is not a whole number of seconds"))),
    }
}

impl GpoolRow {
    pub fn from_job(job: &TraceJob) -> GpoolRow {
        GpoolRow {
            submit: jiff::Timestamp::from_millisecond(job.submit.0)
                .map_or_else(|_| (job.submit.0 / 1000).to_string(), |at| at.to_string()),
            duration: job.duration_ms as f64 / 1000.0,
            gpus_per_node: job.gpus_per_node,
            nodes: job.nodes,
            team: job.team.clone(),
            project: job.project.clone(),
            user: job.user.clone(),
            gpu_types: job.gpu_types.iter().map(GpuModel::as_str).collect::<Vec<_>>().join("|"),
            time_limit: job.time_limit_secs,
            checkpoint_every: job.checkpoint_every_secs,
            qos: job.qos.clone(),
            on_signal: job.on_signal.map_or_else(String::new, |on| on.as_str().to_string()),
            checkpoint_on_signal: false,
            cpus_per_gpu: job.host.map(|ask| ask.cpus / u64::from(job.gpus_per_node)),
            mem_per_gpu: job.host.map(|ask| ask.memory_bytes / u64::from(job.gpus_per_node)),
            gpu_milli: job.gpu_milli.map(u64::from),
        }
    }

    fn into_job(self) -> Result<TraceJob, String> {
        let submit = parse_time(&self.submit).ok_or_else(|| {
            format!(
                "submit: {:?} is not an RFC 3339 time (2017-10-09T07:01:55Z) or seconds since 1970",
                self.submit
            )
        })?;
        let duration_ms =
            duration_ms(self.duration).ok_or_else(|| format!("duration: {} is not seconds ≥ 0", self.duration))?;
        if self.gpus_per_node == 0 || self.nodes == 0 {
            return Err(format!(
                "gpus_per_node and nodes must be at least 1 (got {} and {})",
                self.gpus_per_node, self.nodes
            ));
        }
        if self.team.trim().is_empty() {
            return Err("team: empty".into());
        }
        let on_signal = match (self.on_signal.trim(), self.checkpoint_on_signal) {
            ("", false) => None,
            ("", true) => Some(OnSignal::Checkpoint),
            (text, checkpoint) => match OnSignal::parse(text) {
                Some(on) if !checkpoint || on == OnSignal::Checkpoint => Some(on),
                Some(on) => {
                    return Err(format!(
                        "on_signal: {:?} contradicts checkpoint_on_signal = true",
                        on.as_str()
                    ))
                }
                None => return Err(format!("on_signal: {text:?} is not {}", OnSignal::WORDS)),
            },
        };
        if self.checkpoint_every == Some(0) {
            return Err("checkpoint_every: 0 is not a period (leave it empty for none)".into());
        }
        let gpu_milli = match self.gpu_milli {
            None | Some(1000) => None,
            Some(milli @ 1..=999) if self.gpus_per_node == 1 && self.nodes == 1 => Some(milli as u32),
            Some(milli @ 1..=999) => {
                return Err(format!(
                    "gpu_milli: {milli} is a fraction of one GPU, but the job asks for {} GPUs on {} nodes",
                    self.gpus_per_node, self.nodes
                ))
            }
            Some(other) => return Err(format!("gpu_milli: {other} is not 1 to 1000")),
        };
        Ok(TraceJob {
            submit,
            duration_ms,
            gpus_per_node: self.gpus_per_node,
            nodes: self.nodes,
            project: if self.project.is_empty() {
                self.team.clone()
            } else {
                self.project
            },
            user: if self.user.is_empty() {
                self.team.clone()
            } else {
                self.user
            },
            team: self.team,
            gpu_types: self
                .gpu_types
                .split('|')
                .map(str::trim)
                .filter(|model| !model.is_empty())
                .map(GpuModel::new)
                .collect(),
            time_limit_secs: self.time_limit,
            checkpoint_every_secs: self.checkpoint_every,
            qos: self.qos.trim().to_string(),
            on_signal,
            host: (self.cpus_per_gpu.is_some() || self.mem_per_gpu.is_some()).then(|| crate::sched::HostAsk {
                cpus: self.cpus_per_gpu.unwrap_or(0) * u64::from(self.gpus_per_node),
                memory_bytes: self.mem_per_gpu.unwrap_or(0) * u64::from(self.gpus_per_node),
            }),
            gpu_milli,
        })
    }
}

fn parse_time(text: &str) -> Option<Timestamp> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Timestamp((secs * 1000.0).round() as i64));
    }
    if let Ok(at) = text.parse::<jiff::Timestamp>() {
        return Some(Timestamp(at.as_millisecond()));
    }
    // A civil time with no zone (as Philly's): UTC.
    let civil: jiff::civil::DateTime = text.parse().ok()?;
    let zoned = civil.to_zoned(jiff::tz::TimeZone::UTC).ok()?;
    Some(Timestamp(zoned.timestamp().as_millisecond()))
}

fn duration_ms(secs: f64) -> Option<i64> {
    (0.0..1e12).contains(&secs).then(|| (secs * 1000.0).round() as i64)
}

/// Reads a trace. `file` names it in errors; `gpus_per_node` is the
/// cluster's largest node, which splits Philly jobs larger than a node into
/// gangs (the largest divisor of the job's GPUs that fits one node, on as
/// many nodes as it takes). Jobs come back sorted by submit time (then by
/// their order in the file).
pub fn parse(format: Format, file: &str, text: &str, gpus_per_node: u32) -> Result<Vec<TraceJob>, TraceError> {
    let error = |line: usize, message: String| TraceError {
        file: file.to_string(),
        line,
        message,
    };
    let mut jobs = match format {
        Format::Philly => parse_philly(text, gpus_per_node.max(1)).map_err(|(line, message)| error(line, message))?,
        Format::GpoolCsv => {
            let mut reader = csv::ReaderBuilder::new()
                .trim(csv::Trim::All)
                .from_reader(text.as_bytes());
            let mut jobs = Vec::new();
            for (i, row) in reader.deserialize::<GpoolRow>().enumerate() {
                let line = i + 2;
                let row = row.map_err(|err| error(line, csv_message(&err)))?;
                jobs.push(row.into_job().map_err(|message| error(line, message))?);
            }
            jobs
        }
        Format::GpoolJsonl => {
            let mut jobs = Vec::new();
            for (i, line_text) in text.lines().enumerate() {
                if line_text.trim().is_empty() {
                    continue;
                }
                let row: GpoolRow = serde_json::from_str(line_text).map_err(|err| error(i + 1, err.to_string()))?;
                jobs.push(row.into_job().map_err(|message| error(i + 1, message))?);
            }
            jobs
        }
    };
    if jobs.is_empty() {
        return Err(error(1, "no jobs in the trace".into()));
    }
    jobs.sort_by_key(|job| job.submit);
    Ok(jobs)
}

fn csv_message(err: &csv::Error) -> String {
    match err.kind() {
        csv::ErrorKind::Deserialize { err, .. } => match err.field() {
            Some(field) => format!("column {}: {}", field + 1, err.kind()),
            None => err.kind().to_string(),
        },
        _ => err.to_string(),
    }
}

fn parse_philly(text: &str, node_gpus: u32) -> Result<Vec<TraceJob>, (usize, String)> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = reader.headers().map_err(|err| (1, err.to_string()))?.clone();
    let column = |name: &str| {
        headers.iter().position(|h| h == name).ok_or_else(|| {
            (
                1,
                format!("no {name:?} column (a Philly trace has timestamp,duration,num_gpus,cluster)"),
            )
        })
    };
    let (at, duration, gpus, cluster) = (
        column("timestamp")?,
        column("duration")?,
        column("num_gpus")?,
        column("cluster")?,
    );
    let mut jobs = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let line = i + 2;
        let record = record.map_err(|err| (line, err.to_string()))?;
        let field = |index: usize| record.get(index).unwrap_or("");
        let submit = parse_time(field(at))
            .ok_or_else(|| (line, format!("timestamp: {:?} is not YYYY-MM-DD HH:MM:SS", field(at))))?;
        let duration_ms = field(duration)
            .parse::<f64>()
            .ok()
            .and_then(duration_ms)
            .ok_or_else(|| (line, format!("duration: {:?} is not seconds ≥ 0", field(duration))))?;
        let n: u32 = field(gpus)
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| (line, format!("num_gpus: {:?} is not a whole number ≥ 1", field(gpus))))?;
        let team = field(cluster).to_string();
        if team.is_empty() {
            return Err((line, "cluster: empty".into()));
        }
        let (gpus_per_node, nodes) = gang_shape(n, node_gpus);
        jobs.push(TraceJob {
            submit,
            duration_ms,
            gpus_per_node,
            nodes,
            project: team.clone(),
            user: team.clone(),
            team,
            gpu_types: Vec::new(),
            time_limit_secs: None,
            checkpoint_every_secs: None,
            qos: String::new(),
            on_signal: None,
            host: None,
            gpu_milli: None,
        });
    }
    Ok(jobs)
}

/// `gpus` GPUs as `(per node, nodes)` on nodes of `node_gpus`: one node when
/// it fits, else the largest divisor of `gpus` that fits a node.
pub fn gang_shape(gpus: u32, node_gpus: u32) -> (u32, u32) {
    if gpus <= node_gpus {
        return (gpus, 1);
    }
    let per_node = (1..=node_gpus).rev().find(|d| gpus.is_multiple_of(*d)).unwrap_or(1);
    (per_node, gpus / per_node)
}

/// Writes jobs in gpool's CSV format.
pub fn to_csv(jobs: &[TraceJob]) -> String {
    let mut writer = csv::Writer::from_writer(Vec::new());
    for job in jobs {
        // Writing to a Vec cannot fail.
        let _ = writer.serialize(GpoolRow::from_job(job));
    }
    String::from_utf8(writer.into_inner().unwrap_or_default()).unwrap_or_default()
}
