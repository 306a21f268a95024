//! The CUDA backend: `target.build.cuda`, for TVM 0.27's `cuda` target kind, through LLVM's
//! NVPTX backend.
//!
//! A module is split ([`crate::codegen::device`]) into host code and device kernels, exactly as
//! for OpenCL; the kernels are written by the LLVM backend's own emitter in its kernel form
//! (`codegen/llvm/emit/kernel.rs`: thread ids, shared memory in address space 3, barriers,
//! libdevice math) and compiled to PTX by LLVM's NVPTX backend
//! ([`crate::codegen::llvm::nvptx`]). The host code checks the arguments (device type 2,
//! `kDLCUDA`) and launches each kernel on the current stream of the tensors' device through
//! the runtime ([`crate::runtime::launch`]); the CUDA runtime (`crate::device_api::cuda`)
//! loads the PTX once per device, on first launch, and the driver compiles it for the GPU.
//!
//! # The PTX architecture
//!
//! The target's `arch` (`sm_90a`; `mcpu` when `arch` is absent) names the GPU. LLVM 14's
//! NVPTX backend knows architectures up to `sm_86` and PTX ISA 7.5; asked for `sm_90` it warns
//! and writes PTX that ptxas rejects (`.version 3.2` with `.target sm_90`). kiln therefore
//! compiles for the newest architecture LLVM knows that is not newer than the target's
//! ([`PtxArch::of`]), with that architecture's default PTX version, and the driver compiles that
//! PTX for the actual GPU when the module is loaded (PTX is forward compatible; a cubin is
//! not). An H100 (`sm_90`) gets `sm_86` PTX 7.1. `kiln target --resolve` shows the choice.
//! Targets older than `sm_50` are refused: CUDA 12 and newer build nothing older.
//!
//! # libdevice
//!
//! `exp`, `log`, `sin`, `pow`, `tanh`, `erf`, ... come from NVIDIA's libdevice
//! (`libdevice.10.bc`), linked into the kernels that call them ([`libdevice_path`]: the
//! `KILN_LIBDEVICE` variable, then a CUDA toolkit). Kernels that do not call them need nothing
//! but kiln; a kernel that does, without libdevice, is an error that says how to get it.

use std::path::PathBuf;

use crate::ir::IRModule;
use crate::packed_func::DLDeviceType;
use crate::target::Target;

use super::device::{DeviceCodegen, DeviceLimits, DeviceSource, HostDeviceModule, KernelPlan};
use super::llvm::nvptx;
use super::{CodegenError, CodegenResult};

/// The architectures LLVM 14's NVPTX backend knows (`llc -march=nvptx64 -mcpu=help`), oldest
/// first, each with the PTX ISA version LLVM writes for it by default.
pub const LLVM_SM: &[(u32, &str)] = &[
    (20, "3.2"),
    (21, "3.2"),
    (30, "3.2"),
    (32, "4.0"),
    (35, "3.2"),
    (37, "4.1"),
    (50, "4.0"),
    (52, "4.1"),
    (53, "4.2"),
    (60, "5.0"),
    (61, "5.0"),
    (62, "5.0"),
    (70, "6.0"),
    (72, "6.1"),
    (75, "6.3"),
    (80, "7.0"),
    (86, "7.1"),
];

/// The oldest architecture kiln compiles for (CUDA 12's ptxas and drivers start there).
pub const MIN_SM: u32 = 50;

/// The PTX architecture kiln compiles a `cuda` target for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxArch {
    /// The architecture the target names (`sm_90a`).
    pub requested: String,
    /// Its compute capability times ten (90).
    pub requested_sm: u32,
    /// The architecture of the PTX (`sm_86`): the newest LLVM knows, not newer than requested.
    pub sm: u32,
    /// The PTX ISA version of the PTX (`7.1`).
    pub ptx_version: &'static str,
}

impl PtxArch {
    /// The PTX architecture of `target` (kind `cuda` or `nvptx`): its `arch` (or `mcpu`),
    /// capped at what LLVM 14 knows.
    ///
    /// # Errors
    /// An arch that is not `sm_<digits>[a|f]`, or older than [`MIN_SM`].
    pub fn of(target: &Target) -> CodegenResult<PtxArch> {
        let requested = target
            .get_str("arch")
            .or_else(|| target.get_str("mcpu"))
            .unwrap_or("sm_50")
            .to_owned();
        Self::from_arch(&requested)
    }

    /// The PTX architecture for the arch name `requested` (`sm_90a`).
    ///
    /// # Errors
    /// As [`PtxArch::of`].
    pub fn from_arch(requested: &str) -> CodegenResult<PtxArch> {
        let digits = requested
            .strip_prefix("sm_")
            .map(|r| r.trim_end_matches(['a', 'f']))
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u32>().ok())
            .ok_or_else(|| {
                CodegenError::Unsupported(format!(
                    "cuda target: arch must be `sm_<compute capability>` such as `sm_80` or `sm_90a`, found `{requested}`"
                ))
            })?;
        if digits < MIN_SM {
            return Err(CodegenError::Unsupported(format!(
                "cuda target: arch `{requested}` is older than sm_{MIN_SM}, the oldest that CUDA 12 and newer build for"
            )));
        }
        let &(sm, ptx_version) = LLVM_SM
            .iter()
            .rev()
            .find(|(sm, _)| *sm <= digits)
            .unwrap_or(&LLVM_SM[0]);
        Ok(PtxArch {
            requested: requested.to_owned(),
            requested_sm: digits,
            sm,
            ptx_version,
        })
    }

    /// LLVM's CPU name for it (`sm_86`).
    pub fn cpu(&self) -> String {
        format!("sm_{}", self.sm)
    }

    /// One line saying what is compiled and why (for `kiln target --resolve`).
    pub fn describe(&self) -> String {
        if self.sm == self.requested_sm {
            format!(
                "PTX for {} (PTX ISA {}), compiled by LLVM 14's NVPTX backend",
                self.cpu(),
                self.ptx_version
            )
        } else {
            format!(
                "PTX for {} (PTX ISA {}): LLVM 14's NVPTX backend goes up to sm_86, so {} gets the newest PTX it can write, which the CUDA driver compiles for the GPU when it loads the module",
                self.cpu(),
                self.ptx_version,
                self.requested
            )
        }
    }
}

/// Where libdevice is: `KILN_LIBDEVICE` if set, else the first of `$CUDA_HOME`, `$CUDA_PATH`,
/// `/usr/local/cuda` (`nvvm/libdevice/libdevice.10.bc`) and Debian's
/// `/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc` that exists.
///
/// # Errors
/// Where kiln looked and how to get it (the text completes "the kernels call math functions
/// that CUDA provides in libdevice, and ...").
pub fn libdevice_path() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("KILN_LIBDEVICE") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "KILN_LIBDEVICE names `{}`, which is not a file",
                p.display()
            ))
        };
    }
    let mut tried = Vec::new();
    let roots = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .chain([PathBuf::from("/usr/local/cuda")]);
    let mut candidates: Vec<PathBuf> = roots
        .map(|r| r.join("nvvm/libdevice/libdevice.10.bc"))
        .collect();
    candidates.push(PathBuf::from(
        "/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc",
    ));
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
        tried.push(c.display().to_string());
    }
    Err(format!(
        "no libdevice was found (looked for {}); set KILN_LIBDEVICE to a libdevice.10.bc, e.g. from `pip install nvidia-cuda-nvcc-cu12` (`<site-packages>/nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc`), or use `fast_exp` instead of `exp`",
        tried.join(", ")
    ))
}

/// The CUDA code generator of the device layer (kernels through LLVM's NVPTX backend).
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaCodegen;

impl DeviceCodegen for CudaCodegen {
    fn kind(&self) -> &'static str {
        "cuda"
    }

    fn device_type(&self) -> DLDeviceType {
        DLDeviceType::CUDA
    }

    fn default_limits(&self) -> DeviceLimits {
        // TVM 0.27's `cuda` kind: 1024 threads; 48 KiB, what every CUDA GPU gives a block
        // without opting in (a target that states more gets dynamic shared memory).
        DeviceLimits {
            max_threads: 1024,
            max_shared_bytes: 48 * 1024,
        }
    }

    fn emit(
        &self,
        module: &IRModule,
        plans: &[KernelPlan],
        target: &Target,
    ) -> CodegenResult<DeviceSource> {
        let arch = PtxArch::of(target)?;
        let out = nvptx::compile_ptx(module, plans, &arch.cpu(), "", libdevice_path)?;
        for (p, &bytes) in plans.iter().zip(&out.dyn_shared_bytes) {
            if bytes > 0 && arch.requested_sm < 70 {
                return Err(CodegenError::Unsupported(format!(
                    "CUDA kernel `{}` uses {bytes} bytes of shared memory; more than 48 KiB per block needs sm_70 or newer, and the target's arch is {}",
                    p.name, arch.requested
                )));
            }
        }
        Ok(DeviceSource {
            source: out.ptx,
            other_formats: vec![("ll", out.ll)],
            dyn_shared_bytes: out.dyn_shared_bytes,
        })
    }
}

/// Compiles `module` (already verified) for `target` (kind `cuda`).
///
/// # Errors
/// As [`HostDeviceModule::build`].
pub fn build(module: &IRModule, target: &Target) -> CodegenResult<HostDeviceModule> {
    HostDeviceModule::build(&CudaCodegen, module, target)
}

/// The CUDA device code of `module`: kernels, PTX and kernel table.
///
/// # Errors
/// As [`super::device::device_code`].
pub fn device_code(module: &IRModule, target: &Target) -> CodegenResult<super::device::DeviceCode> {
    super::device::device_code(&CudaCodegen, module, target)
}
