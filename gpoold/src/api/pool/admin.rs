//! Admin requests of the Pool service: user tokens, reservations, policy
//! reloads and injected faults.

use super::PoolService;
use crate::api::Identity;
use crate::error::Error;
use crate::state::{Command, NewToken};
use gpool_core::auth::{authorize, Action, Caller, Role};
use gpool_proto::pb;
use tonic::{Response, Status};

impl PoolService {
    /// Applies `change` for `who` (audited as `action` of `object`).
    pub(super) async fn change_reservation(
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

    /// Issues a user token for `who` (`CreateToken`).
    pub(super) async fn issue_token(
        &self,
        who: &Identity,
        request: pb::CreateTokenRequest,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let pb::CreateTokenRequest {
            user,
            role,
            teams,
            expires_in,
        } = request;
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
        self.audit(who, "token create", &object, true, &result);
        let (record, token) = result?;
        Ok(Response::new(pb::CreateTokenResponse {
            info: Some(token_info(&record)),
            token,
        }))
    }

    /// Hands `fault` to `node`'s agent, which reports it as NVML would.
    pub(super) async fn inject(&self, caller: &Caller, node: String, fault: Option<pb::Inject>) -> Result<(), Status> {
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
            term: 0,
            msg: Some(pb::controller_message::Msg::Inject(fault)),
        };
        self.state
            .call(|reply| Command::ToAgent { node, message, reply })
            .await
            .map_err(Status::from)
    }

    /// Re-reads gpoold.toml and the certificate revocation list.
    pub(super) async fn reload(&self, caller: &Caller) -> Result<String, Status> {
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
}

/// A reservation on the wire; `created`: made by `gpool reservation
/// create` (else gpoold.toml's).
pub(super) fn reservation_to_wire(r: &gpool_core::sched::reservations::Reservation, created: bool) -> pb::Reservation {
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

pub(super) fn token_info(record: &gpool_core::auth::token::TokenRecord) -> pb::TokenInfo {
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
