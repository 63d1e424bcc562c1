//! Interactive jobs (`gpool alloc`, `gpool run --pty`) end with their
//! client, as salloc's allocation ends with salloc: a client keeps its job
//! attached by what it sends (keys, or an empty keepalive every few
//! seconds); a job with no client for `detach_grace` gets SIGHUP, as a
//! dropped terminal would send, and is cancelled `HANGUP_GRACE` later if
//! it still runs. `gpool attach ID` within the grace keeps it.

use crate::state::{CancelMode, Command, StateHandle};
use gpool_core::auth::Caller;
use gpool_core::{JobId, JobState};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// From SIGHUP to the cancel of a job that ran on.
pub const HANGUP_GRACE: Duration = Duration::from_secs(10);

/// When each running interactive job last heard from a client.
#[derive(Default)]
pub struct Attached(Mutex<HashMap<JobId, Instant>>);

impl Attached {
    /// A client of job `id` spoke.
    pub fn seen(&self, id: JobId) {
        let mut seen = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        seen.insert(id, Instant::now());
    }
}

/// What to do about an interactive job that last heard from a client at
/// `seen` and was hung up on at `hung` (if it was), at `now`.
pub fn verdict(seen: Instant, hung: Option<Instant>, now: Instant, grace: Duration) -> Option<CancelMode> {
    match hung {
        Some(hung) if now.duration_since(hung) >= HANGUP_GRACE && seen < hung => Some(CancelMode::Cancel),
        Some(_) => None,
        None if now.duration_since(seen) >= grace => Some(CancelMode::Signal(nix::libc::SIGHUP)),
        None => None,
    }
}

/// Hangs up on, then ends, interactive jobs whose client went away, until
/// gpoold stops.
pub async fn reap(handle: StateHandle, attached: std::sync::Arc<Attached>, grace: Duration) {
    let period = (grace / 4).clamp(Duration::from_millis(250), Duration::from_secs(5));
    let mut hung: HashMap<JobId, Instant> = HashMap::new();
    let caller = Caller {
        user: "gpoold".into(),
        admin: true,
        led_teams: Vec::new(),
    };
    loop {
        tokio::time::sleep(period).await;
        let running: Vec<JobId> = {
            let state = handle.shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            state
                .active_jobs()
                .filter(|job| job.spec.pty.is_some() && matches!(job.state, JobState::Running { .. }))
                .map(|job| job.id)
                .collect()
        };
        let now = Instant::now();
        let mut actions = Vec::new();
        {
            let mut seen = attached.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            seen.retain(|id, _| running.contains(id));
            hung.retain(|id, _| running.contains(id));
            for id in &running {
                // First seen here (or since gpoold started): counts as
                // attached now.
                let last = *seen.entry(*id).or_insert(now);
                if hung.get(id).is_some_and(|at| last >= *at) {
                    // A client came back after the hangup.
                    hung.remove(id);
                }
                if let Some(mode) = verdict(last, hung.get(id).copied(), now, grace) {
                    actions.push((*id, mode));
                }
            }
        }
        for (id, mode) in actions {
            match mode {
                CancelMode::Signal(_) => {
                    tracing::warn!(job = %id, "no client attached for {grace:?}: hanging up on the interactive job");
                    hung.insert(id, now);
                }
                _ => tracing::warn!(job = %id, "ran on {HANGUP_GRACE:?} after its hangup: ending it"),
            }
            let caller = caller.clone();
            let sent = handle
                .call(|reply| Command::Cancel {
                    caller,
                    ids: vec![id],
                    mode,
                    reply,
                })
                .await;
            if let Err(err) = sent {
                tracing::warn!(job = %id, "the detached interactive job: {err}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_job_is_hung_up_on_then_ended_unless_its_client_returns() {
        let grace = Duration::from_secs(60);
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        assert!(verdict(start, None, at(59), grace).is_none());
        assert!(
            matches!(verdict(start, None, at(60), grace), Some(CancelMode::Signal(sig)) if sig == nix::libc::SIGHUP)
        );
        assert!(
            verdict(start, Some(at(60)), at(65), grace).is_none(),
            "its grace after the hangup"
        );
        assert!(matches!(
            verdict(start, Some(at(60)), at(70), grace),
            Some(CancelMode::Cancel)
        ));
        assert!(
            verdict(at(66), Some(at(60)), at(70), grace).is_none(),
            "a client came back"
        );
    }
}
