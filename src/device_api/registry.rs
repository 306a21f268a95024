//! The backend registry: device type code and name -> `Arc<dyn DeviceApi>`.
//!
//! Each registered backend also gets a global packed function `device_api.<name>` in
//! [`crate::packed_func::registry`], as in TVM. kiln's version takes no argument and returns the
//! backend's **device type code** (an `int`), not a pointer: a C++ `DeviceAPI*` cannot cross the
//! ABI safely, and the code is what every other call (`TVMBackendAllocWorkspace`, DLPack devices)
//! takes. Rust code resolves the backend itself with [`get`] / [`get_by_name`].
//!
//! Extension codes for backends registered at run time start at [`DeviceType::EXT_BASE`] (64);
//! [`next_extension_code`] hands out the next free one.

use std::sync::{Arc, Once, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::api::DeviceApi;
use super::cpu::CpuDeviceApi;
use super::device::{Device, DeviceType};
use super::error::{DeviceError, DeviceResult};
use super::stream::StreamHandle;
use super::workspace;
use crate::packed_func::ffi::DLTensor;
use crate::packed_func::{registry as globals, PackedFunc};

struct Entry {
    name: String,
    code: DeviceType,
    api: Arc<dyn DeviceApi>,
}

fn table() -> &'static RwLock<Vec<Entry>> {
    static TABLE: OnceLock<RwLock<Vec<Entry>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

// Every write is one push, so a poisoned lock is still consistent.
fn read() -> RwLockReadGuard<'static, Vec<Entry>> {
    table().read().unwrap_or_else(|e| e.into_inner())
}

fn write() -> RwLockWriteGuard<'static, Vec<Entry>> {
    table().write().unwrap_or_else(|e| e.into_inner())
}

/// Registers the built-in backends (the CPU, OpenCL, CUDA), the `device_api.<name>` globals and
/// the runtime context slots (`__TVMBackendAllocWorkspace`, `__TVMBackendFreeWorkspace`).
/// Idempotent and cheap after the first call; every lookup here calls it, so calling it is only
/// needed before loading a library that uses the slots.
pub fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let cpu: Arc<dyn DeviceApi> = Arc::new(CpuDeviceApi::new());
        write().push(Entry {
            name: "cpu".to_owned(),
            code: DeviceType::CPU,
            api: cpu,
        });
        register_global("cpu", DeviceType::CPU);
        // OpenCL is always registered; it finds its devices (maybe none) on first use.
        let opencl: Arc<dyn DeviceApi> = super::opencl::instance();
        write().push(Entry {
            name: "opencl".to_owned(),
            code: DeviceType::OPENCL,
            api: opencl,
        });
        register_global("opencl", DeviceType::OPENCL);
        // So is CUDA; it loads the driver and finds its devices (maybe none) on first use.
        let cuda: Arc<dyn DeviceApi> = super::cuda::instance();
        write().push(Entry {
            name: "cuda".to_owned(),
            code: DeviceType::CUDA,
            api: cuda,
        });
        register_global("cuda", DeviceType::CUDA);
        crate::packed_func::context::register_context_symbol(
            "__TVMBackendAllocWorkspace",
            workspace::backend_alloc_workspace_ptr(),
        );
        crate::packed_func::context::register_context_symbol(
            "__TVMBackendFreeWorkspace",
            workspace::backend_free_workspace_ptr(),
        );
    });
}

fn register_global(name: &str, code: DeviceType) {
    let fname = format!("device_api.{name}");
    let f = PackedFunc::from_typed(fname.clone(), move || i64::from(code.0));
    if let Err(e) = globals::register(&fname, f, true) {
        log::warn!("registering `{fname}`: {e}");
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// Registers `api` as the backend of device type `code` under `name`.
///
/// `code` is either a DLPack code whose DLPack name is `name` (a real `cuda` backend at 2), or an
/// extension code in `[DeviceType::EXT_BASE, DeviceType::EXT_END)` (see
/// [`next_extension_code`]). `api.device_type()` must be `code`.
///
/// ```
/// use std::sync::Arc;
/// use kiln::device_api::{self, Device, NullDeviceApi, Tensor};
///
/// let code = device_api::next_extension_code()?;
/// let api = Arc::new(NullDeviceApi::new("docdev", code, 1, 1 << 20));
/// device_api::register_device_api("docdev", code, api)?;
///
/// let dev: Device = "docdev:0".parse()?;
/// let t = Tensor::from_slice(&[1i32, 2, 3], &[3], dev)?; // allocated and copied by docdev
/// assert_eq!(t.to_vec::<i32>()?, [1, 2, 3]);
/// let f = kiln::packed_func::registry::require("device_api.docdev")?;
/// assert_eq!(f.call_typed::<_, i64>(())?, i64::from(code.0));
/// # Ok::<(), kiln::Error>(())
/// ```
///
/// # Errors
/// [`DeviceError::Registration`] for a taken name or code, a malformed name, a code outside the
/// allowed ranges, or a backend that reports another code.
pub fn register_device_api(
    name: &str,
    code: DeviceType,
    api: Arc<dyn DeviceApi>,
) -> DeviceResult<()> {
    init();
    let fail = |reason: String| DeviceError::Registration {
        name: name.to_owned(),
        code: code.0,
        reason,
    };
    if !valid_name(name) {
        return Err(fail(
            "a backend name is lowercase letters, digits and `_`, not starting with a digit"
                .to_owned(),
        ));
    }
    match code.builtin_name() {
        Some(n) if n != name => {
            return Err(fail(format!(
                "code {} is DLPack's `{n}`; register `{n}` there or use an extension code \
                 (from {})",
                code.0,
                DeviceType::EXT_BASE
            )))
        }
        Some(_) => {}
        None if (DeviceType::EXT_BASE..DeviceType::EXT_END).contains(&code.0) => {
            if DeviceType::from_builtin_name(name).is_some() {
                return Err(fail(format!("`{name}` is a DLPack device name")));
            }
        }
        None => {
            return Err(fail(format!(
                "extension codes are {}..{} (lower codes are reserved for DLPack and TVM, higher \
                 ones for TVM's RPC sessions)",
                DeviceType::EXT_BASE,
                DeviceType::EXT_END
            )))
        }
    }
    if api.device_type() != code {
        return Err(fail(format!(
            "the backend reports device type {}",
            api.device_type().0
        )));
    }
    {
        let mut t = write();
        if let Some(e) = t.iter().find(|e| e.name == name || e.code == code) {
            return Err(fail(format!(
                "already registered as `{}` with code {}",
                e.name, e.code.0
            )));
        }
        t.push(Entry {
            name: name.to_owned(),
            code,
            api,
        });
    }
    register_global(name, code);
    Ok(())
}

/// The next extension code no backend uses.
///
/// # Errors
/// [`DeviceError::Registration`] when all extension codes are taken.
pub fn next_extension_code() -> DeviceResult<DeviceType> {
    init();
    let t = read();
    (DeviceType::EXT_BASE..DeviceType::EXT_END)
        .map(DeviceType)
        .find(|c| t.iter().all(|e| e.code != *c))
        .ok_or_else(|| DeviceError::Registration {
            name: String::new(),
            code: DeviceType::EXT_END,
            reason: "every extension code is taken".to_owned(),
        })
}

fn registered_names(t: &[Entry]) -> Vec<String> {
    t.iter().map(|e| e.name.clone()).collect()
}

/// The backend of device type `t`.
///
/// # Errors
/// [`DeviceError::NoBackend`] for a known type without a backend (e.g. `rocm`, which kiln has
/// no backend for), [`DeviceError::UnknownDevice`] for a code nobody knows; both list the
/// registered backends.
pub fn get(t: DeviceType) -> DeviceResult<Arc<dyn DeviceApi>> {
    init();
    let table = read();
    if let Some(e) = table.iter().find(|e| e.code == t) {
        return Ok(e.api.clone());
    }
    let registered = registered_names(&table);
    drop(table);
    match t.builtin_name() {
        Some(n) => Err(DeviceError::NoBackend {
            name: n.to_owned(),
            code: t.0,
            registered,
        }),
        None => Err(DeviceError::UnknownDevice {
            name: format!("device_type({})", t.0),
            known: registered,
        }),
    }
}

/// The backend called `name` (or the backend of the DLPack type / TVM alias called `name`).
///
/// # Errors
/// As [`get`]; [`DeviceError::UnknownDevice`] for an unknown name.
pub fn get_by_name(name: &str) -> DeviceResult<Arc<dyn DeviceApi>> {
    init();
    get(DeviceType::from_name(name)?)
}

/// The backend serving `dev`, after checking the id.
///
/// # Errors
/// As [`get`]; [`DeviceError::InvalidDevice`].
pub fn get_for(dev: Device) -> DeviceResult<Arc<dyn DeviceApi>> {
    let api = get(dev.device_type)?;
    api.check_device(dev)?;
    Ok(api)
}

/// The registered backends, `(name, code)`, in registration order (the CPU first).
pub fn list() -> Vec<(String, DeviceType)> {
    init();
    read().iter().map(|e| (e.name.clone(), e.code)).collect()
}

/// The registered name of `t` (no initialization, so it is safe inside registration).
pub(crate) fn name_of(t: DeviceType) -> Option<String> {
    table()
        .try_read()
        .ok()?
        .iter()
        .find(|e| e.code == t)
        .map(|e| e.name.clone())
}

/// The code registered under `name`.
pub(crate) fn code_of(name: &str) -> Option<DeviceType> {
    init();
    read().iter().find(|e| e.name == name).map(|e| e.code)
}

/// Copies `from` into `to` through the backend that owns the device side: the non-CPU side's
/// backend, or the CPU's for host-to-host copies. Across two non-CPU backends, the copy bounces
/// through host memory. `stream` is a stream of that backend's device (use
/// [`StreamHandle::DEFAULT`] when unsure).
///
/// # Errors
/// As [`DeviceApi::copy_data_from_to`].
///
/// # Safety
/// As [`DeviceApi::copy_data_from_to`].
pub unsafe fn copy_data_from_to(
    from: &DLTensor,
    to: &DLTensor,
    stream: StreamHandle,
) -> DeviceResult<()> {
    let f = Device::from(from.device);
    let owner = if f.is_cpu() { to.device.into() } else { f };
    let api = get(owner.device_type)?;
    // SAFETY: forwarded contract.
    unsafe { api.copy_data_from_to(from, to, stream) }
}
