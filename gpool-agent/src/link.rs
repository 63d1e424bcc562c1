//! The agent's end of AgentLink: connect, register, heartbeat, forward job
//! events, obey Launch, Signal and Kill; reconnect with backoff when the link drops.

use crate::launch::Attempts;
use gpool_core::model::Gpu;
use gpool_proto::dial::{Address, ClientTls};
use gpool_proto::pb;
use gpool_proto::pb::agent_link_client::AgentLinkClient;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Short enough that a failover's new leader hears from its agents while
/// their jobs' lease holds (`gpool_core::fencing::check_failover`).
const MAX_BACKOFF: Duration = gpool_core::fencing::AGENT_MAX_REDIAL;

/// What the agent tells the controller about itself at each connect.
pub struct NodeInfo {
    pub name: String,
    pub gpus: Vec<Gpu>,
    pub labels: BTreeMap<String, String>,
    pub topology: gpool_core::topology::Topology,
    pub heartbeat_interval: Duration,
    pub sampler: crate::gpu::Sampler,
    /// Xid events, injected faults and the health program's latest run.
    pub health: Arc<crate::gpu::health::Health>,
    /// Its CPUs and memory (bytes).
    pub cpus: u32,
    pub memory_bytes: u64,
}

/// Keeps the link up until `shutdown` resolves. Job events that could not
/// be sent wait in `events` for the next connection.
/// `controllers`: tried in turn at each connect (a standby of a pool run
/// with `[ha]` names the leader, which is dialled then).
pub async fn run(
    controller: Vec<Address>,
    tls: ClientTls,
    info: NodeInfo,
    attempts: Arc<Attempts>,
    mut events: mpsc::UnboundedReceiver<pb::JobEvent>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    // Before the first Register: a node that could not carry out a launch
    // never takes one.
    let orders = start_orders(attempts.clone())?;
    // As the operator wrote them (https://HOST:PORT...), for the log.
    let named = controller.iter().map(Address::text).collect::<Vec<_>>().join(",");
    let mut backoff = MIN_BACKOFF;
    // Events not yet delivered: they ride on the next Register.
    let mut undelivered = Vec::new();
    loop {
        let outcome = tokio::select! {
            () = &mut shutdown => return Ok(()),
            outcome = serve_once(&controller, &tls, &info, (&attempts, &orders), &mut events, &mut undelivered) => outcome,
        };
        match outcome {
            Ok(()) => {
                tracing::warn!("gpoold at {named} closed the link; reconnecting");
                backoff = MIN_BACKOFF;
            }
            Err(err) => tracing::warn!("link to gpoold at {named}: {err}; retrying in {backoff:?}"),
        }
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn register(info: &NodeInfo, running: Vec<pb::RunningAttempt>, ended: Vec<pb::JobEvent>) -> pb::AgentMessage {
    let register = pb::Register {
        node: info.name.clone(),
        gpus: info
            .gpus
            .iter()
            .map(|gpu| gpool_proto::convert::gpu_to_wire(gpu, 0))
            .collect(),
        labels: gpool_proto::convert::labels_to_wire(&info.labels),
        links: gpool_proto::convert::topology_to_wire(&info.topology),
        running,
        ended,
        boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|id| id.trim().to_string())
            .unwrap_or_default(),
        cpus: info.cpus,
        memory_bytes: info.memory_bytes,
    };
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Register(register)),
    }
}

/// Heartbeats sent on one link and not yet answered: (seq, CLOCK_BOOTTIME ms).
const UNANSWERED: usize = 256;

/// One connection: registers, then heartbeats, forwards job events and
/// obeys gpoold until the link drops (`Ok` when gpoold closed it).
async fn serve_once(
    controller: &[Address],
    tls: &ClientTls,
    info: &NodeInfo,
    (attempts, orders): (&Arc<Attempts>, &Orders),
    events: &mut mpsc::UnboundedReceiver<pb::JobEvent>,
    undelivered: &mut Vec<pb::JobEvent>,
) -> Result<(), String> {
    let (channel, controller) = connect(controller, tls).await?;
    // Heartbeats and job events go ahead of bulk data (log output), so a
    // busy log never delays what keeps the node alive.
    let (control, control_receiver) = mpsc::channel::<pb::AgentMessage>(1024);
    let (bulk, bulk_receiver) = mpsc::channel::<pb::AgentMessage>(64);
    // Running attempts are read before the ended ones: one that ends in
    // between is in both (gpoold counts its end first, then finds it no
    // longer runs there), never in neither, which gpoold would take for an
    // attempt lost with the node and run again.
    let running = attempts.running();
    let ended = ends_to_report(attempts, events, undelivered);
    let message = register(info, running, ended.clone());
    // The Register counts as heartbeat 0: gpoold answers it with a lease.
    let mut sent: std::collections::VecDeque<(u64, u64)> = [(0, crate::supervise::boot_ms())].into();
    control.send(message).await.map_err(|_| "link closed")?;
    let mut inbound = AgentLinkClient::new(channel)
        .max_decoding_message_size(gpool_proto::MAX_MESSAGE_BYTES)
        .connect(prioritized(control_receiver, bulk_receiver))
        .await
        .map_err(|status| format!("register refused: {}", status.message()))?
        .into_inner();
    // gpoold answers only once the Register, ends included, is durable.
    attempts.reported(&ended);
    undelivered.clear();
    tracing::info!(
        "registered with gpoold at {} as {} with {} GPUs",
        controller.text(),
        info.name,
        info.gpus.len()
    );
    let mut heartbeat = tokio::time::interval(info.heartbeat_interval);
    let mut seq = 0;
    // Until when the latest lease holds: past it, this link is given up
    // for a new one (a new connection gets through a healed network sooner
    // than the old one's retransmissions).
    let mut lease_until: Option<u64> = None;
    loop {
        tokio::select! {
            message = inbound.message() => {
                let Some(message) = message.map_err(|status| status.message().to_string())? else {
                    return Ok(());
                };
                // A deposed leader's message ends the link: the next
                // connect finds the leader.
                admit(message.term)?;
                match message {
                    pb::ControllerMessage { msg: Some(pb::controller_message::Msg::Lease(lease)), .. } => {
                        if let Some(until) = on_lease(&lease, &mut sent, (info, attempts), &mut heartbeat) {
                            lease_until = Some(until);
                        }
                    }
                    message => obey(message, (attempts, orders), &bulk, &info.health),
                }
            }
            Some(event) = events.recv() => send_events(&control, event, events, undelivered).await?,
            _ = heartbeat.tick() => {
                if lease_until.is_some_and(|until| crate::supervise::boot_ms() > until) {
                    return Err("gpoold has not answered for longer than the lease; requeueable attempts are stopped".into());
                }
                seq += 1;
                send_heartbeat(&control, &mut sent, seq, (info, attempts)).await?;
            }
        }
    }
}

/// Sends `first` and the job events queued behind it (less the starts of
/// attempts whose ends go with them); what the link did not take waits
/// in `undelivered`.
async fn send_events(
    control: &mpsc::Sender<pb::AgentMessage>,
    first: pb::JobEvent,
    events: &mut mpsc::UnboundedReceiver<pb::JobEvent>,
    undelivered: &mut Vec<pb::JobEvent>,
) -> Result<(), String> {
    let mut queued = vec![first];
    while queued.len() < EVENTS_AT_ONCE {
        match events.try_recv() {
            Ok(event) => queued.push(event),
            Err(_) => break,
        }
    }
    let mut queued = without_starts_of_ended(queued).into_iter();
    while let Some(event) = queued.next() {
        let message = pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::JobEvent(event.clone())),
        };
        if control.send(message).await.is_err() {
            undelivered.push(event);
            undelivered.extend(queued);
            return Err("link closed while sending a job event".into());
        }
    }
    Ok(())
}

/// The most queued job events taken at once.
const EVENTS_AT_ONCE: usize = 256;

/// `events` less each start whose attempt's end is among them: gpoold
/// learns nothing from the start of an attempt it hears has ended (a
/// start only tells it to kill a stale attempt, which the end says is
/// gone), and a short job's two messages become one.
fn without_starts_of_ended(events: Vec<pb::JobEvent>) -> Vec<pb::JobEvent> {
    use pb::job_event::Outcome;
    let is_start = |event: &pb::JobEvent| matches!(event.outcome, Some(Outcome::Started(_)));
    let ended: std::collections::HashSet<(u64, u64)> = events
        .iter()
        .filter(|event| {
            matches!(
                event.outcome,
                Some(Outcome::ExitCode(_) | Outcome::Signal(_) | Outcome::FailedToStart(_))
            )
        })
        .map(|event| (event.job_id, event.epoch))
        .collect();
    if ended.is_empty() {
        return events;
    }
    events
        .into_iter()
        .filter(|event| !is_start(event) || !ended.contains(&(event.job_id, event.epoch)))
        .collect()
}

/// The highest controller term this agent has seen (`[ha]`; 0: none),
/// kept in `TERM_FILE` too, so that a restarted agent still refuses a
/// deposed leader.
static HIGHEST_TERM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static TERM_FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Remembers the highest term in `path` (in the spool), starting from what
/// it says.
pub fn remember_terms_in(path: std::path::PathBuf) {
    let known = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    HIGHEST_TERM.fetch_max(known.unwrap_or(0), std::sync::atomic::Ordering::SeqCst);
    let _ = TERM_FILE.set(path);
}

/// Keeps `term` as the highest seen, or refuses it (and says so in the log).
fn admit(term: u64) -> Result<(), String> {
    use std::sync::atomic::Ordering;
    let highest = HIGHEST_TERM.load(Ordering::SeqCst);
    match gpool_core::fencing::admit_term(highest, term) {
        Ok(now) => {
            if HIGHEST_TERM.fetch_max(now, Ordering::SeqCst) < now {
                if let Some(path) = TERM_FILE.get() {
                    let written = std::fs::write(path.with_extension("new"), format!("{now}\n"))
                        .and_then(|()| std::fs::rename(path.with_extension("new"), path));
                    if let Err(err) = written {
                        tracing::warn!("cannot keep controller term {now} in {}: {err}", path.display());
                    }
                }
            }
            Ok(())
        }
        Err(refusal) => {
            tracing::error!("{refusal}");
            Err(refusal)
        }
    }
}

/// Connects to gpoold for the link: the first controller that answers (or
/// the leader a standby names), and its address.
async fn connect(controllers: &[Address], tls: &ClientTls) -> Result<(tonic::transport::Channel, Address), String> {
    // The link is one long call: only the connection has a deadline (and
    // keepalive pings find a gpoold that went away).
    let deadlines = gpool_proto::dial::Deadlines {
        connect: Duration::from_secs(10),
        request: None,
    };
    gpool_proto::dial::connect_first(controllers, tls, deadlines)
        .await
        .map_err(|err| format!("cannot connect: {err}"))
}

/// The ended attempts a Register carries: the journal's unreported ends
/// and the events not yet delivered (queued ones moved there first).
fn ends_to_report(
    attempts: &Attempts,
    events: &mut mpsc::UnboundedReceiver<pb::JobEvent>,
    undelivered: &mut Vec<pb::JobEvent>,
) -> Vec<pb::JobEvent> {
    // Read after the running attempts (`serve_once`), so none falls between.
    while let Ok(event) = events.try_recv() {
        undelivered.push(event);
    }
    // Ends the journal keeps until a Register carries them, and events
    // that could not be sent (failed starts are not journaled).
    let mut ended = attempts.unreported();
    ended.extend(undelivered.iter().cloned());
    ended
}

/// A lease from gpoold: renews the attempts' lease from the heartbeat it
/// answers and retunes the heartbeat; returns until when it holds.
fn on_lease(
    lease: &pb::Lease,
    sent: &mut std::collections::VecDeque<(u64, u64)>,
    (info, attempts): (&NodeInfo, &Attempts),
    heartbeat: &mut tokio::time::Interval,
) -> Option<u64> {
    let answered = sent.iter().find(|(s, _)| *s == lease.heartbeat_seq).map(|(_, at)| *at);
    sent.retain(|(s, _)| *s > lease.heartbeat_seq);
    let sent_at = answered?;
    let fence_after = Duration::from_millis(u64::from(lease.fence_after_ms));
    let lease_until = sent_at + u64::from(lease.fence_after_ms);
    attempts.renew_lease(
        sent_at,
        fence_after,
        Duration::from_millis(u64::from(lease.fence_grace_ms)),
    );
    // Several heartbeats per lease, whatever agent.toml says.
    let period = info
        .heartbeat_interval
        .min(fence_after / 4)
        .max(Duration::from_millis(50));
    if period != heartbeat.period() {
        *heartbeat = tokio::time::interval(period);
        heartbeat.reset();
    }
    Some(lease_until)
}

/// Sends heartbeat `seq` (GPU samples, health, spool state), noting when
/// it went; a heartbeat the link could not take goes back to `Health`.
async fn send_heartbeat(
    control: &mpsc::Sender<pb::AgentMessage>,
    sent: &mut std::collections::VecDeque<(u64, u64)>,
    seq: u64,
    (info, attempts): (&NodeInfo, &Attempts),
) -> Result<(), String> {
    if sent.len() == UNANSWERED {
        sent.pop_front();
    }
    sent.push_back((seq, crate::supervise::boot_ms()));
    let latest = info.sampler.latest();
    let mut beat = info.health.heartbeat(latest.samples, seq);
    beat.mps_faults = (attempts.mps_failures().into_iter())
        .map(|(index, why)| pb::MpsFault { index, why })
        .collect();
    beat.spool_short = attempts.upkeep();
    beat.readings_stuck = latest.stuck;
    let message = pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Heartbeat(beat)),
    };
    if let Err(mpsc::error::SendError(unsent)) = control.send(message).await {
        if let Some(pb::agent_message::Msg::Heartbeat(heartbeat)) = unsent.msg {
            info.health.unsent(heartbeat);
        }
        return Err("link closed while sending a heartbeat".into());
    }
    Ok(())
}

/// One stream of both channels, `control` first whenever it has a message.
fn prioritized(
    control: mpsc::Receiver<pb::AgentMessage>,
    bulk: mpsc::Receiver<pb::AgentMessage>,
) -> impl tokio_stream::Stream<Item = pb::AgentMessage> {
    futures_util::stream::unfold((control, bulk), |(mut control, mut bulk)| async move {
        let message = tokio::select! {
            biased;
            Some(message) = control.recv() => message,
            Some(message) = bulk.recv() => message,
            else => return None,
        };
        Some((message, (control, bulk)))
    })
}

/// Launches, kills and signals for attempts, in the order gpoold sent
/// them.
type Orders = std::sync::mpsc::Sender<pb::ControllerMessage>;

/// Carries out `Orders` one at a time on a thread of their own, off the
/// link's task: a launch looks its user up (NSS, which may hang on a
/// directory server) and waits for the spawner, and none of that may hold
/// up the heartbeats that keep the node's lease. One thread, woken once
/// per order (a task handing each order to the blocking pool woke two).
fn start_orders(attempts: Arc<Attempts>) -> std::io::Result<Orders> {
    let (orders, pending) = std::sync::mpsc::channel::<pb::ControllerMessage>();
    let runtime = tokio::runtime::Handle::current();
    std::thread::Builder::new().name("orders".into()).spawn(move || {
        // The attempts' watchers it starts are the runtime's tasks.
        let _entered = runtime.enter();
        while let Ok(order) = pending.recv() {
            let carried_out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match order.msg {
                Some(pb::controller_message::Msg::Launch(launch)) => attempts.launch(launch),
                Some(pb::controller_message::Msg::Kill(kill)) => attempts.kill(
                    kill.job_id,
                    kill.epoch,
                    Duration::from_secs(u64::from(kill.grace_seconds)),
                ),
                Some(pb::controller_message::Msg::Signal(signal)) => {
                    attempts.signal(signal.job_id, signal.epoch, signal.signal)
                }
                _ => {}
            }));
            if carried_out.is_err() {
                tracing::error!("an order to the node's attempts failed (it panicked)");
            }
        }
    })?;
    Ok(orders)
}

fn obey(
    message: pb::ControllerMessage,
    (attempts, orders): (&Arc<Attempts>, &Orders),
    bulk: &mpsc::Sender<pb::AgentMessage>,
    health: &crate::gpu::health::Health,
) {
    match message.msg {
        Some(pb::controller_message::Msg::Inject(inject)) => health.inject(&inject),
        Some(
            pb::controller_message::Msg::Launch(_)
            | pb::controller_message::Msg::Kill(_)
            | pb::controller_message::Msg::Signal(_),
        ) => {
            let _ = orders.send(message);
        }
        Some(pb::controller_message::Msg::ReadLog(request)) => attempts.stream_log(request, bulk.clone()),
        Some(pb::controller_message::Msg::StopLog(stop)) => attempts.stop_log(stop.request_id),
        Some(pb::controller_message::Msg::Input(input)) => attempts.type_in(input),
        Some(pb::controller_message::Msg::Lease(_)) | None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::job_event::Outcome;

    fn event(job_id: u64, epoch: u64, outcome: Outcome) -> pb::JobEvent {
        pb::JobEvent {
            job_id,
            epoch,
            outcome: Some(outcome),
            cause: 0,
        }
    }

    /// A start goes out unless its attempt's end goes with it; the ends,
    /// and other attempts' starts, go out as they came.
    #[test]
    fn a_start_is_left_out_only_beside_its_attempts_end() {
        let events = vec![
            event(1, 1, Outcome::Started(true)),
            event(2, 2, Outcome::Started(true)),
            event(1, 1, Outcome::ExitCode(0)),
            event(3, 3, Outcome::Started(true)),
            event(3, 4, Outcome::FailedToStart("no such file".into())),
        ];
        let sent: Vec<(u64, u64, Option<Outcome>)> = without_starts_of_ended(events)
            .into_iter()
            .map(|event| (event.job_id, event.epoch, event.outcome))
            .collect();
        assert_eq!(
            sent,
            vec![
                (2, 2, Some(Outcome::Started(true))),
                (1, 1, Some(Outcome::ExitCode(0))),
                (3, 3, Some(Outcome::Started(true))),
                (3, 4, Some(Outcome::FailedToStart("no such file".into()))),
            ]
        );
    }
}
