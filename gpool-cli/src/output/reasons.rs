//! A pending job's reasons as data (`reason_details` in JSON) and as text
//! rendered from it: each reason's sentence under its code, and the hint
//! that goes with it.

use gpool_proto::pb;
use serde_json::Value;

/// `{code, reason, hint, ...facts}`: the facts its code has, no others
/// (keys in order, as a JSON object's map keeps them).
#[derive(serde::Serialize)]
pub struct ReasonJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<String>,
    code: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpus_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpus_free_on_one_node: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpus_kept: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpus_wanted: Option<u64>,
    hint: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    in_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    in_use: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    limits: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    models_available: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    models_wanted: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nodes_down: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nodes_draining: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nodes_with_enough: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nodes_wanted: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pool: Option<&'a str>,
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    team: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
}

/// A reason as `ReasonJson` prints it: serialized straight from the
/// message (a listing of thousands of waiting jobs builds no maps).
pub fn reason_view(reason: &pb::Reason) -> ReasonJson<'_> {
    let models = !reason.models_wanted.is_empty() || !reason.models_available.is_empty();
    ReasonJson {
        at: reason.at_ms.map(super::rfc3339),
        code: &reason.code,
        count: reason.count,
        gpus_free: reason.gpus_free,
        gpus_free_on_one_node: reason.gpus_free_on_one_node,
        gpus_kept: reason.gpus_kept,
        gpus_wanted: reason.gpus_wanted,
        hint: (!reason.hint.is_empty()).then_some(reason.hint.as_str()),
        in_secs: reason.in_secs,
        in_use: reason.in_use,
        job: reason.job,
        limit: reason.limit,
        limits: &reason.limits,
        models_available: models.then_some(reason.models_available.as_slice()),
        models_wanted: models.then_some(reason.models_wanted.as_slice()),
        nodes_down: reason.nodes_down,
        nodes_draining: reason.nodes_draining,
        nodes_with_enough: reason.nodes_with_enough,
        nodes_wanted: reason.nodes_wanted,
        pool: reason.pool.as_deref(),
        reason: &reason.words,
        reservation: reason.reservation.as_deref(),
        team: reason.team.as_deref(),
        user: reason.user.as_deref(),
    }
}

/// One text of each of a job's reasons (its sentence, or its code), as a
/// JSON array: a listing of thousands of jobs builds no vector for it.
pub struct ReasonTexts<'a>(pub &'a [pb::Reason], pub for<'r> fn(&'r pb::Reason) -> &'r str);

impl serde::Serialize for ReasonTexts<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(self.1))
    }
}

/// A reason's sentence.
pub fn words_of(reason: &pb::Reason) -> &str {
    &reason.words
}

/// A reason's stable snake_case code.
pub fn code_of(reason: &pb::Reason) -> &str {
    &reason.code
}

/// What would make the job start sooner: its reasons' hints.
pub fn hints(job: &pb::Job) -> impl Iterator<Item = &str> {
    job.reasons
        .iter()
        .map(|reason| reason.hint.as_str())
        .filter(|hint| !hint.is_empty())
}

/// `reason_view` as a JSON value.
pub fn reason_json(reason: &pb::Reason) -> Value {
    serde_json::to_value(reason_view(reason)).unwrap_or(Value::Null)
}

pub fn reasons_json(job: &pb::Job) -> Vec<Value> {
    job.reasons.iter().map(reason_json).collect()
}

/// Each reason as lines of text: `because SENTENCE (CODE)`, then what
/// would help with it.
pub fn reason_lines(job: &pb::Job) -> Vec<String> {
    let mut lines = Vec::new();
    for reason in &job.reasons {
        lines.push(format!("because {} ({})", reason.words, reason.code));
        if !reason.hint.is_empty() {
            lines.push(format!("  to start sooner: {}", reason.hint));
        }
    }
    lines
}
