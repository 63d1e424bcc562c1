//! Human tables and the stable JSON schema of `--output json`.
//!
//! JSON job object: id, name, state, user, team, project, workload_type,
//! pool, gpus (per node), gpus_total, nodes, gpu_types, priority,
//! time_limit_secs, command, workdir, submitted_at, started_at, ended_at
//! (RFC 3339 UTC to the millisecond, or null), exit_code (or null), end_reason, reasons (why
//! pending), attempt, placement ([{node, gpus}]), qos, burst (the running
//! attempt may be preempted), n_preemptions, lost_gpu_secs, requeue_cause
//! (preempted, node_lost, gpu_fault, node_fault, requeued; or null), preempted_at
//! and last_checkpoint_at (RFC 3339 or null), estimated_start (the job
//! holding the backfill reservation; else null), redacted (another user's
//! job: command and workdir are empty), image (empty: on the host),
//! mem_bytes, cpus_per_gpu, max_output_bytes, begin, reservation and notify
//! ({to, on}) (or null), reason_codes (one stable
//! snake_case code per reason), node_list, array_job_id and array_task_id
//! (an array's task; else null), array (an array's record: indices,
//! max_parallel, tasks, waiting_indices, waiting, running, ended,
//! not_completed; else null), stdout_path and stderr_path (-o/-e
//! patterns; else null), gpu_use ({samples, mean_utilization_pct,
//! peak_utilization_pct, peak_memory_used_mib, idle}, or null),
//! stragglers ([{node, index, utilization_pct, median_pct, since}]),
//! events ([{at, text}]: stragglers flagged and back in step).
//! JSON node object: name, state, gpus_total, gpus_free (0 unless the node
//! takes work), drained_by and drained_at (an operator's drain; else null),
//! gpu_model, labels,
//! drain_reason, gpus ([{index, model, memory_mib, uuid, job_id}]).

use gpool_proto::convert::state_name;
use gpool_proto::pb;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, UNIX_EPOCH};

#[derive(Serialize)]
pub struct JobJson<'a> {
    id: u64,
    name: &'a str,
    state: &'static str,
    user: &'a str,
    team: &'a str,
    project: &'a str,
    workload_type: &'a str,
    pool: &'a str,
    gpus: u32,
    gpus_total: u64,
    nodes: u32,
    gpu_types: &'a [String],
    priority: i32,
    time_limit_secs: Option<u64>,
    command: &'a [String],
    workdir: &'a str,
    image: &'a str,
    mem_bytes: Option<u64>,
    cpus_per_gpu: Option<u32>,
    max_output_bytes: Option<u64>,
    /// `--begin`: the moment, or seconds after submission.
    begin: Option<String>,
    reservation: Option<&'a str>,
    notify: Option<NotifyJson<'a>>,
    submitted_at: String,
    started_at: Option<String>,
    ended_at: Option<String>,
    exit_code: Option<i32>,
    end_reason: &'a str,
    reasons: &'a [String],
    /// One stable snake_case code per reason.
    reason_codes: &'a [String],
    /// The nodes of its latest attempt, rank 0 first.
    node_list: &'a [String],
    attempt: u32,
    placement: Vec<PlacementJson<'a>>,
    qos: &'a str,
    burst: bool,
    n_preemptions: u32,
    lost_gpu_secs: u64,
    /// Why its latest attempt went back to the queue (null: it never did).
    requeue_cause: Option<&'a str>,
    preempted_at: Option<String>,
    last_checkpoint_at: Option<String>,
    estimated_start: Option<String>,
    /// Another user's job: command, environment and workdir are hidden.
    redacted: bool,
    array_job_id: Option<u64>,
    array_task_id: Option<u32>,
    array: Option<ArrayJson<'a>>,
    stdout_path: Option<&'a str>,
    stderr_path: Option<&'a str>,
    /// Its requirements: null / "any" / empty where it has none.
    min_gpu_memory_mib: Option<u64>,
    nvlink: &'a str,
    constraint: BTreeMap<&'a str, &'a str>,
    nodelist: &'a [String],
    exclude: &'a [String],
    /// From its nodes' samples while it ran, or null before any.
    gpu_use: Option<GpuUseJson>,
    /// GPUs lagging far behind the job's others.
    stragglers: Vec<StragglerJson<'a>>,
    /// Its history besides its state, oldest first.
    events: Vec<EventJson<'a>>,
}

#[derive(Serialize)]
struct EventJson<'a> {
    at: String,
    text: &'a str,
}

#[derive(Serialize)]
struct StragglerJson<'a> {
    node: &'a str,
    index: u32,
    utilization_pct: u32,
    median_pct: u32,
    since: String,
}

#[derive(Serialize)]
struct GpuUseJson {
    samples: u64,
    mean_utilization_pct: f64,
    peak_utilization_pct: u32,
    peak_memory_used_mib: u64,
    /// Mean utilisation under 1% over at least 3 samples.
    idle: bool,
}

#[derive(Serialize)]
struct ArrayJson<'a> {
    /// As submitted: `0-999%50`.
    indices: String,
    max_parallel: Option<u32>,
    tasks: u32,
    /// Tasks not yet jobs of their own (waiting to start).
    waiting_indices: &'a str,
    waiting: u32,
    running: u32,
    ended: u32,
    not_completed: u32,
}

#[derive(Serialize)]
struct PlacementJson<'a> {
    node: &'a str,
    gpus: &'a [u32],
}

static EMPTY_SPEC: std::sync::OnceLock<pb::JobSpec> = std::sync::OnceLock::new();

fn spec(job: &pb::Job) -> &pb::JobSpec {
    job.spec
        .as_ref()
        .unwrap_or_else(|| EMPTY_SPEC.get_or_init(pb::JobSpec::default))
}

/// `--notify` in a job object.
#[derive(Serialize)]
pub struct NotifyJson<'a> {
    to: &'a str,
    on: Vec<&'static str>,
}

fn notify_events(notify: &pb::Notify) -> Vec<&'static str> {
    [
        (notify.on_start, "start"),
        (notify.on_end, "end"),
        (notify.on_fail, "fail"),
    ]
    .into_iter()
    .filter_map(|(on, event)| on.then_some(event))
    .collect()
}

/// When a job with `--begin` may start, as a moment.
fn begin_text(spec: &pb::JobSpec, submitted_at_ms: i64) -> Option<String> {
    match (spec.begin_at_ms, spec.begin_after_secs, spec.begin_now) {
        (0, 0, false) => None,
        (0, secs, _) => Some(rfc3339(
            submitted_at_ms.saturating_add(secs.min(i64::MAX as u64 / 1000) as i64 * 1000),
        )),
        (at, _, _) => Some(rfc3339(at)),
    }
}

pub fn job_json(job: &pb::Job) -> JobJson<'_> {
    let spec = spec(job);
    JobJson {
        id: job.id,
        name: &spec.name,
        state: state_name(job.state()),
        user: &job.user,
        team: &spec.team,
        project: &spec.project,
        workload_type: &spec.workload_type,
        pool: &spec.pool,
        gpus: spec.gpus,
        gpus_total: u64::from(spec.gpus) * u64::from(spec.nodes),
        nodes: spec.nodes,
        gpu_types: &spec.gpu_types,
        priority: spec.priority,
        time_limit_secs: spec.time_limit.map(|d| d.seconds),
        command: &spec.command,
        workdir: &spec.workdir,
        image: &spec.image,
        mem_bytes: (spec.mem_bytes > 0).then_some(spec.mem_bytes),
        cpus_per_gpu: (spec.cpus_per_gpu > 0).then_some(spec.cpus_per_gpu),
        max_output_bytes: (spec.max_output_bytes > 0).then_some(spec.max_output_bytes),
        begin: begin_text(spec, job.submitted_at_ms),
        reservation: (!spec.reservation.is_empty()).then_some(spec.reservation.as_str()),
        notify: spec.notify.as_ref().map(|notify| NotifyJson {
            to: &notify.to,
            on: notify_events(notify),
        }),
        submitted_at: rfc3339_ms(job.submitted_at_ms),
        started_at: job.started_at_ms.map(rfc3339_ms),
        ended_at: job.ended_at_ms.map(rfc3339_ms),
        exit_code: job.exit_code,
        end_reason: &job.end_reason,
        reasons: &job.pending_reasons,
        reason_codes: &job.reason_codes,
        node_list: &job.last_nodes,
        attempt: job.attempt,
        placement: job
            .placement
            .iter()
            .map(|p| PlacementJson {
                node: &p.node,
                gpus: &p.gpu_indices,
            })
            .collect(),
        qos: &spec.qos,
        burst: job.burst,
        n_preemptions: job.n_preemptions,
        lost_gpu_secs: job.lost_gpu_secs,
        requeue_cause: (!job.requeue_cause.is_empty()).then_some(job.requeue_cause.as_str()),
        preempted_at: job.preempted_at_ms.map(rfc3339),
        last_checkpoint_at: job.last_checkpoint_at_ms.map(rfc3339),
        estimated_start: job.estimated_start_ms.map(rfc3339),
        redacted: job.redacted,
        array_job_id: job.array_task_index.map(|_| job.array_job_id),
        array_task_id: job.array_task_index,
        array: job.array.as_ref().map(|info| ArrayJson {
            indices: array_indices(spec),
            max_parallel: spec
                .array
                .as_ref()
                .and_then(|a| (a.max_parallel > 0).then_some(a.max_parallel)),
            tasks: info.tasks,
            waiting_indices: &info.waiting_indices,
            waiting: info.waiting,
            running: info.running,
            ended: info.ended,
            not_completed: info.not_completed,
        }),
        stdout_path: (!spec.stdout_path.is_empty()).then_some(spec.stdout_path.as_str()),
        stderr_path: (!spec.stderr_path.is_empty()).then_some(spec.stderr_path.as_str()),
        min_gpu_memory_mib: (spec.min_gpu_memory_mib != 0).then_some(spec.min_gpu_memory_mib),
        nvlink: if spec.nvlink.is_empty() {
            "any"
        } else {
            spec.nvlink.as_str()
        },
        constraint: spec
            .constraints
            .iter()
            .map(|l| (l.key.as_str(), l.value.as_str()))
            .collect(),
        nodelist: &spec.nodelist,
        exclude: &spec.exclude,
        gpu_use: job.gpu_use.as_ref().map(|used| GpuUseJson {
            samples: used.samples,
            mean_utilization_pct: (used.mean_utilization_pct * 10.0).round() / 10.0,
            peak_utilization_pct: used.peak_utilization_pct,
            peak_memory_used_mib: used.peak_memory_used_mib,
            idle: idle_allocation(used),
        }),
        stragglers: job
            .stragglers
            .iter()
            .map(|straggler| StragglerJson {
                node: &straggler.node,
                index: straggler.index,
                utilization_pct: straggler.utilization_pct,
                median_pct: straggler.median_pct,
                since: rfc3339(straggler.since_ms),
            })
            .collect(),
        events: job
            .events
            .iter()
            .map(|event| EventJson {
                at: rfc3339_ms(event.at_ms),
                text: &event.text,
            })
            .collect(),
    }
}

/// A job that holds GPUs and does not use them (gpool-core's rule).
fn idle_allocation(used: &pb::GpuUse) -> bool {
    gpool_core::model::is_idle_allocation(used.samples, used.mean_utilization_pct)
}

/// An array spec as users write it (`0-999:2%50`), from the wire.
fn array_indices(spec: &pb::JobSpec) -> String {
    gpool_proto::convert::spec_from_wire(pb::JobSpec {
        array: spec.array.clone(),
        ..Default::default()
    })
    .array
    .map(|array| array.to_string())
    .unwrap_or_default()
}

pub fn rfc3339(unix_ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(unix_ms.max(0) as u64);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// RFC 3339 to the millisecond (JSON: accounting needs better than a
/// second).
pub fn rfc3339_ms(unix_ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(unix_ms.max(0) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

pub fn print_json<T: Serialize>(value: &T) {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    // A closed stdout (a pipe into `head`) is not an error worth reporting.
    let _ = serde_json::to_writer(&mut out, value);
    let _ = writeln!(out);
    let _ = out.flush();
}

/// Prints a JSON array one element at a time.
pub struct JsonArrayPrinter {
    out: std::io::BufWriter<std::io::StdoutLock<'static>>,
    n_items: usize,
}

impl JsonArrayPrinter {
    pub fn new() -> JsonArrayPrinter {
        let mut out = std::io::BufWriter::with_capacity(256 * 1024, std::io::stdout().lock());
        let _ = out.write_all(b"[");
        JsonArrayPrinter { out, n_items: 0 }
    }

    pub fn push<T: Serialize>(&mut self, item: &T) {
        if self.n_items > 0 {
            let _ = self.out.write_all(b",");
        }
        // A closed stdout (a pipe into `head`) is not an error worth reporting.
        let _ = serde_json::to_writer(&mut self.out, item);
        self.n_items += 1;
    }

    pub fn finish(mut self) {
        let _ = self.out.write_all(b"]\n");
        let _ = self.out.flush();
    }
}

/// Prints rows as left-aligned columns (comfy-table): on a terminal, long
/// cells wrap to its width; into a pipe, lines stay whole.
pub fn print_table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_header(header.iter().copied());
    if std::io::stdout().is_terminal() {
        table.set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
    }
    for row in rows {
        table.add_row(row);
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for line in table.lines() {
        if writeln!(out, "{}", line.trim_end()).is_err() {
            return;
        }
    }
    let _ = out.flush();
}

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
const SLURM_COLUMN_NAMES: &[(&str, &str)] = &[
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

fn parse_columns(text: &str, tables: &[&[(&'static str, &str)]]) -> Result<Columns, String> {
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
        "gpus" => spec.gpus.to_string(),
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
            pb::JobState::Pending => job.pending_reasons.first().cloned().unwrap_or_default(),
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

fn placement_text(job: &pb::Job) -> String {
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

/// `gpool show`: the job's environment only counted unless `with_env`
/// (an exported shell environment is dozens of lines).
pub fn print_job_details(job: &pb::Job, with_env: bool) {
    let spec = spec(job);
    let or_dash = |text: &str| {
        if text.is_empty() {
            "-".to_string()
        } else {
            text.to_string()
        }
    };
    let mut lines = vec![
        ("id", crate::cmd::display_id(job)),
        ("name", spec.name.clone()),
        ("state", state_name(job.state()).to_string()),
        ("user", job.user.clone()),
        ("team", spec.team.clone()),
        ("project", or_dash(&spec.project)),
        ("workload type", or_dash(&spec.workload_type)),
        ("pool", or_dash(&spec.pool)),
        ("gpus", format!("{} per node x {} node(s)", spec.gpus, spec.nodes)),
        (
            "gpu types",
            if spec.gpu_types.is_empty() {
                "any".into()
            } else {
                spec.gpu_types.join(",")
            },
        ),
        ("priority", spec.priority.to_string()),
        (
            "time limit",
            spec.time_limit.map_or("none".into(), |d| {
                humantime::format_duration(Duration::from_secs(d.seconds)).to_string()
            }),
        ),
        (
            "command",
            if job.redacted {
                "(hidden: another user's job)".to_string()
            } else {
                spec.command.join(" ")
            },
        ),
        ("workdir", or_dash(&spec.workdir)),
        ("submitted", rfc3339(job.submitted_at_ms)),
        ("started", job.started_at_ms.map_or("-".into(), rfc3339)),
        ("ended", job.ended_at_ms.map_or("-".into(), rfc3339)),
        ("attempts", job.attempt.to_string()),
    ];
    if job.array_task_index.is_some() {
        lines.push(("job id", job.id.to_string()));
    }
    let requires = requirement_words(spec);
    if !requires.is_empty() {
        lines.push(("requires", requires.join("; ")));
    }
    if let Some(begin) = begin_text(spec, job.submitted_at_ms) {
        lines.push(("not before", begin));
    }
    if !spec.reservation.is_empty() {
        lines.push(("reservation", spec.reservation.clone()));
    }
    if let Some(notify) = &spec.notify {
        lines.push((
            "notify",
            format!("{} on {}", notify.to, notify_events(notify).join(",")),
        ));
    }
    if let Some(info) = &job.array {
        lines.push((
            "array",
            format!(
                "{}: {} tasks; {} waiting, {} running, {} ended ({} not completed)",
                array_indices(spec),
                info.tasks,
                info.waiting,
                info.running,
                info.ended,
                info.not_completed
            ),
        ));
    }
    for (label, path) in [("stdout", &spec.stdout_path), ("stderr", &spec.stderr_path)] {
        if !path.is_empty() {
            lines.push((label, path.clone()));
        }
    }
    if !job.placement.is_empty() {
        lines.push(("placement", placement_text(job)));
    }
    for event in &job.events {
        lines.push(("event", format!("{} {}", rfc3339(event.at_ms), event.text)));
    }
    for straggler in &job.stragglers {
        lines.push((
            "straggler",
            format!(
                "{} GPU {} at {}% while the job's median is {}%, since {}",
                straggler.node,
                straggler.index,
                straggler.utilization_pct,
                straggler.median_pct,
                rfc3339(straggler.since_ms)
            ),
        ));
    }
    if let Some(used) = &job.gpu_use {
        lines.push((
            "gpu use",
            format!(
                "{:.0}% on average, {}% at peak, {} MiB memory at peak ({} samples){}",
                used.mean_utilization_pct,
                used.peak_utilization_pct,
                used.peak_memory_used_mib,
                used.samples,
                if idle_allocation(used) {
                    "; idle: it holds GPUs it does not use"
                } else {
                    ""
                }
            ),
        ));
    }
    if let Some(code) = job.exit_code {
        lines.push(("exit code", code.to_string()));
    }
    if !job.end_reason.is_empty() {
        lines.push(("end reason", job.end_reason.clone()));
    }
    lines.push(("qos", or_dash(&spec.qos)));
    if job.state() == pb::JobState::Running {
        let class = if job.burst { "burst (preemptible)" } else { "guaranteed" };
        lines.push(("runs as", class.to_string()));
    }
    if let Some(at) = job.preempted_at_ms {
        lines.push(("preempted at", rfc3339(at)));
    }
    if let Some(at) = job.last_checkpoint_at_ms {
        lines.push(("checkpointed", rfc3339(at)));
    }
    if job.n_preemptions > 0 {
        lines.push((
            "preemptions",
            format!("{} ({} GPU-seconds of work lost)", job.n_preemptions, job.lost_gpu_secs),
        ));
    }
    if let Some(priority) = &job.priority {
        lines.push(("sched priority", priority_text(priority)));
    }
    if let Some(at) = job.estimated_start_ms {
        lines.push(("expected start", rfc3339(at)));
    }
    for reason in &job.pending_reasons {
        lines.push(("why pending", reason.clone()));
    }
    for hint in &job.hints {
        lines.push(("to start sooner", hint.clone()));
    }
    if with_env {
        for var in &spec.env {
            lines.push(("env", format!("{}={}", var.name, var.value)));
        }
    } else if !spec.env.is_empty() {
        lines.push((
            "env",
            format!("{} variables (gpool show --env {} lists them)", spec.env.len(), job.id),
        ));
    }
    // The longest key ("to start sooner:") still gets a space after it.
    for (key, value) in lines {
        outln!("{:<17}{value}", format!("{key}:"));
    }
}

/// `1520.3 = qos 1000 + fair share 500 + age 20.3 + size 0 + own 0`.
pub fn priority_text(p: &pb::PriorityFactors) -> String {
    format!(
        "{:.1} = qos {:.1} + fair share {:.1} + age {:.1} + size {:.1} + own {:.0}",
        p.total, p.qos, p.fair_share, p.age, p.size, p.nice
    )
}

pub fn priority_json(p: &pb::PriorityFactors) -> serde_json::Value {
    serde_json::json!({
        "total": p.total, "qos": p.qos, "fair_share": p.fair_share,
        "age": p.age, "size": p.size, "own": p.nice,
    })
}

pub fn node_state(node: &pb::Node) -> &'static str {
    let n_busy = node.gpus.iter().filter(|gpu| gpu.job_id != 0).count();
    match node.state() {
        pb::NodeState::Up if n_busy == 0 => "idle",
        pb::NodeState::Up if n_busy == node.gpus.len() => "allocated",
        pb::NodeState::Up => "mixed",
        pb::NodeState::Draining => "draining",
        pb::NodeState::Drained => "drained",
        pb::NodeState::Down => "down",
        pb::NodeState::Unspecified => "unknown",
    }
}

fn gpu_models(node: &pb::Node) -> String {
    let models: std::collections::BTreeSet<&str> = node.gpus.iter().map(|gpu| gpu.model.as_str()).collect();
    models.into_iter().collect::<Vec<_>>().join(",")
}

pub fn node_json(node: &pb::Node) -> serde_json::Value {
    let labels: BTreeMap<&str, &str> = node.labels.iter().map(|l| (l.key.as_str(), l.value.as_str())).collect();
    let gpus: Vec<serde_json::Value> = node
        .gpus
        .iter()
        .map(|gpu| {
            serde_json::json!({
                "index": gpu.index, "model": gpu.model, "memory_mib": gpu.memory_mib,
                "uuid": gpu.uuid, "job_id": (gpu.job_id != 0).then_some(gpu.job_id),
                "mig_parent": gpu.mig_parent, "numa_node": gpu.numa_node,
                "compute_capability": (!gpu.compute_capability.is_empty()).then_some(&gpu.compute_capability),
                "utilization_pct": gpu.sample.map(|s| s.utilization_pct),
                "memory_used_mib": gpu.sample.map(|s| s.memory_used_mib),
                "temperature_c": gpu.sample.map(|s| s.temperature_c),
                "power_w": gpu.sample.map(|s| s.power_w),
                "out_of_service": gpu.out_of_service.as_ref().map(|out| serde_json::json!({
                    "reason": out.reason, "since": rfc3339(out.since_ms), "by_operator": out.by_operator,
                })),
            })
        })
        .collect();
    serde_json::json!({
        "name": node.name,
        "state": node_state(node),
        "gpus_total": node.gpus.len(),
        "gpus_free": n_free(node),
        "gpus_out_of_service": node.gpus.iter().filter(|gpu| gpu.out_of_service.is_some()).count(),
        "gpu_model": gpu_models(node),
        "pools": node.pools,
        "labels": labels,
        "cpus": (node.cpus > 0).then_some(node.cpus),
        "memory_bytes": (node.memory_bytes > 0).then_some(node.memory_bytes),
        "reservations": node.reservations.iter().map(|r| serde_json::json!({
            "name": r.name, "start": rfc3339(r.start_ms), "end": rfc3339(r.end_ms),
        })).collect::<Vec<_>>(),
        "drain_reason": (!node.drain_reason.is_empty()).then_some(&node.drain_reason),
        "drained_by_health": node.drained_by_health,
        "drained_by": (!node.drained_by.is_empty()).then_some(&node.drained_by),
        "drained_at": (node.drained_at_ms != 0).then(|| rfc3339(node.drained_at_ms)),
        "health_check": node.health_check.as_ref().map(health_check_json),
        "gpus": gpus,
        "links": node.links.iter().map(|l| serde_json::json!({
            "a": l.a, "b": l.b, "link": gpool_proto::convert::link_name(l.link()),
        })).collect::<Vec<_>>(),
    })
}

pub fn print_nodes_table(nodes: &[pb::Node]) {
    let rows = nodes
        .iter()
        .map(|node| {
            let labels: Vec<String> = node.labels.iter().map(|l| format!("{}={}", l.key, l.value)).collect();
            let n_free = n_free(node);
            let n_out = node.gpus.iter().filter(|gpu| gpu.out_of_service.is_some()).count();
            vec![
                node.name.clone(),
                node_state(node).to_string(),
                node.gpus.len().to_string(),
                n_free.to_string(),
                n_out.to_string(),
                gpu_models(node),
                node.pools.join(","),
                labels.join(","),
                node_reasons(node),
            ]
        })
        .collect();
    print_table(
        &[
            "NAME", "STATE", "GPUS", "FREE", "OUT", "MODEL", "POOLS", "LABELS", "REASON",
        ],
        rows,
    );
}

/// A job's requirements on nodes and GPUs, in words (none: empty).
fn requirement_words(spec: &pb::JobSpec) -> Vec<String> {
    let mut words = Vec::new();
    if spec.min_gpu_memory_mib != 0 {
        words.push(format!("GPUs of at least {} MiB", spec.min_gpu_memory_mib));
    }
    if !spec.nvlink.is_empty() && spec.nvlink != "any" {
        words.push(format!("NVLink {}", spec.nvlink));
    }
    if !spec.constraints.is_empty() {
        let pairs: Vec<String> = spec
            .constraints
            .iter()
            .map(|l| format!("{}={}", l.key, l.value))
            .collect();
        words.push(format!("labels {}", pairs.join(",")));
    }
    if !spec.nodelist.is_empty() {
        words.push(format!("only on {}", spec.nodelist.join(",")));
    }
    if !spec.exclude.is_empty() {
        words.push(format!("not on {}", spec.exclude.join(",")));
    }
    words
}

/// Free and in service: a job may be placed on it.
fn is_free(gpu: &pb::Gpu) -> bool {
    gpu.job_id == 0 && gpu.out_of_service.is_none()
}

/// GPUs that could take work now: none on a node that is down, drained
/// or draining.
fn n_free(node: &pb::Node) -> usize {
    if node.state() != pb::NodeState::Up {
        return 0;
    }
    node.gpus.iter().filter(|gpu| is_free(gpu)).count()
}

/// The node's drain reason, then each GPU out of service and why.
fn node_reasons(node: &pb::Node) -> String {
    let mut reasons: Vec<String> = Vec::new();
    if !node.drain_reason.is_empty() {
        if node.drained_by.is_empty() {
            reasons.push(node.drain_reason.clone());
        } else {
            let at = rfc3339(node.drained_at_ms);
            reasons.push(format!("{} (by {}, {at})", node.drain_reason, node.drained_by));
        }
    }
    for gpu in &node.gpus {
        if let Some(out) = &gpu.out_of_service {
            let pinned = if out.by_operator { ", drained" } else { "" };
            reasons.push(format!("GPU {}{pinned}: {}", gpu.index, out.reason));
        }
    }
    for reservation in &node.reservations {
        reasons.push(format!(
            "reserved for {} from {} to {}",
            reservation.name,
            rfc3339(reservation.start_ms),
            rfc3339(reservation.end_ms)
        ));
    }
    reasons.join("; ")
}

/// `gpool health`: GPUs and nodes out of service now, then each node's
/// health log, oldest first.
pub fn print_health(nodes: &[pb::Node]) {
    let mut out_rows = Vec::new();
    for node in nodes {
        if node.drained_by_health {
            out_rows.push(vec![
                node.name.clone(),
                "-".into(),
                "health".into(),
                node.drain_reason.clone(),
            ]);
        }
        for gpu in &node.gpus {
            if let Some(out) = &gpu.out_of_service {
                let by = if out.by_operator { "operator" } else { "health" };
                out_rows.push(vec![
                    node.name.clone(),
                    gpu.index.to_string(),
                    by.into(),
                    format!("{} (since {})", out.reason, rfc3339(out.since_ms)),
                ]);
            }
        }
    }
    if out_rows.is_empty() {
        outln!("every GPU is in service");
    } else {
        outln!("Out of service:");
        print_table(&["NODE", "GPU", "BY", "REASON"], out_rows);
    }
    for node in nodes {
        if let Some(check) = node.health_check.as_ref().filter(|check| !check.passed) {
            outln!(
                "{}: health program failing at {}: {}",
                node.name,
                rfc3339(check.at_ms),
                check.message
            );
        }
    }
    let mut log: Vec<(&pb::HealthEvent, &str)> = nodes
        .iter()
        .flat_map(|node| node.health_log.iter().map(move |event| (event, node.name.as_str())))
        .collect();
    log.sort_by_key(|(event, _)| event.at_ms);
    if !log.is_empty() {
        outln!("History:");
        let rows = log
            .into_iter()
            .map(|(event, node)| {
                vec![
                    rfc3339(event.at_ms),
                    node.to_string(),
                    event.gpu.map_or("-".to_string(), |gpu| gpu.to_string()),
                    event.transition.clone(),
                    event.reason.clone(),
                ]
            })
            .collect();
        print_table(&["TIME", "NODE", "GPU", "EVENT", "REASON"], rows);
    }
}

fn health_check_json(check: &pb::HealthCheck) -> serde_json::Value {
    serde_json::json!({ "passed": check.passed, "message": check.message, "at": rfc3339(check.at_ms) })
}

pub fn health_json(nodes: &[pb::Node]) -> serde_json::Value {
    serde_json::Value::Array(
        nodes
            .iter()
            .map(|node| {
                serde_json::json!({
                    "node": node.name,
                    "drained_by_health": node.drained_by_health,
                    "drain_reason": (!node.drain_reason.is_empty()).then_some(&node.drain_reason),
                    "health_check": node.health_check.as_ref().map(health_check_json),
                    "out_of_service": node.gpus.iter().filter_map(|gpu| gpu.out_of_service.as_ref().map(|out| serde_json::json!({
                        "gpu": gpu.index, "reason": out.reason, "since": rfc3339(out.since_ms), "by_operator": out.by_operator,
                    }))).collect::<Vec<_>>(),
                    "log": node.health_log.iter().map(|event| serde_json::json!({
                        "at": rfc3339(event.at_ms), "gpu": event.gpu, "event": event.transition, "reason": event.reason,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// One pool's line of `gpool nodes --summary`, as sinfo's.
#[derive(Default, Serialize)]
pub struct PoolSummary {
    pub pool: String,
    pub nodes: usize,
    /// Nodes by state (idle, mixed, allocated, draining, drained, down).
    pub node_states: BTreeMap<&'static str, usize>,
    pub gpus_total: usize,
    pub gpus_allocated: usize,
    pub gpus_idle: usize,
    /// Free GPUs out of service, and those of nodes that are down, drained
    /// or draining.
    pub gpus_unavailable: usize,
    /// GPUs by model.
    pub models: BTreeMap<String, usize>,
    /// How many more jobs of 1, 2, 4 and 8 GPUs, and whole-node gangs,
    /// could start now.
    pub startable: gpool_core::fragmentation::Startable,
}

/// Per pool (a node counts in each pool it belongs to): its nodes by state
/// and its GPUs allocated, idle and out of service.
pub fn pool_summaries(nodes: &[pb::Node]) -> Vec<PoolSummary> {
    let mut pools: BTreeMap<String, PoolSummary> = BTreeMap::new();
    for node in nodes {
        let state = node_state(node);
        let available = matches!(state, "idle" | "mixed" | "allocated");
        let n_busy = node.gpus.iter().filter(|gpu| gpu.job_id != 0).count();
        // Free GPUs out of service count as such even on a node in service.
        let n_out = node
            .gpus
            .iter()
            .filter(|gpu| gpu.job_id == 0 && gpu.out_of_service.is_some())
            .count();
        // A node no pool selects is counted under "(none)".
        let none = ["(none)".to_string()];
        let node_pools = if node.pools.is_empty() {
            &none[..]
        } else {
            &node.pools[..]
        };
        for pool in node_pools {
            let summary = pools.entry(pool.clone()).or_insert_with(|| PoolSummary {
                pool: pool.clone(),
                ..PoolSummary::default()
            });
            summary.nodes += 1;
            *summary.node_states.entry(state).or_default() += 1;
            summary.gpus_total += node.gpus.len();
            summary.gpus_allocated += n_busy;
            if available {
                summary.gpus_idle += node.gpus.len() - n_busy - n_out;
                summary.gpus_unavailable += n_out;
                summary
                    .startable
                    .add_node((node.gpus.len() - n_busy - n_out) as u32, node.gpus.len() as u32);
            } else {
                summary.gpus_unavailable += node.gpus.len() - n_busy;
            }
            for gpu in &node.gpus {
                *summary.models.entry(gpu.model.clone()).or_default() += 1;
            }
        }
    }
    pools.into_values().collect()
}

pub fn print_pool_summaries(summaries: &[PoolSummary]) {
    let rows = summaries
        .iter()
        .map(|summary| {
            let states: Vec<String> = summary
                .node_states
                .iter()
                .map(|(state, n)| format!("{n} {state}"))
                .collect();
            let models: Vec<String> = summary.models.iter().map(|(model, n)| format!("{n}x{model}")).collect();
            vec![
                summary.pool.clone(),
                summary.nodes.to_string(),
                states.join(", "),
                format!(
                    "{}/{}/{}/{}",
                    summary.gpus_allocated, summary.gpus_idle, summary.gpus_unavailable, summary.gpus_total
                ),
                summary.startable.summary(),
                models.join(","),
            ]
        })
        .collect();
    print_table(
        &[
            "POOL",
            "NODES",
            "NODE STATES",
            "GPUS(A/I/O/T)",
            "FITS 1/2/4/8 GPUS",
            "MODELS",
        ],
        rows,
    );
}
