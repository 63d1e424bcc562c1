//! Simulated GPUs from agent.toml, for machines without NVIDIA GPUs.

use crate::config::SimulatedGpu;
use gpool_core::model::{Gpu, GpuModel};

/// The declared GPUs, indexed in order; a GPU with a `mig` layout is
/// offered as its slices (model `a100-3g.20gb`, a `MIG-` UUID), indexed
/// after all whole GPUs, as NVML's are.
pub fn gpus(node_name: &str, declared: &[SimulatedGpu]) -> Vec<Gpu> {
    let mut gpus = Vec::new();
    let mut slices = Vec::new();
    let mut index = 0u32;
    for entry in declared {
        for _ in 0..entry.count {
            let pci_bus_id = format!("00000000:{:02x}:00.0", index + 1);
            let gpu = Gpu {
                index,
                uuid: format!("SIM-{node_name}-{index}"),
                model: GpuModel::new(&entry.model),
                memory_mib: entry.memory_mib,
                reserved_mib: entry.reserved_mib,
                pci_bus_id,
                mig_parent: None,
                numa_node: entry.numa_node,
                compute_capability: entry.compute_capability.clone().unwrap_or_default(),
            };
            if entry.mig.is_empty() {
                gpus.push(gpu);
            } else {
                let family = entry.model.split('-').next().unwrap_or(&entry.model).to_string();
                for (k, profile) in entry.mig.iter().enumerate() {
                    slices.push(Gpu {
                        uuid: format!("MIG-SIM-{node_name}-{index}-{k}"),
                        model: GpuModel::new(&format!("{family}-{profile}")),
                        memory_mib: mig_memory_mib(profile).unwrap_or(0),
                        mig_parent: Some(index),
                        ..gpu.clone()
                    });
                }
            }
            index += 1;
        }
    }
    for (k, mut slice) in slices.into_iter().enumerate() {
        slice.index = index + k as u32;
        gpus.push(slice);
    }
    gpus
}

/// The memory of MIG profile `3g.20gb` (`1g.10gb+me` too): 20 GB, in MiB;
/// `None` if it is not such a profile.
pub fn mig_memory_mib(profile: &str) -> Option<u64> {
    let (slices, rest) = profile.split_once("g.")?;
    slices.parse::<u32>().ok().filter(|n| (1..=8).contains(n))?;
    let gigabytes = rest.split('+').next()?.strip_suffix("gb")?;
    gigabytes
        .parse::<u64>()
        .ok()
        .filter(|gb| *gb > 0)
        .and_then(|gb| gb.checked_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(model: &str, count: u32, mig: &[&str]) -> SimulatedGpu {
        SimulatedGpu {
            model: model.into(),
            memory_mib: 40_960,
            reserved_mib: 0,
            count,
            utilization_pct: 0,
            memory_used_mib: 0,
            ecc_corrected: 0,
            ecc_uncorrected: 0,
            mig: mig.iter().map(|p| p.to_string()).collect(),
            numa_node: None,
            compute_capability: None,
        }
    }

    #[test]
    fn a_mig_gpu_is_offered_as_its_slices_after_the_whole_gpus() {
        let gpus = gpus(
            "n1",
            &[
                declared("a100-40gb", 1, &["3g.20gb", "2g.10gb", "1g.5gb"]),
                declared("a100-40gb", 1, &[]),
            ],
        );
        let listed: Vec<(u32, &str, u64, Option<u32>)> = gpus
            .iter()
            .map(|g| (g.index, g.model.as_str(), g.memory_mib, g.mig_parent))
            .collect();
        assert_eq!(
            listed,
            [
                (1, "a100-40gb", 40_960, None),
                (2, "a100-3g.20gb", 20_480, Some(0)),
                (3, "a100-2g.10gb", 10_240, Some(0)),
                (4, "a100-1g.5gb", 5_120, Some(0)),
            ]
        );
        assert_eq!(gpus[1].uuid, "MIG-SIM-n1-0-0");
        let devices = crate::gpu::GpuDevices::of(&gpus);
        assert_eq!(devices.names(&[1, 3]), ["1", "MIG-SIM-n1-0-1"]);
        assert_eq!(devices.minors(&[2, 3]), [0]);
        assert_eq!(devices.all_minors(), [0, 1]);
        assert_eq!(mig_memory_mib("1g.10gb+me"), Some(10_240));
        assert_eq!(mig_memory_mib("big"), None);
    }
}
