//! A pending job's reasons as data (`reason_details` in JSON) and as text
//! rendered from it: each reason's sentence under its code, and the hint
//! that goes with it.

use gpool_proto::pb;
use serde_json::{json, Map, Value};

/// `{code, reason, hint, ...facts}`: the facts its code has, no others.
pub fn reason_json(reason: &pb::Reason) -> Value {
    let mut object = Map::new();
    object.insert("code".into(), json!(reason.code));
    object.insert("reason".into(), json!(reason.words));
    object.insert("hint".into(), json!((!reason.hint.is_empty()).then_some(&reason.hint)));
    let texts = [
        ("pool", &reason.pool),
        ("team", &reason.team),
        ("user", &reason.user),
        ("reservation", &reason.reservation),
    ];
    for (name, value) in texts {
        if let Some(value) = value {
            object.insert(name.into(), json!(value));
        }
    }
    let counts = [
        ("limit", reason.limit),
        ("in_use", reason.in_use),
        ("gpus_wanted", reason.gpus_wanted),
        ("gpus_free", reason.gpus_free),
        ("gpus_free_on_one_node", reason.gpus_free_on_one_node),
        ("gpus_kept", reason.gpus_kept),
        ("nodes_wanted", reason.nodes_wanted),
        ("nodes_with_enough", reason.nodes_with_enough),
        ("nodes_down", reason.nodes_down),
        ("nodes_draining", reason.nodes_draining),
        ("in_secs", reason.in_secs),
        ("job", reason.job),
        ("count", reason.count),
    ];
    for (name, value) in counts {
        if let Some(value) = value {
            object.insert(name.into(), json!(value));
        }
    }
    if !reason.models_wanted.is_empty() || !reason.models_available.is_empty() {
        object.insert("models_wanted".into(), json!(reason.models_wanted));
        object.insert("models_available".into(), json!(reason.models_available));
    }
    if !reason.limits.is_empty() {
        object.insert("limits".into(), json!(reason.limits));
    }
    if let Some(at) = reason.at_ms {
        object.insert("at".into(), json!(super::rfc3339(at)));
    }
    Value::Object(object)
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
