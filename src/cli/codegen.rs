//! `kiln build` and `kiln run`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::codegen::device;
use crate::codegen::ModuleRef;
use crate::device_api::DeviceType;
use crate::ir::{IRModule, Param, PrimFunc};
use crate::npy::{parse_dtype, NpyArray};
use crate::packed_func::{Any, AnyView, DLTensor};
use crate::runtime::LibraryModule;
use crate::target::Target;

use super::CmdResult;

pub(crate) const DEFAULT_TARGET: &str = r#"{"kind": "llvm", "mcpu": "native"}"#;

/// Arguments of `kiln build`.
#[derive(clap::Args)]
pub struct BuildArgs {
    /// The IR module (kiln-ir/1 JSON).
    module: PathBuf,
    /// The target (JSON, legacy string or tag).
    #[arg(long, short, default_value = DEFAULT_TARGET)]
    target: String,
    /// The output: `.so`, `.o`, `.ll` or `.s`, by extension; with a device target also
    /// `.cl` (the kernels' OpenCL C source; `.so` embeds it beside the host code).
    #[arg(long, short)]
    output: PathBuf,
    /// Apply the best records of this tuning database (`kiln tune`) [default:
    /// $KILN_TUNING_DB when set].
    #[arg(long)]
    db: Option<PathBuf>,
    /// Apply records measured on another CPU model too.
    #[arg(long)]
    any_cpu: bool,
}

/// Arguments of `kiln run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// An IR module (`.json`, compiled in-process) or a library (`.so`).
    pub(crate) module: PathBuf,
    /// The function to call.
    pub(crate) function: String,
    /// Arguments: `file.npy`, `rand:SHAPE[:DTYPE]` or `zeros:SHAPE[:DTYPE]` (SHAPE like
    /// `1024x1024`, DTYPE default float32), an integer, a float, `true`/`false`. With an IR module
    /// and no arguments, tensors of constant shape are generated at random.
    pub(crate) args: Vec<String>,
    /// The target used to compile an IR module. With a device target (`opencl`), tensors are
    /// copied to its device 0, the function runs there, and `--repeat` times it with device
    /// events.
    #[arg(long, short, default_value = DEFAULT_TARGET)]
    pub(crate) target: String,
    /// Call the function this many times (at most 10 000 000) and print the median, min and
    /// max time.
    #[arg(long, default_value_t = 0, value_parser = parse_repeat)]
    pub(crate) repeat: usize,
    /// Where to write every tensor argument after the call, as `<name>.npy`.
    #[arg(long, default_value = "kiln-out")]
    pub(crate) out: PathBuf,
    /// Also run the reference interpreter (IR modules only) and report the largest difference.
    #[arg(long)]
    pub(crate) check: bool,
    /// Run on a remote device through the TVM RPC server at HOST:PORT (kiln's `kiln
    /// rpc-server` or TVM's): the library (or the IR module, built here for `--target`) is
    /// uploaded, its tensors copied there and back, and `--repeat` timed there.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "tracker")]
    pub(crate) rpc: Option<String>,
    /// Ask the RPC tracker at HOST:PORT for a server of `--key`, and run there.
    #[arg(long, value_name = "HOST:PORT", requires = "key")]
    pub(crate) tracker: Option<String>,
    /// The key: the tracker's device key with `--tracker`, the server's match key with `--rpc`.
    #[arg(long, default_value = "")]
    pub(crate) key: String,
    /// Apply the best records of this tuning database to an IR module [default:
    /// $KILN_TUNING_DB when set].
    #[arg(long)]
    pub(crate) db: Option<PathBuf>,
    /// The remote device the function runs on (`cpu`, `opencl`, `cuda`, with `:N` for another
    /// ordinal).
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub(crate) device: String,
}

/// The most calls `--repeat` times: each call's time is kept for the median, so the bound
/// keeps that list to 80 MB (a count of 10^12 was an allocation that aborted the process).
pub(crate) const MAX_REPEAT: usize = 10_000_000;

fn parse_repeat(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if n > MAX_REPEAT {
        return Err(format!(
            "at most {MAX_REPEAT} calls are timed (each call's time is kept for the median)"
        ));
    }
    Ok(n)
}

pub(crate) fn read_module(path: &Path) -> Result<IRModule, Box<dyn std::error::Error>> {
    let text = crate::util::read_text_bounded(path, crate::util::MAX_TEXT_FILE_BYTES)
        .map_err(|e| format!("reading `{}`: {e}", path.display()))?;
    Ok(IRModule::from_json_str(&text).map_err(|e| format!("`{}`: {e}", path.display()))?)
}

/// `kiln build`.
pub fn run_build(a: &BuildArgs) -> CmdResult {
    let module = read_module(&a.module)?;
    module
        .verify()
        .map_err(|e| format!("`{}`: {e}", a.module.display()))?;
    let target = Target::parse(&a.target)?;
    let module = match super::tune::db_path(a.db.as_deref(), None) {
        Some(p) => super::tune::apply_db(&p, &module, &target, a.any_cpu)?,
        None => module,
    };
    let t = Instant::now();
    write_library(&module, &target, &a.output)?;
    eprintln!(
        "wrote {} ({} function(s), {:.1} ms) for {}",
        a.output.display(),
        module.functions.len(),
        t.elapsed().as_secs_f64() * 1e3,
        target_line(&target, &a.target)?
    );
    Ok(())
}

/// Compiles `module` for `target` and writes the result to `output`: for `llvm`, a `.so`, `.o`,
/// `.ll` or `.s` by extension; for a device kind (`opencl`, `cuda`), what its code generator
/// exports (device source, or a `.so` with the device code inside). What `kiln build` and
/// Python's `kiln.build` do.
///
/// # Errors
/// The module does not compile for the target, the target kind has no code generator that
/// writes files, or the file cannot be written.
pub fn write_library(module: &IRModule, target: &Target, output: &Path) -> CmdResult {
    crate::codegen::export_library(module, target, output).map_err(|e| match e {
        crate::codegen::CodegenError::NoCodegen { kind } => {
            let kinds: Vec<String> = std::iter::once("llvm")
                .chain(device::BUILTIN.iter().map(|c| c.kind()))
                .map(|k| format!("`{k}`"))
                .collect();
            format!(
                "`kiln build` writes files for target kinds {}, found `{kind}`",
                kinds.join(", ")
            )
            .into()
        }
        e => e.into(),
    })
}

pub(crate) enum Arg {
    Tensor(String, NpyArray),
    Scalar(Any),
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn fill_random(a: &mut NpyArray, seed: u64) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let (code, bits) = (a.dtype.code.0, a.dtype.bits);
    let eb = a.elem_bytes();
    for chunk in a.data.as_mut_slice().chunks_exact_mut(eb) {
        let r = xorshift(&mut s);
        let unit = (r >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        match (code, bits) {
            (2, 32) => chunk.copy_from_slice(&(unit as f32).to_le_bytes()),
            (2, 64) => chunk.copy_from_slice(&unit.to_le_bytes()),
            (2, 16) => chunk.copy_from_slice(&half::f16::from_f64(unit).to_le_bytes()),
            (4, 16) => chunk.copy_from_slice(&half::bf16::from_f64(unit).to_le_bytes()),
            (6, _) => chunk[0] = (r & 1) as u8,
            _ => {
                let v = (r % 10).to_le_bytes();
                chunk.copy_from_slice(&v[..eb]);
            }
        }
    }
}

fn parse_shape(s: &str) -> Result<Vec<i64>, String> {
    if s.is_empty() || s == "scalar" {
        return Ok(vec![]);
    }
    s.split(['x', ','])
        .map(|d| {
            d.trim()
                .parse::<i64>()
                .map_err(|_| format!("shape `{s}`: `{d}` is not an integer"))
        })
        .collect()
}

pub(crate) fn parse_arg(s: &str, index: usize, seed: u64) -> Result<Arg, String> {
    let name = format!("arg{index}");
    if s.ends_with(".npy") {
        return Ok(Arg::Tensor(
            name,
            NpyArray::read(Path::new(s)).map_err(|e| e.to_string())?,
        ));
    }
    for (prefix, random) in [("rand:", true), ("zeros:", false)] {
        if let Some(rest) = s.strip_prefix(prefix) {
            let mut parts = rest.splitn(2, ':');
            let shape = parse_shape(parts.next().unwrap_or(""))?;
            let dt_name = parts.next().unwrap_or("float32");
            let dtype = parse_dtype(dt_name).ok_or_else(|| {
                format!("unknown dtype `{dt_name}` in `{s}` (expected float32, int64, bool, ...)")
            })?;
            let mut a = NpyArray::zeros(dtype, &shape).map_err(|e| e.to_string())?;
            if random {
                fill_random(&mut a, seed);
            }
            return Ok(Arg::Tensor(name, a));
        }
    }
    match s {
        "true" => return Ok(Arg::Scalar(Any::from(true))),
        "false" => return Ok(Arg::Scalar(Any::from(false))),
        _ => {}
    }
    if let Ok(i) = s.parse::<i64>() {
        return Ok(Arg::Scalar(Any::from(i)));
    }
    if let Ok(f) = s.parse::<f64>() {
        return Ok(Arg::Scalar(Any::from(f)));
    }
    Err(format!(
        "argument #{index} `{s}`: expected a .npy file, rand:SHAPE[:DTYPE], zeros:SHAPE[:DTYPE], a number or true/false"
    ))
}

/// The arguments of `kiln run`: parsed from the command line, or generated for an IR function
/// given none; tensors take their parameter's name.
pub(crate) fn run_args(a: &RunArgs, pf: Option<&PrimFunc>) -> Result<Vec<Arg>, String> {
    let mut args: Vec<Arg> = if a.args.is_empty() {
        match pf {
            Some(p) => generated_args(p)?,
            None => Vec::new(),
        }
    } else {
        a.args
            .iter()
            .enumerate()
            .map(|(i, s)| parse_arg(s, i, i as u64 + 1))
            .collect::<Result<_, _>>()?
    };
    if let Some(p) = pf {
        for (arg, param) in args.iter_mut().zip(&p.params) {
            if let Arg::Tensor(name, _) = arg {
                *name = param.name().to_owned();
            }
        }
    }
    Ok(args)
}

pub(crate) fn generated_args(f: &PrimFunc) -> Result<Vec<Arg>, String> {
    f.params
        .iter()
        .enumerate()
        .map(|(i, p)| match p {
            Param::Buffer(b) => {
                let shape: Option<Vec<i64>> = b.shape.iter().map(|e| e.as_int()).collect();
                let shape = shape.ok_or_else(|| {
                    format!("parameter `{}` has a symbolic shape: pass the arguments on the command line (e.g. rand:1024)", b.name)
                })?;
                let dtype = parse_dtype(&b.dtype.to_string()).ok_or_else(|| format!("parameter `{}`: cannot generate {}", b.name, b.dtype))?;
                let mut a = NpyArray::zeros(dtype, &shape).map_err(|e| e.to_string())?;
                fill_random(&mut a, i as u64 + 1);
                Ok(Arg::Tensor(b.name.clone(), a))
            }
            Param::Scalar(v) => Err(format!("parameter `{}` is a scalar: pass the arguments on the command line", v.name)),
        })
        .collect()
}

/// The target as `kiln build` and `kiln run` report it: its canonical JSON, `(the default
/// target)` when it came from the default, and for `llvm` what the code gets
/// ([`crate::codegen::llvm::CodegenOptions::describe`]).
pub fn target_line(target: &Target, given: &str) -> Result<String, crate::error::Error> {
    let mut s = target.to_string();
    if given == DEFAULT_TARGET {
        s.push_str(" (the default target)");
    }
    if target.kind_name() == "llvm" {
        let o = crate::codegen::llvm::CodegenOptions::from_target(target)?;
        s.push_str(": ");
        s.push_str(&o.describe());
    }
    Ok(s)
}

/// `kiln run`.
pub fn run_run(a: &RunArgs) -> CmdResult {
    if a.rpc.is_some() || a.tracker.is_some() {
        return super::rpc::run_remote(a);
    }
    let is_lib = a.module.extension().is_some_and(|e| e == "so");
    // The device the function's tensors live on: the CPU, or the device of its kernels.
    let on_device: Option<DeviceType>;
    let (rt, ir): (ModuleRef, Option<IRModule>) = if is_lib {
        // SAFETY: the user asked to run this library; loading it runs its initializers, as any
        // dlopen does (kiln checks it is an ELF shared object first).
        let lib = unsafe { LibraryModule::load(&a.module) }?;
        // The device its kernels' kind names (a DLPack name, or a registered backend's).
        on_device = lib
            .device()
            .map(|d| DeviceType::from_name(d.kind()))
            .transpose()?;
        (std::sync::Arc::new(lib), None)
    } else {
        let module = read_module(&a.module)?;
        let target = Target::parse(&a.target)?;
        let module = match super::tune::db_path(a.db.as_deref(), None) {
            Some(p) => super::tune::apply_db(&p, &module, &target, false)?,
            None => module,
        };
        on_device = device::codegen_for(target.kind_name()).map(|cg| cg.device_type().into());
        let t = Instant::now();
        let rt = crate::codegen::build(&module, &target)?;
        eprintln!(
            "compiled {} in {:.1} ms for {}",
            a.module.display(),
            t.elapsed().as_secs_f64() * 1e3,
            target_line(&target, &a.target)?
        );
        (rt, Some(module))
    };
    let f = rt.require_function(&a.function)?;
    let pf = ir.as_ref().and_then(|m| m.get(&a.function)).cloned();
    let mut args = run_args(a, pf.as_ref())?;
    let mut interp_inputs = None;
    if a.check {
        let p = pf
            .as_ref()
            .ok_or("--check needs an IR module, not a library")?;
        interp_inputs = Some(to_interp(&args, p)?);
    }
    if let Some(dev_type) = on_device {
        return run_on_device(a, &f, dev_type, &mut args, interp_inputs, pf);
    }
    // Tensor views live as long as `args`; no array is moved while they are used.
    let dls: Vec<Option<DLTensor>> = args
        .iter_mut()
        .map(|x| match x {
            Arg::Tensor(_, t) => Some(t.as_dltensor()),
            Arg::Scalar(_) => None,
        })
        .collect();
    let views: Vec<AnyView<'_>> = args
        .iter()
        .zip(&dls)
        .map(|(x, d)| match (x, d) {
            (_, Some(d)) => AnyView::from(d),
            (Arg::Scalar(s), None) => s.view(),
            (Arg::Tensor(..), None) => unreachable!("every tensor has a view"),
        })
        .collect();
    let result = f.call(&views)?;
    if a.repeat > 0 {
        // Time the optimized code, not the JIT's quick first tier.
        #[cfg(feature = "llvm")]
        crate::codegen::llvm::wait_all_optimized();
        let mut times: Vec<f64> = Vec::with_capacity(a.repeat);
        for _ in 0..a.repeat {
            let t = Instant::now();
            f.call(&views)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (median, min, max) = spread(&mut times);
        println!(
            "{}: {} runs, median {median:.4} ms, min {min:.4} ms, max {max:.4} ms",
            a.function, a.repeat
        );
    }
    drop(views);
    if !result.is_none() {
        println!("result: {:?}", result.value());
    }
    finish(a, &args, interp_inputs, pf)
}

/// `(median, min, max)` of non-empty timings (sorted in place).
pub(crate) fn spread(times: &mut [f64]) -> (f64, f64, f64) {
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[0], times[times.len() - 1])
}

/// Runs `f` on device 0 of `dev_type`: tensors copied in, one call (and `--repeat` more, timed with device
/// events), synchronized, tensors copied back into `args`.
fn run_on_device(
    a: &RunArgs,
    f: &crate::packed_func::PackedFunc,
    dev_type: DeviceType,
    args: &mut [Arg],
    interp_inputs: Option<Vec<crate::ir::interp::InterpArg>>,
    pf: Option<PrimFunc>,
) -> CmdResult {
    use crate::device_api::{self, Device, Tensor};
    let dev = Device::new(dev_type, 0);
    let api = device_api::get(dev_type)?;
    api.check_device(dev)?;
    let stream = api.current_stream(dev);
    let mut host: Vec<Option<DLTensor>> = args
        .iter_mut()
        .map(|x| match x {
            Arg::Tensor(_, t) => Some(t.as_dltensor()),
            Arg::Scalar(_) => None,
        })
        .collect();
    let mut on_dev: Vec<Option<Tensor>> = Vec::with_capacity(host.len());
    for h in &host {
        on_dev.push(match h {
            None => None,
            Some(h) => {
                // SAFETY: `h` views a live host array of its shape.
                let shape = unsafe { std::slice::from_raw_parts(h.shape, h.ndim as usize) };
                let t = Tensor::empty(shape, h.dtype, dev)?;
                // SAFETY: both tensors are live, of one shape and dtype; synchronized below.
                unsafe { device_api::copy_data_from_to(h, t.as_dltensor(), stream) }?;
                Some(t)
            }
        });
    }
    let views: Vec<AnyView<'_>> = args
        .iter()
        .zip(&on_dev)
        .map(|(x, d)| match (x, d) {
            (_, Some(t)) => AnyView::from(t.as_dltensor()),
            (Arg::Scalar(s), None) => s.view(),
            (Arg::Tensor(..), None) => unreachable!("every tensor has a device copy"),
        })
        .collect();
    let result = f.call(&views)?;
    api.sync_stream(dev, stream)?;
    if a.repeat > 0 {
        crate::codegen::llvm::wait_all_optimized();
        let (start, end) = (api.create_event(dev)?, api.create_event(dev)?);
        let mut device_ms = Vec::with_capacity(a.repeat);
        let mut wall_ms = Vec::with_capacity(a.repeat);
        for _ in 0..a.repeat {
            let t = Instant::now();
            api.record_event(dev, stream, start)?;
            f.call(&views)?;
            api.record_event(dev, stream, end)?;
            api.sync_event(dev, end)?;
            wall_ms.push(t.elapsed().as_secs_f64() * 1e3);
            device_ms.push(api.event_elapsed(dev, start, end)?.as_secs_f64() * 1e3);
        }
        api.destroy_event(dev, start)?;
        api.destroy_event(dev, end)?;
        let (dm, dmin, dmax) = spread(&mut device_ms);
        let (wm, wmin, wmax) = spread(&mut wall_ms);
        println!(
            "{}: {} runs on {dev}, device time median {dm:.4} ms, min {dmin:.4} ms, max {dmax:.4} ms; call to completion median {wm:.4} ms [{wmin:.4}, {wmax:.4}]",
            a.function, a.repeat
        );
    }
    drop(views);
    for (h, d) in host.iter_mut().zip(&on_dev) {
        if let (Some(h), Some(d)) = (h, d) {
            // SAFETY: both live, same shape and dtype; synchronized below.
            unsafe { device_api::copy_data_from_to(d.as_dltensor(), h, stream) }?;
        }
    }
    api.sync_stream(dev, stream)?;
    if !result.is_none() {
        println!("result: {:?}", result.value());
    }
    finish(a, args, interp_inputs, pf)
}

/// Writes every tensor argument as `.npy` into `--out` and, with `--check`, compares them with
/// the reference interpreter's results.
pub(crate) fn finish(
    a: &RunArgs,
    args: &[Arg],
    interp_inputs: Option<Vec<crate::ir::interp::InterpArg>>,
    pf: Option<PrimFunc>,
) -> CmdResult {
    std::fs::create_dir_all(&a.out).map_err(|e| format!("creating `{}`: {e}", a.out.display()))?;
    for x in args {
        if let Arg::Tensor(name, t) = x {
            let p = a.out.join(format!("{name}.npy"));
            t.write(&p)?;
            println!("wrote {} ({} {:?})", p.display(), t.dtype, t.shape);
        }
    }
    if let (Some(mut iargs), Some(p)) = (interp_inputs, pf) {
        crate::ir::interp::run(&p, &mut iargs)?;
        // Absolute 1e-3, or for 16-bit floats (computed in f32 and rounded by both the code
        // and the interpreter) one unit in the last place of the expected value: a rounding
        // that lands on the other side of a tie is not an error.
        let mut worst = 0f64;
        let mut bad = None;
        for (x, ia) in args.iter().zip(&iargs) {
            if let (Arg::Tensor(name, t), crate::ir::interp::InterpArg::Buffer(hb)) = (x, ia) {
                let rel = match (t.dtype.code.0, t.dtype.bits) {
                    (2, 16) => 2f64.powi(-10),
                    (4, 16) => 2f64.powi(-7),
                    _ => 0.0,
                };
                let got = as_f64(t);
                let n = hb.data.len() / hb.dtype.bytes().max(1);
                let want: Vec<f64> = (0..n)
                    .filter_map(|i| hb.get(i).map(|s| s.as_f64()))
                    .collect();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let both_nan = g.is_nan() && w.is_nan();
                    let d = if both_nan || g == w {
                        0.0
                    } else {
                        (g - w).abs()
                    };
                    let d = if d.is_nan() { f64::INFINITY } else { d };
                    worst = worst.max(d);
                    if d > 1e-3f64.max(rel * w.abs()) && bad.is_none() {
                        bad = Some(format!("{name}[{i}] is {g}, the interpreter gives {w}"));
                    }
                }
            }
        }
        println!("check against the reference interpreter: max abs difference {worst:e}");
        if let Some(bad) = bad {
            return Err(
                format!("compiled and interpreted results differ by {worst:e} ({bad})").into(),
            );
        }
    }
    Ok(())
}

fn as_f64(t: &NpyArray) -> Vec<f64> {
    let b = t.data.as_slice();
    let eb = t.elem_bytes();
    b.chunks_exact(eb)
        .map(|c| match (t.dtype.code.0, t.dtype.bits) {
            (2, 32) => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            (2, 64) => f64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
            (2, 16) => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
            (4, 16) => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            (0, _) => {
                let mut v = [0u8; 8];
                v[..eb].copy_from_slice(c);
                let s = 64 - 8 * eb as u32;
                ((i64::from_le_bytes(v) << s) >> s) as f64
            }
            _ => {
                let mut v = [0u8; 8];
                v[..eb].copy_from_slice(c);
                u64::from_le_bytes(v) as f64
            }
        })
        .collect()
}

pub(crate) fn to_interp(
    args: &[Arg],
    p: &PrimFunc,
) -> Result<Vec<crate::ir::interp::InterpArg>, String> {
    use crate::ir::interp::{HostBuffer, InterpArg, Scalar};
    if args.len() != p.params.len() {
        return Err(format!(
            "`{}` takes {} arguments, {} given",
            p.name,
            p.params.len(),
            args.len()
        ));
    }
    args.iter()
        .zip(&p.params)
        .map(|(x, param)| match (x, param) {
            (Arg::Tensor(_, t), Param::Buffer(b)) => Ok(InterpArg::Buffer(HostBuffer {
                dtype: b.dtype,
                shape: t.shape.clone(),
                strides: None,
                data: t.data.as_slice().to_vec(),
            })),
            (Arg::Scalar(s), Param::Scalar(v)) => {
                let sc = if v.dtype.is_float() {
                    Scalar::from_float(v.dtype, s.get::<f64>().map_err(|e| e.to_string())?)
                } else {
                    Scalar::from_int(
                        v.dtype,
                        i128::from(s.get::<i64>().map_err(|e| e.to_string())?),
                    )
                };
                Ok(InterpArg::Scalar(sc))
            }
            _ => Err(format!(
                "argument for `{}` has the wrong kind (tensor vs scalar)",
                param.name()
            )),
        })
        .collect()
}
