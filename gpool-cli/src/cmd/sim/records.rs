//! `gpool sim --jobs-out FILE` and `--events-out FILE`: every attempt of
//! every job under each policy, and every preemption and rescind with its
//! reason, as CSV for an audit of where and when each job ran.

use crate::output;
use gpool_core::sim::{AttemptRecord, EventRecord, Outcome};
use std::path::Path;

/// The columns of `--jobs-out`.
pub(super) const JOB_COLUMNS: [&str; 13] = [
    "policy",
    "job",
    "attempt",
    "team",
    "submit",
    "start",
    "end",
    "nodes",
    "gpu_model",
    "gpus",
    "end_state",
    "preempted_for",
    "placement",
];

/// The columns of `--events-out`.
pub(super) const EVENT_COLUMNS: [&str; 7] = ["policy", "at", "event", "job", "attempt", "for_job", "reason"];

fn time(at: Option<gpool_core::ids::Timestamp>) -> String {
    at.map_or_else(String::new, |at| output::rfc3339_ms(at.0))
}

/// One row of `--jobs-out`.
fn job_row(policy: &str, record: &AttemptRecord) -> Vec<String> {
    let nodes: Vec<&str> = record.placement.iter().map(|(node, _)| node.as_str()).collect();
    let placement: Vec<String> = record
        .placement
        .iter()
        .map(|(node, gpus)| {
            let gpus: Vec<String> = gpus.iter().map(u32::to_string).collect();
            format!("{node}[{}]", gpus.join(","))
        })
        .collect();
    vec![
        policy.to_string(),
        record.job.to_string(),
        record.attempt.to_string(),
        record.team.clone(),
        output::rfc3339_ms(record.submit.0),
        time(record.start),
        time(record.end),
        nodes.join(" "),
        record.gpu_models.join("|"),
        record.gpus.to_string(),
        record.end_state.as_str().to_string(),
        record.preempted_for.map_or_else(String::new, |id| id.to_string()),
        placement.join(" "),
    ]
}

/// One row of `--events-out`.
fn event_row(policy: &str, event: &EventRecord) -> Vec<String> {
    let kind = match event.kind {
        gpool_core::sim::EventKind::Preempted => "preempted",
        gpool_core::sim::EventKind::Rescinded => "rescinded",
    };
    vec![
        policy.to_string(),
        output::rfc3339_ms(event.at.0),
        kind.to_string(),
        event.job.to_string(),
        event.attempt.to_string(),
        event.for_job.to_string(),
        event.reason.clone(),
    ]
}

/// Writes `rows` under `header` to `path`; errors name `flag` and the file.
fn write_csv(flag: &str, path: &Path, header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> Result<(), String> {
    let fail = |err: &dyn std::fmt::Display| format!("{flag} {}: {err}", path.display());
    let mut writer = csv::Writer::from_path(path).map_err(|err| fail(&err))?;
    writer.write_record(header).map_err(|err| fail(&err))?;
    for row in rows {
        writer.write_record(&row).map_err(|err| fail(&err))?;
    }
    writer.flush().map_err(|err| fail(&err))
}

/// `--jobs-out`: every policy's attempts, in the order they ended.
pub(super) fn write_jobs(path: &Path, outcomes: &[&Outcome]) -> Result<(), String> {
    let rows = outcomes
        .iter()
        .flat_map(|o| o.attempts.iter().map(|record| job_row(&o.policy, record)));
    write_csv("--jobs-out", path, &JOB_COLUMNS, rows)
}

/// `--events-out`: every policy's preemptions and rescinds, in time order.
pub(super) fn write_events(path: &Path, outcomes: &[&Outcome]) -> Result<(), String> {
    let rows = outcomes
        .iter()
        .flat_map(|o| o.events.iter().map(|event| event_row(&o.policy, event)));
    write_csv("--events-out", path, &EVENT_COLUMNS, rows)
}
