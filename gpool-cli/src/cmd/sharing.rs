//! `gpool why ID` and `gpool usage [--team T]`.

use super::Ctx;
use crate::output;
use crate::CliError;
use gpool_proto::convert::state_name;
use gpool_proto::pb;

/// Why a job is where it is: for a pending job the scheduler's reasons,
/// what would make it start sooner, and its priority's factors.
pub async fn why(ctx: &Ctx, id: super::JobRef) -> Result<(), CliError> {
    let job = super::jobs::fetch(ctx, id).await?;
    let state = state_name(job.state());
    if ctx.json() {
        output::print_json(&serde_json::json!({
            "id": job.id,
            "state": state,
            "reasons": output::ReasonTexts(&job.reasons, output::words_of),
            "reason_codes": output::ReasonTexts(&job.reasons, output::code_of),
            "reason_details": output::reasons_json(&job),
            "hints": output::hints(&job).collect::<Vec<_>>(),
            "priority": job.priority.as_ref().map(output::priority_json),
            "estimated_start": job.estimated_start_ms.map(output::rfc3339),
            "burst": job.burst,
            "end_reason": job.end_reason,
            "service_gpu_secs": job.service_gpu_secs,
            "las_queue": job.las_queue,
        }));
        return Ok(());
    }
    match job.state() {
        pb::JobState::Pending => {
            outln!("job {id} is pending");
            for line in output::reason_lines(&job) {
                outln!("  {line}");
            }
            if let Some(priority) = &job.priority {
                outln!("  priority {}", output::priority_text(priority));
            }
            outln!("  {}", service_line(&job));
            match job.estimated_start_ms {
                Some(at) => outln!(
                    "  expected to start at {} (GPUs reserved for it) if running jobs end by their time limits",
                    output::rfc3339(at)
                ),
                None => outln!("  no start time is estimated"),
            }
        }
        pb::JobState::Running => {
            let class = if job.burst {
                "as burst work (it may be preempted)"
            } else {
                "guaranteed"
            };
            outln!("job {id} is running {class}");
            outln!("  {}", service_line(&job));
        }
        _ if job.end_reason.is_empty() => outln!("job {id} is {state}"),
        _ => outln!("job {id} is {state}: {}", job.end_reason),
    }
    Ok(())
}

/// Its attained service, and its least-attained-service queue where the
/// pool orders by it.
fn service_line(job: &pb::Job) -> String {
    let hours = job.service_gpu_secs as f64 / 3600.0;
    match job.las_queue {
        Some(queue) => {
            format!("service {hours:.2} GPU-hours: LAS queue {queue} of its team (0 is the least served, tried first)")
        }
        None => format!("service {hours:.2} GPU-hours (the pool orders by priority alone)"),
    }
}

pub async fn usage(ctx: &Ctx, team: Option<String>) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let teams = conn
        .client
        .get_usage(pb::GetUsageRequest {
            team: team.unwrap_or_default(),
        })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner()
        .teams;
    if ctx.json() {
        let rows: Vec<serde_json::Value> = teams
            .iter()
            .map(|t| {
                serde_json::json!({
                    // null: no [[team]] is configured, so the whole pool is.
                    "team": t.team, "shares": t.shares,
                    "guaranteed_gpus": (t.guaranteed_gpus != u32::MAX).then_some(t.guaranteed_gpus),
                    "guaranteed_gpu_hours": t.guaranteed_gpu_hours, "burst_gpu_hours": t.burst_gpu_hours,
                    "gpu_hours_budget": t.gpu_hours_budget, "budget_left_gpu_hours": t.budget_left_gpu_hours,
                    "gpus_in_use": t.gpus_in_use, "guaranteed_gpus_in_use": t.guaranteed_gpus_in_use,
                    "fair_share": t.fair_share, "period_start": output::rfc3339(t.period_start_ms),
                })
            })
            .collect();
        output::print_json(&serde_json::Value::Array(rows));
        return Ok(());
    }
    outln!(
        "{:<16} {:>6} {:>10} {:>10} {:>12} {:>9} {:>10} {:>10}",
        "TEAM",
        "SHARES",
        "GUAR.GPUS",
        "GPUS NOW",
        "GUAR.GPU-H",
        "BURST-H",
        "BUDGET LEFT",
        "FAIRSHARE"
    );
    for t in &teams {
        outln!(
            "{:<16} {:>6} {:>10} {:>10} {:>12.1} {:>9.1} {:>10} {:>10.3}",
            t.team,
            t.shares,
            if t.guaranteed_gpus == u32::MAX {
                "all".to_string()
            } else {
                t.guaranteed_gpus.to_string()
            },
            t.gpus_in_use,
            t.guaranteed_gpu_hours,
            t.burst_gpu_hours,
            t.budget_left_gpu_hours
                .map_or("-".to_string(), |left| format!("{left:.1}")),
            t.fair_share
        );
    }
    Ok(())
}
