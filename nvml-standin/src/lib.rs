//! A stand-in `libnvidia-ml.so.1`: the NVML functions gpool calls, with
//! NVML's own C ABI and return codes, over GPUs read from a TOML file
//! (`GPOOL_NVML_STANDIN`; see `fixtures/`). Loaded in place of the real
//! library (gpool-agent's `nvml_library`), it lets the agent's NVML path
//! (discovery, topology, MIG, samples, Xid events) run where there is no
//! GPU, and faults be injected: a call that fails, a call that hangs, a GPU
//! that is lost.
//!
//! Device handles are small numbers (GPU and MIG slot), never pointers to
//! memory: a caller only hands them back.
//!
//! Safety: every function here has the contract its NVML namesake has in
//! nvml.h (valid out-pointers of the documented types, buffers of the
//! given length); that is the caller's side of each `unsafe` call.
#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod events;
pub mod fixture;
pub mod samples;

use fixture::{code, Fixture, NvLink};
use nvml_wrapper_sys::bindings as sys;
use std::os::raw::{c_char, c_int, c_uint, c_ulong};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The environment variable that names the fixture file.
pub const FIXTURE_ENV: &str = "GPOOL_NVML_STANDIN";

pub(crate) struct Loaded {
    path: String,
    /// The file as last read, with its modification time; read again
    /// when that changes (at most every `RELOAD_EVERY`), so a test can
    /// raise an ECC count, add an Xid or a fault while the agent runs.
    fixture: Mutex<(std::sync::Arc<Fixture>, Option<std::time::SystemTime>, Instant)>,
    /// The first init: faults and Xids are timed from it.
    started: Instant,
}

const RELOAD_EVERY: Duration = Duration::from_millis(100);

impl Loaded {
    pub(crate) fn fixture(&self) -> std::sync::Arc<Fixture> {
        let mut held = self.fixture.lock().unwrap_or_else(|p| p.into_inner());
        if held.2.elapsed() >= RELOAD_EVERY {
            held.2 = Instant::now();
            let modified = std::fs::metadata(&self.path).and_then(|meta| meta.modified()).ok();
            if modified != held.1 {
                match Fixture::load(&self.path) {
                    // The GPUs stay those of the first read; what they say
                    // (counters, Xids, faults) follows the file.
                    Ok(fixture) if fixture.gpu.len() == held.0.gpu.len() => {
                        *held = (std::sync::Arc::new(fixture), modified, Instant::now());
                    }
                    Ok(_) => eprintln!("nvml stand-in: {}: the number of GPUs may not change", self.path),
                    Err(err) => eprintln!("nvml stand-in: {err}"),
                }
            }
        }
        held.0.clone()
    }
}

static LOADED: OnceLock<Result<Loaded, String>> = OnceLock::new();
/// Inits not yet shut down.
static INITS: Mutex<u32> = Mutex::new(0);

pub(crate) fn loaded() -> Result<&'static Loaded, u32> {
    if *INITS.lock().unwrap_or_else(|p| p.into_inner()) == 0 {
        return Err(code::UNINITIALIZED);
    }
    LOADED
        .get()
        .and_then(|loaded| loaded.as_ref().ok())
        .ok_or(code::UNINITIALIZED)
}

pub(crate) fn since_start(loaded: &Loaded) -> u64 {
    loaded.started.elapsed().as_millis() as u64
}

/// A GPU (by its index in the file) or one of its MIG slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) gpu: usize,
    pub(crate) slot: Option<u32>,
}

impl Handle {
    pub(crate) fn to_device(self) -> sys::nvmlDevice_t {
        let slot = self.slot.map_or(0, |slot| slot as usize + 1);
        (((self.gpu + 1) << 8) | slot) as sys::nvmlDevice_t
    }

    fn of(device: sys::nvmlDevice_t, fixture: &Fixture) -> Option<Handle> {
        let raw = device as usize;
        let gpu = (raw >> 8).checked_sub(1)?;
        let slot = (raw & 0xff).checked_sub(1).map(|slot| slot as u32);
        let found = fixture.gpu.get(gpu)?;
        if let Some(slot) = slot {
            found.mig.get(slot as usize)?;
        }
        Some(Handle { gpu, slot })
    }
}

/// Runs `answer` for `call` once the library is initialised, after the
/// fault the file sets for it (a hang, then an error or the answer).
pub(crate) fn gate(
    call: &str,
    gpu: Option<usize>,
    answer: impl FnOnce(&'static Loaded, &Fixture) -> u32,
) -> sys::nvmlReturn_t {
    let loaded = match loaded() {
        Ok(loaded) => loaded,
        Err(err) => return err,
    };
    let fixture = loaded.fixture();
    if let Some(fault) = fixture.fault_for(call, gpu.map(|gpu| gpu as u32), since_start(loaded)) {
        if let Some(hang_ms) = fault.hang_ms {
            std::thread::sleep(Duration::from_millis(hang_ms));
        }
        if let Some(error) = fault.error {
            return error;
        }
    }
    answer(loaded, &fixture)
}

/// `gate` for a call on one device.
pub(crate) fn on_device(
    call: &str,
    device: sys::nvmlDevice_t,
    answer: impl FnOnce(&Fixture, Handle) -> u32,
) -> sys::nvmlReturn_t {
    let Ok(loaded) = loaded() else {
        return code::UNINITIALIZED;
    };
    let Some(handle) = Handle::of(device, &loaded.fixture()) else {
        return code::INVALID_ARGUMENT;
    };
    gate(call, Some(handle.gpu), |_, fixture| answer(fixture, handle))
}

pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> u32 {
    if out.is_null() {
        return code::INVALID_ARGUMENT;
    }
    out.write(value);
    code::SUCCESS
}

unsafe fn put_str(buf: *mut c_char, len: c_uint, text: &str) -> u32 {
    if buf.is_null() {
        return code::INVALID_ARGUMENT;
    }
    if text.len() + 1 > len as usize {
        return code::INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, text.len());
    buf.add(text.len()).write(0);
    code::SUCCESS
}

fn pci_info(bus_id: &str) -> sys::nvmlPciInfo_t {
    let mut info = sys::nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pciDeviceId: 0x2330_10de,
        pciSubSystemId: 0,
        busId: [0; 32],
    };
    (info.domain, info.bus, info.device) = fixture::pci_numbers(bus_id);
    for (slot, byte) in info.busId.iter_mut().zip(bus_id.bytes().take(31)) {
        *slot = byte as c_char;
    }
    // The legacy field has a 4-digit domain.
    let legacy = bus_id.get(4..).unwrap_or(bus_id);
    for (slot, byte) in info.busIdLegacy.iter_mut().zip(legacy.bytes().take(15)) {
        *slot = byte as c_char;
    }
    info
}

// ---- Init and the system ----

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> sys::nvmlReturn_t {
    let loaded = LOADED.get_or_init(|| {
        let path = std::env::var(FIXTURE_ENV).map_err(|_| format!("{FIXTURE_ENV} is not set"))?;
        let modified = std::fs::metadata(&path).and_then(|meta| meta.modified()).ok();
        Fixture::load(&path).map(|fixture| Loaded {
            fixture: Mutex::new((std::sync::Arc::new(fixture), modified, Instant::now())),
            path,
            started: Instant::now(),
        })
    });
    match loaded {
        Ok(_) => {
            *INITS.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            code::SUCCESS
        }
        Err(err) => {
            eprintln!("nvml stand-in: {err}");
            // What NVML says when it finds no driver.
            9
        }
    }
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> sys::nvmlReturn_t {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> sys::nvmlReturn_t {
    let mut inits = INITS.lock().unwrap_or_else(|p| p.into_inner());
    if *inits == 0 {
        return code::UNINITIALIZED;
    }
    *inits -= 1;
    code::SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: sys::nvmlReturn_t) -> *const c_char {
    let text: &'static [u8] = match result {
        code::SUCCESS => b"Success\0",
        code::UNINITIALIZED => b"Uninitialized\0",
        code::INVALID_ARGUMENT => b"Invalid Argument\0",
        code::NOT_SUPPORTED => b"Not Supported\0",
        code::NOT_FOUND => b"Not Found\0",
        code::INSUFFICIENT_SIZE => b"Insufficient Size\0",
        code::TIMEOUT => b"Timeout\0",
        code::FUNCTION_NOT_FOUND => b"Function Not Found\0",
        code::GPU_IS_LOST => b"GPU is lost\0",
        _ => b"Unknown Error\0",
    };
    text.as_ptr().cast()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> sys::nvmlReturn_t {
    gate("nvmlSystemGetDriverVersion", None, |_, fixture| {
        put_str(version, length, &fixture.driver_version)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> sys::nvmlReturn_t {
    gate("nvmlSystemGetCudaDriverVersion_v2", None, |_, fixture| {
        put(version, fixture.cuda_version)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> sys::nvmlReturn_t {
    nvmlSystemGetCudaDriverVersion_v2(version)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> sys::nvmlReturn_t {
    gate("nvmlDeviceGetCount_v2", None, |_, fixture| {
        put(count, fixture.gpu.len() as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut sys::nvmlDevice_t,
) -> sys::nvmlReturn_t {
    gate("nvmlDeviceGetHandleByIndex_v2", Some(index as usize), |_, fixture| {
        if index as usize >= fixture.gpu.len() {
            return code::INVALID_ARGUMENT;
        }
        let handle = Handle {
            gpu: index as usize,
            slot: None,
        };
        put(device, handle.to_device())
    })
}

// ---- What a device is ----

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: sys::nvmlDevice_t, index: *mut c_uint) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetIndex", device, |_, handle| {
        put(index, handle.gpu as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: sys::nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetName", device, |fixture, handle| {
        let gpu = &fixture.gpu[handle.gpu];
        match handle.slot {
            None => put_str(name, length, &gpu.name),
            Some(slot) => put_str(name, length, &format!("{} MIG {}", gpu.name, gpu.mig[slot as usize])),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: sys::nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetUUID", device, |fixture, handle| {
        let gpu = &fixture.gpu[handle.gpu];
        match handle.slot {
            None => put_str(uuid, length, &gpu.uuid),
            Some(slot) => {
                let base = gpu.uuid.trim_start_matches("GPU-");
                put_str(uuid, length, &format!("MIG-{base}-{slot}"))
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: sys::nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetPciInfo_v3", device, |fixture, handle| {
        put(pci, pci_info(&fixture.gpu[handle.gpu].pci_bus_id))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: sys::nvmlDevice_t,
    memory: *mut sys::nvmlMemory_v2_t,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetMemoryInfo_v2", device, |fixture, handle| {
        if memory.is_null() {
            return code::INVALID_ARGUMENT;
        }
        let gpu = &fixture.gpu[handle.gpu];
        let total_mib = match handle.slot {
            None => gpu.memory_mib,
            Some(slot) => fixture::mig_memory_mib(&gpu.mig[slot as usize]).unwrap_or(0),
        };
        let (total, used) = (total_mib << 20, gpu.memory_used_mib.min(total_mib) << 20);
        let version = (*memory).version;
        put(
            memory,
            sys::nvmlMemory_v2_t {
                version,
                total,
                reserved: gpu.memory_reserved_mib.min(total_mib) << 20,
                free: total - used,
                used,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: sys::nvmlDevice_t,
    memory: *mut sys::nvmlMemory_t,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetMemoryInfo", device, |fixture, handle| {
        let gpu = &fixture.gpu[handle.gpu];
        let (total, used) = (gpu.memory_mib << 20, gpu.memory_used_mib << 20);
        put(
            memory,
            sys::nvmlMemory_t {
                total,
                free: total.saturating_sub(used),
                used,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: sys::nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetCudaComputeCapability", device, |fixture, handle| {
        let cc = &fixture.gpu[handle.gpu].compute_capability;
        let (high, low) = cc.split_once('.').unwrap_or((cc, "0"));
        let status = put(major, high.parse().unwrap_or(0));
        if status != code::SUCCESS {
            return status;
        }
        put(minor, low.parse().unwrap_or(0))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: sys::nvmlDevice_t,
    node_set_size: c_uint,
    node_set: *mut c_ulong,
    _scope: c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetMemoryAffinity", device, |fixture, handle| {
        match fixture.gpu[handle.gpu].numa_node {
            None => code::NOT_SUPPORTED,
            Some(_) if node_set_size == 0 || node_set.is_null() => code::INVALID_ARGUMENT,
            Some(node) if node >= c_ulong::BITS => code::NOT_SUPPORTED,
            Some(node) => put(node_set, 1 << node),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(device: sys::nvmlDevice_t, node: *mut c_uint) -> sys::nvmlReturn_t {
    // Only GPUs whose memory is a NUMA node of its own (Grace Hopper)
    // have one; PCIe and SXM GPUs on x86 answer NotSupported.
    on_device("nvmlDeviceGetNumaNodeId", device, |_, _| {
        let _ = node;
        code::NOT_SUPPORTED
    })
}

// ---- MIG ----

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: sys::nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetMigMode", device, |fixture, handle| {
        let mode = c_uint::from(!fixture.gpu[handle.gpu].mig.is_empty());
        let status = put(current, mode);
        if status != code::SUCCESS {
            return status;
        }
        put(pending, mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: sys::nvmlDevice_t,
    count: *mut c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetMaxMigDeviceCount", device, |fixture, handle| {
        if fixture.gpu[handle.gpu].mig.is_empty() {
            return code::NOT_SUPPORTED;
        }
        put(count, fixture::MAX_MIG_SLOTS)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: sys::nvmlDevice_t,
    index: c_uint,
    mig_device: *mut sys::nvmlDevice_t,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetMigDeviceHandleByIndex", device, |fixture, handle| {
        // Slots past the instances made are empty.
        if index as usize >= fixture.gpu[handle.gpu].mig.len() {
            return code::NOT_FOUND;
        }
        let slice = Handle {
            gpu: handle.gpu,
            slot: Some(index),
        };
        put(mig_device, slice.to_device())
    })
}

// ---- Topology ----

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: sys::nvmlDevice_t,
    link: c_uint,
    active: *mut c_uint,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceGetNvLinkState", device, |fixture, handle| {
        match fixture.nvlink(handle.gpu, link) {
            None => code::NOT_SUPPORTED,
            Some(found) => put(active, c_uint::from(found != NvLink::Inactive)),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: sys::nvmlDevice_t,
    link: c_uint,
    pci: *mut sys::nvmlPciInfo_t,
) -> sys::nvmlReturn_t {
    on_device(
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        device,
        |fixture, handle| match fixture.nvlink(handle.gpu, link) {
            None => code::NOT_SUPPORTED,
            Some(NvLink::Inactive) => code::NOT_FOUND,
            Some(NvLink::Switch) => put(pci, pci_info(fixture::NVSWITCH_BUS_ID)),
            Some(NvLink::Gpu(peer)) => put(pci, pci_info(&fixture.gpu[peer].pci_bus_id)),
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: sys::nvmlDevice_t,
    link: c_uint,
    kind: *mut c_uint,
) -> sys::nvmlReturn_t {
    on_device(
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        device,
        |fixture, handle| match fixture.nvlink(handle.gpu, link) {
            None => code::NOT_SUPPORTED,
            Some(NvLink::Inactive) => code::NOT_FOUND,
            Some(NvLink::Switch) => put(kind, sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH),
            Some(NvLink::Gpu(_)) => put(kind, sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU),
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    first: sys::nvmlDevice_t,
    second: sys::nvmlDevice_t,
    level: *mut c_uint,
) -> sys::nvmlReturn_t {
    on_device(
        "nvmlDeviceGetTopologyCommonAncestor",
        first,
        |fixture, a| match Handle::of(second, fixture) {
            None => code::INVALID_ARGUMENT,
            Some(b) => put(level, fixture.common_ancestor(a.gpu, b.gpu)),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_name_a_gpu_or_a_slice_and_nothing_else() {
        let fixture: Fixture = toml::from_str(
            "[[gpu]]\nname = \"a\"\nuuid = \"GPU-a\"\npci_bus_id = \"0:1:0.0\"\nmemory_mib = 1\nmig = [\"1g.10gb\"]\n",
        )
        .unwrap();
        for handle in [Handle { gpu: 0, slot: None }, Handle { gpu: 0, slot: Some(0) }] {
            assert_eq!(Handle::of(handle.to_device(), &fixture), Some(handle));
        }
        assert_eq!(Handle::of(Handle { gpu: 1, slot: None }.to_device(), &fixture), None);
        assert_eq!(Handle::of(Handle { gpu: 0, slot: Some(1) }.to_device(), &fixture), None);
        assert_eq!(Handle::of(std::ptr::null_mut(), &fixture), None);
    }

    #[test]
    fn bus_ids_fill_both_fields() {
        let info = pci_info("00000000:18:00.0");
        let text = |field: &[c_char]| -> String {
            field
                .iter()
                .take_while(|c| **c != 0)
                .map(|c| *c as u8 as char)
                .collect()
        };
        assert_eq!(text(&info.busId), "00000000:18:00.0");
        assert_eq!(text(&info.busIdLegacy), "0000:18:00.0");
        assert_eq!((info.domain, info.bus, info.device), (0, 0x18, 0));
    }
}
