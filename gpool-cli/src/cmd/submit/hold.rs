//! `gpool submit --hold`: the job is submitted, then held at once.

use crate::CliError;
use gpool_core::JobSpec;
use gpool_proto::convert::state_name;

/// How long after submission a job submitted with --hold may begin at
/// the earliest: gpoold takes no hold with the submission, so the hold is
/// a second request, and this keeps the scheduler from starting the job in
/// between (a hold that comes later is refused, and said).
const HOLD_GATE_SECS: u64 = 10;

/// Makes each spec begin no sooner than `HOLD_GATE_SECS` after submission.
pub(super) fn gate_until_held(specs: &mut [JobSpec]) {
    use gpool_core::model::Begin;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64);
    let gate_ms = now_ms + (HOLD_GATE_SECS * 1000) as i64;
    for spec in specs {
        let later = match spec.begin {
            Some(Begin::AfterSecs(secs)) => secs >= HOLD_GATE_SECS,
            Some(Begin::At(at)) => at.0 >= gate_ms,
            None => false,
        };
        if !later {
            spec.begin = Some(Begin::AfterSecs(HOLD_GATE_SECS));
        }
    }
}

/// Holds the jobs just submitted (`--hold`); one that could not be held is
/// named, with what to do about it.
pub(super) async fn hold_submitted(conn: &mut crate::cmd::Connection, ids: &[u64]) -> Result<(), CliError> {
    let request = gpool_proto::pb::CancelJobsRequest {
        ids: ids.to_vec(),
        hold: gpool_proto::pb::HoldChange::Hold.into(),
        ..Default::default()
    };
    let not_held = |ids: &[u64], why: &str| {
        let named = crate::cmd::jobs::id_list(ids);
        let bare = named.split_once(' ').map_or(named.as_str(), |(_, bare)| bare);
        CliError::Refused(format!(
            "--hold: {named} submitted but not held ({why}); `gpool hold {bare}` holds it while it waits, `gpool cancel {bare}` ends it"
        ))
    };
    let outcomes = match conn.client.cancel_jobs(request).await {
        Ok(answer) => answer.into_inner().outcomes,
        Err(status) => return Err(not_held(ids, &conn.refused(status).to_string())),
    };
    for id in ids {
        let why = match outcomes.iter().find(|outcome| outcome.id == *id) {
            Some(outcome) if outcome.held => continue,
            Some(outcome) if !outcome.error.is_empty() => outcome.error.clone(),
            Some(outcome) => format!("it is {}", state_name(outcome.state())),
            None => "gpoold did not answer for it".to_string(),
        };
        return Err(not_held(&[*id], &why));
    }
    Ok(())
}
