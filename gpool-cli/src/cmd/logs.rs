//! `gpool logs ID [--follow] [--stderr]`: a job's output, streamed from the
//! node that ran it through gpoold.

use super::Ctx;
use crate::CliError;
use gpool_proto::pb;
use std::io::Write;

pub async fn run(ctx: &Ctx, id: u64, follow: bool, stderr: bool) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let mut chunks = conn
        .client
        .job_logs(pb::JobLogsRequest { id, stderr, follow })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    let mut out = std::io::stdout().lock();
    loop {
        let next = chunks.message();
        // Output that exists comes at once; only following may wait.
        let chunk = match (follow, ctx.timeout) {
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
        // A closed stdout (a pipe into `head`) ends the command quietly.
        if out.write_all(&chunk.data).and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
    }
    Ok(())
}
