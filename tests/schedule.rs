//! Schedule primitives: each transform verifies and computes what the plain loop nest computes
//! (interpreter and JIT), the scheduled benchmark kernels are `examples/kernels/*.json`, and
//! their hot loops are vector code.

mod common;
#[path = "ir/common.rs"]
mod ir_common;

use common::{interp_last, jit_last, schedule_inputs as inputs, HostArray};
use kiln::codegen::llvm::{CodegenOptions, LlvmModule};
use kiln::ir::{kernels, IRModule, PrimFunc};
use kiln::packed_func::{AnyView, Module};
use kiln::schedule::{kernels as sk, AxisMap, Schedule, ScheduleError, Step};

fn fast_opts() -> CodegenOptions {
    let mut o = CodegenOptions::host();
    o.fast_math = "fast".into();
    o
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: [{i}] {g} vs {w}"
        );
    }
}

/// Scheduled `f` agrees with `plain` in the interpreter, and JIT-compiled (IEEE and fast math).
fn same_results(plain: &PrimFunc, f: &PrimFunc, shapes: &[Vec<i64>]) {
    f.verify().unwrap();
    let want = interp_last(plain, shapes);
    close(
        &format!("{} interp", f.name),
        &interp_last(f, shapes),
        &want,
        1e-5,
    );
    close(
        &format!("{} jit", f.name),
        &jit_last(f, shapes, &CodegenOptions::host()),
        &want,
        1e-5,
    );
    close(
        &format!("{} jit fast-math", f.name),
        &jit_last(f, shapes, &fast_opts()),
        &want,
        1e-5,
    );
}

#[test]
fn scheduled_benchmark_kernels_compute_what_the_plain_ones_do() {
    same_results(&kernels::vadd(), &sk::vadd().unwrap(), &vec![vec![1003]; 3]);
    // m = 72 leaves a partial row block and a partial register block; k = 9 is odd.
    same_results(
        &kernels::matmul_sized(72, 64, 9),
        &sk::matmul_sized(72, 64, 9).unwrap(),
        &[vec![72, 9], vec![9, 64], vec![72, 64]],
    );
    same_results(
        &kernels::matmul_sized(13, 32, 40),
        &sk::matmul_sized(13, 32, 40).unwrap(),
        &[vec![13, 40], vec![40, 32], vec![13, 32]],
    );
    same_results(
        &kernels::rowsum_sized(7, 192),
        &sk::rowsum_sized(7, 192).unwrap(),
        &[vec![7, 192], vec![7]],
    );
    same_results(
        &kernels::softmax_sized(5, 128),
        &sk::softmax_sized(5, 128).unwrap(),
        &[vec![5, 128], vec![5, 128]],
    );
}

/// `examples/kernels/plain/*.json` are the kernels before any schedule (what `kiln tune`
/// starts from): the matmul of the builder, and the softmax algorithm the hand schedule
/// starts from (`fast_exp`, as TVM's `fast_softmax`). `KILN_BLESS=1` regenerates them.
#[test]
fn the_plain_example_kernels_are_the_algorithms() {
    let softmax = |r, c| sk::softmax_algorithm(r, c, kiln::ir::Intrinsic::FastExp);
    for (file, f) in [
        ("matmul_256", kernels::matmul_sized(256, 256, 256)),
        ("softmax_256x1024", softmax(256, 1024)),
        ("softmax_4096x4096", softmax(4096, 4096)),
    ] {
        let m = IRModule::from_functions(vec![f]);
        m.verify().unwrap();
        ir_common::check_snapshot(
            &format!("examples/kernels/plain/{file}.json"),
            &(m.to_json_string() + "\n"),
        );
    }
}

#[test]
fn the_example_kernels_are_the_scheduled_kernels() {
    // `KILN_BLESS=1` regenerates examples/kernels/*.json from `kiln::schedule::kernels`.
    for f in [sk::vadd(), sk::matmul(), sk::rowsum(), sk::softmax()] {
        let m = IRModule::from_functions(vec![f.unwrap()]);
        m.verify().unwrap();
        let name = &m.functions[0].name;
        ir_common::check_snapshot(
            &format!("examples/kernels/{name}.json"),
            &(m.to_json_string() + "\n"),
        );
    }
    // The AVX2 matmul (6 x 16 register tiles), which the quickstart builds on CPUs without
    // AVX-512.
    let m = IRModule::from_functions(vec![sk::matmul_tiled(
        1024,
        1024,
        1024,
        sk::MatmulTiles::AVX2,
    )
    .unwrap()]);
    m.verify().unwrap();
    ir_common::check_snapshot(
        "examples/kernels/matmul_avx2.json",
        &(m.to_json_string() + "\n"),
    );
    // The AVX2 softmax (the max in 32 lanes, `exp` in 32), likewise.
    let m = IRModule::from_functions(vec![
        sk::softmax_with(4096, 4096, sk::SoftmaxLanes::AVX2).unwrap()
    ]);
    m.verify().unwrap();
    ir_common::check_snapshot(
        "examples/kernels/softmax_avx2.json",
        &(m.to_json_string() + "\n"),
    );
}

fn asm_of(f: PrimFunc) -> String {
    let m = LlvmModule::jit(&IRModule::from_functions(vec![f]), &fast_opts()).unwrap();
    m.get_source("asm").unwrap()
}

/// The instructions of the innermost loop that contains `needle` (the block ending in a backward
/// jump), as a rough view of the hot loop.
fn hot_loop_with(asm: &str, needle: &str) -> Option<String> {
    let lines: Vec<&str> = asm.lines().collect();
    let mut label_at = std::collections::HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        if let Some(lbl) = l.strip_suffix(':') {
            label_at.insert(lbl.trim().to_owned(), i);
        }
    }
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim();
        if !t.starts_with('j') {
            continue;
        }
        let Some(target) = t.split_whitespace().nth(1) else {
            continue;
        };
        if let Some(&start) = label_at.get(target) {
            if start < i {
                let body = lines[start..=i].join("\n");
                if body.contains(needle) {
                    return Some(body);
                }
            }
        }
    }
    None
}

#[test]
fn hot_loops_are_vector_code() {
    let host = CodegenOptions::host();
    let wide = if host.features.contains("+avx512f") {
        "zmm"
    } else if host.features.contains("+avx2") {
        "ymm"
    } else {
        eprintln!("no AVX2 on this host: only checking for xmm");
        "xmm"
    };
    let asm = asm_of(sk::matmul_sized(128, 128, 128).unwrap());
    let l = hot_loop_with(&asm, "vfmadd").expect("matmul has an FMA loop");
    assert!(l.contains(wide), "matmul FMA loop is not {wide} code:\n{l}");
    let n_fma = l.lines().filter(|x| x.contains("vfmadd")).count();
    assert!(n_fma >= 8, "matmul inner loop has {n_fma} FMAs:\n{l}");
    let asm = asm_of(sk::vadd().unwrap());
    let l = hot_loop_with(&asm, "vaddps").expect("vadd has a vector add loop");
    // vadd is left to LLVM's loop vectorizer, which follows the CPU's tuning: on CPUs tuned
    // `prefer-256-bit` (skylake-avx512, icelake) it picks ymm even where zmm exists.
    let vadd_ok = l.contains(wide) || (wide == "zmm" && l.contains("ymm"));
    assert!(vadd_ok, "vadd loop is not {wide} code:\n{l}");
    let asm = asm_of(sk::softmax_sized(64, 256).unwrap());
    assert!(
        !asm.contains("expf"),
        "softmax calls libm expf instead of the vector polynomial"
    );
}

#[test]
fn split_with_a_remainder_guards_the_tail() {
    let f = kernels::vadd();
    let mut s = Schedule::new(f.clone());
    let (o, i) = s.split("i", 8).unwrap();
    assert_eq!((o.as_str(), i.as_str()), ("i_o", "i_i"));
    let text = s.func().to_string();
    assert!(text.contains("if i_o * 8i64 + i_i < n"), "{text}");
    s.vectorize("i_i").unwrap();
    same_results(&f, &s.finish().unwrap(), &vec![vec![21]; 3]);
}

#[test]
fn tile_fuse_and_reorder_keep_results() {
    let f = kernels::matmul_sized(12, 10, 7);
    let shapes = [vec![12, 7], vec![7, 10], vec![12, 10]];
    let mut s = Schedule::new(f.clone());
    let [io, jo, ii, ji] = s.tile("i", "j", 4, 5).unwrap();
    let fused = s.fuse(&io, &jo).unwrap();
    s.parallel(&fused).unwrap();
    s.unroll(&ii).unwrap();
    let _ = ji;
    same_results(&f, &s.finish().unwrap(), &shapes);
}

#[test]
fn reorder_rejects_loops_that_are_not_one_nest() {
    let mut s = Schedule::new(kernels::matmul_sized(4, 4, 4));
    // `k0` sits below a sequence (the init store), so `i, j, k0` is not a perfect nest.
    let err = s.reorder(&["k0", "i"]).unwrap_err();
    assert!(matches!(err, ScheduleError::Form { .. }), "{err}");
    let err = s.split("nope", 4).unwrap_err().to_string();
    assert!(err.contains("exactly one loop named `nope`"), "{err}");
}

#[test]
fn layout_transform_cache_write_and_rfactor_from_json_steps() {
    let f = kernels::matmul_sized(16, 32, 8);
    let shapes = [vec![16, 8], vec![8, 32], vec![16, 32]];
    let steps: Vec<Step> = serde_json::from_str(
        r#"[
          {"transform_layout": {"buffer": "B", "into": "Bt", "dims": [{"axis": 1, "div": 8}, {"axis": 0}, {"axis": 1, "modulo": 8}]}},
          {"split": {"loop": "j", "factor": 8}},
          {"cache_write": {"buffer": "C", "at": "j_o"}},
          {"kind": {"loop": "i", "kind": "parallel"}}
        ]"#,
    )
    .unwrap();
    let mut s = Schedule::new(f.clone());
    s.apply(&steps).unwrap();
    let g = s.finish().unwrap();
    assert!(g.to_string().contains("C_local"), "{g}");
    same_results(&f, &g, &shapes);
    // rfactor on a max reduction.
    let f = sk::softmax_algorithm(3, 32, kiln::ir::Intrinsic::Exp);
    let mut s = Schedule::new(f.clone());
    let (o, i) = s.split("jm", 8).unwrap();
    s.rfactor(&o, &i).unwrap();
    s.vectorize(&i).unwrap();
    same_results(&f, &s.finish().unwrap(), &[vec![3, 32], vec![3, 32]]);
    // A layout map that merges indices is refused.
    let mut s = Schedule::new(kernels::matmul_sized(4, 8, 4));
    let err = s
        .transform_layout("B", "Bx", &[AxisMap::inner(1, 4), AxisMap::id(0)])
        .unwrap_err();
    assert!(err.to_string().contains("apart"), "{err}");
}

#[test]
fn scheduled_kernels_are_correct_for_unaligned_data() {
    // Data pointers 4 bytes past an 8-byte boundary (never 16-, 32- or 64-byte aligned).
    let o = fast_opts();
    for (plain, f, shapes) in [
        (kernels::vadd(), sk::vadd().unwrap(), vec![vec![77i64]; 3]),
        (
            kernels::matmul_sized(24, 64, 17),
            sk::matmul_sized(24, 64, 17).unwrap(),
            vec![vec![24, 17], vec![17, 64], vec![24, 64]],
        ),
        (
            kernels::matmul_sized(70, 48, 19),
            sk::matmul_tiled(70, 48, 19, sk::MatmulTiles::AVX2).unwrap(),
            vec![vec![70, 19], vec![19, 48], vec![70, 48]],
        ),
        (
            kernels::matmul_sized(70, 48, 19),
            sk::matmul_tiled(
                70,
                48,
                19,
                sk::MatmulTiles {
                    mb: 12,
                    ..sk::MatmulTiles::AVX2
                },
            )
            .unwrap(),
            vec![vec![70, 19], vec![19, 48], vec![70, 48]],
        ),
        (
            kernels::rowsum_sized(3, 128),
            sk::rowsum_sized(3, 128).unwrap(),
            vec![vec![3, 128], vec![3]],
        ),
        (
            kernels::softmax_sized(3, 64),
            sk::softmax_sized(3, 64).unwrap(),
            vec![vec![3, 64], vec![3, 64]],
        ),
    ] {
        let want = interp_last(&plain, &shapes);
        let m = LlvmModule::jit(&IRModule::from_functions(vec![f.clone()]), &o).unwrap();
        let pf = m.require_function(&f.name).unwrap();
        // One extra element in front; the tensor starts at element 1.
        let mut arrays: Vec<HostArray> = inputs(&shapes)
            .iter()
            .map(|v| {
                let mut padded = vec![0.0f32];
                padded.extend_from_slice(v);
                HostArray::f32(&[padded.len() as i64], &padded)
            })
            .collect();
        let mut shape_store: Vec<Vec<i64>> = shapes.clone();
        let dls: Vec<_> = arrays
            .iter_mut()
            .zip(shape_store.iter_mut())
            .map(|(a, s)| {
                let mut d = a.dl();
                // SAFETY: the array holds one element more than the shape covers.
                d.data = unsafe { d.data.cast::<f32>().add(1) }.cast();
                d.ndim = s.len() as i32;
                d.shape = s.as_mut_ptr();
                assert_eq!(d.data as usize % 8, 4);
                d
            })
            .collect();
        let views: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
        pf.call(&views).unwrap();
        let got = arrays.last().unwrap().to_f32()[1..].to_vec();
        close(&format!("{} unaligned", f.name), &got, &want, 1e-5);
    }
}

/// matmul's register tiles follow the target's CPU: AVX-512 CPUs (named, `native` on one, or
/// `+avx512f`) get 8 x 32, the others 6 x 16; `-avx512f` wins over the CPU.
#[test]
fn matmul_tiles_follow_the_targets_vector_registers() {
    let tiles = |t: &str| sk::MatmulTiles::for_target(&kiln::target::Target::parse(t).unwrap());
    assert_eq!(
        tiles(r#"{"kind": "llvm", "mcpu": "haswell"}"#),
        sk::MatmulTiles::AVX2
    );
    assert_eq!(
        tiles(r#"{"kind": "llvm", "mcpu": "znver3"}"#),
        sk::MatmulTiles::AVX2
    );
    assert_eq!(
        tiles(r#"{"kind": "llvm", "mcpu": "skylake-avx512"}"#),
        sk::MatmulTiles::AVX512
    );
    assert_eq!(
        tiles(r#"{"kind": "llvm", "mcpu": "znver4"}"#),
        sk::MatmulTiles::AVX512
    );
    assert_eq!(
        tiles(r#"{"kind": "llvm", "mcpu": "haswell", "mattr": ["+avx512f"]}"#),
        sk::MatmulTiles::AVX512
    );
    assert_eq!(
        tiles(r#"{"kind": "llvm", "mcpu": "znver4", "mattr": ["-avx512f"]}"#),
        sk::MatmulTiles::AVX2
    );
    // `native`: the host's features decide.
    let host_has = kiln::target::host_cpu().is_some_and(|(_, f)| f.iter().any(|x| x == "+avx512f"));
    let want = if host_has {
        sk::MatmulTiles::AVX512
    } else {
        sk::MatmulTiles::AVX2
    };
    assert_eq!(tiles(r#"{"kind": "llvm", "mcpu": "native"}"#), want);
}

/// matmul's row blocks follow the L2 cache: `mb` rows of `A` in half of it, a multiple of
/// `mr`, between `mr` and `MATMUL_MB_MAX`; the L2 is the host's whatever CPU the target names
/// (that CPU's instructions, this machine's caches), a named CPU's only where the host's cannot
/// be read.
#[test]
fn matmul_row_blocks_follow_the_l2_cache() {
    assert_eq!(sk::block_rows(256 << 10, 1024, 4), 32);
    assert_eq!(sk::block_rows(2 << 20, 1024, 8), 256);
    assert_eq!(sk::block_rows(1 << 20, 1024, 8), 128);
    assert_eq!(sk::block_rows(64 << 20, 1024, 8), sk::MATMUL_MB_MAX);
    assert_eq!(sk::block_rows(512 << 10, 1024, 8), 64);
    assert_eq!(sk::block_rows(256 << 10, 1024, 8), 32);
    assert_eq!(sk::block_rows(256 << 10, 3000, 8), 8);
    assert_eq!(sk::block_rows(256 << 10, 100_000, 4), 4);
    assert_eq!(sk::block_rows(1 << 20, 1500, 6), 84);
    assert_eq!(sk::block_rows(256 << 10, 1500, 6), 18);
    let target = |t: &str| kiln::target::Target::parse(t).unwrap();
    let tiles = |t: &str, k| sk::MatmulTiles::for_target_and_depth(&target(t), k);
    let host_l2 = kiln::target::host_caches().l2;
    for (t, table_l2, (mr, nr)) in [
        (r#"{"kind": "llvm", "mcpu": "haswell"}"#, 256 << 10, (6, 16)),
        (
            r#"{"kind": "llvm", "mcpu": "sapphirerapids"}"#,
            2 << 20,
            (8, 32),
        ),
        // An unknown CPU: the smallest L2 (256 KiB) where the host's is not known.
        (r#"{"kind": "llvm", "mcpu": "x86-64"}"#, 256 << 10, (6, 16)),
    ] {
        let l2 = host_l2.unwrap_or(table_l2);
        assert_eq!(kiln::target::l2_bytes(&target(t)), l2, "{t}");
        let got = tiles(t, 1024);
        let least = sk::MATMUL_MB_MIN / mr * mr;
        assert_eq!(
            (got.mr, got.nr, got.mb, got.kc),
            (mr, nr, sk::block_rows(l2, 1024, mr).max(least), 0),
            "{t}"
        );
    }
    // One pass, whatever the depth: where the block of A does not fit half the L2, the least
    // rows (120 in tiles of 6 or 8), A streaming past the panels of B.
    for k in [64, 1024, 4096, 100_000] {
        for t in [
            r#"{"kind": "llvm", "mcpu": "haswell"}"#,
            r#"{"kind": "llvm", "mcpu": "sapphirerapids"}"#,
        ] {
            let got = tiles(t, k);
            assert_eq!(got.kc, 0, "{t} k={k}");
            assert!(got.mb >= 120 && got.mb % got.mr == 0, "{t} k={k}: {got:?}");
            assert!(got.mb <= sk::MATMUL_MB_MAX, "{t} k={k}: {got:?}");
        }
    }
    // The passes that would keep 120 rows in half the L2 (a starting point of the tuner):
    // with 256 KiB of L2 (a Haswell's), 30 rows of depth 1024 would fit; 126 rows of 256 steps
    // do.
    assert_eq!(sk::depth_block(256 << 10, 1024), 256);
    assert_eq!(sk::block_rows(256 << 10, 256, 6), 126);
    // Passes of k: none when MATMUL_MB_MIN rows fit; else the fewest that divide k.
    assert_eq!(sk::depth_block(2 << 20, 1024), 0);
    assert_eq!(sk::depth_block(1 << 20, 1024), 0);
    assert_eq!(sk::depth_block(512 << 10, 1024), 512);
    assert_eq!(sk::depth_block(256 << 10, 1000), 250);
    // 1031 is prime: no pass length divides it, one pass.
    assert_eq!(sk::depth_block(256 << 10, 1031), 0);
    assert_eq!(sk::depth_block(256 << 10, 0), 0);
    let native_t = r#"{"kind": "llvm", "mcpu": "native"}"#;
    let native = tiles(native_t, 1024);
    let l2 = kiln::target::l2_bytes(&target(native_t));
    assert_eq!(l2, host_l2.unwrap_or(256 << 10));
    assert_eq!(
        (native.mb, native.kc),
        (
            sk::block_rows(l2, 1024, native.mr).max(sk::MATMUL_MB_MIN / native.mr * native.mr),
            0
        )
    );
    assert!(native.mb % native.mr == 0 && native.mb <= sk::MATMUL_MB_MAX);
}

/// Built for an AVX2-only CPU, matmul's inner loop is ymm FMAs with no spill to the stack.
#[test]
fn the_avx2_matmul_keeps_its_accumulators_in_registers() {
    let t = kiln::target::Target::parse(r#"{"kind": "llvm", "mcpu": "haswell"}"#).unwrap();
    let o = CodegenOptions::from_target(&t).unwrap();
    let f = sk::matmul_tiled(64, 64, 64, sk::MatmulTiles::for_target(&t)).unwrap();
    let m = LlvmModule::jit(&IRModule::from_functions(vec![f]), &o).unwrap();
    m.wait_optimized().unwrap();
    let asm = m.get_source("asm").unwrap();
    assert!(
        asm.contains("vfmadd231ps") && asm.contains("%ymm"),
        "no ymm FMA"
    );
    assert!(!asm.contains("%zmm"), "zmm registers on an AVX2 target");
    // The k loop (the block with the FMAs): no vector register goes to or comes from the
    // stack.
    let lines: Vec<&str> = asm.lines().collect();
    let first = lines.iter().position(|l| l.contains("vfmadd")).unwrap();
    let last = lines.iter().rposition(|l| l.contains("vfmadd")).unwrap();
    let spills: Vec<&&str> = lines[first..=last]
        .iter()
        .filter(|l| l.contains("%ymm") && l.contains("(%rsp)"))
        .collect();
    assert!(spills.is_empty(), "vector spills in the k loop: {spills:?}");
}

/// Every benchmark kernel built for an AVX2-only CPU is ymm vector code (no zmm register): the
/// kernels the bench runs for `haswell` (matmul with that CPU's tiles and row blocks).
#[test]
fn the_benchmark_kernels_for_haswell_use_ymm_registers_only() {
    let t = kiln::target::Target::parse(r#"{"kind": "llvm", "mcpu": "haswell"}"#).unwrap();
    let o = CodegenOptions::from_target(&t).unwrap();
    for f in [
        sk::vadd().unwrap(),
        sk::matmul_tiled(
            128,
            128,
            128,
            sk::MatmulTiles::for_target_and_depth(&t, 128),
        )
        .unwrap(),
        sk::rowsum_sized(64, 256).unwrap(),
        sk::softmax_sized(64, 256).unwrap(),
    ] {
        let name = f.name.clone();
        let m = LlvmModule::jit(&IRModule::from_functions(vec![f]), &o).unwrap();
        m.wait_optimized().unwrap();
        let asm = m.get_source("asm").unwrap();
        assert!(asm.contains("%ymm"), "{name}: no ymm code");
        assert!(!asm.contains("%zmm"), "{name}: zmm register on haswell");
    }
}

/// `C[i, j] += A[i, k] * B[k, j]` with no init: the output's values on entry count.
fn matmul_accumulate(m: i64, n: i64, k: i64) -> PrimFunc {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param};
    let buf = |name: &str, s: [i64; 2]| {
        Buffer::new(
            name,
            DataType::f32(),
            s.iter().map(|&d| Expr::from(d)).collect(),
        )
    };
    let (a, b, c) = (buf("A", [m, k]), buf("B", [k, n]), buf("C", [m, n]));
    let body = for_range("i", m, ForKind::Serial, |i| {
        for_range("j", n, ForKind::Serial, |j| {
            for_range("k0", k, ForKind::Serial, |r| {
                let ij = [i.clone(), j.clone()];
                c.store(
                    ij.clone(),
                    c.load(ij) + a.load([i.clone(), r.clone()]) * b.load([r.clone(), j.clone()]),
                )
            })
        })
    });
    PrimFunc::new(
        "matmul_acc",
        [a, b, c].into_iter().map(Param::Buffer).collect(),
        body,
    )
}

#[test]
fn cache_write_loads_the_output_only_when_its_values_are_read_before_written() {
    let shapes = [vec![8, 6], vec![6, 16], vec![8, 16]];
    // With the init `C[i, j] = 0` first in the tile, the cache's read-in would be dead: none.
    let f = kernels::matmul_sized(8, 16, 6);
    let mut s = Schedule::new(f.clone());
    let (_, ji) = s.split("j", 4).unwrap();
    s.reorder(&["i", "j_o", &ji]).unwrap();
    s.cache_write("C", "j_o").unwrap();
    let g = s.finish().unwrap();
    let text = g.to_string();
    assert!(text.contains("C_local") && !text.contains("C_cr"), "{g}");
    same_results(&f, &g, &shapes);
    // Accumulating into C's values on entry: the read-in stays, and the results agree.
    let f = matmul_accumulate(8, 16, 6);
    let mut s = Schedule::new(f.clone());
    s.split("j", 4).unwrap();
    s.cache_write("C", "j_o").unwrap();
    let g = s.finish().unwrap();
    assert!(g.to_string().contains("C_cr"), "{g}");
    same_results(&f, &g, &shapes);
    // Init of part of the tile only (the loop covers 2 of the 4 columns): the read-in stays.
    let f = kernels::matmul_sized(8, 16, 6);
    let mut s = Schedule::new(f.clone());
    let (_, ji) = s.split("j", 4).unwrap();
    s.reorder(&["i", "j_o", &ji]).unwrap();
    let (_, _) = s.split(&ji, 2).unwrap();
    s.cache_write("C", "j_o").unwrap();
    let g = s.finish().unwrap();
    same_results(&f, &g, &shapes);
}

/// `for i { <prefix>; for j { B[i, j] = A[i, j] + 1 }; for j { B[i, j] = B[i, j] * 2 } }`, the
/// prefix built from the row's `i`.
fn rows_with_prefix(
    prefix: impl Fn(&kiln::ir::Buffer, &kiln::ir::Expr) -> kiln::ir::Stmt,
) -> PrimFunc {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, Stmt};
    let buf = |name: &str| Buffer::new(name, DataType::f32(), vec![Expr::from(4), Expr::from(8)]);
    let (a, b) = (buf("A"), buf("B"));
    let body = for_range("i", 4, ForKind::Serial, |i| {
        Stmt::Seq(vec![
            prefix(&b, &i),
            for_range("j", 8, ForKind::Serial, |j| {
                b.store([i.clone(), j.clone()], a.load([i.clone(), j]) + 1.0f32)
            }),
            for_range("j2", 8, ForKind::Serial, |j| {
                b.store([i.clone(), j.clone()], b.load([i.clone(), j]) * 2.0f32)
            }),
        ])
    });
    PrimFunc::new("rows", vec![Param::Buffer(a), Param::Buffer(b)], body)
}

/// `rows_with_prefix(prefix)` with `B` cached at the row loop: whether the cache is read in,
/// after checking that the results agree with the plain function's.
fn reads_in_after(prefix: impl Fn(&kiln::ir::Buffer, &kiln::ir::Expr) -> kiln::ir::Stmt) -> bool {
    let f = rows_with_prefix(prefix);
    let mut s = Schedule::new(f.clone());
    s.cache_write("B", "i").unwrap();
    let g = s.finish().unwrap();
    same_results(&f, &g, &[vec![4, 8], vec![4, 8]]);
    g.to_string().contains("B_cr")
}

/// A one-element scratch buffer `t` around `body(t)`.
fn with_scratch(body: impl FnOnce(&kiln::ir::Buffer) -> kiln::ir::Stmt) -> kiln::ir::Stmt {
    use kiln::ir::{Buffer, DataType, Expr, StorageScope};
    let t = Buffer::temp(
        "t",
        DataType::f32(),
        vec![Expr::from(1)],
        StorageScope::Local,
    );
    t.allocate(body(&t))
}

#[test]
fn cache_write_finds_the_first_write_past_statements_that_leave_the_cache_alone() {
    use kiln::ir::builder::let_stmt;
    use kiln::ir::{DataType, Expr};
    // A softmax row: its max and the sum's init come before the exponentials are written. The
    // read-in of `B` is dead: none (the output is then written once, by the write-back).
    let f = kernels::softmax_sized(4, 32);
    let mut s = Schedule::new(f.clone());
    s.cache_write("B", "i").unwrap();
    let g = s.finish().unwrap();
    let text = g.to_string();
    assert!(text.contains("B_local") && !text.contains("B_cr"), "{g}");
    same_results(&f, &g, &[vec![4, 32], vec![4, 32]]);
    // A prefix that leaves `B` alone (a scratch value, a `let`): no read-in.
    assert!(!reads_in_after(|_, i| with_scratch(|t| {
        let_stmt("k", i.clone(), |k| {
            t.store([Expr::from(0)], k.cast(DataType::f32()))
        })
    })));
    // A prefix that reads `B` before the write: the read-in stays, and the results agree.
    assert!(reads_in_after(|b, i| with_scratch(|t| {
        t.store([Expr::from(0)], b.load([i.clone(), Expr::from(3)]))
    })));
    // The same read in a `let`'s value: the read-in stays.
    assert!(reads_in_after(|b, i| with_scratch(|t| {
        let_stmt("v", b.load([i.clone(), Expr::from(5)]), |v| {
            t.store([Expr::from(0)], v)
        })
    })));
}

/// `partition` splits a loop's range in two loops that compute what the one did; the second
/// starts at 0 and its inner loops are renamed, so each part takes its own schedule.
#[test]
fn partition_splits_a_range_into_two_loops_scheduled_apart() {
    let f = kernels::matmul_sized(10, 32, 7);
    let shapes = [vec![10, 7], vec![7, 32], vec![10, 32]];
    let mut s = Schedule::new(f.clone());
    let map = s.partition("i", 6).unwrap();
    assert_eq!(map["i"], "i_p");
    assert_eq!(map["j"], "j_p");
    assert_eq!(map["k0"], "k0_p");
    // Different schedules for the two parts.
    s.split("j", 8).unwrap();
    s.vectorize("j_i").unwrap();
    s.parallel("i_p").unwrap();
    s.split("k0_p", 2).unwrap();
    let g = s.finish().unwrap();
    let text = g.to_string();
    assert!(text.contains("i_p: int64 in parallel(0i64, 4i64)"), "{g}");
    same_results(&f, &g, &shapes);
    // The same from a JSON step, and partitioning the second part again.
    let steps: Vec<Step> = serde_json::from_str(
        r#"[{"partition": {"loop": "i", "at": 3}}, {"partition": {"loop": "i_p", "at": 5}}]"#,
    )
    .unwrap();
    let mut s = Schedule::new(f.clone());
    s.apply(&steps).unwrap();
    let g = s.finish().unwrap();
    assert!(g.to_string().contains("i_p_p"), "{g}");
    same_results(&f, &g, &shapes);
    // Bad input: each is an error naming what was expected.
    let mut s = Schedule::new(f.clone());
    for at in [0, 10, -1, 11] {
        let e = s.partition("i", at).unwrap_err().to_string();
        assert!(
            e.contains("0 < at < 10") && e.contains(&format!("at = {at}")),
            "{e}"
        );
    }
    let e = s.partition("nope", 2).unwrap_err().to_string();
    assert!(e.contains("exactly one loop named `nope`"), "{e}");
    let e = Schedule::new(kernels::vadd())
        .partition("i", 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("constant bounds"), "{e}");
    let mut s = Schedule::new(f);
    s.cache_write("C", "i").unwrap();
    let e = s.partition("i", 2).unwrap_err().to_string();
    assert!(e.contains("free of allocations"), "{e}");
}

/// matmul for any row count: whole blocks, whole tiles and the last rows are parts of their
/// own, so the scheduled function has no bounds guard at all, and computes the product.
#[test]
fn matmul_rows_not_a_multiple_of_the_tile_need_no_guard() {
    for m in [1, 5, 6, 7, 13, 24, 29, 37] {
        let f = kernels::matmul_sized(m, 32, 5);
        let g = sk::matmul_tiled(
            m,
            32,
            5,
            sk::MatmulTiles {
                mr: 6,
                nr: 16,
                mb: 12,
                kc: 0,
            },
        )
        .unwrap();
        let text = g.to_string();
        assert!(!text.contains("if "), "m = {m}: a guard\n{g}");
        same_results(&f, &g, &[vec![m, 5], vec![5, 32], vec![m, 32]]);
    }
}

/// matmul with `k` in passes (`kc`): `C` zeroed first, each pass adding into it; any row count,
/// no bounds guard, the product computed.
#[test]
fn matmul_in_passes_over_k_computes_the_product() {
    for (m, k, kc) in [(13, 12, 4), (24, 10, 5), (7, 16, 8), (30, 9, 3)] {
        let f = kernels::matmul_sized(m, 32, k);
        let tiles = sk::MatmulTiles {
            mr: 6,
            nr: 16,
            mb: 12,
            kc,
        };
        let g = sk::matmul_tiled(m, 32, k, tiles).unwrap();
        let text = g.to_string();
        assert!(!text.contains("if "), "m = {m}: a guard\n{g}");
        assert!(text.contains("k0_o"), "k not in passes\n{g}");
        same_results(&f, &g, &[vec![m, k], vec![k, 32], vec![m, 32]]);
    }
    // A pass length that does not divide k: one pass.
    let g = sk::matmul_tiled(
        12,
        32,
        10,
        sk::MatmulTiles {
            mr: 6,
            nr: 16,
            mb: 12,
            kc: 4,
        },
    )
    .unwrap();
    assert!(!g.to_string().contains("k0_o"), "{g}");
}

/// A parallel loop inside a parallel or vectorized one is refused at the step that would nest
/// it (the verifier's rule), and the function stays as it was.
#[test]
fn parallel_loops_do_not_nest_and_a_refused_step_changes_nothing() {
    let mut s = Schedule::new(kernels::matmul_sized(8, 16, 4));
    s.parallel("i").unwrap();
    let before = s.func().to_string();
    let e = s.parallel("j").unwrap_err().to_string();
    assert!(
        e.contains("parallel loop `j` inside the parallel loop `i`"),
        "{e}"
    );
    assert_eq!(s.func().to_string(), before);
    let mut s = Schedule::new(kernels::matmul_sized(8, 16, 4));
    s.parallel("j").unwrap();
    let e = s.vectorize("i").unwrap_err().to_string();
    assert!(e.contains("inside the vectorized loop `i`"), "{e}");
    // A symbolic extent cannot be vectorized or unrolled; the loop stays as it was.
    let mut s = Schedule::new(kernels::vadd());
    let before = s.func().to_string();
    for e in [s.vectorize("i"), s.unroll("i")] {
        let e = e.unwrap_err().to_string();
        assert!(
            e.contains("needs loop `i` to have a constant extent"),
            "{e}"
        );
    }
    assert_eq!(s.func().to_string(), before);
    // With the outer loop serial again, the inner one may be parallel.
    let mut s = Schedule::new(kernels::matmul_sized(8, 16, 4));
    let steps: Vec<Step> = serde_json::from_str(
        r#"[{"kind": {"loop": "i", "kind": "parallel"}}, {"kind": {"loop": "i", "kind": "serial"}},
            {"kind": {"loop": "j", "kind": "parallel"}}]"#,
    )
    .unwrap();
    s.apply(&steps).unwrap();
    s.finish().unwrap();
}

/// Values at the edges of what a JSON schedule can hold: a split factor beyond the extent is
/// the extent (one outer iteration, no guard), even `i64::MAX`; packing with a zero or
/// negative divisor or modulus, or into a name that is taken, is refused at the step with the
/// value seen, and the function is left as it was.
#[test]
fn schedule_steps_with_extreme_values_apply_or_are_refused() {
    let mut s = Schedule::new(kernels::matmul_sized(4, 8, 3));
    let (io, ii) = s.split("i", i64::MAX).unwrap();
    let f = s.finish().unwrap();
    let text = f.to_string();
    assert!(
        text.contains(&format!("for {io}: int64 in serial(0i64, 1i64)")),
        "{text}"
    );
    assert!(
        text.contains(&format!("for {ii}: int64 in serial(0i64, 4i64)")),
        "{text}"
    );
    assert!(!text.contains("if "), "a guard is left: {text}");

    let mut s = Schedule::new(kernels::matmul_sized(4, 8, 3));
    let before = s.func().to_string();
    for (dims, seen) in [
        (
            vec![AxisMap::outer(1, 0), AxisMap::id(0), AxisMap::inner(1, 4)],
            "div: 0",
        ),
        (
            vec![AxisMap::outer(1, 4), AxisMap::id(0), AxisMap::inner(1, -4)],
            "modulo: Some(-4)",
        ),
    ] {
        let e = s
            .transform_layout("B", "Bp", &dims)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("div >= 1 and modulo >= 1") && e.contains(seen),
            "{e}"
        );
        assert_eq!(s.func().to_string(), before);
    }
    let e = s
        .transform_layout("B", "A", &[AxisMap::id(0), AxisMap::id(1)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("found `A`, which is taken"), "{e}");
    assert_eq!(s.func().to_string(), before);
    // A divisor beyond any extent: one panel holding the whole axis.
    s.transform_layout(
        "B",
        "Bp",
        &[
            AxisMap::outer(1, i64::MAX),
            AxisMap::id(0),
            AxisMap::inner(1, i64::MAX),
        ],
    )
    .unwrap();
    let shapes = [vec![4, 3], vec![3, 8], vec![4, 8]];
    assert_eq!(
        interp_last(&s.finish().unwrap(), &shapes),
        interp_last(&kernels::matmul_sized(4, 8, 3), &shapes)
    );
}

/// A split factor an int32 loop variable cannot hold is refused with the factor and the type
/// (the extent is symbolic, so it is not clamped to the extent), and nothing changes.
#[test]
fn a_split_factor_beyond_an_int32_loop_is_refused() {
    let m = IRModule::from_json_str(
        r#"{"format": "kiln-ir/1", "functions": [{"name": "f",
          "params": [{"kind": "buffer", "name": "X", "dtype": "float32", "shape": [16]},
                     {"kind": "scalar", "name": "n", "dtype": "int32"}],
          "body": {"stmt": "for", "var": {"name": "i", "dtype": "int32"},
            "min": {"const": 0, "dtype": "int32"}, "extent": {"var": "n"}, "kind": "serial",
            "body": {"stmt": "store", "buffer": "X", "indices": [{"var": "i"}],
                     "value": {"const": 1.0, "dtype": "float32"}}}}]}"#,
    )
    .unwrap();
    let mut s = Schedule::new(m.functions[0].clone());
    let before = s.func().to_string();
    let big = i64::from(i32::MAX) + 1;
    let e = s.split("i", big).unwrap_err().to_string();
    assert!(
        e.contains("needs a factor that fits the loop variable's type int32")
            && e.contains(&big.to_string()),
        "{e}"
    );
    assert_eq!(s.func().to_string(), before);
    // The largest int32 factor applies.
    s.split("i", i64::from(i32::MAX)).unwrap();
    s.finish().unwrap();
}

/// Columns not a multiple of the register tile: the last `n % nr` columns are a narrower tile
/// of their own, reading the partly filled last panel; no bounds guard anywhere: not in the
/// `k` loop, and not in the packing of `B`, whose whole panels are filled by a vector loop and
/// the last panel's few columns by a loop of their own.
#[test]
fn matmul_columns_not_a_multiple_of_the_tile_get_a_narrower_tile() {
    let tiles = sk::MatmulTiles {
        mr: 6,
        nr: 16,
        mb: 12,
        kc: 0,
    };
    for (m, n, k) in [(13, 40, 5), (7, 8, 3), (12, 17, 4), (6, 1, 2)] {
        let f = kernels::matmul_sized(m, n, k);
        let g = sk::matmul_tiled(m, n, k, tiles).unwrap();
        let text = g.to_string();
        let guards = text.lines().filter(|l| l.contains("if "));
        assert_eq!(guards.count(), 0, "{m}x{n}x{k}: a guard\n{g}");
        if n >= 16 {
            assert!(
                text.contains("for Bp_l1_i: int64 in vectorized(0i64, 16i64)"),
                "{m}x{n}x{k}: the whole panels' fill is not a vector loop\n{g}"
            );
        }
        same_results(&f, &g, &[vec![m, k], vec![k, n], vec![m, n]]);
    }
    let kc = sk::MatmulTiles { kc: 2, ..tiles };
    let g = sk::matmul_tiled(13, 40, 6, kc).unwrap();
    same_results(
        &kernels::matmul_sized(13, 40, 6),
        &g,
        &[vec![13, 6], vec![6, 40], vec![13, 40]],
    );
}

/// `decompose_reduction` turns TVM's form of a reduction (the init guarded in the first
/// iteration) into kiln's (the init before the loop), and the matmul schedule then applies to
/// a TVM matmul by its loop and buffer names.
#[test]
fn decompose_reduction_brings_tvms_matmul_to_the_hand_schedule() {
    let (m, n, k) = (13, 40, 5);
    let shapes = [vec![m, k], vec![k, n], vec![m, n]];
    let tvm = kernels::matmul_tvm_form(m, n, k);
    let mut s = Schedule::new(tvm.clone());
    s.decompose_reduction("k").unwrap();
    let text = s.func().to_string();
    assert!(!text.contains("if "), "{text}");
    let parts = sk::MatmulParts {
        k: "k".into(),
        ..Default::default()
    };
    let tiles = sk::MatmulTiles {
        mr: 6,
        nr: 16,
        mb: 12,
        kc: 0,
    };
    let g = sk::matmul_tiled_on(s.clone(), &parts, [m, n, k], tiles)
        .unwrap()
        .finish()
        .unwrap();
    same_results(&kernels::matmul_sized(m, n, k), &g, &shapes);
    // The trace replays on the TVM form.
    let steps = sk::matmul_tiled_on(s, &parts, [m, n, k], tiles)
        .unwrap()
        .trace()
        .to_vec();
    assert_eq!(steps[0], Step::DecomposeReduction { loop_: "k".into() });
    let mut r = Schedule::new(tvm.clone());
    r.apply(&steps).unwrap();
    assert_eq!(r.finish().unwrap().to_string(), g.to_string());
}

/// What `decompose_reduction` refuses, each with the function left as it was.
#[test]
fn decompose_reduction_refuses_other_forms() {
    let tvm = kernels::matmul_tvm_form(4, 4, 3);
    let cases: Vec<(PrimFunc, &str, &str)> = vec![
        // kiln's own form: nothing to decompose.
        (kernels::matmul_sized(4, 4, 3), "k0", "needs"),
        // At a spatial loop: the guard does not test `j`.
        (tvm.clone(), "j", "every loop from `j` inward"),
        (tvm.clone(), "nope", "expected exactly one loop"),
        // A reduction that may run zero times.
        (kernels::matmul_tvm_form(4, 4, 0), "k", "at least 1"),
    ];
    for (f, at, want) in cases {
        let mut s = Schedule::new(f);
        let before = s.func().to_string();
        let e = s.decompose_reduction(at).unwrap_err().to_string();
        assert!(e.contains(want), "{at}: {e}");
        assert_eq!(s.func().to_string(), before);
    }
}

/// Loops that share a name (as a hand-written or converted function may have) are named once
/// each when scheduling starts, in the order they are written, so that every loop can be
/// scheduled; unique names are kept.
#[test]
fn repeated_loop_names_are_made_unique() {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, Stmt};
    let f32t = DataType::f32();
    let a = Buffer::new("A", f32t, vec![Expr::from(64i64)]);
    let b = Buffer::new("B", f32t, vec![Expr::from(64i64)]);
    let body = Stmt::Seq(vec![
        for_range("j", Expr::from(64i64), ForKind::Serial, |j| {
            b.store([j.clone()], a.load([j]) * 2.0f32)
        }),
        for_range("j", Expr::from(64i64), ForKind::Serial, |j| {
            b.store([j.clone()], b.load([j]) + 1.0f32)
        }),
        for_range("j_1", Expr::from(64i64), ForKind::Serial, |j| {
            b.store([j.clone()], b.load([j]) * 3.0f32)
        }),
    ]);
    let f = PrimFunc::new("f", vec![Param::Buffer(a), Param::Buffer(b)], body);
    let mut s = Schedule::new(f.clone());
    let text = s.func().to_string();
    for name in ["for j:", "for j_2:", "for j_1:"] {
        assert!(text.contains(name), "{name}\n{text}");
    }
    // The third loop kept its own name; the second got the next free one.
    let (_, inner) = s.split("j_2", 16).unwrap();
    s.vectorize(&inner).unwrap();
    s.parallel("j_1").unwrap();
    let g = s.finish().unwrap();
    let shapes = [vec![64], vec![64]];
    assert_eq!(interp_last(&g, &shapes), interp_last(&f, &shapes));
}

/// `cache_read`: the region one iteration of a loop reads is copied into a `local` buffer
/// first, and the body reads the copy; a region that may pass the buffer's end is copied under
/// a guard; the step replays from JSON.
#[test]
fn cache_read_stages_the_region_a_loop_iteration_reads() {
    let (m, n, k) = (8, 48, 12);
    let shapes = [vec![m, k], vec![k, n], vec![m, n]];
    let f = kernels::matmul_sized(m, n, k);
    let mut s = Schedule::new(f.clone());
    let (jo, ji) = s.split("j", 16).unwrap();
    s.reorder(&[&jo, "i", &ji]).unwrap();
    let cache = s.cache_read("B", &jo).unwrap();
    let g = s.finish().unwrap();
    let text = g.to_string();
    // A 12 x 16 panel of B per column block, copied with the columns vectorized.
    assert!(
        text.contains(&format!("allocate {cache}: float32[12, 16] local")),
        "{g}"
    );
    assert!(!text.contains("if "), "{g}");
    same_results(&f, &g, &shapes);
    // 48 columns in blocks of 20: the last block's copy would pass the end of B; guarded.
    let mut s = Schedule::new(f.clone());
    let (jo, ji) = s.split("j", 20).unwrap();
    s.reorder(&[&jo, "i", &ji]).unwrap();
    s.cache_read("B", &jo).unwrap();
    let g = s.finish().unwrap();
    assert!(g.to_string().contains("if "), "{g}");
    same_results(&f, &g, &shapes);
    // Replayed from JSON, the same function.
    let steps: Vec<Step> = serde_json::from_str(
        r#"[{"split": {"loop": "j", "factor": 16}},
            {"reorder": {"loops": ["j_o", "i", "j_i"]}},
            {"cache_read": {"buffer": "B", "at": "j_o"}}]"#,
    )
    .unwrap();
    let mut r = Schedule::new(f.clone());
    r.apply(&steps).unwrap();
    let mut s = Schedule::new(f.clone());
    s.split("j", 16).unwrap();
    s.reorder(&["j_o", "i", "j_i"]).unwrap();
    s.cache_read("B", "j_o").unwrap();
    assert_eq!(s.trace(), r.trace());
    assert_eq!(
        r.finish().unwrap().to_string(),
        s.finish().unwrap().to_string()
    );
}

/// `cache_read_panels_of`: `A[i, k]` cut into row panels `[rows / w, k, w]` by the loop of a
/// block of rows, each register tile of `w` rows reading its panel with the rows side by side;
/// a block past the buffer's end is guarded; a width that does not divide the block, or a
/// tile that straddles panels, is refused; the step replays from JSON.
#[test]
fn cache_read_panels_of_packs_row_panels_of_a_region() {
    let (m, n, k) = (16, 8, 12);
    let shapes = [vec![m, k], vec![k, n], vec![m, n]];
    let f = kernels::matmul_sized(m, n, k);
    let blocked = |f: &PrimFunc| {
        let mut s = Schedule::new(f.clone());
        let (io, ii) = s.split("i", 8).unwrap();
        s.split(&ii, 4).unwrap();
        (s, io)
    };
    let (mut s, io) = blocked(&f);
    let cache = s.cache_read_panels_of("A", &io, 4, 0).unwrap();
    let g = s.finish().unwrap();
    let text = g.to_string();
    assert!(
        text.contains(&format!("allocate {cache}: float32[2, 12, 4] local")),
        "{g}"
    );
    assert!(text.contains(&format!("{cache}[i_i_o, k0, i_i_i]")), "{g}");
    assert!(!text.contains("if "), "{g}");
    // Filled a panel at a time, its four rows side by side (unrolled) along `k`.
    assert!(
        text.contains("for A_cr2: int64 in unrolled(0i64, 4i64)"),
        "{g}"
    );
    same_results(&f, &g, &shapes);
    // 20 rows in blocks of 8: the last block's copy would pass the end of A; guarded.
    let f20 = kernels::matmul_sized(20, n, k);
    let (mut s, io) = blocked(&f20);
    s.cache_read_panels_of("A", &io, 4, 0).unwrap();
    let g = s.finish().unwrap();
    same_results(&f20, &g, &[vec![20, k], vec![k, n], vec![20, n]]);
    // Refused, leaving the function as it was: a width that does not divide the block's 8
    // rows, a tile of 4 rows in panels of 2, a dimension `A` does not have.
    let (mut s, io) = blocked(&f);
    let before = s.func().to_string();
    let err = s
        .cache_read_panels_of("A", &io, 3, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("divides") && err.contains("(8)") && err.contains("found 3"),
        "{err}"
    );
    let err = s
        .cache_read_panels_of("A", &io, 2, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot cut") && err.contains("panels of 2"),
        "{err}"
    );
    let err = s
        .cache_read_panels_of("A", &io, 4, 7)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("needs a dimension of `A` to cut into panels, found 7 (it has 2)"),
        "{err}"
    );
    assert_eq!(s.func().to_string(), before);
    assert_eq!(s.trace().len(), 2);
    // The step's JSON form: a panel width and the dimension cut; replayed, the same function.
    let steps: Vec<Step> = serde_json::from_str(
        r#"[{"split": {"loop": "i", "factor": 8}}, {"split": {"loop": "i_i", "factor": 4}},
            {"cache_read": {"buffer": "A", "at": "i_o", "panel": 4, "innermost": 0}}]"#,
    )
    .unwrap();
    let mut r = Schedule::new(f.clone());
    r.apply(&steps).unwrap();
    let (mut s, io) = blocked(&f);
    s.cache_read_panels_of("A", &io, 4, 0).unwrap();
    assert_eq!(s.trace(), r.trace());
    assert_eq!(
        r.finish().unwrap().to_string(),
        s.finish().unwrap().to_string()
    );
}

/// `cache_read_panels`: the region's last dimension cut into contiguous panels, `[E / w, ..,
/// w]`, each register tile reading one; a width that does not divide the region, or an access
/// that straddles panels, is refused.
#[test]
fn cache_read_panels_packs_column_panels_of_a_region() {
    let (m, n, k) = (8, 64, 12);
    let shapes = [vec![m, k], vec![k, n], vec![m, n]];
    let f = kernels::matmul_sized(m, n, k);
    // Columns in panels of 8, four panels per block of 32: for each block, B's 12 x 32 slice
    // becomes 4 panels of 12 x 8.
    let mut s = Schedule::new(f.clone());
    let (jo, ji) = s.split("j", 8).unwrap();
    let (jt, jg) = s.split(&jo, 4).unwrap();
    s.reorder(&[&jt, "i", &jg, &ji]).unwrap();
    let cache = s.cache_read_panels("B", &jt, 8).unwrap();
    let g = s.finish().unwrap();
    let text = g.to_string();
    assert!(
        text.contains(&format!("allocate {cache}: float32[4, 12, 8] local")),
        "{g}"
    );
    assert!(text.contains(&format!("{cache}[j_o_i, k0, j_i]")), "{g}");
    same_results(&f, &g, &shapes);
    // Panels of 4 where the columns are read 8 at a time: the 8 columns of `j_i` fall in two
    // panels, and `j_i`'s coefficient (1) is no multiple of 4: refused, not cut by division.
    let mut s = Schedule::new(f.clone());
    let (jo, ji) = s.split("j", 8).unwrap();
    let (jt, jg) = s.split(&jo, 4).unwrap();
    s.reorder(&[&jt, "i", &jg, &ji]).unwrap();
    let err = s.cache_read_panels("B", &jt, 4).unwrap_err().to_string();
    assert!(
        err.contains("cannot cut") && err.contains("panels of 4"),
        "{err}"
    );
    // Panels of 2 x 8 columns: the panel loop's coefficient (8) is no multiple of 16 either.
    let err = s.cache_read_panels("B", &jt, 16).unwrap_err().to_string();
    assert!(err.contains("cannot cut"), "{err}");
    // Refused: 32 columns in panels of 12, or of 0.
    let mut s = Schedule::new(f.clone());
    let (jo, ji) = s.split("j", 8).unwrap();
    let (jt, jg) = s.split(&jo, 4).unwrap();
    s.reorder(&[&jt, "i", &jg, &ji]).unwrap();
    let before = s.func().to_string();
    let err = s.cache_read_panels("B", &jt, 12).unwrap_err().to_string();
    assert!(
        err.contains("divides") && err.contains("(32)") && err.contains("12"),
        "{err}"
    );
    let err = s.cache_read_panels("B", &jt, 0).unwrap_err().to_string();
    assert!(err.contains("found 0"), "{err}");
    assert_eq!(s.func().to_string(), before);
    // The step's JSON form names the width; replayed, the same function.
    let steps: Vec<Step> = serde_json::from_str(
        r#"[{"split": {"loop": "j", "factor": 8}}, {"split": {"loop": "j_o", "factor": 4}},
            {"reorder": {"loops": ["j_o_o", "i", "j_o_i", "j_i"]}},
            {"cache_read": {"buffer": "B", "at": "j_o_o", "panel": 8}}]"#,
    )
    .unwrap();
    let mut r = Schedule::new(f.clone());
    r.apply(&steps).unwrap();
    assert_eq!(r.trace(), steps.as_slice());
    assert_eq!(r.finish().unwrap().to_string(), text);
}

/// What `cache_read` refuses, with the function left as it was.
#[test]
fn cache_read_refuses_written_buffers_and_missing_accesses() {
    let f = kernels::matmul_sized(4, 8, 3);
    let mut s = Schedule::new(f.clone());
    let before = s.func().to_string();
    let err = s.cache_read("C", "i").unwrap_err().to_string();
    assert!(
        err.contains("cache_read") && err.contains("only read") && err.contains("`C`"),
        "{err}"
    );
    let err = s.cache_read("X", "i").unwrap_err().to_string();
    assert!(
        err.contains("no parameter or allocated buffer `X`"),
        "{err}"
    );
    let err = s.cache_read("B", "nope").unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
    // A transposed copy, and panels of a dimension, need one of the buffer's dimensions.
    let err = s
        .cache_read_transposed("B", "i", 5)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("needs a dimension of `B` to make innermost, found 5 (it has 2)"),
        "{err}"
    );
    let panels = Step::CacheRead {
        buffer: "B".into(),
        at: "i".into(),
        panel: Some(4),
        innermost: Some(2),
    };
    let err = s.apply(&[panels]).unwrap_err().to_string();
    assert!(
        err.contains("needs a dimension of `B` to cut into panels, found 2 (it has 2)"),
        "{err}"
    );
    assert_eq!(s.func().to_string(), before);
    assert!(s.trace().is_empty());
}

/// A second cache of the same buffer (each row part of a matmul caches its `C` tile, each
/// column part its slice of `B`) names its copy loops apart from the first one's (`C_c_1r0`):
/// every loop name of the result is unique, so a later step can name each copy (a record of
/// the tuner replays steps by loop name). Before, every copy's loops were `C_cw0`, ..., and a
/// step naming one failed as ambiguous.
#[test]
fn second_caches_of_a_buffer_get_loop_names_of_their_own() {
    let (m, n, k) = (14, 40, 8);
    let f = kernels::matmul_sized(m, n, k);
    let mut s = common::packed_matmul(
        [m, n, k],
        [6, 16, 12, 0],
        sk::PackB::InTask {
            panels: 2,
            ahead: false,
        },
        sk::PackA::InPlace,
    );
    let text = s.func().to_string();
    let mut names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("for ")?.split(':').next())
        .collect();
    let total = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), total, "a loop name repeats:\n{text}");
    for l in ["C_cw0", "C_c_1w1", "C_c_2w0", "B_cr0", "B_c_1r0", "B_c_2r1"] {
        assert!(names.contains(&l), "no loop `{l}`:\n{text}");
    }
    // The second copies can be named by a step, and the result still computes the matmul.
    s.split("C_c_1w0", 1).unwrap();
    s.split("B_c_1r0", 4).unwrap();
    let g = s.finish().unwrap();
    same_results(&f, &g, &[vec![m, k], vec![k, n], vec![m, n]]);
}

/// `B` packed by each parallel task, a pass of `k` (or all of it) at a time: the same results
/// as the plain matmul for shapes with partial row blocks, narrow column tails and several
/// passes, and no up-front packing of `B`.
#[test]
fn matmul_with_b_packed_in_each_task_computes_the_matmul() {
    for (m, n, k, kc, panels) in [
        (13, 40, 6, 2, 1),
        (72, 64, 9, 0, 1),
        (64, 96, 32, 8, 1),
        (7, 17, 4, 2, 1),
        (64, 96, 32, 8, 4),
        (13, 104, 6, 2, 8),
        (20, 64, 12, 0, 2),
    ] {
        for ahead in [false, true] {
            let f = kernels::matmul_sized(m, n, k);
            let g = common::packed_matmul(
                [m, n, k],
                [6, 16, 12, kc],
                sk::PackB::InTask { panels, ahead },
                sk::PackA::InPlace,
            )
            .finish()
            .unwrap();
            let text = g.to_string();
            assert!(
                text.contains("B_local") && !text.contains("Bp"),
                "{m}x{n}x{k}\n{g}"
            );
            // The next pass prefetched where there are passes, and only when asked.
            assert_eq!(
                text.contains("prefetch B["),
                ahead && kc > 0,
                "{m}x{n}x{k} kc {kc}\n{g}"
            );
            same_results(&f, &g, &[vec![m, k], vec![k, n], vec![m, n]]);
        }
    }
}

/// The shapes `[m, n, k]` and pass depths the matmuls with `A` packed are checked at (rows that
/// leave a last, partly filled panel, rows that fill whole panels, fewer rows than a panel;
/// `k` in passes and in one), each with every packing of `B`: `check(shape, kc, pack)`.
fn for_each_packing_of_b(mut check: impl FnMut([i64; 3], i64, sk::PackB)) {
    for (m, n, k, kc) in [
        (13, 40, 6, 2),
        (72, 64, 9, 0),
        (5, 17, 4, 0),
        (50, 96, 32, 8),
    ] {
        for pack in [
            sk::PackB::Whole,
            sk::PackB::InTask {
                panels: 2,
                ahead: false,
            },
            sk::PackB::InTask {
                panels: 2,
                ahead: true,
            },
            sk::PackB::InPlace,
        ] {
            check([m, n, k], kc, pack);
        }
    }
}

/// `A` packed into row panels up front, with every packing of `B`: the same results as the
/// plain matmul where the rows leave a last, partly filled panel (its fill a part of its own),
/// where they fill whole panels only, and with fewer rows than one panel; the whole panels'
/// fill has no bounds guard.
#[test]
fn matmul_with_a_packed_computes_the_matmul() {
    for_each_packing_of_b(|[m, n, k], kc, pack| {
        let f = kernels::matmul_sized(m, n, k);
        let g = common::packed_matmul([m, n, k], [6, 16, 12, kc], pack, sk::PackA::Whole)
            .finish()
            .unwrap();
        let text = g.to_string();
        assert!(text.contains("allocate Ap"), "{m}x{n}x{k} {pack:?}\n{g}");
        if m >= 6 {
            // The whole panels' fill: a parallel loop over panels, no `if` before the
            // copy.
            let at = text
                .find("for Ap_l0_o: int64 in parallel")
                .unwrap_or_else(|| panic!("{m}x{n}x{k}\n{g}"));
            let fill = &text[at..];
            let end = ["for Ap_l0_p", "allocate"]
                .iter()
                .filter_map(|x| fill.find(x))
                .min()
                .unwrap_or(fill.len());
            assert!(!fill[..end].contains("if "), "{m}x{n}x{k}\n{g}");
        }
        same_results(&f, &g, &[vec![m, k], vec![k, n], vec![m, n]]);
    });
}

/// `A` packed by each task, a pass of `k` at a time, into row panels (`PackA::InTask`), with
/// every packing of `B`: the same results as the plain matmul, with rows that leave a last
/// tile of their own, with `k` in one pass and in passes, and with fewer rows than a tile.
/// Where `B` is not packed by the tasks, a task is a whole block of rows: the parallel loop is
/// the row blocks', not fused with the column panels.
#[test]
fn matmul_with_a_packed_in_the_task_computes_the_matmul() {
    for_each_packing_of_b(|[m, n, k], kc, pack| {
        let f = kernels::matmul_sized(m, n, k);
        let g = common::packed_matmul([m, n, k], [6, 16, 12, kc], pack, sk::PackA::InTask)
            .finish()
            .unwrap();
        let text = g.to_string();
        let at = |s: &str| format!("{m}x{n}x{k} kc {kc} {pack:?}: {s}\n{g}");
        assert!(text.contains("allocate A_local"), "{}", at("no packed A"));
        assert!(!text.contains("allocate Ap"), "{}", at("A packed up front"));
        let fused = text
            .lines()
            .any(|l| l.contains("_o_j") && l.contains("parallel"));
        let by_task = matches!(pack, sk::PackB::InTask { .. });
        assert_eq!(fused, by_task, "{}", at("tasks of the wrong shape"));
        same_results(&f, &g, &[vec![m, k], vec![k, n], vec![m, n]]);
    });
}

/// `f(A[6, 8], B[6, 8])`: a workspace `T` computed by the nest `fill` (over `i`, `j`), then
/// `B[i2, j2] = T[i2, j2] + T[i2, (j2 + 1) % 8]` (`use_`, a nest of its own), in the order
/// `order` gives (`true`: the fill first).
fn inline_case(
    fill: impl FnOnce(&kiln::ir::Buffer, &kiln::ir::Buffer, &kiln::ir::Buffer) -> kiln::ir::Stmt,
    fill_first: bool,
) -> PrimFunc {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, Stmt, StorageScope};
    let shape = || vec![Expr::from(6i64), Expr::from(8i64)];
    let a = Buffer::new("A", DataType::f32(), shape());
    let b = Buffer::new("B", DataType::f32(), shape());
    let t = Buffer::temp("T", DataType::f32(), shape(), StorageScope::Workspace);
    let fill = fill(&a, &b, &t);
    let use_ = for_range("i2", 6i64, ForKind::Serial, |i| {
        for_range("j2", 8i64, ForKind::Serial, |j| {
            let next = (j.clone() + 1i64).floormod(8i64);
            b.store(
                vec![i.clone(), j.clone()],
                t.load(vec![i.clone(), j]) + t.load(vec![i, next]),
            )
        })
    });
    let seq = if fill_first {
        vec![fill, use_]
    } else {
        vec![use_, fill]
    };
    PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b)],
        t.allocate(Stmt::Seq(seq)),
    )
}

/// `for i in 0..6 { for j in 0..ej { body(i, j) } }`.
fn nest_2d(
    ej: i64,
    body: impl Fn(kiln::ir::Expr, kiln::ir::Expr) -> kiln::ir::Stmt,
) -> kiln::ir::Stmt {
    use kiln::ir::builder::for_range;
    use kiln::ir::ForKind;
    for_range("i", 6i64, ForKind::Serial, |i| {
        for_range("j", ej, ForKind::Serial, |j| body(i, j))
    })
}

/// `for i in 0..6 { for j in 0..8 { T[i, j] = value(A, i, j) } }`.
fn fill_nest(
    t: &kiln::ir::Buffer,
    value: impl Fn(kiln::ir::Expr, kiln::ir::Expr) -> kiln::ir::Expr,
) -> kiln::ir::Stmt {
    nest_2d(8, |i, j| t.store(vec![i.clone(), j.clone()], value(i, j)))
}

#[test]
fn compute_inline_replaces_each_read_by_the_value_and_drops_the_buffer() {
    use kiln::ir::builder::if_then_else_expr;
    use kiln::ir::Expr;
    let shapes = [vec![6, 8], vec![6, 8]];
    // An expression of the loop variables, and a guarded read (a padding's form).
    type Value = Box<dyn Fn(&kiln::ir::Buffer, Expr, Expr) -> Expr>;
    let values: Vec<Value> = vec![
        Box::new(|a, i, j| a.load(vec![i, j]) * Expr::from(2.0f32) + Expr::from(1.0f32)),
        Box::new(|a, i, j| {
            let inside = i.clone().ge(1i64).and(j.clone().lt(7i64));
            let read = a.load(vec![i - 1i64, j + 1i64]);
            if_then_else_expr(inside, read, Expr::from(0.0f32))
        }),
    ];
    for value in &values {
        let f = inline_case(|a, _, t| fill_nest(t, |i, j| value(a, i, j)), true);
        let mut s = Schedule::new(f.clone());
        s.compute_inline("T").unwrap();
        assert_eq!(s.trace(), &[Step::ComputeInline { buffer: "T".into() }]);
        let g = s.finish().unwrap();
        let text = g.to_string();
        assert!(!text.contains("T["), "{g}");
        assert!(!text.contains("allocate"), "{g}");
        assert!(!text.contains("for i:"), "the fill nest is gone\n{g}");
        same_results(&f, &g, &shapes);
        // The same from JSON steps.
        let steps: Vec<Step> =
            serde_json::from_str(r#"[{"compute_inline": {"buffer": "T"}}]"#).unwrap();
        let mut s = Schedule::new(f.clone());
        s.apply(&steps).unwrap();
        assert_eq!(s.finish().unwrap().to_string(), text);
    }
}

#[test]
fn compute_inline_refuses_what_it_cannot_inline_and_changes_nothing() {
    use kiln::ir::builder::{for_range, if_then_else, let_expr};
    use kiln::ir::{Expr, ForKind, Stmt};
    let copy = |a: &kiln::ir::Buffer, t: &kiln::ir::Buffer| fill_nest(t, |i, j| a.load(vec![i, j]));
    let cases: Vec<(&str, PrimFunc, &str)> = vec![
        (
            "A",
            inline_case(|a, _, t| copy(a, t), true),
            "needs a buffer the function allocates, found the parameter `A`",
        ),
        (
            "Z",
            inline_case(|a, _, t| copy(a, t), true),
            "found no allocated buffer `Z`",
        ),
        (
            "T",
            // Two nests store `T`.
            inline_case(|a, _, t| Stmt::Seq(vec![copy(a, t), copy(a, t)]), true),
            "needs exactly one store to `T` (the nest that computes it), found 2",
        ),
        (
            "T",
            // The fill reads `B`, which the function writes.
            inline_case(|_, b, t| fill_nest(t, |i, j| b.load(vec![i, j])), true),
            "found a read of `B`, which the function writes",
        ),
        (
            "T",
            // The fill covers half the columns.
            inline_case(
                |a, _, t| {
                    nest_2d(4, |i, j| {
                        t.store(vec![i.clone(), j.clone()], a.load(vec![i, j]))
                    })
                },
                true,
            ),
            "needs the loop `j` to run from 0 over dimension 1 of `T` (8), found [0, 4)",
        ),
        (
            "T",
            // A loop the store does not use.
            inline_case(
                |a, _, t| {
                    for_range("r", 2i64, ForKind::Serial, |_| {
                        fill_nest(t, |i, j| a.load(vec![i, j]))
                    })
                },
                true,
            ),
            "found `r` unused",
        ),
        (
            "T",
            // The diagonal: `i` indexes both dimensions, the second of which it does not span.
            inline_case(
                |a, _, t| {
                    nest_2d(8, |i, j| {
                        t.store(vec![i.clone(), i.clone()], a.load(vec![i, j]))
                    })
                },
                true,
            ),
            "needs the loop `i` to run from 0 over dimension 1 of `T` (8), found [0, 6)",
        ),
        (
            "T",
            inline_case(|a, _, t| copy(a, t), false),
            "needs every read of `T` after the nest that computes it, found one before it",
        ),
        (
            "T",
            inline_case(
                |a, _, t| {
                    fill_nest(t, |i, j| {
                        let_expr("x", a.load(vec![i, j]), |x| x.clone() * x)
                    })
                },
                true,
            ),
            "needs a value without `let`",
        ),
        (
            "T",
            // The nest sits under a condition.
            inline_case(
                |a, _, t| if_then_else(Expr::from(true), copy(a, t), None),
                true,
            ),
            "needs the store to `T` in a perfect loop nest at the top of the body",
        ),
    ];
    for (buffer, f, want) in cases {
        let mut s = Schedule::new(f.clone());
        let before = s.func().to_string();
        let err = s.compute_inline(buffer).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, ScheduleError::Form { .. }) && msg.contains("compute_inline"),
            "{msg}"
        );
        assert!(msg.contains(want), "want `{want}`, got: {msg}");
        assert_eq!(s.func().to_string(), before);
        assert!(s.trace().is_empty());
    }
}

/// Caches of a region a fused loop indexes: `B[i, floordiv(f, 8), floormod(f, 8)]` (rows
/// and columns fused into one loop of 48 elements, split by 16, so a tile spans rows) is
/// cached as one dimension of 16 elements, written back and read in along it.
#[test]
fn caches_read_a_fused_loops_pair_of_dimensions_as_one() {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param};
    let shape = || vec![Expr::from(4i64), Expr::from(6i64), Expr::from(8i64)];
    let a = Buffer::new("A", DataType::f32(), shape());
    let b = Buffer::new("B", DataType::f32(), shape());
    let body = for_range("i", 4i64, ForKind::Serial, |i| {
        for_range("y", 6i64, ForKind::Serial, |y| {
            for_range("x", 8i64, ForKind::Serial, |x| {
                let ix = vec![i.clone(), y.clone(), x.clone()];
                b.store(
                    ix.clone(),
                    a.load(ix) * Expr::from(2.0f32) + Expr::from(1.0f32),
                )
            })
        })
    });
    let f = PrimFunc::new("f", vec![Param::Buffer(a), Param::Buffer(b)], body);
    let mut s = Schedule::new(f.clone());
    let fused = s.fuse("y", "x").unwrap();
    let (fo, fi) = s.split(&fused, 16).unwrap();
    let out = s.cache_write("B", &fo).unwrap();
    let inp = s.cache_read("A", &fo).unwrap();
    s.vectorize(&fi).unwrap();
    let g = s.finish().unwrap();
    let text = g.to_string();
    // Each cache is [1, 16]: the batch index and 16 consecutive elements of the fused pair.
    for c in [&out, &inp] {
        assert!(text.contains(&format!("{c}: float32[1, 16]")), "{c}\n{g}");
    }
    same_results(&f, &g, &[vec![4, 6, 8], vec![4, 6, 8]]);
    // A split that does not divide the pair (48 by 20) guards the copies at the pair's end.
    let mut s = Schedule::new(f.clone());
    let fused = s.fuse("y", "x").unwrap();
    let (fo, _) = s.split(&fused, 20).unwrap();
    s.cache_write("B", &fo).unwrap();
    s.cache_read("A", &fo).unwrap();
    same_results(&f, &s.finish().unwrap(), &[vec![4, 6, 8], vec![4, 6, 8]]);
}
