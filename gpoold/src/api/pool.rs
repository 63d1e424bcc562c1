//! The Pool service: what the CLI calls.

mod admin;
mod jobs;
mod nodes;
mod watch;

use super::{caller, identity, Identity};
use crate::error::Error;
use crate::security::{AuditEntry, Security};
use crate::state::{Command, StateHandle};
use admin::{reservation_to_wire, token_info};
use gpool_core::auth::{authorize, Action};
use gpool_core::JobId;
use gpool_proto::pb;
use gpool_proto::pb::pool_server::Pool;
use nodes::nodes_to_wire;
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
    /// With `[ha]`: this leader's election, which `Controllers` lists.
    pub leadership: Option<Arc<crate::ha::Leadership>>,
    /// The address this controller is bound to (`Controllers` without
    /// `[ha]`).
    pub listen: String,
    /// Open `WatchJobs` streams, by user.
    pub watches: Arc<watch::Watches>,
    /// When each interactive job last heard from its client.
    pub attached: Arc<super::sessions::Attached>,
}

type JobStream = Pin<Box<dyn Stream<Item = Result<pb::Job, Status>> + Send>>;
type LogStream = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send>>;
type JobListStream = Pin<Box<dyn Stream<Item = Result<pb::ListJobsResponse, Status>> + Send>>;

impl PoolService {
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

#[tonic::async_trait]
impl Pool for PoolService {
    async fn submit_jobs(
        &self,
        request: Request<pb::SubmitJobsRequest>,
    ) -> Result<Response<pb::SubmitJobsResponse>, Status> {
        let who = identity(&request)?;
        self.submit(&who, request.into_inner()).await
    }

    async fn cancel_jobs(
        &self,
        request: Request<pb::CancelJobsRequest>,
    ) -> Result<Response<pb::CancelJobsResponse>, Status> {
        let who = identity(&request)?;
        self.cancel(&who, request.into_inner()).await
    }

    async fn update_jobs(
        &self,
        request: Request<pb::UpdateJobsRequest>,
    ) -> Result<Response<pb::CancelJobsResponse>, Status> {
        let who = identity(&request)?;
        self.update(&who, request.into_inner()).await
    }

    async fn get_job(&self, request: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        let caller = caller(&request)?;
        Ok(Response::new(self.job(JobId(request.get_ref().id), &caller, true)?))
    }

    type ListJobsStream = JobListStream;

    async fn list_jobs(&self, request: Request<pb::ListJobsRequest>) -> Result<Response<JobListStream>, Status> {
        let caller = caller(&request)?;
        self.list(caller, request.into_inner())
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
            term: 0,
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
        let pb::WriteInputRequest { id, data, resize } = request.into_inner();
        let max = crate::state::MAX_INPUT_BYTES;
        if data.len() > max {
            return Err(Status::invalid_argument(format!(
                "data: {} bytes of terminal input in one call; at most {max}",
                data.len()
            )));
        }
        let target = self.input_target(JobId(id), &who.caller);
        // Keystrokes are not audited one by one: only a refusal is.
        self.audit(&who, "type", &format!("job {id}"), false, &target);
        let (node, epoch) = target?;
        self.attached.seen(JobId(id));
        // A client's keepalive: it is attached, and has nothing to send.
        if data.is_empty() && resize.is_none() {
            return Ok(Response::new(pb::WriteInputResponse {}));
        }
        let input = pb::TerminalInput {
            job_id: id,
            epoch,
            data,
            resize,
        };
        let message = pb::ControllerMessage {
            term: 0,
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

    async fn controllers(
        &self,
        request: Request<pb::ControllersRequest>,
    ) -> Result<Response<pb::ControllersResponse>, Status> {
        identity(&request)?;
        let Some(leadership) = &self.leadership else {
            let this = pb::Controller {
                name: String::new(),
                advertise: self.listen.clone(),
                leader: true,
                lease_left_secs: -1,
            };
            return Ok(Response::new(pb::ControllersResponse {
                ha: false,
                term: 0,
                controllers: vec![this],
            }));
        };
        let candidates = leadership
            .candidates()
            .await
            .map_err(|err| Status::failed_precondition(format!("the controllers' etcd did not answer: {err}")))?;
        let controllers = candidates
            .into_iter()
            .map(|candidate| pb::Controller {
                name: candidate.name,
                advertise: candidate.advertise,
                leader: candidate.leader,
                lease_left_secs: candidate.lease_left_secs.unwrap_or(-1),
            })
            .collect();
        Ok(Response::new(pb::ControllersResponse {
            ha: true,
            term: leadership.term,
            controllers,
        }))
    }

    /// Anyone may ask: this controller serves. A standby's listener
    /// answers this call with a redirect instead (`crate::standby`).
    async fn leader(&self, _: Request<pb::LeaderRequest>) -> Result<Response<pb::LeaderResponse>, Status> {
        Ok(Response::new(pb::LeaderResponse {
            name: self.leadership.as_ref().map(|l| l.name.clone()).unwrap_or_default(),
            term: crate::ha::term(),
        }))
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let who = identity(&request)?;
        self.issue_token(&who, request.into_inner()).await
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
        self.watch(caller, request.get_ref())
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
        let sleeping = state.sleeping_nodes();
        let nodes = nodes_to_wire(&state, state.nodes.values().chain(&sleeping));
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn drain_node(&self, request: Request<pb::DrainNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let who = identity(&request)?;
        self.drain(&who, request.into_inner()).await
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
        self.resume(&who, request.into_inner()).await
    }
}
