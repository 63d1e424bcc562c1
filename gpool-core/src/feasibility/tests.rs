//! Tests for the submit-time feasibility check.

use super::*;
use crate::testing::{job_builder, node};
use crate::JobId;

fn spec(gpus: u32, nodes: u32, types: &[&str]) -> JobSpec {
    job_builder(JobId(1))
        .gpus(gpus)
        .nodes(nodes)
        .gpu_types(types)
        .build()
        .spec
}

#[test]
fn no_nodes_yet_accepts_everything() {
    assert_eq!(check_feasible(&spec(64, 9, &["b200"]), &Policy::default(), &[]), Ok(()));
}

#[test]
fn too_many_gpus_names_the_largest_fit() {
    let nodes = [node("n1", 8, "h100"), node("n2", 4, "l4")];
    let err = check_feasible(&spec(16, 1, &[]), &Policy::default(), &nodes).unwrap_err();
    assert_eq!(
        err.to_string(),
        "gpus: no node of pool \"default\" has 16 GPUs of an acceptable model; the largest fit is 8 h100 GPUs on one node"
    );
    assert_eq!(check_feasible(&spec(8, 1, &[]), &Policy::default(), &nodes), Ok(()));
}

#[test]
fn unknown_model_and_too_many_nodes() {
    let nodes = [node("n1", 8, "h100"), node("n2", 8, "h100"), node("n3", 4, "l4")];
    let err = check_feasible(&spec(1, 1, &["a100"]), &Policy::default(), &nodes).unwrap_err();
    assert_eq!(
        err.to_string(),
        "gpu_type: no node of pool \"default\" has a GPU of model a100 (models there: h100, l4)"
    );
    let err = check_feasible(&spec(8, 3, &[]), &Policy::default(), &nodes).unwrap_err();
    assert_eq!(
        err.to_string(),
        "nodes: pool \"default\" cannot give 8 GPUs on each of 3 nodes; the largest fit is 2 nodes with 8 h100 GPUs each"
    );
}

#[test]
fn drained_and_down_nodes_still_count() {
    let mut drained = node("n1", 8, "h100");
    drained.drain_reason = Some("maintenance".into());
    drained.alive = false;
    assert_eq!(
        check_feasible(&spec(8, 1, &["h100"]), &Policy::default(), &[drained]),
        Ok(())
    );
}

#[test]
fn unknown_pool_is_refused() {
    let mut job = spec(1, 1, &[]);
    job.pool = "gpu-xl".into();
    let err = check_feasible(&job, &Policy::default(), &[]).unwrap_err();
    assert_eq!(err.to_string(), "pool: unknown pool \"gpu-xl\" (known: default)");
}
