//! Build time of TVM's operators: kiln against `tvm.compile`, on the TOPI corpus of
//! `tests/python/tvm_corpus.py` (issue 17's goal: kiln builds at least 5x faster than
//! `tvm.compile`, corpus median), measured in one run.
//!
//! `tvm_corpus.py --emit` converts every operator with `python/kiln_tvm.py` and times
//! `tvm.compile` of its PrimFunc (median of 5 builds in one Python process, TVM loaded and warm:
//! TIR lowering, LLVM at TVM's default level, an in-memory module, no linking). Then, in this
//! process, each converted module is built by kiln:
//! - **callable**: `kiln::codegen::build` (what `target.build.llvm` runs) until its functions are
//!   callable: the JIT's first tier (`codegen/llvm/tiering.rs`), whose code runs the benchmark
//!   kernels at 0.93-1.15x the optimized code's time;
//! - **optimized**: the same build until the background tier has installed the code optimized at
//!   the target's level (O3), the code the run-time figures of `docs/tvm.md` measure;
//! - **O3 JIT**: one tier, O3 code before the build returns (`Tiering::Off`);
//! - **.so**: `kiln::codegen::llvm::export` to a shared library (O3, then the system C compiler
//!   links it), the in-process part of `kiln build`, against `tvm.compile` followed by
//!   `export_library` (TVM links with the system C compiler too).
//!
//! Each kiln figure is the median of several builds without the compile cache. Printed: each
//! operator's times, then per column the median over the corpus, and the median [min-max] of the
//! per-operator ratio tvm.compile / kiln (> 1: kiln builds faster).
//!
//! Needs `$KILN_PYTHON` (default `python3`) with `apache-tvm==0.27.0.post1`; without it, the
//! bench says so and measures nothing. Run: `cargo bench --bench tvm_build`
//! (`KILN_BENCH_QUICK=1`: fewer builds).

#[path = "util/mod.rs"]
mod util;
use util::{median, Stats};

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use kiln::codegen::llvm::{CodegenOptions, LlvmModule, Tiering};
use kiln::ir::IRModule;
use kiln::target::Target;

fn ms(s: f64) -> String {
    format!("{:.1}", s * 1e3)
}

fn main() {
    let py = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_tvm = Command::new(&py)
        .args(["-c", "import tvm, tvm_ffi, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_tvm {
        println!("tvm_build: `{py}` cannot import tvm (pip install apache-tvm==0.27.0.post1); nothing measured");
        return;
    }
    let quick = std::env::var_os("KILN_BENCH_QUICK").is_some();
    let reps = if quick { 3 } else { 7 };
    let target = Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap();
    let opts = CodegenOptions::from_target(&target).unwrap();
    let cpu = opts.clone().resolved().cpu;
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/tvm_corpus.py");
    let out = Command::new(&py)
        .args([script, "--emit"])
        .arg(dir.path())
        .args(["--tvm-mcpu", &cpu])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tvm_corpus.py --emit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
    std::env::set_var("KILN_CACHE", "off");
    println!(
        "CPU: {}; kiln target {{\"kind\": \"llvm\", \"mcpu\": \"native\"}} (mcpu {cpu}), TVM the same CPU; load average {}",
        util::cpu_model(),
        util::load_average()
    );
    println!(
        "{:28} {:>12} {:>10} | {:>10} {:>10} {:>10} {:>10}  (ms, medians)",
        "operator", "tvm.compile", "TVM .so", "callable", "optimized", "O3 JIT", ".so"
    );
    let mut cols: [Vec<f64>; 6] = Default::default();
    let mut ratios: [Vec<f64>; 5] = Default::default();
    for row in index.as_array().unwrap() {
        let op = row["op"].as_str().unwrap();
        let text = std::fs::read_to_string(row["file"].as_str().unwrap()).unwrap();
        let module = IRModule::from_json_str(&text).unwrap();
        let times = |key: &str| -> f64 {
            let v: Vec<f64> = row[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_f64().unwrap())
                .collect();
            median(&v)
        };
        let (tvm, tvm_so) = (times("tvm_build_s"), times("tvm_so_s"));
        let (mut callable, mut optimized, mut o3, mut so) = (vec![], vec![], vec![], vec![]);
        for _ in 0..reps {
            kiln::codegen::llvm::wait_all_optimized();
            let t = Instant::now();
            let m = kiln::codegen::build(&module, &target).unwrap();
            callable.push(t.elapsed().as_secs_f64());
            kiln::codegen::llvm::wait_all_optimized();
            optimized.push(t.elapsed().as_secs_f64());
            drop(m);
            let t = Instant::now();
            let m = LlvmModule::jit_with(&module, &opts, Tiering::Off).unwrap();
            o3.push(t.elapsed().as_secs_f64());
            drop(m);
            let lib = dir.path().join(format!("{op}.so"));
            let t = Instant::now();
            kiln::codegen::llvm::export(&module, &opts, Path::new(&lib)).unwrap();
            so.push(t.elapsed().as_secs_f64());
        }
        let k = [
            median(&callable),
            median(&optimized),
            median(&o3),
            median(&so),
        ];
        println!(
            "{op:28} {:>12} {:>10} | {:>10} {:>10} {:>10} {:>10}",
            ms(tvm),
            ms(tvm_so),
            ms(k[0]),
            ms(k[1]),
            ms(k[2]),
            ms(k[3])
        );
        cols[0].push(tvm);
        cols[5].push(tvm_so);
        for i in 0..4 {
            cols[i + 1].push(k[i]);
            ratios[i].push(tvm / k[i]);
        }
        ratios[4].push(tvm_so / k[3]);
    }
    let n = cols[0].len();
    println!();
    println!(
        "{n} operators; median build time: tvm.compile {} ms, tvm.compile + export_library {} ms",
        ms(median(&cols[0])),
        ms(median(&cols[5]))
    );
    let names = [
        "callable (JIT, first tier)",
        "optimized (JIT, O3 installed)",
        "O3 JIT (one tier)",
        ".so (export + cc link)",
    ];
    for i in 0..4 {
        let r = Stats::of(&ratios[i]);
        println!(
            "  kiln {:32} {:>6} ms   tvm.compile / kiln: median {:.1}x [{:.1}-{:.1}]",
            names[i],
            ms(median(&cols[i + 1])),
            r.median,
            r.min,
            r.max
        );
    }
    let r = Stats::of(&ratios[4]);
    println!(
        "  kiln .so against TVM's .so (tvm.compile + export_library): median {:.1}x [{:.1}-{:.1}]",
        r.median, r.min, r.max
    );
}
