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
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What the agent tells the controller about itself at each connect.
pub struct NodeInfo {
    pub name: String,
    pub gpus: Vec<Gpu>,
    pub labels: BTreeMap<String, String>,
    pub topology: gpool_core::topology::Topology,
    pub heartbeat_interval: Duration,
    pub sampler: crate::gpu::Sampler,
}

/// Keeps the link up until `shutdown` resolves. Job events that could not
/// be sent wait in `events` for the next connection.
pub async fn run(
    controller: Address,
    tls: ClientTls,
    info: NodeInfo,
    attempts: Arc<Attempts>,
    mut events: mpsc::UnboundedReceiver<pb::JobEvent>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut backoff = MIN_BACKOFF;
    // Events not yet delivered: they ride on the next Register.
    let mut undelivered = Vec::new();
    loop {
        let outcome = tokio::select! {
            () = &mut shutdown => return,
            outcome = serve_once(&controller, &tls, &info, &attempts, &mut events, &mut undelivered) => outcome,
        };
        match outcome {
            Ok(()) => {
                tracing::warn!("gpoold at {controller:?} closed the link; reconnecting");
                backoff = MIN_BACKOFF;
            }
            Err(err) => tracing::warn!("link to gpoold at {controller:?}: {err}; retrying in {backoff:?}"),
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn register(info: &NodeInfo, attempts: &Attempts, ended: Vec<pb::JobEvent>) -> pb::AgentMessage {
    let register = pb::Register {
        node: info.name.clone(),
        gpus: info
            .gpus
            .iter()
            .map(|gpu| gpool_proto::convert::gpu_to_wire(gpu, 0))
            .collect(),
        labels: gpool_proto::convert::labels_to_wire(&info.labels),
        links: gpool_proto::convert::topology_to_wire(&info.topology),
        running: attempts.running(),
        ended,
    };
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Register(register)),
    }
}

async fn serve_once(
    controller: &Address,
    tls: &ClientTls,
    info: &NodeInfo,
    attempts: &Arc<Attempts>,
    events: &mut mpsc::UnboundedReceiver<pb::JobEvent>,
    undelivered: &mut Vec<pb::JobEvent>,
) -> Result<(), String> {
    let channel = gpool_proto::dial::connect(controller, tls)
        .await
        .map_err(|err| format!("cannot connect: {err}"))?;
    let (outbound, outbound_receiver) = mpsc::channel::<pb::AgentMessage>(1024);
    // Ended attempts are read before the running ones, so none falls between.
    while let Ok(event) = events.try_recv() {
        undelivered.push(event);
    }
    // Ends the journal keeps until a Register carries them, and events
    // that could not be sent (failed starts are not journaled).
    let mut ended = attempts.unreported();
    ended.extend(undelivered.iter().cloned());
    let message = register(info, attempts, ended.clone());
    outbound.send(message).await.map_err(|_| "link closed")?;
    let mut inbound = AgentLinkClient::new(channel)
        .connect(tokio_stream::wrappers::ReceiverStream::new(outbound_receiver))
        .await
        .map_err(|status| format!("register refused: {}", status.message()))?
        .into_inner();
    // gpoold answers only once the Register, ends included, is durable.
    attempts.reported(&ended);
    undelivered.clear();
    tracing::info!(
        "registered with gpoold at {controller:?} as {} with {} GPUs",
        info.name,
        info.gpus.len()
    );
    let mut heartbeat = tokio::time::interval(info.heartbeat_interval);
    loop {
        tokio::select! {
            message = inbound.message() => match message.map_err(|status| status.message().to_string())? {
                Some(message) => obey(message, attempts, &outbound),
                None => return Ok(()),
            },
            Some(event) = events.recv() => {
                let message = pb::AgentMessage { msg: Some(pb::agent_message::Msg::JobEvent(event.clone())) };
                if outbound.send(message).await.is_err() {
                    undelivered.push(event);
                    return Err("link closed while sending a job event".into());
                }
            }
            _ = heartbeat.tick() => {
                let message = pb::AgentMessage { msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat { samples: info.sampler.samples() })) };
                outbound.send(message).await.map_err(|_| "link closed while sending a heartbeat")?;
            }
        }
    }
}

fn obey(message: pb::ControllerMessage, attempts: &Arc<Attempts>, outbound: &mpsc::Sender<pb::AgentMessage>) {
    match message.msg {
        Some(pb::controller_message::Msg::Launch(launch)) => attempts.launch(launch),
        Some(pb::controller_message::Msg::Kill(kill)) => attempts.kill(
            kill.job_id,
            kill.epoch,
            Duration::from_secs(u64::from(kill.grace_seconds)),
        ),
        Some(pb::controller_message::Msg::ReadLog(request)) => attempts.stream_log(request, outbound.clone()),
        Some(pb::controller_message::Msg::Signal(signal)) => {
            attempts.signal(signal.job_id, signal.epoch, signal.signal)
        }
        None => tracing::warn!("empty message from gpoold ignored"),
    }
}
