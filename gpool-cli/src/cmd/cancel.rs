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

/// Cancels (or signals) every id it can and reports each; exits 1 if any
/// id was left alone (no such job, or not the caller's).
pub async fn run(ctx: &Ctx, ids: Vec<u64>, signal: Option<i32>) -> Result<u8, CliError> {
    change(ctx, ids, signal, pb::HoldChange::None).await
}

/// `gpool hold ID...` (`hold` true) and `gpool release ID...`: pending jobs
/// are kept from being scheduled, or let go again; each id is reported.
pub async fn hold(ctx: &Ctx, ids: Vec<u64>, hold: bool) -> Result<u8, CliError> {
    let change = if hold {
        pb::HoldChange::Hold
    } else {
        pb::HoldChange::Release
    };
    self::change(ctx, ids, None, change).await
}

async fn change(ctx: &Ctx, ids: Vec<u64>, signal: Option<i32>, hold: pb::HoldChange) -> Result<u8, CliError> {
    let mut conn = ctx.connect().await?;
    let response = conn
        .client
        .cancel_jobs(pb::CancelJobsRequest {
            ids,
            signal: signal.unwrap_or(0),
            hold: hold.into(),
        })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    let code = u8::from(response.outcomes.iter().any(|o| !o.error.is_empty()));
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
                    "error": (!o.error.is_empty()).then_some(&o.error),
                    "held": o.held,
                })
            })
            .collect();
        output::print_json(&serde_json::json!({ "outcomes": outcomes }));
        return Ok(code);
    }
    for outcome in response.outcomes {
        if !outcome.error.is_empty() {
            eprintln!("gpool: job {} left alone: {}", outcome.id, outcome.error);
        } else if hold != pb::HoldChange::None {
            match (outcome.held, outcome.state()) {
                (true, _) => outln!("job {} held", outcome.id),
                (false, pb::JobState::Pending) => outln!("job {} released", outcome.id),
                (false, state) => outln!(
                    "job {} is {}: only pending jobs are held",
                    outcome.id,
                    state_name(state)
                ),
            }
        } else if signal.is_some() {
            if outcome.signalled {
                outln!("signalled job {}", outcome.id);
            } else {
                outln!("job {} is not running ({})", outcome.id, state_name(outcome.state()));
            }
        } else if outcome.cancelled {
            outln!("cancelled job {}", outcome.id);
        } else {
            outln!("job {} had already ended ({})", outcome.id, state_name(outcome.state()));
        }
    }
    Ok(code)
}
