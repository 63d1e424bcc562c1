//! Where a job's output is read and its terminal typed at: the node and
//! attempt, for the caller it is allowed to.

use super::pool::PoolService;
use crate::error::Error;
use gpool_core::auth::{authorize, Action, Caller};
use gpool_core::JobId;
use tonic::Status;

impl PoolService {
    /// Where a job's output is: rank 0's node and the latest attempt.
    pub(super) fn log_source(
        &self,
        id: JobId,
        (rank, attempt): (u32, u32),
        stderr: bool,
        caller: &Caller,
    ) -> Result<(String, u32, u64), Status> {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let job = state.find_job(id)?.ok_or(Error::UnknownJob(id))?;
        authorize(caller, &Action::ReadJob(job.auth_ref())).map_err(Error::from)?;
        if job.spec.discard_output {
            return Err(Error::OutputDiscarded(id).into());
        }
        if let Some(elsewhere) = output_file(&job, id, rank, stderr) {
            return Err(elsewhere);
        }
        if job.n_attempts == 0 || job.last_nodes.is_empty() {
            return Err(Error::NotStarted(id).into());
        }
        let (attempt, nodes) = attempt_nodes(&job, attempt)?;
        // Only the running attempt is followed.
        let epoch = match &job.state {
            gpool_core::JobState::Running { epoch, .. } if attempt == job.n_attempts => epoch.0,
            _ => 0,
        };
        match nodes.get(rank as usize) {
            Some(node) => Ok((node.clone(), attempt, epoch)),
            None => Err(Error::InvalidRequest {
                field: "rank",
                reason: format!(
                    "attempt {attempt} of job {id} ran on {} node(s): ranks 0 to {}",
                    nodes.len(),
                    nodes.len().saturating_sub(1)
                ),
            }
            .into()),
        }
    }

    /// Where typing at job `id`'s terminal goes: its running attempt's
    /// node (rank 0) and epoch. Only an interactive job's owner (or an
    /// admin) may type at it, and only while it runs.
    pub(super) fn input_target(&self, id: JobId, caller: &Caller) -> Result<(String, u64), Status> {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let job = state.find_job(id)?.ok_or(Error::UnknownJob(id))?;
        authorize(caller, &Action::TypeInto(job.auth_ref())).map_err(Error::from)?;
        if job.spec.pty.is_none() {
            return Err(Error::InvalidRequest {
                field: "id",
                reason: format!(
                    "job {} has no terminal: only jobs of gpool alloc or gpool run --pty take input",
                    job.display_id()
                ),
            }
            .into());
        }
        match (&job.state, job.last_nodes.first()) {
            (gpool_core::JobState::Running { epoch, .. }, Some(node)) => Ok((node.clone(), epoch.0)),
            _ => Err(Error::InvalidRequest {
                field: "id",
                reason: format!(
                    "job {} is {}: only a running job's terminal takes input",
                    job.display_id(),
                    job.state.name()
                ),
            }
            .into()),
        }
    }
}

/// Where the output of a job that writes it to a file (`-o`/`-e`) went, as
/// the error to answer; `None` where the node keeps it.
fn output_file(job: &gpool_core::Job, id: JobId, rank: u32, stderr: bool) -> Option<Status> {
    let (stream, file) = if stderr {
        ("stderr", &job.spec.stderr_path)
    } else {
        ("stdout", &job.spec.stdout_path)
    };
    if file.is_empty() {
        return None;
    }
    // Where it went, as its node expanded the pattern (the node is
    // known once the job started).
    let node = job.last_nodes.get(rank as usize).map(|node| node.as_str());
    let fields = gpool_core::array::OutputFields {
        job: id.0,
        array: job.array_task.as_ref().map(|task| task.array.0),
        task_index: job.array_task.as_ref().map(|task| task.index),
        node: node.unwrap_or("%n"),
        rank,
        user: &job.user,
        name: &job.spec.name,
    };
    let expanded = gpool_core::array::expand_output_pattern(file, &fields);
    let path = match std::path::Path::new(&expanded) {
        path if path.is_absolute() || job.spec.workdir.is_empty() => path.to_path_buf(),
        path => std::path::Path::new(&job.spec.workdir).join(path),
    };
    let on = node.map_or_else(String::new, |node| format!(" on {node}"));
    Some(
        Error::InvalidRequest {
            field: "id",
            reason: format!(
                "job {} writes its {stream} to {}{on} (-{} {file}): read it there",
                job.display_id(),
                path.display(),
                if stderr { "e" } else { "o" }
            ),
        }
        .into(),
    )
}

/// Attempt `attempt` of `job` (0: the latest) and the nodes it ran on.
fn attempt_nodes(job: &gpool_core::Job, attempt: u32) -> Result<(u32, &[String]), Status> {
    match attempt {
        0 => Ok((job.n_attempts, job.last_nodes.as_slice())),
        n if n == job.n_attempts => Ok((n, job.last_nodes.as_slice())),
        n => match job.past_attempts.iter().find(|past| past.attempt == n) {
            Some(past) => Ok((n, past.nodes.as_slice())),
            None => {
                let known: Vec<String> = job
                    .past_attempts
                    .iter()
                    .map(|past| past.attempt.to_string())
                    .chain(std::iter::once(job.n_attempts.to_string()))
                    .collect();
                Err(Error::InvalidRequest {
                    field: "attempt",
                    reason: format!(
                        "job {} has no attempt {n} on record (attempts with output: {})",
                        job.display_id(),
                        known.join(", ")
                    ),
                }
                .into())
            }
        },
    }
}
