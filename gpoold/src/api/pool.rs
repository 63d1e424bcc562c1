//! The Pool service: what the CLI calls.

use super::job_wire::job_wire;
use super::{caller, identity, Identity};
use crate::error::Error;
use crate::security::{AuditEntry, Security};
use crate::state::{CancelMode, CancelOutcome, Command, JobUpdate, NewToken, SharedState, State, StateHandle};
use gpool_core::auth::{authorize, Action, Caller, Role};
use gpool_core::model::Node;
use gpool_core::JobId;
use gpool_proto::convert::{node_to_wire, spec_from_wire, state_to_wire};
use gpool_proto::pb;
use gpool_proto::pb::pool_server::Pool;
use prost::Message;
use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

#[derive(Clone)]
pub struct PoolService {
    pub state: StateHandle,
    pub logs: super::LogRelay,
    /// gpoold.toml, re-read by ReloadPolicy; `None` in dev mode.
    pub config_path: Option<std::path::PathBuf>,
    pub security: Arc<Security>,
    pub reports: crate::reports::Reports,
}

type JobStream = Pin<Box<dyn Stream<Item = Result<pb::Job, Status>> + Send>>;
type LogStream = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send>>;
type JobListStream = Pin<Box<dyn Stream<Item = Result<pb::ListJobsResponse, Status>> + Send>>;

/// Jobs per ListJobs message, and most jobs looked at under one read lock.
const LIST_CHUNK: usize = 128;
const LIST_SCAN: usize = 8 * LIST_CHUNK;

/// The next chunk of jobs matching `filter` from `*next_id` on; advances
/// `*next_id` and says whether jobs remain to be looked at.
fn list_chunk(
    shared: &SharedState,
    caller: &Caller,
    filter: &pb::ListJobsRequest,
    next_id: &mut JobId,
) -> Result<(Vec<pb::Job>, bool), Error> {
    let wanted_states: Vec<pb::JobState> = filter.states().collect();
    let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut chunk = Vec::with_capacity(LIST_CHUNK);
    let mut n_scanned = 0;
    // Pending and running jobs only: the jobs that have not ended are
    // looked at, not the whole history (which is read from disk).
    let active_only = if wanted_states.is_empty() {
        !filter.all
    } else {
        wanted_states
            .iter()
            .all(|wanted| matches!(wanted, pb::JobState::Pending | pb::JobState::Running))
    };
    let jobs: Box<dyn Iterator<Item = Result<Cow<'_, gpool_core::Job>, Error>>> = if active_only {
        Box::new(state.active_jobs_from(*next_id).map(|job| Ok(Cow::Borrowed(job))))
    } else {
        Box::new(state.jobs_from(*next_id))
    };
    for job in jobs {
        let job = job?;
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
            // A listing shows no environment: leaving it out keeps the
            // messages small (`gpool show` has it).
            let wire = job_wire(&state, &job, caller, false);
            chunk.push(wire);
        }
        if chunk.len() == LIST_CHUNK || n_scanned == LIST_SCAN {
            return Ok((chunk, true));
        }
    }
    Ok((chunk, false))
}

impl PoolService {
    /// Job `id` as `caller` may see it, with its environment or not (a
    /// watch sends none, as a listing).
    fn job(&self, id: JobId, caller: &Caller, with_env: bool) -> Result<pb::Job, Status> {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let found = if with_env {
            state.find_job_with_env(id)?
        } else {
            state.find_job(id)?
        };
        let job = found.ok_or(Error::UnknownJob(id))?;
        Ok(job_wire(&state, &job, caller, with_env))
    }

    /// `ids` split into those of jobs in memory (and tasks of arrays in
    /// memory), which the state task acts on, and the rest.
    fn split_live(&self, ids: &[JobId]) -> (Vec<JobId>, Vec<JobId>) {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        ids.iter()
            .partition(|id| state.job(**id).is_some() || state.virtual_task(**id).is_some())
    }

    /// What a cancel (hold, signal...) of `ids`, none of them a job in
    /// memory, comes to: unknown, refused, or ended already. Read a few at
    /// a time under the state's read lock, on a blocking thread; ids past
    /// the last one ever given out are unknown without a look.
    async fn outcomes_off_task(&self, ids: Vec<JobId>, caller: &Caller, mode: CancelMode) -> Vec<CancelOutcome> {
        const CHUNK: usize = 64;
        let mut outcomes = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            let (shared, chunk, caller) = (self.state.shared.clone(), chunk.to_vec(), caller.clone());
            let looked_up = tokio::task::spawn_blocking(move || {
                let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
                chunk
                    .into_iter()
                    .map(|id| ended_outcome(&state, id, &caller, mode))
                    .collect::<Vec<_>>()
            })
            .await;
            match looked_up {
                Ok(found) => outcomes.extend(found),
                Err(err) => tracing::warn!("looking up ended jobs: {err}"),
            }
        }
        outcomes
    }

    /// Writes an audit line for `action` on `object`: always for admin
    /// actions, and for any request refused for want of permission.
    fn audit<T>(&self, who: &Identity, action: &str, object: &str, admin_action: bool, result: &Result<T, Status>) {
        let outcome = match result {
            Ok(_) if admin_action => "allowed".to_string(),
            Ok(_) => return,
            Err(status) if admin_action || status.code() == tonic::Code::PermissionDenied => {
                format!("refused: {}", status.message())
            }
            Err(_) => return,
        };
        self.security.audit(&AuditEntry {
            at: crate::security::now_text(),
            caller: &who.caller.user,
            via: &who.via,
            peer: &who.peer,
            action,
            object,
            outcome,
        });
    }
}

impl PoolService {
    /// Applies `change` for `who` (audited as `action` of `object`).
    async fn change_reservation(
        &self,
        who: &Identity,
        change: crate::state::ReservationChange,
        action: &str,
        object: &str,
    ) -> Result<Response<pb::Reservation>, Status> {
        let caller = who.caller.clone();
        let result = self
            .state
            .call(|reply| Command::Reservation { caller, change, reply })
            .await
            .map_err(Status::from);
        self.audit(who, action, object, true, &result);
        Ok(Response::new(reservation_to_wire(&result?, true)))
    }
}

/// A reservation on the wire; `created`: made by `gpool reservation
/// create` (else gpoold.toml's).
fn reservation_to_wire(r: &gpool_core::sched::reservations::Reservation, created: bool) -> pb::Reservation {
    pb::Reservation {
        name: r.name.clone(),
        nodes: r.nodes.clone(),
        start_ms: r.start.0,
        end_ms: r.end.0,
        users: r.users.clone(),
        teams: r.teams.clone(),
        created,
    }
}

/// Refuses a request naming more job ids than one may.
fn check_id_count(n_ids: usize) -> Result<(), Status> {
    if n_ids > gpool_core::ids::MAX_IDS_PER_REQUEST {
        return Err(Error::InvalidRequest {
            field: "ids",
            reason: format!(
                "{n_ids} job ids in one request; at most {} (send the rest in further requests)",
                gpool_core::ids::MAX_IDS_PER_REQUEST
            ),
        }
        .into());
    }
    Ok(())
}

/// The outcome of cancelling (holding, signalling...) `id`, a job not in
/// memory: it never was, the caller may not touch it, or it ended.
fn ended_outcome(state: &crate::state::State, id: JobId, caller: &Caller, mode: CancelMode) -> CancelOutcome {
    let unknown = CancelOutcome {
        id,
        refused: Some(Error::UnknownJob(id)),
        ..CancelOutcome::default()
    };
    if id.0 >= state.next_job_id() {
        return unknown;
    }
    let job = match state.find_job(id) {
        Ok(Some(job)) => job,
        Ok(None) => return unknown,
        Err(err) => {
            return CancelOutcome {
                id,
                refused: Some(err),
                ..CancelOutcome::default()
            }
        }
    };
    let action = match mode {
        CancelMode::Signal(_) => Action::SignalJob(job.auth_ref()),
        _ => Action::CancelJob(job.auth_ref()),
    };
    CancelOutcome {
        id,
        state: Some(job.state.clone()),
        refused: authorize(caller, &action).err().map(Error::from),
        ..CancelOutcome::default()
    }
}

fn outcomes_to_wire(outcomes: Vec<CancelOutcome>) -> pb::CancelJobsResponse {
    let outcomes = outcomes
        .into_iter()
        .map(|o| pb::CancelOutcome {
            id: o.id.0,
            state: o.state.as_ref().map_or(pb::JobState::Unspecified, state_to_wire).into(),
            cancelled: o.cancelled,
            signalled: o.signalled,
            error: o.refused.map(|err| err.to_string()).unwrap_or_default(),
            held: o.held,
            requeued: o.requeued,
            updated: o.updated,
        })
        .collect();
    pb::CancelJobsResponse { outcomes }
}

#[tonic::async_trait]
impl Pool for PoolService {
    async fn submit_jobs(
        &self,
        request: Request<pb::SubmitJobsRequest>,
    ) -> Result<Response<pb::SubmitJobsResponse>, Status> {
        let who = identity(&request)?;
        let caller = who.caller.clone();
        let request = request.into_inner();
        // Decoded a spec at a time, from the request's own buffer; a spec
        // the same as the one before it (a file of alike jobs) is decoded,
        // checked and held once.
        let mut specs: Vec<std::sync::Arc<gpool_core::model::JobSpec>> = Vec::with_capacity(request.specs.len());
        let n_specs = request.specs.len();
        for (spec_idx, encoded) in request.specs.iter().enumerate() {
            if let Some(last) = specs
                .last()
                .filter(|_| spec_idx > 0 && request.specs[spec_idx - 1] == *encoded)
            {
                specs.push(last.clone());
                continue;
            }
            let spec = pb::JobSpec::decode(encoded.clone()).map_err(|err| Error::InvalidRequest {
                field: "specs",
                reason: format!("spec {} of {n_specs}: {err}", spec_idx + 1),
            })?;
            if !spec.nvlink.is_empty() && gpool_core::model::NvlinkNeed::parse(&spec.nvlink).is_err() {
                return Err(Error::InvalidRequest {
                    field: "nvlink",
                    reason: format!(
                        "spec {} of {n_specs}: {:?} is not required, preferred or any",
                        spec_idx + 1,
                        spec.nvlink
                    ),
                }
                .into());
            }
            specs.push(std::sync::Arc::new(spec_from_wire(spec)));
        }
        drop(request);
        let result = self
            .state
            .call(|reply| Command::Submit { caller, specs, reply })
            .await
            .map_err(Status::from);
        self.audit(&who, "submit", "", false, &result);
        Ok(Response::new(pb::SubmitJobsResponse {
            ids: result?.into_iter().map(|id| id.0).collect(),
        }))
    }

    async fn cancel_jobs(
        &self,
        request: Request<pb::CancelJobsRequest>,
    ) -> Result<Response<pb::CancelJobsResponse>, Status> {
        let who = identity(&request)?;
        let caller = who.caller.clone();
        let request = request.into_inner();
        if request.signal != 0 {
            gpool_core::spec::parse_signal(&request.signal.to_string()).map_err(|reason| Error::InvalidRequest {
                field: "signal",
                reason,
            })?;
        }
        let mode = match (request.signal, request.hold(), request.requeue) {
            (0, pb::HoldChange::None, false) if request.pending_only => CancelMode::CancelPending,
            (0, pb::HoldChange::None, false) => CancelMode::Cancel,
            (0, pb::HoldChange::Hold, false) => CancelMode::Hold(true),
            (0, pb::HoldChange::Release, false) => CancelMode::Hold(false),
            (0, pb::HoldChange::None, true) => CancelMode::Requeue,
            (signal, pb::HoldChange::None, false) => CancelMode::Signal(signal),
            _ => {
                return Err(Error::InvalidRequest {
                    field: "signal",
                    reason: "a request signals, holds, releases or requeues jobs, one of them".into(),
                }
                .into())
            }
        };
        let ids: Vec<JobId> = request.ids.into_iter().map(JobId).collect();
        check_id_count(ids.len())?;
        let object = ids.iter().map(|id| format!("job {id}")).collect::<Vec<_>>().join(" ");
        // Ids of jobs that ended and left memory, or never were, are
        // answered here, from disk, off the state task: only jobs in
        // memory go to it, so a long list of old ids never holds up
        // heartbeats or other requests.
        let (live, elsewhere) = self.split_live(&ids);
        let answered = self.outcomes_off_task(elsewhere, &caller, mode).await;
        let result = if live.is_empty() && !ids.is_empty() {
            Ok(Vec::new())
        } else {
            self.state
                .call(|reply| Command::Cancel {
                    caller,
                    ids: live,
                    mode,
                    reply,
                })
                .await
                .map_err(Status::from)
        };
        let result = result.map(|mut outcomes| {
            outcomes.extend(answered);
            let position: std::collections::HashMap<JobId, usize> =
                ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
            outcomes.sort_by_key(|outcome| position.get(&outcome.id).copied().unwrap_or(usize::MAX));
            outcomes
        });
        let action = match mode {
            CancelMode::Signal(_) => "signal",
            CancelMode::Hold(true) => "hold",
            CancelMode::Hold(false) => "release",
            CancelMode::Requeue => "requeue",
            CancelMode::Cancel | CancelMode::CancelPending => "cancel",
        };
        self.audit(&who, action, &object, false, &result);
        let outcomes = result?;
        // Each refusal of one id is audited like a refused request.
        for outcome in outcomes.iter().filter(|o| matches!(o.refused, Some(Error::Denied(_)))) {
            let reason = outcome.refused.as_ref().map(ToString::to_string).unwrap_or_default();
            let refused: Result<(), Status> = Err(Status::permission_denied(reason));
            self.audit(&who, action, &format!("job {}", outcome.id), false, &refused);
        }
        Ok(Response::new(outcomes_to_wire(outcomes)))
    }

    async fn update_jobs(
        &self,
        request: Request<pb::UpdateJobsRequest>,
    ) -> Result<Response<pb::CancelJobsResponse>, Status> {
        let who = identity(&request)?;
        let caller = who.caller.clone();
        let request = request.into_inner();
        let change = JobUpdate {
            time_limit_secs: request.time_limit.map(|limit| limit.seconds),
            priority: request.priority,
            max_parallel: request.max_parallel.map(|max| (max != 0).then_some(max)),
        };
        let ids: Vec<JobId> = request.ids.into_iter().map(JobId).collect();
        let object = ids.iter().map(|id| format!("job {id}")).collect::<Vec<_>>().join(" ");
        let result = self
            .state
            .call(|reply| Command::Update {
                caller,
                ids,
                change,
                reply,
            })
            .await
            .map_err(Status::from);
        self.audit(&who, "update", &object, false, &result);
        let outcomes = result?;
        for outcome in outcomes.iter().filter(|o| matches!(o.refused, Some(Error::Denied(_)))) {
            let reason = outcome.refused.as_ref().map(ToString::to_string).unwrap_or_default();
            let refused: Result<(), Status> = Err(Status::permission_denied(reason));
            self.audit(&who, "update", &format!("job {}", outcome.id), false, &refused);
        }
        Ok(Response::new(outcomes_to_wire(outcomes)))
    }

    async fn get_job(&self, request: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        let caller = caller(&request)?;
        Ok(Response::new(self.job(JobId(request.get_ref().id), &caller, true)?))
    }

    type ListJobsStream = JobListStream;

    async fn list_jobs(&self, request: Request<pb::ListJobsRequest>) -> Result<Response<JobListStream>, Status> {
        let caller = caller(&request)?;
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
                let (chunk, more) = match list_chunk(&shared, &caller, &filter, &mut next_id) {
                    Ok(found) => found,
                    Err(err) => {
                        drop(sender.send(Err(err.into())).await);
                        return;
                    }
                };
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
        let who = identity(&request)?;
        let pb::JobLogsRequest {
            id,
            stderr,
            follow,
            rank,
            attempt,
        } = request.into_inner();
        let source = self.log_source(JobId(id), (rank, attempt), stderr, &who.caller);
        self.audit(&who, "logs", &format!("job {id}"), false, &source);
        let (node, attempt, epoch) = source?;
        let (request_id, receiver) = self.logs.open(&node);
        let read_log = pb::ReadLog {
            request_id,
            job_id: id,
            attempt,
            stderr,
            follow,
            epoch,
        };
        let message = pb::ControllerMessage {
            msg: Some(pb::controller_message::Msg::ReadLog(read_log)),
        };
        if let Err(err) = self.state.call(|reply| Command::ToAgent { node, message, reply }).await {
            self.logs.close(request_id);
            return Err(err.into());
        }
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::map(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
            |chunk| *chunk,
        ))))
    }

    async fn write_input(
        &self,
        request: Request<pb::WriteInputRequest>,
    ) -> Result<Response<pb::WriteInputResponse>, Status> {
        let who = identity(&request)?;
        let pb::WriteInputRequest { id, data } = request.into_inner();
        let target = self.input_target(JobId(id), &who.caller);
        // Keystrokes are not audited one by one: only a refusal is.
        self.audit(&who, "type", &format!("job {id}"), false, &target);
        let (node, epoch) = target?;
        let input = pb::TerminalInput {
            job_id: id,
            epoch,
            data,
        };
        let message = pb::ControllerMessage {
            msg: Some(pb::controller_message::Msg::Input(input)),
        };
        self.state
            .call(|reply| Command::ToAgent { node, message, reply })
            .await
            .map_err(Status::from)?;
        Ok(Response::new(pb::WriteInputResponse {}))
    }

    async fn report_checkpoint(
        &self,
        request: Request<pb::ReportCheckpointRequest>,
    ) -> Result<Response<pb::ReportCheckpointResponse>, Status> {
        let who = identity(&request)?;
        let caller = who.caller.clone();
        let pb::ReportCheckpointRequest { job_id, attempt } = request.into_inner();
        let result = self
            .state
            .call(|reply| Command::Checkpoint {
                caller,
                job: JobId(job_id),
                attempt,
                reply,
            })
            .await
            .map_err(Status::from);
        self.audit(&who, "checkpoint", &format!("job {job_id}"), false, &result);
        let outcome = result?;
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
        let report = state.usage_report(now);
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

    async fn get_report(&self, request: Request<pb::ReportRequest>) -> Result<Response<pb::ReportResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let mut by = Vec::new();
        for name in &request.by {
            let dimension = gpool_core::accounting::Dimension::parse(name)
                .map_err(|reason| Error::InvalidRequest { field: "by", reason })?;
            if by.contains(&dimension) {
                return Err(Error::InvalidRequest {
                    field: "by",
                    reason: format!("{dimension} is given twice"),
                }
                .into());
            }
            by.push(dimension);
        }
        let now = crate::wall_clock();
        let (since, until) = self.reports.window(request.since_ms, request.until_ms, now)?;
        let report = self.reports.report(&caller, since, until, &by, now).await?;
        Ok(Response::new(gpool_proto::convert::report_to_wire(&report)))
    }

    async fn get_savings(&self, request: Request<pb::ReportRequest>) -> Result<Response<pb::SavingsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let now = crate::wall_clock();
        let (since, until) = self.reports.window(request.since_ms, request.until_ms, now)?;
        let percentile = (request.percentile != 0.0).then_some(request.percentile);
        let savings = self.reports.savings(&caller, since, until, percentile, now).await?;
        Ok(Response::new(gpool_proto::convert::savings_to_wire(&savings)))
    }

    async fn reload_policy(
        &self,
        request: Request<pb::ReloadPolicyRequest>,
    ) -> Result<Response<pb::ReloadPolicyResponse>, Status> {
        let who = identity(&request)?;
        let result = self.reload(&who.caller).await;
        self.audit(&who, "reload", "policy", true, &result);
        let summary = result?;
        Ok(Response::new(pb::ReloadPolicyResponse { summary }))
    }

    async fn who_am_i(&self, request: Request<pb::WhoAmIRequest>) -> Result<Response<pb::WhoAmIResponse>, Status> {
        let who = identity(&request)?;
        Ok(Response::new(pb::WhoAmIResponse {
            user: who.caller.user,
            admin: who.caller.admin,
            led_teams: who.caller.led_teams,
            via: who.via,
        }))
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let who = identity(&request)?;
        let pb::CreateTokenRequest {
            user,
            role,
            teams,
            expires_in,
        } = request.into_inner();
        let object = format!("token for user {user}");
        let result = async {
            let request = NewToken {
                user: valid_user_name(user)?,
                role: if role.is_empty() {
                    Role::User
                } else {
                    Role::parse(&role).map_err(|reason| Error::InvalidRequest { field: "role", reason })?
                },
                teams,
                expires_in_secs: expires_in.map(|duration| duration.seconds),
                secret: crate::security::random_secret()?,
            };
            let caller = who.caller.clone();
            self.state
                .call(|reply| Command::CreateToken { caller, request, reply })
                .await
        }
        .await
        .map_err(Status::from);
        self.audit(&who, "token create", &object, true, &result);
        let (record, token) = result?;
        Ok(Response::new(pb::CreateTokenResponse {
            info: Some(token_info(&record)),
            token,
        }))
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        let who = identity(&request)?;
        let result = authorize(&who.caller, &Action::ManageTokens).map_err(|err| Status::from(Error::from(err)));
        self.audit(&who, "token list", "", false, &result);
        result?;
        let state = self.state.shared.read().unwrap_or_else(|p| p.into_inner());
        Ok(Response::new(pb::ListTokensResponse {
            tokens: state.tokens.values().map(token_info).collect(),
        }))
    }

    async fn revoke_token(&self, request: Request<pb::RevokeTokenRequest>) -> Result<Response<pb::TokenInfo>, Status> {
        let who = identity(&request)?;
        let caller = who.caller.clone();
        let id = request.into_inner().id;
        let result = self
            .state
            .call(|reply| Command::RevokeToken { caller, id, reply })
            .await
            .map_err(Status::from);
        self.audit(&who, "token revoke", &format!("token {id}"), true, &result);
        Ok(Response::new(token_info(&result?)))
    }

    async fn inject_fault(
        &self,
        request: Request<pb::InjectFaultRequest>,
    ) -> Result<Response<pb::InjectFaultResponse>, Status> {
        let who = identity(&request)?;
        let pb::InjectFaultRequest { node, fault } = request.into_inner();
        let object = format!("node {node}");
        let result = self.inject(&who.caller, node, fault).await;
        self.audit(&who, "inject", &object, true, &result);
        result.map(|()| Response::new(pb::InjectFaultResponse {}))
    }

    type WatchJobsStream = JobStream;

    async fn watch_jobs(&self, request: Request<pb::WatchJobsRequest>) -> Result<Response<JobStream>, Status> {
        let caller = caller(&request)?;
        // Subscribed before the first read, so no change falls between.
        let mut changes = self.state.job_changes.subscribe();
        let mut unfinished = std::collections::BTreeSet::new();
        check_id_count(request.get_ref().ids.len())?;
        // Each job once, however often it is named.
        let ids: std::collections::BTreeSet<u64> = request.get_ref().ids.iter().copied().collect();
        let mut first = Vec::with_capacity(ids.len());
        for id in ids {
            let job = self.job(JobId(id), &caller, false)?;
            if !is_finished(&job) {
                unfinished.insert(JobId(id));
            }
            first.push(job);
        }
        // Boxed: a channel holds room for 32 of its messages from the
        // start, and a watcher waits long (a `gpool wait` on a day's job).
        let (sender, receiver) = tokio::sync::mpsc::channel::<Box<Result<pb::Job, Status>>>(LIST_CHUNK);
        let service = self.clone();
        tokio::spawn(async move {
            for job in first {
                if sender.send(Box::new(Ok(job))).await.is_err() {
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
                    let job = service.job(id, &caller, false);
                    if job.as_ref().map_or(true, is_finished) {
                        unfinished.remove(&id);
                    }
                    if sender.send(Box::new(job)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::map(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
            |job| *job,
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
        let who = identity(&request)?;
        let caller = who.caller.clone();
        let pb::DrainNodeRequest { name, reason, now, gpu } = request.into_inner();
        if reason.trim().is_empty() {
            return Err(Error::InvalidRequest {
                field: "reason",
                reason: "say why the node is drained".into(),
            }
            .into());
        }
        let object = match gpu {
            Some(gpu) => format!("node {name} GPU {gpu}"),
            None => format!("node {name}"),
        };
        let result = self
            .state
            .call(|reply| Command::Drain {
                caller,
                node: name,
                reason,
                at_once: now,
                gpu,
                reply,
            })
            .await
            .map_err(Status::from);
        self.audit(&who, "drain", &object, true, &result);
        let node = result?;
        Ok(Response::new(self.node_to_wire(&node)))
    }

    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        let who = identity(&request)?;
        let caller = who.caller.clone();
        let name = request.into_inner().name;
        let object = format!("node {name}");
        let result = self
            .state
            .call(|reply| Command::RemoveNode {
                caller,
                node: name,
                reply,
            })
            .await
            .map_err(Status::from);
        self.audit(&who, "remove", &object, true, &result);
        Ok(Response::new(pb::RemoveNodeResponse { name: result? }))
    }

    async fn create_reservation(
        &self,
        request: Request<pb::CreateReservationRequest>,
    ) -> Result<Response<pb::Reservation>, Status> {
        let who = identity(&request)?;
        let request = request.into_inner();
        let object = format!("reservation {}", request.name);
        let definition = gpool_proto::convert::reservation_from_wire(request);
        let change = crate::state::ReservationChange::Create(definition);
        self.change_reservation(&who, change, "create", &object).await
    }

    async fn delete_reservation(
        &self,
        request: Request<pb::DeleteReservationRequest>,
    ) -> Result<Response<pb::Reservation>, Status> {
        let who = identity(&request)?;
        let name = request.into_inner().name;
        let object = format!("reservation {name}");
        let change = crate::state::ReservationChange::Delete(name);
        self.change_reservation(&who, change, "delete", &object).await
    }

    async fn list_reservations(
        &self,
        request: Request<pb::ListReservationsRequest>,
    ) -> Result<Response<pb::ListReservationsResponse>, Status> {
        identity(&request)?;
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let reservations = state
            .policy
            .reservations
            .iter()
            .map(|r| reservation_to_wire(r, state.is_created_reservation(&r.name)))
            .collect();
        Ok(Response::new(pb::ListReservationsResponse { reservations }))
    }

    async fn resume_node(&self, request: Request<pb::ResumeNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let who = identity(&request)?;
        let caller = who.caller.clone();
        let pb::ResumeNodeRequest { name, gpu } = request.into_inner();
        let object = match gpu {
            Some(gpu) => format!("node {name} GPU {gpu}"),
            None => format!("node {name}"),
        };
        let result = self
            .state
            .call(|reply| Command::Resume {
                caller,
                node: name,
                gpu,
                reply,
            })
            .await
            .map_err(Status::from);
        self.audit(&who, "resume", &object, true, &result);
        let node = result?;
        Ok(Response::new(self.node_to_wire(&node)))
    }
}

impl PoolService {
    /// Hands `fault` to `node`'s agent, which reports it as NVML would.
    async fn inject(&self, caller: &Caller, node: String, fault: Option<pb::Inject>) -> Result<(), Status> {
        authorize(caller, &Action::InjectFault(&node)).map_err(Error::from)?;
        let mut fault = fault.ok_or_else(|| Error::InvalidRequest {
            field: "fault",
            reason: "say which fault to inject".into(),
        })?;
        {
            let state = self
                .state
                .shared
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let known = state.nodes.get(&node).ok_or_else(|| Error::UnknownNode(node.clone()))?;
            let Some(gpu) = known.gpus.iter().find(|gpu| gpu.index == fault.gpu) else {
                return Err(Error::InvalidRequest {
                    field: "gpu",
                    reason: format!("node {node} has no GPU {}", fault.gpu),
                }
                .into());
            };
            // Faults are of whole GPUs: a MIG slice's is its parent's.
            fault.gpu = gpu.mig_parent.unwrap_or(gpu.index);
        }
        let message = pb::ControllerMessage {
            msg: Some(pb::controller_message::Msg::Inject(fault)),
        };
        self.state
            .call(|reply| Command::ToAgent { node, message, reply })
            .await
            .map_err(Status::from)
    }

    /// Re-reads gpoold.toml and the certificate revocation list.
    async fn reload(&self, caller: &Caller) -> Result<String, Status> {
        let Some(path) = self.config_path.clone() else {
            return Err(Status::failed_precondition(
                "gpoold runs without a config file (dev mode): there is no policy to reload",
            ));
        };
        authorize(caller, &Action::ReloadPolicy).map_err(Error::from)?;
        crate::reload_policy(&self.state, &self.security, &path, Some(caller.clone()))
            .await
            .map_err(|err| Status::invalid_argument(err.to_string()))
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
            wire.health_check = state.health_checks.get(&node.name).cloned();
            let samples = state.gpu_samples.get(&node.name).map_or(&[][..], Vec::as_slice);
            for gpu in &mut wire.gpus {
                // A MIG slice's readings are its parent's.
                let physical = gpu.mig_parent.unwrap_or(gpu.index);
                gpu.sample = samples.iter().find(|sample| sample.index == physical).copied();
            }
            wire.pools = state
                .policy
                .pools
                .iter()
                .filter(|pool| pool.selects(&node.labels))
                .map(|pool| pool.name.clone())
                .collect();
            let now = crate::wall_clock();
            wire.reservations = state
                .policy
                .reservations
                .iter()
                .filter(|r| r.end > now && r.nodes.contains(&node.name))
                .map(|r| pb::NodeReservation {
                    name: r.name.clone(),
                    start_ms: r.start.0,
                    end_ms: r.end.0,
                })
                .collect();
            wire
        })
        .collect()
}

fn token_info(record: &gpool_core::auth::token::TokenRecord) -> pb::TokenInfo {
    pb::TokenInfo {
        id: record.id,
        user: record.user.clone(),
        role: record.role.as_str().to_string(),
        teams: record.teams.clone(),
        created_by: record.created_by.clone(),
        created_at_ms: record.created_at.0,
        expires_at_ms: record.expires_at.map(|at| at.0),
        revoked_at_ms: record.revoked_at.map(|at| at.0),
    }
}

/// A Unix user name a token may be issued for.
fn valid_user_name(user: String) -> Result<String, Error> {
    if gpool_core::auth::is_user_name(&user) {
        Ok(user)
    } else {
        Err(Error::InvalidRequest {
            field: "user",
            reason: format!("{user:?} is not a user name (letters, digits, '.', '_', '-')"),
        })
    }
}

fn is_finished(job: &pb::Job) -> bool {
    gpool_proto::convert::is_ended(job.state())
}
