//! [`OpenClDeviceApi`]: the `opencl` backend (DLPack's `kDLOpenCL` = 4) over any OpenCL 1.2+
//! driver, loaded at run time, and [`OpenClProgram`], the kernel launcher generated code uses.
//!
//! # Design
//!
//! - **Binding.** `sys.rs` opens `libOpenCL.so.1` (the Khronos ICD loader) with `libloading` and
//!   keeps a small typed table of the entry points used here. Nothing is linked at build time:
//!   kiln builds and runs without OpenCL, and then this backend has 0 devices. Devices are
//!   discovered on first use, not at registry initialization, so processes that never touch
//!   `opencl` never load a driver.
//! - **Devices.** One kiln device per OpenCL device, over every platform and device type (GPU,
//!   CPU, accelerator), in platform order; one `cl_context` per platform, shared by its devices.
//! - **Memory.** A [`DevicePtr`] is the `cl_mem` handle value, as in TVM's OpenCL runtime
//!   (`DLTensor::data` holds the `cl_mem`); it is a handle, not an address
//!   ([`DeviceMemoryApi::pointers_are_handles`]). Each device keeps a table of its live buffers
//!   (handle -> size): a foreign or freed pointer is [`DeviceError::UnknownPointer`] /
//!   [`DeviceError::DoubleFree`], and every copy and memset is checked against the size of the
//!   buffer its base pointer names before the driver sees it. Sizes above
//!   `CL_DEVICE_MAX_MEM_ALLOC_SIZE` are refused here ([`DeviceError::OutOfMemory`]), because
//!   some drivers (PoCL) accept huge buffers lazily.
//! - **Copies.** Host <-> device: non-blocking `clEnqueueWrite/ReadBuffer`; device -> device on
//!   one device: `clEnqueueCopyBuffer`. Between two OpenCL devices, and between OpenCL and any
//!   other backend, `raw_copy` answers `Unsupported` and the provided `copy_data_from_to`
//!   bounces through host memory. A strided layout that is one rectangle of up to three
//!   dimensions with a contiguous inner run is copied with `clEnqueue*BufferRect`; other strided
//!   host sides are packed through a compact buffer by the provided fallback.
//! - **Streams** are in-order command queues with profiling enabled; the default stream is one
//!   queue per device. Each stream remembers the event of the last command enqueued on it, so
//!   querying a stream never blocks and never enqueues. Sync is `clFinish`.
//! - **Events** are `cl_event`s of `clEnqueueMarkerWithWaitList`; waiting on one from another
//!   stream is `clEnqueueBarrierWithWaitList`; elapsed time compares the two markers'
//!   `CL_PROFILING_COMMAND_END`.
//! - **Host callbacks**: a marker whose `clSetEventCallback` runs the callback, then completes a
//!   user event that a barrier behind the marker waits for, so work queued after the callback
//!   starts only after it ran. The callback runs on a driver thread and must not block on
//!   OpenCL work (the OpenCL specification leaves blocking calls in callbacks undefined).
//! - **Errors** from the driver are [`DeviceError::Backend`] with the failed call and the error
//!   code's name (`clCreateBuffer failed with CL_OUT_OF_RESOURCES (-5)`), and become the thread's
//!   last error like every other failure.
//!
//! # Files
//!
//! - `mod.rs`: device discovery, the backend type, its [`DeviceApi`] impl (attributes).
//! - `memory.rs`: the buffer tables, the [`DeviceMemoryApi`] impl and the planning of
//!   rectangular copies.
//! - `stream.rs`: command queues as streams, markers as events: the [`DeviceStreamApi`] impl.
//! - `sys.rs`: the OpenCL C API, loaded at run time, and safe owned handles over it.
//! - `module.rs`: [`OpenClProgram`], an OpenCL C program built per device, and its kernel
//!   launches ([`load_kernels`] is the runtime's launcher factory).
//!
//! The `unsafe` code is in `sys.rs`; `memory.rs` only forwards the host-pointer contract of
//! `raw_copy` / `raw_copy_strided` to the enqueue calls, and reads a tensor's shape and strides.
//!
//! Without any OpenCL platform, `device_count()` is 0 and using `opencl:0` says that no platform
//! was found and how to install one ([`NO_PLATFORM_HELP`]).
//!
//! [`DevicePtr`]: super::DevicePtr
//! [`DeviceMemoryApi`]: super::DeviceMemoryApi
//! [`DeviceMemoryApi::pointers_are_handles`]: super::DeviceMemoryApi::pointers_are_handles
//! [`DeviceStreamApi`]: super::DeviceStreamApi

mod memory;
mod module;
mod stream;
mod sys;

use std::sync::{Arc, Mutex, OnceLock};

use super::api::{AttrKind, AttrValue, DeviceApi};
use super::device::{Device, DeviceType};
use super::error::{DeviceError, DeviceResult};
use super::stream::HandleTable;

pub use module::{load_kernels, KernelArg, OpenClProgram};
pub use sys::error_name;

use memory::MemTable;
use stream::ClStream;
use sys::device_info as info;

/// How to get an OpenCL platform, appended to the "no platform" error.
pub const NO_PLATFORM_HELP: &str = "install an OpenCL driver and the ICD loader, e.g. \
     `apt-get install pocl-opencl-icd ocl-icd-libopencl1` (PoCL runs OpenCL on the CPU)";

/// One OpenCL device.
struct ClDevice {
    id: sys::DeviceId,
    platform: String,
    context: Arc<sys::Context>,
    default_stream: Arc<ClStream>,
    max_alloc: u64,
    max_work_group: usize,
    max_work_items: Vec<usize>,
    mem: Mutex<MemTable>,
}

struct Runtime {
    devices: Vec<ClDevice>,
}

fn no_platform(why: &str) -> String {
    format!("no OpenCL platform was found ({why}); {NO_PLATFORM_HELP}")
}

fn discover() -> Result<Runtime, String> {
    let cl = sys::cl().map_err(|e| no_platform(&e))?;
    let platforms = match cl.platforms() {
        Ok(p) => p,
        Err(e) if e.code == sys::CL_PLATFORM_NOT_FOUND_KHR => Vec::new(),
        Err(e) => return Err(no_platform(&e.to_string())),
    };
    if platforms.is_empty() {
        return Err(no_platform(&format!(
            "{} lists no platform: no OpenCL driver (ICD) is installed",
            cl.path
        )));
    }
    let mut devices = Vec::new();
    let mut skipped = Vec::new();
    for p in &platforms {
        let pname = p.name().unwrap_or_else(|_| "unnamed platform".to_owned());
        let ids = match p.devices() {
            Ok(ids) if !ids.is_empty() => ids,
            Ok(_) => continue,
            Err(e) => {
                log::warn!("OpenCL platform `{pname}`: {e}; skipped");
                skipped.push(format!("{pname}: {e}"));
                continue;
            }
        };
        let context = match sys::Context::new(&ids) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                log::warn!("OpenCL platform `{pname}`: {e}; skipped");
                skipped.push(format!("{pname}: {e}"));
                continue;
            }
        };
        for id in ids {
            let queue = match context.queue(id) {
                Ok(q) => q,
                Err(e) => {
                    log::warn!("an OpenCL device of `{pname}`: {e}; skipped");
                    skipped.push(format!("{pname}: {e}"));
                    continue;
                }
            };
            let index = devices.len() as i32;
            devices.push(ClDevice {
                id,
                platform: pname.clone(),
                context: context.clone(),
                default_stream: Arc::new(ClStream::new(index, queue)),
                max_alloc: id.ulong(info::MAX_MEM_ALLOC_SIZE).unwrap_or(0),
                max_work_group: id.size(info::MAX_WORK_GROUP_SIZE).unwrap_or(1),
                max_work_items: id.sizes(info::MAX_WORK_ITEM_SIZES).unwrap_or_default(),
                mem: Mutex::new(MemTable::default()),
            });
        }
    }
    if devices.is_empty() {
        return Err(no_platform(&format!(
            "{} platform(s), none with a usable device{}",
            platforms.len(),
            if skipped.is_empty() {
                String::new()
            } else {
                format!(": {}", skipped.join("; "))
            }
        )));
    }
    Ok(Runtime { devices })
}

/// The OpenCL backend; see the module docs. Use [`global`] (or the registry's `opencl`).
pub struct OpenClDeviceApi {
    runtime: OnceLock<Result<Runtime, String>>,
    streams: Mutex<HandleTable<Arc<ClStream>>>,
    events: Mutex<HandleTable<(i32, Option<sys::Event>)>>,
}

impl std::fmt::Debug for OpenClDeviceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClDeviceApi")
            .field("devices", &self.device_count().unwrap_or(0))
            .finish()
    }
}

/// The process's OpenCL backend (the one registered as `opencl`), with or without devices.
pub(crate) fn instance() -> Arc<OpenClDeviceApi> {
    static API: OnceLock<Arc<OpenClDeviceApi>> = OnceLock::new();
    API.get_or_init(|| {
        Arc::new(OpenClDeviceApi {
            runtime: OnceLock::new(),
            streams: Mutex::new(HandleTable::new()),
            events: Mutex::new(HandleTable::new()),
        })
    })
    .clone()
}

/// The process's OpenCL backend, the one registered as `opencl` (for kernel launchers).
///
/// # Errors
/// [`DeviceError::InvalidDevice`] for `opencl:0` when no OpenCL platform is available: the
/// message says why and how to install one.
pub fn global() -> DeviceResult<Arc<OpenClDeviceApi>> {
    let api = instance();
    match api.runtime() {
        Ok(_) => Ok(api),
        Err(msg) => Err(DeviceError::InvalidDevice {
            device: Device::new(DeviceType::OPENCL, 0),
            reason: msg.clone(),
        }),
    }
}

fn driver(dev: Device, e: sys::ClError) -> DeviceError {
    DeviceError::Backend {
        device: dev,
        message: e.to_string(),
    }
}

impl OpenClDeviceApi {
    fn runtime(&self) -> Result<&Runtime, &String> {
        self.runtime.get_or_init(discover).as_ref()
    }

    /// A device [`DeviceApi::check_device`] accepted.
    fn dev(&self, dev: Device) -> DeviceResult<&ClDevice> {
        self.runtime()
            .ok()
            .and_then(|r| r.devices.get(usize::try_from(dev.device_id).ok()?))
            .ok_or_else(|| DeviceError::InvalidDevice {
                device: dev,
                reason: "not an OpenCL device of this process".to_owned(),
            })
    }

    /// The OpenCL platform name of `dev` (`"Portable Computing Language"`).
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`].
    pub fn platform_name(&self, dev: Device) -> DeviceResult<String> {
        self.check_device(dev)?;
        Ok(self.dev(dev)?.platform.clone())
    }

    /// The largest buffer `dev` can allocate (`CL_DEVICE_MAX_MEM_ALLOC_SIZE`); larger requests
    /// are [`DeviceError::OutOfMemory`] without calling the driver.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`].
    pub fn max_alloc_size(&self, dev: Device) -> DeviceResult<u64> {
        self.check_device(dev)?;
        Ok(self.dev(dev)?.max_alloc)
    }
}

/// `"OpenCL C 1.2 pocl"` -> `"1.2"`.
fn version_number(s: &str) -> Option<String> {
    s.split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .map(str::to_owned)
}

impl DeviceApi for OpenClDeviceApi {
    fn name(&self) -> &str {
        "opencl"
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::OPENCL
    }

    fn device_count(&self) -> DeviceResult<usize> {
        Ok(self.runtime().map_or(0, |r| r.devices.len()))
    }

    fn check_device(&self, dev: Device) -> DeviceResult<()> {
        let found = self.runtime().map(|r| r.devices.len());
        super::api::check_discovered(dev, "opencl", DeviceType::OPENCL, found)
    }

    fn raw_attr(&self, dev: Device, kind: AttrKind) -> DeviceResult<Option<AttrValue>> {
        let d = self.dev(dev)?;
        let id = d.id;
        let int = |v: Option<u64>| v.map(|v| AttrValue::Int(i64::try_from(v).unwrap_or(i64::MAX)));
        let extensions = || id.string(info::EXTENSIONS).unwrap_or_default();
        Ok(match kind {
            AttrKind::EXIST => Some(AttrValue::Int(1)),
            AttrKind::MAX_THREADS_PER_BLOCK => int(Some(d.max_work_group as u64)),
            AttrKind::WARP_SIZE => {
                let ext = extensions();
                let w = if ext.contains("cl_nv_device_attribute_query") {
                    id.uint(info::WARP_SIZE_NV).ok()
                } else if ext.contains("cl_amd_device_attribute_query") {
                    id.uint(info::WAVEFRONT_WIDTH_AMD).ok()
                } else {
                    None
                };
                int(Some(u64::from(w.unwrap_or(1))))
            }
            AttrKind::MAX_SHARED_MEMORY_PER_BLOCK => int(id.ulong(info::LOCAL_MEM_SIZE).ok()),
            AttrKind::COMPUTE_VERSION => id
                .string(info::OPENCL_C_VERSION)
                .ok()
                .and_then(|s| version_number(&s))
                .map(AttrValue::Str),
            AttrKind::DEVICE_NAME => id.string(info::NAME).ok().map(AttrValue::Str),
            AttrKind::MAX_CLOCK_RATE => int(id
                .uint(info::MAX_CLOCK_FREQUENCY)
                .ok()
                .map(|mhz| u64::from(mhz) * 1000)),
            AttrKind::MULTI_PROCESSOR_COUNT => {
                int(id.uint(info::MAX_COMPUTE_UNITS).ok().map(u64::from))
            }
            AttrKind::MAX_THREAD_DIMENSIONS => {
                let v: Vec<String> = d.max_work_items.iter().map(ToString::to_string).collect();
                (!v.is_empty()).then(|| AttrValue::Str(format!("[{}]", v.join(", "))))
            }
            AttrKind::MAX_REGISTERS_PER_BLOCK => {
                if extensions().contains("cl_nv_device_attribute_query") {
                    int(id.uint(info::REGISTERS_PER_BLOCK_NV).ok().map(u64::from))
                } else {
                    None
                }
            }
            // TVM's `CL_TARGET_OPENCL_VERSION` convention: 3.0 is 300, 1.2 is 120.
            AttrKind::API_VERSION => int(id
                .string(info::VERSION)
                .ok()
                .and_then(|s| version_number(&s))
                .and_then(|v| {
                    let (major, minor) = v.split_once('.')?;
                    let minor = minor.chars().next()?.to_digit(10)?;
                    Some(major.parse::<u64>().ok()? * 100 + u64::from(minor) * 10)
                })),
            AttrKind::DRIVER_VERSION => id.string(info::DRIVER_VERSION).ok().map(AttrValue::Str),
            AttrKind::L2_CACHE_SIZE_BYTES => int(id
                .ulong(info::GLOBAL_MEM_CACHE_SIZE)
                .ok()
                .filter(|&v| v > 0)),
            AttrKind::TOTAL_GLOBAL_MEMORY => int(id.ulong(info::GLOBAL_MEM_SIZE).ok()),
            AttrKind::IMAGE_PITCH_ALIGNMENT => int(id
                .uint(info::IMAGE_PITCH_ALIGNMENT)
                .ok()
                .filter(|&v| v > 0)
                .map(u64::from)),
            // No portable query: GCN arch is AMD's, free memory is not in OpenCL 1.2.
            _ => None,
        })
    }
}
