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
    reasons: super::reasons::ReasonTexts<'a>,
    /// One stable snake_case code per reason.
    reason_codes: super::reasons::ReasonTexts<'a>,
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
        reasons: super::reasons::ReasonTexts(&job.reasons, super::reasons::words_of),
        reason_codes: super::reasons::ReasonTexts(&job.reasons, super::reasons::code_of),
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
