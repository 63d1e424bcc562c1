//! Nodes on the wire: their GPUs (with what fractions hold of them),
//! health and NVLink/PCIe topology.

use super::labels_to_wire;
use crate::pb;
use gpool_core::model::{Gpu, GpuModel, Node, NodeState};
use gpool_core::topology::{GpuLink, Link, Topology};

/// `job_id`: the job holding the GPU, 0 when free.
pub fn gpu_to_wire(gpu: &Gpu, job_id: u64) -> pb::Gpu {
    pb::Gpu {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        model: gpu.model.as_str().to_string(),
        memory_mib: gpu.memory_mib,
        reserved_mib: gpu.reserved_mib,
        pci_bus_id: gpu.pci_bus_id.clone(),
        mig_parent: gpu.mig_parent,
        numa_node: gpu.numa_node,
        compute_capability: gpu.compute_capability.clone(),
        job_id,
        sample: None,
        out_of_service: None,
        shared_used_mib: 0,
        shared_jobs: 0,
    }
}

/// What an agent reported; its node name and indices are checked by the
/// receiver.
pub fn gpu_from_wire(gpu: pb::Gpu) -> Gpu {
    Gpu {
        index: gpu.index,
        uuid: gpu.uuid,
        model: GpuModel::new(&gpu.model),
        memory_mib: gpu.memory_mib,
        reserved_mib: gpu.reserved_mib,
        pci_bus_id: gpu.pci_bus_id,
        mig_parent: gpu.mig_parent,
        numa_node: gpu.numa_node,
        compute_capability: gpu.compute_capability,
    }
}

/// `holder(gpu_index)` gives the job holding a GPU of this node, if any.
pub fn node_to_wire(node: &Node, holder: impl Fn(u32) -> Option<u64>) -> pb::Node {
    let gpus: Vec<pb::Gpu> = node
        .gpus
        .iter()
        .map(|gpu| pb::Gpu {
            out_of_service: node.gpus_out.get(&gpu.index).map(out_of_service_to_wire),
            ..gpu_to_wire(gpu, holder(gpu.index).unwrap_or(0))
        })
        .collect();
    let n_busy = gpus.iter().filter(|gpu| gpu.job_id != 0).count();
    let state = match node.state(n_busy) {
        NodeState::Up => pb::NodeState::Up,
        NodeState::Draining => pb::NodeState::Draining,
        NodeState::Drained => pb::NodeState::Drained,
        NodeState::Down => pb::NodeState::Down,
    };
    pb::Node {
        name: node.name.clone(),
        state: state.into(),
        gpus,
        labels: labels_to_wire(&node.labels),
        drain_reason: node.drain_reason.clone().unwrap_or_default(),
        links: topology_to_wire(&node.topology),
        pools: Vec::new(),
        health_log: node.health_log.iter().map(health_event_to_wire).collect(),
        drained_by_health: node.health_drain.is_some(),
        health_check: None,
        drained_by: node
            .drained_by
            .as_ref()
            .map(|(user, _)| user.clone())
            .unwrap_or_default(),
        drained_at_ms: node.drained_by.as_ref().map_or(0, |(_, at)| at.0),
        reservations: Vec::new(),
        cpus: node.cpus,
        memory_bytes: node.memory_bytes,
        // Set by gpoold for nodes of [[power]] groups.
        ..Default::default()
    }
}

pub fn out_of_service_to_wire(out: &gpool_core::health::OutOfService) -> pb::OutOfService {
    pb::OutOfService {
        reason: out.reason.clone(),
        since_ms: out.since.0,
        by_operator: out.by == gpool_core::health::TakenBy::Operator,
    }
}

pub fn health_event_to_wire(event: &gpool_core::health::HealthEvent) -> pb::HealthEvent {
    pb::HealthEvent {
        at_ms: event.at.0,
        gpu: event.gpu,
        transition: event.transition.to_string(),
        reason: event.reason.clone(),
    }
}

pub fn topology_to_wire(topology: &Topology) -> Vec<pb::GpuLink> {
    topology
        .links()
        .iter()
        .map(|l| pb::GpuLink {
            a: l.a,
            b: l.b,
            link: match l.link {
                Link::Nvlink => pb::Link::Nvlink,
                Link::PcieSwitch => pb::Link::PcieSwitch,
                Link::HostBridge => pb::Link::HostBridge,
                Link::Numa => pb::Link::Numa,
                Link::System => pb::Link::System,
            }
            .into(),
        })
        .collect()
}

/// Unknown or unset link kinds read as `System` (nothing better is known).
pub fn topology_from_wire(links: &[pb::GpuLink]) -> Topology {
    Topology::new(links.iter().map(|l| GpuLink {
        a: l.a,
        b: l.b,
        link: match l.link() {
            pb::Link::Nvlink => Link::Nvlink,
            pb::Link::PcieSwitch => Link::PcieSwitch,
            pb::Link::HostBridge => Link::HostBridge,
            pb::Link::Numa => Link::Numa,
            pb::Link::System | pb::Link::Unspecified => Link::System,
        },
    }))
}

/// A link kind's name in JSON and tables.
pub fn link_name(link: pb::Link) -> &'static str {
    match link {
        pb::Link::Nvlink => Link::Nvlink.name(),
        pb::Link::PcieSwitch => Link::PcieSwitch.name(),
        pb::Link::HostBridge => Link::HostBridge.name(),
        pb::Link::Numa => Link::Numa.name(),
        pb::Link::System | pb::Link::Unspecified => Link::System.name(),
    }
}
