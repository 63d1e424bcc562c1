//! Simulated GPUs from agent.toml, for machines without NVIDIA GPUs.

use crate::config::SimulatedGpu;
use gpool_core::model::{Gpu, GpuModel};

pub fn gpus(node_name: &str, declared: &[SimulatedGpu]) -> Vec<Gpu> {
    let mut gpus = Vec::new();
    for entry in declared {
        for _ in 0..entry.count {
            let index = gpus.len() as u32;
            gpus.push(Gpu {
                index,
                uuid: format!("SIM-{node_name}-{index}"),
                model: GpuModel::new(&entry.model),
                memory_mib: entry.memory_mib,
                pci_bus_id: format!("00000000:{:02x}:00.0", index + 1),
            });
        }
    }
    gpus
}
