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
}

/// `Ok` when some known nodes of the pool could run the job (now or once
/// their GPUs are free, drained or down nodes included, since they can come
/// back), or when the pool has no known node yet.
pub fn check_feasible(spec: &JobSpec, policy: &Policy, nodes: &[Node]) -> Result<(), Infeasible> {
    let Some(pool) = policy.pool(&spec.pool) else {
        let known: Vec<&str> = policy.pools.iter().map(|p| p.name.as_str()).collect();
        return Err(Infeasible::UnknownPool {
            pool: spec.pool.clone(),
            known: known.join(", "),
        });
    };
    // For every model: how many GPUs of it each node of the pool has.
    let mut per_node_counts: BTreeMap<&GpuModel, Vec<u32>> = BTreeMap::new();
    let mut n_pool_nodes = 0;
    for node in nodes.iter().filter(|node| pool.selects(&node.labels)) {
        n_pool_nodes += 1;
        let mut counts: BTreeMap<&GpuModel, u32> = BTreeMap::new();
        for gpu in &node.gpus {
            *counts.entry(&gpu.model).or_default() += 1;
        }
        for (model, count) in counts {
            per_node_counts.entry(model).or_default().push(count);
        }
    }
    if n_pool_nodes == 0 {
        return Ok(());
    }
    let acceptable: Vec<(&GpuModel, Vec<u32>)> = per_node_counts
        .into_iter()
        .filter(|(model, _)| spec.gpu_types.is_empty() || spec.gpu_types.contains(model))
        .map(|(model, mut counts)| {
            counts.sort_unstable_by(|a, b| b.cmp(a));
            (model, counts)
        })
        .collect();
    if acceptable.is_empty() {
        return Err(no_such_model(spec, &pool.name, nodes, pool));
    }
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
        largest: format!("{n_nodes} nodes with {} {model} GPUs each", spec.gpus_per_node),
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
