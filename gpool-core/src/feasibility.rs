//! Submit-time check: could any known node of the job's pool ever run it?
//!
//! Slurm refuses such a job at submit; gpool does too, and names the largest
//! fit there is. While a pool has no known node yet, every job is accepted
//! (it waits with the reason "no nodes").

use crate::model::{GpuModel, JobSpec, Node};
use crate::sched::Policy;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Infeasible {
    #[error("pool: unknown pool {pool:?} (known: {known})")]
    UnknownPool { pool: String, known: String },
    #[error("gpu_type: no node of pool {pool:?} has a GPU of model {wanted} (models there: {available})")]
    NoSuchModel {
        pool: String,
        wanted: String,
        available: String,
    },
    #[error(
        "gpus: no node of pool {pool:?} has {gpus_per_node} GPUs of an acceptable model; the largest fit is {largest}"
    )]
    TooManyGpus {
        pool: String,
        gpus_per_node: u32,
        largest: String,
    },
    #[error(
        "nodes: pool {pool:?} cannot give {gpus_per_node} GPUs on each of {nodes} nodes; the largest fit is {largest}"
    )]
    TooManyNodes {
        pool: String,
        gpus_per_node: u32,
        nodes: u32,
        largest: String,
    },
    #[error("{field}: no node is named {name} (known: {known})")]
    UnknownNode {
        field: &'static str,
        name: String,
        known: String,
    },
    #[error("{field}: no node of pool {pool:?} {what}")]
    NoNodeAllowed {
        field: &'static str,
        pool: String,
        what: String,
    },
    #[error(
        "min_gpu_memory: no GPU of an acceptable model in pool {pool:?} has {wanted_mib} MiB; the largest has {largest_mib} MiB"
    )]
    TooLittleMemory {
        pool: String,
        wanted_mib: u64,
        largest_mib: u64,
    },
    #[error(
        "gpu_mem: no GPU of an acceptable model in pool {pool:?} leaves {wanted_mib} MiB to fractions; the most any leaves is {largest_mib} MiB"
    )]
    ShareTooLarge {
        pool: String,
        wanted_mib: u64,
        largest_mib: u64,
    },
    #[error(
        "gpus: {gpus_per_node} GPUs of MIG slice {model} on one node: a job gets one slice per node (CUDA uses one MIG device per process)"
    )]
    MigSlices { model: String, gpus_per_node: u32 },
    #[error(
        "requirements: {detail}, counting only the nodes and GPUs that its min_gpu_memory, nvlink, constraint, nodelist and exclude allow"
    )]
    Requirements { detail: String },
    #[error("mem: no node of pool {pool:?} has {wanted} of memory; the most is {largest}")]
    TooMuchMemory {
        pool: String,
        wanted: String,
        largest: String,
    },
    #[error(
        "cpus_per_gpu: {cpus_per_gpu} CPUs for each of {gpus_per_node} GPUs is {wanted} CPUs on a node; no node of pool {pool:?} has that many (the most: {largest})"
    )]
    TooManyCpus {
        pool: String,
        cpus_per_gpu: u32,
        gpus_per_node: u32,
        wanted: u64,
        largest: u32,
    },
    #[error("nvlink: no node of pool {pool:?} has {gpus_per_node} GPUs all joined by NVLink; the most is {largest}")]
    NoNvlinkSet {
        pool: String,
        gpus_per_node: u32,
        largest: u32,
    },
}

/// The job's memory and CPUs per node against the largest allowed node of
/// its pool, where every such node said what it has (an agent of an
/// earlier release reports neither, and could be large enough).
fn check_host_resources(spec: &JobSpec, pool: &crate::model::PoolDef, nodes: &[Node]) -> Result<(), Infeasible> {
    let allowed: Vec<&Node> = nodes
        .iter()
        .filter(|node| pool.selects(&node.labels) && spec.requires.allows_node(&node.name, &node.labels))
        .collect();
    let gib = |bytes: u64| format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64);
    if let Some(wanted) = spec
        .mem_bytes
        .filter(|_| allowed.iter().all(|node| node.memory_bytes > 0))
    {
        let largest = allowed.iter().map(|node| node.memory_bytes).max().unwrap_or(0);
        if !allowed.is_empty() && wanted > largest {
            return Err(Infeasible::TooMuchMemory {
                pool: pool.name.clone(),
                wanted: gib(wanted),
                largest: gib(largest),
            });
        }
    }
    if let Some(cpus_per_gpu) = spec.cpus_per_gpu.filter(|_| allowed.iter().all(|node| node.cpus > 0)) {
        let wanted = u64::from(cpus_per_gpu) * u64::from(spec.gpus_per_node.max(1));
        let largest = allowed.iter().map(|node| node.cpus).max().unwrap_or(0);
        if !allowed.is_empty() && wanted > u64::from(largest) {
            return Err(Infeasible::TooManyCpus {
                pool: pool.name.clone(),
                cpus_per_gpu,
                gpus_per_node: spec.gpus_per_node,
                wanted,
                largest,
            });
        }
    }
    Ok(())
}

/// The job's node requirements against the known nodes: names it gives
/// exist, some node of the pool passes them all.
fn check_node_requirements(spec: &JobSpec, pool: &crate::model::PoolDef, nodes: &[Node]) -> Result<(), Infeasible> {
    let requires = &spec.requires;
    for (field, names) in [("nodelist", &requires.nodelist), ("exclude", &requires.exclude)] {
        if let Some(name) = names.iter().find(|name| !nodes.iter().any(|node| &node.name == *name)) {
            let mut known: Vec<&str> = nodes.iter().map(|node| node.name.as_str()).collect();
            known.truncate(20);
            return Err(Infeasible::UnknownNode {
                field,
                name: name.clone(),
                known: known.join(", "),
            });
        }
    }
    let in_pool: Vec<&Node> = nodes.iter().filter(|node| pool.selects(&node.labels)).collect();
    if !requires.constraints.is_empty()
        && !in_pool
            .iter()
            .any(|node| requires.constraints.iter().all(|(k, v)| node.labels.get(k) == Some(v)))
    {
        let wanted: Vec<String> = requires.constraints.iter().map(|(k, v)| format!("{k}={v}")).collect();
        return Err(Infeasible::NoNodeAllowed {
            field: "constraint",
            pool: pool.name.clone(),
            what: format!("has the labels {}", wanted.join(",")),
        });
    }
    if !in_pool
        .iter()
        .any(|node| requires.allows_node(&node.name, &node.labels))
    {
        let field = if requires.nodelist.is_empty() {
            "exclude"
        } else {
            "nodelist"
        };
        return Err(Infeasible::NoNodeAllowed {
            field,
            pool: pool.name.clone(),
            what: "is left by nodelist, exclude and constraint together".into(),
        });
    }
    Ok(())
}

/// How many of `gpus` (one model, on one node) the job could get: all of
/// them, or with NVLink required the largest set all joined by NVLink.
fn usable_count(spec: &JobSpec, node: &Node, gpus: &[u32]) -> u32 {
    if spec.requires.nvlink != crate::model::NvlinkNeed::Required {
        return gpus.len() as u32;
    }
    (1..=gpus.len())
        .rev()
        .find(|k| node.topology.worst_link(&node.topology.choose(gpus, *k)) == crate::topology::Link::Nvlink)
        .unwrap_or(0) as u32
}

/// `Ok` when some known nodes of the pool could run the job (now or once
/// their GPUs are free, drained or down nodes included, since they can come
/// back), or when the pool has no known node yet.
pub fn check_feasible(spec: &JobSpec, policy: &Policy, nodes: &[Node]) -> Result<(), Infeasible> {
    let result = check_spec(spec, policy, nodes);
    match result {
        // Where only its requirements keep it from fitting, say so rather
        // than blame its size or models.
        Err(
            err @ (Infeasible::TooManyGpus { .. } | Infeasible::TooManyNodes { .. } | Infeasible::NoSuchModel { .. }),
        ) if !spec.requires.is_empty() => {
            let unconstrained = JobSpec {
                requires: Default::default(),
                ..spec.clone()
            };
            match check_spec(&unconstrained, policy, nodes) {
                Ok(()) => Err(Infeasible::Requirements {
                    detail: err.to_string(),
                }),
                Err(_) => Err(err),
            }
        }
        other => other,
    }
}

fn check_spec(spec: &JobSpec, policy: &Policy, nodes: &[Node]) -> Result<(), Infeasible> {
    let Some(pool) = policy.pool(&spec.pool) else {
        let known: Vec<&str> = policy.pools.iter().map(|p| p.name.as_str()).collect();
        return Err(Infeasible::UnknownPool {
            pool: spec.pool.to_string(),
            known: known.join(", "),
        });
    };
    if !nodes.iter().any(|node| pool.selects(&node.labels)) {
        return Ok(());
    }
    check_node_requirements(spec, pool, nodes)?;
    check_host_resources(spec, pool, nodes)?;
    check_slices_and_memory(spec, pool, nodes)?;
    let (acceptable, n_without_nvlink) = model_counts(spec, pool, nodes);
    if acceptable.is_empty() {
        return Err(no_such_model(spec, &pool.name, nodes, pool));
    }
    check_counts(spec, pool, &acceptable, n_without_nvlink)
}

/// MIG slices come one to a job per node, and some acceptable GPU has the
/// memory the job asks for.
fn check_slices_and_memory(spec: &JobSpec, pool: &crate::model::PoolDef, nodes: &[Node]) -> Result<(), Infeasible> {
    if spec.gpus_per_node > 1 {
        if let Some(slice) = spec.gpu_types.iter().find(|model| model.is_mig_slice()) {
            return Err(Infeasible::MigSlices {
                model: slice.to_string(),
                gpus_per_node: spec.gpus_per_node,
            });
        }
    }
    let acceptable_model = |model: &GpuModel| model.accepted_by(&spec.gpu_types);
    if spec.requires.min_gpu_memory_mib > 0 {
        let largest_mib = nodes
            .iter()
            .filter(|node| pool.selects(&node.labels) && spec.requires.allows_node(&node.name, &node.labels))
            .flat_map(|node| &node.gpus)
            .filter(|gpu| acceptable_model(&gpu.model))
            .map(|gpu| gpu.memory_mib)
            .max();
        if let Some(largest_mib) = largest_mib.filter(|largest| !spec.requires.allows_memory(*largest)) {
            return Err(Infeasible::TooLittleMemory {
                pool: pool.name.clone(),
                wanted_mib: spec.requires.min_gpu_memory_mib,
                largest_mib,
            });
        }
    }
    if let Some(wanted_mib) = spec.gpu_share.map(|ask| ask.memory_mib).filter(|mib| *mib > 0) {
        let largest_mib = nodes
            .iter()
            .filter(|node| pool.selects(&node.labels) && spec.requires.allows_node(&node.name, &node.labels))
            .flat_map(|node| &node.gpus)
            .filter(|gpu| acceptable_model(&gpu.model))
            .map(|gpu| gpu.memory_mib.saturating_sub(gpu.reserved_mib))
            .max();
        if let Some(largest_mib) = largest_mib.filter(|largest| *largest < wanted_mib) {
            return Err(Infeasible::ShareTooLarge {
                pool: pool.name.clone(),
                wanted_mib,
                largest_mib,
            });
        }
    }
    Ok(())
}

/// For each acceptable model, how many GPUs of it each allowed node of the
/// pool could give the job (most first), and the most GPUs of an
/// acceptable model any node has, NVLink or not.
fn model_counts<'n>(
    spec: &JobSpec,
    pool: &crate::model::PoolDef,
    nodes: &'n [Node],
) -> (Vec<(&'n GpuModel, Vec<u32>)>, u32) {
    let acceptable_model = |model: &GpuModel| model.accepted_by(&spec.gpu_types);
    let mut per_node_counts: BTreeMap<&GpuModel, Vec<u32>> = BTreeMap::new();
    let mut n_without_nvlink = 0;
    for node in nodes
        .iter()
        .filter(|node| pool.selects(&node.labels) && spec.requires.allows_node(&node.name, &node.labels))
    {
        let mut by_model: BTreeMap<&GpuModel, Vec<u32>> = BTreeMap::new();
        for gpu in node
            .gpus
            .iter()
            .filter(|gpu| spec.requires.allows_memory(gpu.memory_mib))
        {
            by_model.entry(&gpu.model).or_default().push(gpu.index);
        }
        for (model, gpus) in by_model {
            let count = usable_count(spec, node, &gpus);
            if acceptable_model(model) {
                n_without_nvlink = n_without_nvlink.max(gpus.len() as u32);
            }
            per_node_counts.entry(model).or_default().push(count);
        }
    }
    let acceptable: Vec<(&GpuModel, Vec<u32>)> = per_node_counts
        .into_iter()
        .filter(|(model, _)| model.accepted_by(&spec.gpu_types))
        .map(|(model, mut counts)| {
            counts.sort_unstable_by(|a, b| b.cmp(a));
            (model, counts)
        })
        .collect();
    (acceptable, n_without_nvlink)
}

/// Some acceptable model has enough nodes with room for the job, or why
/// none does: no NVLink set that large, too many GPUs for one node, or
/// too many nodes.
fn check_counts(
    spec: &JobSpec,
    pool: &crate::model::PoolDef,
    acceptable: &[(&GpuModel, Vec<u32>)],
    n_without_nvlink: u32,
) -> Result<(), Infeasible> {
    let fits = |counts: &Vec<u32>| counts.iter().filter(|c| **c >= spec.gpus_per_node).count();
    if acceptable.iter().any(|(_, counts)| fits(counts) >= spec.nodes as usize) {
        return Ok(());
    }
    // `acceptable` is not empty here, so both maxima exist.
    let Some((model, counts)) = acceptable
        .iter()
        .max_by_key(|(model, counts)| (counts[0], std::cmp::Reverse(*model)))
    else {
        return Ok(());
    };
    if counts[0] < spec.gpus_per_node && n_without_nvlink >= spec.gpus_per_node {
        return Err(Infeasible::NoNvlinkSet {
            pool: pool.name.clone(),
            gpus_per_node: spec.gpus_per_node,
            largest: counts[0],
        });
    }
    if counts[0] < spec.gpus_per_node {
        return Err(Infeasible::TooManyGpus {
            pool: pool.name.clone(),
            gpus_per_node: spec.gpus_per_node,
            largest: format!("{} {model} GPUs on one node", counts[0]),
        });
    }
    let Some((model, n_nodes)) = acceptable
        .iter()
        .map(|(model, counts)| (model, fits(counts)))
        .max_by_key(|(model, n)| (*n, std::cmp::Reverse(**model)))
    else {
        return Ok(());
    };
    Err(Infeasible::TooManyNodes {
        pool: pool.name.clone(),
        gpus_per_node: spec.gpus_per_node,
        nodes: spec.nodes,
        largest: format!(
            "{n_nodes} {} with {} {model} GPUs each",
            if n_nodes == 1 { "node" } else { "nodes" },
            spec.gpus_per_node
        ),
    })
}

fn no_such_model(spec: &JobSpec, pool_name: &str, nodes: &[Node], pool: &crate::model::PoolDef) -> Infeasible {
    let available: std::collections::BTreeSet<&str> = nodes
        .iter()
        .filter(|node| pool.selects(&node.labels))
        .flat_map(|node| node.gpus.iter().map(|gpu| gpu.model.as_str()))
        .collect();
    let wanted: Vec<&str> = spec.gpu_types.iter().map(GpuModel::as_str).collect();
    Infeasible::NoSuchModel {
        pool: pool_name.to_string(),
        wanted: if wanted.is_empty() {
            "any".into()
        } else {
            wanted.join(" or ")
        },
        available: if available.is_empty() {
            "none".into()
        } else {
            available.into_iter().collect::<Vec<_>>().join(", ")
        },
    }
}

#[cfg(test)]
mod tests;
