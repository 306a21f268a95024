//! [`CudaDeviceApi`]: the `cuda` backend (DLPack's `kDLCUDA` = 2) over the NVIDIA driver API,
//! loaded at run time, and [`CudaModule`], the launcher of PTX kernels generated code uses.
//!
//! # Design
//!
//! - **Binding.** `sys.rs` opens `libcuda.so.1` (or the file named by `KILN_CUDA_DRIVER`, which
//!   kiln's tests point at a mock driver) with `libloading` and keeps a typed table of the driver
//!   entry points used here. Nothing is linked at build time and no CUDA toolkit is needed:
//!   without a driver kiln builds and runs, and this backend has 0 devices. Only the driver API
//!   is used (no `libcudart`). Devices are discovered on first use, not at registry
//!   initialization, so processes that never touch `cuda` never load the driver.
//! - **Devices and contexts.** kiln device `cuda:N` is CUDA device ordinal `N`, as in PyTorch
//!   and DLPack. Each device's *primary context* (the one the CUDA runtime, PyTorch and cuBLAS
//!   share) is retained once, at discovery, and made current on the calling thread before every
//!   driver call (a thread that never called CUDA has no current context; cupy/cupy#72), so
//!   kiln works from any thread and interoperates with other CUDA libraries.
//! - **Faults.** A *sticky* error (`CUDA_ERROR_ILLEGAL_ADDRESS` (700) from a faulting kernel,
//!   a launch timeout, a device-side assert, ...) corrupts the context: every later call in it
//!   fails, and only a new process recovers. The first call that returns one marks the device
//!   faulted; every later operation on that device fails at once with the first error, before
//!   the driver is asked (never a hang on a dead context). Other devices are unaffected.
//! - **Memory.** A [`DevicePtr`] is the device address (`CUdeviceptr`), as in TVM's CUDA
//!   runtime (`DLTensor::data` holds the address); it is not host-accessible. Each device keeps
//!   a table of its live allocations (address -> size): a foreign or freed pointer is
//!   [`DeviceError::UnknownPointer`] / [`DeviceError::DoubleFree`], and every copy, memset and
//!   kernel buffer argument is checked against the size of the allocation before the driver
//!   sees it. `cuMemAlloc` aligns to 256 bytes; a larger alignment is honoured by
//!   over-allocating. `CUDA_ERROR_OUT_OF_MEMORY` is [`DeviceError::OutOfMemory`].
//! - **Copies.** Host <-> device: `cuMemcpy{HtoD,DtoH}Async` on the given stream; device ->
//!   device on one device: `cuMemcpyDtoDAsync`; between two CUDA devices: `cuMemcpyPeerAsync`
//!   (the driver stages through the host without peer access). Strided host layouts are packed
//!   or unpacked through a compact host buffer by the provided fallback; copies to and from
//!   other non-CPU backends bounce through host memory.
//! - **Streams** are `cuStreamCreate(CU_STREAM_NON_BLOCKING)` streams (as TVM's); the default
//!   stream ([`StreamHandle::DEFAULT`]) is each device's legacy `NULL` stream. The current
//!   stream is the trait's per-thread, per-device one; [`CudaDeviceApi::cu_stream`] gives the
//!   `CUstream` of a handle for other CUDA libraries. Sync is `cuStreamSynchronize`; a query is
//!   `cuStreamQuery` (`CUDA_ERROR_NOT_READY` (600) = not done).
//! - **Events** are `cuEvent`s with timing; a stream waits for one with `cuStreamWaitEvent`;
//!   elapsed time is `cuEventElapsedTime`.
//! - **Host callbacks** are `cuLaunchHostFunc`: the callback runs on a driver thread after the
//!   work before it, and work queued after it waits for it. It must not call CUDA (nor kiln
//!   operations on CUDA devices): the driver forbids API calls in host functions.
//! - **Errors** from the driver are [`DeviceError::Backend`] with the failed call, the
//!   `CUresult`'s name and the driver's text (`cuMemAlloc failed with CUDA_ERROR_OUT_OF_MEMORY
//!   (2): out of memory`), and become the thread's last error like every other failure.
//!
//! # Files
//!
//! - `mod.rs`: device discovery, primary contexts and faults, the backend type and its
//!   [`DeviceApi`] impl (attributes).
//! - `memory.rs`: the allocation tables and the [`DeviceMemoryApi`] impl.
//! - `stream.rs`: streams, events and host callbacks: the [`DeviceStreamApi`] impl.
//! - `sys.rs`: the driver API, loaded at run time, and owned handles over it.
//! - `module.rs`: [`CudaModule`], PTX loaded lazily per device, and its checked kernel launches
//!   ([`load_kernels`] is the runtime's launcher factory for kind `cuda`).
//!
//! The `unsafe` code is in `sys.rs`; `memory.rs` hands device and host ranges to the driver's
//! copy and memset calls after checking them against the allocation table, and `module.rs`
//! hands kernel parameters to `cuLaunchKernel` after checking them against the kernel table.
//!
//! Without a driver, `device_count()` is 0 and using `cuda:0` says why: *no CUDA driver:
//! libcuda.so.1 could not be loaded (...)*, with how to get one ([`NO_DRIVER_HELP`]); with a
//! driver but no device, *no CUDA device: cuInit failed with CUDA_ERROR_NO_DEVICE (100): ...*.
//!
//! [`DevicePtr`]: super::DevicePtr
//! [`StreamHandle::DEFAULT`]: super::StreamHandle::DEFAULT
//! [`DeviceMemoryApi`]: super::DeviceMemoryApi
//! [`DeviceStreamApi`]: super::DeviceStreamApi

mod memory;
mod module;
mod stream;
mod sys;

use std::sync::{Arc, Mutex, OnceLock};

use super::api::{AttrKind, AttrValue, DeviceApi};
use super::device::{Device, DeviceType};
use super::error::{DeviceError, DeviceResult};
use super::stream::{HandleTable, StreamHandle};

pub use module::{load_kernels, CudaModule, KernelArg};
pub use sys::{error_name, DRIVER_ENV};

use memory::MemTable;
use stream::{CuEvent, CuStream};
use sys::device_attr as attr;

/// How to get a CUDA driver, appended to the "no CUDA driver" error.
pub const NO_DRIVER_HELP: &str = "install the NVIDIA driver (it provides libcuda.so.1), or set \
     KILN_CUDA_DRIVER to the path of the driver library";

/// The launch limits of a device, read once at discovery.
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_threads_per_block: u64,
    max_block: [u64; 3],
    max_grid: [u64; 3],
    /// Shared memory per block without opting in (48 KiB).
    shared_per_block: u64,
    /// The most a block may opt in to.
    shared_per_block_optin: u64,
}

/// One CUDA device.
struct CuDevice {
    id: sys::DeviceId,
    /// The retained primary context, or why it could not be retained.
    ctx: Result<sys::Context, String>,
    limits: Limits,
    default_stream: Arc<CuStream>,
    /// The first sticky error of this device's context: set once, never cleared.
    fault: OnceLock<String>,
    mem: Mutex<MemTable>,
}

struct Runtime {
    drv: &'static sys::Driver,
    version: i32,
    devices: Vec<CuDevice>,
}

fn no_driver(why: &str) -> String {
    format!("no CUDA driver: {why}; {NO_DRIVER_HELP}")
}

fn discover() -> Result<Runtime, String> {
    let drv = sys::driver().map_err(|e| no_driver(&e))?;
    drv.init()
        .map_err(|e| format!("no CUDA device: {e} (driver {})", drv.path))?;
    let version = drv.version().unwrap_or(0);
    let count = drv
        .device_count()
        .map_err(|e| format!("no CUDA device: {e} (driver {})", drv.path))?;
    if count <= 0 {
        return Err(format!(
            "no CUDA device: the driver ({}, CUDA {}) reports 0 devices",
            drv.path,
            version_string(version)
        ));
    }
    let mut devices = Vec::new();
    for ordinal in 0..count {
        let id = drv
            .device(ordinal)
            .map_err(|e| format!("CUDA device {ordinal}: {e}"))?;
        let a = |k: i32| {
            drv.device_attribute(id, k)
                .ok()
                .and_then(|v| u64::try_from(v).ok())
                .unwrap_or(0)
        };
        let limits = Limits {
            max_threads_per_block: a(attr::MAX_THREADS_PER_BLOCK),
            max_block: [
                a(attr::MAX_BLOCK_DIM_X),
                a(attr::MAX_BLOCK_DIM_Y),
                a(attr::MAX_BLOCK_DIM_Z),
            ],
            max_grid: [
                a(attr::MAX_GRID_DIM_X),
                a(attr::MAX_GRID_DIM_Y),
                a(attr::MAX_GRID_DIM_Z),
            ],
            shared_per_block: a(attr::MAX_SHARED_MEMORY_PER_BLOCK),
            shared_per_block_optin: a(attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
                .max(a(attr::MAX_SHARED_MEMORY_PER_BLOCK)),
        };
        // Ids stay CUDA ordinals: a device whose context cannot be retained stays in the list
        // and reports why on every use.
        let ctx = drv.retain_primary_context(id).map_err(|e| e.to_string());
        if let Err(e) = &ctx {
            log::warn!("CUDA device {ordinal}: {e}");
        }
        devices.push(CuDevice {
            id,
            ctx,
            limits,
            default_stream: Arc::new(CuStream::new(ordinal, sys::Stream::legacy())),
            fault: OnceLock::new(),
            mem: Mutex::new(MemTable::default()),
        });
    }
    Ok(Runtime {
        drv,
        version,
        devices,
    })
}

/// `12040` -> `"12.4"`.
fn version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The CUDA backend; see the module docs. Use [`global`] (or the registry's `cuda`).
pub struct CudaDeviceApi {
    runtime: OnceLock<Result<Runtime, String>>,
    streams: Mutex<HandleTable<Arc<CuStream>>>,
    events: Mutex<HandleTable<Arc<CuEvent>>>,
}

impl std::fmt::Debug for CudaDeviceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDeviceApi")
            .field("devices", &self.device_count().unwrap_or(0))
            .finish()
    }
}

/// The process's CUDA backend (the one registered as `cuda`), with or without devices.
pub(crate) fn instance() -> Arc<CudaDeviceApi> {
    static API: OnceLock<Arc<CudaDeviceApi>> = OnceLock::new();
    API.get_or_init(|| {
        Arc::new(CudaDeviceApi {
            runtime: OnceLock::new(),
            streams: Mutex::new(HandleTable::new()),
            events: Mutex::new(HandleTable::new()),
        })
    })
    .clone()
}

/// The process's CUDA backend, the one registered as `cuda` (for kernel launchers).
///
/// # Errors
/// [`DeviceError::InvalidDevice`] for `cuda:0` when no CUDA device is available: the message
/// says why (no driver, or a driver without a device).
pub fn global() -> DeviceResult<Arc<CudaDeviceApi>> {
    let api = instance();
    match api.runtime() {
        Ok(_) => Ok(api),
        Err(msg) => Err(DeviceError::InvalidDevice {
            device: Device::new(DeviceType::CUDA, 0),
            reason: msg.clone(),
        }),
    }
}

fn driver(dev: Device, e: &sys::CuError) -> DeviceError {
    DeviceError::Backend {
        device: dev,
        message: e.to_string(),
    }
}

impl CuDevice {
    /// Runs `f`, which makes driver calls for this device: fails at once when the device
    /// faulted earlier, makes its primary context current on this thread first, and remembers
    /// a sticky error `f` returns.
    fn call<T>(&self, dev: Device, f: impl FnOnce() -> sys::CuResult<T>) -> DeviceResult<T> {
        self.check_fault(dev)?;
        let ctx = self.ctx.as_ref().map_err(|e| DeviceError::Backend {
            device: dev,
            message: e.clone(),
        })?;
        ctx.make_current()
            .and_then(|()| f())
            .map_err(|e| self.failed(dev, &e))
    }

    /// Fails when the device faulted earlier.
    fn check_fault(&self, dev: Device) -> DeviceResult<()> {
        match self.fault.get() {
            None => Ok(()),
            Some(first) => Err(DeviceError::Backend {
                device: dev,
                message: format!(
                    "the device's CUDA context is unusable after an earlier error ({first}); \
                     restart the process to use {dev} again"
                ),
            }),
        }
    }

    /// The error of a failed call, after remembering it if it is sticky.
    fn failed(&self, dev: Device, e: &sys::CuError) -> DeviceError {
        if e.is_sticky() {
            let first = self.fault.get_or_init(|| e.to_string());
            log::error!("{dev}: {first}; the device's CUDA context is unusable from now on");
            return DeviceError::Backend {
                device: dev,
                message: format!(
                    "{e}; the device's CUDA context is unusable from now on (a kernel faulted \
                     or the device failed): restart the process to use {dev} again"
                ),
            };
        }
        driver(dev, e)
    }

    fn context(&self, dev: Device) -> DeviceResult<&sys::Context> {
        self.ctx.as_ref().map_err(|e| DeviceError::Backend {
            device: dev,
            message: e.clone(),
        })
    }
}

impl CudaDeviceApi {
    fn runtime(&self) -> Result<&Runtime, &String> {
        self.runtime.get_or_init(discover).as_ref()
    }

    /// A device [`DeviceApi::check_device`] accepted.
    fn dev(&self, dev: Device) -> DeviceResult<&CuDevice> {
        self.runtime()
            .ok()
            .and_then(|r| r.devices.get(usize::try_from(dev.device_id).ok()?))
            .ok_or_else(|| DeviceError::InvalidDevice {
                device: dev,
                reason: "not a CUDA device of this process".to_owned(),
            })
    }

    /// The driver (after a successful discovery).
    fn drv(&self, dev: Device) -> DeviceResult<&'static sys::Driver> {
        self.runtime()
            .map(|r| r.drv)
            .map_err(|msg| DeviceError::InvalidDevice {
                device: dev,
                reason: msg.clone(),
            })
    }

    /// The driver library in use (`libcuda.so.1`, or `KILN_CUDA_DRIVER`).
    ///
    /// # Errors
    /// Why no driver is available.
    pub fn driver_path(&self) -> Result<String, String> {
        self.runtime()
            .map(|r| r.drv.path.clone())
            .map_err(Clone::clone)
    }

    /// The CUDA version of the driver (`cuDriverGetVersion`: 12040 for 12.4).
    ///
    /// # Errors
    /// Why no driver is available.
    pub fn driver_version(&self) -> Result<i32, String> {
        self.runtime().map(|r| r.version).map_err(Clone::clone)
    }

    /// The `CUstream` of `stream` on `dev` (0 for the default, legacy stream), for handing kiln's
    /// streams to other CUDA libraries. The value stays valid until the stream is freed.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`], [`DeviceError::InvalidStream`].
    pub fn cu_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<usize> {
        self.check_device(dev)?;
        Ok(self.stream(dev, stream)?.stream.raw())
    }

    /// The first sticky error of `dev`'s context, if it faulted (see the module docs): every
    /// operation on the device fails from then on.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`].
    pub fn fault(&self, dev: Device) -> DeviceResult<Option<String>> {
        self.check_device(dev)?;
        Ok(self.dev(dev)?.fault.get().cloned())
    }
}

impl DeviceApi for CudaDeviceApi {
    fn name(&self) -> &str {
        "cuda"
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::CUDA
    }

    fn device_count(&self) -> DeviceResult<usize> {
        Ok(self.runtime().map_or(0, |r| r.devices.len()))
    }

    fn check_device(&self, dev: Device) -> DeviceResult<()> {
        let found = self.runtime().map(|r| r.devices.len());
        super::api::check_discovered(dev, "cuda", DeviceType::CUDA, found)
    }

    /// Makes `dev`'s primary context current on this thread (TVM's `cudaSetDevice`).
    fn raw_set_device(&self, dev: Device) -> DeviceResult<()> {
        self.dev(dev)?.call(dev, || Ok(()))
    }

    fn raw_attr(&self, dev: Device, kind: AttrKind) -> DeviceResult<Option<AttrValue>> {
        let d = self.dev(dev)?;
        let drv = self.drv(dev)?;
        d.check_fault(dev)?;
        let int = |v: u64| Some(AttrValue::Int(i64::try_from(v).unwrap_or(i64::MAX)));
        let get = |k: i32| -> DeviceResult<i64> {
            drv.device_attribute(d.id, k)
                .map(i64::from)
                .map_err(|e| d.failed(dev, &e))
        };
        let l = &d.limits;
        Ok(match kind {
            AttrKind::EXIST => Some(AttrValue::Int(1)),
            AttrKind::MAX_THREADS_PER_BLOCK => int(l.max_threads_per_block),
            AttrKind::WARP_SIZE => Some(AttrValue::Int(get(attr::WARP_SIZE)?)),
            AttrKind::MAX_SHARED_MEMORY_PER_BLOCK => int(l.shared_per_block),
            AttrKind::COMPUTE_VERSION => {
                let major = get(attr::COMPUTE_CAPABILITY_MAJOR)?;
                let minor = get(attr::COMPUTE_CAPABILITY_MINOR)?;
                Some(AttrValue::Str(format!("{major}.{minor}")))
            }
            AttrKind::DEVICE_NAME => Some(AttrValue::Str(
                drv.device_name(d.id).map_err(|e| d.failed(dev, &e))?,
            )),
            AttrKind::MAX_CLOCK_RATE => Some(AttrValue::Int(get(attr::CLOCK_RATE)?)),
            AttrKind::MULTI_PROCESSOR_COUNT => {
                Some(AttrValue::Int(get(attr::MULTIPROCESSOR_COUNT)?))
            }
            AttrKind::MAX_THREAD_DIMENSIONS => Some(AttrValue::Str(format!(
                "[{}, {}, {}]",
                l.max_block[0], l.max_block[1], l.max_block[2]
            ))),
            AttrKind::MAX_REGISTERS_PER_BLOCK => {
                Some(AttrValue::Int(get(attr::MAX_REGISTERS_PER_BLOCK)?))
            }
            // TVM's `CUDA_VERSION` convention (12040 for 12.4), from the driver in use.
            AttrKind::API_VERSION => Some(AttrValue::Int(i64::from(
                self.driver_version().unwrap_or(0),
            ))),
            AttrKind::DRIVER_VERSION => Some(AttrValue::Str(version_string(
                self.driver_version().unwrap_or(0),
            ))),
            AttrKind::L2_CACHE_SIZE_BYTES => Some(AttrValue::Int(get(attr::L2_CACHE_SIZE)?)),
            AttrKind::TOTAL_GLOBAL_MEMORY => {
                int(drv.device_total_mem(d.id).map_err(|e| d.failed(dev, &e))?)
            }
            AttrKind::AVAILABLE_GLOBAL_MEMORY => {
                let (free, _) = d.call(dev, || drv.mem_get_info())?;
                int(free)
            }
            // AMD's; and CUDA has no image pitch in kiln's sense.
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn driver_versions_read_as_major_dot_minor() {
        assert_eq!(super::version_string(12040), "12.4");
        assert_eq!(super::version_string(13000), "13.0");
        assert_eq!(super::version_string(11080), "11.8");
    }
}
