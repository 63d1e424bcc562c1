//! Jobs as tables, details and JSON: `gpool jobs`, `show`, `history`.

use super::*;

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
    exclusive: bool,
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
    /// Each reason as data: `{code, reason, hint, ...facts}`.
    reason_details: Vec<super::reasons::ReasonJson<'a>>,
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
    /// A fraction of one GPU (`memory_mib` or `fraction`, `compute_pct`);
    /// null: whole GPUs.
    gpu_share: Option<serde_json::Value>,
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
    /// Of its events, the warnings (a node that did not enforce the
    /// limits it asked for), without their `warning: `.
    warnings: Vec<&'a str>,
}

#[derive(Serialize)]
pub(super) struct EventJson<'a> {
    at: String,
    text: &'a str,
}

#[derive(Serialize)]
pub(super) struct StragglerJson<'a> {
    node: &'a str,
    index: u32,
    utilization_pct: u32,
    median_pct: u32,
    since: String,
}

#[derive(Serialize)]
pub(super) struct GpuUseJson {
    samples: u64,
    mean_utilization_pct: f64,
    peak_utilization_pct: u32,
    peak_memory_used_mib: u64,
    /// Mean utilisation under 1% over at least 3 samples.
    idle: bool,
}

#[derive(Serialize)]
pub(super) struct ArrayJson<'a> {
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
pub(super) struct PlacementJson<'a> {
    node: &'a str,
    gpus: &'a [u32],
}

static EMPTY_SPEC: std::sync::OnceLock<pb::JobSpec> = std::sync::OnceLock::new();

pub(super) fn spec(job: &pb::Job) -> &pb::JobSpec {
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

pub(super) fn notify_events(notify: &pb::Notify) -> Vec<&'static str> {
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
pub(super) fn begin_text(spec: &pb::JobSpec, submitted_at_ms: i64) -> Option<String> {
    match (spec.begin_at_ms, spec.begin_after_secs, spec.begin_now) {
        (0, 0, false) => None,
        (0, secs, _) => Some(rfc3339(
            submitted_at_ms.saturating_add(secs.min(i64::MAX as u64 / 1000) as i64 * 1000),
        )),
        (at, _, _) => Some(rfc3339(at)),
    }
}

/// A job as `--output json` prints it.
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
        exclusive: spec.exclusive,
        max_output_bytes: (spec.max_output_bytes > 0).then_some(spec.max_output_bytes),
        begin: begin_text(spec, job.submitted_at_ms),
        reservation: (!spec.reservation.is_empty()).then_some(spec.reservation.as_str()),
        notify: spec.notify.as_ref().map(notify_json),
        submitted_at: rfc3339_ms(job.submitted_at_ms),
        started_at: job.started_at_ms.map(rfc3339_ms),
        ended_at: job.ended_at_ms.map(rfc3339_ms),
        exit_code: job.exit_code,
        end_reason: &job.end_reason,
        reasons: &job.pending_reasons,
        reason_codes: &job.reason_codes,
        reason_details: job.reasons.iter().map(super::reasons::reason_view).collect(),
        node_list: &job.last_nodes,
        attempt: job.attempt,
        placement: placement_json(job),
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
        array: job.array.as_ref().map(|info| array_json(info, spec)),
        stdout_path: (!spec.stdout_path.is_empty()).then_some(spec.stdout_path.as_str()),
        stderr_path: (!spec.stderr_path.is_empty()).then_some(spec.stderr_path.as_str()),
        gpu_share: (spec.gpu_mem_mib != 0 || spec.gpu_fraction_milli != 0).then(|| {
            serde_json::json!({
                "memory_mib": (spec.gpu_mem_mib != 0).then_some(spec.gpu_mem_mib),
                "fraction": (spec.gpu_fraction_milli != 0).then(|| f64::from(spec.gpu_fraction_milli) / 1000.0),
                "compute_pct": (spec.gpu_compute_pct != 0).then_some(spec.gpu_compute_pct),
            })
        }),
        min_gpu_memory_mib: (spec.min_gpu_memory_mib != 0).then_some(spec.min_gpu_memory_mib),
        nvlink: nvlink_json(spec),
        constraint: constraint_json(spec),
        nodelist: &spec.nodelist,
        exclude: &spec.exclude,
        gpu_use: job.gpu_use.as_ref().map(gpu_use_json),
        stragglers: stragglers_json(job),
        events: events_json(job),
        warnings: job
            .events
            .iter()
            .filter_map(|e| e.text.strip_prefix("warning: "))
            .collect(),
    }
}

/// `notify`: whom `--notify` mails, and on which events.
fn notify_json(notify: &pb::Notify) -> NotifyJson<'_> {
    NotifyJson {
        to: &notify.to,
        on: notify_events(notify),
    }
}

/// `placement`: each node of the job and its GPUs there.
fn placement_json(job: &pb::Job) -> Vec<PlacementJson<'_>> {
    job.placement
        .iter()
        .map(|p| PlacementJson {
            node: &p.node,
            gpus: &p.gpu_indices,
        })
        .collect()
}

/// `array`: an array's record, its indices and how its tasks stand.
fn array_json<'a>(info: &'a pb::ArrayInfo, spec: &pb::JobSpec) -> ArrayJson<'a> {
    ArrayJson {
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
    }
}

/// `nvlink`: what the job asks of NVLink, `any` where it asks nothing.
fn nvlink_json(spec: &pb::JobSpec) -> &str {
    if spec.nvlink.is_empty() {
        "any"
    } else {
        spec.nvlink.as_str()
    }
}

/// `constraint`: the node labels the job asks for, by key.
fn constraint_json(spec: &pb::JobSpec) -> BTreeMap<&str, &str> {
    spec.constraints
        .iter()
        .map(|l| (l.key.as_str(), l.value.as_str()))
        .collect()
}

/// `gpu_use`: the job's GPU use from its nodes' samples.
fn gpu_use_json(used: &pb::GpuUse) -> GpuUseJson {
    GpuUseJson {
        samples: used.samples,
        mean_utilization_pct: (used.mean_utilization_pct * 10.0).round() / 10.0,
        peak_utilization_pct: used.peak_utilization_pct,
        peak_memory_used_mib: used.peak_memory_used_mib,
        idle: idle_allocation(used),
    }
}

/// `stragglers`: the GPUs lagging far behind the job's others.
fn stragglers_json(job: &pb::Job) -> Vec<StragglerJson<'_>> {
    job.stragglers
        .iter()
        .map(|straggler| StragglerJson {
            node: &straggler.node,
            index: straggler.index,
            utilization_pct: straggler.utilization_pct,
            median_pct: straggler.median_pct,
            since: rfc3339(straggler.since_ms),
        })
        .collect()
}

/// `events`: the job's history besides its state, oldest first.
fn events_json(job: &pb::Job) -> Vec<EventJson<'_>> {
    job.events
        .iter()
        .map(|event| EventJson {
            at: rfc3339_ms(event.at_ms),
            text: &event.text,
        })
        .collect()
}

/// A job that holds GPUs and does not use them (gpool-core's rule).
pub(super) fn idle_allocation(used: &pb::GpuUse) -> bool {
    gpool_core::model::is_idle_allocation(used.samples, used.mean_utilization_pct)
}

/// An array spec as users write it (`0-999:2%50`), from the wire.
pub(super) fn array_indices(spec: &pb::JobSpec) -> String {
    gpool_proto::convert::spec_from_wire(pb::JobSpec {
        array: spec.array.clone(),
        ..Default::default()
    })
    .array
    .map(|array| array.to_string())
    .unwrap_or_default()
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

/// A job's requirements on nodes and GPUs, in words (none: empty).
pub(super) fn requirement_words(spec: &pb::JobSpec) -> Vec<String> {
    let mut words = Vec::new();
    match (spec.gpu_mem_mib, spec.gpu_fraction_milli) {
        (0, 0) => {}
        (0, milli) => words.push(format!("{:.3} of one GPU's memory", f64::from(milli) / 1000.0)),
        (mib, _) => words.push(format!("{mib} MiB of one GPU's memory")),
    }
    if spec.gpu_compute_pct != 0 {
        words.push(format!("at most {}% of its compute", spec.gpu_compute_pct));
    }
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
