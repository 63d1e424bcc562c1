//! `gpool checkpoint`: run inside a job to report a finished checkpoint.

use super::Ctx;
use crate::output;
use crate::CliError;
use gpool_proto::pb;

/// The job and attempt from the flags, else from `GPOOL_JOB_ID` and
/// `GPOOL_ATTEMPT` (set in every job's environment).
fn from_env(flag: Option<u64>, name: &str) -> Result<u64, CliError> {
    if let Some(value) = flag {
        return Ok(value);
    }
    let text = std::env::var(name).map_err(|_| {
        CliError::Usage(format!(
            "{name} is not set: run `gpool checkpoint` inside a gpool job, or pass --job and --attempt"
        ))
    })?;
    text.trim()
        .parse()
        .map_err(|_| CliError::Usage(format!("{name}: {text:?} is not a number")))
}

pub async fn run(ctx: &Ctx, job: Option<u64>, attempt: Option<u64>) -> Result<(), CliError> {
    let job_id = from_env(job, "GPOOL_JOB_ID")?;
    let attempt = u32::try_from(from_env(attempt, "GPOOL_ATTEMPT")?)
        .map_err(|_| CliError::Usage("GPOOL_ATTEMPT is out of range".into()))?;
    let mut conn = ctx.connect().await?;
    let response = conn
        .client
        .report_checkpoint(pb::ReportCheckpointRequest { job_id, attempt })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    if ctx.json() {
        output::print_json(
            &serde_json::json!({ "job_id": job_id, "attempt": attempt, "preempted": response.preempted }),
        );
    } else if response.preempted {
        outln!("checkpoint of job {job_id} recorded; it is being preempted and ends now");
    } else {
        outln!("checkpoint of job {job_id} recorded");
    }
    Ok(())
}
