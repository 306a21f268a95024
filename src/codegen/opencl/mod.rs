//! The OpenCL backend: `target.build.opencl`, for TVM 0.27's `opencl` target kind.
//!
//! A module is split (`super::device`) into host code and device kernels, as TVM's OpenCL
//! backend does. The kernels become one OpenCL C source ([`emit`]); the host code stays LLVM
//! ([`super::llvm`]): it checks the arguments exactly like a CPU function (device type 4, one
//! device id) and launches each kernel, in program order, on the current stream of the
//! tensors' device, without waiting ([`crate::device_api::kernels`]).
//!
//! The target's `max_num_threads` and `max_shared_memory_per_block` bound every kernel; the
//! code generator never queries a device. The runtime module ([`OpenClModule`]) keeps the
//! source, which the device runtime builds once per device on first launch
//! (`crate::device_api::opencl::OpenClProgram`), and answers `get_source("cl")`. Exporting writes
//! the source (`.cl`) or the host code with the source embedded (`.so`, `.o`, `.ll`, `.s`),
//! which kiln's loader runs.

pub mod emit;

use std::path::Path;
use std::sync::Arc;

use crate::device_api::kernels::{DeviceModule, KernelInfo, KernelParamKind};
use crate::ir::IRModule;
use crate::packed_func::{Module, PackedFunc};
use crate::target::Target;

use super::device::{plan_module, KernelParam, KernelPlan};
use super::llvm::{CodegenOptions, LlvmModule};
use super::{CodegenError, CodegenResult};

/// DLPack's device type of OpenCL (`kDLOpenCL`).
pub const DEVICE_TYPE: i32 = 4;

/// The host code options for an `opencl` target: its `host` target's if it has one (else the
/// machine kiln runs on), with OpenCL tensors.
///
/// # Errors
/// A host target LLVM cannot compile for.
pub fn host_options(target: &Target) -> CodegenResult<CodegenOptions> {
    let mut o = match target.host() {
        Some(h) if h.kind_name() == "llvm" => CodegenOptions::from_target(h)?,
        _ => CodegenOptions::host(),
    };
    o.device_type = DEVICE_TYPE;
    o.device_name = "opencl".into();
    o.device_host = true;
    Ok(o)
}

/// The device code of `module`: its kernels and their OpenCL C source, after checking every
/// kernel against the target's limits.
///
/// # Errors
/// A kernel over the target's `max_num_threads` or `max_shared_memory_per_block`, and what the
/// OpenCL C generator cannot express.
pub fn device_code(
    module: &IRModule,
    target: &Target,
) -> CodegenResult<(Vec<KernelPlan>, String, Vec<KernelInfo>)> {
    let max_threads = target.get_int("max_num_threads").unwrap_or(256);
    let max_shared = target
        .get_int("max_shared_memory_per_block")
        .unwrap_or(16384);
    for f in &module.functions {
        crate::ir::device::check_device_limits(f, max_threads, max_shared)
            .map_err(|e| CodegenError::Unsupported(e.to_string()))?;
    }
    let plans = plan_module(module)?;
    let noalias = |func: &str| module.get(func).is_some_and(|f| f.attrs.noalias);
    let source = emit::source(&plans, &noalias)?;
    let infos = plans
        .iter()
        .map(|p| KernelInfo {
            name: p.name.clone(),
            params: p
                .params
                .iter()
                .map(|kp| match kp {
                    KernelParam::Buffer(b) => KernelParamKind::Buffer(b.dtype),
                    KernelParam::Scalar(v) => KernelParamKind::Scalar(v.dtype),
                })
                .collect(),
        })
        .collect();
    Ok((plans, source, infos))
}

/// A module compiled for `opencl`: host functions in-process (JIT), kernels built by the
/// OpenCL driver on first launch.
pub struct OpenClModule {
    host: LlvmModule,
    device: Arc<DeviceModule>,
    ir: IRModule,
    opts: CodegenOptions,
}

impl std::fmt::Debug for OpenClModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClModule")
            .field("host", &self.host)
            .field("device", &self.device)
            .finish()
    }
}

impl OpenClModule {
    /// Compiles `module` (already verified) for `target` (kind `opencl`).
    ///
    /// # Errors
    /// As [`device_code`], and the host code generator's errors.
    pub fn build(module: &IRModule, target: &Target) -> CodegenResult<Self> {
        let (_, source, infos) = device_code(module, target)?;
        let mut opts = host_options(target)?;
        let program = crate::device_api::opencl::OpenClProgram::new(source.clone());
        let device = Arc::new(DeviceModule::new(
            "opencl",
            source.clone(),
            infos.clone(),
            Box::new(program),
        ));
        let host = LlvmModule::jit_device(module, &opts, device.clone())?;
        opts.device_meta = Some(DeviceModule::meta_json("opencl", &source, &infos));
        Ok(OpenClModule {
            host,
            device,
            ir: module.clone(),
            opts,
        })
    }

    /// The OpenCL C source of the kernels.
    pub fn source(&self) -> &str {
        self.device.source()
    }

    /// Writes the module: `.cl` the kernels' OpenCL C source; `.so` a library of the host code
    /// with the source embedded (kiln's loader runs it); `.o`, `.ll`, `.s` the host code.
    ///
    /// # Errors
    /// An unknown extension, I/O, LLVM and linker failures.
    pub fn export(&self, path: &Path) -> CodegenResult<()> {
        if path.extension().and_then(|e| e.to_str()) == Some("cl") {
            return std::fs::write(path, self.source())
                .map_err(|e| CodegenError::Io(format!("writing `{}`: {e}", path.display())));
        }
        super::llvm::export(&self.ir, &self.opts, path)
    }

    /// The host code's module (its options, its optimized code).
    pub fn host(&self) -> &LlvmModule {
        &self.host
    }
}

impl Module for OpenClModule {
    fn type_key(&self) -> &str {
        "opencl"
    }

    fn get_function(&self, name: &str) -> Option<PackedFunc> {
        self.host.get_function(name)
    }

    fn function_names(&self) -> Vec<String> {
        self.host.function_names()
    }

    fn get_source(&self, format: &str) -> Option<String> {
        match format {
            "cl" | "opencl" | "" => Some(self.source().to_owned()),
            other => self.host.get_source(other),
        }
    }
}
