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
//! The `unsafe` code is in `sys.rs`; this file only forwards the host-pointer contract of
//! `raw_copy` / `raw_copy_strided` to the enqueue calls, and reads a tensor's shape and strides.
//!
//! Without any OpenCL platform, `device_count()` is 0 and using `opencl:0` says that no platform
//! was found and how to install one ([`NO_PLATFORM_HELP`]).

pub mod program;
mod sys;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::api::{shape_of, strides_of, AttrKind, AttrValue, DeviceApi};
use super::device::{Device, DeviceType};
use super::error::{DeviceError, DeviceResult};
use super::memory::{DeviceMemoryApi, DevicePtr, HostCallback, MemRegion, MemoryStats};
use super::stream::{DeviceStreamApi, EventHandle, HandleTable, StreamHandle};
use crate::packed_func::ffi::{DLDataType, DLTensor};

pub use program::{KernelArg, OpenClProgram};
pub use sys::error_name;

use sys::device_info as info;

/// How to get an OpenCL platform, appended to the "no platform" error.
pub const NO_PLATFORM_HELP: &str = "install an OpenCL driver and the ICD loader, e.g. \
     `apt-get install pocl-opencl-icd ocl-icd-libopencl1` (PoCL runs OpenCL on the CPU)";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the tables consistent, so a poisoned lock is usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The live buffers of one device.
#[derive(Default)]
struct MemTable {
    /// `cl_mem` value -> (buffer, size in bytes). A user of a buffer (a copy, a launch until
    /// its command is enqueued) holds a clone of the `Arc`, so a free by another thread
    /// meanwhile cannot release the `cl_mem` under it; cloning is an atomic increment, not a
    /// `clRetainMemObject` (a driver call that takes the buffer's lock, which the driver's
    /// worker threads contend for).
    live: HashMap<usize, (Arc<sys::Mem>, u64), foldhash::fast::RandomState>,
    /// Handles freed and not handed out again since.
    freed: HashSet<usize, foldhash::fast::RandomState>,
    in_use: u64,
    peak: u64,
}

/// A command queue and the event of the last command enqueued on it.
pub(crate) struct ClStream {
    device: i32,
    queue: sys::Queue,
    last: Mutex<Option<sys::Event>>,
}

impl ClStream {
    fn new(device: i32, queue: sys::Queue) -> Self {
        Self {
            device,
            queue,
            last: Mutex::new(None),
        }
    }

    /// Enqueues through `f`, which returns the command's event, and remembers it.
    fn enqueue(
        &self,
        f: impl FnOnce(&sys::Queue) -> sys::ClResult<sys::Event>,
    ) -> sys::ClResult<()> {
        let mut last = lock(&self.last);
        let ev = f(&self.queue)?;
        *last = Some(ev);
        Ok(())
    }
}

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

fn to_usize(v: u64) -> Option<usize> {
    usize::try_from(v).ok()
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

    /// The stream `s` of `dev` (the device's default queue for [`StreamHandle::DEFAULT`]).
    pub(crate) fn stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<Arc<ClStream>> {
        if s.is_default() {
            return Ok(self.dev(dev)?.default_stream.clone());
        }
        match lock(&self.streams).get(s.to_raw()) {
            Some(st) if st.device == dev.device_id => Ok(st.clone()),
            _ => Err(DeviceError::InvalidStream {
                device: dev,
                handle: s.to_raw(),
            }),
        }
    }

    /// The live buffer `ptr` of `dev`, checked to hold `offset + nbytes` bytes.
    fn buffer(
        &self,
        op: &'static str,
        dev: Device,
        ptr: DevicePtr,
        offset: u64,
        nbytes: u64,
    ) -> DeviceResult<Arc<sys::Mem>> {
        let d = self.dev(dev)?;
        let mem = lock(&d.mem);
        let oob = |allocation| DeviceError::OutOfBounds {
            op,
            device: dev,
            ptr,
            offset,
            nbytes,
            allocation,
        };
        let (buf, size) = mem.live.get(&ptr.0).ok_or_else(|| oob(None))?;
        if offset.checked_add(nbytes).is_none_or(|end| end > *size) {
            return Err(oob(Some(*size)));
        }
        Ok(buf.clone())
    }

    /// The live buffer `ptr` of `dev` for a kernel argument, with its size.
    pub(crate) fn kernel_buffer(
        &self,
        dev: Device,
        ptr: DevicePtr,
    ) -> Option<(Arc<sys::Mem>, u64)> {
        let d = self.dev(dev).ok()?;
        let mem = lock(&d.mem);
        mem.live.get(&ptr.0).map(|(b, s)| (b.clone(), *s))
    }

    fn event(&self, dev: Device, e: EventHandle) -> DeviceResult<Option<sys::Event>> {
        match lock(&self.events).get(e.to_raw()) {
            Some((d, ev)) if *d == dev.device_id => Ok(ev.clone()),
            _ => Err(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            }),
        }
    }
}

/// A strided copy as one rectangle of up to 3 dimensions (`clEnqueue*BufferRect`).
#[derive(Debug, PartialEq, Eq)]
struct RectPlan {
    /// Bytes per row, rows, slices.
    region: [usize; 3],
    from: sys::Rect,
    to: sys::Rect,
    /// Bytes from each side's base + byte offset to one past its last byte.
    from_span: u64,
    to_span: u64,
}

/// Plans a copy of `shape` between two layouts (strides in elements, `None` = compact), or `None`
/// when no rectangle describes it: negative strides, a non-contiguous inner run, more than three
/// dimensions after merging, or pitches OpenCL refuses.
fn plan_rect(
    shape: &[i64],
    fs: Option<&[i64]>,
    ts: Option<&[i64]>,
    elem: usize,
    foff: u64,
    toff: u64,
) -> Option<RectPlan> {
    let compact = |shape: &[i64]| -> Vec<i64> {
        let mut st = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            st[i] = st[i + 1].saturating_mul(shape[i + 1]);
        }
        st
    };
    let fs = fs.map_or_else(|| compact(shape), <[i64]>::to_vec);
    let ts = ts.map_or_else(|| compact(shape), <[i64]>::to_vec);
    // (extent, from stride, to stride), innermost first, extents of 1 dropped, mergeable
    // neighbours merged.
    let mut dims: Vec<(usize, usize, usize)> = Vec::new();
    for i in (0..shape.len()).rev() {
        let n = usize::try_from(shape[i]).ok()?;
        if n == 1 {
            continue;
        }
        let (f, t) = (usize::try_from(fs[i]).ok()?, usize::try_from(ts[i]).ok()?);
        match dims.last_mut() {
            Some(top) if top.1.checked_mul(top.0)? == f && top.2.checked_mul(top.0)? == t => {
                top.0 = top.0.checked_mul(n)?;
            }
            _ => dims.push((n, f, t)),
        }
    }
    if dims.is_empty() {
        dims.push((1, 1, 1));
    }
    if dims.len() > 3 || dims[0].1 != 1 || dims[0].2 != 1 {
        return None;
    }
    let get = |k: usize| dims.get(k).copied();
    let region = [
        dims[0].0.checked_mul(elem)?,
        get(1).map_or(1, |d| d.0),
        get(2).map_or(1, |d| d.0),
    ];
    let side = |pick: fn(&(usize, usize, usize)) -> usize, off: u64| -> Option<(sys::Rect, u64)> {
        let row = match get(1) {
            Some(d) => pick(&d).checked_mul(elem)?,
            None => region[0],
        };
        let slice = match get(2) {
            Some(d) => pick(&d).checked_mul(elem)?,
            None => row.checked_mul(region[1])?,
        };
        if row < region[0] || slice < row.checked_mul(region[1])? || slice % row != 0 {
            return None;
        }
        let span = (region[2] - 1)
            .checked_mul(slice)?
            .checked_add((region[1] - 1).checked_mul(row)?)?
            .checked_add(region[0])?;
        let rect = sys::Rect {
            origin: [usize::try_from(off).ok()?, 0, 0],
            row_pitch: row,
            slice_pitch: slice,
        };
        Some((rect, span as u64))
    };
    let (from, from_span) = side(|d| d.1, foff)?;
    let (to, to_span) = side(|d| d.2, toff)?;
    Some(RectPlan {
        region,
        from,
        to,
        from_span,
        to_span,
    })
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
        if dev.device_type != DeviceType::OPENCL {
            return Err(DeviceError::InvalidDevice {
                device: dev,
                reason: format!(
                    "backend `opencl` serves device type opencl ({})",
                    DeviceType::OPENCL.0
                ),
            });
        }
        let count = match self.runtime() {
            Ok(r) => r.devices.len(),
            Err(msg) => {
                return Err(DeviceError::InvalidDevice {
                    device: dev,
                    reason: msg.clone(),
                })
            }
        };
        if dev.device_id < 0 || dev.device_id as usize >= count {
            return Err(DeviceError::InvalidDevice {
                device: dev,
                reason: format!("backend `opencl` has {count} device(s)"),
            });
        }
        Ok(())
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

impl DeviceMemoryApi for OpenClDeviceApi {
    fn raw_alloc(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        _dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr> {
        let d = self.dev(dev)?;
        let oom = |reason: String| DeviceError::OutOfMemory {
            device: dev,
            nbytes: nbytes as u64,
            align: align as u64,
            reason,
        };
        if nbytes as u64 > d.max_alloc {
            return Err(oom(format!(
                "the device's largest buffer (CL_DEVICE_MAX_MEM_ALLOC_SIZE) is {} bytes",
                d.max_alloc
            )));
        }
        let buf = d.context.buffer(nbytes).map_err(|e| match e.code {
            sys::CL_MEM_OBJECT_ALLOCATION_FAILURE
            | sys::CL_OUT_OF_RESOURCES
            | sys::CL_OUT_OF_HOST_MEMORY
            | sys::CL_INVALID_BUFFER_SIZE => oom(e.to_string()),
            _ => driver(dev, e),
        })?;
        let handle = buf.raw();
        let mut mem = lock(&d.mem);
        mem.freed.remove(&handle);
        mem.live.insert(handle, (Arc::new(buf), nbytes as u64));
        mem.in_use += nbytes as u64;
        mem.peak = mem.peak.max(mem.in_use);
        Ok(DevicePtr(handle))
    }

    fn raw_free(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
        let d = self.dev(dev)?;
        let mut mem = lock(&d.mem);
        match mem.live.remove(&ptr.0) {
            Some((buf, size)) => {
                mem.in_use -= size;
                mem.freed.insert(ptr.0);
                drop(mem);
                // The driver keeps the buffer until commands queued on it have completed.
                drop(buf);
                Ok(())
            }
            None if mem.freed.contains(&ptr.0) => Err(DeviceError::DoubleFree { device: dev, ptr }),
            None => Err(DeviceError::UnknownPointer {
                device: dev,
                ptr,
                what: "the opencl backend".to_owned(),
            }),
        }
    }

    unsafe fn raw_copy(
        &self,
        src: MemRegion,
        dst: MemRegion,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        let mine = |r: MemRegion| r.device.device_type == DeviceType::OPENCL;
        let n = nbytes as u64;
        let off = |r: MemRegion| {
            to_usize(r.offset).ok_or(DeviceError::OutOfBounds {
                op: "copy",
                device: r.device,
                ptr: r.ptr,
                offset: r.offset,
                nbytes: n,
                allocation: None,
            })
        };
        match (mine(src), mine(dst)) {
            (true, true) if src.device != dst.device => Err(DeviceError::Unsupported {
                device: src.device,
                what: format!(
                    "direct copies to {} (the copy goes through the host)",
                    dst.device
                ),
            }),
            (true, true) => {
                let dev = src.device;
                let (s, dbuf) = (
                    self.buffer("copy", dev, src.ptr, src.offset, n)?,
                    self.buffer("copy", dev, dst.ptr, dst.offset, n)?,
                );
                let (so, doff) = (off(src)?, off(dst)?);
                self.stream(dev, stream)?
                    .enqueue(|q| q.copy(&s, &dbuf, so, doff, nbytes))
                    .map_err(|e| driver(dev, e))
            }
            (false, true) => {
                let dev = dst.device;
                let buf = self.buffer("copy", dev, dst.ptr, dst.offset, n)?;
                let o = off(dst)?;
                let host = (src.ptr.0 as *const u8).wrapping_add(src.offset as usize);
                self.stream(dev, stream)?
                    .enqueue(|q| {
                        // SAFETY: the host source is readable for `nbytes` bytes until the copy
                        // completes (this function's contract).
                        unsafe { q.write(&buf, o, nbytes, host) }
                    })
                    .map_err(|e| driver(dev, e))
            }
            (true, false) => {
                let dev = src.device;
                let buf = self.buffer("copy", dev, src.ptr, src.offset, n)?;
                let o = off(src)?;
                let host = (dst.ptr.0 as *mut u8).wrapping_add(dst.offset as usize);
                self.stream(dev, stream)?
                    .enqueue(|q| {
                        // SAFETY: the host destination is writable for `nbytes` bytes until
                        // the copy completes (this function's contract).
                        unsafe { q.read(&buf, o, nbytes, host) }
                    })
                    .map_err(|e| driver(dev, e))
            }
            (false, false) => Err(DeviceError::Unsupported {
                device: src.device,
                what: "copies between two non-OpenCL devices".to_owned(),
            }),
        }
    }

    unsafe fn raw_copy_strided(
        &self,
        from: &DLTensor,
        to: &DLTensor,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        let (fdev, tdev) = (Device::from(from.device), Device::from(to.device));
        let unsupported = |what: &str| DeviceError::Unsupported {
            device: if fdev.device_type == DeviceType::OPENCL {
                fdev
            } else {
                tdev
            },
            what: what.to_owned(),
        };
        let bits = usize::from(from.dtype.bits) * usize::from(from.dtype.lanes);
        if bits % 8 != 0 {
            return Err(unsupported("strided copies of sub-byte elements"));
        }
        // SAFETY: shape and strides hold `ndim` entries (this function's contract).
        let (shape, fs, ts) = unsafe { (shape_of(from)?, strides_of(from), strides_of(to)) };
        let plan = plan_rect(shape, fs, ts, bits / 8, from.byte_offset, to.byte_offset)
            .ok_or_else(|| {
                unsupported(
                    "this strided copy (OpenCL copies rectangles of up to 3 dimensions with a                      contiguous inner run and growing pitches)",
                )
            })?;
        let cl = |d: Device| d.device_type == DeviceType::OPENCL;
        let (fptr, tptr) = (DevicePtr::from_raw(from.data), DevicePtr::from_raw(to.data));
        match (cl(fdev), cl(tdev)) {
            (true, true) if fdev == tdev => {
                let a = self.buffer("copy", fdev, fptr, from.byte_offset, plan.from_span)?;
                let b = self.buffer("copy", tdev, tptr, to.byte_offset, plan.to_span)?;
                self.stream(fdev, stream)?
                    .enqueue(|q| q.copy_rect(&a, &b, plan.from, plan.to, plan.region))
                    .map_err(|e| driver(fdev, e))
            }
            (false, true) if fdev.is_cpu() => {
                let b = self.buffer("copy", tdev, tptr, to.byte_offset, plan.to_span)?;
                self.stream(tdev, stream)?
                    .enqueue(|q| {
                        // SAFETY: the host tensor's elements are readable until the copy
                        // completes (this function's contract); the rectangle covers exactly
                        // them.
                        unsafe {
                            q.write_rect(&b, plan.to, fptr.0 as *const u8, plan.from, plan.region)
                        }
                    })
                    .map_err(|e| driver(tdev, e))
            }
            (true, false) if tdev.is_cpu() => {
                let a = self.buffer("copy", fdev, fptr, from.byte_offset, plan.from_span)?;
                self.stream(fdev, stream)?
                    .enqueue(|q| {
                        // SAFETY: the host tensor's elements are writable until the copy
                        // completes (this function's contract); the rectangle covers exactly
                        // them.
                        unsafe {
                            q.read_rect(&a, plan.from, tptr.0 as *mut u8, plan.to, plan.region)
                        }
                    })
                    .map_err(|e| driver(fdev, e))
            }
            _ => Err(unsupported(&format!(
                "direct strided copies between {fdev} and {tdev}"
            ))),
        }
    }

    fn raw_memset(
        &self,
        dev: Device,
        ptr: DevicePtr,
        offset: u64,
        value: u8,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        let buf = self.buffer("memset", dev, ptr, offset, nbytes as u64)?;
        let st = self.stream(dev, stream)?;
        let o = to_usize(offset).unwrap_or(usize::MAX);
        st.enqueue(|q| q.fill(&buf, value, o, nbytes))
            .map_err(|e| driver(dev, e))
    }

    fn raw_memory_stats(&self, dev: Device) -> DeviceResult<MemoryStats> {
        let d = self.dev(dev)?;
        let total = d.id.ulong(info::GLOBAL_MEM_SIZE).ok();
        let mem = lock(&d.mem);
        Ok(MemoryStats {
            total,
            free: None,
            in_use: mem.in_use,
            peak: mem.peak,
            allocations: mem.live.len() as u64,
        })
    }

    fn pointers_are_handles(&self) -> bool {
        true
    }
}

impl DeviceStreamApi for OpenClDeviceApi {
    fn raw_create_stream(&self, dev: Device) -> DeviceResult<StreamHandle> {
        let d = self.dev(dev)?;
        let q = d.context.queue(d.id).map_err(|e| driver(dev, e))?;
        let st = Arc::new(ClStream::new(dev.device_id, q));
        Ok(StreamHandle::from_raw(lock(&self.streams).insert(st)))
    }

    fn raw_free_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        if s.is_default() {
            return Err(DeviceError::InvalidStream {
                device: dev,
                handle: 0,
            });
        }
        lock(&self.streams).remove(s.to_raw());
        // Queued work completes before the queue goes (clReleaseCommandQueue would also wait
        // for it; finishing here reports a failure).
        st.queue.finish().map_err(|e| driver(dev, e))
    }

    fn raw_sync_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        st.queue.finish().map_err(|e| driver(dev, e))?;
        let last = lock(&st.last).clone();
        match last.map(|e| e.status()) {
            Some(Ok(status)) if status < 0 => Err(DeviceError::Backend {
                device: dev,
                message: format!(
                    "a command on the stream failed with {} ({status})",
                    sys::error_name(status)
                ),
            }),
            _ => Ok(()),
        }
    }

    fn raw_query_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<bool> {
        let st = self.stream(dev, s)?;
        let last = lock(&st.last).clone();
        let Some(ev) = last else { return Ok(true) };
        st.queue.flush().map_err(|e| driver(dev, e))?;
        event_done(dev, &ev)
    }

    fn raw_add_callback(&self, dev: Device, s: StreamHandle, cb: HostCallback) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        let d = self.dev(dev)?;
        let gate = d.context.user_event().map_err(|e| driver(dev, e))?;
        let mut marker = None;
        st.enqueue(|q| {
            let m = q.marker()?;
            marker = Some(m);
            // Work queued after the callback waits for it (the gate opens after it ran).
            q.barrier(&[&gate])?;
            q.marker()
        })
        .map_err(|e| {
            let _ = gate.complete_user();
            driver(dev, e)
        })?;
        let Some(marker) = marker else {
            let _ = gate.complete_user();
            return Err(DeviceError::Backend {
                device: dev,
                message: "clEnqueueMarkerWithWaitList returned no event".to_owned(),
            });
        };
        let opener = gate.clone();
        let r = marker.on_complete(Box::new(move |_status| {
            cb();
            if let Err(e) = opener.complete_user() {
                log::error!("opening the stream after a host callback: {e}");
            }
        }));
        if let Err(e) = r {
            let _ = gate.complete_user();
            return Err(driver(dev, e));
        }
        st.queue.flush().map_err(|e| driver(dev, e))
    }

    fn raw_create_event(&self, dev: Device) -> DeviceResult<EventHandle> {
        Ok(EventHandle::from_raw(
            lock(&self.events).insert((dev.device_id, None)),
        ))
    }

    fn raw_record_event(&self, dev: Device, s: StreamHandle, e: EventHandle) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        self.event(dev, e)?;
        let mut marker = None;
        st.enqueue(|q| {
            let m = q.marker()?;
            marker = Some(m.clone());
            Ok(m)
        })
        .map_err(|err| driver(dev, err))?;
        // Other queues may wait for the marker: it must reach the device.
        st.queue.flush().map_err(|err| driver(dev, err))?;
        match lock(&self.events).get_mut(e.to_raw()) {
            Some((d, slot)) if *d == dev.device_id => {
                *slot = marker;
                Ok(())
            }
            _ => Err(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            }),
        }
    }

    fn raw_query_event(&self, dev: Device, e: EventHandle) -> DeviceResult<bool> {
        match self.event(dev, e)? {
            None => Ok(true),
            Some(ev) => event_done(dev, &ev),
        }
    }

    fn raw_sync_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        match self.event(dev, e)? {
            None => Ok(()),
            Some(ev) => ev.wait().map_err(|err| driver(dev, err)),
        }
    }

    fn raw_stream_wait_event(
        &self,
        dev: Device,
        s: StreamHandle,
        e: EventHandle,
    ) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        match self.event(dev, e)? {
            None => Ok(()),
            Some(ev) => st
                .enqueue(|q| {
                    q.barrier(&[&ev])?;
                    q.marker()
                })
                .map_err(|err| driver(dev, err)),
        }
    }

    fn raw_destroy_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        self.event(dev, e)?;
        lock(&self.events).remove(e.to_raw());
        Ok(())
    }

    fn raw_event_elapsed(
        &self,
        dev: Device,
        start: EventHandle,
        end: EventHandle,
    ) -> DeviceResult<Duration> {
        let get = |h: EventHandle, which: &str| -> DeviceResult<sys::Event> {
            self.event(dev, h)?.ok_or_else(|| DeviceError::Backend {
                device: dev,
                message: format!("the {which} event {:#x} was never recorded", h.to_raw()),
            })
        };
        let (a, b) = (get(start, "start")?, get(end, "end")?);
        a.wait().map_err(|e| driver(dev, e))?;
        b.wait().map_err(|e| driver(dev, e))?;
        let time = |ev: &sys::Event| {
            ev.end_time_ns().map_err(|e| {
                if e.code == sys::CL_PROFILING_INFO_NOT_AVAILABLE {
                    DeviceError::Unsupported {
                        device: dev,
                        what: format!(
                            "timing between events: the driver gives no profiling information \
                             for markers ({e})"
                        ),
                    }
                } else {
                    driver(dev, e)
                }
            })
        };
        let (t0, t1) = (time(&a)?, time(&b)?);
        if t1 < t0 {
            return Err(DeviceError::Backend {
                device: dev,
                message: format!(
                    "the end event completed {} ns before the start event",
                    t0 - t1
                ),
            });
        }
        Ok(Duration::from_nanos(t1 - t0))
    }
}

fn event_done(dev: Device, ev: &sys::Event) -> DeviceResult<bool> {
    match ev.status().map_err(|e| driver(dev, e))? {
        sys::CL_COMPLETE => Ok(true),
        s if s < 0 => Err(DeviceError::Backend {
            device: dev,
            message: format!(
                "a command on the stream failed with {} ({s})",
                sys::error_name(s)
            ),
        }),
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::plan_rect;

    #[test]
    fn a_sub_block_of_a_matrix_is_one_rectangle() {
        // Rows 1..3, columns 2..5 of a 4x8 f32 matrix, to a compact 2x3.
        let p = plan_rect(&[2, 3], Some(&[8, 1]), None, 4, 40, 0).unwrap();
        assert_eq!(p.region, [12, 2, 1]);
        assert_eq!((p.from.origin, p.from.row_pitch), ([40, 0, 0], 32));
        assert_eq!((p.to.row_pitch, p.to.slice_pitch), (12, 24));
        assert_eq!((p.from_span, p.to_span), (44, 24));
    }

    #[test]
    fn compact_layouts_merge_and_transposes_are_refused() {
        let p = plan_rect(&[2, 3, 4], None, Some(&[12, 4, 1]), 1, 0, 0).unwrap();
        assert_eq!(p.region, [24, 1, 1]);
        assert!(plan_rect(&[4, 3], Some(&[1, 4]), None, 4, 0, 0).is_none());
        // Four dimensions that do not merge.
        assert!(plan_rect(&[2, 2, 2, 2], Some(&[64, 16, 4, 1]), None, 4, 0, 0).is_none());
        assert!(plan_rect(&[3], Some(&[-1]), None, 4, 0, 0).is_none());
    }
}
