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

use gpool_core::sessions::{detached, Detached, HANGUP_GRACE};

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
                let hung_for = hung.get(id).map(|at| now.duration_since(*at));
                let mode = match detached(now.duration_since(last), hung_for, grace) {
                    Some(Detached::HangUp) => CancelMode::Signal(nix::libc::SIGHUP),
                    Some(Detached::End) => CancelMode::Cancel,
                    None => continue,
                };
                actions.push((*id, mode));
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
