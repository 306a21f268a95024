//! [`HostDeviceModule`]: the runtime module of a device target, whatever its kind.

use std::path::Path;
use std::sync::Arc;

use crate::codegen::llvm::{CodegenOptions, LlvmModule};
use crate::codegen::{CodegenError, CodegenResult};
use crate::ir::IRModule;
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
        let g = crate::schedule::auto::device_default(f, limits.max_threads).map_err(|e| {
            CodegenError::Unsupported(format!(
                "function `{}` has loops outside any kernel, and the default device schedule \
                 refuses them: {e}",
                f.name
            ))
        })?;
        *f = g;
    }
    Ok(out)
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
