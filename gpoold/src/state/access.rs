//! Callers and tokens: who a local user or a presented token is, and
//! issuing and revoking user tokens (records keep only a keyed hash).

use super::{State, Write};
use crate::error::Error;
use gpool_core::auth::token::{self, Credential, Key, TokenError, TokenRecord};
use gpool_core::auth::{authorize, Action, Caller, Role};
use gpool_core::{JobState, Timestamp};

/// A token request as gpoold checked it.
pub struct NewToken {
    pub user: String,
    pub role: Role,
    pub teams: Vec<String>,
    pub expires_in_secs: Option<u64>,
    pub secret: [u8; token::SECRET_LEN],
}

impl State {
    /// A user known by name on the controller host (Unix socket, dev mode):
    /// an admin if `admins` lists them, and lead of the teams whose `leads`
    /// name them.
    pub fn local_caller(&self, user: &str) -> Caller {
        Caller {
            user: user.to_string(),
            admin: self.is_admin(user),
            led_teams: self.policy.sharing.teams_led_by(user),
        }
    }

    /// The caller a presented token stands for. A user token gives its
    /// record's role (and the teams the config says the user leads); a
    /// job token gives the job's owner, as a plain user, while the attempt
    /// it was issued to runs.
    pub fn token_caller(&self, key: &Key, credential: &Credential, now: Timestamp) -> Result<Caller, TokenError> {
        match credential {
            Credential::User { id, secret } => {
                let record = self.tokens.get(id).ok_or(TokenError::Unknown(*id))?;
                let mut caller = token::check_user_token(key, record, secret, now)?;
                for team in self.policy.sharing.teams_led_by(&caller.user) {
                    if !caller.led_teams.contains(&team) {
                        caller.led_teams.push(team);
                    }
                }
                Ok(caller)
            }
            Credential::Job { job, epoch, mac } => {
                // The MAC is checked first, whatever the job: a forged token
                // learns nothing of another job's state.
                let found = self.jobs.get(job);
                let running = found.and_then(|found| match &found.state {
                    JobState::Running { epoch, .. } => Some(*epoch),
                    _ => None,
                });
                let owner = found.map_or("", |found| found.user.as_str());
                token::check_job_token(key, *job, *epoch, mac, running, owner)
            }
        }
    }

    pub(super) fn create_token(
        &mut self,
        caller: &Caller,
        request: NewToken,
        now: Timestamp,
    ) -> Result<(TokenRecord, String, Vec<Write>), Error> {
        authorize(caller, &Action::ManageTokens)?;
        if request.role != Role::Lead && !request.teams.is_empty() {
            return Err(Error::InvalidRequest {
                field: "team",
                reason: "only a lead token names teams (--role lead)".into(),
            });
        }
        if request.role == Role::Lead && request.teams.is_empty() {
            return Err(Error::InvalidRequest {
                field: "team",
                reason: "a lead token needs the teams it leads (--team T)".into(),
            });
        }
        if let Some(unknown) = request
            .teams
            .iter()
            .find(|team| self.policy.sharing.teams.iter().all(|t| &t.name != *team))
        {
            return Err(Error::InvalidRequest {
                field: "team",
                reason: format!("no team {unknown:?} is configured"),
            });
        }
        let id = self.tokens.keys().next_back().map_or(1, |last| last + 1);
        let record = TokenRecord {
            id,
            user: request.user,
            role: request.role,
            teams: request.teams,
            created_by: caller.user.clone(),
            created_at: now,
            expires_at: request
                .expires_in_secs
                .map(|secs| Timestamp(now.0.saturating_add((secs as i64).saturating_mul(1000)))),
            revoked_at: None,
            hash: token::secret_hash(&self.token_key, id, &request.secret),
        };
        let text = token::user_token_text(id, &request.secret);
        self.tokens.insert(id, record.clone());
        Ok((record, text, vec![Write::Token(id)]))
    }

    pub(super) fn revoke_token(
        &mut self,
        caller: &Caller,
        id: u64,
        now: Timestamp,
    ) -> Result<(TokenRecord, Vec<Write>), Error> {
        authorize(caller, &Action::ManageTokens)?;
        let record = self.tokens.get_mut(&id).ok_or(Error::UnknownToken(id))?;
        record.revoked_at.get_or_insert(now);
        Ok((record.clone(), vec![Write::Token(id)]))
    }
}
