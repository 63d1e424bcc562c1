//! The only code that talks to NVML: reads devices into raw structs.

use super::RawDevice;
use gpool_core::topology::{GpuLink, Link, Topology};
use gpool_proto::pb;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::Nvml;

/// NVML_DEVICE_MIG_ENABLE of nvml.h.
const MIG_ENABLED: u32 = 1;

/// Loads and initialises the NVML at `library` (the driver's
/// `libnvidia-ml.so.1`, or a stand-in).
pub fn open(library: &std::path::Path) -> Result<Nvml, nvml_wrapper::error::NvmlError> {
    Nvml::builder().lib_path(library.as_os_str()).init()
}

/// Every device NVML sees, or why NVML is not usable here. A GPU in MIG
/// mode is left out and its slices are listed instead, with indices after
/// the whole GPUs' (which keep NVML's indices).
pub fn devices(nvml: &Nvml) -> Result<Vec<RawDevice>, nvml_wrapper::error::NvmlError> {
    let n_devices = nvml.device_count()?;
    let mut devices = Vec::with_capacity(n_devices as usize);
    let mut slices = Vec::new();
    for index in 0..n_devices {
        let device = nvml.device_by_index(index)?;
        let pci_bus_id = device.pci_info()?.bus_id;
        let numa_node = numa_node_of(&device);
        let compute_capability = device
            .cuda_compute_capability()
            .map(|cc| format!("{}.{}", cc.major, cc.minor))
            .unwrap_or_default();
        if device.mig_mode().is_ok_and(|mode| mode.current == MIG_ENABLED) {
            for slot in 0..device.mig_device_count().unwrap_or(0) {
                // Empty slots answer NotFound.
                let Ok(slice) = device.mig_device_by_index(slot) else {
                    continue;
                };
                slices.push(RawDevice {
                    index: 0,
                    uuid: slice.uuid()?,
                    name: slice.name()?,
                    memory_bytes: slice.memory_info()?.total,
                    reserved_bytes: 0,
                    pci_bus_id: pci_bus_id.clone(),
                    mig_parent: Some(index),
                    numa_node,
                    compute_capability: compute_capability.clone(),
                });
            }
            continue;
        }
        let memory = device.memory_info()?;
        devices.push(RawDevice {
            index,
            uuid: device.uuid()?,
            name: device.name()?,
            memory_bytes: memory.total,
            reserved_bytes: memory.reserved,
            pci_bus_id,
            mig_parent: None,
            numa_node,
            compute_capability,
        });
    }
    for (k, mut slice) in slices.into_iter().enumerate() {
        slice.index = n_devices + k as u32;
        devices.push(slice);
    }
    Ok(devices)
}

/// NVML_AFFINITY_SCOPE_NODE of nvml.h: affinity by NUMA node.
const AFFINITY_SCOPE_NODE: u32 = 0;

/// The NUMA node the device's PCIe slot hangs off: NVML's memory affinity
/// where it names one node (`nvidia-smi topo -m`'s "NUMA Affinity"), else
/// the GPU's own NUMA id (GPUs whose memory is a NUMA node of its own).
/// On an H100 SXM on x86 the GPU's own id is "N/A" and the affinity is the
/// answer.
fn numa_node_of(device: &nvml_wrapper::Device) -> Option<u32> {
    let from_affinity = device.memory_affinity(1, AFFINITY_SCOPE_NODE).ok().and_then(|mask| {
        let mask = *mask.first()?;
        (mask.count_ones() == 1).then(|| mask.trailing_zeros())
    });
    from_affinity.or_else(|| device.numa_node_id().ok())
}

/// Node-wide facts for its labels: `nvidia.driver` (`550.54.15`),
/// `nvidia.cuda` (`12.4`: the newest CUDA the driver runs).
pub fn node_labels(nvml: &Nvml) -> std::collections::BTreeMap<String, String> {
    let mut labels = std::collections::BTreeMap::new();
    if let Ok(driver) = nvml.sys_driver_version() {
        labels.insert("nvidia.driver".to_string(), driver);
    }
    if let Ok(cuda) = nvml.sys_cuda_driver_version() {
        labels.insert(
            "nvidia.cuda".to_string(),
            format!("{}.{}", cuda / 1000, (cuda % 1000) / 10),
        );
    }
    labels
}

/// The links between every pair of devices: NVLink where an active link of
/// one reaches the other's PCI bus id, or where both reach the node's
/// NVSwitch fabric (a DGX: every GPU's links go to NVSwitches, which join
/// them all); else the PCIe path NVML reports. A pair NVML cannot place is
/// left out (and counts as `system`).
pub fn topology(nvml: &Nvml, devices: &[RawDevice]) -> Result<Topology, nvml_wrapper::error::NvmlError> {
    // MIG slices have no peer links of their own.
    let devices: Vec<&RawDevice> = devices.iter().filter(|raw| raw.mig_parent.is_none()).collect();
    let mut nvlink_peers: Vec<Vec<String>> = Vec::with_capacity(devices.len());
    let mut on_nvswitch: Vec<bool> = Vec::with_capacity(devices.len());
    for raw in &devices {
        let device = nvml.device_by_index(raw.index)?;
        let mut peers = Vec::new();
        let mut switched = false;
        for link in 0..NVLINK_MAX_LINKS {
            let link = device.link_wrapper_for(link);
            // A GPU without NVLink answers NotSupported: no peers.
            if !link.is_active().is_ok_and(|active| active) {
                continue;
            }
            // Drivers before the device type answer only the remote bus.
            if remote_is_nvswitch(nvml, &device, link.link()) {
                switched = true;
            } else if let Ok(pci) = link.remote_pci_info() {
                peers.push(pci.bus_id);
            }
        }
        nvlink_peers.push(peers);
        on_nvswitch.push(switched);
    }
    let mut links = Vec::new();
    for (i, a) in devices.iter().enumerate() {
        for (j, b) in devices.iter().enumerate().skip(i + 1) {
            let by_nvlink = (on_nvswitch[i] && on_nvswitch[j])
                || nvlink_peers[i].iter().any(|peer| same_bus(peer, &b.pci_bus_id))
                || nvlink_peers[j].iter().any(|peer| same_bus(peer, &a.pci_bus_id));
            let link = if by_nvlink {
                Some(Link::Nvlink)
            } else {
                let (device_a, device_b) = (nvml.device_by_index(a.index)?, nvml.device_by_index(b.index)?);
                match nvml.topology_common_ancestor(&device_a, &device_b) {
                    Ok(TopologyLevel::Internal | TopologyLevel::Single | TopologyLevel::Multiple) => {
                        Some(Link::PcieSwitch)
                    }
                    Ok(TopologyLevel::HostBridge) => Some(Link::HostBridge),
                    Ok(TopologyLevel::Node) => Some(Link::Numa),
                    Ok(TopologyLevel::System) => Some(Link::System),
                    Err(_) => None,
                }
            };
            if let Some(link) = link {
                links.push(GpuLink {
                    a: a.index,
                    b: b.index,
                    link,
                });
            }
        }
    }
    Ok(Topology::new(links))
}

/// NVML_NVLINK_DEVICE_TYPE_SWITCH of nvml.h.
const NVLINK_DEVICE_TYPE_SWITCH: u32 = 2;

/// Whether `link` of `device` goes to an NVSwitch. Called through the raw
/// symbol: nvml-wrapper 0.13's `remote_device_type` hands NVML a temporary
/// and so always answers Unknown.
fn remote_is_nvswitch(nvml: &Nvml, device: &nvml_wrapper::Device, link: u32) -> bool {
    let lib = nvml.lib();
    if lib.nvmlDeviceGetNvLinkRemoteDeviceType.is_err() {
        return false;
    }
    let mut kind = 0;
    // SAFETY: the symbol is loaded (checked above), the device handle is
    // live for as long as `nvml`, and the out-pointer is a local.
    let status = unsafe { lib.nvmlDeviceGetNvLinkRemoteDeviceType(device.handle(), link, &mut kind) };
    status == 0 && kind == NVLINK_DEVICE_TYPE_SWITCH
}

/// NVML_NVLINK_MAX_LINKS of nvml.h: links per device NVML may report.
const NVLINK_MAX_LINKS: u32 = 18;

/// Whether two PCI bus ids name the same device: NVML writes the domain
/// with 4 or 8 digits depending on the call, so it is left out.
pub fn same_bus(x: &str, y: &str) -> bool {
    fn bus_device(id: &str) -> String {
        let lower = id.trim().to_ascii_lowercase();
        match lower.split_once(':') {
            Some((_, rest)) if rest.contains(':') => rest.to_string(),
            _ => lower,
        }
    }
    bus_device(x) == bus_device(y)
}

/// The readings of device `index`; `None` when it cannot be read (and so
/// shows no sample).
pub fn sample(nvml: &Nvml, index: u32) -> Option<pb::GpuSample> {
    let device = nvml.device_by_index(index).ok()?;
    let remap = remapped_rows(nvml, &device);
    Some(pb::GpuSample {
        index,
        utilization_pct: device.utilization_rates().map_or(0, |u| u.gpu),
        memory_used_mib: device.memory_info().map_or(0, |m| m.used / (1024 * 1024)),
        temperature_c: device.temperature(TemperatureSensor::Gpu).unwrap_or(0),
        power_w: device.power_usage().map_or(0, |milliwatts| milliwatts / 1000),
        ecc_corrected: device
            .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .unwrap_or(0),
        ecc_uncorrected: device
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap_or(0),
        sm_clock_mhz: device.clock_info(Clock::SM).unwrap_or(0),
        remap_failure: remap.is_some_and(|r| r.failed),
        // Older GPUs retire pages instead of remapping rows.
        remap_pending: remap.map_or_else(|| device.are_pages_pending_retired().unwrap_or(false), |r| r.pending),
    })
}

/// Row remapping state (A100 and later).
#[derive(Debug, Clone, Copy)]
struct Remap {
    pending: bool,
    failed: bool,
}

/// The device's row remapping state; `None` where the driver or the GPU
/// has no row remapping.
fn remapped_rows(nvml: &Nvml, device: &nvml_wrapper::Device) -> Option<Remap> {
    let lib = nvml.lib();
    lib.nvmlDeviceGetRemappedRows.as_ref().ok()?;
    let (mut corrected, mut uncorrected, mut pending, mut failed) = (0, 0, 0, 0);
    // SAFETY: the symbol is loaded (checked above), the device handle is
    // live for as long as `nvml`, and each out-pointer is a local.
    let status = unsafe {
        lib.nvmlDeviceGetRemappedRows(
            device.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failed,
        )
    };
    (status == 0).then_some(Remap {
        pending: pending != 0,
        failed: failed != 0,
    })
}

/// Watches NVML's critical Xid events on every device, for as long as the
/// agent runs, handing each to `health` (on a thread of its own: the wait
/// blocks).
pub fn watch_xids(library: std::path::PathBuf, health: std::sync::Arc<super::health::Health>) {
    let spawned = std::thread::Builder::new().name("nvml-xid".into()).spawn(move || {
        if let Err(err) = xid_loop(&library, &health) {
            tracing::warn!("cannot watch NVML's Xid events ({err}); Xids go unreported");
        }
    });
    if let Err(err) = spawned {
        tracing::warn!("cannot start the Xid watcher: {err}");
    }
}

fn xid_loop(library: &std::path::Path, health: &super::health::Health) -> Result<(), nvml_wrapper::error::NvmlError> {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    use nvml_wrapper::error::NvmlError;
    let nvml = open(library)?;
    let n_devices = nvml.device_count()?;
    // A device that cannot be watched (lost, or without event support)
    // leaves the others watched. A failed registration consumes the set, so
    // the set is built again without that device.
    let mut skipped = std::collections::BTreeSet::new();
    let set = 'build: loop {
        let mut set = nvml.create_event_set()?;
        for index in (0..n_devices).filter(|index| !skipped.contains(index)) {
            let registered = nvml
                .device_by_index(index)
                .map_err(|err| err.to_string())
                .and_then(|device| {
                    device
                        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        .map_err(|err| err.error.to_string())
                });
            match registered {
                Ok(with_device) => set = with_device,
                Err(err) => {
                    tracing::warn!(gpu = index, "cannot watch its Xid events: {err}");
                    skipped.insert(index);
                    continue 'build;
                }
            }
        }
        break set;
    };
    loop {
        match set.wait(1_000) {
            Ok(event) => {
                let index = event.device.index().unwrap_or(u32::MAX);
                if let Some(XidError::Value(xid)) = event.event_data {
                    tracing::warn!(gpu = index, xid, "NVML reports an Xid");
                    health.push_xid(index, u32::try_from(xid).unwrap_or(u32::MAX));
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(err) => {
                tracing::warn!("waiting for NVML events: {err}");
                std::thread::sleep(std::time::Duration::from_secs(5));
            }
        }
    }
}
