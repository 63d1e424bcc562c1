//! Event sets: the fixture's Xid events, delivered to the GPUs registered.

use crate::fixture::code;
use crate::{gate, on_device, put, since_start, Handle};
use nvml_wrapper_sys::bindings as sys;
use std::os::raw::{c_uint, c_ulonglong};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// nvmlEventTypeXidCriticalError of nvml.h.
const XID_CRITICAL: c_ulonglong = 0x8;

/// An event set: the GPUs registered with it, and which of the file's Xids
/// it has delivered (by their place in the file: Xids are added at its
/// end).
struct EventSet {
    gpus: Mutex<Vec<usize>>,
    delivered: Mutex<Vec<bool>>,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut sys::nvmlEventSet_t) -> sys::nvmlReturn_t {
    gate("nvmlEventSetCreate", None, |_, _| {
        let created = Box::new(EventSet {
            gpus: Mutex::new(Vec::new()),
            delivered: Mutex::new(Vec::new()),
        });
        let raw = Box::into_raw(created).cast();
        let status = put(set, raw);
        if status != code::SUCCESS {
            drop(Box::from_raw(raw.cast::<EventSet>()));
        }
        status
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: sys::nvmlDevice_t,
    types: c_ulonglong,
    set: sys::nvmlEventSet_t,
) -> sys::nvmlReturn_t {
    on_device("nvmlDeviceRegisterEvents", device, |_, handle| {
        if set.is_null() {
            return code::INVALID_ARGUMENT;
        }
        if types & XID_CRITICAL == 0 {
            return code::NOT_SUPPORTED;
        }
        let set = &*set.cast::<EventSet>();
        set.gpus.lock().unwrap_or_else(|p| p.into_inner()).push(handle.gpu);
        code::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: sys::nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    timeout_ms: c_uint,
) -> sys::nvmlReturn_t {
    gate("nvmlEventSetWait_v2", None, |loaded, _| {
        if set.is_null() || data.is_null() {
            return code::INVALID_ARGUMENT;
        }
        let set = &*set.cast::<EventSet>();
        let until = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            let now = since_start(loaded);
            let fixture = loaded.fixture();
            let gpus = set.gpus.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let mut delivered = set.delivered.lock().unwrap_or_else(|p| p.into_inner());
            if delivered.len() < fixture.xid.len() {
                delivered.resize(fixture.xid.len(), false);
            }
            let due = fixture
                .xid
                .iter()
                .enumerate()
                .find(|(k, xid)| !delivered[*k] && xid.after_ms <= now && gpus.contains(&(xid.gpu as usize)));
            if let Some((k, xid)) = due {
                delivered[k] = true;
                let device = Handle {
                    gpu: xid.gpu as usize,
                    slot: None,
                };
                return put(
                    data,
                    sys::nvmlEventData_t {
                        device: device.to_device(),
                        eventType: XID_CRITICAL,
                        eventData: xid.xid,
                        gpuInstanceId: 0,
                        computeInstanceId: 0,
                    },
                );
            }
            drop(delivered);
            if Instant::now() >= until {
                return code::TIMEOUT;
            }
            std::thread::sleep(Duration::from_millis(10).min(until.saturating_duration_since(Instant::now())));
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: sys::nvmlEventSet_t) -> sys::nvmlReturn_t {
    if set.is_null() {
        return code::INVALID_ARGUMENT;
    }
    drop(Box::from_raw(set.cast::<EventSet>()));
    code::SUCCESS
}
