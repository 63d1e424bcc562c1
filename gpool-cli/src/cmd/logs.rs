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
    while let Some(chunk) = chunks.message().await.map_err(|s| conn.refused(s))? {
        // A closed stdout (a pipe into `head`) ends the command quietly.
        if out.write_all(&chunk.data).and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
    }
    Ok(())
}
