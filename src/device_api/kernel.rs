//! Kernels as a device runs them: what a backend implements to launch the kernels of one
//! device source ([`KernelLauncher`]), and the launch arguments it receives.
//!
//! These are device-level types: they speak DLPack ([`DLDataType`]) and device memory
//! ([`DevicePtr`]), never the compiler's IR, so a backend (OpenCL here, CUDA or a plugin next)
//! implements them without knowing how its source was generated. The runtime
//! ([`crate::runtime::device_module`]) pairs a launcher with the kernel table of a compiled
//! module and serves the launches generated host code makes.

use super::{DevicePtr, DeviceResult};
use crate::packed_func::{ffi::DLDataTypeCode, DLDataType};

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

/// What a kernel parameter is, as a device module records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelParamKind {
    /// A buffer of this element type.
    Buffer(DLDataType),
    /// A scalar of this type (`bool` is passed as a 4-byte `int`).
    Scalar(DLDataType),
}

impl KernelParamKind {
    /// The bytes a scalar of this kind occupies in a launch: its size, 4 for `bool` (passed as
    /// an `int`), 8 (a handle) for a buffer.
    pub fn arg_size(self) -> usize {
        match self {
            KernelParamKind::Buffer(_) => 8,
            KernelParamKind::Scalar(t) if t.code == DLDataTypeCode::BOOL => 4,
            KernelParamKind::Scalar(t) => t.bytes(),
        }
    }
}

/// One kernel of a device module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInfo {
    /// The kernel's symbol in the device code.
    pub name: String,
    /// Its parameters, in order.
    pub params: Vec<KernelParamKind>,
    /// Bytes of dynamic shared memory each block of the kernel gets at launch (CUDA's
    /// `extern __shared__`; 0 for kernels whose shared memory is all static, and on OpenCL).
    pub dyn_shared_bytes: u64,
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

/// Makes the launcher of one device source with these kernels: how a backend loads the device
/// code of a compiled module or a loaded library. Registered per target kind with
/// [`crate::runtime::device_module::register_kernel_loader`].
pub type KernelLoader = fn(&str, &[KernelInfo]) -> Result<Box<dyn KernelLauncher>, String>;
