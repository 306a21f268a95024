//! kiln's compiler for Python: a shared library that `tvm_ffi.load_module` loads, whose
//! functions are tvm-ffi packed functions (`__tvm_ffi_<name>` symbols, the same ABI as the
//! kernels kiln builds). Python's `kiln` package (`python/kiln/`) calls them in-process:
//!
//! | function | arguments | returns |
//! |---|---|---|
//! | `version` | | kiln's version |
//! | `build` | kiln IR (JSON text), target (JSON or legacy text), output path, options (JSON) | JSON: `{"functions": [...], "target": {...}, "parallel": {function: [loops]}, "ms": ...}` |
//! | `jit` | kiln IR (JSON text), target, symbol prefix, options | the same JSON; the functions are compiled in memory and registered as tvm-ffi system-library symbols `__tvm_ffi_<prefix><name>` (`tvm_ffi.system_lib(prefix)` is their module) |
//! | `target_canonical` | target text | the canonical TVM 0.27 JSON export |
//! | `target_describe` | target text | what the target resolves to on this machine (one line) |
//! | `ir_text` | kiln IR (JSON text) | the verified module in text form |
//! | `devices` | backend name or `""` | `kiln devices --json`'s document |
//! | `cli` | the arguments as a JSON list of strings | the exit code of `kiln <args>` |
//! | `wait_optimized` | | nothing, once every function `jit` compiled runs its O3 code |
//! | `tensor_empty` | shape (JSON list), dtype, device (`opencl:0`, ...) | a tvm-ffi Tensor in kiln's memory of that device |
//! | `tvm_device_table` | | the address of [`tvm_device::TABLE`], kiln's device backends as the C table that `kiln.tvm`'s TVM `DeviceAPI` calls |
//! | `tensor_copy` | destination Tensor, source Tensor | nothing: the elements copied, across devices, and waited for |
//!
//! Errors are raised through tvm-ffi (`TVMFFIErrorSetRaisedFromCStr`, which the loader puts in
//! this library's context slot) with the kind of kiln's error: `ValueError` for a malformed
//! target or IR, `RuntimeError` for what failed to compile or run, `TypeError` for arguments of
//! the wrong kind. A panic is caught at the boundary and raised as a `RuntimeError`.
//!
//! The C entry points and the error slot are in [`ffi`], the C table of kiln's device backends for
//! TVM's runtime in [`tvm_device`]; this file is safe Rust.

use std::path::Path;
use std::time::Instant;

use kiln::ir::IRModule;
use kiln::packed_func::{Any, AnyView, Value};
use kiln::target::Target;

pub mod ffi;
pub mod tvm_device;

/// An error raised to the caller: a tvm-ffi kind (`ValueError`, ...) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raised {
    /// The kind, a Python exception name.
    pub kind: &'static str,
    /// The message.
    pub message: String,
}

impl Raised {
    fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Raised {
            kind,
            message: message.into(),
        }
    }
}

/// What a function of this library returns.
pub type Result<T> = std::result::Result<T, Raised>;

/// A kiln error kind as one of the Python exceptions this library raises.
fn known(kind: &str) -> &'static str {
    match kind {
        "ValueError" => "ValueError",
        "TypeError" => "TypeError",
        "MemoryError" => "MemoryError",
        _ => "RuntimeError",
    }
}

/// The kind of a kiln error behind a `Box<dyn Error>` from the command-line layer.
fn kind_of(e: &(dyn std::error::Error + 'static)) -> &'static str {
    use kiln::codegen::CodegenError;
    if let Some(k) = e.downcast_ref::<kiln::Error>() {
        return known(k.kind());
    }
    if let Some(d) = e.downcast_ref::<kiln::device_api::DeviceError>() {
        return known(d.kind());
    }
    if e.downcast_ref::<kiln::target::TargetError>().is_some()
        || e.downcast_ref::<kiln::ir::IrError>().is_some()
    {
        return "ValueError";
    }
    if let Some(c) = e.downcast_ref::<CodegenError>() {
        return match c {
            CodegenError::Ir(_) => "ValueError",
            _ => "RuntimeError",
        };
    }
    "RuntimeError"
}

fn boxed(e: Box<dyn std::error::Error>) -> Raised {
    Raised::new(kind_of(&*e), e.to_string())
}

fn arg_str<'a>(fname: &str, args: &'a [AnyView<'a>], i: usize, what: &str) -> Result<&'a str> {
    match args.get(i).map(|a| a.value()) {
        Some(Value::Str(s)) => Ok(s),
        Some(_) => Err(Raised::new(
            "TypeError",
            format!(
                "kiln.{fname}: argument #{i} ({what}) must be a str, found {}",
                args[i].type_name()
            ),
        )),
        None => Err(Raised::new(
            "TypeError",
            format!(
                "kiln.{fname}: expected an argument #{i} ({what}), found {} argument(s)",
                args.len()
            ),
        )),
    }
}

fn arity(fname: &str, args: &[AnyView<'_>], n: usize) -> Result<()> {
    if args.len() == n {
        return Ok(());
    }
    Err(Raised::new(
        "TypeError",
        format!("kiln.{fname} takes {n} argument(s), found {}", args.len()),
    ))
}

fn parse_module(text: &str) -> Result<IRModule> {
    let m = IRModule::from_json_str(text)
        .map_err(|e| Raised::new("ValueError", format!("kiln IR: {e}")))?;
    m.verify()
        .map_err(|e| Raised::new("ValueError", format!("kiln IR: {e}")))?;
    Ok(m)
}

fn parse_target(text: &str) -> Result<Target> {
    Target::parse(text).map_err(|e| Raised::new("ValueError", format!("target: {e}")))
}

/// The options of `build` and `jit`: `{"auto_parallel": bool, "min_work": int, "db": path,
/// "any_cpu": bool}` (all optional). `db`: the best records of that tuning database for these
/// functions, this target and this CPU (any CPU with `any_cpu`) are applied first (`kiln build
/// --db`); with `auto_parallel`, each function's outermost independent loop then runs on the
/// thread pool ([`kiln::schedule::auto::auto_parallel`]), except in the functions a record
/// scheduled: their schedule is the one the tuner measured, whose own knobs chose their
/// parallel loops (a tuned transpose of 512 x 128, vectorized and left serial by its search,
/// ran 15 us as recorded and 46 us with its outer loop made parallel on top). Returns the
/// module, the loops made parallel, and what the database applied or skipped.
fn apply_options(
    module: IRModule,
    text: &str,
    target: &Target,
) -> Result<(IRModule, serde_json::Value, Vec<String>)> {
    let bad = |why: String| Raised::new("ValueError", format!("kiln build options: {why}"));
    let v: serde_json::Value = if text.trim().is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?
    };
    let obj = v
        .as_object()
        .ok_or_else(|| bad(format!("expected a JSON object, found {v}")))?;
    const KNOWN: [&str; 4] = ["auto_parallel", "min_work", "db", "any_cpu"];
    for k in obj.keys() {
        if !KNOWN.contains(&k.as_str()) {
            return Err(bad(format!(
                "unknown option `{k}`; known: {}",
                KNOWN.join(", ")
            )));
        }
    }
    let flag = |name: &str| match obj.get(name) {
        None | Some(serde_json::Value::Null) => Ok(false),
        Some(serde_json::Value::Bool(b)) => Ok(*b),
        Some(x) => Err(bad(format!("`{name}` must be a bool, found {x}"))),
    };
    let auto = flag("auto_parallel")?;
    let any_cpu = flag("any_cpu")?;
    let min_work = match obj.get("min_work") {
        None => kiln::schedule::auto::DEFAULT_MIN_WORK,
        Some(x) => x
            .as_u64()
            .ok_or_else(|| bad(format!("`min_work` must be a count, found {x}")))?,
    };
    let mut out = module;
    let mut tuning = Vec::new();
    // Functions a record scheduled: built as measured, without loops made parallel on top.
    let mut tuned: Vec<String> = Vec::new();
    match obj.get("db") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::String(path)) => {
            let db = kiln::tune::Database::open_existing(Path::new(path))
                .map_err(|e| Raised::new("FileNotFoundError", format!("kiln build: {e}")))?;
            tuning.extend(db.warnings.iter().map(|w| format!("warning: {w}")));
            let (m, notes) = db.apply(&out, target, any_cpu);
            tuned.extend(
                m.functions
                    .iter()
                    .zip(&out.functions)
                    .filter(|(g, f)| g != f)
                    .map(|(g, _)| g.name.clone()),
            );
            out = m;
            tuning.extend(notes);
        }
        Some(x) => return Err(bad(format!("`db` must be a path, found {x}"))),
    }
    let mut parallel = serde_json::Map::new();
    if auto {
        for f in out
            .functions
            .iter_mut()
            .filter(|f| !tuned.contains(&f.name))
        {
            let r = kiln::schedule::auto::auto_parallel(f, min_work);
            if !r.loops.is_empty() {
                parallel.insert(f.name.clone(), serde_json::json!(r.loops));
            }
            *f = r.func;
        }
    }
    Ok((out, serde_json::Value::Object(parallel), tuning))
}

/// `version()`: kiln's version.
pub fn version(args: &[AnyView<'_>]) -> Result<Any> {
    arity("version", args, 0)?;
    Ok(Any::from(env!("CARGO_PKG_VERSION")))
}

/// `build(ir_json, target, output_path, options)`: compiles the module and writes the library
/// (`.so`, `.o`, `.ll`, `.s`, or a device kind's export) to `output_path`.
pub fn build(args: &[AnyView<'_>]) -> Result<Any> {
    arity("build", args, 4)?;
    let ir = arg_str("build", args, 0, "kiln IR JSON")?;
    let target = arg_str("build", args, 1, "target")?;
    let out = arg_str("build", args, 2, "output path")?;
    let target = parse_target(target)?;
    let (module, parallel, tuning) = apply_options(
        parse_module(ir)?,
        arg_str("build", args, 3, "options JSON")?,
        &target,
    )?;
    let t = Instant::now();
    kiln::cli::codegen::write_library(&module, &target, Path::new(out)).map_err(boxed)?;
    Ok(built_info(&module, &target, parallel, tuning, t))
}

/// What `build` and `jit` return: the function names, the canonical target, the loops made
/// parallel, what the tuning database applied, and the milliseconds since `t`, as JSON text.
fn built_info(
    module: &IRModule,
    target: &Target,
    parallel: serde_json::Value,
    tuning: Vec<String>,
    t: Instant,
) -> Any {
    let doc = serde_json::json!({
        "functions": module.functions.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
        "target": target.export(),
        "parallel": parallel,
        "tuning": tuning,
        "ms": t.elapsed().as_secs_f64() * 1e3,
    });
    Any::from(doc.to_string())
}

/// `jit(ir_json, target, prefix, options)`: compiles the module in memory (kiln's JIT: callable after a
/// quick first tier, its O3 code installed in the background) and registers each function with
/// tvm-ffi as the system-library symbol `__tvm_ffi_<prefix><name>`, so that
/// `tvm_ffi.system_lib(prefix)` is a module of them. The compiled code stays for the life of
/// the process (tvm-ffi's system library has no way to unregister a symbol).
pub fn jit(args: &[AnyView<'_>]) -> Result<Any> {
    arity("jit", args, 4)?;
    let ir = arg_str("jit", args, 0, "kiln IR JSON")?;
    let target = arg_str("jit", args, 1, "target")?;
    let prefix = arg_str("jit", args, 2, "symbol prefix")?;
    let target = parse_target(target)?;
    let (module, parallel, tuning) = apply_options(
        parse_module(ir)?,
        arg_str("jit", args, 3, "options JSON")?,
        &target,
    )?;
    ffi::route_errors_to_tvm_ffi();
    let t = Instant::now();
    let built = kiln::codegen::build(&module, &target)
        .map_err(|e| boxed(Box::new(kiln::Error::from(e))))?;
    // The module's exported functions (an internal function has no symbol of its own).
    for name in built.function_names() {
        let pf = built.get_function(&name).ok_or_else(|| {
            Raised::new(
                "RuntimeError",
                format!("kiln.jit: the built module has no function `{name}`"),
            )
        })?;
        ffi::register_system_lib_symbol(&format!("__tvm_ffi_{prefix}{name}"), &pf)?;
    }
    ffi::keep_forever(built);
    Ok(built_info(&module, &target, parallel, tuning, t))
}

fn device_error(e: kiln::device_api::DeviceError) -> Raised {
    Raised::new(known(e.kind()), e.to_string())
}

/// `tensor_empty(shape_json, dtype, device)`: a compact tensor in the memory of `device`
/// (allocated by kiln's device runtime, as the kernels kiln builds for that device expect),
/// as a tvm-ffi Tensor object that frees it when Python drops it. Its contents are unspecified
/// (zeros on the CPU).
pub fn tensor_empty(args: &[AnyView<'_>]) -> Result<Any> {
    arity("tensor_empty", args, 3)?;
    let shape_text = arg_str("tensor_empty", args, 0, "shape as a JSON list")?;
    let dtype_text = arg_str("tensor_empty", args, 1, "dtype")?;
    let device_text = arg_str("tensor_empty", args, 2, "device")?;
    let shape: Vec<i64> = serde_json::from_str(shape_text).map_err(|e| {
        Raised::new(
            "ValueError",
            format!(
                "kiln.empty: the shape must be a JSON list of integers, found `{shape_text}` ({e})"
            ),
        )
    })?;
    let dtype = kiln::packed_func::DLDataType::parse(dtype_text).ok_or_else(|| {
        Raised::new(
            "ValueError",
            format!("kiln.empty: `{dtype_text}` is not a dtype (float32, int8, bfloat16, ...)"),
        )
    })?;
    let device: kiln::device_api::Device = device_text.parse().map_err(device_error)?;
    let t = kiln::device_api::Tensor::empty(&shape, dtype, device).map_err(device_error)?;
    Ok(ffi::tensor_object(t))
}

/// `tensor_copy(dst, src)`: copies the elements of `src` into `dst` (tensors of one shape and
/// dtype, on any devices: host memory, or kiln's memory of a device) and waits for the copy.
pub fn tensor_copy(args: &[AnyView<'_>]) -> Result<Any> {
    arity("tensor_copy", args, 2)?;
    let get = |i: usize, what: &str| {
        args[i].as_dltensor().ok_or_else(|| {
            Raised::new(
                "TypeError",
                format!(
                    "kiln.tensor_copy: argument #{i} ({what}) must be a tensor, found {}",
                    args[i].type_name()
                ),
            )
        })
    };
    let (dst, src) = (get(0, "destination")?, get(1, "source")?);
    ffi::copy_tensor(src, dst).map_err(device_error)?;
    Ok(Any::none())
}

/// `tvm_device_table()`: the address of kiln's device table for TVM's runtime
/// ([`tvm_device::TABLE`]).
pub fn tvm_device_table(args: &[AnyView<'_>]) -> Result<Any> {
    arity("tvm_device_table", args, 0)?;
    Ok(Any::from(tvm_device::table_address()))
}

/// `wait_optimized()`: blocks until every function compiled by `jit` so far runs its optimized
/// (O3) code instead of the JIT's quick first tier; for timing kernels.
pub fn wait_optimized(args: &[AnyView<'_>]) -> Result<Any> {
    arity("wait_optimized", args, 0)?;
    kiln::codegen::llvm::wait_all_optimized();
    Ok(Any::none())
}

/// `target_canonical(text)`: the canonical TVM 0.27 JSON export of a target.
pub fn target_canonical(args: &[AnyView<'_>]) -> Result<Any> {
    arity("target_canonical", args, 1)?;
    let t = parse_target(arg_str("target_canonical", args, 0, "target")?)?;
    Ok(Any::from(t.export().to_string()))
}

/// `target_describe(text)`: what the target resolves to on this machine (CPU, vector width,
/// float semantics), as `kiln build` reports it.
pub fn target_describe(args: &[AnyView<'_>]) -> Result<Any> {
    arity("target_describe", args, 1)?;
    let text = arg_str("target_describe", args, 0, "target")?;
    let t = parse_target(text)?;
    let line = kiln::cli::codegen::target_line(&t, text).map_err(|e| boxed(e.into()))?;
    Ok(Any::from(line))
}

/// `ir_text(ir_json)`: the verified module in kiln's text form.
pub fn ir_text(args: &[AnyView<'_>]) -> Result<Any> {
    arity("ir_text", args, 1)?;
    let m = parse_module(arg_str("ir_text", args, 0, "kiln IR JSON")?)?;
    Ok(Any::from(m.to_string()))
}

/// `devices(backend)`: `kiln devices --json` for every backend, or only `backend`.
pub fn devices(args: &[AnyView<'_>]) -> Result<Any> {
    arity("devices", args, 1)?;
    let b = arg_str("devices", args, 0, "backend name")?;
    let doc = kiln::cli::devices::json((!b.is_empty()).then_some(b)).map_err(boxed)?;
    Ok(Any::from(doc.to_string()))
}

/// `cli(args_json)`: runs `kiln <args>` in this process and returns its exit code.
pub fn cli(args: &[AnyView<'_>]) -> Result<Any> {
    arity("cli", args, 1)?;
    let text = arg_str("cli", args, 0, "arguments as a JSON list")?;
    let argv: Vec<String> = serde_json::from_str(text).map_err(|e| {
        Raised::new(
            "ValueError",
            format!("kiln.cli: expected a JSON list of strings, {e}"),
        )
    })?;
    let code = kiln::cli::run(std::iter::once("kiln".to_owned()).chain(argv));
    Ok(Any::from(i64::from(code)))
}
