//! `gpool.v1.SubmitJobsRequest` as gpool programs hold it: each spec still
//! encoded, as it came off the wire. The wire form is the .proto's own
//! (`repeated JobSpec specs = 1`), so any gRPC client speaks to gpoold as
//! before; only gpool's Rust type differs (the generated code names this
//! one, by `extern_path`). A request of 100,000 specs is then one buffer
//! that gpoold decodes a spec at a time, never 100,000 decoded specs at
//! once, and a spec that repeats the one before it (a file of alike jobs)
//! is not decoded again. A field added to the message in the .proto must
//! be added here too (`tests/generated.rs` checks the fields).

use crate::pb;
use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType};
use prost::{DecodeError, Message};

const SPECS_TAG: u32 = 1;

#[derive(Clone, PartialEq, Default, Debug)]
pub struct SubmitJobsRequest {
    /// Each an encoded `JobSpec`; on gpoold's side, slices of the request's
    /// own buffer.
    pub specs: Vec<Bytes>,
}

impl SubmitJobsRequest {
    pub fn new<'a>(specs: impl IntoIterator<Item = &'a pb::JobSpec>) -> SubmitJobsRequest {
        SubmitJobsRequest {
            specs: specs.into_iter().map(|spec| spec.encode_to_vec().into()).collect(),
        }
    }
}

impl Message for SubmitJobsRequest {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for spec in &self.specs {
            prost::encoding::bytes::encode(SPECS_TAG, spec, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            SPECS_TAG => prost::encoding::bytes::merge_repeated(wire_type, &mut self.specs, buf, ctx),
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        prost::encoding::bytes::encoded_len_repeated(SPECS_TAG, &self.specs)
    }

    fn clear(&mut self) {
        self.specs.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The .proto's own form of the request, as any other client builds it.
    #[derive(Clone, PartialEq, prost::Message)]
    struct AsDeclared {
        #[prost(message, repeated, tag = "1")]
        specs: Vec<pb::JobSpec>,
    }

    fn spec(name: &str, gpus: u32) -> pb::JobSpec {
        pb::JobSpec {
            name: name.into(),
            command: vec!["true".into()],
            gpus,
            ..pb::JobSpec::default()
        }
    }

    #[test]
    fn the_wire_form_is_the_declared_one_both_ways() {
        let specs = vec![spec("a", 1), spec("b", 8), pb::JobSpec::default()];
        let declared = AsDeclared { specs: specs.clone() }.encode_to_vec();
        let ours = SubmitJobsRequest::new(&specs);
        assert_eq!(ours.encode_to_vec(), declared);
        assert_eq!(ours.encoded_len(), declared.len());
        let decoded = SubmitJobsRequest::decode(Bytes::from(declared)).expect("decodes");
        let back: Vec<pb::JobSpec> = decoded
            .specs
            .iter()
            .map(|spec| pb::JobSpec::decode(spec.clone()).expect("each spec decodes"))
            .collect();
        assert_eq!(back, specs);
    }

    #[test]
    fn unknown_fields_are_skipped() {
        let mut bytes = SubmitJobsRequest::new(&[spec("a", 1)]).encode_to_vec();
        // Field 2, varint 7.
        bytes.extend_from_slice(&[0x10, 0x07]);
        let decoded = SubmitJobsRequest::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(decoded.specs.len(), 1);
    }
}
