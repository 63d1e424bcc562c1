//! The jobs table of `gpool jobs` and `gpool history`: its columns (with
//! Slurm's names for them), each cell, and the table.

use super::*;

/// The columns `gpool jobs --format` takes, with their headers.
pub const JOB_COLUMNS: &[(&str, &str)] = &[
    ("id", "ID"),
    ("name", "NAME"),
    ("user", "USER"),
    ("team", "TEAM"),
    ("project", "PROJECT"),
    ("state", "STATE"),
    ("gpus", "GPUS"),
    ("nodes", "NODES"),
    ("submitted", "SUBMITTED"),
    ("start", "START"),
    ("elapsed", "ELAPSED"),
    ("limit", "LIMIT"),
    ("priority", "PRIORITY"),
    ("position", "POS"),
    ("qos", "QOS"),
    ("pool", "POOL"),
    ("exit", "EXIT"),
    ("reason", "REASON/NODES"),
];

/// The table's columns unless --format names others.
pub const DEFAULT_JOB_COLUMNS: &str = "id,name,user,team,state,gpus,nodes,submitted,elapsed,limit,reason";

/// Columns of the jobs table, in order.
#[derive(Debug, Clone)]
pub struct Columns(pub Vec<&'static str>);

/// The columns `gpool history --format` takes besides the jobs table's,
/// with their headers: what sacct users reach for.
pub const HISTORY_COLUMNS: &[(&str, &str)] = &[
    ("gpu_hours", "GPU-HOURS"),
    ("ended", "ENDED"),
    ("node_list", "NODELIST"),
    ("max_gpu_mem", "MAXGPUMEM"),
    ("gpu_util", "GPU-UTIL"),
];

/// `gpool history`'s columns unless --format names others.
pub const DEFAULT_HISTORY_COLUMNS: &str = "id,name,user,team,state,exit,gpu_hours,ended,node_list";

/// Slurm's names for columns (sacct/squeue --format), lower-cased.
pub(super) const SLURM_COLUMN_NAMES: &[(&str, &str)] = &[
    ("jobid", "id"),
    ("jobname", "name"),
    ("account", "team"),
    ("partition", "pool"),
    ("exitcode", "exit"),
    ("nodelist", "node_list"),
    ("timelimit", "limit"),
    ("submit", "submitted"),
    ("end", "ended"),
];

/// Parses `id,name,state`: known column names, at least one.
pub fn parse_job_columns(text: &str) -> Result<Columns, String> {
    parse_columns(text, &[JOB_COLUMNS])
}

/// As `parse_job_columns`, with the history's own columns too.
pub fn parse_history_columns(text: &str) -> Result<Columns, String> {
    parse_columns(text, &[JOB_COLUMNS, HISTORY_COLUMNS])
}

pub(super) fn parse_columns(text: &str, tables: &[&[(&'static str, &str)]]) -> Result<Columns, String> {
    let known = || tables.iter().flat_map(|table| table.iter().map(|(column, _)| *column));
    text.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| {
            let lower = name.to_ascii_lowercase();
            let name_meant = SLURM_COLUMN_NAMES
                .iter()
                .find(|(slurm, _)| *slurm == lower)
                .map_or(lower.as_str(), |(_, ours)| *ours);
            known().find(|column| *column == name_meant).ok_or_else(|| {
                let names: Vec<&str> = known().collect();
                format!("{name:?} is not a column ({})", names.join(", "))
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|columns| {
            if columns.is_empty() {
                Err("no column named".to_string())
            } else {
                Ok(Columns(columns))
            }
        })
}

/// One job's cell in `column`, as of `now_ms`.
pub fn job_cell(job: &pb::Job, column: &str, now_ms: i64) -> String {
    let spec = spec(job);
    let duration = |secs: i64| gpool_core::spec::format_duration(secs.max(0) as u64);
    match column {
        "id" => crate::cmd::display_id(job),
        "name" => spec.name.clone(),
        "user" => job.user.clone(),
        "team" => spec.team.clone(),
        "project" => spec.project.clone(),
        "state" => state_name(job.state()).to_string(),
        // An exclusive job's GPUs are its nodes' (all of each), once placed.
        "gpus" => match job.placement.iter().map(|p| p.gpu_indices.len()).max() {
            Some(held) if spec.exclusive => held.to_string(),
            _ => spec.gpus.to_string(),
        },
        "nodes" => spec.nodes.to_string(),
        "submitted" => rfc3339(job.submitted_at_ms),
        "start" => match (job.started_at_ms, job.estimated_start_ms) {
            (Some(at), _) => rfc3339(at),
            (None, Some(at)) => format!("~{}", rfc3339(at)),
            (None, None) => "-".into(),
        },
        "elapsed" => match job.started_at_ms {
            Some(start) => duration((job.ended_at_ms.unwrap_or(now_ms) - start) / 1000),
            None => "-".into(),
        },
        "limit" => spec
            .time_limit
            .map_or("-".into(), |limit| duration(limit.seconds as i64)),
        "priority" => job
            .priority
            .as_ref()
            .map_or(spec.priority.to_string(), |p| format!("{:.0}", p.total)),
        "position" => job.queue_position.map_or("-".into(), |position| position.to_string()),
        "qos" => spec.qos.clone(),
        "pool" => spec.pool.clone(),
        "exit" => job.exit_code.map_or("-".into(), |code| code.to_string()),
        "gpu_hours" => format!("{:.2}", gpu_hours(job)),
        "ended" => job.ended_at_ms.map_or("-".into(), rfc3339),
        "node_list" => match job.last_nodes.is_empty() {
            true => "-".into(),
            false => job.last_nodes.join(","),
        },
        "max_gpu_mem" => job
            .gpu_use
            .as_ref()
            .filter(|used| used.samples > 0)
            .map_or("-".into(), |used| format!("{}M", used.peak_memory_used_mib)),
        "gpu_util" => job
            .gpu_use
            .as_ref()
            .filter(|used| used.samples > 0)
            .map_or("-".into(), |used| format!("{:.0}%", used.mean_utilization_pct)),
        "reason" => match job.state() {
            pb::JobState::Pending => job
                .reasons
                .first()
                .map(|reason| reason.words.clone())
                .unwrap_or_default(),
            pb::JobState::Running => placement_text(job),
            _ => job.end_reason.clone(),
        },
        _ => String::new(),
    }
}

/// The GPU-hours of a job's last attempt (history's GPU-HOURS, its JSON's
/// `gpu_hours`); an array's record used none itself (its tasks are listed).
pub fn gpu_hours(job: &pb::Job) -> f64 {
    let spec = spec(job);
    let gpus = if job.array.is_some() {
        0
    } else {
        u64::from(spec.gpus) * u64::from(spec.nodes.max(1))
    };
    let secs = match (job.started_at_ms, job.ended_at_ms) {
        (Some(start), Some(end)) => (end - start).max(0) as f64 / 1000.0,
        _ => 0.0,
    };
    gpus as f64 * secs / 3600.0
}

pub fn print_jobs_table(jobs: &[pb::Job], columns: &[&str]) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64);
    let header: Vec<&str> = columns
        .iter()
        .map(|column| {
            JOB_COLUMNS
                .iter()
                .chain(HISTORY_COLUMNS)
                .find(|(name, _)| name == column)
                .map_or(*column, |(_, header)| *header)
        })
        .collect();
    let rows = jobs
        .iter()
        .map(|job| columns.iter().map(|column| job_cell(job, column, now_ms)).collect())
        .collect();
    print_table(&header, rows);
}

pub(super) fn placement_text(job: &pb::Job) -> String {
    let parts: Vec<String> = job
        .placement
        .iter()
        .map(|p| {
            let gpus: Vec<String> = p.gpu_indices.iter().map(u32::to_string).collect();
            format!("{}[{}]", p.node, gpus.join(","))
        })
        .collect();
    parts.join(" ")
}
