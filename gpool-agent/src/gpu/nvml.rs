//! The only code that talks to NVML: reads devices into raw structs.

use super::RawDevice;
use gpool_proto::pb;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::Nvml;

/// Every device NVML sees, or why NVML is not usable here.
pub fn devices() -> Result<Vec<RawDevice>, nvml_wrapper::error::NvmlError> {
    let nvml = Nvml::init()?;
    let n_devices = nvml.device_count()?;
    let mut devices = Vec::with_capacity(n_devices as usize);
    for index in 0..n_devices {
        let device = nvml.device_by_index(index)?;
        devices.push(RawDevice {
            index,
            uuid: device.uuid()?,
            name: device.name()?,
            memory_bytes: device.memory_info()?.total,
            pci_bus_id: device.pci_info()?.bus_id,
        });
    }
    Ok(devices)
}

/// One heartbeat's readings of every device; a device that cannot be read
/// is left out (and so shows no sample).
pub fn samples(nvml: &Nvml) -> Vec<pb::GpuSample> {
    let n_devices = nvml.device_count().unwrap_or(0);
    (0..n_devices)
        .filter_map(|index| {
            let device = nvml.device_by_index(index).ok()?;
            Some(pb::GpuSample {
                index,
                utilization_pct: device.utilization_rates().map_or(0, |u| u.gpu),
                memory_used_mib: device.memory_info().map_or(0, |m| m.used / (1024 * 1024)),
                temperature_c: device.temperature(TemperatureSensor::Gpu).unwrap_or(0),
                power_w: device.power_usage().map_or(0, |milliwatts| milliwatts / 1000),
            })
        })
        .collect()
}
