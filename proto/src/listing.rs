//! `gpool.v1.ListJobsResponse` as gpool programs hold it. The wire form is
//! the .proto's own (`repeated Job jobs = 1`), so any gRPC client lists
//! jobs as before; only gpool's Rust type differs (the generated code names
//! this one, by `extern_path`). The CLI decodes the jobs as usual. gpoold
//! encodes each job where it reads it (`push_encoded`), so a chunk of a
//! listing crosses to the connection's thread as one buffer, not as
//! thousands of strings; and the reasons that waiting jobs alike share are
//! encoded once and copied after each job's own fields. A field added to
//! the message in the .proto must be added here too (`tests/generated.rs`
//! checks the fields).

use crate::pb;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

const JOBS_TAG: u32 = 1;

/// `Job.reasons`' field number, for reasons encoded apart (`encode_reasons`).
const JOB_REASONS_TAG: u32 = 34;

#[derive(Clone, PartialEq, Default, Debug)]
pub struct ListJobsResponse {
    /// The jobs decoded (the CLI's side), or to encode.
    pub jobs: Vec<pb::Job>,
    /// Jobs already encoded as entries of field 1, sent after `jobs`
    /// (gpoold's side).
    pub encoded: Vec<u8>,
}

impl ListJobsResponse {
    /// Appends `job` encoded, with `more_reasons` (from `encode_reasons`)
    /// after the reasons it holds: the job decodes with both, in that order.
    pub fn push_encoded(&mut self, job: &pb::Job, more_reasons: &[u8]) {
        let len = job.encoded_len() + more_reasons.len();
        encoding::encode_key(JOBS_TAG, WireType::LengthDelimited, &mut self.encoded);
        encoding::encode_varint(len as u64, &mut self.encoded);
        job.encode_raw(&mut self.encoded);
        self.encoded.extend_from_slice(more_reasons);
    }
}

/// `reasons` as entries of `Job.reasons`, to follow any job's own fields
/// (`ListJobsResponse::push_encoded`): repeated fields may come in any
/// order, and a decoder appends each entry where it finds it.
pub fn encode_reasons<'a>(reasons: impl IntoIterator<Item = &'a pb::Reason>) -> Vec<u8> {
    let mut bytes = Vec::new();
    for reason in reasons {
        encoding::message::encode(JOB_REASONS_TAG, reason, &mut bytes);
    }
    bytes
}

impl Message for ListJobsResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for job in &self.jobs {
            encoding::message::encode(JOBS_TAG, job, buf);
        }
        buf.put_slice(&self.encoded);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            JOBS_TAG => encoding::message::merge_repeated(wire_type, &mut self.jobs, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        encoding::message::encoded_len_repeated(JOBS_TAG, &self.jobs) + self.encoded.len()
    }

    fn clear(&mut self) {
        self.jobs.clear();
        self.encoded.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The .proto's own form of the response, as any other client reads it.
    #[derive(Clone, PartialEq, prost::Message)]
    struct AsDeclared {
        #[prost(message, repeated, tag = "1")]
        jobs: Vec<pb::Job>,
    }

    fn reason(code: &str) -> pb::Reason {
        pb::Reason {
            code: code.into(),
            words: format!("waits: {code}"),
            hint: "wait".into(),
            pool: Some("default".into()),
            ..pb::Reason::default()
        }
    }

    fn job(id: u64, reasons: &[&str]) -> pb::Job {
        pb::Job {
            id,
            user: "alice".into(),
            spec: Some(pb::JobSpec {
                name: format!("job{id}"),
                command: vec!["true".into()],
                gpus: 1,
                ..pb::JobSpec::default()
            }),
            reasons: reasons.iter().map(|code| reason(code)).collect(),
            queue_position: Some(id as u32),
            ..pb::Job::default()
        }
    }

    #[test]
    fn the_wire_form_is_the_declared_one_both_ways() {
        let jobs = vec![job(1, &["resources"]), job(2, &[]), pb::Job::default()];
        let declared = AsDeclared { jobs: jobs.clone() }.encode_to_vec();
        let decoded = ListJobsResponse {
            jobs: jobs.clone(),
            encoded: Vec::new(),
        };
        assert_eq!(decoded.encode_to_vec(), declared);
        assert_eq!(decoded.encoded_len(), declared.len());
        let mut encoded = ListJobsResponse::default();
        jobs.iter().for_each(|job| encoded.push_encoded(job, &[]));
        assert_eq!(encoded.encode_to_vec(), declared);
        assert_eq!(encoded.encoded_len(), declared.len());
        assert_eq!(
            ListJobsResponse::decode(declared.as_slice()).expect("decodes").jobs,
            jobs
        );
    }

    #[test]
    fn reasons_encoded_apart_follow_the_jobs_own() {
        let own = job(7, &["requeued"]);
        let shared = [reason("resources"), reason("budget_exhausted")];
        let mut response = ListJobsResponse::default();
        response.push_encoded(&own, &encode_reasons(&shared));
        response.push_encoded(&job(8, &[]), &encode_reasons(&shared[..1]));
        let listed = AsDeclared::decode(response.encode_to_vec().as_slice()).expect("any client decodes it");
        let codes = |job: &pb::Job| job.reasons.iter().map(|r| r.code.clone()).collect::<Vec<_>>();
        assert_eq!(codes(&listed.jobs[0]), ["requeued", "resources", "budget_exhausted"]);
        assert_eq!(codes(&listed.jobs[1]), ["resources"]);
        // All else of the job is as it was.
        let mut whole = own.clone();
        whole.reasons.extend(shared.iter().cloned());
        assert_eq!(listed.jobs[0], whole);
    }

    #[test]
    fn unknown_fields_are_skipped() {
        let mut bytes = AsDeclared {
            jobs: vec![job(1, &[])],
        }
        .encode_to_vec();
        // Field 2, varint 7.
        bytes.extend_from_slice(&[0x10, 0x07]);
        let decoded = ListJobsResponse::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(decoded.jobs.len(), 1);
    }
}
