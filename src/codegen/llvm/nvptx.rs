//! LLVM's NVPTX backend: NVPTX kernels (the emitter's kernel form, `emit/kernel.rs`) to PTX text.
//!
//! The kernel module is parsed, libdevice is linked in when the kernels call it (its functions
//! made internal and the unreferenced ones dropped before optimizing, so that a build pays for
//! the few functions its kernels call and not for libdevice's 350, and only what the optimizer
//! does not inline stays in the PTX, as `.func`s; TVM marks them `available_externally`, which
//! optimizes every one of them), optimized at O3 by the NVPTX target machine's pipeline
//! (which resolves libdevice's `__nvvm_reflect` queries; the module asks for IEEE denormals,
//! `nvvm-reflect-ftz` 0) and printed as PTX assembly.
//!
//! Target machines come from the backend's pool, keyed like host ones by triple, CPU
//! (`sm_86`) and features (`+ptx75`).

use std::path::PathBuf;

use inkwell::module::Linkage as LlvmLinkage;

use super::*;

/// The NVPTX target triple kiln compiles kernels for (64-bit addresses).
pub const NVPTX_TRIPLE: &str = "nvptx64-nvidia-cuda";

/// A kernel module compiled to PTX.
#[derive(Debug, Clone)]
pub struct Ptx {
    /// The PTX assembly (`.version`, `.target`, one `.entry` per kernel).
    pub ptx: String,
    /// The optimized LLVM IR it came from (libdevice's inlined functions included).
    pub ll: String,
    /// Bytes of dynamic shared memory of each kernel, in plan order (0 where its shared
    /// memory is static): a kernel over 48 KiB takes it all from the launch's dynamic shared
    /// memory.
    pub dyn_shared_bytes: Vec<u64>,
}

/// Compiles the NVPTX kernels of `plans` (kernels of `module`) for `cpu` (`sm_80`) and
/// `features` (empty: the CPU's default PTX version), linking libdevice when the kernels call
/// it; `libdevice` finds it, and is asked only then.
///
/// # Errors
/// What a kernel cannot do; kernels that need libdevice when `libdevice` finds none (its
/// error says where it looked and how to provide it); an unreadable libdevice; LLVM failures.
pub fn compile_ptx(
    module: &IRModule,
    plans: &[crate::codegen::device::KernelPlan],
    cpu: &str,
    features: &str,
    libdevice: impl FnOnce() -> Result<PathBuf, String>,
) -> R<Ptx> {
    let km = emit::kernel_module(module, plans, cpu, features)?;
    let libdevice = if km.libdevice {
        Some(libdevice().map_err(|why| {
            CodegenError::Unsupported(format!(
                "the kernels call math functions that CUDA provides in libdevice (exp, log, sin, pow, tanh, erf, ...), and {why}"
            ))
        })?)
    } else {
        None
    };
    let o = CodegenOptions {
        triple: NVPTX_TRIPLE.into(),
        cpu: cpu.into(),
        features: features.into(),
        opt_level: 3,
        fast_math: String::new(),
        device_type: crate::packed_func::DLDeviceType::CUDA.0,
        device_name: "cuda".into(),
        device_host: false,
        device_meta: None,
        stream_store_bytes: None,
    };
    jit::with_target_machine(&o, |tm| {
        let ctx = Context::create();
        jit::route_diagnostics(&ctx);
        let m = parse_and_optimize(&ctx, &km.text, &o, Passes::None, tm)?;
        if let Some(path) = &libdevice {
            let lib = LlvmIrModule::parse_bitcode_from_path(path, &ctx).map_err(|e| {
                CodegenError::Llvm(format!(
                    "cannot read libdevice `{}`: {}",
                    path.display(),
                    e.to_string()
                ))
            })?;
            lib.set_triple(&tm.get_triple());
            lib.set_data_layout(&tm.get_target_data().get_data_layout());
            m.link_in_module(lib).map_err(|e| {
                CodegenError::Llvm(format!(
                    "linking libdevice `{}` failed: {}",
                    path.display(),
                    e.to_string()
                ))
            })?;
            let mut f = m.get_first_function();
            while let Some(func) = f {
                let is_lib = func.get_name().to_bytes().starts_with(b"__nv_");
                if is_lib && func.count_basic_blocks() > 0 {
                    func.set_linkage(LlvmLinkage::Internal);
                }
                f = func.get_next_function();
            }
        }
        let pbo = PassBuilderOptions::create();
        pbo.set_loop_unrolling(true);
        // `globaldce` first: the few libdevice functions the kernels reach are all that O3
        // then optimizes (not libdevice's 350), and what it inlines disappears.
        m.run_passes("globaldce,default<O3>", tm, pbo)
            .map_err(|e| {
                CodegenError::Llvm(format!("LLVM optimization failed: {}", e.to_string()))
            })?;
        let ll = m.print_to_string().to_string();
        let buf = tm
            .write_to_memory_buffer(&m, FileType::Assembly)
            .map_err(|e| {
                CodegenError::Llvm(format!("LLVM PTX emission failed: {}", e.to_string()))
            })?;
        let ptx = String::from_utf8_lossy(buf.as_slice()).into_owned();
        Ok(Ptx {
            ptx,
            ll,
            dyn_shared_bytes: km.dyn_shared_bytes.clone(),
        })
    })?
}
