//! Exporting: the module compiled to an object (or `.ll`/`.s` text) and linked into a shared
//! library with the export runtime (`runtime/export_rt.c`) where it needs it.

use super::*;

/// Generates `module`'s LLVM IR for `linkage`, optimizes it and emits an object or assembly,
/// with a target machine from the process's pool.
pub(super) fn compile_object(
    module: &IRModule,
    o: &CodegenOptions,
    linkage: &Linkage,
    ft: FileType,
) -> R<Vec<u8>> {
    let mut text = generate_ir(module, o, linkage)?;
    if let Linkage::Export = linkage {
        add_device_meta(&mut text, o);
    }
    compile_text(&text, o, Passes::Default, ft)
}

/// Appends an exported library's device code and kernel table (`o.device_meta`), for kiln's
/// loader (`runtime::device_module`), as the constant string `__kiln_device_meta`.
pub(super) fn add_device_meta(text: &mut String, o: &CodegenOptions) {
    if let Some(meta) = &o.device_meta {
        let len = meta.len() + 1;
        let _ = writeln!(
            text,
            "@__kiln_device_meta = constant [{len} x i8] c\"{}\", align 1",
            emit::c_string(meta)
        );
    }
}

/// Parses, optimizes and emits LLVM IR text as an object or assembly, with a target machine
/// from the process's pool.
pub(crate) fn compile_text(
    text: &str,
    o: &CodegenOptions,
    passes: Passes,
    ft: FileType,
) -> R<Vec<u8>> {
    with_optimized(text, o, passes, |m, tm| {
        let buf = tm.write_to_memory_buffer(m, ft).map_err(|e| {
            CodegenError::Llvm(format!("LLVM code emission failed: {}", e.to_string()))
        })?;
        Ok(buf.as_slice().to_vec())
    })
}

/// Runs `then` on LLVM IR text parsed and optimized with a target machine from the pool.
pub(super) fn with_optimized<T>(
    text: &str,
    o: &CodegenOptions,
    passes: Passes,
    then: impl FnOnce(&LlvmIrModule<'_>, &TargetMachine) -> R<T>,
) -> R<T> {
    jit::with_target_machine(o, |tm| {
        let ctx = Context::create();
        jit::route_diagnostics(&ctx);
        let m = parse_and_optimize(&ctx, text, o, passes, tm)?;
        then(&m, tm)
    })?
}

/// The optimized LLVM IR of `module` as exported.
pub(super) fn optimized_ll(module: &IRModule, o: &CodegenOptions) -> R<String> {
    let o = o.clone().resolved();
    let mut text = generate_ir(module, &o, &Linkage::Export)?;
    add_device_meta(&mut text, &o);
    with_optimized(&text, &o, Passes::Default, |m, _| {
        Ok(m.print_to_string().to_string())
    })
}

/// Compiles for export and returns the object or assembly bytes.
pub(super) fn compile_to(module: &IRModule, o: &CodegenOptions, ft: FileType) -> R<Vec<u8>> {
    compile_object(module, &o.clone().resolved(), &Linkage::Export, ft)
}

/// Writes `module` compiled with `o` to `path` (`.so`, `.o`, `.ll`, `.s`).
///
/// # Errors
/// As [`LlvmModule::export`].
pub fn export(module: &IRModule, o: &CodegenOptions, path: &Path) -> R<()> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let io = |e: std::io::Error| CodegenError::Io(format!("writing `{}`: {e}", path.display()));
    match ext {
        "o" => {
            let obj = compile_to(module, o, FileType::Object)?;
            if !uses_export_runtime(&obj) {
                return std::fs::write(path, obj).map_err(io);
            }
            // One relocatable object with the runtime inside (a partial link).
            link(&obj, true, path, &["-r", "-nostdlib"], &[])
        }
        "s" => std::fs::write(path, compile_to(module, o, FileType::Assembly)?).map_err(io),
        "ll" => std::fs::write(path, optimized_ll(module, o)?).map_err(io),
        "so" => {
            let obj = compile_to(module, o, FileType::Object)?;
            // The runtime only when the code calls it: linking it costs about 4 ms.
            let rt = uses_export_runtime(&obj);
            link(&obj, rt, path, &["-shared", "-fPIC", "-pthread"], &["-lm"])
        }
        other => Err(CodegenError::Unsupported(format!(
            "cannot export to `{}`: expected a path ending in .so, .o, .ll or .s, found extension `{other}`",
            path.display()
        ))),
    }
}

/// The runtime of exported libraries (`src/runtime/export_rt.c`: the persistent thread pool
/// and the workspace cache for hosts that fill no context slot), compiled when kiln was built.
const EXPORT_RUNTIME: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kiln_export_rt.o"));

/// Whether an object file calls the export runtime (its symbols are all `__kiln_rt_*`).
fn uses_export_runtime(obj: &[u8]) -> bool {
    obj.windows(10).any(|w| w == b"__kiln_rt_")
}

/// Links the object `obj`, with the export runtime when `runtime`, into `path` with the C
/// compiler (`$CC`, else `cc`), `flags` and then the libraries `libs`.
///
/// The libraries come after the objects: a `-lm` before them is dropped, and the library's
/// `expf`, `logf`, `powf`, ... are then unversioned references, which the dynamic loader binds
/// to glibc's oldest versions (e.g. `expf@GLIBC_2.2.5`, about twice as slow as the current one).
fn link(obj: &[u8], runtime: bool, path: &Path, flags: &[&str], libs: &[&str]) -> R<()> {
    let dir = tempfile::tempdir()
        .map_err(|e| CodegenError::Io(format!("creating a temporary directory: {e}")))?;
    let write = |name: &str, bytes: &[u8]| -> R<std::path::PathBuf> {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes)
            .map_err(|e| CodegenError::Io(format!("writing `{}`: {e}", p.display())))?;
        Ok(p)
    };
    let objp = write("module.o", obj)?;
    let mut cmd = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(flags).arg("-o").arg(path).arg(&objp);
    if runtime {
        cmd.arg(write("kiln_export_rt.o", EXPORT_RUNTIME)?);
    }
    cmd.args(libs);
    let cc = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|e| {
        CodegenError::Io(format!(
            "running the C compiler `{cc}` to link `{}`: {e}",
            path.display()
        ))
    })?;
    if !out.status.success() {
        return Err(CodegenError::Io(format!(
            "linking `{}` with `{cc}` failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}
