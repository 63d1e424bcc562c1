//! The steps of `wait_for`: the progress display while jobs run, Ctrl-C,
//! `--fail-fast`, and the exit code at the end.

use super::{describe, ended, own_exit_code, print_summary};
use crate::cmd::submit::{EXIT_CANCELLED, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TIMEOUT};
use crate::cmd::{display_id, Connection};
use crate::CliError;
use gpool_proto::convert::state_name;
use gpool_proto::pb;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

/// What the watch has told so far.
#[derive(Default)]
pub(super) struct Seen {
    /// Each job's latest news.
    pub(super) last: BTreeMap<u64, pb::Job>,
    pub(super) n_ended: u64,
    pub(super) n_not_completed: u64,
    /// With --fail-fast: the job whose end cancelled the others.
    pub(super) failed_first: Option<u64>,
}

/// On a terminal (unless quiet): a spinner for one job, a bar for several.
pub(super) fn progress_bar(ids: &[u64], quiet: bool) -> Option<ProgressBar> {
    (std::io::stderr().is_terminal() && !quiet).then(|| {
        let (bar, template) = match ids {
            [id] => (
                ProgressBar::new_spinner().with_prefix(format!("job {id}")),
                "{spinner} {prefix}: {msg} ({elapsed})",
            ),
            _ => (
                ProgressBar::new(ids.len() as u64),
                "{spinner} {bar:30} {pos}/{len} jobs ended, {msg} ({elapsed})",
            ),
        };
        bar.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner()));
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    })
}

/// Ctrl-C: names the jobs still in the pool (and prints the summary with --output json).
pub(super) fn stop_waiting(ids: &[u64], last: &BTreeMap<u64, pb::Job>, progress: Option<&ProgressBar>, json: bool) {
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    // Waiting stops; the jobs do not.
    let left: Vec<String> = ids
        .iter()
        .filter(|id| !last.get(id).is_some_and(ended))
        .map(u64::to_string)
        .collect();
    if !left.is_empty() {
        let them = if left.len() == 1 { "it" } else { "them" };
        eprintln!(
            "gpool: stopped waiting; job {} still in the pool: `gpool cancel {}` ends {them}",
            left.join(" "),
            left.join(" ")
        );
    }
    if json {
        print_summary(ids, last, EXIT_INTERRUPTED);
    }
}

/// `--fail-fast`: cancels the jobs other than `job` that have not ended.
pub(super) async fn cancel_the_rest(
    conn: &mut Connection,
    ids: &[u64],
    job: &pb::Job,
    last: &BTreeMap<u64, pb::Job>,
) -> Result<(), CliError> {
    let rest: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| *id != job.id && !last.get(id).is_some_and(ended))
        .collect();
    if !rest.is_empty() {
        eprintln!(
            "gpool: job {} {}; cancelling the {} others (--fail-fast)",
            display_id(job),
            describe(job),
            rest.len()
        );
        for chunk in rest.chunks(gpool_core::ids::MAX_IDS_PER_REQUEST) {
            let request = pb::CancelJobsRequest {
                ids: chunk.to_vec(),
                ..Default::default()
            };
            conn.client.cancel_jobs(request).await.map_err(|s| conn.refused(s))?;
        }
    }
    Ok(())
}

/// Shows `job`'s news: on the bar, else (unless quiet) a line on stderr when its state changed.
pub(super) fn show_progress(progress: Option<&ProgressBar>, ids: &[u64], job: &pb::Job, seen: &Seen, quiet: bool) {
    if let Some(bar) = progress {
        if ids.len() == 1 {
            bar.set_message(describe(job));
        } else {
            bar.set_position(seen.n_ended);
            bar.set_message(format!("{} not completed", seen.n_not_completed));
        }
    } else if !quiet && seen.last.get(&job.id).is_none_or(|before| before.state != job.state) {
        // Off a terminal (CI logs, journald): a line per change of
        // state, with the job's name, so a failure is named when it
        // happens.
        let name = job.spec.as_ref().map_or("", |spec| spec.name.as_str());
        eprintln!(
            "gpool: job {} ({name}) {} [{}/{} ended]",
            display_id(job),
            describe(job),
            seen.n_ended,
            ids.len()
        );
    }
}

/// The exit code of the first job (in `ids` order) that did not complete, each such job named on stderr.
pub(super) fn exit_code(ids: &[u64], seen: &Seen, own_code: bool) -> Result<u8, CliError> {
    let mut first_code = 0;
    for id in ids {
        let job = seen
            .last
            .get(id)
            .ok_or_else(|| CliError::Refused(format!("job {id}: the controller ended the watch without news")))?;
        let code = match job.state() {
            pb::JobState::Completed => 0,
            pb::JobState::Cancelled => EXIT_CANCELLED,
            pb::JobState::Timeout => EXIT_TIMEOUT,
            pb::JobState::Failed if own_code => job.exit_code.map_or(EXIT_FAILED, own_exit_code),
            pb::JobState::Failed | pb::JobState::NodeFail | pb::JobState::OutOfMemory => EXIT_FAILED,
            other => {
                return Err(CliError::Refused(format!(
                    "job {id}: watch ended while {}",
                    state_name(other)
                )))
            }
        };
        if code != 0 {
            eprintln!("gpool: job {id} {}", describe(job));
            // With --fail-fast, the job that failed first speaks, not one
            // it had cancelled.
            if first_code == 0 || seen.failed_first == Some(*id) {
                first_code = code;
            }
        }
    }
    Ok(first_code)
}
