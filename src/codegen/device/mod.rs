//! The device layer every device code generator shares: the host/device split, the kernel plan,
//! the launch ABI, the host/device module, and the table of device code generators.
//!
//! # Design
//!
//! A function with thread-bound loop nests runs on two processors. Each outermost thread-bound
//! nest is a device kernel; everything else is host code. For any device kind:
//!
//! ```text
//! IRModule ──► plan::plan_module ──► [KernelPlan] ─┬─► DeviceCodegen::emit ──► device source (OpenCL C, PTX)
//!                                                  │        └─► runtime::DeviceModule::load(kind, source, kernels)
//!                                                  └─► llvm (host code): argument checks of the
//!                                                      kind's device type; each nest becomes a
//!                                                      launch through `__KilnDeviceLaunch`
//! ```
//!
//! - [`plan`] finds the kernels and what they capture; the host and device generators read the
//!   same [`KernelPlan`], so they cannot disagree on a kernel's parameters.
//! - The launch ABI is the runtime's ([`crate::runtime::launch`]): the host code passes the
//!   kernel index, `{value, extra}` pairs (a buffer's handle and byte span, a scalar's bits) and
//!   the grid and block extents; the kernel table ([`kernel_infos`]) gives their types in
//!   DLPack terms.
//! - [`HostDeviceModule`] is the runtime module of any device kind: the host code (JIT) and the
//!   device module, `get_source` of either, and export (the device source by its extension,
//!   or a library with the source embedded as `__kiln_device_meta`).
//! - A device code generator implements [`DeviceCodegen`] (its kind, device type, default
//!   limits and the emitter) and appears once in [`BUILTIN`]; the command
//!   line, `target.build.<kind>` and the conformance tests find it there. Adding `cuda` is a
//!   folder `codegen/cuda/` and one line here, and a line in the runtime's table of kernel
//!   loaders (`crate::runtime::device_module::BUILTIN_LOADERS`), which also names the source's
//!   formats (`cl`, `ptx`).

pub mod plan;

#[cfg(feature = "llvm")]
mod module;

#[cfg(feature = "llvm")]
pub use module::HostDeviceModule;
pub use plan::{c_name, plan_function, plan_module, span_elements, KernelParam, KernelPlan};

use crate::device_api::kernel::{KernelInfo, KernelParamKind};
use crate::ir::IRModule;
use crate::packed_func::DLDeviceType;
use crate::target::Target;

use super::{CodegenError, CodegenResult};

/// A device code generator: how one target kind turns planned kernels into device source.
///
/// The rest (the split, the host code, limits, the runtime module, export) is shared.
pub trait DeviceCodegen: Send + Sync {
    /// The target kind (`opencl`); also the kind of the device modules it makes, and the name
    /// of the device its tensors live on.
    fn kind(&self) -> &'static str;

    /// The DLPack device type the host code checks its tensors against.
    fn device_type(&self) -> DLDeviceType;

    /// The threads per block and shared-memory bytes per block a kernel may use when the
    /// target does not say (`max_num_threads`, `max_shared_memory_per_block`).
    fn default_limits(&self) -> DeviceLimits;

    /// The device source of `plans` (kernels of `module`, checked against the limits).
    ///
    /// # Errors
    /// What the device language cannot express.
    fn emit(
        &self,
        module: &IRModule,
        plans: &[KernelPlan],
        target: &Target,
    ) -> CodegenResult<DeviceSource>;
}

/// What a device code generator emits for the kernels of a module.
#[derive(Debug, Clone, Default)]
pub struct DeviceSource {
    /// The device source the runtime loads (OpenCL C, PTX).
    pub source: String,
    /// Other views of the device code that `get_source` answers by name (CUDA: `ll`, the
    /// kernels' LLVM IR).
    pub other_formats: Vec<(&'static str, String)>,
    /// Bytes of dynamic shared memory of each kernel, in plan order (empty: none uses any).
    pub dyn_shared_bytes: Vec<u64>,
}

impl From<String> for DeviceSource {
    fn from(source: String) -> Self {
        DeviceSource {
            source,
            ..Default::default()
        }
    }
}

/// A device's launch limits, as a target states them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Threads per block (`max_num_threads`).
    pub max_threads: i64,
    /// Shared memory per block, in bytes (`max_shared_memory_per_block`).
    pub max_shared_bytes: i64,
}

impl DeviceLimits {
    /// The limits `target` states, `defaults` where it is silent.
    pub fn of(target: &Target, defaults: DeviceLimits) -> Self {
        DeviceLimits {
            max_threads: target
                .get_int("max_num_threads")
                .unwrap_or(defaults.max_threads),
            max_shared_bytes: target
                .get_int("max_shared_memory_per_block")
                .unwrap_or(defaults.max_shared_bytes),
        }
    }
}

/// kiln's device code generators. Adding one is one line here.
#[cfg(feature = "llvm")]
pub const BUILTIN: &[&dyn DeviceCodegen] =
    &[&super::opencl::OpenClCodegen, &super::cuda::CudaCodegen];
/// kiln's device code generators (none without the `llvm` feature: host code needs LLVM).
#[cfg(not(feature = "llvm"))]
pub const BUILTIN: &[&dyn DeviceCodegen] = &[];

/// The device code generator of target kind `kind`, if kiln has one.
pub fn codegen_for(kind: &str) -> Option<&'static dyn DeviceCodegen> {
    BUILTIN.iter().copied().find(|c| c.kind() == kind)
}

/// The device code of `module` for `target`: its kernels, their source and their table, after
/// checking every kernel against the target's limits.
#[derive(Debug, Clone)]
pub struct DeviceCode {
    /// The kernels, in module order.
    pub plans: Vec<KernelPlan>,
    /// The device source.
    pub source: String,
    /// Other views of the device code, by `get_source` format ([`DeviceSource`]).
    pub other_formats: Vec<(&'static str, String)>,
    /// The kernel table the runtime launches from.
    pub kernels: Vec<KernelInfo>,
}

/// Plans, checks and emits the device code of `module`.
///
/// # Errors
/// A kernel over the target's threads or shared memory per block, a kernel the split cannot
/// launch, and what the device language cannot express.
pub fn device_code(
    cg: &dyn DeviceCodegen,
    module: &IRModule,
    target: &Target,
) -> CodegenResult<DeviceCode> {
    let limits = DeviceLimits::of(target, cg.default_limits());
    for f in &module.functions {
        crate::ir::device::check_device_limits(f, limits.max_threads, limits.max_shared_bytes)
            .map_err(|e| CodegenError::Unsupported(e.to_string()))?;
    }
    let plans = plan_module(module)?;
    let emitted = cg.emit(module, &plans, target)?;
    let mut kernels = kernel_infos(&plans);
    for (k, bytes) in kernels.iter_mut().zip(&emitted.dyn_shared_bytes) {
        k.dyn_shared_bytes = *bytes;
    }
    Ok(DeviceCode {
        plans,
        source: emitted.source,
        other_formats: emitted.other_formats,
        kernels,
    })
}

/// The runtime's kernel table of `plans`: names and parameter kinds in DLPack types.
pub fn kernel_infos(plans: &[KernelPlan]) -> Vec<KernelInfo> {
    plans
        .iter()
        .map(|p| KernelInfo {
            name: p.name.clone(),
            dyn_shared_bytes: 0,
            params: p
                .params
                .iter()
                .map(|kp| match kp {
                    KernelParam::Buffer(b) => KernelParamKind::Buffer(b.dtype.into()),
                    KernelParam::Scalar(v) => KernelParamKind::Scalar(v.dtype.into()),
                })
                .collect(),
        })
        .collect()
}
