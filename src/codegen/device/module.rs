//! [`HostDeviceModule`]: the runtime module of a device target, whatever its kind.

use std::path::Path;
use std::sync::Arc;

use crate::codegen::llvm::{CodegenOptions, LlvmModule};
use crate::codegen::{CodegenError, CodegenResult};
use crate::ir::rewrite::{rw_stmt, Rewriter};
use crate::ir::visit::{walk_stmt, Visitor};
use crate::ir::{Buffer, Expr, ForKind, IRModule, Stmt, StorageScope, VarId};
use crate::packed_func::{Module, PackedFunc};
use crate::runtime::DeviceModule;
use crate::target::Target;

use super::{device_code, DeviceCodegen};

/// The host code options for a device target: its `host` target's if it has one (else the
/// machine kiln runs on), with tensors of the device kind's type.
///
/// # Errors
/// A host target LLVM cannot compile for.
pub fn host_options(cg: &dyn DeviceCodegen, target: &Target) -> CodegenResult<CodegenOptions> {
    let mut o = match target.host() {
        Some(h) if h.kind_name() == "llvm" => CodegenOptions::from_target(h)?,
        _ => CodegenOptions::host(),
    };
    o.device_type = cg.device_type().0;
    o.device_name = cg.kind().into();
    o.device_host = true;
    Ok(o)
}

/// `module` with every loop nest that touches device memory outside a kernel made a kernel of
/// its own ([`crate::schedule::auto::bind_default`], TVM's `DefaultGPUSchedule`), so that a
/// function nobody scheduled runs on a device target; functions whose nests are all kernels
/// already are kept as they are.
///
/// # Errors
/// A nest the default schedule cannot bind, named with its function.
pub fn default_kernels(
    cg: &dyn DeviceCodegen,
    module: &IRModule,
    target: &Target,
) -> CodegenResult<IRModule> {
    let limits = super::DeviceLimits::of(target, cg.default_limits());
    let mut out = module.clone();
    for f in &mut out.functions {
        if f.attrs.host {
            if !crate::ir::device::kernels(f).is_empty() {
                return Err(CodegenError::Unsupported(format!(
                    "function `{}` is a host function (attrs.host, TVM's tir.is_host_func) but \
                     has thread-bound loops: a host function launches no kernels",
                    f.name
                )));
            }
            continue;
        }
        let mut g = crate::schedule::auto::device_default(f, limits.max_threads).map_err(|e| {
            CodegenError::Unsupported(format!(
                "function `{}` has loops outside any kernel, and the default device schedule \
                 refuses them: {e}",
                f.name
            ))
        })?;
        g.body = promote_host_locals(&g.body);
        *f = g;
    }
    Ok(out)
}

/// `s` with every `local` allocation of the host that a kernel uses made a `workspace`
/// allocation (device memory for the call). TVM's lowering allocates a reduction's
/// intermediate (`argmax`'s `A_red_temp`) as `local` at the top of the function; on the CPU
/// that is the stack, but a kernel cannot reach the host's stack.
fn promote_host_locals(s: &Stmt) -> Stmt {
    match s {
        Stmt::For {
            kind: ForKind::ThreadBinding(_),
            ..
        } => s.clone(),
        Stmt::Allocate { buffer, body }
            if buffer.scope == StorageScope::Local && kernel_uses(body, buffer.data.id) =>
        {
            let mut b = buffer.clone();
            b.scope = StorageScope::Workspace;
            let mut r = Rescope(b.clone());
            let body = rw_stmt(&mut r, &promote_host_locals(body));
            Stmt::Allocate {
                buffer: b,
                body: Box::new(body),
            }
        }
        _ => s.map_children(promote_host_locals),
    }
}

/// Whether a thread-bound loop nest in `s` uses the buffer `id`.
fn kernel_uses(s: &Stmt, id: VarId) -> bool {
    struct Find(VarId, bool);
    impl Visitor for Find {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::For {
                kind: ForKind::ThreadBinding(_),
                ..
            } = s
            {
                if s.free_uses().buffers.iter().any(|b| b.data.id == self.0) {
                    self.1 = true;
                }
                return;
            }
            walk_stmt(self, s);
        }
        fn expr(&mut self, _: &Expr) {}
    }
    let mut f = Find(id, false);
    f.stmt(s);
    f.1
}

/// Gives every access of a buffer the scope of `.0`.
struct Rescope(Buffer);

impl Rewriter for Rescope {
    fn post_expr(&mut self, e: Expr) -> Expr {
        match e {
            Expr::Load { buffer, indices } if buffer.data.id == self.0.data.id => Expr::Load {
                buffer: self.0.clone(),
                indices,
            },
            e => e,
        }
    }
    fn post_store(&mut self, buffer: Buffer, indices: Vec<Expr>, value: Expr) -> Stmt {
        let buffer = if buffer.data.id == self.0.data.id {
            self.0.clone()
        } else {
            buffer
        };
        Stmt::Store {
            buffer,
            indices,
            value,
        }
    }
}

/// A module compiled for a device target: host functions in-process (JIT), kernels loaded by
/// the device runtime (built by the driver on first launch).
pub struct HostDeviceModule {
    host: LlvmModule,
    device: Arc<DeviceModule>,
    /// Other views of the device code (`ll` of CUDA kernels), by `get_source` format.
    other_formats: Vec<(&'static str, String)>,
    ir: IRModule,
    opts: CodegenOptions,
}

impl std::fmt::Debug for HostDeviceModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostDeviceModule")
            .field("kind", &self.device.kind())
            .field("host", &self.host)
            .field("device", &self.device)
            .finish()
    }
}

impl HostDeviceModule {
    /// Compiles `module` (already verified) for `target` with the device code generator `cg`.
    ///
    /// # Errors
    /// As [`device_code`], the host code generator's errors, and a device runtime that cannot
    /// load the kind's code.
    pub fn build(
        cg: &dyn DeviceCodegen,
        module: &IRModule,
        target: &Target,
    ) -> CodegenResult<Self> {
        let scheduled = default_kernels(cg, module, target)?;
        let module = &scheduled;
        let code = device_code(cg, module, target)?;
        let mut opts = host_options(cg, target)?;
        let device = DeviceModule::load(cg.kind(), code.source, code.kernels)
            .map_err(CodegenError::Unsupported)?;
        let device = Arc::new(device);
        let host = LlvmModule::jit_device(module, &opts, device.clone())?;
        // Only an export embeds the metadata; the JIT has the device module itself.
        opts.device_meta = Some(DeviceModule::meta_json(
            device.kind(),
            device.source(),
            device.kernels(),
        ));
        Ok(HostDeviceModule {
            host,
            device,
            other_formats: code.other_formats,
            ir: module.clone(),
            opts,
        })
    }

    /// The device source of the kernels.
    pub fn source(&self) -> &str {
        self.device.source()
    }

    /// The device module (kernel table and launcher).
    pub fn device(&self) -> &Arc<DeviceModule> {
        &self.device
    }

    /// Writes the module: the device source for the kind's source extension (`.cl`, `.ptx`);
    /// `.so` a library of the host code with the source embedded (kiln's loader runs it);
    /// `.o`, `.ll`, `.s` the host code.
    ///
    /// # Errors
    /// An unknown extension, I/O, LLVM and linker failures.
    pub fn export(&self, path: &Path) -> CodegenResult<()> {
        let ext = path.extension().and_then(|e| e.to_str());
        if ext.is_some() && ext == self.device.source_formats().first().copied() {
            return std::fs::write(path, self.source())
                .map_err(|e| CodegenError::Io(format!("writing `{}`: {e}", path.display())));
        }
        crate::codegen::llvm::export(&self.ir, &self.opts, path)
    }

    /// The host code's module (its options, its optimized code).
    pub fn host(&self) -> &LlvmModule {
        &self.host
    }
}

impl Module for HostDeviceModule {
    fn type_key(&self) -> &str {
        self.device.kind()
    }

    fn get_function(&self, name: &str) -> Option<PackedFunc> {
        self.host.get_function(name)
    }

    fn function_names(&self) -> Vec<String> {
        self.host.function_names()
    }

    fn get_source(&self, format: &str) -> Option<String> {
        if format.is_empty() || self.device.answers(format) {
            Some(self.source().to_owned())
        } else if let Some((_, text)) = self.other_formats.iter().find(|(f, _)| *f == format) {
            Some(text.clone())
        } else {
            self.host.get_source(format)
        }
    }
}
