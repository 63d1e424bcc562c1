//! The AgentLink service: one bidirectional stream per agent.

use crate::error::Error;
use crate::state::{AgentConn, AgentEvent, AttemptOutcome, Command, StateHandle};
use gpool_core::job_state::ExitStatus;
use gpool_core::model::Node;
use gpool_core::{Epoch, JobId};
use gpool_proto::convert::{gpu_from_wire, labels_from_wire, topology_from_wire};
use gpool_proto::pb;
use gpool_proto::pb::agent_link_server::AgentLink;
use std::collections::HashSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

pub struct AgentLinkService {
    pub state: StateHandle,
    pub next_conn_id: AtomicU64,
    pub logs: super::LogRelay,
    pub security: std::sync::Arc<crate::security::Security>,
    /// Set when gpoold is stopping: each link's stream ends then, so the
    /// agents redial (a restarted or newly elected controller) at once
    /// instead of holding the shutdown up.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

type ControllerStream = Pin<Box<dyn Stream<Item = Result<pb::ControllerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentLink for AgentLinkService {
    type ConnectStream = ControllerStream;

    async fn connect(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<ControllerStream>, Status> {
        let ip = super::remote_addr(&request).map_or_else(|| "127.0.0.1".to_string(), |addr| addr.ip().to_string());
        let agent = request
            .extensions()
            .get::<super::AgentIdentity>()
            .cloned()
            .ok_or_else(|| Status::unauthenticated("the link did not pass authentication"))?;
        let mut inbound = request.into_inner();
        let register = match inbound.message().await? {
            Some(pb::AgentMessage {
                msg: Some(pb::agent_message::Msg::Register(register)),
            }) => register,
            _ => return Err(invalid("the first message of a link must be Register")),
        };
        let ended: Vec<AgentEvent> = register.ended.iter().cloned().filter_map(event_from_wire).collect();
        let (node, running) = node_from_register(register)?;
        let node_name = node.name.clone();
        if let Err(reason) = gpool_core::auth::agent_speaks_for(agent.cert_node.as_deref(), &node_name) {
            return Err(self.refuse_register(&agent, &node_name, reason));
        }
        let (outbox, outbound) = crate::state::Outbox::new();
        // Weak: the link's stream still ends when the state drops the link.
        let stop_logs = outbox.downgrade();
        let conn_id = self.next_conn_id.fetch_add(1, Ordering::Relaxed);
        let conn = AgentConn {
            id: conn_id,
            outbox,
            ip,
            cert_serial: agent.cert_serial,
        };
        self.state
            .call(|reply| Command::AgentRegister {
                node,
                running,
                ended,
                conn,
                reply,
            })
            .await?;
        tracing::info!(node = %node_name, "agent registered");
        let state = self.state.clone();
        let logs = self.logs.clone();
        // Ends when the agent closes its stream or the link breaks.
        tokio::spawn(relay_agent_messages(
            inbound, state, logs, stop_logs, node_name, conn_id,
        ));
        let mut stopping = self.stopping.clone();
        let outbound = futures_util::StreamExt::take_until(outbound, async move {
            let _ = stopping.wait_for(|stopping| *stopping).await;
        });
        Ok(Response::new(Box::pin(outbound)))
    }
}

impl AgentLinkService {
    /// Logs and audits a Register refused to a certificate that does not
    /// speak for `node_name`: the status to answer.
    fn refuse_register(&self, agent: &super::AgentIdentity, node_name: &str, reason: String) -> Status {
        tracing::warn!(peer = %agent.peer, "register refused: {reason}");
        self.security.audit(&crate::security::AuditEntry {
            at: crate::security::now_text(),
            caller: agent.cert_node.as_deref().unwrap_or(""),
            via: "agent certificate",
            peer: &agent.peer,
            action: "agent register",
            object: node_name,
            outcome: format!("refused: {reason}"),
        });
        Status::permission_denied(reason)
    }
}

/// Hands what an agent says on its link to the state task until the link
/// closes, then tells the state the agent is gone.
async fn relay_agent_messages(
    mut inbound: Streaming<pb::AgentMessage>,
    state: StateHandle,
    logs: super::LogRelay,
    stop_logs: crate::state::WeakOutbox,
    node_name: String,
    conn_id: u64,
) {
    while let Ok(Some(message)) = inbound.message().await {
        let command = match message.msg {
            Some(pb::agent_message::Msg::Heartbeat(heartbeat)) => Command::AgentHeartbeat {
                node: node_name.clone(),
                conn_id,
                samples: heartbeat.samples,
                seq: heartbeat.seq,
                // An Xid storm is cut short (the agent caps it too).
                xids: heartbeat.xids.into_iter().take(256).collect(),
                mps_faults: (heartbeat.mps_faults.into_iter().take(256))
                    .map(|fault| pb::MpsFault {
                        index: fault.index,
                        why: fault.why.chars().take(512).collect(),
                    })
                    .collect(),
                health_check: heartbeat.health_check,
                spool_short: heartbeat.spool_short.chars().take(512).collect(),
                readings_stuck: heartbeat.readings_stuck.chars().take(512).collect(),
            },
            Some(pb::agent_message::Msg::JobEvent(event)) => match event_from_wire(event) {
                Some(event) => Command::AgentJobEvent {
                    node: node_name.clone(),
                    conn_id,
                    event,
                },
                None => continue,
            },
            Some(pb::agent_message::Msg::LogData(data)) => {
                let request_id = data.request_id;
                if logs.deliver(&node_name, data) {
                    if let Some(outbox) = stop_logs.upgrade() {
                        let stop = pb::StopLog { request_id };
                        let _ = outbox.send(pb::ControllerMessage {
                            term: 0,
                            msg: Some(pb::controller_message::Msg::StopLog(stop)),
                        });
                    }
                }
                continue;
            }
            Some(pb::agent_message::Msg::Register(_)) | None => continue,
        };
        if state.agent_commands.send(command).await.is_err() {
            return;
        }
    }
    tracing::info!(node = %node_name, "agent link closed");
    let _ = state
        .agent_commands
        .send(Command::AgentGone {
            node: node_name,
            conn_id,
        })
        .await;
}

fn invalid(reason: &str) -> Status {
    Error::InvalidRequest {
        field: "register",
        reason: reason.to_string(),
    }
    .into()
}

/// Checks what an agent says about its node before the state sees it.
fn node_from_register(register: pb::Register) -> Result<(Node, Vec<(JobId, Epoch)>), Status> {
    let name_ok = !register.node.is_empty()
        && register.node.len() <= 253
        && register
            .node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !name_ok {
        return Err(invalid(&format!("node name {:?} is not a host name", register.node)));
    }
    check_gpu_indices(&register)?;
    check_labels(&register)?;
    check_gpu_names(&register)?;
    let node = Node {
        name: register.node,
        gpus: register.gpus.into_iter().map(gpu_from_wire).collect(),
        labels: labels_from_wire(register.labels),
        drain_reason: None,
        drained_by: None,
        alive: true,
        topology: topology_from_wire(&register.links),
        gpus_out: Default::default(),
        health_drain: None,
        health_log: Vec::new(),
        boot_id: register
            .boot_id
            .chars()
            .filter(char::is_ascii_graphic)
            .take(64)
            .collect(),
        cpus: register.cpus,
        memory_bytes: register.memory_bytes,
    };
    let running = register
        .running
        .iter()
        .map(|a| (JobId(a.job_id), Epoch(a.epoch)))
        .collect();
    Ok((node, running))
}

/// Checks that a Register's GPU indices are distinct and in range, and that
/// its topology links only those GPUs.
fn check_gpu_indices(register: &pb::Register) -> Result<(), Status> {
    let mut seen = HashSet::new();
    for gpu in &register.gpus {
        if gpu.index > 4096 || !seen.insert(gpu.index) {
            return Err(invalid(&format!(
                "node {}: GPU index {} is repeated or out of range",
                register.node, gpu.index
            )));
        }
    }
    if let Some(link) = register
        .links
        .iter()
        .find(|l| !seen.contains(&l.a) || !seen.contains(&l.b))
    {
        return Err(invalid(&format!(
            "node {}: topology links GPU {} and GPU {}, which it does not report",
            register.node, link.a, link.b
        )));
    }
    Ok(())
}

/// Checks a Register's labels: how many, their sizes, and that they are
/// printable.
fn check_labels(register: &pb::Register) -> Result<(), Status> {
    const MAX_LABELS: usize = 64;
    if register.labels.len() > MAX_LABELS {
        return Err(invalid(&format!(
            "node {}: {} labels, more than the limit of {MAX_LABELS}",
            register.node,
            register.labels.len()
        )));
    }
    if let Some(label) = register
        .labels
        .iter()
        .find(|label| label.key.is_empty() || label.key.len() > 63 || label.value.len() > 253)
    {
        return Err(invalid(&format!(
            "node {}: label {:.63?} must have a key of 1 to 63 bytes and a value of at most 253",
            register.node, label.key
        )));
    }
    if let Some(label) = register
        .labels
        .iter()
        .find(|label| !printable(&label.key) || !printable(&label.value))
    {
        return Err(invalid(&format!(
            "node {}: label {:.63?} holds a control character",
            register.node, label.key
        )));
    }
    Ok(())
}

/// Checks that a Register's GPU names are printable and of a sane size, and
/// that it has no more GPUs and links than a node has.
fn check_gpu_names(register: &pb::Register) -> Result<(), Status> {
    if let Some(gpu) = register.gpus.iter().find(|gpu| {
        gpu.model.is_empty()
            || gpu.model.len() > 64
            || !printable(&gpu.model)
            || !printable(&gpu.uuid)
            || !printable(&gpu.pci_bus_id)
            || gpu.uuid.len() > 128
            || gpu.pci_bus_id.len() > 64
    }) {
        return Err(invalid(&format!(
            "node {}: GPU {}: its model ({:.64?}), UUID and PCI bus id must be printable, the model 1 to 64 bytes",
            register.node, gpu.index, gpu.model
        )));
    }
    if register.gpus.len() > 4096 || register.links.len() > 65_536 {
        return Err(invalid(&format!(
            "node {}: {} GPUs and {} links, more than a node has",
            register.node,
            register.gpus.len(),
            register.links.len()
        )));
    }
    Ok(())
}

/// What an agent names is printed in tables, logs and the status page:
/// no control characters (a newline would forge a line of its own).
fn printable(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

fn event_from_wire(event: pb::JobEvent) -> Option<AgentEvent> {
    let cause = event.cause();
    let outcome = match (event.outcome?, cause) {
        (pb::job_event::Outcome::Started(_), _) => AttemptOutcome::Started,
        (pb::job_event::Outcome::FailedToStart(reason), pb::EndCause::NodeRefused) => AttemptOutcome::Refused(reason),
        (pb::job_event::Outcome::FailedToStart(reason), _) => AttemptOutcome::FailedToStart(reason),
        (_, pb::EndCause::OutputLimit) => AttemptOutcome::OutputLimit,
        (_, pb::EndCause::TimeLimit) => AttemptOutcome::TimedOut,
        (_, pb::EndCause::Fenced) => AttemptOutcome::Fenced,
        (_, pb::EndCause::OutOfMemory) => AttemptOutcome::OutOfMemory,
        (
            pb::job_event::Outcome::ExitCode(code),
            pb::EndCause::Killed | pb::EndCause::Vanished | pb::EndCause::NodeRefused,
        ) => AttemptOutcome::Stopped(ExitStatus::Code(code)),
        (
            pb::job_event::Outcome::Signal(signal),
            pb::EndCause::Killed | pb::EndCause::Vanished | pb::EndCause::NodeRefused,
        ) => AttemptOutcome::Stopped(ExitStatus::Signal(signal.clamp(0, 127))),
        (pb::job_event::Outcome::ExitCode(code), pb::EndCause::Own) => AttemptOutcome::Exited(ExitStatus::Code(code)),
        (pb::job_event::Outcome::Signal(signal), pb::EndCause::Own) => {
            AttemptOutcome::Exited(ExitStatus::Signal(signal.clamp(0, 127)))
        }
    };
    Some(AgentEvent {
        job: JobId(event.job_id),
        epoch: Epoch(event.epoch),
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(model: &str, label: (&str, &str)) -> pb::Register {
        pb::Register {
            node: "n1".into(),
            gpus: vec![pb::Gpu {
                index: 0,
                uuid: "GPU-1".into(),
                model: model.into(),
                memory_mib: 1,
                ..Default::default()
            }],
            labels: vec![pb::Label {
                key: label.0.into(),
                value: label.1.into(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn names_with_control_characters_are_refused_at_register() {
        assert!(node_from_register(register("h100", ("rack", "r1"))).is_ok());
        let forged = node_from_register(register("h100\nnode n9 up", ("rack", "r1"))).unwrap_err();
        assert!(forged.message().contains("must be printable"), "{}", forged.message());
        let label = node_from_register(register("h100", ("rack", "r1\u{1b}[2J"))).unwrap_err();
        assert!(label.message().contains("control character"), "{}", label.message());
        assert!(node_from_register(register("", ("rack", "r1"))).is_err());
    }
}
