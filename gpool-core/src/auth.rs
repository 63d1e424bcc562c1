//! Who may do what: authorisation as one pure function of the caller and
//! the action (with the object it touches), and the credentials gpoold
//! hands out (user tokens and per-attempt job tokens) as pure parsing,
//! hashing and checking.
//!
//! Rules: users see their own jobs in full and others' only as queue
//! entries; they cancel, signal and checkpoint only their own; team leads
//! manage their team's jobs; admins may do everything. A user submits only
//! to a team that lists them among its members (a team with no members is
//! open to all), with a priority no higher than the configured bound.

use crate::JobId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a credential allows beyond a plain user's rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Lead,
    Admin,
}

impl Role {
    pub fn parse(text: &str) -> Result<Role, String> {
        match text {
            "user" => Ok(Role::User),
            "lead" => Ok(Role::Lead),
            "admin" => Ok(Role::Admin),
            other => Err(format!("{other:?} is not a role (user, lead or admin)")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Lead => "lead",
            Role::Admin => "admin",
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub admin: bool,
    /// Teams whose jobs this caller manages as their lead.
    pub led_teams: Vec<String>,
}

impl Caller {
    pub fn user(name: &str) -> Caller {
        Caller {
            user: name.to_string(),
            admin: false,
            led_teams: Vec::new(),
        }
    }
}

/// A job as authorisation sees it.
#[derive(Debug, Clone, Copy)]
pub struct JobRef<'a> {
    pub id: JobId,
    pub owner: &'a str,
    pub team: &'a str,
}

/// What may be asked for, with the object it touches.
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    /// A job's command, environment, workdir and output.
    ReadJob(JobRef<'a>),
    CancelJob(JobRef<'a>),
    SignalJob(JobRef<'a>),
    CheckpointJob(JobRef<'a>),
    /// Typing at an interactive job's terminal: that runs commands as its
    /// owner, so only its owner (or an admin) may, not a team lead.
    TypeInto(JobRef<'a>),
    /// Submitting to `team` (whose `members` are given; empty is open to
    /// all) at `priority`, where users may go up to `max_user_priority`
    /// (lower is always allowed: it only makes their own job wait).
    Submit {
        team: &'a str,
        members: &'a [String],
        priority: i32,
        max_user_priority: i32,
    },
    /// Changing a pending job (`gpool update`): its owner and team leads
    /// may shorten its time limit, set its priority up to
    /// `max_user_priority` and change its array's %N; a longer time limit
    /// is for admins only (as in Slurm).
    UpdateJob {
        job: JobRef<'a>,
        longer_time: bool,
        priority: Option<i32>,
        max_user_priority: i32,
    },
    DrainNode(&'a str),
    ResumeNode(&'a str),
    RemoveNode(&'a str),
    ReloadPolicy,
    ManageTokens,
    /// Create or delete reservations (`gpool reservation`).
    ManageReservations,
    /// The whole pool's costs against dedicated GPUs (`gpool report
    /// savings`).
    ViewPoolSavings,
    /// Make a node's agent report a GPU fault (`gpool admin inject`).
    InjectFault(&'a str),
}

impl fmt::Display for Action<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let job = |f: &mut fmt::Formatter<'_>, verb: &str, job: &JobRef| {
            write!(f, "{verb} job {} of user {} (team {})", job.id, job.owner, job.team)
        };
        match self {
            Action::ReadJob(j) => job(f, "read the details of", j),
            Action::CancelJob(j) => job(f, "cancel", j),
            Action::SignalJob(j) => job(f, "signal", j),
            Action::CheckpointJob(j) => job(f, "report a checkpoint of", j),
            Action::TypeInto(j) => job(f, "type at the terminal of", j),
            // The priority is named only where one was asked for: the
            // default (0) is no part of a refusal.
            Action::Submit { team, priority: 0, .. } => write!(f, "submit to team {team}"),
            Action::Submit { team, priority, .. } => write!(f, "submit to team {team} at priority {priority}"),
            Action::UpdateJob { job: j, .. } => job(f, "update", j),
            Action::DrainNode(node) => write!(f, "drain node {node}"),
            Action::ResumeNode(node) => write!(f, "resume node {node}"),
            Action::RemoveNode(node) => write!(f, "remove node {node}"),
            Action::ReloadPolicy => write!(f, "reload the policy"),
            Action::ManageTokens => write!(f, "manage access tokens"),
            Action::ManageReservations => write!(f, "manage reservations"),
            Action::ViewPoolSavings => write!(f, "see the pool's costs and savings"),
            Action::InjectFault(node) => write!(f, "inject a GPU fault on node {node}"),
        }
    }
}

/// A refusal: who asked, for what, and why not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("user {user} may not {action}: {reason}")]
pub struct Denied {
    pub user: String,
    pub action: String,
    pub reason: String,
}

/// Whether `name` can be a user name: 1 to 64 letters, digits, '.', '_'
/// and '-'.
pub fn is_user_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Allows `action` to `caller`, or says why not.
pub fn authorize(caller: &Caller, action: &Action) -> Result<(), Denied> {
    if caller.admin {
        return Ok(());
    }
    let refused = |reason: String| {
        Err(Denied {
            user: caller.user.clone(),
            action: action.to_string(),
            reason,
        })
    };
    match action {
        Action::ReadJob(job) | Action::CancelJob(job) | Action::SignalJob(job) | Action::CheckpointJob(job) => {
            if job.owner == caller.user || caller.led_teams.iter().any(|team| team == job.team) {
                Ok(())
            } else {
                refused(format!("only its owner, a lead of team {} or an admin may", job.team))
            }
        }
        Action::TypeInto(job) => {
            if job.owner == caller.user {
                Ok(())
            } else {
                refused("only its owner or an admin may".into())
            }
        }
        Action::Submit {
            team,
            members,
            priority,
            max_user_priority,
        } => {
            let member = members.is_empty()
                || members.iter().any(|m| m == &caller.user)
                || caller.led_teams.iter().any(|led| led == team);
            if !member {
                refused(format!("team {team} has members {} only", members.join(", ")))
            } else if priority > max_user_priority {
                refused(format!(
                    "priority is above max_user_priority ({max_user_priority}); only admins go beyond it"
                ))
            } else {
                Ok(())
            }
        }
        Action::UpdateJob {
            job,
            longer_time,
            priority,
            max_user_priority,
        } => {
            if job.owner != caller.user && !caller.led_teams.iter().any(|team| team == job.team) {
                refused(format!("only its owner, a lead of team {} or an admin may", job.team))
            } else if *longer_time {
                refused("only admins may make a time limit longer".to_string())
            } else if priority.is_some_and(|priority| priority > *max_user_priority) {
                refused(format!(
                    "priority is above max_user_priority ({max_user_priority}); only admins go beyond it"
                ))
            } else {
                Ok(())
            }
        }
        Action::DrainNode(_)
        | Action::ResumeNode(_)
        | Action::RemoveNode(_)
        | Action::ReloadPolicy
        | Action::ManageTokens
        | Action::ManageReservations
        | Action::ViewPoolSavings
        | Action::InjectFault(_) => refused("only admins may".to_string()),
    }
}

/// How an agent's link presented itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentCredential<'a> {
    /// A client certificate that chains to the cluster CA: its common name
    /// (the node name it was issued for), and whether its serial is revoked.
    Certificate { node: &'a str, revoked: bool },
    /// TLS without a client certificate.
    NoCertificate,
    /// No TLS. `local_uid`: the owner of the peer's socket where the peer
    /// is on this host; `insecure_allowed`: the operator allowed plaintext
    /// from other hosts (insecure_plaintext).
    Plaintext {
        local_uid: Option<u32>,
        controller_uid: u32,
        insecure_allowed: bool,
    },
}

/// Whether a link may speak for a node at all: a valid, unrevoked
/// certificate; or plaintext from root or the controller's own user on its
/// host, or from another host where the operator allowed plaintext.
pub fn admit_agent_link(credential: &AgentCredential) -> Result<(), String> {
    match *credential {
        AgentCredential::Certificate { node, revoked: true } => {
            Err(format!("the certificate of node {node} is revoked"))
        }
        AgentCredential::Certificate { .. } => Ok(()),
        AgentCredential::NoCertificate => {
            Err("agents must present a client certificate issued by the cluster CA".into())
        }
        AgentCredential::Plaintext {
            local_uid: Some(uid),
            controller_uid,
            ..
        } if uid != 0 && uid != controller_uid => {
            Err("a plaintext agent link must come from root or gpoold's user on this host".into())
        }
        AgentCredential::Plaintext {
            local_uid: None,
            insecure_allowed: false,
            ..
        } => Err("plaintext agent links from other hosts are not allowed (no insecure_plaintext)".into()),
        AgentCredential::Plaintext { .. } => Ok(()),
    }
}

/// Whether an admitted link may register as `node`: a certificate speaks
/// only for the node it names.
pub fn agent_speaks_for(cert_node: Option<&str>, node: &str) -> Result<(), String> {
    match cert_node {
        Some(cert_node) if cert_node != node => Err(format!(
            "the agent's certificate is for node {cert_node}, but it registers as {node}"
        )),
        _ => Ok(()),
    }
}

pub mod token;

#[cfg(test)]
mod tests;
