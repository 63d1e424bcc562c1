use super::*;
use proptest::prelude::*;

fn spec_asking(mem_bytes: Option<u64>, cpus_per_gpu: Option<u32>) -> JobSpec {
    let mut spec = (*crate::testing::job_builder(crate::JobId(1)).build().spec).clone();
    spec.mem_bytes = mem_bytes;
    spec.cpus_per_gpu = cpus_per_gpu;
    spec
}

#[test]
fn a_label_reads_back_as_it_was_written() {
    assert_eq!(LimitSet::parse("cpu,devices,memory,pids"), LimitSet::ALL);
    assert_eq!(LimitSet::ALL.label(), "cpu,devices,memory,pids");
    assert_eq!(LimitSet::parse(""), LimitSet::NONE);
    assert_eq!(LimitSet::NONE.label(), "");
    let some = LimitSet::parse("memory, devices");
    assert_eq!(some.label(), "devices,memory");
    assert_eq!(some.words(), "devices, memory");
    assert_eq!(LimitSet::NONE.words(), "nothing");
    // A newer agent's limit this controller does not know is passed over.
    assert_eq!(LimitSet::parse("memory,io"), LimitSet::NONE.with(Limit::Memory));
}

#[test]
fn a_node_whose_agent_does_not_say_enforces_nothing() {
    let mut labels = BTreeMap::new();
    assert_eq!(LimitSet::of_node(&labels), LimitSet::NONE);
    labels.insert(LABEL.to_string(), String::new());
    assert_eq!(LimitSet::of_node(&labels), LimitSet::NONE);
    labels.insert(LABEL.to_string(), "cpu,memory".to_string());
    assert_eq!(LimitSet::of_node(&labels), LimitSet::parse("cpu,memory"));
}

#[test]
fn a_job_asks_for_memory_and_cpu_limits_it_was_given_only() {
    assert_eq!(asked_by(&spec_asking(None, None)), LimitSet::NONE);
    assert_eq!(asked_by(&spec_asking(Some(1 << 30), None)), LimitSet::parse("memory"));
    assert_eq!(asked_by(&spec_asking(None, Some(4))), LimitSet::parse("cpu"));
    assert_eq!(
        asked_by(&spec_asking(Some(1 << 30), Some(4))),
        LimitSet::parse("cpu,memory")
    );
    // A pool's defaults are written into the spec: they count as asked.
    let mut spec = spec_asking(None, None);
    crate::model::PoolDefaults {
        cpus_per_gpu: None,
        mem_per_gpu_bytes: Some(1 << 30),
    }
    .apply(&mut spec);
    assert_eq!(asked_by(&spec), LimitSet::parse("memory"));
}

#[test]
fn what_a_node_does_not_enforce_of_what_a_job_asks_is_unenforced() {
    let asked = LimitSet::parse("cpu,memory");
    assert_eq!(unenforced(asked, Some(LimitSet::ALL)), LimitSet::NONE);
    assert_eq!(
        unenforced(asked, Some(LimitSet::parse("devices,memory,pids"))),
        LimitSet::parse("cpu")
    );
    assert_eq!(
        unenforced(asked, None),
        asked,
        "an agent that does not say enforces nothing"
    );
    assert_eq!(
        unenforced(LimitSet::NONE, None),
        LimitSet::NONE,
        "a job that asks nothing runs anywhere"
    );
}

#[test]
fn the_warning_names_the_node_the_limit_and_the_ask() {
    let spec = spec_asking(Some(16 << 30), Some(4));
    assert_eq!(
        warning("n1", LimitSet::parse("memory"), &spec),
        "warning: node n1 does not enforce memory (--mem 16G): the job may use more"
    );
    assert_eq!(
        warning("n2", LimitSet::parse("cpu,memory"), &spec),
        "warning: node n2 does not enforce cpu (--cpus-per-gpu 4) or memory (--mem 16G): the job may use more"
    );
    assert_eq!(size_words(256 << 20), "256M");
    assert_eq!(size_words(1536 << 10), "1536K");
    assert_eq!(size_words(1000), "1000");
}

#[test]
fn the_mode_is_refuse_or_warn() {
    assert_eq!(EnforceLimits::default(), EnforceLimits::Refuse);
    assert_eq!(EnforceLimits::parse("warn"), Ok(EnforceLimits::Warn));
    assert_eq!(EnforceLimits::parse("refuse"), Ok(EnforceLimits::Refuse));
    let err = EnforceLimits::parse("ignore").unwrap_err();
    assert!(err.contains("\"ignore\" is not \"refuse\" or \"warn\""), "{err}");
}

fn any_set() -> impl Strategy<Value = LimitSet> {
    (0u8..16).prop_map(LimitSet)
}

proptest! {
    /// Never a silent pass: every limit a job asks for is either enforced
    /// by the node or named as unenforced, and nothing the node enforces
    /// (or the job does not ask for) is named.
    #[test]
    fn every_asked_limit_is_enforced_or_named(asked in any_set(), enforced in any_set()) {
        let missing = unenforced(asked, Some(enforced));
        for limit in Limit::ALL {
            let named = missing.contains(limit);
            prop_assert_eq!(named, asked.contains(limit) && !enforced.contains(limit));
        }
        prop_assert!(missing.is_subset(asked));
        prop_assert_eq!(unenforced(asked, None), asked);
        prop_assert!(unenforced(asked, Some(LimitSet::ALL)).is_empty());
    }

    /// A label an agent writes reads back as the same set.
    #[test]
    fn a_set_survives_its_label(set in any_set()) {
        prop_assert_eq!(LimitSet::parse(&set.label()), set);
        let mut names = set.names();
        names.sort_unstable();
        prop_assert_eq!(names.join(","), set.label());
    }
}
