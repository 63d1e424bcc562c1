//! `scontrol show job ID`, `scontrol show node NAME` (Slurm's key=value
//! lines), and `scontrol hold|release|requeue ID...`.

use super::format;
use crate::CliError;
use gpool_proto::pb;

pub async fn run(ctx: &crate::cmd::Ctx, argv: Vec<String>) -> Result<u8, CliError> {
    let words: Vec<&str> = argv
        .iter()
        .skip(1)
        .map(String::as_str)
        .filter(|w| !w.starts_with('-'))
        .collect();
    match words.as_slice() {
        ["show", "job" | "jobs", id] => show_job(ctx, id).await,
        ["show", "node" | "nodes", name] => show_node(ctx, name).await,
        [verb @ ("hold" | "release" | "requeue" | "uhold"), ids @ ..] if !ids.is_empty() => {
            let verb = if *verb == "uhold" { "hold" } else { verb };
            let mut gpool = vec!["gpool".to_string(), verb.to_string()];
            gpool.extend(ids.iter().flat_map(|ids| ids.split(',')).map(String::from));
            crate::run(crate::parse::command_line(gpool)?).await
        }
        _ => Err(CliError::Usage(format!(
            "scontrol: error: {:?}: gpool's scontrol takes show job ID, show node NAME, and hold, release or requeue ID...",
            words.join(" ")
        ))),
    }
}

async fn show_job(ctx: &crate::cmd::Ctx, id: &str) -> Result<u8, CliError> {
    let job_ref =
        crate::cmd::parse_job_ref(id).map_err(|reason| CliError::Usage(format!("scontrol: error: {reason}")))?;
    let job = crate::cmd::jobs::fetch(ctx, job_ref).await?;
    outln!("{}", job_lines(&job, super::now_ms()));
    Ok(0)
}

/// A job as `scontrol show job` writes it.
pub fn job_lines(job: &pb::Job, now_ms: i64) -> String {
    let spec = job.spec.clone().unwrap_or_default();
    let limit = spec
        .time_limit
        .map_or_else(|| "UNLIMITED".into(), |limit| format::sacct_duration(limit.seconds));
    let array = match job.array_task_index {
        Some(index) => format!(" ArrayJobId={} ArrayTaskId={index}", job.array_job_id),
        None => String::new(),
    };
    let nodes = if job.started_at_ms.is_some() {
        format::node_list(job)
    } else {
        "(null)".into()
    };
    [
        format!("JobId={} JobName={}", job.id, spec.name),
        format!("   UserId={} Account={} QOS={}", job.user, spec.team, spec.qos),
        format!(
            "   JobState={} Reason={}{array}",
            format::state_long(job),
            super::squeue::reason(job)
        ),
        format!(
            "   RunTime={} TimeLimit={limit}",
            format::sacct_duration(format::elapsed_secs(job, now_ms))
        ),
        format!(
            "   SubmitTime={} StartTime={} EndTime={}",
            format::sacct_time(Some(job.submitted_at_ms)),
            format::sacct_time(job.started_at_ms),
            format::sacct_time(job.ended_at_ms)
        ),
        format!("   Partition={} NodeList={nodes}", super::partition(&spec)),
        format!(
            "   NumNodes={} TRES=gres/gpu={}",
            spec.nodes.max(1),
            spec.gpus * spec.nodes.max(1)
        ),
        format!(
            "   ExitCode={} Restarts={}",
            format::exit_code(job),
            job.attempt.saturating_sub(1)
        ),
        format!("   WorkDir={}", spec.workdir),
    ]
    .join("\n")
}

async fn show_node(ctx: &crate::cmd::Ctx, name: &str) -> Result<u8, CliError> {
    let nodes = super::nodes(ctx).await?;
    let node = nodes
        .iter()
        .find(|node| node.name == name)
        .ok_or_else(|| CliError::Usage(format!("scontrol: error: Node {name} not found")))?;
    let state = crate::output::node_state(node).to_ascii_uppercase();
    let reason = if node.drain_reason.is_empty() {
        "(null)"
    } else {
        node.drain_reason.as_str()
    };
    outln!(
        "NodeName={} State={state} Partitions={}\n   Gres=gpu:{}:{} CPUTot={} RealMemory={}\n   Reason={reason}",
        node.name,
        node.pools.join(","),
        crate::output::gpu_models(node),
        node.gpus.len(),
        node.cpus,
        node.memory_bytes >> 20,
    );
    Ok(0)
}
