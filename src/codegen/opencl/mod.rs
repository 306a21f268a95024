//! The OpenCL backend: `target.build.opencl`, for TVM 0.27's `opencl` target kind.
//!
//! A module is split ([`crate::codegen::device`]) into host code and device kernels, as TVM's
//! OpenCL backend does. The kernels become one OpenCL C source ([`emit`]); the host code stays
//! LLVM: it checks the arguments exactly like a CPU function (device type 4, one device id) and
//! launches each kernel, in program order, on the current stream of the tensors' device,
//! without waiting ([`crate::runtime::launch`]). Everything but the emitter is the shared
//! device layer: this file only says what is OpenCL's ([`OpenClCodegen`]).
//!
//! The target's `max_num_threads` and `max_shared_memory_per_block` bound every kernel; the
//! code generator never queries a device. The runtime module keeps the source, which the
//! device runtime builds once per device on first launch
//! (`crate::device_api::opencl::OpenClProgram`), and answers `get_source("cl")`. Exporting
//! writes the source (`.cl`) or the host code with the source embedded (`.so`, `.o`, `.ll`,
//! `.s`), which kiln's loader runs.

pub mod emit;

use crate::ir::IRModule;
use crate::packed_func::DLDeviceType;
use crate::target::Target;

use super::device::{DeviceCodegen, DeviceLimits, DeviceSource, HostDeviceModule, KernelPlan};
use super::CodegenResult;

/// The OpenCL C code generator of the device layer.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenClCodegen;

impl DeviceCodegen for OpenClCodegen {
    fn kind(&self) -> &'static str {
        "opencl"
    }

    fn device_type(&self) -> DLDeviceType {
        DLDeviceType::OPENCL
    }

    fn default_limits(&self) -> DeviceLimits {
        // TVM 0.27's `opencl` kind: 256 threads; 16 KiB, OpenCL 1.2's least `__local` memory.
        DeviceLimits {
            max_threads: 256,
            max_shared_bytes: 16384,
        }
    }

    fn emit(
        &self,
        module: &IRModule,
        plans: &[KernelPlan],
        _: &Target,
    ) -> CodegenResult<DeviceSource> {
        let noalias = |func: &str| module.get(func).is_some_and(|f| f.attrs.noalias);
        emit::source(plans, &noalias).map(DeviceSource::from)
    }
}

/// Compiles `module` (already verified) for `target` (kind `opencl`).
///
/// # Errors
/// As [`HostDeviceModule::build`].
pub fn build(module: &IRModule, target: &Target) -> CodegenResult<HostDeviceModule> {
    HostDeviceModule::build(&OpenClCodegen, module, target)
}

/// The OpenCL device code of `module`: kernels, source and kernel table.
///
/// # Errors
/// As [`super::device::device_code`].
pub fn device_code(module: &IRModule, target: &Target) -> CodegenResult<super::device::DeviceCode> {
    super::device::device_code(&OpenClCodegen, module, target)
}
