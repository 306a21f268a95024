//! The cost of calling an exported kiln library from a host that is not kiln: a 1-element
//! `vadd` (the benchmark kernel, whose loop is parallel) exported with `kiln build`'s default
//! target.
//!
//! - From a plain C host (`tests/c/pool_host.c bench`, dlopen, no context slot filled): ns per
//!   call of `__tvm_ffi_vadd` against a C function in the host that checks and decodes the
//!   same three DLTensor arguments and adds one float, both timed in the same process (medians
//!   of 15 batches of 20000 calls); the host runs 5 times and the medians are summarized.
//! - From Python through `tvm_ffi` (`python/bench_call.py`, `$KILN_PYTHON`), when `tvm`
//!   imports: against TVM 0.27's export of the same vadd (parallel, as in the kernels bench)
//!   and of a serial one, with and without `import tvm` (which fills the libraries' pool slot
//!   with TVM's pool).
//!
//! Run: `cargo bench --bench export_call`.

mod util;
use util::{cpu_model, Stats};

use std::path::Path;
use std::process::Command;

use kiln::codegen::llvm::{export, CodegenOptions};
use kiln::ir::IRModule;
use kiln::target::Target;

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let t = Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap();
    let o = CodegenOptions::from_target(&t).unwrap();
    let module = IRModule::from_functions(vec![kiln::schedule::kernels::vadd().unwrap()]);
    export(&module, &o, &d.join("kiln_vadd.so")).unwrap();
    println!("CPU: {}", cpu_model());
    println!(
        "1-element vadd exported for {}; median [min-max]",
        t.export()
    );

    // The plain C host.
    let exe = d.join("pool_host");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/pool_host.c");
    let st = Command::new(cc)
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(src)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(st.success(), "compiling pool_host.c");
    let (mut k, mut c, mut r) = (vec![], vec![], vec![]);
    for _ in 0..5 {
        let out = Command::new(&exe)
            .arg("bench")
            .arg(d.join("kiln_vadd.so"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<f64> = text
            .lines()
            .find_map(|l| l.strip_prefix("call_ns: "))
            .unwrap_or_else(|| panic!("pool_host: {text}"))
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        k.push(v[0]);
        c.push(v[1]);
        r.push(v[2]);
    }
    let (ks, cs, rs) = (Stats::of(&k), Stats::of(&c), Stats::of(&r));
    println!(
        "plain C host: __tvm_ffi_vadd {:.2} ns [{:.2}-{:.2}], C decode+add {:.2} ns [{:.2}-{:.2}]; kiln / C = {:.2} [{:.2}-{:.2}] (goal <= 1.5)",
        ks.median, ks.min, ks.max, cs.median, cs.min, cs.max, rs.median, rs.min, rs.max
    );

    // Python through tvm_ffi, beside TVM's exports.
    let py = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/bench_call.py");
    let has_tvm = Command::new(&py)
        .args(["-c", "import tvm, tvm_ffi, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_tvm {
        println!("python: `{py}` cannot import tvm, tvm_ffi and numpy; the tvm_ffi comparison is skipped");
        return;
    }
    let mcpu = o.resolved().cpu;
    let st = Command::new(&py)
        .args([script, "build", d.to_str().unwrap(), &mcpu])
        .status()
        .unwrap();
    assert!(st.success(), "bench_call.py build");
    // TVM's serial export from the same plain C host (it needs libtvm_ffi's symbols: preloaded).
    let lib_ffi = Command::new(&py)
        .args([
            "-c",
            "import pathlib, tvm_ffi; print(pathlib.Path(tvm_ffi.__file__).parent / 'lib' / 'libtvm_ffi.so')",
        ])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|p| Path::new(p).exists());
    if let Some(ffi) = lib_ffi {
        let mut t = vec![];
        for _ in 0..5 {
            let out = Command::new(&exe)
                .arg("bench")
                .arg(d.join("tvm_serial_vadd.so"))
                .env("LD_PRELOAD", &ffi)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(v) = text.lines().find_map(|l| l.strip_prefix("call_ns: ")) {
                t.push(v.split_whitespace().next().unwrap().parse::<f64>().unwrap());
            }
        }
        if !t.is_empty() {
            let ts = Stats::of(&t);
            println!(
                "plain C host, TVM 0.27's serial vadd export (libtvm_ffi preloaded): {:.2} ns [{:.2}-{:.2}]; kiln / TVM = {:.2}",
                ts.median,
                ts.min,
                ts.max,
                ks.median / ts.median
            );
        }
    }
    for import in [false, true] {
        let mut args = vec![script, "time", d.to_str().unwrap()];
        if import {
            args.push("--import-tvm");
        }
        let out = Command::new(&py).args(&args).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "bench_call.py: {e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let get = |k: &str| -> Option<(f64, f64, f64)> {
            let x = v.get(k)?;
            Some((
                x["median"].as_f64()?,
                x["min"].as_f64()?,
                x["max"].as_f64()?,
            ))
        };
        let kiln = get("kiln").unwrap();
        let mut line = format!(
            "python tvm_ffi{}: kiln {:.0} ns [{:.0}-{:.0}]",
            if import {
                " after `import tvm`"
            } else {
                ", no tvm"
            },
            kiln.0,
            kiln.1,
            kiln.2
        );
        for (key, what) in [
            ("tvm", "TVM parallel vadd"),
            ("tvm_serial", "TVM serial vadd"),
        ] {
            if let Some(t) = get(key) {
                line += &format!(
                    "; {what} {:.0} ns [{:.0}-{:.0}], kiln / TVM = {:.2}",
                    t.0,
                    t.1,
                    t.2,
                    kiln.0 / t.0
                );
            }
        }
        println!("{line}");
    }
}
