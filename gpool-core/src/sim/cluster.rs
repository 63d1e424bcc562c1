//! The simulated cluster: groups of alike nodes, from a small TOML file.
//!
//! ```toml
//! [[nodes]]
//! count = 48
//! gpus = 8
//! model = "v100"
//! links = "nvswitch"   # nvswitch | pairs | pcie (default)
//! prefix = "dgx"       # names dgx001, dgx002, ... (default "n")
//! labels = { rack = "r1" }
//! ```

use crate::model::GpuModel;
use crate::sched::{Availability, GpuView, NodeView};
use crate::toml_text::{self, ConfigError};
use crate::topology::{group_links, Link, Topology};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub nodes: Vec<NodeView>,
    /// Price of one GPU-hour by model, where the cluster file gives one.
    pub prices: BTreeMap<GpuModel, f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    nodes: Vec<toml::Spanned<GroupFile>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupFile {
    count: u32,
    gpus: u32,
    model: String,
    #[serde(default)]
    links: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// Price of one GPU-hour of this model.
    #[serde(default)]
    price_per_gpu_hour: Option<f64>,
    /// CPUs and memory (a size, `512G`) of each node, given out to jobs
    /// that ask for them; leave both out for nodes not held to them.
    #[serde(default)]
    cpus: Option<u64>,
    #[serde(default)]
    memory: Option<String>,
}

/// How a node's GPUs are connected.
pub fn links(template: &str, gpus: u32) -> Option<Topology> {
    let all: Vec<u32> = (0..gpus).collect();
    let pcie = group_links(std::slice::from_ref(&all), Link::PcieSwitch);
    Some(match template {
        "pcie" => Topology::new(pcie),
        "nvswitch" => Topology::new(group_links(&[all], Link::Nvlink)),
        "pairs" => {
            let pairs: Vec<Vec<u32>> = all.chunks(2).map(<[u32]>::to_vec).collect();
            Topology::new(group_links(&pairs, Link::Nvlink).into_iter().chain(pcie))
        }
        _ => return None,
    })
}

impl Cluster {
    /// Parses a cluster file; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Cluster, ConfigError> {
        let parsed: ClusterFile = toml_text::parse(file, text)?;
        if parsed.nodes.is_empty() {
            return Err(toml_text::invalid(file, text, 0, "nodes: no [[nodes]] group".into()));
        }
        let mut nodes = Vec::new();
        let mut prices = BTreeMap::new();
        let mut numbers: BTreeMap<String, usize> = BTreeMap::new();
        for spanned in parsed.nodes {
            let at = spanned.span().start;
            let invalid = |message: String| toml_text::invalid(file, text, at, message);
            let group = spanned.into_inner();
            if group.count == 0 || group.gpus == 0 || group.gpus > 64 {
                return Err(invalid(format!(
                    "nodes: count {} and gpus {} must be at least 1 (gpus at most 64)",
                    group.count, group.gpus
                )));
            }
            let model = GpuModel::new(&group.model);
            if model.as_str().is_empty() {
                return Err(invalid("nodes.model: empty".into()));
            }
            let memory = match &group.memory {
                None => None,
                Some(size) => {
                    Some(crate::spec::parse_size(size).map_err(|reason| invalid(format!("nodes.memory: {reason}")))?)
                }
            };
            // A node that gives only one of them is not held to the other.
            let host = (group.cpus.is_some() || memory.is_some()).then(|| crate::sched::HostView {
                total: crate::sched::HostAsk {
                    cpus: group.cpus.unwrap_or(u64::MAX),
                    memory_bytes: memory.unwrap_or(u64::MAX),
                },
                held: Vec::new(),
            });
            let template = group.links.as_deref().unwrap_or("pcie");
            let topology = links(template, group.gpus)
                .ok_or_else(|| invalid(format!("nodes.links: {template:?} is not nvswitch, pairs or pcie")))?;
            if let Some(price) = group.price_per_gpu_hour {
                if !(price.is_finite() && price >= 0.0) {
                    return Err(invalid(format!(
                        "nodes.price_per_gpu_hour: {price} is not zero or more"
                    )));
                }
                prices.insert(model.clone(), price);
            }
            let prefix = group.prefix.unwrap_or_else(|| "n".into());
            for _ in 0..group.count {
                let number = numbers.entry(prefix.clone()).or_default();
                *number += 1;
                nodes.push(NodeView {
                    name: format!("{prefix}{number:03}"),
                    labels: group.labels.clone(),
                    availability: Availability::Up,
                    gpus: (0..group.gpus)
                        .map(|index| GpuView {
                            index,
                            model: model.clone(),
                            busy: false,
                            memory_mib: 81_920,
                            reserved_mib: 0,
                            shared: None,
                        })
                        .collect(),
                    topology: topology.clone(),
                    host: host.clone(),
                    enforces: crate::enforce::LimitSet::ALL,
                });
            }
        }
        Ok(Cluster { nodes, prices })
    }

    /// `n` nodes of `gpus` GPUs each, of one model, all NVSwitch-connected.
    pub fn uniform(n: usize, gpus: u32, model: &str) -> Cluster {
        let text = format!("[[nodes]]\ncount = {n}\ngpus = {gpus}\nmodel = {model:?}\nlinks = \"nvswitch\"\n");
        // The text above is always a valid cluster file.
        Cluster::parse("uniform", &text).unwrap_or(Cluster {
            nodes: Vec::new(),
            prices: BTreeMap::new(),
        })
    }

    pub fn gpus(&self) -> u64 {
        self.nodes.iter().map(|node| node.gpus.len() as u64).sum()
    }

    pub fn max_gpus_per_node(&self) -> u32 {
        self.nodes.iter().map(|node| node.gpus.len() as u32).max().unwrap_or(0)
    }
}
