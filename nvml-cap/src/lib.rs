//! `libgpool_nvml_cap.so`: what a fraction of a GPU sees of its GPU through
//! NVML. The agent preloads it (`LD_PRELOAD`) into each fraction's
//! processes; `nvmlDeviceGetMemoryInfo` and `nvmlDeviceGetMemoryInfo_v2`
//! then report, for the shared GPU (`GPOOL_SHARED_GPU`, its NVML index),
//! the fraction's cap (`GPOOL_GPU_MEM_MIB`) as its total, and no more free
//! memory than the cap, so that `nvidia-smi` and frameworks that size
//! themselves from NVML see the job's part. Other GPUs, and every other
//! NVML call, are the driver's.
//!
//! A program linked against NVML reaches these functions by the dynamic
//! linker's order; one that loads NVML itself (`nvidia-smi`, Python's
//! `pynvml` through ctypes) looks them up with `dlsym`, which this library
//! also wraps: it hands out its own two functions for those names and
//! keeps the driver's to call.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

type nvmlReturn_t = c_int;
type nvmlDevice_t = *mut c_void;
const NVML_SUCCESS: nvmlReturn_t = 0;
const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;

#[repr(C)]
pub struct nvmlMemory_t {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
pub struct nvmlMemory_v2_t {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

type MemoryInfo = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t;
type MemoryInfoV2 = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> nvmlReturn_t;
type DeviceIndex = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;
type Dlsym = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

const MEMORY_INFO: &CStr = c"nvmlDeviceGetMemoryInfo";
const MEMORY_INFO_V2: &CStr = c"nvmlDeviceGetMemoryInfo_v2";
const DEVICE_INDEX: &CStr = c"nvmlDeviceGetIndex";

/// The driver's functions, once found (by `dlsym` on NVML's handle, or
/// next in the linker's order).
static REAL_MEMORY_INFO: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_MEMORY_INFO_V2: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_DEVICE_INDEX: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The C library's `dlsym` (this library's own wraps it), found when the
/// library is loaded.
static mut REAL_DLSYM: usize = 0;

/// Finds the C library's `dlsym` before the program runs (dlvsym is not
/// wrapped; glibc 2.34 moved dlsym into libc).
extern "C" fn find_real_dlsym() {
    let found = [c"GLIBC_2.34", c"GLIBC_2.2.5"]
        .iter()
        // SAFETY: dlvsym with constant C strings.
        .map(|version| unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) })
        .find(|found| !found.is_null());
    // SAFETY: written once, at load, before any thread of the program runs.
    unsafe {
        REAL_DLSYM = found.map_or(0, |found| found as usize);
    }
}

#[used]
#[link_section = ".init_array"]
static FIND_REAL_DLSYM: extern "C" fn() = find_real_dlsym;

fn real_dlsym() -> Option<Dlsym> {
    // SAFETY: set at load (or here, by a lookup that came before this
    // library's constructor), always to the same address.
    if unsafe { REAL_DLSYM } == 0 {
        find_real_dlsym();
    }
    // SAFETY: as above.
    let address = unsafe { REAL_DLSYM };
    // SAFETY: the address of the C library's dlsym, whose type this is.
    (address != 0).then(|| unsafe { std::mem::transmute::<usize, Dlsym>(address) })
}

/// The cap, and the NVML index of the GPU it applies to.
fn cap() -> Option<(u64, u32)> {
    static CAP: OnceLock<Option<(u64, u32)>> = OnceLock::new();
    *CAP.get_or_init(|| {
        let mib = std::env::var("GPOOL_GPU_MEM_MIB").ok()?.parse::<u64>().ok()?;
        let gpu = std::env::var("GPOOL_SHARED_GPU").ok()?.parse::<u32>().ok()?;
        Some((mib.checked_mul(1 << 20)?, gpu))
    })
}

/// The driver's function `name`: found earlier, or next in the linker's
/// order after this library.
fn driver(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let known = slot.load(Ordering::Acquire);
    if !known.is_null() {
        return known;
    }
    let Some(dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the C library's dlsym with a constant C string.
    let found = unsafe { dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if !found.is_null() {
        slot.store(found, Ordering::Release);
    }
    found
}

/// The cap in bytes where `device` is the shared GPU.
fn cap_of(device: nvmlDevice_t) -> Option<u64> {
    let (bytes, gpu) = cap()?;
    let index = driver(&REAL_DEVICE_INDEX, DEVICE_INDEX);
    if index.is_null() {
        return None;
    }
    // SAFETY: NVML's nvmlDeviceGetIndex, whose type this is.
    let index: DeviceIndex = unsafe { std::mem::transmute::<*mut c_void, DeviceIndex>(index) };
    let mut found: c_uint = 0;
    // SAFETY: a device handle NVML gave the caller, and a place to write.
    let code = unsafe { index(device, &mut found) };
    (code == NVML_SUCCESS && found == gpu).then_some(bytes)
}

/// What of `total` bytes with `free` free the job sees under `cap`: its
/// total and free (never more than the GPU has free).
pub fn capped(total: u64, free: u64, cap: u64) -> (u64, u64) {
    let total = total.min(cap);
    (total, free.min(total))
}

/// # Safety
/// As NVML's: `device` from NVML, `memory` writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t {
    let real = driver(&REAL_MEMORY_INFO, MEMORY_INFO);
    if real.is_null() {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    // SAFETY: the driver's function of this type, called as the caller did.
    let code = unsafe { std::mem::transmute::<*mut c_void, MemoryInfo>(real)(device, memory) };
    if let (NVML_SUCCESS, Some(cap), false) = (code, cap_of(device), memory.is_null()) {
        // SAFETY: NVML filled it.
        let memory = unsafe { &mut *memory };
        (memory.total, memory.free) = capped(memory.total, memory.free, cap);
        memory.used = memory.total - memory.free;
    }
    code
}

/// # Safety
/// As NVML's: `device` from NVML, `memory` writable with its version set.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    let real = driver(&REAL_MEMORY_INFO_V2, MEMORY_INFO_V2);
    if real.is_null() {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    // SAFETY: the driver's function of this type, called as the caller did.
    let code = unsafe { std::mem::transmute::<*mut c_void, MemoryInfoV2>(real)(device, memory) };
    if let (NVML_SUCCESS, Some(cap), false) = (code, cap_of(device), memory.is_null()) {
        // SAFETY: NVML filled it.
        let memory = unsafe { &mut *memory };
        (memory.total, memory.free) = capped(memory.total, memory.free, cap);
        memory.reserved = memory.reserved.min(memory.total - memory.free);
        memory.used = memory.total - memory.free - memory.reserved;
    }
    code
}

/// `dlsym`, as the C library's, but NVML's two memory functions are this
/// library's (the driver's kept for them to call). `RTLD_NEXT` is the
/// C library's own, reached by a jump (it looks past whoever called it,
/// which must stay the caller, not this library).
///
/// # Safety
/// As the C library's dlsym.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        "cmp rdi, -1",
        "jne {wrapped}",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz {wrapped}",
        "jmp rax",
        wrapped = sym dlsym_on_handle,
        real = sym REAL_DLSYM,
    )
}

/// `dlsym` of a handle (or `RTLD_DEFAULT`, or `RTLD_NEXT` before the C
/// library's was found), through the C library's.
///
/// # Safety
/// As the C library's dlsym.
unsafe extern "C" fn dlsym_on_handle(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let Some(real) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: as the caller promises.
    let found = unsafe { real(handle, name) };
    if found.is_null() || name.is_null() {
        return found;
    }
    // SAFETY: a C string, as the caller promises.
    let name = unsafe { CStr::from_ptr(name) };
    let (slot, ours) = if name == MEMORY_INFO {
        (&REAL_MEMORY_INFO, nvmlDeviceGetMemoryInfo as *mut c_void)
    } else if name == MEMORY_INFO_V2 {
        (&REAL_MEMORY_INFO_V2, nvmlDeviceGetMemoryInfo_v2 as *mut c_void)
    } else if name == DEVICE_INDEX {
        REAL_DEVICE_INDEX.store(found, Ordering::Release);
        return found;
    } else {
        return found;
    };
    if found == ours {
        return found;
    }
    slot.store(found, Ordering::Release);
    // Which GPU a handle is, asked of the same library (one loaded with
    // RTLD_LOCAL is not found next in the linker's order).
    if REAL_DEVICE_INDEX.load(Ordering::Acquire).is_null() {
        // SAFETY: as above, with a constant C string.
        let index = unsafe { real(handle, DEVICE_INDEX.as_ptr()) };
        REAL_DEVICE_INDEX.store(index, Ordering::Release);
    }
    ours
}

#[cfg(test)]
mod tests {
    use super::capped;

    /// The job's total is the cap (or the GPU's, when smaller), and it
    /// never sees more free than the GPU has or than its total.
    #[test]
    fn the_job_sees_its_cap() {
        const GIB: u64 = 1 << 30;
        assert_eq!(capped(80 * GIB, 70 * GIB, 20 * GIB), (20 * GIB, 20 * GIB));
        assert_eq!(capped(80 * GIB, 5 * GIB, 20 * GIB), (20 * GIB, 5 * GIB));
        assert_eq!(capped(16 * GIB, 16 * GIB, 20 * GIB), (16 * GIB, 16 * GIB));
    }
}
