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
        .as_ref()
        .clone()
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

fn with_requirements(gpus: u32, requires: crate::model::Requirements) -> JobSpec {
    JobSpec {
        requires,
        ..spec(gpus, 1, &[])
    }
}

#[test]
fn too_little_gpu_memory_is_refused_with_the_largest_there_is() {
    let nodes = [node("n1", 8, "h100"), node("n2", 8, "h100")];
    let wanted = crate::spec::parse_gpu_memory("100G").unwrap();
    let spec = with_requirements(
        1,
        crate::model::Requirements {
            min_gpu_memory_mib: wanted,
            ..Default::default()
        },
    );
    let err = check_feasible(&spec, &Policy::default(), &nodes).unwrap_err();
    assert_eq!(
        err.to_string(),
        "min_gpu_memory: no GPU of an acceptable model in pool \"default\" has 95368 MiB; the largest has 81920 MiB"
    );
    // "80G" is what an 80 GB card has.
    let eighty = crate::spec::parse_gpu_memory("80G").unwrap();
    let spec = with_requirements(
        1,
        crate::model::Requirements {
            min_gpu_memory_mib: eighty,
            ..Default::default()
        },
    );
    assert_eq!(check_feasible(&spec, &Policy::default(), &nodes), Ok(()));
}

#[test]
fn node_names_and_labels_are_checked_against_known_nodes() {
    let mut n1 = node("n1", 8, "h100");
    n1.labels.insert("rack".into(), "r1".into());
    let nodes = [n1, node("n2", 8, "h100")];
    let requires = |nodelist: &[&str], exclude: &[&str], constraint: &[(&str, &str)]| crate::model::Requirements {
        nodelist: nodelist.iter().map(|n| n.to_string()).collect(),
        exclude: exclude.iter().map(|n| n.to_string()).collect(),
        constraints: constraint.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    };
    let check = |r| check_feasible(&with_requirements(1, r), &Policy::default(), &nodes);
    assert_eq!(
        check(requires(&["n9"], &[], &[])).unwrap_err().to_string(),
        "nodelist: no node is named n9 (known: n1, n2)"
    );
    assert_eq!(
        check(requires(&[], &["n7"], &[])).unwrap_err().to_string(),
        "exclude: no node is named n7 (known: n1, n2)"
    );
    assert_eq!(
        check(requires(&[], &[], &[("rack", "r2")])).unwrap_err().to_string(),
        "constraint: no node of pool \"default\" has the labels rack=r2"
    );
    assert_eq!(
        check(requires(&["n2"], &[], &[("rack", "r1")]))
            .unwrap_err()
            .to_string(),
        "nodelist: no node of pool \"default\" is left by nodelist, exclude and constraint together"
    );
    assert_eq!(check(requires(&["n1"], &["n2"], &[("rack", "r1")])), Ok(()));
}

#[test]
fn nvlink_required_counts_only_gpus_joined_by_nvlink() {
    use crate::topology::{group_links, Link, Topology};
    let mut pairs = node("n1", 4, "h100");
    pairs.topology = Topology::new(group_links(&[vec![0, 1], vec![2, 3]], Link::Nvlink));
    let required = |gpus| {
        with_requirements(
            gpus,
            crate::model::Requirements {
                nvlink: crate::model::NvlinkNeed::Required,
                ..Default::default()
            },
        )
    };
    assert_eq!(
        check_feasible(&required(2), &Policy::default(), &[pairs.clone()]),
        Ok(())
    );
    assert_eq!(
        check_feasible(&required(4), &Policy::default(), &[pairs.clone()])
            .unwrap_err()
            .to_string(),
        "nvlink: no node of pool \"default\" has 4 GPUs all joined by NVLink; the most is 2"
    );
    assert_eq!(check_feasible(&spec(4, 1, &[]), &Policy::default(), &[pairs]), Ok(()));
}

#[test]
fn requirements_that_shrink_the_fit_are_named_and_mig_slices_go_one_per_node() {
    let nodes = [node("n1", 8, "h100"), node("n2", 2, "h100")];
    let narrowed = with_requirements(
        4,
        crate::model::Requirements {
            nodelist: vec!["n2".into()],
            ..Default::default()
        },
    );
    assert_eq!(
        check_feasible(&narrowed, &Policy::default(), &nodes).unwrap_err().to_string(),
        "requirements: gpus: no node of pool \"default\" has 4 GPUs of an acceptable model; the largest fit is 2 h100 GPUs on one node, counting only the nodes and GPUs that its min_gpu_memory, nvlink, constraint, nodelist and exclude allow"
    );
    let slices = [node("m1", 7, "a100-1g.5gb")];
    assert_eq!(
        check_feasible(&spec(2, 1, &["a100-1g.5gb"]), &Policy::default(), &slices)
            .unwrap_err()
            .to_string(),
        "gpus: 2 GPUs of MIG slice a100-1g.5gb on one node: a job gets one slice per node (CUDA uses one MIG device per process)"
    );
    // A job that names no model never gets a slice.
    assert!(check_feasible(&spec(1, 1, &[]), &Policy::default(), &slices).is_err());
    assert_eq!(
        check_feasible(&spec(1, 1, &["a100-1g.5gb"]), &Policy::default(), &slices),
        Ok(())
    );
}

#[test]
fn memory_and_cpus_past_every_node_are_refused_where_nodes_said_theirs() {
    let host = |name: &str, cpus: u32, gib: u64| Node {
        cpus,
        memory_bytes: gib << 30,
        ..node(name, 8, "h100")
    };
    let nodes = [host("n1", 64, 512), host("n2", 128, 1024)];
    let mut big = spec(8, 1, &[]);
    big.mem_bytes = Some(5000 << 30);
    assert_eq!(
        check_feasible(&big, &Policy::default(), &nodes)
            .unwrap_err()
            .to_string(),
        "mem: no node of pool \"default\" has 5000.0 GiB of memory; the most is 1024.0 GiB"
    );
    big.mem_bytes = Some(1000 << 30);
    assert_eq!(check_feasible(&big, &Policy::default(), &nodes), Ok(()));
    big.cpus_per_gpu = Some(1000);
    assert_eq!(
        check_feasible(&big, &Policy::default(), &nodes).unwrap_err().to_string(),
        "cpus_per_gpu: 1000 CPUs for each of 8 GPUs is 8000 CPUs on a node; no node of pool \"default\" has that many (the most: 128)"
    );
    big.cpus_per_gpu = Some(16);
    assert_eq!(check_feasible(&big, &Policy::default(), &nodes), Ok(()));
    // A node that said nothing (an earlier agent) may be large enough.
    let mut unknown = nodes.to_vec();
    unknown.push(node("n3", 8, "h100"));
    big.cpus_per_gpu = Some(1000);
    assert_eq!(check_feasible(&big, &Policy::default(), &unknown), Ok(()));
}

#[test]
fn a_pools_defaults_fill_in_only_what_the_job_leaves_out() {
    let defaults = crate::model::PoolDefaults {
        cpus_per_gpu: Some(4),
        mem_per_gpu_bytes: Some(16 << 30),
    };
    let mut own_cpus = spec(2, 1, &[]);
    own_cpus.cpus_per_gpu = Some(1);
    defaults.apply(&mut own_cpus);
    assert_eq!((own_cpus.cpus_per_gpu, own_cpus.mem_bytes), (Some(1), Some(32 << 30)));
    let mut own_mem = spec(2, 1, &[]);
    own_mem.mem_bytes = Some(1 << 30);
    defaults.apply(&mut own_mem);
    assert_eq!((own_mem.cpus_per_gpu, own_mem.mem_bytes), (Some(4), Some(1 << 30)));
}
