use super::*;
use proptest::prelude::*;

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|name| name.to_string()).collect()
}

#[test]
fn host_lists_compress_as_slurm_writes_them() {
    assert_eq!(
        hostlist(&names(&["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07"])),
        "gpu-[01-04,07]"
    );
    assert_eq!(hostlist(&names(&["gpu-01"])), "gpu-01");
    assert_eq!(hostlist(&names(&["n9", "n10", "n11"])), "n[9-11]");
    assert_eq!(hostlist(&names(&["h100-b", "h100-a"])), "h100-b,h100-a");
    assert_eq!(hostlist(&names(&["a1", "b2", "a3", "a2"])), "a[1-3],b2");
    assert_eq!(hostlist(&names(&["x", "n1"])), "x,n1");
    assert_eq!(hostlist(&[]), "");
}

#[test]
fn tasks_per_node_runs_as_slurm_writes_them() {
    assert_eq!(tasks_per_node(&[4, 4]), "4(x2)");
    assert_eq!(tasks_per_node(&[2, 2, 2, 1]), "2(x3),1");
    assert_eq!(tasks_per_node(&[1]), "1");
}

#[test]
fn a_gang_rank_and_an_array_task_see_slurms_variables() {
    let nodes = names(&["gpu-01", "gpu-02"]);
    let job = SlurmJob {
        job_id: 42,
        name: "train",
        nodes: &nodes,
        submit_dir: "/home/alice/run",
        submit_host: "login-1",
        cluster: "gpool",
        partition: "default",
        account: "nlp",
        cpus_per_gpu: Some(8),
        mem_bytes: Some(64 << 30),
        restart_count: 1,
        tasks_per_node: 1,
        array: Some(SlurmArray {
            array_job_id: 40,
            task_id: 7,
            task_count: 10,
            task_min: 0,
            task_max: 9,
        }),
    };
    let vars: std::collections::BTreeMap<String, String> = env(&job, 1, 4).into_iter().collect();
    let get = |name: &str| vars.get(name).map(String::as_str).unwrap_or("<unset>");
    assert_eq!(get("SLURM_JOB_ID"), "42");
    assert_eq!(get("SLURM_JOB_NODELIST"), "gpu-[01-02]");
    assert_eq!(get("SLURM_NNODES"), "2");
    assert_eq!(get("SLURM_NTASKS"), "2");
    assert_eq!(get("SLURM_TASKS_PER_NODE"), "1(x2)");
    assert_eq!(
        (get("SLURM_PROCID"), get("SLURM_NODEID"), get("SLURM_LOCALID")),
        ("1", "1", "0")
    );
    assert_eq!(get("SLURM_GPUS_ON_NODE"), "4");
    assert_eq!(get("SLURM_CPUS_PER_TASK"), "32");
    assert_eq!(get("SLURM_MEM_PER_NODE"), "65536");
    assert_eq!(get("SLURM_RESTART_COUNT"), "1");
    assert_eq!(get("SLURM_SUBMIT_HOST"), "login-1");
    assert_eq!(
        (
            get("SLURM_ARRAY_JOB_ID"),
            get("SLURM_ARRAY_TASK_ID"),
            get("SLURM_ARRAY_TASK_COUNT")
        ),
        ("40", "7", "10")
    );
    assert_eq!((get("SLURM_ARRAY_TASK_MIN"), get("SLURM_ARRAY_TASK_MAX")), ("0", "9"));
    let plain = SlurmJob {
        array: None,
        cpus_per_gpu: None,
        mem_bytes: None,
        submit_host: "",
        ..job
    };
    let vars: std::collections::BTreeMap<String, String> = env(&plain, 0, 4).into_iter().collect();
    for unset in [
        "SLURM_ARRAY_TASK_ID",
        "SLURM_CPUS_PER_TASK",
        "SLURM_MEM_PER_NODE",
        "SLURM_SUBMIT_HOST",
    ] {
        assert!(!vars.contains_key(unset), "{unset}");
    }
    // Two tasks a node: the node's script is its first task.
    let two = SlurmJob {
        tasks_per_node: 2,
        ..plain
    };
    let vars: std::collections::BTreeMap<String, String> = env(&two, 1, 4).into_iter().collect();
    assert_eq!(vars["SLURM_NTASKS"], "4");
    assert_eq!(vars["SLURM_TASKS_PER_NODE"], "2(x2)");
    assert_eq!(
        (vars["SLURM_PROCID"].as_str(), vars["SLURM_NODEID"].as_str()),
        ("2", "1")
    );
}

proptest! {
    /// A compressed list names every host once, and nothing else.
    #[test]
    fn a_host_list_names_each_host(numbers in proptest::collection::btree_set(0u32..200, 1..30), padded in any::<bool>()) {
        let hosts: Vec<String> = numbers
            .iter()
            .map(|n| if padded { format!("gpu-{n:03}") } else { format!("gpu-{n}") })
            .collect();
        let list = hostlist(&hosts);
        let mut expanded = Vec::new();
        let inner = list.strip_prefix("gpu-").unwrap();
        let inner = inner.trim_start_matches('[').trim_end_matches(']');
        for part in inner.split(',') {
            match part.split_once('-') {
                Some((first, last)) => {
                    let width = first.len();
                    let (first, last): (u32, u32) = (first.parse().unwrap(), last.parse().unwrap());
                    for n in first..=last {
                        expanded.push(if padded { format!("gpu-{n:0width$}") } else { format!("gpu-{n}") });
                    }
                }
                None => expanded.push(format!("gpu-{part}")),
            }
        }
        prop_assert_eq!(expanded, hosts);
    }
}
