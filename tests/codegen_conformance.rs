//! One conformance suite for every code generator, as `tests/device_conformance.rs` is for
//! every device: each test body is written once over a [`Backend`] (a target, and the device
//! its tensors live on) and instantiated per backend by `codegen_conformance!` — `llvm` (the
//! CPU) and `opencl` today, `cuda` next (one line at the bottom).
//!
//! - **Run files**: every case of the interpreter's hand-checked oracle files
//!   (`tests/ir/run/*.json`) runs on code built by the backend and must give the same outputs.
//!   On a device backend, a function without thread-bound loops is run as a kernel of one
//!   thread (`blockIdx.x` and `threadIdx.x` of extent 1 around its body), so the device code
//!   generator compiles every statement and expression of the files; cases that expect an
//!   error or a return value do not apply there (a kernel can do neither), nor out-of-bounds
//!   accesses (generated code does not check them, as in TVM).
//! - **Random elementwise programs** (`C[i] = e(A[i], B[i], i)` with random expressions `e`,
//!   int32 and float32): on the CPU a serial loop, on a device a grid of blocks of threads;
//!   bit for bit against the interpreter (NaNs match any NaN; contraction is off on both).
//!   Programs the interpreter rejects (an integer division by zero) are skipped: a kernel
//!   gives 0 there (docs/ir.md).
//! - **Random shared-memory programs** (device backends): each thread stores `e` into shared
//!   memory, a barrier, then reads its neighbour's value.
//!
//! A device backend skips visibly without its device, and fails instead under
//! `KILN_REQUIRE_<KIND>=1` (CI sets `KILN_REQUIRE_OPENCL=1`).

mod common;
mod random_expr;
#[path = "ir/runfile.rs"]
mod runfile;

use proptest::prelude::*;
use random_expr::{expr, lower, Leaves, E};
use runfile::*;

use kiln::codegen::ModuleRef;
use kiln::device_api::{self, Device, DeviceType, Tensor};
use kiln::ir::builder::{barrier, thread_for};
use kiln::ir::interp::{run, HostBuffer, InterpArg, Scalar};
use kiln::ir::{Buffer, DataType, Expr, ForKind, IRModule, Param, PrimFunc, Stmt, ThreadTag, Var};
use kiln::packed_func::{Any, AnyView, PackedFuncError};
use kiln::target::Target;

/// A check of a device source: `Err` with what is wrong.
type SourceCheck = fn(&str) -> Result<(), String>;

/// A code generator under test.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    /// Its target, as JSON. Floating-point contraction is off, so float results are exactly
    /// rounded and comparable bit for bit with the interpreter.
    target: &'static str,
    /// The device its tensors live on: `None` for the CPU.
    device: Option<DeviceType>,
    /// Functions of the run files it cannot compile yet: `(file stem, function, the reason
    /// its error gives)`.
    unsupported: &'static [(&'static str, &'static str, &'static str)],
    /// A check of every device source the backend builds, run with or without a device
    /// (CUDA: ptxas for sm_80 and sm_90), so that code for a device CI does not have is
    /// still validated by the vendor's own assembler.
    check_source: Option<SourceCheck>,
}

impl Backend {
    fn name(&self) -> String {
        self.device.map_or_else(|| "cpu".to_owned(), |d| d.name())
    }

    /// Whether the backend's device exists; `false` after a visible `skipping:` line, or a
    /// panic under `KILN_REQUIRE_<KIND>=1`.
    fn available(&self, test: &str) -> bool {
        let Some(t) = self.device else { return true };
        let why = match device_api::get(t) {
            Ok(api) if api.device_count().unwrap_or(0) > 0 => return true,
            Ok(_) => format!("the {} backend has no device", t.name()),
            Err(e) => e.to_string(),
        };
        let var = format!("KILN_REQUIRE_{}", t.name().to_ascii_uppercase());
        assert_ne!(
            std::env::var(&var).as_deref(),
            Ok("1"),
            "{var}=1 but: {why}"
        );
        eprintln!("skipping: no {} device ({why}) [{test}]", t.name());
        false
    }

    /// Whether the backend's device exists, without skipping messages (a build without a
    /// device is still checked).
    fn has_device(&self) -> bool {
        match self.device {
            None => true,
            Some(t) => device_api::get(t).is_ok_and(|api| api.device_count().unwrap_or(0) > 0),
        }
    }

    /// Builds `module`, and checks its device source with `check_source`.
    fn build(&self, module: &IRModule) -> Result<ModuleRef, String> {
        let target = Target::parse(self.target).map_err(|e| e.to_string())?;
        let m = kiln::codegen::build(module, &target).map_err(|e| e.to_string())?;
        if let Some(check) = self.check_source {
            let src = m.get_source("").unwrap_or_default();
            check(&src).map_err(|e| format!("{e}\n--- source ---\n{src}"))?;
        }
        Ok(m)
    }

    /// `f` as this backend runs it: itself on the CPU; on a device, itself if it has kernels,
    /// else its body as a kernel of one thread.
    fn prepare(&self, f: &PrimFunc) -> PrimFunc {
        if self.device.is_none() || !kiln::ir::device::kernels(f).is_empty() {
            return f.clone();
        }
        let mut g = f.clone();
        let body = f.body.clone();
        let one = || Expr::from(1i64);
        g.body = thread_for("conf_bx", one(), ThreadTag::Block(0), |_| {
            thread_for("conf_tx", one(), ThreadTag::Thread(0), |_| body.clone())
        });
        g
    }

    /// Calls `name` on `args` (buffers copied to the device and back), returning its result.
    fn call(
        &self,
        m: &ModuleRef,
        name: &str,
        args: &mut [InterpArg],
    ) -> Result<Any, PackedFuncError> {
        let f = m.require_function(name)?;
        let dev = self.device.map_or(Device::cpu(), |t| Device::new(t, 0));
        let dev_err = |e: kiln::device_api::DeviceError| PackedFuncError::Raised {
            kind: "RuntimeError".into(),
            message: format!("test harness: {e}"),
        };
        let mut tensors = Vec::new();
        for a in args.iter() {
            tensors.push(match a {
                InterpArg::Buffer(h) => Some(to_device(h, dev).map_err(dev_err)?),
                InterpArg::Scalar(_) => None,
            });
        }
        let scalars: Vec<Any> = args
            .iter()
            .map(|a| match a {
                InterpArg::Scalar(Scalar::Bool(b)) => Any::from(*b),
                InterpArg::Scalar(s @ Scalar::Float(..)) => Any::from(s.as_f64()),
                InterpArg::Scalar(s) => Any::from(s.as_i64()),
                InterpArg::Buffer(_) => Any::none(),
            })
            .collect();
        let views: Vec<AnyView> = tensors
            .iter()
            .zip(&scalars)
            .map(|(t, s)| {
                t.as_ref()
                    .map_or_else(|| s.view(), |t| AnyView::from(t.as_dltensor()))
            })
            .collect();
        let ret = f.call(&views)?;
        drop(views);
        if self.device.is_some() {
            let api = device_api::get(dev.device_type).map_err(dev_err)?;
            api.sync_stream(dev, api.current_stream(dev))
                .map_err(dev_err)?;
        }
        for (a, t) in args.iter_mut().zip(&tensors) {
            if let (InterpArg::Buffer(h), Some(t)) = (a, t) {
                from_device(t, h).map_err(dev_err)?;
            }
        }
        Ok(ret)
    }
}

/// A tensor on `dev` holding `h`'s elements.
fn to_device(h: &HostBuffer, dev: Device) -> kiln::device_api::DeviceResult<Tensor> {
    let t = Tensor::empty(&h.shape, h.dtype.into(), dev)?;
    let mut host = common::HostArray::from_host_buffer(h);
    copy(&host.dl(), t.as_dltensor())?;
    Ok(t)
}

/// Copies `t`'s elements back into `h`.
fn from_device(t: &Tensor, h: &mut HostBuffer) -> kiln::device_api::DeviceResult<()> {
    let mut host = common::HostArray::from_host_buffer(h);
    copy(t.as_dltensor(), &host.dl())?;
    h.data.copy_from_slice(host.bytes());
    Ok(())
}

/// A synchronous copy between a host array and a tensor of the same shape and dtype.
fn copy(
    from: &kiln::packed_func::DLTensor,
    to: &kiln::packed_func::DLTensor,
) -> kiln::device_api::DeviceResult<()> {
    let dev = if from.device.device_type.0 == 1 {
        to.device
    } else {
        from.device
    };
    let api = device_api::get(dev.device_type.into())?;
    let dev = Device::from(dev);
    let stream = api.current_stream(dev);
    // SAFETY: both describe live, compact buffers of the same shape and dtype: the host array
    // owns its storage for the call, the tensor its allocation.
    unsafe { device_api::copy_data_from_to(from, to, stream) }?;
    api.sync_stream(dev, stream)
}

/// Runs every applicable case of the run files; `(ran, not applicable, failures)`.
///
/// Each function is built alone, so one the backend cannot compile is named with its reason.
/// A function in the backend's `unsupported` list must fail to build with that reason (when it
/// builds, the list is out of date: a failure); any other build failure is a failure.
fn run_files(b: &Backend) -> (usize, usize, Vec<String>) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ir/run");
    let (mut ran, mut skipped, mut failures) = (0, 0, Vec::new());
    let runs = b.has_device();
    for (path, file, module) in load_run_files(dir) {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let mut built = std::collections::BTreeMap::new();
        for f in &module.functions {
            let known = b
                .unsupported
                .iter()
                .find(|(file, func, _)| *file == stem && *func == f.name);
            match (b.build(&IRModule::from_functions(vec![b.prepare(f)])), known) {
                (Ok(m), None) => {
                    built.insert(f.name.clone(), m);
                }
                (Ok(_), Some(_)) => failures.push(format!(
                    "{stem}.json `{}` now builds for {}: remove it from the backend's `unsupported` list",
                    f.name,
                    b.name()
                )),
                (Err(e), Some((_, _, why))) if e.contains(why) => {}
                (Err(e), _) => failures.push(format!(
                    "{stem}.json `{}`: building for {}: {e}",
                    f.name,
                    b.name()
                )),
            }
        }
        if !runs {
            ran += built.len();
            continue;
        }
        for (i, case) in file.runs.iter().enumerate() {
            let Some(m) = built.get(&case.function) else {
                skipped += 1;
                continue;
            };
            let oob = case
                .error
                .as_deref()
                .is_some_and(|e| e.contains("out of bounds"));
            let device_only =
                b.device.is_some() && (case.error.is_some() || case.returns.is_some());
            if oob || device_only {
                skipped += 1;
                continue;
            }
            let mut args = make_args(case);
            let r = b.call(m, &case.function, &mut args);
            let outcome = check_compiled_call(case, r, &args);
            match outcome {
                Ok(()) => ran += 1,
                Err(e) => failures.push(format!(
                    "{} runs[{i}] ({}) on {}: {e}",
                    path.display(),
                    case.function,
                    b.name()
                )),
            }
        }
    }
    (ran, skipped, failures)
}

const BLOCKS: i64 = 3;
const THREADS: i64 = 32;
const N: i64 = BLOCKS * THREADS;

/// `C[i] = e(A[i], B[i], i)`: a serial loop for the CPU; for a device, a grid of `BLOCKS`
/// blocks of `THREADS` threads, optionally (`shared`) storing `e` into shared memory and
/// reading the next thread's value after a barrier.
fn program(e: &E, t: DataType, on_device: bool, shared: bool) -> PrimFunc {
    let buf = |n: &str| Buffer::new(n, t, vec![Expr::from(N)]);
    let (a, b, c) = (buf("A"), buf("B"), buf("C"));
    let value = |i: &Expr| {
        lower(
            e,
            t,
            &Leaves {
                a: a.load([i.clone()]),
                b: b.load([i.clone()]),
                index: i.clone(),
                float_scale: 1.0,
            },
        )
    };
    let body = if !on_device {
        let i = Var::new("i", DataType::i64());
        let iv = Expr::Var(i.clone());
        Stmt::For {
            var: i,
            min: Expr::from(0i64),
            extent: Expr::from(N),
            kind: ForKind::Serial,
            body: Box::new(c.store([iv.clone()], value(&iv))),
        }
    } else {
        let sh = Buffer::shared("sh", t, &[THREADS]);
        thread_for("bx", Expr::from(BLOCKS), ThreadTag::Block(0), |bx| {
            let inner = thread_for("tx", Expr::from(THREADS), ThreadTag::Thread(0), |tx| {
                let i = bx.clone() * THREADS + tx.clone();
                let v = value(&i);
                if shared {
                    let next = (tx.clone() + 1i64).floormod(THREADS);
                    Stmt::seq(vec![
                        sh.store([tx.clone()], v),
                        barrier(),
                        c.store([i], sh.load([next])),
                    ])
                } else {
                    c.store([i], v)
                }
            });
            if shared {
                sh.allocate(inner)
            } else {
                inner
            }
        })
    };
    PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
}

fn inputs(t: DataType, seed: u64) -> (HostBuffer, HostBuffer) {
    let mut s = seed | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        // Non-zero, so that fewer programs divide by zero.
        let v = (s % 20) as i64 + 1;
        if s & (1 << 40) != 0 {
            -v
        } else {
            v
        }
    };
    let mut vals = || (0..N).map(|_| next()).collect::<Vec<i64>>();
    let host = |v: Vec<i64>| {
        if t.is_float() {
            HostBuffer::from_slice(&[N], &v.iter().map(|x| *x as f32 / 4.0).collect::<Vec<_>>())
        } else {
            HostBuffer::from_slice(&[N], &v.iter().map(|x| *x as i32).collect::<Vec<_>>())
        }
    };
    (host(vals()), host(vals()))
}

/// Runs a random program on `b` and in the interpreter; they must agree bit for bit.
fn differential(
    b: &Backend,
    e: &E,
    t: DataType,
    shared: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let f = program(e, t, b.device.is_some(), shared);
    let (x, y) = inputs(t, seed);
    let fresh = || {
        vec![
            InterpArg::Buffer(x.clone()),
            InterpArg::Buffer(y.clone()),
            InterpArg::Buffer(HostBuffer::zeros(t, &[N])),
        ]
    };
    let mut want = fresh();
    // Integer division by zero: an error in the interpreter, 0 in a kernel.
    prop_assume!(run(&f, &mut want).is_ok());
    let m = match b.build(&IRModule::from_functions(vec![f])) {
        // A kernel's float `%` and math call libdevice; without it here (and not required,
        // as CI requires it) the program is not built.
        Err(e)
            if e.to_string().contains("libdevice")
                && std::env::var("KILN_REQUIRE_PTXAS").as_deref() != Ok("1") =>
        {
            return Ok(());
        }
        r => r.map_err(|e| TestCaseError::fail(format!("building for {}: {e}", b.name())))?,
    };
    if !b.has_device() {
        // Built (and checked by `check_source`); nothing to run it on.
        return Ok(());
    }
    let mut got = fresh();
    b.call(&m, "f", &mut got)
        .map_err(|e| TestCaseError::fail(format!("running on {}: {e}", b.name())))?;
    let (InterpArg::Buffer(g), InterpArg::Buffer(w)) = (&got[2], &want[2]) else {
        unreachable!()
    };
    if t.is_float() {
        let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
        for (i, (g, w)) in g.iter().zip(&w).enumerate() {
            prop_assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "element {i} on {}: {g}, interpreter {w}\n{}",
                b.name(),
                m.get_source("").unwrap_or_default()
            );
        }
    } else {
        prop_assert_eq!(g.to_vec::<i32>().unwrap(), w.to_vec::<i32>().unwrap());
    }
    Ok(())
}

/// The suite, instantiated for one backend in a module of its name.
macro_rules! codegen_conformance {
    ($name:ident, $backend:expr, device: $device:tt) => {
        mod $name {
            use super::*;

            fn backend() -> Backend {
                $backend
            }

            #[test]
            fn run_files_agree_with_the_interpreter() {
                let b = backend();
                // Without the device: every function is still built (and checked).
                let runs = b.available("run_files");
                if !runs && b.check_source.is_none() {
                    return;
                }
                let (ran, skipped, failures) = run_files(&b);
                assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
                if runs {
                    eprintln!("{}: {ran} run-file cases and functions agree, {skipped} cases do not apply", b.name());
                } else {
                    eprintln!("{}: {ran} run-file functions built and checked (not run: no device)", b.name());
                }
                // 10 cases run, or (built only) the functions of the five files.
                let least = if runs { 10 } else { 5 };
                assert!(ran >= least, "only {ran} run-file cases or functions applied to {}", b.name());
            }

            proptest! {
                #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

                #[test]
                fn random_int32_programs_agree_with_the_interpreter(e in expr(), seed: u64) {
                    let b = backend();
                    if b.available("random_int32_programs") || b.check_source.is_some() {
                        differential(&b, &e, DataType::i32(), false, seed)?;
                    }
                }

                #[test]
                fn random_float32_programs_agree_with_the_interpreter(e in expr(), seed: u64) {
                    let b = backend();
                    if b.available("random_float32_programs") || b.check_source.is_some() {
                        differential(&b, &e, DataType::f32(), false, seed)?;
                    }
                }
            }

            codegen_conformance!(@device $device);
        }
    };
    (@device true) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

            #[test]
            fn random_shared_memory_programs_agree_with_the_interpreter(e in expr(), float: bool, seed: u64) {
                let b = backend();
                if b.available("random_shared_memory_programs") || b.check_source.is_some() {
                    let t = if float { DataType::f32() } else { DataType::i32() };
                    differential(&b, &e, t, true, seed)?;
                }
            }
        }
    };
    (@device false) => {};
}

codegen_conformance!(
    llvm,
    Backend {
        // The host CPU, as `tests/codegen_files.rs` builds: with mcpu `generic`, float16
        // conversions become calls to compiler-rt helpers (`__gnu_h2f_ieee`) the JIT does not
        // resolve (see docs/codegen.md).
        target: r#"{"kind": "llvm", "mcpu": "native", "fast-math-contract": false}"#,
        device: None,
        unsupported: &[],
        check_source: None,
    },
    device: false
);
codegen_conformance!(
    opencl,
    Backend {
        target: r#"{"kind": "opencl"}"#,
        device: Some(DeviceType::OPENCL),
        unsupported: &[
            // A kernel cannot return a value or raise an error.
            ("guards", "iota", "`return` inside a device kernel"),
            ("while", "isqrt_ceil", "`return` inside a device kernel"),
            // A `parallel` loop is the CPU's; a device runs threads.
            ("while", "searchsorted_parallel", "parallel loop `i` inside the device kernel"),
            ("half", "half_add", "float16 is not supported by kiln's OpenCL code generator"),
        ],
        check_source: None,
    },
    device: true
);
codegen_conformance!(
    cuda,
    Backend {
        target: r#"{"kind": "cuda", "arch": "sm_80"}"#,
        device: Some(DeviceType::CUDA),
        unsupported: &[
            // A kernel cannot return a value or raise an error.
            ("guards", "iota", "`return` inside a device kernel"),
            ("while", "isqrt_ceil", "`return` inside a device kernel"),
            // A `parallel` loop is the CPU's; a device runs threads.
            ("while", "searchsorted_parallel", "parallel loop `i` inside the device kernel"),
        ],
        check_source: Some(common::ptxas_check),
    },
    device: true
);
