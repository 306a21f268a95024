//! The benchmark kernels (`examples/kernels/*.json`, scheduled by `kiln::schedule::kernels`)
//! against a plain Rust loop, numpy and TVM 0.27, in one run.
//!
//! kiln's kernels (`kiln::schedule::kernels`, as `examples/kernels/*.json`, with matmul's
//! register tiles chosen for the target's CPU and row blocks for its L2 cache:
//! `MatmulTiles::for_target_and_depth`; vadd's 64 MiB output with streaming stores on x86) are JIT-compiled for
//! the default target a user gets, `{"kind": "llvm", "mcpu": "native", "num-cores": <logical
//! CPUs>}` (no fast math: multiply-add contraction is on by default and softmax asks for
//! `fast_exp` itself), then, in a second run, for an AVX2-only CPU (`haswell`); with
//! `KILN_BENCH_MCPU` set, one run for that CPU. They are called through the packed-function ABI
//! with 64-byte-aligned inputs. TVM builds its kernels for the same target (the CPU name LLVM
//! resolves `native` to, passed as `KILN_TVM_MCPU`). numpy and TVM (the fastest of TVM's
//! strongest schedules for each kernel on this machine: see the script) are timed by
//! `python/bench_tvm.py`, run with `$KILN_PYTHON` (default `python3`) when it can import numpy
//! (TVM when `tvm` imports too; for an AVX2-only target, with `OPENBLAS_CORETYPE=Haswell`, so that
//! numpy's matmul is OpenBLAS's AVX2 code); the same script checks kiln's outputs, written to a
//! temporary directory, against numpy. Times are medians of repeated calls with the spread (min -
//! max) beside them; ratios are other / kiln (> 1: kiln is faster), paired by round for numpy
//! and TVM (the median over interleaved rounds of the two block medians' ratio, with quartiles).
//!
//! Last, on the first OpenCL device (PoCL in CI), kiln's OpenCL kernels against hand-written
//! OpenCL C and a launch against a bare one (`opencl_kernels`, which `cargo bench --bench
//! opencl` runs alone; without a device it says so).
//!
//! Run: `cargo bench --bench kernels` (`KILN_BENCH_QUICK=1` for fewer repetitions,
//! `KILN_BENCH_DIR=dir` to keep the data files; `-- --asm <kernel>` prints a kernel's assembly).

mod bare_opencl;
mod opencl_kernels;
mod util;
use util::{cpu_model, num_cpus, rnd, Array};

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use kiln::codegen::llvm::{CodegenOptions, LlvmModule};
use kiln::ir::IRModule;
use kiln::packed_func::{AnyView, DLTensor, Module};
use kiln::target::Target;

/// Median, min and max of `reps` timings of `f`, in seconds, after `warm` untimed calls.
fn time(warm: usize, reps: usize, mut f: impl FnMut()) -> (f64, f64, f64) {
    for _ in 0..warm {
        f();
    }
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (t[t.len() / 2], t[0], t[t.len() - 1])
}

struct Row {
    name: &'static str,
    unit: &'static str,
    /// Work per call in the unit (bytes for GB/s, flops for GFLOP/s, 0 for ms only).
    work: f64,
    kiln: (f64, f64, f64),
    rust: (f64, f64, f64),
    kiln_vs_rust_err: f64,
}

/// The scheduled kernel `name` for this run's target: `examples/kernels/<name>.json`'s schedule,
/// with matmul's register tiles chosen for the target's CPU and its row blocks for the CPU's L2
/// (`MatmulTiles::for_target_and_depth`).
fn scheduled(name: &str) -> IRModule {
    use kiln::schedule::kernels as sk;
    let f = match name {
        "vadd" => sk::vadd(),
        "matmul" => sk::matmul_tiled(
            1024,
            1024,
            1024,
            sk::MatmulTiles::for_target_and_depth(&target(), 1024),
        ),
        "rowsum" => sk::rowsum(),
        _ => sk::softmax(),
    };
    let m = IRModule::from_functions(vec![f.unwrap()]);
    m.verify().unwrap();
    m
}

fn kernel(name: &str) -> LlvmModule {
    let m = scheduled(name);
    let o = CodegenOptions::from_target(&target()).unwrap().resolved();
    let m = LlvmModule::jit(&m, &o).unwrap();
    // Time the optimized code, not the JIT's quick first tier.
    m.wait_optimized().unwrap();
    m
}

/// Exports a kernel as `<dir>/<name>.so` for python/bench_tvm.py (kiln through tvm_ffi).
fn export_kernel(name: &str, dir: &Path) {
    let m = scheduled(name);
    let o = CodegenOptions::from_target(&target()).unwrap();
    kiln::codegen::llvm::export(&m, &o, &dir.join(format!("{name}.so"))).unwrap();
}

/// The CPU the kernels are built for: `native` (the default target), or `KILN_BENCH_MCPU`.
fn bench_mcpu() -> String {
    std::env::var("KILN_BENCH_MCPU").unwrap_or_else(|_| "native".into())
}

/// The target of every kiln kernel of this run.
fn target() -> Target {
    Target::from_json(&serde_json::json!({
        "kind": "llvm",
        "mcpu": bench_mcpu(),
        "num-cores": num_cpus(),
    }))
    .unwrap()
}

fn call(m: &LlvmModule, name: &str, arrays: &mut [&mut Array]) {
    let f = m.require_function(name).unwrap();
    let dls: Vec<DLTensor> = arrays.iter_mut().map(|a| a.dl()).collect();
    let views: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
    f.call(&views).unwrap();
}

fn max_err(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from((x - y).abs()))
        .fold(0.0, f64::max)
}

fn main() {
    // `cargo bench --bench kernels -- --asm <kernel>` prints a kernel's assembly instead.
    let argv: Vec<String> = std::env::args().collect();
    if let Some(k) = argv.iter().position(|a| a == "--asm") {
        let name = argv.get(k + 1).map_or("matmul", String::as_str);
        print!("{}", kernel(name).get_source("asm").unwrap_or_default());
        return;
    }
    // Without `KILN_BENCH_MCPU`: this run for the host CPU (`native`), then the same bench
    // again, in a child process, for an AVX2-only CPU (`haswell`).
    let again_for_avx2 = std::env::var_os("KILN_BENCH_MCPU").is_none();
    run();
    if again_for_avx2 {
        println!();
        let st = std::process::Command::new(std::env::current_exe().unwrap())
            .env("KILN_BENCH_MCPU", "haswell")
            .status()
            .unwrap();
        assert!(st.success(), "the haswell run failed");
        // The OpenCL kernels on the first OpenCL device, against hand-written OpenCL C
        // (`cargo bench --bench opencl` runs this part alone; it says so and returns without
        // a device).
        println!();
        opencl_kernels::main();
    }
}

/// One run of the whole bench for this process's target ([`target`]).
fn run() {
    let quick = std::env::var("KILN_BENCH_QUICK").is_ok_and(|v| v == "1");
    let reps = |n: usize| if quick { n.div_ceil(4).max(3) } else { n };
    // `KILN_BENCH_DIR` keeps the inputs and outputs (for rerunning python/bench_tvm.py alone).
    let dir = tempfile::tempdir().unwrap();
    let keep = std::env::var_os("KILN_BENCH_DIR").map(std::path::PathBuf::from);
    if let Some(k) = &keep {
        std::fs::create_dir_all(k).unwrap();
    }
    let d = keep.as_deref().unwrap_or(dir.path());
    let mut rows = Vec::new();

    // vadd, n = 16M.
    {
        let n = 1i64 << 24;
        let m = kernel("vadd");
        let (mut a, mut b) = (Array::new(&[n], rnd(1)), Array::new(&[n], rnd(2)));
        let mut c = Array::new(&[n], |_| 0.0);
        let mut f = || call(&m, "vadd", &mut [&mut a, &mut b, &mut c]);
        let kt = time(3, reps(40), &mut f);
        let mut r = vec![0f32; n as usize];
        let rt = time(2, reps(20), || {
            for ((z, x), y) in r.iter_mut().zip(a.data()).zip(b.data()) {
                *z = x + y;
            }
            black_box(&r);
        });
        a.save(&d.join("vadd_a.bin"));
        b.save(&d.join("vadd_b.bin"));
        c.save(&d.join("vadd_out.bin"));
        rows.push(Row {
            name: "vadd 16M",
            unit: "GB/s",
            work: 12.0 * n as f64,
            kiln: kt,
            rust: rt,
            kiln_vs_rust_err: max_err(c.data(), &r),
        });
    }
    // matmul 1024.
    {
        let n = 1024usize;
        let m = kernel("matmul");
        let sh = [n as i64, n as i64];
        let (mut a, mut b) = (Array::new(&sh, rnd(3)), Array::new(&sh, rnd(4)));
        let mut c = Array::new(&sh, |_| 0.0);
        let kt = time(3, reps(30), || {
            call(&m, "matmul", &mut [&mut a, &mut b, &mut c])
        });
        let mut r = vec![0f32; n * n];
        let rt = time(1, reps(3), || {
            r.iter_mut().for_each(|x| *x = 0.0);
            for i in 0..n {
                for k in 0..n {
                    let x = a.data()[i * n + k];
                    let (row, brow) = (&mut r[i * n..(i + 1) * n], &b.data()[k * n..(k + 1) * n]);
                    for (z, y) in row.iter_mut().zip(brow) {
                        *z += x * y;
                    }
                }
            }
            black_box(&r);
        });
        a.save(&d.join("matmul_a.bin"));
        b.save(&d.join("matmul_b.bin"));
        c.save(&d.join("matmul_out.bin"));
        rows.push(Row {
            name: "matmul 1024",
            unit: "GFLOP/s",
            work: 2.0 * (n * n * n) as f64,
            kiln: kt,
            rust: rt,
            kiln_vs_rust_err: max_err(c.data(), &r),
        });
    }
    // rowsum 4096 x 4096.
    {
        let n = 4096usize;
        let m = kernel("rowsum");
        let mut a = Array::new(&[n as i64, n as i64], rnd(5));
        let mut b = Array::new(&[n as i64], |_| 0.0);
        let kt = time(3, reps(40), || call(&m, "rowsum", &mut [&mut a, &mut b]));
        let mut r = vec![0f32; n];
        let rt = time(2, reps(20), || {
            for (i, z) in r.iter_mut().enumerate() {
                *z = a.data()[i * n..(i + 1) * n].iter().sum();
            }
            black_box(&r);
        });
        a.save(&d.join("rowsum_a.bin"));
        b.save(&d.join("rowsum_out.bin"));
        rows.push(Row {
            name: "rowsum 4096^2",
            unit: "GB/s",
            work: 4.0 * (n * n) as f64,
            kiln: kt,
            rust: rt,
            kiln_vs_rust_err: max_err(b.data(), &r),
        });
    }
    // softmax 4096 x 4096.
    {
        let n = 4096usize;
        let m = kernel("softmax");
        let sh = [n as i64, n as i64];
        let mut a = Array::new(&sh, |i| rnd(6)(i) * 4.0);
        let mut b = Array::new(&sh, |_| 0.0);
        let kt = time(3, reps(30), || call(&m, "softmax", &mut [&mut a, &mut b]));
        let mut r = vec![0f32; n * n];
        let rt = time(1, reps(5), || {
            for (row, out) in a.data().chunks(n).zip(r.chunks_mut(n)) {
                let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut s = 0.0;
                for (o, x) in out.iter_mut().zip(row) {
                    *o = (x - mx).exp();
                    s += *o;
                }
                out.iter_mut().for_each(|o| *o /= s);
            }
            black_box(&r);
        });
        a.save(&d.join("softmax_a.bin"));
        b.save(&d.join("softmax_out.bin"));
        rows.push(Row {
            name: "softmax 4096^2",
            unit: "ms",
            work: 0.0,
            kiln: kt,
            rust: rt,
            kiln_vs_rust_err: max_err(b.data(), &r),
        });
    }

    // Thread pool launch latency: a 64-element vadd, parallel (2 tasks) against serial.
    let launch = {
        let o = CodegenOptions::from_target(&target()).unwrap().resolved();
        let jit = |f| {
            let m = LlvmModule::jit(&IRModule::from_functions(vec![f]), &o).unwrap();
            m.wait_optimized().unwrap();
            m
        };
        let (par, ser) = (
            jit(kiln::schedule::kernels::vadd().unwrap()),
            jit(kiln::ir::kernels::vadd()),
        );
        let mut arrs: Vec<Array> = (0..3).map(|_| Array::new(&[64], |i| i as f32)).collect();
        let per_call = |m: &LlvmModule, arrs: &mut Vec<Array>| {
            let [a, b, c] = &mut arrs[..] else {
                unreachable!()
            };
            let t = time(100, reps(31), || {
                for _ in 0..1000 {
                    call(m, "vadd", &mut [&mut *a, &mut *b, &mut *c]);
                }
            });
            (t.0 / 1e3, t.1 / 1e3, t.2 / 1e3)
        };
        (per_call(&par, &mut arrs), per_call(&ser, &mut arrs))
    };
    for k in ["vadd", "matmul", "rowsum", "softmax"] {
        export_kernel(k, d);
    }
    // numpy, TVM, and kiln's exported libraries through tvm_ffi.
    let py = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/bench_tvm.py");
    let mut args = vec![script.to_owned(), d.display().to_string()];
    if quick {
        args.push("--quick".into());
    }
    // TVM builds for the CPU kiln builds for (TVM's LLVM does not take `native`).
    let tvm_cpu = CodegenOptions::from_target(&target())
        .unwrap()
        .resolved()
        .cpu;
    let mut cmd = Command::new(&py);
    // For an AVX2-only target, numpy's OpenBLAS uses its Haswell kernels as it would on an
    // AVX2-only CPU (numpy's wheels pick OpenBLAS kernels at run time, AVX-512 ones here).
    if !kiln::target::has_avx512(&target()) && std::env::var_os("OPENBLAS_CORETYPE").is_none() {
        cmd.env("OPENBLAS_CORETYPE", "Haswell");
    }
    let other: serde_json::Value = match cmd
        .args(&args)
        .env("KILN_TVM_MCPU", &tvm_cpu)
        .env("KILN_TVM_NUM_CORES", num_cpus().to_string())
        .output()
    {
        Ok(o) if o.status.success() => serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            eprintln!(
                "bench_tvm.py printed no JSON ({e}): {}",
                String::from_utf8_lossy(&o.stdout)
            );
            serde_json::Value::Null
        }),
        Ok(o) => {
            eprintln!(
                "`{py} {script}` failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            serde_json::Value::Null
        }
        Err(e) => {
            eprintln!("cannot run `{py}`: {e}; numpy and TVM columns skipped");
            serde_json::Value::Null
        }
    };
    if let Some(n) = other.get("note").and_then(|v| v.as_str()) {
        eprintln!("bench_tvm.py: {n}");
    }

    println!("CPU: {}", cpu_model());
    println!(
        "kiln and TVM kernels for {} (mcpu {tvm_cpu}); load average {}",
        target().export(),
        util::load_average()
    );
    println!("median [min-max] of repeated calls; x = other time / kiln time (> 1: kiln faster): Rust loop vs");
    println!("kiln JIT; numpy and TVM vs kiln .so through tvm_ffi, timed in interleaved blocks with them, x the median");
    println!("over rounds of (its block median / kiln's block median in the same round) [quartiles]; TVM: its");
    println!("fastest schedule of those python/bench_tvm.py builds (named below the table)\n");
    let fmt = |r: &Row, t: (f64, f64, f64)| -> String {
        if r.work > 0.0 {
            format!(
                "{:.1} [{:.1}-{:.1}] {:.2}ms",
                r.work / t.0 / 1e9,
                r.work / t.2 / 1e9,
                r.work / t.1 / 1e9,
                t.0 * 1e3
            )
        } else {
            format!("{:.2} [{:.2}-{:.2}] ms", t.0 * 1e3, t.1 * 1e3, t.2 * 1e3)
        }
    };
    println!(
        "{:<14} {:>7} | {:>28} | {:>28} | {:>28} {:>5} | {:>28} {:>16} | {:>28} {:>16} | check",
        "kernel",
        "unit",
        "kiln JIT (Rust call)",
        "kiln .so (tvm_ffi)",
        "Rust loop",
        "x",
        "numpy",
        "x",
        "TVM 0.27",
        "x"
    );
    for r in &rows {
        let k = r.name.split_whitespace().next().unwrap_or("").to_owned();
        let get = |who: &str| -> Option<(f64, f64, f64)> {
            let v = other.get(&k)?.get(who)?;
            Some((
                v.get("median")?.as_f64()?,
                v.get("min")?.as_f64()?,
                v.get("max")?.as_f64()?,
            ))
        };
        // numpy and TVM are compared with kiln called the same way, in the same rounds.
        let kffi = get("kiln_ffi");
        let base = kffi.map_or(r.kiln.0, |t| t.0);
        // The paired ratio when the script gave one (it does whenever kiln's .so ran), else
        // the ratio of the two medians.
        let paired = |who: &str| -> Option<String> {
            let v = other.get(&k)?.get(who)?;
            let f = |key: &str| v.get(key).and_then(|x| x.as_f64());
            Some(format!(
                "{:.2} [{:.2}-{:.2}]",
                f("x")?,
                f("x_q1")?,
                f("x_q3")?
            ))
        };
        let cell = |who: &str| match get(who) {
            Some(t) => (
                fmt(r, t),
                paired(who).unwrap_or_else(|| format!("{:.2}", t.0 / base)),
            ),
            None => ("-".into(), "-".into()),
        };
        let (np, npx) = cell("numpy");
        let (tvm, tvmx) = cell("tvm");
        let err = |key: &str| {
            other
                .get(&k)
                .and_then(|v| v.get(key))
                .and_then(|v| v.as_f64())
        };
        let check = match (err("kiln_max_abs_err"), err("kiln_ffi_max_abs_err")) {
            (Some(a), Some(b)) => format!("max|kiln-numpy| {a:.1e} / .so {b:.1e}"),
            (Some(a), None) => format!("max|kiln-numpy| {a:.1e}"),
            _ => format!("max|kiln-Rust| {:.1e}", r.kiln_vs_rust_err),
        };
        println!(
            "{:<14} {:>7} | {:>28} | {:>28} | {:>28} {:>5} | {:>28} {:>16} | {:>28} {:>16} | {}",
            r.name,
            r.unit,
            fmt(r, r.kiln),
            kffi.map_or("-".into(), |t| fmt(r, t)),
            fmt(r, r.rust),
            format!("{:.2}", r.rust.0 / r.kiln.0),
            np,
            npx,
            tvm,
            tvmx,
            check
        );
    }
    for r in &rows {
        let k = r.name.split_whitespace().next().unwrap_or("");
        if let Some(sched) = other
            .get(k)
            .and_then(|v| v.get("tvm_schedule"))
            .and_then(|v| v.as_str())
        {
            let cands = other
                .get(k)
                .and_then(|v| v.get("tvm_candidates"))
                .and_then(|v| v.as_object())
                .map(|m| {
                    let list: Vec<String> = m
                        .iter()
                        .filter_map(|(n, t)| Some(format!("{n} {:.2} ms", t.as_f64()? * 1e3)))
                        .collect();
                    format!(" (fastest of: {})", list.join(", "))
                })
                .unwrap_or_default();
            println!("TVM {k}: {sched}{cands}");
        }
    }
    println!(
        "\nthread pool ({} threads): vadd n=64 per call {:.2} us [{:.2}-{:.2}] parallel vs {:.2} us serial: launch cost {:.2} us",
        kiln::runtime::parallel::ThreadPool::global().num_threads(),
        launch.0 .0 * 1e6,
        launch.0 .1 * 1e6,
        launch.0 .2 * 1e6,
        launch.1 .0 * 1e6,
        (launch.0 .0 - launch.1 .0) * 1e6
    );
}
