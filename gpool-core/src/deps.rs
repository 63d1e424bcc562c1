//! Job dependencies (`--dependency afterok:3:4,afterany:5,singleton`), as
//! sbatch has them: when a pending job may be scheduled, and when it never
//! can be (then it ends, with that reason, instead of waiting forever).

use crate::ids::JobId;
use crate::job_state::JobState;
use crate::model::Job;
use crate::spec::{spec_error, SpecError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Most dependencies one job may name.
pub const MAX_DEPENDENCIES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DepKind {
    /// After the job completed (exit 0).
    AfterOk,
    /// After the job ended, however.
    AfterAny,
    /// After the job ended without completing.
    AfterNotOk,
}

/// The job waited for: by id, or (in a request of several jobs, before ids
/// exist) by its 1-based position among the request's earlier jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DepTarget {
    Job(JobId),
    InRequest(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    pub kind: DepKind,
    pub target: DepTarget,
}

impl DepKind {
    pub fn name(self) -> &'static str {
        match self {
            DepKind::AfterOk => "afterok",
            DepKind::AfterAny => "afterany",
            DepKind::AfterNotOk => "afternotok",
        }
    }
}

impl fmt::Display for DepTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DepTarget::Job(id) => write!(f, "job {id}"),
            DepTarget::InRequest(position) => write!(f, "job {position} of the request"),
        }
    }
}

/// Parses `afterok:3:4,afterany:prep,singleton`. `name_of` turns a word
/// that is not an id into a target (the jobs of the same file), or `None`.
pub fn parse_dependencies(
    text: &str,
    name_of: &dyn Fn(&str) -> Option<DepTarget>,
) -> Result<(Vec<Dependency>, bool), SpecError> {
    let mut dependencies = Vec::new();
    let mut singleton = false;
    for item in text.split(',').map(str::trim) {
        if item == "singleton" {
            singleton = true;
            continue;
        }
        let mut parts = item.split(':');
        let kind = match parts.next().unwrap_or_default() {
            "afterok" => DepKind::AfterOk,
            "afterany" => DepKind::AfterAny,
            "afternotok" => DepKind::AfterNotOk,
            other => {
                return Err(spec_error(
                    "dependency",
                    format!("{other:?} is not afterok, afterany, afternotok or singleton"),
                ))
            }
        };
        let mut n_targets = 0;
        for word in parts {
            let target = match word.parse::<u64>() {
                Ok(id) if id > 0 => DepTarget::Job(JobId(id)),
                _ => name_of(word).ok_or_else(|| {
                    spec_error(
                        "dependency",
                        format!("{word:?} is not a job id or the name of an earlier [[job]] of the file"),
                    )
                })?,
            };
            dependencies.push(Dependency { kind, target });
            n_targets += 1;
        }
        if n_targets == 0 {
            return Err(spec_error(
                "dependency",
                format!("{item:?} names no job (e.g. {}:12)", kind.name()),
            ));
        }
    }
    if dependencies.len() > MAX_DEPENDENCIES {
        return Err(spec_error(
            "dependency",
            format!("{} jobs, more than the limit of {MAX_DEPENDENCIES}", dependencies.len()),
        ));
    }
    Ok((dependencies, singleton))
}

/// Whether a pending job's dependencies let it be scheduled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DepState {
    Met,
    /// Not yet: why, in words.
    Waiting(String),
    /// Never: why, in words.
    Never(String),
}

/// The state of `job`'s dependencies. `lookup` finds other jobs;
/// `singleton_holder` is a job of the same user and name that runs (or
/// waits ahead of it), for `singleton`.
pub fn dependency_state<'a>(
    job: &Job,
    lookup: impl Fn(JobId) -> Option<&'a Job>,
    singleton_holder: Option<JobId>,
) -> DepState {
    let mut waiting = None;
    for dependency in &job.spec.dependencies {
        let DepTarget::Job(id) = dependency.target else {
            return DepState::Never(format!("its dependency on {} was never resolved", dependency.target));
        };
        let Some(other) = lookup(id) else {
            return DepState::Never(format!("job {id}, which it depends on, does not exist"));
        };
        let completed = matches!(other.state, JobState::Completed { .. });
        let ended = other.state.is_finished();
        let kind = dependency.kind.name();
        let met = match dependency.kind {
            DepKind::AfterOk if ended && !completed => {
                return DepState::Never(format!(
                    "job {id} ended {}, and it was to complete ({kind})",
                    other.state.name()
                ))
            }
            DepKind::AfterNotOk if completed => {
                return DepState::Never(format!("job {id} completed, and it was not to ({kind})"))
            }
            DepKind::AfterOk => completed,
            DepKind::AfterAny | DepKind::AfterNotOk => ended,
        };
        if !met && waiting.is_none() {
            let until = match dependency.kind {
                DepKind::AfterOk => "to complete",
                DepKind::AfterAny => "to end",
                DepKind::AfterNotOk => "to end without completing",
            };
            waiting = Some(format!("waits for job {id} {until} ({kind})"));
        }
    }
    if let Some(reason) = waiting {
        return DepState::Waiting(reason);
    }
    match singleton_holder.filter(|_| job.spec.singleton) {
        Some(holder) => DepState::Waiting(format!(
            "waits for job {holder}, of the same user and name, to end (singleton)"
        )),
        None => DepState::Met,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Timestamp;
    use crate::testing::job_builder;

    fn job_in(id: u64, state: JobState) -> Job {
        let mut job = job_builder(JobId(id)).build();
        job.state = state;
        job
    }

    fn parse(text: &str) -> Result<(Vec<Dependency>, bool), SpecError> {
        parse_dependencies(text, &|name| (name == "prep").then_some(DepTarget::InRequest(1)))
    }

    #[test]
    fn parses_sbatch_dependency_lists() {
        let (deps, singleton) = parse("afterok:3:4,afterany:prep,singleton").unwrap();
        assert!(singleton);
        assert_eq!(
            deps.iter().map(|d| (d.kind, d.target)).collect::<Vec<_>>(),
            [
                (DepKind::AfterOk, DepTarget::Job(JobId(3))),
                (DepKind::AfterOk, DepTarget::Job(JobId(4))),
                (DepKind::AfterAny, DepTarget::InRequest(1)),
            ]
        );
        assert!(parse("after:3").unwrap_err().reason.contains("not afterok"));
        assert!(parse("afterok").unwrap_err().reason.contains("names no job"));
        assert!(parse("afterok:train").unwrap_err().reason.contains("\"train\""));
    }

    #[test]
    fn waits_runs_or_never_runs() {
        let (deps, _) = parse("afterok:1,afternotok:2").unwrap();
        let mut job = job_builder(JobId(9)).build();
        std::sync::Arc::make_mut(&mut job.spec).dependencies = deps;
        let done = JobState::Completed {
            started_at: Timestamp(0),
            ended_at: Timestamp(1),
        };
        let failed = JobState::Failed {
            started_at: None,
            ended_at: Timestamp(1),
            exit_code: Some(1),
            reason: String::new(),
        };
        let others = |one: JobState, two: JobState| vec![job_in(1, one), job_in(2, two)];
        let state = |others: &Vec<Job>| dependency_state(&job, |id| others.iter().find(|j| j.id == id), None);
        assert_eq!(
            state(&others(JobState::Pending, JobState::Pending)),
            DepState::Waiting("waits for job 1 to complete (afterok)".into())
        );
        assert_eq!(state(&others(done.clone(), failed.clone())), DepState::Met);
        assert_eq!(
            state(&others(failed.clone(), failed.clone())),
            DepState::Never("job 1 ended failed, and it was to complete (afterok)".into())
        );
        assert_eq!(
            state(&others(done.clone(), done.clone())),
            DepState::Never("job 2 completed, and it was not to (afternotok)".into())
        );
        assert!(matches!(state(&vec![]), DepState::Never(reason) if reason.contains("does not exist")));
        let spec = std::sync::Arc::make_mut(&mut job.spec);
        spec.dependencies.clear();
        spec.singleton = true;
        assert!(matches!(
            dependency_state(&job, |_| None, Some(JobId(4))),
            DepState::Waiting(reason) if reason.contains("job 4")
        ));
        assert_eq!(dependency_state(&job, |_| None, None), DepState::Met);
    }
}
