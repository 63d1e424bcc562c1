//! `--notify`: gpoold posts a JSON event to a job's webhook, or mails its
//! mailbox through the configured sendmail, when the job starts or ends.
//!
//! It follows the durable job changes watchers hear of, so an event is
//! never said before it is on disk. Delivery is at most once per event
//! (three tries over about ten seconds), on sender threads of its own
//! (`sender`); a controller restart between a change and its post loses
//! that post, as do changes missed under a flood and events that find the
//! queue full (said in the log, and counted in
//! `gpool_notifications_dropped_total`).

mod sender;

use crate::state::StateHandle;
use gpool_core::model::{Change, Notify};
use gpool_core::JobId;
use gpool_proto::convert::state_name;
use gpool_proto::pb;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

/// Tries per event, and the wait before each retry.
const BACKOFF: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(5)];
/// The longest one post may take, and its connect.
const POST_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What has been said of a job: the attempt whose start was, and its end.
#[derive(Default)]
struct Said {
    started: u32,
    ended: bool,
}

/// Follows job changes until gpoold stops, sending what jobs asked for.
pub async fn run(handle: StateHandle, metrics: std::sync::Arc<crate::metrics::Metrics>) {
    // Their threads end once this task does (gpoold aborts it at shutdown).
    let senders = sender::Senders::start(deliver);
    let mut changes = handle.job_changes.subscribe();
    let mut said: HashMap<JobId, Said> = HashMap::new();
    // Attempts that started before this gpoold did were told of by the
    // one before (or their post was lost with it): not told again.
    let since = crate::wall_clock().0;
    loop {
        let id = match changes.recv().await {
            Ok(id) => id,
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!("notifications: {missed} job changes went by unread; their events may not be sent");
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        let Some((notify, job)) = notifying_job(&handle, id) else {
            continue;
        };
        let entry = said.entry(id).or_default();
        let state = job.state();
        let ended = gpool_proto::convert::is_ended(state);
        let event = if ended && !entry.ended {
            entry.ended = true;
            notify.event(Change::Ended {
                completed: state == pb::JobState::Completed,
            })
        } else if state == pb::JobState::Running && entry.started < job.attempt {
            entry.started = job.attempt;
            // Not one that started before this gpoold did.
            let new = job.started_at_ms.is_some_and(|at| at >= since);
            notify.event(Change::Started).filter(|_| new)
        } else {
            None
        };
        if ended {
            said.remove(&id);
        }
        if let Some(event) = event {
            let sendmail = handle
                .shared
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .notify_rules
                .sendmail
                .clone();
            let (to, id) = (notify.to.clone(), job.id);
            let outgoing = sender::Outgoing {
                notify,
                sendmail,
                event,
                job,
            };
            if !senders.offer(outgoing) {
                metrics.notifications_dropped.inc();
                tracing::warn!(
                    job = id,
                    "notification ({event}) to {to} dropped: {} wait to be sent already",
                    sender::QUEUE_CAPACITY
                );
            }
        }
    }
}

/// The job as the API shows it, if it asked to be notified.
fn notifying_job(handle: &StateHandle, id: JobId) -> Option<(Notify, pb::Job)> {
    let state = handle.shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    let job = state.find_job(id).ok()??;
    let notify = job.spec.notify.clone()?;
    let wire = crate::api::job_wire::job_wire_in_full(&state, &job, false);
    Some((notify, wire))
}

/// The event as JSON: what a receiver needs to act on it.
pub fn payload(event: &str, job: &pb::Job) -> serde_json::Value {
    let spec = job.spec.clone().unwrap_or_default();
    let at = |ms: Option<i64>| {
        ms.map(|ms| {
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
                .to_string()
        })
    };
    serde_json::json!({
        "event": event,
        "job": {
            "id": job.id,
            "name": spec.name,
            "user": job.user,
            "team": spec.team,
            "project": spec.project,
            "state": state_name(job.state()),
            "exit_code": job.exit_code,
            "reason": job.end_reason,
            "nodes": job.last_nodes,
            "attempt": job.attempt,
            "gpus_total": u64::from(spec.gpus) * u64::from(spec.nodes.max(1)),
            "submitted_at": at(Some(job.submitted_at_ms)),
            "started_at": at(job.started_at_ms),
            "ended_at": at(job.ended_at_ms),
            "array_job_id": job.array_task_index.map(|_| job.array_job_id),
            "array_task_id": job.array_task_index,
        },
    })
}

/// Sends one event, with its retries; blocking (on a sender thread).
fn deliver(outgoing: sender::Outgoing) {
    let sender::Outgoing {
        notify,
        sendmail,
        event,
        job,
    } = outgoing;
    let body = payload(event, &job);
    for (attempt, backoff) in std::iter::once(None).chain(BACKOFF.iter().map(Some)).enumerate() {
        if let Some(wait) = backoff {
            std::thread::sleep(*wait);
        }
        match send(&notify, sendmail.as_deref(), &body) {
            Ok(()) => return,
            Err(err) if attempt == BACKOFF.len() => {
                tracing::warn!(job = %job.id, "notification ({event}) to {} not sent: {err}", notify.to);
            }
            Err(err) => tracing::debug!(job = %job.id, "notification to {}: {err}; trying again", notify.to),
        }
    }
}

fn send(notify: &Notify, sendmail: Option<&str>, body: &serde_json::Value) -> Result<(), String> {
    match notify.to.strip_prefix("mail:") {
        None => {
            // No redirects: a receiver under an allowed prefix must not
            // send gpoold's post anywhere else.
            let agent = ureq::Agent::config_builder()
                .timeout_global(Some(POST_TIMEOUT))
                .timeout_connect(Some(CONNECT_TIMEOUT))
                .max_redirects(0)
                .http_status_as_error(true)
                .build()
                .new_agent();
            agent
                .post(&notify.to)
                .header("content-type", "application/json")
                .header("user-agent", "gpoold")
                .send(body.to_string())
                .map(drop)
                .map_err(|err| err.to_string())
        }
        Some(addr) => mail(sendmail.ok_or("no sendmail is set")?, addr.trim(), body),
    }
}

/// Hands the event to `sendmail -t`: the address is a single argument-free
/// header (checked at submit), the body the event's JSON.
fn mail(sendmail: &str, addr: &str, body: &serde_json::Value) -> Result<(), String> {
    use std::io::Write;
    let job = &body["job"];
    let subject = format!(
        "gpool job {} ({}) {}: {}",
        job["id"],
        job["name"].as_str().unwrap_or(""),
        body["event"].as_str().unwrap_or(""),
        job["state"].as_str().unwrap_or("")
    );
    let message = format!(
        "To: {addr}\nSubject: {}\nContent-Type: application/json\n\n{}\n",
        subject.replace(['\r', '\n'], " "),
        serde_json::to_string_pretty(body).unwrap_or_default()
    );
    let mut child = std::process::Command::new(sendmail)
        .arg("-t")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|err| format!("{sendmail}: {err}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(message.as_bytes())
            .map_err(|err| format!("{sendmail}: {err}"))?;
    }
    let output = child.wait_with_output().map_err(|err| format!("{sendmail}: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{sendmail} exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
