//! Matmul register tiles and blocks compared on this machine: the tool behind the choices in
//! `kiln::schedule::kernels::MatmulTiles` (a schedule is tuned by measuring it on each kind of
//! CPU, not by reasoning about one).
//!
//! Each configuration `mr,nr,mb,kc[,pack[,a]]` is `kiln::schedule::kernels::matmul_tiled_packing`
//! with those tiles (`kc` 0: the whole `k` loop in one pass) and `B` packed up front (`pack`
//! `whole`, the default), by each task (`task`, or `taskG` for `G` column panels per task, `taskGp` with the next pass's slice prefetched) or not at all (`none`), and `A` packed up front too when `a` follows (by each task, a pass at a time, when `at` does), JIT-compiled for the target (`KILN_BENCH_MCPU`,
//! default `native`; `num-cores` = the logical CPUs), and called on the same 1024^3 inputs. The
//! configurations run in interleaved rounds (every configuration once per round, a few calls
//! each), so that the machine's load hits them alike; the table gives each one's median GFLOP/s
//! over the rounds with the spread, and its ratio to the first configuration, which is the
//! target's default (`MatmulTiles::for_target_and_depth`) unless configurations are given.
//!
//! Run: `cargo bench --bench matmul_tiles [-- mr,nr,mb,kc[,pack] ...]` (`KILN_BENCH_QUICK=1`: fewer
//! rounds; `KILN_BENCH_SIZE=m,n,k` another shape; `KILN_BENCH_DUMP=DIR` writes each scheduled
//! function there as kiln IR JSON, for `kiln build FILE -o x.s` to show its code).

mod util;
use util::{cpu_model, num_cpus, rnd, Array, Stats};

use std::time::Instant;

use kiln::codegen::llvm::{CodegenOptions, LlvmModule};
use kiln::ir::kernels as plain;
use kiln::ir::IRModule;
use kiln::packed_func::{AnyView, Module};
use kiln::schedule::kernels::{matmul_tiled_packing, MatmulParts, MatmulTiles, PackA, PackB};
use kiln::schedule::Schedule;
use kiln::target::Target;

fn parse_config(s: &str) -> (MatmulTiles, PackB, PackA) {
    let fields: Vec<&str> = s.split(',').map(str::trim).collect();
    let pack_a = match fields.get(5) {
        None => PackA::InPlace,
        Some(&"a") => PackA::Whole,
        Some(&"at") => PackA::InTask,
        Some(other) => {
            panic!("expected `a` (A packed up front) or `at` (A packed by each task) after the pack mode, got {other:?} in {s:?}")
        }
    };
    let pack = match fields.get(4) {
        None | Some(&"whole") => PackB::Whole,
        Some(t) if t.starts_with("task") => PackB::InTask {
            panels: t[4..].trim_end_matches('p').parse().unwrap_or(1),
            ahead: t.ends_with('p'),
        },
        Some(&"none") => PackB::InPlace,
        Some(other) => panic!("expected the pack mode whole, task or none, got {other:?} in {s:?}"),
    };
    let v: Vec<i64> = fields
        .iter()
        .take(4)
        .map(|x| {
            x.parse()
                .unwrap_or_else(|_| panic!("expected mr,nr,mb,kc[,pack] (integers), got {s:?}"))
        })
        .collect();
    assert!(v.len() == 4, "expected mr,nr,mb,kc[,pack], got {s:?}");
    let tiles = MatmulTiles {
        mr: v[0],
        nr: v[1],
        mb: v[2],
        kc: v[3],
    };
    (tiles, pack, pack_a)
}

fn main() {
    let mcpu = std::env::var("KILN_BENCH_MCPU").unwrap_or_else(|_| "native".into());
    let target = Target::from_json(&serde_json::json!({
        "kind": "llvm", "mcpu": mcpu, "num-cores": num_cpus(),
    }))
    .unwrap();
    let (m, n, k) = std::env::var("KILN_BENCH_SIZE").map_or((1024, 1024, 1024), |s| {
        let v: Vec<i64> = s.split(',').map(|x| x.trim().parse().unwrap()).collect();
        (v[0], v[1], v[2])
    });
    let mut configs: Vec<(MatmulTiles, PackB, PackA)> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| parse_config(&a))
        .collect();
    if configs.is_empty() {
        configs.push((
            MatmulTiles::for_target_and_depth(&target, k),
            PackB::Whole,
            PackA::InPlace,
        ));
    }
    let quick = std::env::var_os("KILN_BENCH_QUICK").is_some();
    let (rounds, calls) = if quick { (5, 3) } else { (15, 5) };
    let o = CodegenOptions::from_target(&target).unwrap().resolved();
    println!(
        "CPU: {}; target {} ({}); {m} x {n} x {k}; {rounds} rounds of {calls} calls",
        cpu_model(),
        target.export(),
        o.describe()
    );

    let mut a = Array::new(&[m, k], rnd(1));
    let mut b = Array::new(&[k, n], rnd(2));
    let mut c = Array::new(&[m, n], |_| 0.0);
    // The tensors point into the arrays, which outlive every call.
    let dls = [a.dl(), b.dl(), c.dl()];
    let views: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
    let mut mods = Vec::new();
    for (t, pack, pack_a) in &configs {
        let s = Schedule::new(plain::matmul_sized(m, n, k));
        let f = matmul_tiled_packing(s, &MatmulParts::default(), [m, n, k], *t, *pack, *pack_a)
            .and_then(Schedule::finish)
            .unwrap();
        let ir = IRModule::from_functions(vec![f]);
        if let Some(dir) = std::env::var_os("KILN_BENCH_DUMP") {
            // The scheduled function, for `kiln build FILE -o x.s` (or `x.ll`) to show its code.
            let file = std::path::Path::new(&dir).join(
                format!(
                    "matmul_{}x{}_{}_{}_{:?}_{:?}.json",
                    t.mr, t.nr, t.mb, t.kc, pack, pack_a
                )
                .replace([' ', '{', '}', ':'], ""),
            );
            std::fs::write(&file, ir.to_json_string()).unwrap();
            println!("wrote {}", file.display());
        }
        let start = Instant::now();
        let module = LlvmModule::jit(&ir, &o).unwrap();
        module.wait_optimized().unwrap();
        let build = start.elapsed();
        mods.push((module, build));
    }
    // Check every configuration's output on a few entries against a plain dot product.
    for (module, _) in &mods {
        let f = module.require_function("matmul").unwrap();
        f.call(&views).unwrap();
        for &(i, j) in &[(0, 0), (m - 1, n - 1), (m / 2, n / 3), (m - 1, 0)] {
            let want: f64 = (0..k)
                .map(|p| {
                    f64::from(a.data()[(i * k + p) as usize])
                        * f64::from(b.data()[(p * n + j) as usize])
                })
                .sum();
            let got = f64::from(c.data()[(i * n + j) as usize]);
            assert!(
                (got - want).abs() < 1e-3 * (1.0 + want.abs()),
                "C[{i},{j}] = {got}, expected {want}"
            );
        }
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); mods.len()];
    for _ in 0..rounds {
        for (t, (module, _)) in times.iter_mut().zip(&mods) {
            let f = module.require_function("matmul").unwrap();
            f.call(&views).unwrap();
            for _ in 0..calls {
                let s = Instant::now();
                f.call(&views).unwrap();
                t.push(s.elapsed().as_secs_f64());
            }
        }
    }
    let flops = 2.0 * (m * n * k) as f64;
    let base = Stats::of(&times[0]).median;
    println!("  mr   nr   mb   kc pack   |  GFLOP/s median [min-max] | x first | build (to O3)");
    for ((t, (_, build)), (cfg, pack, pack_a)) in times.iter().zip(&mods).zip(&configs) {
        let pack = match pack_a {
            PackA::InPlace => format!("{pack:?}"),
            PackA::Whole => format!("{pack:?}+A"),
            PackA::InTask => format!("{pack:?}+A in task"),
        };
        let st = Stats::of(t);
        let (md, lo, hi) = (st.median, st.min, st.max);
        println!(
            "{:4} {:4} {:4} {:4} {:6} | {:7.1} [{:.1}-{:.1}] | {:5.3} | {:.1} ms",
            cfg.mr,
            cfg.nr,
            cfg.mb,
            cfg.kc,
            pack,
            flops / md / 1e9,
            flops / hi / 1e9,
            flops / lo / 1e9,
            base / md,
            build.as_secs_f64() * 1e3
        );
    }
}
