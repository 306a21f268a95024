//! The memory facet of a backend: [`DeviceMemoryApi`], with [`DevicePtr`], [`MemRegion`] and
//! [`MemoryStats`].
//!
//! These are the *required* memory operations a backend implements. They receive arguments that
//! [`DeviceApi`](super::DeviceApi)'s provided methods have already checked (device in range,
//! non-zero size, power-of-two alignment, matching copy sizes), so they stay small.

use std::fmt;

use super::device::Device;
use super::error::{DeviceError, DeviceResult};
use super::stream::StreamHandle;
use crate::packed_func::ffi::{DLDataType, DLTensor};

/// An address in a device's memory. Opaque: generic code never dereferences it, because a
/// plugin device's pointers are not host pointers. Only a backend that says so
/// ([`DeviceMemoryApi::host_accessible`], e.g. the CPU) may treat it as one.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DevicePtr(
    /// The address, as the backend handed it out. 0 is the null pointer.
    pub usize,
);

impl DevicePtr {
    /// The null pointer (never a valid allocation).
    pub const NULL: Self = Self(0);

    /// Whether this is the null pointer.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address as a C pointer, for `DLTensor::data` (not to be dereferenced unless the
    /// backend is host-accessible).
    pub fn as_raw(self) -> *mut std::ffi::c_void {
        self.0 as *mut std::ffi::c_void
    }

    /// The address of a C pointer.
    pub fn from_raw(p: *const std::ffi::c_void) -> Self {
        Self(p as usize)
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// One end of a flat copy: a device, a base pointer it handed out (or a host pointer on the
/// CPU), and a byte offset from it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemRegion {
    /// Where the memory lives.
    pub device: Device,
    /// The base pointer.
    pub ptr: DevicePtr,
    /// Bytes from `ptr` to the first byte to copy.
    pub offset: u64,
}

/// Memory statistics of one device. `total` and `free` come from the device (the OS for the
/// CPU) when it knows them; `in_use`, `peak` and `allocations` count what was allocated through
/// this backend in this process.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize)]
pub struct MemoryStats {
    /// Total memory of the device, in bytes.
    pub total: Option<u64>,
    /// Free memory of the device, in bytes.
    pub free: Option<u64>,
    /// Bytes currently allocated through kiln.
    pub in_use: u64,
    /// The largest `in_use` seen.
    pub peak: u64,
    /// Live allocations through kiln.
    pub allocations: u64,
}

/// A host callback queued on a stream: runs once, after everything queued before it.
pub type HostCallback = Box<dyn FnOnce() + Send + 'static>;

/// The memory operations a backend implements. Callers use the checked methods of
/// [`DeviceApi`](super::DeviceApi) instead.
pub trait DeviceMemoryApi {
    /// Allocates `nbytes > 0` bytes aligned to `align` (a power of two) on `dev`.
    ///
    /// # Errors
    /// [`DeviceError::OutOfMemory`] when the device cannot provide the memory (never abort).
    fn raw_alloc(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr>;

    /// Allocates in a memory scope other than `"global"` (e.g. `"global.texture"`). The default
    /// supports none.
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] for a scope the backend does not know.
    fn raw_alloc_scoped(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        dtype: DLDataType,
        scope: &str,
    ) -> DeviceResult<DevicePtr> {
        let _ = (nbytes, align, dtype);
        Err(DeviceError::Unsupported {
            device: dev,
            what: format!("memory scope `{scope}` (supported: global)"),
        })
    }

    /// Frees `ptr`, which this backend must check: a pointer it never handed out is
    /// [`DeviceError::UnknownPointer`], one it freed already [`DeviceError::DoubleFree`] (when
    /// it can tell), never undefined behaviour.
    ///
    /// # Errors
    /// As above.
    fn raw_free(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()>;

    /// Copies `nbytes` bytes from `src` to `dst`. One side is on this backend; the other is on
    /// this backend (any of its devices) or on the CPU (a host pointer). The copy is ordered on
    /// `stream` of the backend's device; it may complete asynchronously until the stream is
    /// synchronized. Copies between two devices of this backend without peer access should
    /// return [`DeviceError::Unsupported`]: the caller then bounces through host memory.
    ///
    /// # Errors
    /// Backend failures; [`DeviceError::OutOfBounds`] where the backend can check.
    ///
    /// # Safety
    /// - A host-side region (CPU device) is valid for `nbytes` bytes from `ptr + offset`
    ///   (readable for `src`, writable for `dst`) until the copy completes.
    /// - Neither region is freed until the copy completes.
    unsafe fn raw_copy(
        &self,
        src: MemRegion,
        dst: MemRegion,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()>;

    /// Copies a non-compact (strided) tensor, element by element. `from` and `to` have the same
    /// shape and dtype (already checked). The default refuses; the CPU implements it.
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] by default.
    ///
    /// # Safety
    /// As [`DeviceMemoryApi::raw_copy`], for every element the tensors address.
    unsafe fn raw_copy_strided(
        &self,
        from: &DLTensor,
        to: &DLTensor,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        let _ = (to, stream);
        Err(DeviceError::Unsupported {
            device: from.device.into(),
            what: "strided copies".to_owned(),
        })
    }

    /// Sets `nbytes` bytes at `ptr + offset` to `value`, ordered on `stream`. The backend checks
    /// that the range lies inside one of its live allocations.
    ///
    /// # Errors
    /// [`DeviceError::OutOfBounds`] for a range outside every live allocation.
    fn raw_memset(
        &self,
        dev: Device,
        ptr: DevicePtr,
        offset: u64,
        value: u8,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()>;

    /// Memory statistics of `dev`.
    ///
    /// # Errors
    /// Backend failures.
    fn raw_memory_stats(&self, dev: Device) -> DeviceResult<MemoryStats>;

    /// Whether this backend's pointers are host pointers that the host may read, write and
    /// offset (TVM's `SupportsDevicePointerArithmeticsOnHost`). False by default.
    fn host_accessible(&self) -> bool {
        false
    }

    /// Whether this backend's pointers are opaque handles rather than addresses (OpenCL's
    /// `cl_mem`, as TVM's OpenCL runtime keeps in `DLTensor::data`): they carry no alignment
    /// and take no arithmetic; offsets travel separately (`byte_offset`, [`MemRegion::offset`]).
    /// False by default.
    fn pointers_are_handles(&self) -> bool {
        false
    }
}

/// The number of bytes of a tensor's elements (TVM's `GetDataSize`): the element count times
/// `ceil(bits * lanes / 8)`. `None` when the shape is negative or the size overflows.
pub fn data_size(shape: &[i64], dtype: DLDataType) -> Option<u64> {
    let mut n: u64 = 1;
    for &d in shape {
        n = n.checked_mul(u64::try_from(d).ok()?)?;
    }
    let elem = (u64::from(dtype.bits) * u64::from(dtype.lanes)).div_ceil(8);
    n.checked_mul(elem)
}
