//! Device kernels at run time: the service that generated host code calls to launch a kernel.
//!
//! A module compiled for a device target (e.g. `opencl`) has two halves: host code (LLVM)
//! that checks the arguments and runs the host part of each function, and device code (e.g.
//! OpenCL C) holding the kernels. The host code launches kernel `k` by calling the context
//! slot `__KilnDeviceLaunch` with the module's *device module* (the slot
//! `__kiln_device_module`): a [`DeviceModule`], which knows each kernel's name and parameters,
//! and forwards the launch to the backend's [`KernelLauncher`] (which builds the device code on
//! first use and enqueues the kernel on the current stream of the device).
//!
//! ```text
//! host fn f(A, B, n)          DeviceModule { kernels: [f_kernel0(A: float32*, n: int32)], launcher }
//!   checks arguments                  ▲
//!   launch(k=0, dev, args, grid, block) ──► kiln_device_launch ──► launcher.launch(dev, "f_kernel0", ...)
//! ```
//!
//! A library exported by `kiln build` carries the device code and kernel table as the
//! constant `__kiln_device_meta` (JSON, format `kiln-device/1`); kiln's loader reads it,
//! creates the device module through the loader registered for its kind
//! ([`register_device_module_loader`]) and fills the two slots. A host that does not fill them
//! (plain C, tvm_ffi alone) gets a `RuntimeError` naming what is missing, never a crash.
//!
//! Every argument is checked before the backend sees it: the launcher is told, for each
//! buffer, the bytes the host's shape checks vouch for, and refuses a handle that is not a live
//! allocation of that size on that device.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock, RwLock};

use serde_json::{json, Value};

use super::{DevicePtr, DeviceResult};
use crate::ir::DataType;

/// One argument of a kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelArg {
    /// A device buffer: its handle, and the bytes the kernel may touch (the launcher checks the
    /// allocation holds them).
    Buffer {
        /// The allocation (the `DLTensor::data` of a device tensor).
        ptr: DevicePtr,
        /// Bytes from the start of the allocation the kernel may access.
        min_bytes: u64,
    },
    /// A scalar: its little-endian bytes (the first `size`).
    Scalar {
        /// The value's bytes.
        bytes: [u8; 8],
        /// 1, 2, 4 or 8.
        size: usize,
    },
}

/// What a kernel parameter is, as the device module records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelParamKind {
    /// A buffer of this element type.
    Buffer(DataType),
    /// A scalar of this type (`bool` is passed as a 4-byte `int`).
    Scalar(DataType),
}

/// One kernel of a device module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInfo {
    /// The kernel's symbol in the device code.
    pub name: String,
    /// Its parameters, in order.
    pub params: Vec<KernelParamKind>,
}

/// A backend's side of launching kernels from one device source.
pub trait KernelLauncher: Send + Sync {
    /// Enqueues kernel `name` on the calling thread's current stream of device `device_id`,
    /// `global` work-items per axis in groups of `local`, without waiting.
    ///
    /// # Errors
    /// A device that does not exist, a build failure (with the build log), a buffer that is not
    /// a live allocation of at least `min_bytes` on that device, sizes over the device's limits.
    fn launch(
        &self,
        device_id: usize,
        name: &str,
        args: &[KernelArg],
        global: [usize; 3],
        local: [usize; 3],
    ) -> DeviceResult<()>;
}

/// The device half of a compiled module: the kernel table and the backend that runs them.
pub struct DeviceModule {
    kind: String,
    source: String,
    kernels: Vec<KernelInfo>,
    launcher: Box<dyn KernelLauncher>,
}

impl std::fmt::Debug for DeviceModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceModule")
            .field("kind", &self.kind)
            .field("kernels", &self.kernels)
            .finish()
    }
}

/// The raw form of one launch argument in generated code: `{value, extra}` (a buffer's handle
/// and byte span, or a scalar's bits and 0).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawKernelArg {
    /// The handle, or the scalar's bits (zero- or sign-extended).
    pub value: u64,
    /// The buffer's byte span (0 for scalars).
    pub extra: u64,
}

impl DeviceModule {
    /// A device module of `kind` (`opencl`) over `source`, with these kernels.
    pub fn new(
        kind: &str,
        source: String,
        kernels: Vec<KernelInfo>,
        launcher: Box<dyn KernelLauncher>,
    ) -> Self {
        DeviceModule {
            kind: kind.to_owned(),
            source,
            kernels,
            launcher,
        }
    }

    /// The device code.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The target kind it was compiled for.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The kernels.
    pub fn kernels(&self) -> &[KernelInfo] {
        &self.kernels
    }

    /// Launches kernel number `kernel` from raw arguments (what generated code passes).
    ///
    /// # Errors
    /// An unknown kernel index, a wrong argument count, negative or oversized extents, and the
    /// launcher's errors.
    pub fn launch_raw(
        &self,
        kernel: usize,
        device_id: i32,
        args: &[RawKernelArg],
        grid: [i64; 3],
        block: [i64; 3],
    ) -> Result<(), String> {
        let k = self.kernels.get(kernel).ok_or_else(|| {
            format!(
                "device module has {} kernels, kernel #{kernel} was launched (a kiln bug)",
                self.kernels.len()
            )
        })?;
        if args.len() != k.params.len() {
            return Err(format!(
                "kernel `{}` takes {} arguments, {} were passed (a kiln bug)",
                k.name,
                k.params.len(),
                args.len()
            ));
        }
        let device_id = usize::try_from(device_id)
            .map_err(|_| format!("kernel `{}`: device id {device_id} is negative", k.name))?;
        let mut global = [1usize; 3];
        let mut local = [1usize; 3];
        for a in 0..3 {
            let axis = ["x", "y", "z"][a];
            let (g, b) = (grid[a], block[a]);
            if g <= 0 || b <= 0 {
                // An empty launch runs nothing, like a loop with no iteration.
                return Ok(());
            }
            let total = g.checked_mul(b).and_then(|t| usize::try_from(t).ok());
            global[a] = total.ok_or_else(|| {
                format!(
                    "kernel `{}`: blockIdx.{axis} {g} × threadIdx.{axis} {b} work-items overflow",
                    k.name
                )
            })?;
            local[a] = b as usize;
        }
        // Up to 8 arguments are converted on the stack: no allocation per launch.
        const INLINE: usize = 8;
        let mut inline = [KernelArg::Scalar {
            bytes: [0; 8],
            size: 0,
        }; INLINE];
        let mut heap = Vec::new();
        let out: &mut [KernelArg] = if args.len() <= INLINE {
            &mut inline[..args.len()]
        } else {
            heap.resize(args.len(), inline[0]);
            &mut heap
        };
        for ((o, p), a) in out.iter_mut().zip(&k.params).zip(args) {
            *o = match p {
                KernelParamKind::Buffer(_) => KernelArg::Buffer {
                    ptr: DevicePtr::from_raw(a.value as usize as *const c_void),
                    min_bytes: a.extra,
                },
                KernelParamKind::Scalar(t) => {
                    let size = if t.is_bool() { 4 } else { t.bytes() };
                    KernelArg::Scalar {
                        bytes: a.value.to_le_bytes(),
                        size,
                    }
                }
            };
        }
        self.launcher
            .launch(device_id, &k.name, out, global, local)
            .map_err(|e| format!("launching kernel `{}`: {e}", k.name))
    }

    /// The `kiln-device/1` JSON that an exported library embeds as `__kiln_device_meta`.
    pub fn meta_json(kind: &str, source: &str, kernels: &[KernelInfo]) -> String {
        let ks: Vec<Value> = kernels
            .iter()
            .map(|k| {
                let ps: Vec<Value> = k
                    .params
                    .iter()
                    .map(|p| match p {
                        KernelParamKind::Buffer(t) => json!({"buffer": t.to_string()}),
                        KernelParamKind::Scalar(t) => json!({"scalar": t.to_string()}),
                    })
                    .collect();
                json!({"name": k.name, "params": ps})
            })
            .collect();
        json!({"format": "kiln-device/1", "kind": kind, "source": source, "kernels": ks})
            .to_string()
    }

    /// Reads `kiln-device/1` JSON: `(kind, source, kernels)`.
    ///
    /// # Errors
    /// Anything malformed, with what was expected.
    pub fn parse_meta(text: &str) -> Result<(String, String, Vec<KernelInfo>), String> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| format!("device metadata is not JSON: {e}"))?;
        if v.get("format").and_then(Value::as_str) != Some("kiln-device/1") {
            return Err(format!(
                "device metadata: expected format `kiln-device/1`, found {}",
                v.get("format").unwrap_or(&Value::Null)
            ));
        }
        let s = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| format!("device metadata: `{k}` must be a string"))
        };
        let (kind, source) = (s("kind")?, s("source")?);
        let mut kernels = Vec::new();
        for k in v
            .get("kernels")
            .and_then(Value::as_array)
            .ok_or("device metadata: `kernels` must be an array")?
        {
            let name = k
                .get("name")
                .and_then(Value::as_str)
                .ok_or("device metadata: a kernel has no `name`")?;
            let mut params = Vec::new();
            for p in k
                .get("params")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("device metadata: kernel `{name}` has no `params`"))?
            {
                let (is_buf, t) = match (p.get("buffer"), p.get("scalar")) {
                    (Some(t), None) => (true, t),
                    (None, Some(t)) => (false, t),
                    _ => return Err(format!("device metadata: kernel `{name}`: a parameter must be {{\"buffer\": T}} or {{\"scalar\": T}}, found {p}")),
                };
                let t = t
                    .as_str()
                    .and_then(DataType::parse)
                    .ok_or_else(|| format!("device metadata: kernel `{name}`: bad type {t}"))?;
                params.push(if is_buf {
                    KernelParamKind::Buffer(t)
                } else {
                    KernelParamKind::Scalar(t)
                });
            }
            kernels.push(KernelInfo {
                name: name.to_owned(),
                params,
            });
        }
        Ok((kind, source, kernels))
    }
}

/// Creates the device module of a loaded library from its metadata `(source, kernels)`.
pub type DeviceModuleLoader = fn(String, Vec<KernelInfo>) -> Result<DeviceModule, String>;

fn loaders() -> &'static RwLock<BTreeMap<String, DeviceModuleLoader>> {
    static L: OnceLock<RwLock<BTreeMap<String, DeviceModuleLoader>>> = OnceLock::new();
    L.get_or_init(|| {
        let mut m = BTreeMap::new();
        let opencl: DeviceModuleLoader = super::opencl::program::load_device_module;
        m.insert("opencl".to_owned(), opencl);
        RwLock::new(m)
    })
}

/// Registers how libraries with device code of `kind` get their device module.
pub fn register_device_module_loader(kind: &str, f: DeviceModuleLoader) {
    loaders()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(kind.to_owned(), f);
}

/// The device module described by `meta` (`kiln-device/1` JSON).
///
/// # Errors
/// Malformed metadata, or no loader for its kind.
pub fn load_device_module(meta: &str) -> Result<Arc<DeviceModule>, String> {
    let (kind, source, kernels) = DeviceModule::parse_meta(meta)?;
    let f = loaders()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&kind)
        .copied()
        .ok_or_else(|| format!("no device runtime for `{kind}` kernels in this kiln"))?;
    f(source, kernels).map(Arc::new)
}

/// The launch service generated host code reaches through the context slot
/// `__KilnDeviceLaunch`. Returns 0, or raises the error (tvm-ffi's error path) and returns -1.
///
/// # Safety
/// - `module` is NULL or a `DeviceModule` that outlives the call (the host code passes the
///   pointer kiln stored in its `__kiln_device_module` slot).
/// - `args` points to `nargs` readable `RawKernelArg`s.
pub unsafe extern "C" fn kiln_device_launch(
    module: *const c_void,
    kernel: i32,
    device_id: i32,
    args: *const RawKernelArg,
    nargs: i32,
    grid: *const i64,
    block: *const i64,
) -> i32 {
    let r = std::panic::catch_unwind(|| {
        if module.is_null() {
            return Err("this library launches device kernels but its device module is missing (the context slot `__kiln_device_module` is empty)".to_owned());
        }
        // SAFETY: the caller passes a live DeviceModule (see `# Safety`).
        let m = unsafe { &*(module as *const DeviceModule) };
        let n = usize::try_from(nargs).unwrap_or(0);
        let args = if n == 0 || args.is_null() {
            &[][..]
        } else {
            // SAFETY: `args` points to `nargs` RawKernelArgs (see `# Safety`).
            unsafe { std::slice::from_raw_parts(args, n) }
        };
        // SAFETY: generated code passes two arrays of 3 i64 extents.
        let (g, b) = unsafe {
            (
                [*grid, *grid.add(1), *grid.add(2)],
                [*block, *block.add(1), *block.add(2)],
            )
        };
        m.launch_raw(
            usize::try_from(kernel).unwrap_or(usize::MAX),
            device_id,
            args,
            g,
            b,
        )
    });
    let msg = match r {
        Ok(Ok(())) => return 0,
        Ok(Err(m)) => m,
        Err(_) => "kiln bug: a panic while launching a device kernel".to_owned(),
    };
    crate::packed_func::ffi::set_raised("RuntimeError", &msg);
    -1
}

/// Registers the launch service as a context slot (idempotent).
pub fn register_runtime_symbols() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let f: unsafe extern "C" fn(
            *const c_void,
            i32,
            i32,
            *const RawKernelArg,
            i32,
            *const i64,
            *const i64,
        ) -> i32 = kiln_device_launch;
        crate::packed_func::library::register_context_symbol("__KilnDeviceLaunch", f as usize);
    });
}
