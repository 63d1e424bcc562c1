//! Fuzzing of every wire message, as proptest cases (bounded time, in CI):
//! any bytes decode to a message or an error, never a panic, and what
//! decodes goes through the same conversions and checks gpoold applies.

use gpool_proto::convert;
use gpool_proto::pb;
use proptest::prelude::*;
use prost::Message;

/// Decodes `bytes` as each message type in turn.
macro_rules! decode_all {
    ($bytes:expr, $($ty:ty),+ $(,)?) => {
        $( let _ = <$ty>::decode($bytes); )+
    };
}

fn decode_every_type(bytes: &[u8]) {
    decode_all!(
        bytes,
        pb::WhoAmIRequest,
        pb::WhoAmIResponse,
        pb::CreateTokenRequest,
        pb::CreateTokenResponse,
        pb::ListTokensRequest,
        pb::ListTokensResponse,
        pb::RevokeTokenRequest,
        pb::TokenInfo,
        pb::ReloadPolicyRequest,
        pb::ReloadPolicyResponse,
        pb::GetUsageRequest,
        pb::TeamUsage,
        pb::GetUsageResponse,
        pb::ReportCheckpointRequest,
        pb::ReportCheckpointResponse,
        pb::JobLogsRequest,
        pb::LogChunk,
        pb::Duration,
        pb::EnvVar,
        pb::JobSpec,
        pb::Placement,
        pb::Job,
        pb::PriorityFactors,
        pb::SubmitJobsRequest,
        pb::SubmitJobsResponse,
        pb::CancelJobsRequest,
        pb::CancelOutcome,
        pb::CancelJobsResponse,
        pb::GetJobRequest,
        pb::ListJobsRequest,
        pb::ListJobsResponse,
        pb::WatchJobsRequest,
        pb::Gpu,
        pb::Label,
        pb::Node,
        pb::GpuLink,
        pb::ListNodesRequest,
        pb::ListNodesResponse,
        pb::DrainNodeRequest,
        pb::ResumeNodeRequest,
        pb::AgentMessage,
        pb::LogData,
        pb::RunningAttempt,
        pb::Register,
        pb::GpuSample,
        pb::Heartbeat,
        pb::JobEvent,
        pb::ControllerMessage,
        pb::Lease,
        pb::Signal,
        pb::ReadLog,
        pb::Launch,
        pb::RemoveNodeRequest,
        pb::RemoveNodeResponse,
        pb::Kill
    );
}

/// What gpoold does with the messages clients and agents send.
fn convert_what_decodes(bytes: &[u8]) {
    if let Ok(request) = pb::SubmitJobsRequest::decode(bytes) {
        for spec in request.specs {
            if let Ok(spec) = pb::JobSpec::decode(spec) {
                let _ = convert::spec_from_wire(spec).validate();
            }
        }
    }
    if let Ok(message) = pb::AgentMessage::decode(bytes) {
        if let Some(pb::agent_message::Msg::Register(register)) = message.msg {
            let _ = convert::topology_from_wire(&register.links);
            let _ = convert::labels_from_wire(register.labels);
            register
                .gpus
                .into_iter()
                .for_each(|gpu| drop(convert::gpu_from_wire(gpu)));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        decode_every_type(&bytes);
        convert_what_decodes(&bytes);
    }

    /// Valid messages with bytes changed: past the first field, where
    /// random bytes rarely get.
    #[test]
    fn mutated_messages_decode_or_fail_cleanly(
        command in proptest::collection::vec(".{0,40}", 0..6),
        env in proptest::collection::vec(("[A-Z_]{1,8}", ".{0,20}"), 0..6),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let spec = pb::JobSpec {
            command,
            env: env.into_iter().map(|(name, value)| pb::EnvVar { name, value }).collect(),
            gpus: 1,
            nodes: 1,
            ..pb::JobSpec::default()
        };
        let mut bytes = pb::SubmitJobsRequest::new(&[spec.clone(), spec]).encode_to_vec();
        for (at, value) in flips {
            let len = bytes.len();
            bytes[at.index(len)] = value;
        }
        let len = bytes.len();
        bytes.truncate(cut.index(len + 1));
        decode_every_type(&bytes);
        convert_what_decodes(&bytes);
    }
}
