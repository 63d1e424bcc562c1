//! One module per subcommand; `Ctx` carries what every one of them needs.

pub mod access;
pub mod cancel;
pub mod checkpoint;
pub mod history;
pub mod jobs;
pub mod logs;
pub mod nodes;
pub mod pki;
pub mod report;
pub mod reservation;
pub mod sharing;
pub mod sim;
pub mod submit;
pub mod terminal;

use crate::client::{self, Client};
use crate::{CliError, Output};

pub struct Ctx {
    pub server: Option<String>,
    pub output: Output,
    /// For connecting and for each answer; `None`: wait as long as it takes.
    pub timeout: Option<std::time::Duration>,
}

/// A connected client and the address it reached.
pub struct Connection {
    pub client: Client,
    pub addr: String,
}

impl Connection {
    pub fn refused(&self, status: tonic::Status) -> CliError {
        CliError::from_status(&self.addr, status)
    }

    /// The user gpoold takes the caller to be (`--me`, `history`).
    pub async fn my_name(&mut self) -> Result<String, CliError> {
        let me = self.client.who_am_i(gpool_proto::pb::WhoAmIRequest {}).await;
        Ok(me.map_err(|s| self.refused(s))?.into_inner().user)
    }
}

impl Ctx {
    pub async fn connect(&self) -> Result<Connection, CliError> {
        let addr = client::resolve_address(self.server.clone())?;
        let client = client::connect(&addr, self.timeout).await?;
        Ok(Connection { client, addr })
    }

    pub fn json(&self) -> bool {
        self.output == Output::Json
    }
}

/// What `gpool show` shows: a job, or a node (any name that is no job id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShowTarget {
    Job(JobRef),
    Node(String),
}

/// A job id, else a node's name (clap's value parser for `gpool show`).
pub fn parse_show_target(text: &str) -> Result<ShowTarget, String> {
    match parse_job_ref(text) {
        Ok(job) => Ok(ShowTarget::Job(job)),
        Err(_) if text.trim().is_empty() => Err("give a job id or a node's name".to_string()),
        Err(_) => Ok(ShowTarget::Node(text.to_string())),
    }
}

/// `gpool show`: a job, or a node.
pub async fn show(ctx: &Ctx, target: ShowTarget, with_env: bool) -> Result<(), CliError> {
    match target {
        ShowTarget::Job(id) => jobs::show(ctx, id, with_env).await,
        ShowTarget::Node(name) => nodes::show(ctx, &name).await,
    }
}

/// A job as users name it: `123`, `123_4` for the task with index 4 of
/// array 123, or `100-110` for the ids from 100 to 110.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobRef {
    Job(u64),
    Task { array: u64, index: u32 },
    Range { first: u64, last: u64 },
}

/// Most ids one `100-110` range may name.
const MAX_ID_RANGE: u64 = 100_000;

impl std::fmt::Display for JobRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobRef::Job(id) => write!(f, "{id}"),
            JobRef::Task { array, index } => write!(f, "{array}_{index}"),
            JobRef::Range { first, last } => write!(f, "{first}-{last}"),
        }
    }
}

/// Parses `123`, `123_4` or `100-110` (clap's value parser for job ids).
pub fn parse_job_ref(text: &str) -> Result<JobRef, String> {
    let bad = || format!("{text:?} is not a job id (such as 123, 123_4 for task 4 of array 123, or 100-110)");
    if let Some((first, last)) = text.split_once('-') {
        let (first, last): (u64, u64) = (first.parse().map_err(|_| bad())?, last.parse().map_err(|_| bad())?);
        if last < first || last - first >= MAX_ID_RANGE {
            return Err(format!(
                "{text:?}: a range of ids goes up, and names at most {MAX_ID_RANGE}"
            ));
        }
        return Ok(JobRef::Range { first, last });
    }
    match text.split_once('_') {
        Some((array, index)) => Ok(JobRef::Task {
            array: array.parse().map_err(|_| bad())?,
            index: index.parse().map_err(|_| bad())?,
        }),
        None => text.parse().map(JobRef::Job).map_err(|_| bad()),
    }
}

impl Connection {
    /// The ids gpoold knows the jobs by: a task's is reserved after its
    /// array's, at its position among the array's indices.
    /// As `resolve`, with the name each array task was given by (`74_3`),
    /// so that answers name it as its user did.
    pub async fn resolve_named(
        &mut self,
        refs: &[JobRef],
    ) -> Result<(Vec<u64>, std::collections::HashMap<u64, String>), CliError> {
        let ids = self.resolve(refs).await?;
        let mut names = std::collections::HashMap::new();
        for job_ref in refs.iter().filter(|job_ref| matches!(job_ref, JobRef::Task { .. })) {
            if let Some(id) = self.resolve(std::slice::from_ref(job_ref)).await?.first() {
                names.insert(*id, job_ref.to_string());
            }
        }
        Ok((ids, names))
    }

    pub async fn resolve(&mut self, refs: &[JobRef]) -> Result<Vec<u64>, CliError> {
        let mut arrays: std::collections::HashMap<u64, gpool_core::array::ArraySpec> = Default::default();
        let mut ids = Vec::with_capacity(refs.len());
        for job_ref in refs {
            let (array, index) = match *job_ref {
                JobRef::Job(id) => {
                    ids.push(id);
                    continue;
                }
                JobRef::Range { first, last } => {
                    ids.extend(first..=last);
                    continue;
                }
                JobRef::Task { array, index } => (array, index),
            };
            if let std::collections::hash_map::Entry::Vacant(entry) = arrays.entry(array) {
                let job = self.client.get_job(gpool_proto::pb::GetJobRequest { id: array }).await;
                let job = job.map_err(|s| self.refused(s))?.into_inner();
                let spec = job.spec.map(gpool_proto::convert::spec_from_wire);
                let Some(spec) = spec.and_then(|spec| spec.array) else {
                    return Err(CliError::Usage(format!("{job_ref}: job {array} is not an array")));
                };
                entry.insert(*spec);
            }
            let spec = &arrays[&array];
            let Some(position) = spec.position_of(index) else {
                return Err(CliError::Usage(format!(
                    "{job_ref}: array {array} has no task {index} (its indices are {spec})"
                )));
            };
            ids.push(gpool_core::array::task_id(gpool_core::JobId(array), position).0);
        }
        Ok(ids)
    }
}

/// How the CLI prints a job's id: `123_4` for a task, `123_[5-999]` for an
/// array's record (the indices of its tasks still waiting, else all).
pub fn display_id(job: &gpool_proto::pb::Job) -> String {
    if let Some(index) = job.array_task_index {
        return format!("{}_{index}", job.array_job_id);
    }
    match &job.array {
        Some(info) if info.waiting > 0 => format!("{}_[{}]", job.id, info.waiting_indices),
        Some(_) => {
            let spec = job.spec.clone().map(gpool_proto::convert::spec_from_wire);
            match spec.and_then(|spec| spec.array) {
                Some(array) => {
                    let indices = array.to_string();
                    let indices = indices.split('%').next().unwrap_or_default().to_string();
                    format!("{}_[{indices}]", job.id)
                }
                None => job.id.to_string(),
            }
        }
        None => job.id.to_string(),
    }
}

/// `90d`, `12h`, `1y`, `30s`: seconds.
pub fn parse_validity(text: &str) -> Result<u64, String> {
    humantime::parse_duration(text)
        .map(|duration| duration.as_secs())
        .map_err(|err| format!("{text:?} is not a duration such as 90d: {err}"))
}

pub fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    if text.trim() == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    humantime::parse_duration(text).map_err(|err| format!("{text:?} is not a duration such as 30s, or 0: {err}"))
}
