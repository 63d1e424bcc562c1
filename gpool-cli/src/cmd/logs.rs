//! `gpool logs ID [--follow] [--stderr]`: a job's output, streamed from the
//! node that ran it through gpoold.

use super::Ctx;
use crate::CliError;
use gpool_proto::pb;
use std::io::Write;

/// Returns once job `id` has left the queue (started, or ended unstarted).
pub(super) async fn wait_until_started(conn: &mut super::Connection, id: u64) -> Result<(), CliError> {
    let mut changes = conn
        .client
        .watch_jobs(pb::WatchJobsRequest { ids: vec![id] })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    while let Some(job) = changes.message().await.map_err(|s| conn.refused(s))? {
        if job.state() != pb::JobState::Pending {
            return Ok(());
        }
    }
    Ok(())
}

pub async fn run(
    ctx: &Ctx,
    id: super::JobRef,
    follow: bool,
    stderr: bool,
    (rank, attempt): (u32, u32),
) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let id = conn.resolve(&[id]).await?[0];
    stream(&mut conn, id, (follow, stderr), (rank, attempt), ctx.timeout).await
}

/// Copies job `id`'s output to stdout (following it if asked, from when it
/// starts); `timeout` bounds the wait for output that exists.
pub async fn stream(
    conn: &mut super::Connection,
    id: u64,
    (follow, stderr): (bool, bool),
    (rank, attempt): (u32, u32),
    timeout: Option<std::time::Duration>,
) -> Result<(), CliError> {
    let request = pb::JobLogsRequest {
        id,
        stderr,
        follow,
        rank,
        attempt,
    };
    let mut chunks = match conn.client.job_logs(request).await {
        Ok(chunks) => chunks.into_inner(),
        // Following a job that has not started: wait until it does.
        Err(status) if follow && status.message().contains("has not started") => {
            wait_until_started(conn, id).await?;
            conn.client
                .job_logs(request)
                .await
                .map_err(|s| conn.refused(s))?
                .into_inner()
        }
        Err(status) => return Err(conn.refused(status)),
    };
    let mut out = std::io::stdout().lock();
    loop {
        let next = chunks.message();
        // Output that exists comes at once; only following may wait.
        let chunk = match (follow, timeout) {
            (false, Some(limit)) => tokio::time::timeout(limit, next)
                .await
                .map_err(|_| CliError::Unreachable {
                    addr: conn.addr.clone(),
                    reason: format!(
                        "the node of job {id} sent none of its output within {}s (is its agent stopped?)",
                        limit.as_secs_f64()
                    ),
                })?,
            _ => next.await,
        };
        let Some(chunk) = chunk.map_err(|s| conn.refused(s))? else {
            break;
        };
        // A closed stdout (a pipe into `head`) ends the command quietly,
        // with the exit code of a tool that SIGPIPE ended.
        if out.write_all(&chunk.data).and_then(|()| out.flush()).is_err() {
            std::process::exit(crate::EXIT_CLOSED_STDOUT.into());
        }
    }
    Ok(())
}
