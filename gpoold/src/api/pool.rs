//! The Pool service: what the CLI calls.

use super::caller;
use crate::error::Error;
use crate::state::{Command, SharedState, State, StateHandle};
use gpool_core::model::Node;
use gpool_core::JobId;
use gpool_proto::convert::{job_to_wire, node_to_wire, spec_from_wire, state_to_wire};
use gpool_proto::pb;
use gpool_proto::pb::pool_server::Pool;
use std::pin::Pin;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct PoolService {
    pub state: StateHandle,
    pub logs: super::LogRelay,
    /// gpoold.toml, re-read by ReloadPolicy; `None` in dev mode.
    pub config_path: Option<std::path::PathBuf>,
}

type JobStream = Pin<Box<dyn Stream<Item = Result<pb::Job, Status>> + Send>>;
type LogStream = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send>>;
type JobListStream = Pin<Box<dyn Stream<Item = Result<pb::ListJobsResponse, Status>> + Send>>;

/// Jobs per ListJobs message, and most jobs looked at under one read lock.
const LIST_CHUNK: usize = 128;
const LIST_SCAN: usize = 8 * LIST_CHUNK;

/// The next chunk of jobs matching `filter` from `*next_id` on; advances
/// `*next_id` and says whether jobs remain to be looked at.
fn list_chunk(shared: &SharedState, filter: &pb::ListJobsRequest, next_id: &mut JobId) -> (Vec<pb::Job>, bool) {
    let wanted_states: Vec<pb::JobState> = filter.states().collect();
    let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut chunk = Vec::with_capacity(LIST_CHUNK);
    let mut n_scanned = 0;
    for job in state.jobs.range(*next_id..).map(|(_, job)| job) {
        *next_id = JobId(job.id.0 + 1);
        n_scanned += 1;
        let state_ok = if wanted_states.is_empty() {
            filter.all || !job.state.is_finished()
        } else {
            wanted_states.contains(&state_to_wire(&job.state))
        };
        if state_ok
            && (filter.team.is_empty() || job.spec.team == filter.team)
            && (filter.user.is_empty() || job.user == filter.user)
        {
            chunk.push(job_wire(&state, job));
        }
        if chunk.len() == LIST_CHUNK || n_scanned == LIST_SCAN {
            return (chunk, true);
        }
    }
    (chunk, false)
}

impl PoolService {
    fn job(&self, id: JobId) -> Result<pb::Job, Status> {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let job = state.jobs.get(&id).ok_or(Error::UnknownJob(id))?;
        Ok(job_wire(&state, job))
    }
}

/// A job as the API shows it: a pending one with the reasons, hints and
/// priority of the latest scheduling cycle.
fn job_wire(state: &State, job: &gpool_core::Job) -> pb::Job {
    if job.state != gpool_core::JobState::Pending {
        return job_to_wire(job, Vec::new());
    }
    let reasons = state
        .pending_reasons
        .get(&job.id)
        .map(|words| words.to_vec())
        .unwrap_or_else(|| vec!["waiting for the next scheduling cycle".to_string()]);
    let mut wire = job_to_wire(job, reasons);
    wire.hints = state
        .pending_hints
        .get(&job.id)
        .map(|words| words.to_vec())
        .unwrap_or_default();
    wire.priority = state.priorities.get(&job.id).map(|p| pb::PriorityFactors {
        total: p.total,
        qos: p.qos,
        fair_share: p.fair_share,
        age: p.age,
        size: p.size,
        nice: p.nice,
    });
    wire.estimated_start_ms = state.estimated_starts.get(&job.id).map(|at| at.0);
    wire
}

#[tonic::async_trait]
impl Pool for PoolService {
    async fn submit_jobs(
        &self,
        request: Request<pb::SubmitJobsRequest>,
    ) -> Result<Response<pb::SubmitJobsResponse>, Status> {
        let user = caller(&request)?;
        let specs = request.into_inner().specs.into_iter().map(spec_from_wire).collect();
        let ids = self.state.call(|reply| Command::Submit { user, specs, reply }).await?;
        Ok(Response::new(pb::SubmitJobsResponse {
            ids: ids.into_iter().map(|id| id.0).collect(),
        }))
    }

    async fn cancel_jobs(
        &self,
        request: Request<pb::CancelJobsRequest>,
    ) -> Result<Response<pb::CancelJobsResponse>, Status> {
        let user = caller(&request)?;
        let request = request.into_inner();
        if request.signal != 0 {
            gpool_core::spec::parse_signal(&request.signal.to_string()).map_err(|reason| Error::InvalidRequest {
                field: "signal",
                reason,
            })?;
        }
        let ids = request.ids.into_iter().map(JobId).collect();
        let signal = (request.signal != 0).then_some(request.signal);
        let outcomes = self
            .state
            .call(|reply| Command::Cancel {
                user,
                ids,
                signal,
                reply,
            })
            .await?;
        let outcomes = outcomes
            .into_iter()
            .map(|o| pb::CancelOutcome {
                id: o.id.0,
                state: state_to_wire(&o.state).into(),
                cancelled: o.cancelled,
                signalled: o.signalled,
            })
            .collect();
        Ok(Response::new(pb::CancelJobsResponse { outcomes }))
    }

    async fn get_job(&self, request: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        caller(&request)?;
        Ok(Response::new(self.job(JobId(request.get_ref().id))?))
    }

    type ListJobsStream = JobListStream;

    async fn list_jobs(&self, request: Request<pb::ListJobsRequest>) -> Result<Response<JobListStream>, Status> {
        caller(&request)?;
        let filter = request.into_inner();
        if let Some(bad) = filter.states.iter().find(|raw| pb::JobState::try_from(**raw).is_err()) {
            return Err(Error::InvalidRequest {
                field: "states",
                reason: format!("{bad} is not a job state"),
            }
            .into());
        }
        let shared = self.state.shared.clone();
        let (sender, receiver) = tokio::sync::mpsc::channel(2);
        // Chunks are built under short read locks, so a long listing neither
        // blocks the state task nor builds one huge message.
        tokio::spawn(async move {
            let mut next_id = JobId(0);
            loop {
                let (chunk, more) = list_chunk(&shared, &filter, &mut next_id);
                if !chunk.is_empty() && sender.send(Ok(pb::ListJobsResponse { jobs: chunk })).await.is_err() {
                    return;
                }
                if !more {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(
            receiver,
        ))))
    }

    type JobLogsStream = LogStream;

    async fn job_logs(&self, request: Request<pb::JobLogsRequest>) -> Result<Response<LogStream>, Status> {
        caller(&request)?;
        let pb::JobLogsRequest { id, stderr, follow } = request.into_inner();
        let (node, attempt) = self.log_source(JobId(id))?;
        let (request_id, receiver) = self.logs.open();
        let read_log = pb::ReadLog {
            request_id,
            job_id: id,
            attempt,
            stderr,
            follow,
        };
        let message = pb::ControllerMessage {
            msg: Some(pb::controller_message::Msg::ReadLog(read_log)),
        };
        if let Err(err) = self.state.call(|reply| Command::ToAgent { node, message, reply }).await {
            self.logs.close(request_id);
            return Err(err.into());
        }
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(
            receiver,
        ))))
    }

    async fn report_checkpoint(
        &self,
        request: Request<pb::ReportCheckpointRequest>,
    ) -> Result<Response<pb::ReportCheckpointResponse>, Status> {
        let user = caller(&request)?;
        let pb::ReportCheckpointRequest { job_id, attempt } = request.into_inner();
        let outcome = self
            .state
            .call(|reply| Command::Checkpoint {
                user,
                job: JobId(job_id),
                attempt,
                reply,
            })
            .await?;
        Ok(Response::new(pb::ReportCheckpointResponse {
            preempted: outcome.preempted,
        }))
    }

    async fn get_usage(&self, request: Request<pb::GetUsageRequest>) -> Result<Response<pb::GetUsageResponse>, Status> {
        caller(&request)?;
        let wanted = request.into_inner().team;
        let now = crate::wall_clock();
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let running = state.running_jobs();
        let running_use: Vec<gpool_core::policy::RunningUse> = running
            .iter()
            .map(|job| gpool_core::policy::RunningUse {
                team: &job.team,
                gpus: job.gpus(),
                started_at: job.started_at,
                burst: job.burst,
            })
            .collect();
        let report = gpool_core::policy::usage_report(&state.policy.sharing, &state.usage, &running_use, now);
        if !wanted.is_empty() && report.iter().all(|team| team.team != wanted) {
            return Err(Error::InvalidRequest {
                field: "team",
                reason: format!("no team {wanted:?} is configured or has used the pool"),
            }
            .into());
        }
        let teams = report
            .into_iter()
            .filter(|team| wanted.is_empty() || team.team == wanted)
            .map(|team| pb::TeamUsage {
                team: team.team,
                shares: team.shares,
                guaranteed_gpus: team.guaranteed_gpus,
                guaranteed_gpu_hours: team.guaranteed_gpu_hours,
                burst_gpu_hours: team.burst_gpu_hours,
                gpu_hours_budget: team.gpu_hours_budget,
                budget_left_gpu_hours: team.budget_left_gpu_hours,
                gpus_in_use: team.gpus_in_use,
                guaranteed_gpus_in_use: team.guaranteed_gpus_in_use,
                fair_share: team.fair_share,
                period_start_ms: team.period_start.0,
            })
            .collect();
        Ok(Response::new(pb::GetUsageResponse { teams }))
    }

    async fn reload_policy(
        &self,
        request: Request<pb::ReloadPolicyRequest>,
    ) -> Result<Response<pb::ReloadPolicyResponse>, Status> {
        let user = caller(&request)?;
        let Some(path) = self.config_path.clone() else {
            return Err(Status::failed_precondition(
                "gpoold runs without a config file (dev mode): there is no policy to reload",
            ));
        };
        let config = crate::config::Config::load(&path).map_err(|err| Status::invalid_argument(err.to_string()))?;
        let summary = self
            .state
            .call(|reply| Command::Reload {
                user: Some(user),
                config: Box::new(config),
                reply,
            })
            .await?;
        Ok(Response::new(pb::ReloadPolicyResponse { summary }))
    }

    type WatchJobsStream = JobStream;

    async fn watch_jobs(&self, request: Request<pb::WatchJobsRequest>) -> Result<Response<JobStream>, Status> {
        caller(&request)?;
        // Subscribed before the first read, so no change falls between.
        let mut changes = self.state.job_changes.subscribe();
        let mut unfinished = std::collections::BTreeSet::new();
        let mut first = Vec::with_capacity(request.get_ref().ids.len());
        for &id in &request.get_ref().ids {
            let job = self.job(JobId(id))?;
            if !is_finished(&job) {
                unfinished.insert(JobId(id));
            }
            first.push(job);
        }
        let (sender, receiver) = tokio::sync::mpsc::channel(LIST_CHUNK);
        let service = PoolService {
            state: self.state.clone(),
            logs: self.logs.clone(),
            config_path: None,
        };
        tokio::spawn(async move {
            for job in first {
                if sender.send(Ok(job)).await.is_err() {
                    return;
                }
            }
            while !unfinished.is_empty() {
                let changed: Vec<JobId> = tokio::select! {
                    () = sender.closed() => return,
                    change = changes.recv() => match change {
                        Ok(id) if unfinished.contains(&id) => vec![id],
                        Ok(_) => continue,
                        // Missed changes: send each unfinished job again.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => unfinished.iter().copied().collect(),
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                };
                for id in changed {
                    let job = service.job(id);
                    if job.as_ref().map_or(true, is_finished) {
                        unfinished.remove(&id);
                    }
                    if sender.send(job).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(
            receiver,
        ))))
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        caller(&request)?;
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let nodes = nodes_to_wire(&state, state.nodes.values());
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn drain_node(&self, request: Request<pb::DrainNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let user = caller(&request)?;
        let pb::DrainNodeRequest { name, reason, now } = request.into_inner();
        if reason.trim().is_empty() {
            return Err(Error::InvalidRequest {
                field: "reason",
                reason: "say why the node is drained".into(),
            }
            .into());
        }
        let node = self
            .state
            .call(|reply| Command::Drain {
                user,
                node: name,
                reason,
                at_once: now,
                reply,
            })
            .await?;
        Ok(Response::new(self.node_to_wire(&node)))
    }

    async fn resume_node(&self, request: Request<pb::ResumeNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let user = caller(&request)?;
        let name = request.into_inner().name;
        let node = self
            .state
            .call(|reply| Command::Resume {
                user,
                node: name,
                reply,
            })
            .await?;
        Ok(Response::new(self.node_to_wire(&node)))
    }
}

impl PoolService {
    /// Where a job's output is: rank 0's node and the latest attempt.
    fn log_source(&self, id: JobId) -> Result<(String, u32), Status> {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let job = state.jobs.get(&id).ok_or(Error::UnknownJob(id))?;
        if job.spec.discard_output {
            return Err(Error::OutputDiscarded(id).into());
        }
        match job.last_nodes.first() {
            Some(node) if job.n_attempts > 0 => Ok((node.clone(), job.n_attempts)),
            _ => Err(Error::NotStarted(id).into()),
        }
    }

    fn node_to_wire(&self, node: &Node) -> pb::Node {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        nodes_to_wire(&state, std::iter::once(node)).remove(0)
    }
}

/// Nodes as the API shows them: which job holds each GPU, and its latest
/// heartbeat sample.
fn nodes_to_wire<'a>(state: &State, nodes: impl Iterator<Item = &'a Node>) -> Vec<pb::Node> {
    let holders = state.gpu_holders();
    nodes
        .map(|node| {
            let mut wire = node_to_wire(node, |gpu_idx| {
                holders.get(&(node.name.as_str(), gpu_idx)).map(|id| id.0)
            });
            let samples = state.gpu_samples.get(&node.name).map_or(&[][..], Vec::as_slice);
            for gpu in &mut wire.gpus {
                gpu.sample = samples.iter().find(|sample| sample.index == gpu.index).copied();
            }
            wire
        })
        .collect()
}

fn is_finished(job: &pb::Job) -> bool {
    matches!(
        job.state(),
        pb::JobState::Completed | pb::JobState::Failed | pb::JobState::Cancelled
    )
}
