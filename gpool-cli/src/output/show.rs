//! `gpool show`: one job, field by field.

use super::*;

/// One line of `gpool show`: its key and its value.
type Line = (&'static str, String);

/// `gpool show`: the job's environment only counted unless `with_env`
/// (an exported shell environment is dozens of lines).
pub fn print_job_details(job: &pb::Job, with_env: bool) {
    let spec = spec(job);
    let mut lines = identity_lines(job, spec);
    lines.extend(request_lines(job, spec));
    lines.extend(timeline_lines(job));
    lines.extend(option_lines(job, spec));
    lines.extend(run_lines(job));
    lines.extend(scheduling_lines(job, spec));
    lines.extend(env_lines(job, spec, with_env));
    // The longest key ("to start sooner:") still gets a space after it.
    for (key, value) in lines {
        outln!("{:<17}{value}", format!("{key}:"));
    }
}

/// `-` for an empty text.
fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".to_string()
    } else {
        text.to_string()
    }
}

/// Which job it is and whose: id, name, state, user, team, project, workload type, pool.
fn identity_lines(job: &pb::Job, spec: &pb::JobSpec) -> Vec<Line> {
    vec![
        ("id", crate::cmd::display_id(job)),
        ("name", spec.name.clone()),
        ("state", state_name(job.state()).to_string()),
        ("user", job.user.clone()),
        ("team", spec.team.clone()),
        ("project", or_dash(&spec.project)),
        ("workload type", or_dash(&spec.workload_type)),
        ("pool", or_dash(&spec.pool)),
    ]
}

/// What it asks for: GPUs, GPU types, priority, time limit, command, workdir.
fn request_lines(job: &pb::Job, spec: &pb::JobSpec) -> Vec<Line> {
    vec![
        (
            "gpus",
            format!(
                "{} per node x {} node(s){}",
                spec.gpus,
                spec.nodes,
                if spec.exclusive {
                    ", exclusive: every GPU of each node"
                } else {
                    ""
                }
            ),
        ),
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
    ]
}

/// When it was submitted, started and ended, and its attempts.
fn timeline_lines(job: &pb::Job) -> Vec<Line> {
    vec![
        ("submitted", rfc3339(job.submitted_at_ms)),
        ("started", job.started_at_ms.map_or("-".into(), rfc3339)),
        ("ended", job.ended_at_ms.map_or("-".into(), rfc3339)),
        ("attempts", job.attempt.to_string()),
    ]
}

/// The options it was submitted with (each only where set), and its placement.
fn option_lines(job: &pb::Job, spec: &pb::JobSpec) -> Vec<Line> {
    let mut lines = Vec::new();
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
    lines
}

/// How its run went: events, stragglers, GPU use, exit code, end reason.
fn run_lines(job: &pb::Job) -> Vec<Line> {
    let mut lines = Vec::new();
    for event in &job.events {
        // A warning (a node that did not enforce its limits) stands out.
        match event.text.strip_prefix("warning: ") {
            Some(warning) => lines.push(("warning", format!("{warning} ({})", rfc3339(event.at_ms)))),
            None => lines.push(("event", format!("{} {}", rfc3339(event.at_ms), event.text))),
        }
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
    lines
}

/// What the scheduler makes of it: QoS, class, preemptions, priority, expected start, why it waits.
fn scheduling_lines(job: &pb::Job, spec: &pb::JobSpec) -> Vec<Line> {
    let mut lines = vec![("qos", or_dash(&spec.qos))];
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
    for reason in &job.reasons {
        lines.push(("why pending", reason.words.clone()));
    }
    for hint in hints(job) {
        lines.push(("to start sooner", hint.to_string()));
    }
    lines
}

/// Its environment: every variable with `with_env`, else how many there are.
fn env_lines(job: &pb::Job, spec: &pb::JobSpec, with_env: bool) -> Vec<Line> {
    let mut lines = Vec::new();
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
    lines
}
