use super::*;
use gpool_core::testing::job_builder;
use gpool_core::JobId;

#[test]
fn spec_round_trips_through_the_wire() {
    let mut spec = (*job_builder(JobId(1)).gpus(4).nodes(2).gpu_types(&["h100"]).build().spec).clone();
    spec.time_limit_secs = Some(3600);
    spec.env = vec![("A".into(), "1".into())].into();
    assert_eq!(spec_from_wire(spec_to_wire(&spec)), spec);
    spec.array = Some(Box::new(ArraySpec::parse("1,3,10-20:5%2").unwrap()));
    spec.stdout_path = "out/%A_%a.log".into();
    spec.stderr_path = "err/%j.log".into();
    assert_eq!(spec_from_wire(spec_to_wire(&spec)), spec);
}

#[test]
fn state_names_parse_back() {
    for name in ["pending", "running", "completed", "failed", "cancelled", "RUNNING"] {
        let state = state_from_name(name).expect(name);
        assert_eq!(state_name(state), name.to_ascii_lowercase());
    }
    assert_eq!(state_from_name("done"), None);
}
