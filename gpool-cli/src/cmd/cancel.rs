//! `gpool cancel ID...`.

use super::Ctx;
use crate::output;
use crate::CliError;
use gpool_proto::convert::state_name;
use gpool_proto::pb;

pub async fn run(ctx: &Ctx, ids: Vec<u64>) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let response = conn
        .client
        .cancel_jobs(pb::CancelJobsRequest { ids })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    if ctx.json() {
        let outcomes: Vec<_> = response
            .outcomes
            .iter()
            .map(|o| serde_json::json!({ "id": o.id, "state": state_name(o.state()), "cancelled": o.cancelled }))
            .collect();
        output::print_json(&serde_json::json!({ "outcomes": outcomes }));
        return Ok(());
    }
    for outcome in response.outcomes {
        if outcome.cancelled {
            println!("cancelled job {}", outcome.id);
        } else {
            println!("job {} had already ended ({})", outcome.id, state_name(outcome.state()));
        }
    }
    Ok(())
}
