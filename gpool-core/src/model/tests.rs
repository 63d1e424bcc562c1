use super::Job;
use crate::ids::JobId;
use crate::testing::job_builder;
use std::sync::Arc;

fn stored(job: &Job) -> Vec<u8> {
    serde_json::to_vec(job).expect("encode")
}

#[test]
fn alike_jobs_read_one_after_another_share_one_spec() {
    let (a, b) = (
        job_builder(JobId(1)).gpus(2).build(),
        job_builder(JobId(2)).gpus(2).build(),
    );
    let other = job_builder(JobId(3)).gpus(4).build();
    let read = |job: &Job| serde_json::from_slice::<Job>(&stored(job)).expect("decode");
    let (read_a, read_b, read_other) = (read(&a), read(&b), read(&other));
    assert!(Arc::ptr_eq(&read_a.spec, &read_b.spec));
    assert!(!Arc::ptr_eq(&read_b.spec, &read_other.spec));
    assert_eq!((read_a, read_b, read_other.clone()), (a, b, other));
    // A job read again after another spec gets its own, as read.
    let again = read(&job_builder(JobId(4)).gpus(2).build());
    assert_eq!(again.spec.gpus_per_node, 2);
    assert!(!Arc::ptr_eq(&again.spec, &read_other.spec));
}

#[test]
fn a_shared_spec_changes_for_one_job_alone() {
    let job = job_builder(JobId(1)).gpus(1).build();
    let mut first: Job = serde_json::from_slice(&stored(&job)).expect("decode");
    let second: Job = serde_json::from_slice(&stored(&job)).expect("decode");
    Arc::make_mut(&mut first.spec).name = "renamed".into();
    assert_eq!(second.spec.name, job.spec.name);
}

#[test]
fn a_bad_spec_names_the_spec_and_the_field() {
    let mut value: serde_json::Value = serde_json::to_value(job_builder(JobId(1)).build()).expect("encode");
    value["spec"].as_object_mut().expect("spec").remove("workdir");
    let err = serde_json::from_value::<Job>(value.clone())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    let err_text = serde_json::from_str::<Job>(&value.to_string())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err_text.contains("spec: missing field `workdir`"), "{err_text}");
    assert!(err.contains("workdir"), "{err}");
}
