//! The only code that talks to NVML: reads devices into raw structs.

use super::RawDevice;
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
