//! [`Tensor`]: an owned N-d array on a device, and [`Element`], the Rust types it holds.
//!
//! A `Tensor` owns its memory (allocated through the device's backend, or imported through
//! DLPack) and its shape and strides; [`Tensor::as_dltensor`] lends a `DLTensor` that points into
//! them, for packed-function calls and generated code. DLPack export hands the whole tensor to a
//! consumer, whose single call of the deleter frees it; DLPack import keeps the producer's
//! deleter and calls it exactly once, when the `Tensor` drops.
//!
//! This file holds `unsafe` code for the host-side views of Rust slices and for DLPack.

use std::fmt;
use std::sync::Arc;

use super::api::{is_compact, DeviceApi};
use super::device::Device;
use super::error::{DeviceError, DeviceResult};
use super::memory::{data_size, DevicePtr};
use super::registry;
use super::stream::StreamHandle;
use crate::packed_func::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLManagedTensorVersioned, DLTensor,
    DLPACK_FLAG_READ_ONLY, DLPACK_VERSION,
};

mod sealed {
    pub trait Sealed {}
}

/// A Rust type a [`Tensor`] can hold, with its DLPack dtype.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The DLPack dtype.
    const DTYPE: DLDataType;
    /// A type of the same size for which every bit pattern is valid (`u8` for `bool`).
    #[doc(hidden)]
    type Pod: Copy + Default + Send + 'static;
    /// Reads an element from its bits.
    #[doc(hidden)]
    fn from_pod(p: Self::Pod) -> Self;
}

macro_rules! element {
    ($($t:ty => $code:ident, $bits:expr;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DLDataType = DLDataType { code: DLDataTypeCode::$code, bits: $bits, lanes: 1 };
            type Pod = $t;
            fn from_pod(p: $t) -> $t { p }
        }
    )*};
}

element! {
    f32 => FLOAT, 32;
    f64 => FLOAT, 64;
    half::f16 => FLOAT, 16;
    half::bf16 => BFLOAT, 16;
    i8 => INT, 8;
    i16 => INT, 16;
    i32 => INT, 32;
    i64 => INT, 64;
    u8 => UINT, 8;
    u16 => UINT, 16;
    u32 => UINT, 32;
    u64 => UINT, 64;
}

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DLDataType = DLDataType {
        code: DLDataTypeCode::BOOL,
        bits: 8,
        lanes: 1,
    };
    type Pod = u8;
    fn from_pod(p: u8) -> bool {
        p != 0
    }
}

enum Owner {
    /// No memory (zero elements).
    Nothing,
    /// Allocated through a backend; freed through it.
    Device {
        api: Arc<dyn DeviceApi>,
        ptr: DevicePtr,
    },
    /// Imported through DLPack; the producer's deleter runs once on drop.
    DlPack(*mut DLManagedTensorVersioned),
}

/// An owned N-d array on a device.
pub struct Tensor {
    /// Points into `shape`/`strides` (boxed, so moving the `Tensor` keeps them valid) and at the
    /// memory `owner` keeps alive.
    dl: DLTensor,
    shape: Box<[i64]>,
    strides: Option<Box<[i64]>>,
    owner: Owner,
    read_only: bool,
}

// SAFETY: a `Tensor` owns its memory and its shape boxes exclusively; its raw pointers point
// only at those. Device memory may be used and freed from any thread (the DeviceApi contract),
// and DLPack's deleter may be called from any thread (DLPack's contract).
unsafe impl Send for Tensor {}
// SAFETY: `&Tensor` only reads the shape and copies out of the memory.
unsafe impl Sync for Tensor {}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("device", &self.device())
            .field("dtype", &self.dl.dtype.to_string())
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("byte_offset", &self.dl.byte_offset)
            .finish()
    }
}

fn check_shape(shape: &[i64]) -> DeviceResult<()> {
    if shape.iter().any(|&d| d < 0) {
        return Err(DeviceError::InvalidTensor(format!(
            "shape {shape:?} has a negative extent"
        )));
    }
    if shape.len() > i32::MAX as usize {
        return Err(DeviceError::InvalidTensor("too many dimensions".into()));
    }
    Ok(())
}

/// A compact host `DLTensor` over `len` elements at `data`, shaped `shape`.
fn host_view(data: *mut std::ffi::c_void, shape: &[i64], dtype: DLDataType) -> DLTensor {
    DLTensor {
        data,
        device: DLDevice::from(Device::cpu()),
        ndim: shape.len() as i32,
        dtype,
        shape: shape.as_ptr().cast_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

impl Tensor {
    fn build(
        shape: &[i64],
        strides: Option<&[i64]>,
        dtype: DLDataType,
        device: Device,
        storage_elems: u64,
    ) -> DeviceResult<Self> {
        check_shape(shape)?;
        let api = registry::get_for(device)?;
        let nbytes = data_size(&[i64::try_from(storage_elems).unwrap_or(i64::MAX)], dtype)
            .ok_or_else(|| {
                DeviceError::InvalidTensor(format!("shape {shape:?}: the size overflows"))
            })?;
        let numel: u64 = shape.iter().map(|&d| d as u64).product();
        let owner = if numel == 0 || nbytes == 0 {
            Owner::Nothing
        } else {
            let n = usize::try_from(nbytes).map_err(|_| DeviceError::OutOfMemory {
                device,
                nbytes,
                align: 64,
                reason: "the size does not fit in usize".into(),
            })?;
            let elem = (usize::from(dtype.bits) * usize::from(dtype.lanes)).div_ceil(8);
            let align = super::api::ALLOC_ALIGNMENT.max(elem.next_power_of_two());
            let ptr = api.alloc_data_space(device, n, align, dtype)?;
            Owner::Device { api, ptr }
        };
        let data = match &owner {
            Owner::Device { ptr, .. } => ptr.as_raw(),
            _ => std::ptr::null_mut(),
        };
        let mut shape: Box<[i64]> = shape.into();
        let mut strides: Option<Box<[i64]>> = strides.map(Into::into);
        let dl = DLTensor {
            data,
            device: device.to_dl(),
            ndim: shape.len() as i32,
            dtype,
            shape: shape.as_mut_ptr(),
            strides: strides
                .as_mut()
                .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: 0,
        };
        Ok(Self {
            dl,
            shape,
            strides,
            owner,
            read_only: false,
        })
    }

    /// A compact tensor (64-byte aligned) whose contents are unspecified: kiln does not fill
    /// it. A tensor with zero elements allocates nothing.
    ///
    /// Safe code never sees uninitialised memory through it: the CPU backend zeroes every
    /// allocation (so on the CPU the tensor reads as zeros), and reading a device tensor copies
    /// the device's bytes into initialised host memory. Use [`Tensor::zeros`] when the zeros
    /// matter on every device.
    ///
    /// # Errors
    /// [`DeviceError::InvalidTensor`] for a negative extent; the backend's allocation errors;
    /// [`DeviceError::NoBackend`] for a device without a backend.
    pub fn empty(shape: &[i64], dtype: DLDataType, device: Device) -> DeviceResult<Self> {
        check_shape(shape)?;
        let numel = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
            .ok_or_else(|| DeviceError::InvalidTensor(format!("shape {shape:?} overflows")))?;
        Self::build(shape, None, dtype, device, numel)
    }

    /// An uninitialized tensor with the given strides (in elements, non-negative), backed by
    /// just enough memory for the elements they address.
    ///
    /// # Errors
    /// As [`Tensor::empty`]; [`DeviceError::InvalidTensor`] for negative strides or a length
    /// mismatch.
    pub fn empty_strided(
        shape: &[i64],
        strides: &[i64],
        dtype: DLDataType,
        device: Device,
    ) -> DeviceResult<Self> {
        check_shape(shape)?;
        if strides.len() != shape.len() || strides.iter().any(|&s| s < 0) {
            return Err(DeviceError::InvalidTensor(format!(
                "strides {strides:?} must be {} non-negative integers for shape {shape:?}",
                shape.len()
            )));
        }
        let span = if shape.contains(&0) {
            0
        } else {
            shape
                .iter()
                .zip(strides)
                .try_fold(1u64, |a, (&d, &s)| {
                    (d as u64 - 1)
                        .checked_mul(s as u64)
                        .and_then(|x| a.checked_add(x))
                })
                .ok_or_else(|| {
                    DeviceError::InvalidTensor(format!("strides {strides:?} overflow"))
                })?
        };
        Self::build(shape, Some(strides), dtype, device, span)
    }

    /// A compact tensor of zeros.
    ///
    /// # Errors
    /// As [`Tensor::empty`].
    pub fn zeros(shape: &[i64], dtype: DLDataType, device: Device) -> DeviceResult<Self> {
        let t = Self::empty(shape, dtype, device)?;
        if let Owner::Device { api, ptr } = &t.owner {
            let n = t.nbytes() as usize;
            api.memset(device, *ptr, 0, 0, n, StreamHandle::DEFAULT)?;
            api.sync_stream(device, StreamHandle::DEFAULT)?;
        }
        Ok(t)
    }

    /// A compact tensor on `device` holding `data`, shaped `shape`.
    ///
    /// # Errors
    /// [`DeviceError::InvalidTensor`] when `shape` does not hold `data.len()` elements; as
    /// [`Tensor::empty`].
    pub fn from_slice<T: Element>(data: &[T], shape: &[i64], device: Device) -> DeviceResult<Self> {
        check_shape(shape)?;
        let numel: u64 = shape.iter().map(|&d| d as u64).product();
        if numel != data.len() as u64 {
            return Err(DeviceError::InvalidTensor(format!(
                "shape {shape:?} holds {numel} elements, the slice has {}",
                data.len()
            )));
        }
        let mut t = Self::empty(shape, T::DTYPE, device)?;
        let src = host_view(data.as_ptr().cast_mut().cast(), shape, T::DTYPE);
        // SAFETY: `src` describes `data` (read only), `t` its own fresh allocation; the copy is
        // synchronized before `data` can go away.
        unsafe { t.copy_in(&src)? };
        Ok(t)
    }

    /// Copies `bytes` (the tensor's elements, row-major, in its dtype's little-endian layout)
    /// into this compact tensor and waits for the copy: a host array of any dtype in, where
    /// [`Tensor::from_slice`] takes typed elements.
    ///
    /// # Errors
    /// [`DeviceError::InvalidTensor`] for a tensor that is not compact, or read-only, or
    /// whose size is not `bytes.len()`; copy errors.
    pub fn copy_from_bytes(&mut self, bytes: &[u8]) -> DeviceResult<()> {
        self.check_bytes(bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        let src = host_view(bytes.as_ptr().cast_mut().cast(), &self.shape, self.dl.dtype);
        // SAFETY: `src` describes `bytes` (read only, `nbytes` long, checked above), alive
        // until the copy is synchronized inside `copy_in`.
        unsafe { self.copy_in(&src) }
    }

    /// Copies this compact tensor's elements into `bytes` (row-major, as
    /// [`Tensor::copy_from_bytes`] takes them) and waits for the copy.
    ///
    /// # Errors
    /// As [`Tensor::copy_from_bytes`] (but a read-only tensor can be read).
    pub fn copy_to_bytes(&self, bytes: &mut [u8]) -> DeviceResult<()> {
        self.check_bytes(bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        let dst = host_view(bytes.as_mut_ptr().cast(), &self.shape, self.dl.dtype);
        // SAFETY: `dst` describes `bytes` (writable, `nbytes` long, checked above), alive until
        // after the sync; `self.dl` describes memory this tensor owns.
        unsafe { registry::copy_data_from_to(&self.dl, &dst, StreamHandle::DEFAULT)? };
        sync_default(self.device())
    }

    fn check_bytes(&self, len: usize) -> DeviceResult<()> {
        if !self.is_compact() {
            return Err(DeviceError::InvalidTensor(
                "a byte copy needs a compact tensor".into(),
            ));
        }
        if self.nbytes() != len as u64 {
            return Err(DeviceError::InvalidTensor(format!(
                "the tensor holds {} bytes ({:?} of {}), the host buffer {len}",
                self.nbytes(),
                self.shape,
                self.dl.dtype
            )));
        }
        Ok(())
    }

    /// Copies `src` into this tensor and waits for the copy.
    ///
    /// # Safety
    /// As [`DeviceApi::copy_data_from_to`] for `src`.
    unsafe fn copy_in(&mut self, src: &DLTensor) -> DeviceResult<()> {
        if self.read_only {
            return Err(DeviceError::InvalidTensor(
                "the tensor is read-only (imported with DLPack's READ_ONLY flag)".into(),
            ));
        }
        // SAFETY: `self.dl` describes memory this tensor owns; `src` is valid (caller).
        unsafe { registry::copy_data_from_to(src, &self.dl, StreamHandle::DEFAULT)? };
        sync_default(src.device.into())?;
        sync_default(self.device())
    }

    /// The elements, copied to the host in row-major order.
    ///
    /// # Errors
    /// [`DeviceError::DtypeMismatch`] when `T` is not the tensor's dtype; copy errors.
    pub fn to_vec<T: Element>(&self) -> DeviceResult<Vec<T>> {
        if self.dl.dtype != T::DTYPE {
            return Err(DeviceError::DtypeMismatch {
                expected: T::DTYPE.to_string(),
                found: self.dl.dtype.to_string(),
            });
        }
        let n = self.numel() as usize;
        let mut out: Vec<T::Pod> = vec![T::Pod::default(); n];
        if n > 0 {
            let dst = host_view(out.as_mut_ptr().cast(), &self.shape, T::DTYPE);
            // SAFETY: `dst` describes `out` (n elements, writable, alive until after the sync);
            // `self.dl` describes memory this tensor owns.
            unsafe { registry::copy_data_from_to(&self.dl, &dst, StreamHandle::DEFAULT)? };
            sync_default(self.device())?;
        }
        Ok(out.into_iter().map(T::from_pod).collect())
    }

    /// Copies the elements of `other` (same shape and dtype, any device) into this tensor.
    ///
    /// # Errors
    /// [`DeviceError::CopyMismatch`]; copy errors.
    pub fn copy_from(&mut self, other: &Tensor) -> DeviceResult<()> {
        // SAFETY: both describe memory their tensors own; `other` outlives the synchronized copy.
        unsafe { self.copy_in(&other.dl) }
    }

    /// A compact copy of this tensor on `device`.
    ///
    /// # Errors
    /// As [`Tensor::empty`] and [`Tensor::copy_from`].
    pub fn copy_to(&self, device: Device) -> DeviceResult<Tensor> {
        let mut t = Self::empty(&self.shape, self.dl.dtype, device)?;
        t.copy_from(self)?;
        Ok(t)
    }

    /// The tensor as a `DLTensor` (pointing into this tensor: valid while it lives).
    pub fn as_dltensor(&self) -> &DLTensor {
        &self.dl
    }

    /// The extents.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The strides in elements, or `None` for compact row-major.
    pub fn strides(&self) -> Option<&[i64]> {
        self.strides.as_deref()
    }

    /// The dtype.
    pub fn dtype(&self) -> DLDataType {
        self.dl.dtype
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.dl.device.into()
    }

    /// Bytes from the data pointer to the first element.
    pub fn byte_offset(&self) -> u64 {
        self.dl.byte_offset
    }

    /// The data pointer (opaque for non-CPU devices).
    pub fn data_ptr(&self) -> DevicePtr {
        DevicePtr::from_raw(self.dl.data)
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }

    /// The bytes of the elements (`numel * ceil(bits * lanes / 8)`).
    pub fn nbytes(&self) -> u64 {
        data_size(&self.shape, self.dl.dtype).unwrap_or(0)
    }

    /// Whether the layout is compact row-major.
    pub fn is_compact(&self) -> bool {
        is_compact(&self.shape, self.strides.as_deref())
    }

    /// Whether the tensor was imported read-only (DLPack flag).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Hands the tensor to a DLPack consumer (`DLManagedTensorVersioned`, version 1.3). The
    /// consumer must call the deleter exactly once; it frees the memory.
    pub fn to_dlpack(self) -> *mut DLManagedTensorVersioned {
        let flags = if self.read_only {
            DLPACK_FLAG_READ_ONLY
        } else {
            0
        };
        let dl = self.dl;
        let ctx = Box::new(Exported {
            managed: DLManagedTensorVersioned {
                version: DLPACK_VERSION,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(exported_deleter),
                flags,
                dl_tensor: dl,
            },
            _tensor: self,
        });
        let p = Box::into_raw(ctx);
        // SAFETY: `p` is the fresh, valid box; `managed` is its first field (repr(C)), so the
        // returned pointer is also the box's address.
        unsafe { (*p).managed.manager_ctx = p.cast() };
        p.cast()
    }

    /// Takes a DLPack tensor (zero copy). The producer's deleter runs exactly once: when the
    /// `Tensor` drops, or before this returns an error.
    ///
    /// # Errors
    /// [`DeviceError::DlPack`] for NULL, a major version other than 1, or a malformed tensor.
    ///
    /// # Safety
    /// - `managed` is NULL or a valid `DLManagedTensorVersioned` whose ownership passes to kiln
    ///   (nobody else calls its deleter).
    /// - Its `dl_tensor` describes valid memory on its device until the deleter runs.
    pub unsafe fn from_dlpack(managed: *mut DLManagedTensorVersioned) -> DeviceResult<Self> {
        if managed.is_null() {
            return Err(DeviceError::DlPack("the managed tensor is NULL".into()));
        }
        let fail = |msg: String| -> DeviceResult<Self> {
            // SAFETY: `managed` is valid and ours (caller); its deleter runs once, here.
            unsafe {
                if let Some(d) = (*managed).deleter {
                    d(managed);
                }
            }
            Err(DeviceError::DlPack(msg))
        };
        // SAFETY: valid (caller).
        let m = unsafe { &*managed };
        if m.version.major != DLPACK_VERSION.major {
            return fail(format!(
                "version {}.{} is not supported (kiln reads {}.x)",
                m.version.major, m.version.minor, DLPACK_VERSION.major
            ));
        }
        let t = &m.dl_tensor;
        // SAFETY: shape/strides hold `ndim` entries (caller).
        let (shape, strides) = match unsafe { super::api::shape_of(t) } {
            Ok(s) => (
                s.to_vec(),
                // SAFETY: strides hold `ndim` entries when non-NULL (caller).
                unsafe { super::api::strides_of(t) }.map(<[i64]>::to_vec),
            ),
            Err(e) => return fail(e.to_string()),
        };
        if let Err(e) = check_shape(&shape) {
            return fail(e.to_string());
        }
        if t.data.is_null() && data_size(&shape, t.dtype).unwrap_or(0) > 0 {
            return fail("data is NULL".into());
        }
        let mut shape: Box<[i64]> = shape.into();
        let mut strides: Option<Box<[i64]>> = strides.map(Into::into);
        let dl = DLTensor {
            data: t.data,
            device: t.device,
            ndim: t.ndim,
            dtype: t.dtype,
            shape: shape.as_mut_ptr(),
            strides: strides
                .as_mut()
                .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: t.byte_offset,
        };
        Ok(Self {
            dl,
            shape,
            strides,
            owner: Owner::DlPack(managed),
            read_only: m.flags & DLPACK_FLAG_READ_ONLY != 0,
        })
    }
}

fn sync_default(dev: Device) -> DeviceResult<()> {
    registry::get(dev.device_type)?.sync_stream(dev, StreamHandle::DEFAULT)
}

impl Drop for Tensor {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.owner, Owner::Nothing) {
            Owner::Nothing => {}
            Owner::Device { api, ptr } => {
                if let Err(e) = api.free_data_space(self.device(), ptr) {
                    log::error!("dropping a tensor: {e}");
                }
            }
            Owner::DlPack(m) => {
                // SAFETY: `m` is the managed tensor `from_dlpack` took ownership of; it is
                // replaced by `Nothing` above, so its deleter runs exactly once.
                unsafe {
                    if let Some(d) = (*m).deleter {
                        d(m);
                    }
                }
            }
        }
    }
}

/// What an exported DLPack tensor points to: the managed struct first (so its address is the
/// box's), then the tensor that owns the memory and the shape.
#[repr(C)]
struct Exported {
    managed: DLManagedTensorVersioned,
    _tensor: Tensor,
}

unsafe extern "C" fn exported_deleter(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    let r = std::panic::catch_unwind(|| {
        // SAFETY: `m` came from `Tensor::to_dlpack`, whose `manager_ctx` is the `Exported` box;
        // DLPack's consumer calls the deleter once, so the box is freed once.
        let ctx = unsafe { (*m).manager_ctx };
        // SAFETY: as above: `ctx` is the `Exported` box, freed here once.
        drop(unsafe { Box::from_raw(ctx.cast::<Exported>()) });
    });
    if r.is_err() {
        log::error!("freeing an exported DLPack tensor panicked; the panic was contained");
    }
}
