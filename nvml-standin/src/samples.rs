//! Readings: utilisation, temperature, power, clocks, ECC, row remapping.

use crate::fixture::code;
use crate::{on_device, put};
use nvml_wrapper_sys::bindings as sys;
use std::os::raw::{c_uint, c_ulonglong};

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: sys::nvmlDevice_t,
    rates: *mut sys::nvmlUtilization_t,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetUtilizationRates", device, |fixture, handle| {
        let gpu = fixture.gpu[handle.gpu].utilization_pct;
        put(rates, sys::nvmlUtilization_t { gpu, memory: gpu / 2 })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: sys::nvmlDevice_t,
    _sensor: c_uint,
    temperature: *mut c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetTemperature", device, |fixture, handle| {
        put(temperature, fixture.gpu[handle.gpu].temperature_c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: sys::nvmlDevice_t,
    milliwatts: *mut c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetPowerUsage", device, |fixture, handle| {
        put(milliwatts, fixture.gpu[handle.gpu].power_w * 1000)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: sys::nvmlDevice_t,
    _clock: c_uint,
    mhz: *mut c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetClockInfo", device, |fixture, handle| {
        put(mhz, fixture.gpu[handle.gpu].sm_clock_mhz)
    })
}

/// NVML_MEMORY_ERROR_TYPE_UNCORRECTED of nvml.h.
const UNCORRECTED: c_uint = 1;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: sys::nvmlDevice_t,
    error_type: c_uint,
    _counter: c_uint,
    count: *mut c_ulonglong,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetTotalEccErrors", device, |fixture, handle| {
        let gpu = &fixture.gpu[handle.gpu];
        put(
            count,
            if error_type == UNCORRECTED {
                gpu.ecc_uncorrected
            } else {
                gpu.ecc_corrected
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: sys::nvmlDevice_t,
    corrected: *mut c_uint,
    uncorrected: *mut c_uint,
    pending: *mut c_uint,
    failed: *mut c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetRemappedRows", device, |fixture, handle| {
        let Some(rows) = fixture.gpu[handle.gpu].remapped_rows else {
            return code::NOT_SUPPORTED;
        };
        for (out, value) in [
            (corrected, rows.corrected),
            (uncorrected, rows.uncorrected),
            (pending, c_uint::from(rows.pending)),
            (failed, c_uint::from(rows.failed)),
        ] {
            let status = put(out, value);
            if status != code::SUCCESS {
                return status;
            }
        }
        code::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: sys::nvmlDevice_t,
    pending: *mut c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetRetiredPagesPendingStatus", device, |fixture, handle| {
        put(pending, c_uint::from(fixture.gpu[handle.gpu].retired_pages_pending))
    })
}
