//! Code generation: IR modules to runtime modules of packed functions, and the runtime entry
//! points the generated code calls.
//!
//! # Design
//!
//! [`build`] verifies the module, then dispatches on the target kind through the global function
//! `target.build.<kind>`, as TVM does: a backend is a packed function taking the IR module and
//! the target (both passed as kiln objects) and returning a runtime [`Module`]. kiln registers
//! `target.build.llvm` (the [`llvm`] backend, behind the default `llvm` feature); a user's
//! backend registers its own.
//!
//! Device targets share one layer ([`device`]): the host/device split, the kernel plan, the
//! host/device module and the table of device code generators ([`device::BUILTIN`]), so each
//! device kind (`opencl`) only brings its emitter. The services generated code calls at run time
//! (the thread pool, the kernel-launch service, the library loader) are the runtime's
//! ([`crate::runtime`]), never the code generator's.

pub mod block;
#[cfg(feature = "llvm")]
pub(crate) mod bounds;
#[cfg(feature = "llvm")]
pub mod cache;
#[cfg(feature = "llvm")]
pub mod cuda;
pub mod device;
#[cfg(feature = "llvm")]
pub(crate) mod index;
pub mod interchange;
#[cfg(feature = "llvm")]
pub mod llvm;
#[cfg(feature = "llvm")]
pub mod opencl;
pub mod partition;
pub mod peel;
pub mod reduce;

use std::sync::Arc;

use crate::ir::{IRModule, IrError};
use crate::packed_func::Module;

/// Errors of code generation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodegenError {
    /// The module is valid IR but uses something this backend cannot compile; the message says
    /// what. Change the IR or the target.
    #[error("cannot compile: {0}")]
    Unsupported(String),
    /// LLVM refused something (a bad triple or CPU, or a kiln bug, which the message says).
    #[error("LLVM: {0}")]
    Llvm(String),
    /// No `target.build.<kind>` is registered.
    #[error("no code generator registered for target kind `{kind}` (global function `target.build.{kind}`)")]
    NoCodegen {
        /// The target kind.
        kind: String,
    },
    /// Writing files or running the linker failed.
    #[error("{0}")]
    Io(String),
    /// The module is not valid IR (the verifier's first error, with its node path). Converts
    /// to the crate error's `Ir` variant.
    #[error(transparent)]
    Ir(#[from] IrError),
    /// The code generator registered for the kind raised this error (a backend's own, or a
    /// call through the registry that failed). Converts to the crate error's `PackedFunc`
    /// variant, so its kind (`ValueError`, ...) is kept.
    #[error(transparent)]
    Backend(#[from] PackedFuncError),
}

/// How a code generation error crosses the packed-function boundary: a backend's raised error
/// as it was, an invalid module as a `ValueError`, the rest as a `RuntimeError` (the kinds the
/// crate error gives them too).
impl From<CodegenError> for PackedFuncError {
    fn from(e: CodegenError) -> Self {
        match e {
            CodegenError::Backend(p) => p,
            CodegenError::Ir(e) => PackedFuncError::Raised {
                kind: "ValueError".into(),
                message: e.to_string(),
            },
            other => PackedFuncError::Raised {
                kind: "RuntimeError".into(),
                message: other.to_string(),
            },
        }
    }
}

/// `Result` of code generation.
pub type CodegenResult<T> = Result<T, CodegenError>;

/// A runtime module, shared.
pub type ModuleRef = Arc<dyn Module>;

use crate::packed_func::{registry, Any, PackedFunc, PackedFuncError};
use crate::target::Target;

/// Compiles `module` for `target` through the code generator registered as
/// `target.build.<kind>`, after verifying the module.
///
/// ```
/// # #[cfg(feature = "llvm")] {
/// use kiln::ir::{kernels, IRModule};
/// use kiln::target::Target;
/// let module = IRModule::from_functions(vec![kernels::vadd()]);
/// let target = Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#)?;
/// let rt = kiln::codegen::build(&module, &target)?;
/// assert_eq!(rt.function_names(), ["vadd"]);
/// # }
/// # Ok::<(), kiln::Error>(())
/// ```
///
/// # Errors
/// [`CodegenError::Ir`]: the verifier's first error (with its node path);
/// [`CodegenError::NoCodegen`] when no code generator is registered for the target's kind;
/// [`CodegenError::Backend`]: whatever the code generator raised.
pub fn build(module: &IRModule, target: &Target) -> CodegenResult<ModuleRef> {
    register_builtin_codegens();
    module.verify()?;
    let kind = target.kind_name().to_owned();
    let f =
        registry::get(&format!("target.build.{kind}")).ok_or(CodegenError::NoCodegen { kind })?;
    let out = f.call_any(&[
        Any::rust_object(module.clone()),
        Any::rust_object(target.clone()),
    ])?;
    out.downcast_ref::<ModuleRef>().cloned().ok_or_else(|| {
        PackedFuncError::Raised {
            kind: "TypeError".into(),
            message: format!(
                "`{}` returned {:?}, expected a runtime module",
                f.name(),
                out
            ),
        }
        .into()
    })
}

/// Compiles `module` for `target` and writes the result to `output`: for `llvm`, a `.so`, `.o`,
/// `.ll` or `.s` by extension; for a device kind (`opencl`, `cuda`), what its code generator
/// exports (device source, or a `.so` with the kernels and their host code inside). What
/// `kiln build` writes, and what `kiln tune` uploads to a remote server.
///
/// # Errors
/// The module does not compile for the target or the file cannot be written;
/// [`CodegenError::NoCodegen`] for a kind kiln has no built-in code generator for (one
/// registered as `target.build.<kind>` builds in memory only, with [`build`]).
#[cfg(feature = "llvm")]
pub fn export_library(
    module: &IRModule,
    target: &Target,
    output: &std::path::Path,
) -> CodegenResult<()> {
    match target.kind_name() {
        "llvm" => llvm::export(module, &llvm::CodegenOptions::from_target(target)?, output),
        kind => match device::codegen_for(kind) {
            Some(cg) => device::HostDeviceModule::build(cg, module, target)?.export(output),
            None => Err(CodegenError::NoCodegen {
                kind: kind.to_owned(),
            }),
        },
    }
}

/// Wraps a Rust code generator as a `target.build.<kind>` packed function: it receives the
/// module and target and returns a runtime module, or any error that converts to a packed
/// function error (kiln's [`crate::Error`], [`CodegenError`], ...; annotate the closure's
/// return type, e.g. `-> kiln::Result<ModuleRef>`, so `?` knows what to convert to).
///
/// A kind of your own, compiled by kiln's LLVM backend (a complete backend with its own device
/// is `examples/custom_backend.rs`):
///
/// ```
/// # #[cfg(feature = "llvm")] {
/// use std::sync::Arc;
/// use kiln::codegen::{codegen_func, llvm::{CodegenOptions, LlvmModule}, ModuleRef};
/// use kiln::ir::{kernels, IRModule};
/// use kiln::target::{Target, TargetKind};
///
/// TargetKind::builder("doc_cpu", 1).option::<i64>("opt-level", Some(2)).register()?;
/// let f = codegen_func("target.build.doc_cpu", |module, target| -> kiln::Result<ModuleRef> {
///     let opts = CodegenOptions::from_target(target)?; // device type 1: CPU tensors
///     let m: ModuleRef = Arc::new(LlvmModule::jit(module, &opts)?);
///     Ok(m)
/// });
/// kiln::packed_func::registry::register("target.build.doc_cpu", f, false)?;
///
/// let module = IRModule::from_functions(vec![kernels::vadd()]);
/// let rt = kiln::codegen::build(&module, &Target::parse(r#"{"kind": "doc_cpu"}"#)?)?;
/// assert_eq!(rt.function_names(), ["vadd"]);
/// # }
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn codegen_func<F, E>(name: &str, f: F) -> PackedFunc
where
    F: Fn(&IRModule, &Target) -> Result<ModuleRef, E> + Send + Sync + 'static,
    E: Into<PackedFuncError>,
{
    let n = name.to_owned();
    PackedFunc::new(name, move |args| {
        let bad = |what: &str| PackedFuncError::Raised {
            kind: "TypeError".into(),
            message: format!("`{n}` expects (IRModule, Target), {what}"),
        };
        if args.len() != 2 {
            return Err(bad(&format!("found {} arguments", args.len())));
        }
        let m = args[0]
            .downcast_ref::<IRModule>()
            .ok_or_else(|| bad("argument #0 is not an IRModule"))?;
        let t = args[1]
            .downcast_ref::<Target>()
            .ok_or_else(|| bad("argument #1 is not a Target"))?;
        Ok(Any::rust_object(f(m, t).map_err(Into::into)?))
    })
}

/// Registers kiln's own code generators (`target.build.llvm`); idempotent.
pub fn register_builtin_codegens() {
    static ONCE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        crate::runtime::init();
        #[cfg(feature = "llvm")]
        {
            let f = codegen_func("target.build.llvm", |m, t| -> CodegenResult<ModuleRef> {
                let opts = llvm::CodegenOptions::from_target(t)?.resolved();
                let Some(cache) = cache::CompileCache::from_env() else {
                    return Ok(Arc::new(llvm::LlvmModule::jit(m, &opts)?) as ModuleRef);
                };
                let key = cache::CompileCache::key(m, &opts);
                if let Some(hit) = cache.lookup(&key, m, &opts) {
                    return Ok(hit);
                }
                let module: ModuleRef = Arc::new(llvm::LlvmModule::jit(m, &opts)?);
                cache.store_in_background(key, m.clone(), opts);
                Ok(module)
            });
            // A user may have registered their own first: theirs wins.
            let _ = registry::register("target.build.llvm", f, false);
            // Every device code generator of the device layer, by its kind.
            for cg in device::BUILTIN {
                let name = format!("target.build.{}", cg.kind());
                let f = codegen_func(&name, move |m, t| -> CodegenResult<ModuleRef> {
                    Ok(Arc::new(device::HostDeviceModule::build(*cg, m, t)?) as ModuleRef)
                });
                let _ = registry::register(&name, f, false);
            }
        }
    });
}
