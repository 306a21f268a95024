//! kiln's device backends as a C table for TVM's runtime: the functions a TVM `DeviceAPI` needs
//! (allocate, free, copy, synchronize, attributes), over kiln's registry
//! ([`kiln::device_api`]).
//!
//! TVM's C++ runtime finds the runtime of a device type through the global function
//! `device_api.<name>`, which returns a pointer to a C++ `DeviceAPI` object. Python's
//! `kiln.tvm` compiles a small C++ class against the installed TVM's own headers
//! (`python/kiln/_tvm_device.cc`) whose methods call through this table, and registers it:
//! then TVM's Relax VM allocates its tensors of that device in kiln's memory, which is what
//! kiln's kernels check their buffers against before a launch. No C++ object crosses into
//! Rust and no Rust type crosses into C++: only the plain C types below.
//!
//! Every function returns 0, or -1 with the message in [`DeviceTable::last_error`] (this
//! thread's); none unwinds (a panic is caught and reported as an error).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use kiln::device_api::{
    copy_data_from_to, get, AttrKind, AttrValue, Device, DevicePtr, DeviceResult, DeviceType,
    StreamHandle,
};
use kiln::packed_func::{DLDataType, DLTensor};

/// The table's layout version: the C++ side refuses another.
pub const TABLE_VERSION: u32 = 1;

/// The C table (`KilnDeviceTable` in `_tvm_device.cc`; the same field order and types).
#[repr(C)]
pub struct DeviceTable {
    /// [`TABLE_VERSION`].
    pub version: u32,
    /// `(device_type, device_id, kind, out_int, out_str) -> rc`: writes `*out_int` for a number
    /// (returns 1), `*out_str` for a string valid until this thread's next call (returns 2), or
    /// nothing when the attribute is unreported (returns 0); -1 on error.
    pub attr: unsafe extern "C" fn(i32, i32, i32, *mut i64, *mut *const c_char) -> i32,
    /// `(device_type, device_id, nbytes, alignment, dtype_hint, out_ptr) -> rc`.
    pub alloc: unsafe extern "C" fn(i32, i32, u64, u64, DLDataType, *mut *mut c_void) -> i32,
    /// `(device_type, device_id, ptr) -> rc`.
    pub free: unsafe extern "C" fn(i32, i32, *mut c_void) -> i32,
    /// `(from, to, stream) -> rc`: copies `from` into `to` (either may be on the host),
    /// ordered on `stream` of the device side.
    pub copy: unsafe extern "C" fn(*const DLTensor, *const DLTensor, *mut c_void) -> i32,
    /// `(device_type, device_id, stream) -> rc`: waits for `stream` (NULL: the default).
    pub sync: unsafe extern "C" fn(i32, i32, *mut c_void) -> i32,
    /// `() -> message`: this thread's last error, valid until its next failing call.
    pub last_error: unsafe extern "C" fn() -> *const c_char,
    /// `(meta, launch_slot, module_slot) -> rc`: loads the device module of an exported
    /// library's `__kiln_device_meta` (once per distinct text, kept for the process) and fills
    /// the library's two device slots (`__kiln_device_module`, then `__KilnDeviceLaunch`).
    /// Registered by the C++ side as tvm-ffi's `kiln.runtime.attach_device_module`, which the
    /// library's host code calls when its loader (TVM's) filled no slot.
    pub attach: unsafe extern "C" fn(*const c_char, *mut c_void, *mut c_void) -> i32,
}

/// The table (a static: its address is what Python hands to the C++ side).
pub static TABLE: DeviceTable = DeviceTable {
    version: TABLE_VERSION,
    attr,
    alloc,
    free,
    copy,
    sync,
    last_error,
    attach,
};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static LAST_STR: RefCell<CString> = RefCell::new(CString::default());
}

fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// Runs `f`: its value, or -1 with the error (or the panic) kept for `last_error`.
fn guarded<E: std::fmt::Display>(what: &str, f: impl FnOnce() -> Result<i32, E>) -> i32 {
    let message = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(rc)) => return rc,
        Ok(Err(e)) => format!("kiln {what}: {e}"),
        Err(p) => {
            let why = crate::ffi::panic_message(p.as_ref());
            format!("kiln {what} panicked (a kiln bug, please report it): {why}")
        }
    };
    LAST_ERROR.with(|l| *l.borrow_mut() = c_string(&message));
    -1
}

fn device(ty: i32, id: i32) -> Device {
    Device::new(DeviceType(ty), id)
}

unsafe extern "C" fn attr(
    ty: i32,
    id: i32,
    kind: i32,
    out_int: *mut i64,
    out_str: *mut *const c_char,
) -> i32 {
    guarded("device attribute", || -> DeviceResult<i32> {
        let dev = device(ty, id);
        let api = get(dev.device_type)?;
        if kind == 0 {
            // kExist: whether the device is there, never an error.
            let n = api.device_count().unwrap_or(0);
            let there = usize::try_from(id).is_ok_and(|i| i < n);
            // SAFETY: the C++ caller passes a writable i64.
            unsafe { out_int.write(i64::from(there)) };
            return Ok(1);
        }
        match api.attr(dev, AttrKind(kind))? {
            None => Ok(0),
            Some(AttrValue::Int(v)) => {
                // SAFETY: as above.
                unsafe { out_int.write(v) };
                Ok(1)
            }
            Some(AttrValue::Str(s)) => {
                LAST_STR.with(|l| {
                    let mut l = l.borrow_mut();
                    *l = c_string(&s);
                    // SAFETY: the caller passes a writable pointer; the string lives in this
                    // thread's slot until its next string attribute.
                    unsafe { out_str.write(l.as_ptr()) };
                });
                Ok(2)
            }
        }
    })
}

unsafe extern "C" fn alloc(
    ty: i32,
    id: i32,
    nbytes: u64,
    align: u64,
    hint: DLDataType,
    out: *mut *mut c_void,
) -> i32 {
    guarded("allocation", || -> DeviceResult<i32> {
        let dev = device(ty, id);
        let api = get(dev.device_type)?;
        // TVM allocates zero bytes for empty tensors; kiln's backends refuse a zero size, so
        // an empty tensor gets the smallest allocation (its data is never read).
        let n = usize::try_from(nbytes.max(1)).unwrap_or(usize::MAX);
        let a = usize::try_from(align.max(1)).unwrap_or(usize::MAX);
        let p = api.alloc_data_space(dev, n, a, hint)?;
        // SAFETY: the C++ caller passes a writable pointer.
        unsafe { out.write(p.as_raw()) };
        Ok(0)
    })
}

unsafe extern "C" fn free(ty: i32, id: i32, ptr: *mut c_void) -> i32 {
    guarded("free", || -> DeviceResult<i32> {
        let dev = device(ty, id);
        get(dev.device_type)?.free_data_space(dev, DevicePtr::from_raw(ptr))?;
        Ok(0)
    })
}

unsafe extern "C" fn copy(from: *const DLTensor, to: *const DLTensor, stream: *mut c_void) -> i32 {
    guarded("copy", || -> DeviceResult<i32> {
        if from.is_null() || to.is_null() {
            return Err(kiln::device_api::DeviceError::InvalidTensor(
                "a NULL tensor was passed to copy".into(),
            ));
        }
        // SAFETY: TVM passes two tensors valid for the call whose data are host memory or
        // memory of a device runtime; kiln's backends check a device tensor's memory against
        // their own allocations (a foreign handle is an error), and TVM keeps both alive until
        // the copy's stream is synchronized.
        unsafe { copy_data_from_to(&*from, &*to, StreamHandle::from_raw(stream as u64)) }?;
        Ok(0)
    })
}

unsafe extern "C" fn sync(ty: i32, id: i32, stream: *mut c_void) -> i32 {
    guarded("stream sync", || -> DeviceResult<i32> {
        let dev = device(ty, id);
        get(dev.device_type)?.sync_stream(dev, StreamHandle::from_raw(stream as u64))?;
        Ok(0)
    })
}

unsafe extern "C" fn last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

unsafe extern "C" fn attach(
    meta: *const c_char,
    launch_slot: *mut c_void,
    module_slot: *mut c_void,
) -> i32 {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicPtr, Ordering};
    use std::sync::{Arc, Mutex};

    use kiln::runtime::{load_device_module, DeviceModule};

    static MODULES: Mutex<Option<HashMap<String, Arc<DeviceModule>>>> = Mutex::new(None);
    guarded("device module", || -> Result<i32, String> {
        if meta.is_null() || launch_slot.is_null() || module_slot.is_null() {
            return Err("attach_device_module was passed a NULL pointer".to_owned());
        }
        // SAFETY: the caller (an exported library's host code) passes its NUL-terminated
        // constant `__kiln_device_meta`.
        let text = unsafe { std::ffi::CStr::from_ptr(meta) }
            .to_str()
            .map_err(|_| "the library's device metadata is not UTF-8".to_owned())?
            .to_owned();
        let mut cache = MODULES.lock().unwrap_or_else(|e| e.into_inner());
        let cache = cache.get_or_insert_with(HashMap::new);
        let dm = match cache.get(&text) {
            Some(dm) => dm.clone(),
            None => {
                let dm = load_device_module(&text)?;
                cache.insert(text, dm.clone());
                dm
            }
        };
        // SAFETY: both slots are the library's exported, aligned `void*` variables, which its
        // host code reads with acquire loads; the module stays in `MODULES` for the process,
        // so the pointer outlives every launch through it. The module is stored first, so a
        // thread that sees the launcher sees the module too.
        unsafe {
            (*(module_slot as *const AtomicPtr<c_void>))
                .store(Arc::as_ptr(&dm) as *mut c_void, Ordering::Release);
            (*(launch_slot as *const AtomicPtr<c_void>)).store(
                kiln::runtime::launch::kiln_device_launch as *const () as *mut c_void,
                Ordering::Release,
            );
        }
        Ok(0)
    })
}

/// The table's address, for `kiln.tvm` to hand to the C++ side.
pub fn table_address() -> i64 {
    std::ptr::addr_of!(TABLE) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_allocations_round_trip_and_errors_are_kept() {
        let t = &TABLE;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writable out-pointers, as the table's contract asks.
        unsafe {
            let hint = DLDataType {
                code: kiln::packed_func::ffi::DLDataTypeCode::FLOAT,
                bits: 32,
                lanes: 1,
            };
            assert_eq!((t.alloc)(1, 0, 256, 64, hint, &mut p), 0);
            assert!(!p.is_null() && (p as usize) % 64 == 0);
            assert_eq!((t.free)(1, 0, p), 0);
            // A second free of the same pointer is kiln's error, not a crash.
            assert_eq!((t.free)(1, 0, p), -1);
            let msg = std::ffi::CStr::from_ptr((t.last_error)())
                .to_string_lossy()
                .into_owned();
            assert!(msg.starts_with("kiln free:"), "{msg}");
            let mut v = 0i64;
            let mut s: *const c_char = std::ptr::null();
            assert_eq!((t.attr)(1, 0, 0, &mut v, &mut s), 1);
            assert_eq!(v, 1);
            assert_eq!((t.attr)(1, 7, 0, &mut v, &mut s), 1);
            assert_eq!(v, 0, "cpu:7 does not exist");
            assert_eq!(
                (t.copy)(std::ptr::null(), std::ptr::null(), std::ptr::null_mut()),
                -1
            );
        }
    }

    #[test]
    fn attaching_a_bad_device_module_is_an_error_that_leaves_the_slots_empty() {
        let t = &TABLE;
        let mut launch: *mut c_void = std::ptr::null_mut();
        let mut module: *mut c_void = std::ptr::null_mut();
        let (ls, ms) = (
            std::ptr::addr_of_mut!(launch).cast::<c_void>(),
            std::ptr::addr_of_mut!(module).cast::<c_void>(),
        );
        let message = || {
            // SAFETY: the table's last error is a NUL-terminated string of this thread.
            unsafe { std::ffi::CStr::from_ptr((t.last_error)()) }
                .to_string_lossy()
                .into_owned()
        };
        // SAFETY: NULL or NUL-terminated metadata and two writable pointer slots.
        unsafe {
            assert_eq!((t.attach)(std::ptr::null(), ls, ms), -1);
            assert_eq!(
                message(),
                "kiln device module: attach_device_module was passed a NULL pointer"
            );
            assert_eq!((t.attach)(c"not metadata".as_ptr(), ls, ms), -1);
        }
        assert!(
            message().starts_with("kiln device module: "),
            "{}",
            message()
        );
        assert!(launch.is_null() && module.is_null());
    }
}
