//! `gpool cancel [--signal SIG] ID...`.

use super::Ctx;
use crate::output;
use crate::CliError;
use gpool_proto::convert::state_name;
use gpool_proto::pb;

/// A signal by name (`USR1`, `SIGUSR1`, any case) or number.
pub fn parse_signal(text: &str) -> Result<i32, String> {
    if let Ok(number) = text.parse::<i32>() {
        return nix::sys::signal::Signal::try_from(number)
            .map(|signal| signal as i32)
            .map_err(|_| format!("{number} is not a signal number"));
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<nix::sys::signal::Signal>()
        .map(|signal| signal as i32)
        .map_err(|_| format!("{text:?} is not a signal name (e.g. USR1, TERM, 10)"))
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
