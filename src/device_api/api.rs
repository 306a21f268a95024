//! The [`DeviceApi`] trait: one boundary per backend, TVM's `DeviceAPI` made complete with what
//! PaddlePaddle's CustomDevice and DIOPI add.
//!
//! A backend implements four small required methods here plus two facets,
//! [`DeviceMemoryApi`] and [`DeviceStreamApi`] (the `raw_*` methods). Everything a caller uses is
//! a *provided* method of [`DeviceApi`]: it checks the arguments (device in range, sizes,
//! alignment, shapes, dtypes), builds the error, records it as the thread's last error for this
//! backend, and layers policy (workspace pool, bounce copies through the host, the per-thread
//! current device and stream) over the raw calls.

use std::cell::RefCell;
use std::fmt;

use super::device::{Device, DeviceType};
use super::error::{DeviceError, DeviceResult};
use super::memory::{data_size, DeviceMemoryApi, DevicePtr, HostCallback, MemoryStats};
use super::stream::{DeviceStreamApi, EventHandle, StreamHandle};
use crate::packed_func::ffi::{DLDataType, DLTensor};
use crate::util::panic_message;

/// The alignment of data allocations when none is given, and the minimum for tensors (TVM's
/// `kAllocAlignment`).
pub const ALLOC_ALIGNMENT: usize = 64;

/// A device attribute kind: TVM's `DeviceAttrKind` codes 0..=16.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct AttrKind(pub i32);

const ATTR_NAMES: [&str; 17] = [
    "exist",
    "max_threads_per_block",
    "warp_size",
    "max_shared_memory_per_block",
    "compute_version",
    "device_name",
    "max_clock_rate",
    "multi_processor_count",
    "max_thread_dimensions",
    "max_registers_per_block",
    "gcn_arch",
    "api_version",
    "driver_version",
    "l2_cache_size_bytes",
    "total_global_memory",
    "available_global_memory",
    "image_pitch_alignment",
];

impl AttrKind {
    /// `kExist`: 1 if the device exists, else 0.
    pub const EXIST: Self = Self(0);
    /// `kMaxThreadsPerBlock`.
    pub const MAX_THREADS_PER_BLOCK: Self = Self(1);
    /// `kWarpSize`.
    pub const WARP_SIZE: Self = Self(2);
    /// `kMaxSharedMemoryPerBlock`, bytes.
    pub const MAX_SHARED_MEMORY_PER_BLOCK: Self = Self(3);
    /// `kComputeVersion`, a string such as `"8.0"`.
    pub const COMPUTE_VERSION: Self = Self(4);
    /// `kDeviceName`, a string.
    pub const DEVICE_NAME: Self = Self(5);
    /// `kMaxClockRate`, kHz.
    pub const MAX_CLOCK_RATE: Self = Self(6);
    /// `kMultiProcessorCount` (cores on a CPU).
    pub const MULTI_PROCESSOR_COUNT: Self = Self(7);
    /// `kMaxThreadDimensions`, a string `"[x, y, z]"`.
    pub const MAX_THREAD_DIMENSIONS: Self = Self(8);
    /// `kMaxRegistersPerBlock`.
    pub const MAX_REGISTERS_PER_BLOCK: Self = Self(9);
    /// `kGcnArch`.
    pub const GCN_ARCH: Self = Self(10);
    /// `kApiVersion`.
    pub const API_VERSION: Self = Self(11);
    /// `kDriverVersion`.
    pub const DRIVER_VERSION: Self = Self(12);
    /// `kL2CacheSizeBytes`.
    pub const L2_CACHE_SIZE_BYTES: Self = Self(13);
    /// `kTotalGlobalMemory`, bytes.
    pub const TOTAL_GLOBAL_MEMORY: Self = Self(14);
    /// `kAvailableGlobalMemory`, bytes.
    pub const AVAILABLE_GLOBAL_MEMORY: Self = Self(15);
    /// `kImagePitchAlignment`.
    pub const IMAGE_PITCH_ALIGNMENT: Self = Self(16);

    /// All 17 kinds, in code order.
    pub fn all() -> impl Iterator<Item = AttrKind> {
        (0..ATTR_NAMES.len() as i32).map(AttrKind)
    }

    /// The snake-case name (`"device_name"`), or `None` for an unknown code.
    pub fn name(self) -> Option<&'static str> {
        usize::try_from(self.0)
            .ok()
            .and_then(|i| ATTR_NAMES.get(i).copied())
    }

    /// The kind called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        ATTR_NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| Self(i as i32))
    }
}

impl fmt::Display for AttrKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.pad(n),
            None => f.pad(&format!("attr({})", self.0)),
        }
    }
}

/// The value of a device attribute.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize)]
#[serde(untagged)]
pub enum AttrValue {
    /// A number.
    Int(i64),
    /// A string.
    Str(String),
}

impl AttrValue {
    /// The number, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Self::Int(v) => Some(*v),
            Self::Str(_) => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            Self::Int(_) => None,
        }
    }
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(v) => write!(f, "{v}"),
            Self::Str(s) => f.write_str(s),
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Vec<(i32, String)>> = const { RefCell::new(Vec::new()) };
    static CURRENT_DEVICE: RefCell<Vec<(i32, i32)>> = const { RefCell::new(Vec::new()) };
    static CURRENT_STREAM: RefCell<Vec<((i32, i32), StreamHandle)>> = const { RefCell::new(Vec::new()) };
}

/// `check_device` of a backend whose devices a driver discovers: `dev` must be of type `ty`
/// and below the number of devices found (`found`: that number, or why there are none).
pub(crate) fn check_discovered(
    dev: Device,
    backend: &str,
    ty: DeviceType,
    found: Result<usize, &String>,
) -> DeviceResult<()> {
    let invalid = |reason: String| DeviceError::InvalidDevice {
        device: dev,
        reason,
    };
    if dev.device_type != ty {
        return Err(invalid(format!(
            "backend `{backend}` serves device type {} ({})",
            ty.name(),
            ty.0
        )));
    }
    let count = found.map_err(|why| invalid(why.clone()))?;
    if dev.device_id < 0 || dev.device_id as usize >= count {
        return Err(invalid(format!(
            "backend `{backend}` has {count} device(s)"
        )));
    }
    Ok(())
}

/// Records a failed result as the backend's last error (DIOPI's `get_last_error_string`) and
/// passes the result on: every provided method of [`DeviceApi`] ends with it.
pub(crate) fn noted<T, A: DeviceApi + ?Sized>(api: &A, r: DeviceResult<T>) -> DeviceResult<T> {
    if let Err(e) = &r {
        api.set_last_error(e.to_string());
    }
    r
}

fn set_entry<K: PartialEq, V>(v: &mut Vec<(K, V)>, k: K, val: V) -> Option<V> {
    match v.iter_mut().find(|(key, _)| *key == k) {
        Some(e) => Some(std::mem::replace(&mut e.1, val)),
        None => {
            v.push((k, val));
            None
        }
    }
}

/// A device backend: one boundary, required methods small, policy in provided methods.
///
/// Implement [`name`](Self::name), [`device_type`](Self::device_type),
/// [`device_count`](Self::device_count), [`raw_attr`](Self::raw_attr) and the two facets; call
/// the provided methods. See `docs/devices.md` for the contract.
pub trait DeviceApi: DeviceMemoryApi + DeviceStreamApi + Send + Sync {
    /// The backend's name (`"cpu"`): its registry name and the `device_api.<name>` function.
    fn name(&self) -> &str;

    /// The device type code of this backend's devices.
    fn device_type(&self) -> DeviceType;

    /// How many devices of this type exist (ids `0..count`).
    ///
    /// # Errors
    /// Backend failures (a missing driver is a count of 0, not an error).
    fn device_count(&self) -> DeviceResult<usize>;

    /// One attribute of a device that [`DeviceApi::check_device`] accepted; `None` when the
    /// backend does not support the kind.
    ///
    /// # Errors
    /// Backend failures only; unsupported is `Ok(None)`.
    fn raw_attr(&self, dev: Device, kind: AttrKind) -> DeviceResult<Option<AttrValue>>;

    /// Makes `dev` the backend's current device on this thread (e.g. `cudaSetDevice`). The
    /// default does nothing: the current device is tracked by [`DeviceApi::set_device`].
    ///
    /// # Errors
    /// Backend failures.
    fn raw_set_device(&self, dev: Device) -> DeviceResult<()> {
        let _ = dev;
        Ok(())
    }

    // ------------------------------------------------------------------ provided: checks

    /// Checks that `dev` is one of this backend's devices.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`] for another device type or an id out of range.
    fn check_device(&self, dev: Device) -> DeviceResult<()> {
        if dev.device_type != self.device_type() {
            return Err(DeviceError::InvalidDevice {
                device: dev,
                reason: format!(
                    "backend `{}` serves device type {} ({})",
                    self.name(),
                    self.device_type(),
                    self.device_type().0
                ),
            });
        }
        let count = self.device_count()?;
        if dev.device_id < 0 || dev.device_id as usize >= count {
            return Err(DeviceError::InvalidDevice {
                device: dev,
                reason: format!("backend `{}` has {count} device(s)", self.name()),
            });
        }
        Ok(())
    }

    /// Sets this thread's last error message for the backend.
    fn set_last_error(&self, message: String) {
        let code = self.device_type().0;
        // `try_with`: this may run while the thread's locals are being destroyed (a workspace
        // pool freeing its blocks at thread exit).
        let _ = LAST_ERROR.try_with(|l| {
            if let Ok(mut l) = l.try_borrow_mut() {
                set_entry(&mut l, code, message);
            }
        });
    }

    /// The message of the most recent failed call to this backend on this thread (DIOPI's
    /// `get_last_error_string`), per thread so that threads do not see each other's errors.
    fn last_error(&self) -> Option<String> {
        let code = self.device_type().0;
        LAST_ERROR.with(|l| {
            l.borrow()
                .iter()
                .find(|(c, _)| *c == code)
                .map(|(_, m)| m.clone())
        })
    }

    /// Forgets this thread's last error for the backend.
    fn clear_last_error(&self) {
        let code = self.device_type().0;
        LAST_ERROR.with(|l| l.borrow_mut().retain(|(c, _)| *c != code));
    }

    // ------------------------------------------------------------------ provided: devices

    /// One attribute. `kExist` is answered for any id (0 when out of range); other kinds need a
    /// valid device; an unsupported kind is `Ok(None)`.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`]; backend failures.
    fn attr(&self, dev: Device, kind: AttrKind) -> DeviceResult<Option<AttrValue>> {
        if kind == AttrKind::EXIST {
            let ok = self.check_device(dev).is_ok();
            return Ok(Some(AttrValue::Int(i64::from(ok))));
        }
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_attr(dev, kind)),
        )
    }

    /// Makes `dev` the current device of this backend on this thread.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`]; backend failures.
    fn set_device(&self, dev: Device) -> DeviceResult<()> {
        let r = self
            .check_device(dev)
            .and_then(|()| self.raw_set_device(dev));
        match r {
            Ok(()) => {
                CURRENT_DEVICE
                    .with(|c| set_entry(&mut c.borrow_mut(), dev.device_type.0, dev.device_id));
                Ok(())
            }
            Err(e) => {
                self.set_last_error(e.to_string());
                Err(e)
            }
        }
    }

    /// The current device of this backend on this thread (id 0 until [`DeviceApi::set_device`]).
    fn current_device(&self) -> Device {
        let t = self.device_type();
        let id = CURRENT_DEVICE.with(|c| {
            c.borrow()
                .iter()
                .find(|(k, _)| *k == t.0)
                .map_or(0, |(_, id)| *id)
        });
        Device::new(t, id)
    }

    // ------------------------------------------------------------------ provided: memory

    /// Allocates `nbytes` bytes aligned to `align` on `dev` (TVM's `AllocDataSpace`).
    ///
    /// # Errors
    /// [`DeviceError::ZeroSize`], [`DeviceError::BadAlignment`], [`DeviceError::OutOfMemory`],
    /// [`DeviceError::InvalidDevice`].
    fn alloc_data_space(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr> {
        noted(
            self,
            (|| {
                self.check_device(dev)?;
                if nbytes == 0 {
                    return Err(DeviceError::ZeroSize { device: dev });
                }
                if !align.is_power_of_two() {
                    return Err(DeviceError::BadAlignment {
                        device: dev,
                        align: align as u64,
                    });
                }
                if nbytes > isize::MAX as usize - align {
                    return Err(DeviceError::OutOfMemory {
                        device: dev,
                        nbytes: nbytes as u64,
                        align: align as u64,
                        reason: "the size exceeds isize::MAX".to_owned(),
                    });
                }
                self.raw_alloc(dev, nbytes, align, dtype_hint)
            })(),
        )
    }

    /// Allocates room for a tensor of `shape` and `dtype` in memory scope `scope` (`None`, `""`
    /// and `"global"` are plain device memory), aligned to `max(64, element size)`.
    ///
    /// # Errors
    /// As [`DeviceApi::alloc_data_space`]; [`DeviceError::InvalidTensor`] for a negative extent;
    /// [`DeviceError::Unsupported`] for an unknown scope.
    fn alloc_data_space_for(
        &self,
        dev: Device,
        shape: &[i64],
        dtype: DLDataType,
        scope: Option<&str>,
    ) -> DeviceResult<DevicePtr> {
        let nbytes = match data_size(shape, dtype) {
            Some(n) => n,
            None => {
                let e = DeviceError::InvalidTensor(format!(
                    "shape {shape:?} has a negative extent or its size overflows"
                ));
                self.set_last_error(e.to_string());
                return Err(e);
            }
        };
        let elem = (usize::from(dtype.bits) * usize::from(dtype.lanes)).div_ceil(8);
        let align = ALLOC_ALIGNMENT.max(elem.next_power_of_two());
        let nbytes = usize::try_from(nbytes).unwrap_or(usize::MAX);
        match scope {
            None | Some("") | Some("global") => self.alloc_data_space(dev, nbytes, align, dtype),
            Some(s) => noted(
                self,
                self.check_device(dev).and_then(|()| {
                    if nbytes == 0 {
                        Err(DeviceError::ZeroSize { device: dev })
                    } else {
                        self.raw_alloc_scoped(dev, nbytes, align, dtype, s)
                    }
                }),
            ),
        }
    }

    /// Frees memory from [`DeviceApi::alloc_data_space`].
    ///
    /// # Errors
    /// [`DeviceError::UnknownPointer`], [`DeviceError::DoubleFree`],
    /// [`DeviceError::InvalidDevice`].
    fn free_data_space(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_free(dev, ptr)),
        )
    }

    /// The number of bytes of a tensor's elements (TVM's `GetDataSize`).
    ///
    /// # Errors
    /// [`DeviceError::InvalidTensor`] for a malformed shape.
    fn data_size(&self, t: &DLTensor) -> DeviceResult<u64> {
        // SAFETY: `shape_of` only reads `t.shape` for `t.ndim` entries, which the DLTensor
        // contract guarantees.
        let shape = unsafe { shape_of(t) }?;
        data_size(shape, t.dtype).ok_or_else(|| {
            DeviceError::InvalidTensor(format!(
                "shape {shape:?} has a negative extent or overflows"
            ))
        })
    }

    /// Allocates a temporary buffer of `nbytes` bytes (64-byte aligned) through this thread's
    /// workspace pool for `dev` when this backend is the registered one for its type; otherwise
    /// directly. Free it with [`DeviceApi::free_workspace`] on the same thread.
    ///
    /// # Errors
    /// As [`DeviceApi::alloc_data_space`].
    fn alloc_workspace(
        &self,
        dev: Device,
        nbytes: usize,
        dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr> {
        let me = self as *const Self as *const ();
        noted(
            self,
            match super::workspace::thread_alloc_for(me, dev, nbytes) {
                Some(r) => r,
                None => self.alloc_data_space(dev, nbytes, ALLOC_ALIGNMENT, dtype_hint),
            },
        )
    }

    /// Frees a buffer from [`DeviceApi::alloc_workspace`].
    ///
    /// # Errors
    /// [`DeviceError::UnknownPointer`] (including a pointer allocated on another thread).
    fn free_workspace(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
        let me = self as *const Self as *const ();
        noted(
            self,
            match super::workspace::thread_free_for(me, dev, ptr) {
                Some(r) => r,
                None => self.free_data_space(dev, ptr),
            },
        )
    }

    /// Copies the elements of `from` into `to` (TVM's `CopyDataFromTo`): host to device, device
    /// to host, device to device, or across backends (bouncing through host memory when no
    /// direct path exists). Byte offsets are honoured; strided tensors are copied where a
    /// backend (or the host, for the host side of a transfer) can walk them. The copy is ordered
    /// on `stream` of this backend's device and may complete asynchronously: synchronize the
    /// stream before reading the result or freeing either side.
    ///
    /// # Errors
    /// [`DeviceError::CopyMismatch`] for different dtypes, shapes or sizes;
    /// [`DeviceError::InvalidTensor`]; [`DeviceError::Unsupported`] for a strided layout no one
    /// can walk; backend failures.
    ///
    /// # Safety
    /// - `from.data` and `to.data` (plus `byte_offset`, shape and strides) describe memory that
    ///   is valid to read (`from`) and write (`to`) on their devices: host memory for CPU
    ///   tensors, memory handed out by the backend otherwise.
    /// - `shape` (and `strides`, when not NULL) point to `ndim` integers.
    /// - Neither side is freed before the copy completes.
    unsafe fn copy_data_from_to(
        &self,
        from: &DLTensor,
        to: &DLTensor,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        // SAFETY: forwarded from this function's contract.
        noted(self, unsafe {
            super::copy::copy_tensor(self, from, to, stream)
        })
    }

    /// Sets `nbytes` bytes at `ptr + offset` on `dev` to `value`, ordered on `stream`.
    ///
    /// # Errors
    /// [`DeviceError::OutOfBounds`] outside a live allocation; [`DeviceError::InvalidDevice`].
    fn memset(
        &self,
        dev: Device,
        ptr: DevicePtr,
        offset: u64,
        value: u8,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        noted(
            self,
            self.check_device(dev).and_then(|()| {
                if nbytes == 0 {
                    Ok(())
                } else {
                    self.raw_memset(dev, ptr, offset, value, nbytes, stream)
                }
            }),
        )
    }

    /// Memory statistics of `dev`.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`]; backend failures.
    fn memory_stats(&self, dev: Device) -> DeviceResult<MemoryStats> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_memory_stats(dev)),
        )
    }

    // ------------------------------------------------------------------ provided: streams

    /// Creates a stream on `dev`.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`]; backend failures.
    fn create_stream(&self, dev: Device) -> DeviceResult<StreamHandle> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_create_stream(dev)),
        )
    }

    /// Frees a stream (after its queued work completes). If it is this thread's current stream
    /// for `dev`, the default stream becomes current.
    ///
    /// # Errors
    /// [`DeviceError::InvalidStream`] for a dead handle or the default stream.
    fn free_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()> {
        let r = self.check_device(dev).and_then(|()| {
            if stream.is_default() {
                Err(DeviceError::InvalidStream {
                    device: dev,
                    handle: 0,
                })
            } else {
                self.raw_free_stream(dev, stream)
            }
        });
        match r {
            Ok(()) => {
                CURRENT_STREAM.with(|c| {
                    c.borrow_mut().retain(|(k, s)| {
                        !(*k == (dev.device_type.0, dev.device_id) && *s == stream)
                    })
                });
                Ok(())
            }
            Err(e) => {
                self.set_last_error(e.to_string());
                Err(e)
            }
        }
    }

    /// Makes `stream` this thread's current stream for `dev` (tvm-ffi's env stream: per thread,
    /// per device, not owned) and returns the previous one.
    ///
    /// # Errors
    /// [`DeviceError::InvalidStream`] for a dead handle.
    fn set_current_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<StreamHandle> {
        noted(
            self,
            self.check_device(dev).and_then(|()| {
                if !stream.is_default() {
                    self.raw_check_stream(dev, stream)?;
                }
                Ok(CURRENT_STREAM.with(|c| {
                    set_entry(
                        &mut c.borrow_mut(),
                        (dev.device_type.0, dev.device_id),
                        stream,
                    )
                    .unwrap_or_default()
                }))
            }),
        )
    }

    /// This thread's current stream for `dev` ([`StreamHandle::DEFAULT`] until set).
    fn current_stream(&self, dev: Device) -> StreamHandle {
        CURRENT_STREAM.with(|c| {
            c.borrow()
                .iter()
                .find(|(k, _)| *k == (dev.device_type.0, dev.device_id))
                .map_or(StreamHandle::DEFAULT, |(_, s)| *s)
        })
    }

    /// Blocks until the work queued on `stream` has completed.
    ///
    /// # Errors
    /// [`DeviceError::InvalidStream`]; the first failure of the queued work.
    fn sync_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_sync_stream(dev, stream)),
        )
    }

    /// Whether the work queued on `stream` has completed (never blocks).
    ///
    /// # Errors
    /// [`DeviceError::InvalidStream`].
    fn query_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<bool> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_query_stream(dev, stream)),
        )
    }

    /// Makes work queued on `dst` from now on wait for the work queued on `src` so far (TVM's
    /// `SyncStreamFromTo`), through a temporary event.
    ///
    /// # Errors
    /// [`DeviceError::InvalidStream`] for either handle.
    fn sync_stream_from_to(
        &self,
        dev: Device,
        src: StreamHandle,
        dst: StreamHandle,
    ) -> DeviceResult<()> {
        noted(
            self,
            self.check_device(dev).and_then(|()| {
                // Check both handles before creating anything (without synchronizing: a failure
                // of queued work is reported by the next synchronization of its stream).
                self.raw_check_stream(dev, src)?;
                self.raw_check_stream(dev, dst)?;
                let ev = self.raw_create_event(dev)?;
                let res = self
                    .raw_record_event(dev, src, ev)
                    .and_then(|()| self.raw_stream_wait_event(dev, dst, ev));
                let destroyed = self.raw_destroy_event(dev, ev);
                res.and(destroyed)
            }),
        )
    }

    /// Queues a host callback on `stream`: it runs once, after the work queued before it. A
    /// panicking callback is caught and logged.
    ///
    /// # Errors
    /// [`DeviceError::InvalidStream`] (the callback is dropped without running).
    fn add_callback(
        &self,
        dev: Device,
        stream: StreamHandle,
        callback: HostCallback,
    ) -> DeviceResult<()> {
        let guarded: HostCallback = Box::new(move || {
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback)) {
                log::error!("a stream host callback panicked: {}", panic_message(&*p));
            }
        });
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_add_callback(dev, stream, guarded)),
        )
    }

    // ------------------------------------------------------------------ provided: events

    /// Creates an event on `dev`.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`]; backend failures.
    fn create_event(&self, dev: Device) -> DeviceResult<EventHandle> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_create_event(dev)),
        )
    }

    /// Records `event` at the current end of `stream`.
    ///
    /// # Errors
    /// [`DeviceError::InvalidStream`], [`DeviceError::InvalidEvent`].
    fn record_event(
        &self,
        dev: Device,
        stream: StreamHandle,
        event: EventHandle,
    ) -> DeviceResult<()> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_record_event(dev, stream, event)),
        )
    }

    /// Whether `event` has completed (never blocks).
    ///
    /// # Errors
    /// [`DeviceError::InvalidEvent`].
    fn query_event(&self, dev: Device, event: EventHandle) -> DeviceResult<bool> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_query_event(dev, event)),
        )
    }

    /// Blocks until `event` has completed.
    ///
    /// # Errors
    /// [`DeviceError::InvalidEvent`].
    fn sync_event(&self, dev: Device, event: EventHandle) -> DeviceResult<()> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_sync_event(dev, event)),
        )
    }

    /// Makes work queued on `stream` from now on wait for `event`.
    ///
    /// # Errors
    /// [`DeviceError::InvalidStream`], [`DeviceError::InvalidEvent`].
    fn stream_wait_event(
        &self,
        dev: Device,
        stream: StreamHandle,
        event: EventHandle,
    ) -> DeviceResult<()> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_stream_wait_event(dev, stream, event)),
        )
    }

    /// Destroys `event`.
    ///
    /// # Errors
    /// [`DeviceError::InvalidEvent`].
    fn destroy_event(&self, dev: Device, event: EventHandle) -> DeviceResult<()> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_destroy_event(dev, event)),
        )
    }

    /// The device time from `start`'s recorded point to `end`'s, after both have completed
    /// (blocks until then).
    ///
    /// # Errors
    /// [`DeviceError::InvalidEvent`]; [`DeviceError::Unsupported`] for a backend without event
    /// timing; an event never recorded.
    fn event_elapsed(
        &self,
        dev: Device,
        start: EventHandle,
        end: EventHandle,
    ) -> DeviceResult<std::time::Duration> {
        noted(
            self,
            self.check_device(dev)
                .and_then(|()| self.raw_event_elapsed(dev, start, end)),
        )
    }
}

/// The shape of a `DLTensor` as a slice, after checking `ndim` and the pointer.
///
/// # Safety
/// - When `t.ndim > 0` and `t.shape` is not NULL, it points to `t.ndim` integers that outlive
///   the borrow of `t`.
pub(crate) unsafe fn shape_of(t: &DLTensor) -> DeviceResult<&[i64]> {
    if t.ndim < 0 {
        return Err(DeviceError::InvalidTensor(format!("ndim is {}", t.ndim)));
    }
    if t.ndim == 0 {
        return Ok(&[]);
    }
    if t.shape.is_null() {
        return Err(DeviceError::InvalidTensor(format!(
            "shape is NULL with ndim = {}",
            t.ndim
        )));
    }
    // SAFETY: non-NULL and `ndim` entries long (caller).
    Ok(unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) })
}

/// The strides of a `DLTensor` (`None` when NULL, i.e. compact row-major).
///
/// # Safety
/// - When `t.strides` is not NULL, it points to `t.ndim` integers that outlive the borrow of `t`.
pub(crate) unsafe fn strides_of(t: &DLTensor) -> Option<&[i64]> {
    if t.strides.is_null() || t.ndim <= 0 {
        None
    } else {
        // SAFETY: non-NULL and `ndim` entries long (caller).
        Some(unsafe { std::slice::from_raw_parts(t.strides, t.ndim as usize) })
    }
}

/// Whether `strides` (in elements) describe a compact row-major layout of `shape`; extents of 1
/// may have any stride.
pub fn is_compact(shape: &[i64], strides: Option<&[i64]>) -> bool {
    let Some(strides) = strides else { return true };
    let mut expected = 1i64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

impl fmt::Debug for dyn DeviceApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceApi({:?}, {})", self.name(), self.device_type().0)
    }
}
