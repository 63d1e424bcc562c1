//! `gpool cancel [--signal SIG] ID...`.

use super::Ctx;
use crate::output;
use crate::CliError;
use gpool_proto::convert::state_name;
use gpool_proto::pb;

/// A signal by name (`USR1`, `SIGUSR1`, any case) or number, of those
/// gpool sends to jobs.
pub fn parse_signal(text: &str) -> Result<i32, String> {
    gpool_core::spec::parse_signal(text)
}

pub async fn run(ctx: &Ctx, ids: Vec<u64>, signal: Option<i32>) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let response = conn
        .client
        .cancel_jobs(pb::CancelJobsRequest {
            ids,
            signal: signal.unwrap_or(0),
        })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    if ctx.json() {
        let outcomes: Vec<_> = response
            .outcomes
            .iter()
            .map(|o| {
                serde_json::json!({
                    "id": o.id,
                    "state": state_name(o.state()),
                    "cancelled": o.cancelled,
                    "signalled": o.signalled,
                })
            })
            .collect();
        output::print_json(&serde_json::json!({ "outcomes": outcomes }));
        return Ok(());
    }
    for outcome in response.outcomes {
        if signal.is_some() {
            if outcome.signalled {
                println!("signalled job {}", outcome.id);
            } else {
                println!("job {} is not running ({})", outcome.id, state_name(outcome.state()));
            }
        } else if outcome.cancelled {
            println!("cancelled job {}", outcome.id);
        } else {
            println!("job {} had already ended ({})", outcome.id, state_name(outcome.state()));
        }
    }
    Ok(())
}
