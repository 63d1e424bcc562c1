//! Access tokens: their text form, their keyed hashes, and the checks that
//! turn one into a caller. Randomness and the key come in as arguments.
//!
//! A user token reads `gpool_<id>_<64 hex digits>`: the id finds its record,
//! and the record keeps only a keyed BLAKE3 hash of the secret, never the
//! token. A job token reads `gpoolj_<job>_<epoch>_<64 hex digits>`: a MAC of
//! the job id and attempt epoch under the controller's key, valid while that
//! attempt is the job's running one, and acting as the job's owner.

use super::{Caller, Role};
use crate::{Epoch, JobId, Timestamp};
use serde::{Deserialize, Serialize};

pub const SECRET_LEN: usize = 32;
pub type Key = [u8; 32];

const USER_PREFIX: &str = "gpool_";
const JOB_PREFIX: &str = "gpoolj_";
/// Longer text is refused before it is looked at.
const MAX_TOKEN_LEN: usize = 128;

/// A token as presented, parsed but not yet checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    User { id: u64, secret: [u8; SECRET_LEN] },
    Job { job: JobId, epoch: Epoch, mac: [u8; 32] },
}

/// A user token's record, kept by the controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: u64,
    pub user: String,
    pub role: Role,
    /// Teams a `lead` token leads.
    pub teams: Vec<String>,
    pub created_by: String,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
    /// Keyed hash of the secret, hex.
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is malformed: {0}")]
    Malformed(String),
    /// Said as a wrong one is: a caller learns nothing of which ids exist.
    #[error("token {0} is wrong")]
    Unknown(u64),
    #[error("token {0} is wrong")]
    Wrong(u64),
    #[error("token {id} expired at {at}")]
    Expired { id: u64, at: Timestamp },
    #[error("token {0} was revoked")]
    Revoked(u64),
    #[error("the job token of job {job} attempt epoch {epoch} is wrong")]
    WrongJobToken { job: JobId, epoch: Epoch },
    #[error("the job token of job {job} is for an attempt that is no longer running")]
    JobNotRunning { job: JobId },
}

pub fn user_token_text(id: u64, secret: &[u8; SECRET_LEN]) -> String {
    format!("{USER_PREFIX}{id}_{}", hex(secret))
}

/// The job token of attempt `epoch` of `job`.
pub fn job_token_text(key: &Key, job: JobId, epoch: Epoch) -> String {
    format!("{JOB_PREFIX}{}_{}_{}", job.0, epoch.0, hex(&job_mac(key, job, epoch)))
}

/// Parses a presented token; never panics, whatever the text.
pub fn parse(text: &str) -> Result<Credential, TokenError> {
    let malformed = |reason: &str| Err(TokenError::Malformed(reason.to_string()));
    let text = text.trim();
    if text.len() > MAX_TOKEN_LEN {
        return malformed("longer than any token");
    }
    if let Some(rest) = text.strip_prefix(JOB_PREFIX) {
        let mut parts = rest.split('_');
        let (Some(job), Some(epoch), Some(mac), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return malformed("a job token has a job id, an epoch and a MAC");
        };
        let (Some(job), Some(epoch), Some(mac)) = (number(job), number(epoch), unhex(mac)) else {
            return malformed("a job token's parts are decimal numbers and 64 hex digits");
        };
        return Ok(Credential::Job {
            job: JobId(job),
            epoch: Epoch(epoch),
            mac,
        });
    }
    let Some(rest) = text.strip_prefix(USER_PREFIX) else {
        return malformed("it does not start with gpool_");
    };
    let Some((id, secret)) = rest.split_once('_') else {
        return malformed("a token has an id and a secret");
    };
    match (number(id), unhex(secret)) {
        (Some(id), Some(secret)) => Ok(Credential::User { id, secret }),
        _ => malformed("a token's id is a decimal number and its secret 64 hex digits"),
    }
}

/// The keyed hash a record keeps of a token's secret.
pub fn secret_hash(key: &Key, id: u64, secret: &[u8; SECRET_LEN]) -> String {
    let mut hasher = blake3::Hasher::new_keyed(key);
    hasher.update(b"gpool user token v1\0");
    hasher.update(&id.to_be_bytes());
    hasher.update(secret);
    hasher.finalize().to_hex().to_string()
}

/// The caller a user token stands for, if it is right, current and unrevoked.
pub fn check_user_token(
    key: &Key,
    record: &TokenRecord,
    secret: &[u8; SECRET_LEN],
    now: Timestamp,
) -> Result<Caller, TokenError> {
    let expected = blake3::Hash::from_hex(&record.hash).map_err(|_| TokenError::Wrong(record.id))?;
    let presented =
        blake3::Hash::from_hex(secret_hash(key, record.id, secret)).map_err(|_| TokenError::Wrong(record.id))?;
    // blake3::Hash compares in constant time.
    if expected != presented {
        return Err(TokenError::Wrong(record.id));
    }
    if record.revoked_at.is_some() {
        return Err(TokenError::Revoked(record.id));
    }
    if let Some(at) = record.expires_at.filter(|at| *at <= now) {
        return Err(TokenError::Expired { id: record.id, at });
    }
    Ok(Caller {
        user: record.user.clone(),
        admin: record.role == Role::Admin,
        led_teams: if record.role == Role::Lead {
            record.teams.clone()
        } else {
            Vec::new()
        },
    })
}

/// Checks a job token's MAC; `running_epoch` is the epoch of the job's
/// running attempt, if it runs. The caller it gives is the job's owner,
/// with a plain user's rights.
pub fn check_job_token(
    key: &Key,
    job: JobId,
    epoch: Epoch,
    mac: &[u8; 32],
    running_epoch: Option<Epoch>,
    owner: &str,
) -> Result<Caller, TokenError> {
    if blake3::Hash::from(*mac) != blake3::Hash::from(job_mac(key, job, epoch)) {
        return Err(TokenError::WrongJobToken { job, epoch });
    }
    if running_epoch != Some(epoch) {
        return Err(TokenError::JobNotRunning { job });
    }
    Ok(Caller::user(owner))
}

fn job_mac(key: &Key, job: JobId, epoch: Epoch) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_keyed(key);
    hasher.update(b"gpool job token v1\0");
    hasher.update(&job.0.to_be_bytes());
    hasher.update(&epoch.0.to_be_bytes());
    *hasher.finalize().as_bytes()
}

fn number(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte_idx, pair) in text.as_bytes().chunks(2).enumerate() {
        let pair = std::str::from_utf8(pair).ok()?;
        out[byte_idx] = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}
