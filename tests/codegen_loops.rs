//! Loop metadata the LLVM emitter writes for serial loops nobody scheduled: an outer loop
//! whose accesses all stride by a row (its variable in no buffer's last index) is kept from
//! LLVM's loop vectorizer, which on AVX-512 would gather and scatter after unrolling the inner
//! loops; a loop that walks a row is left to it. Results are unchanged (interpreter vs JIT).

mod common;

use common::{interp_last, jit_last, target_opts};
use kiln::codegen::llvm::{generate_ir, CodegenOptions, Linkage};
use kiln::ir::{IRModule, PrimFunc};
use serde_json::{json, Value};

fn v(name: &str) -> Value {
    json!({ "var": name })
}

fn copy_nest(outer_in_last: bool) -> PrimFunc {
    // C[i, j] = A[i, j + 16] over C[64, 16] (a `split`), or C[j, i] = A[j, i] over C[16, 64]
    // with `i` outside (the outer loop walks the rows).
    let (ci, ai) = if outer_in_last {
        (vec![v("j"), v("i")], vec![v("j"), v("i")])
    } else {
        (
            vec![v("i"), v("j")],
            vec![
                v("i"),
                json!({ "op": "add", "args": [v("j"), { "const": 16, "dtype": "int64" }] }),
            ],
        )
    };
    let inner = json!({ "stmt": "for", "var": { "name": "j", "dtype": "int64" },
        "min": { "const": 0, "dtype": "int64" }, "extent": { "const": 16, "dtype": "int64" },
        "kind": "serial", "body": { "stmt": "store", "buffer": "C", "indices": ci,
            "value": { "op": "load", "buffer": "A", "indices": ai } } });
    let body = json!({ "stmt": "for", "var": { "name": "i", "dtype": "int64" },
        "min": { "const": 0, "dtype": "int64" }, "extent": { "const": 64, "dtype": "int64" },
        "kind": "serial", "body": inner });
    let (a_shape, c_shape) = if outer_in_last {
        (json!([16, 64]), json!([16, 64]))
    } else {
        (json!([64, 48]), json!([64, 16]))
    };
    let m = json!({ "format": "kiln-ir/1", "functions": [{ "name": "f",
        "params": [
            { "kind": "buffer", "name": "A", "dtype": "float32", "shape": a_shape },
            { "kind": "buffer", "name": "C", "dtype": "float32", "shape": c_shape }],
        "attrs": { "global_symbol": "f", "noalias": true }, "body": body }] });
    let m = IRModule::from_json_str(&m.to_string()).unwrap();
    m.verify().unwrap();
    m.functions[0].clone()
}

fn ir(f: &PrimFunc) -> String {
    generate_ir(
        &IRModule::from_functions(vec![f.clone()]),
        &CodegenOptions::host(),
        &Linkage::Export,
    )
    .unwrap()
}

fn width_one_loops(f: &PrimFunc) -> usize {
    ir(f)
        .matches("\"llvm.loop.vectorize.width\", i32 1}")
        .count()
}

/// The vector width the emitter picks for a short loop of `lanes`-lane steps storing
/// `float32` on this machine: a step is at most one register wide, the rest interleaved.
fn host_width(lanes: i64) -> i64 {
    let bits = i64::from(CodegenOptions::host().resolved().vector_register_bits());
    lanes.min(bits / 32).max(4)
}

/// The number of loops the emitter gives steps of `lanes` lanes (vectors of
/// [`host_width`], interleaved to `lanes`), not unrolled (a short innermost loop of
/// constant length).
fn short_loops(f: &PrimFunc, lanes: i64) -> usize {
    let ir = ir(f);
    let w = host_width(lanes);
    let n = ir
        .matches(&format!("\"llvm.loop.vectorize.width\", i32 {w}}}"))
        .count();
    if n > 0 {
        let il = lanes / w;
        assert!(
            ir.contains(&format!("\"llvm.loop.interleave.count\", i32 {il}}}")),
            "{ir}"
        );
        assert!(ir.contains("\"llvm.loop.unroll.disable\""), "{ir}");
    }
    n
}

#[test]
fn a_row_strided_outer_loop_is_kept_from_the_vectorizer() {
    let f = copy_nest(false);
    assert_eq!(width_one_loops(&f), 1);
    // The inner loop, 16 contiguous elements, is vectorized by 16 lanes (no scalar rest).
    assert_eq!(short_loops(&f, 16), 1);
    let shapes = [vec![64, 48], vec![64, 16]];
    assert_eq!(
        jit_last(&f, &shapes, &CodegenOptions::host()),
        interp_last(&f, &shapes)
    );
}

/// `C[i, j] = X[i] * float(j)` over `C[10, 12]`: TOPI's `one_hot` nest (`select(I[i] == j,
/// ...)`), whose outer loop reads `X` contiguously but stores rows apart.
fn row_of_a_broadcast() -> PrimFunc {
    let inner = json!({ "stmt": "for", "var": { "name": "j", "dtype": "int64" },
        "min": { "const": 0, "dtype": "int64" }, "extent": { "const": 12, "dtype": "int64" },
        "kind": "serial", "body": { "stmt": "store", "buffer": "C", "indices": [v("i"), v("j")],
            "value": { "op": "mul", "args": [
                { "op": "load", "buffer": "X", "indices": [v("i")] },
                { "op": "cast", "dtype": "float32", "args": [v("j")] }] } } });
    let body = json!({ "stmt": "for", "var": { "name": "i", "dtype": "int64" },
        "min": { "const": 0, "dtype": "int64" }, "extent": { "const": 10, "dtype": "int64" },
        "kind": "serial", "body": inner });
    let m = json!({ "format": "kiln-ir/1", "functions": [{ "name": "f",
        "params": [
            { "kind": "buffer", "name": "X", "dtype": "float32", "shape": [10] },
            { "kind": "buffer", "name": "C", "dtype": "float32", "shape": [10, 12] }],
        "attrs": { "global_symbol": "f", "noalias": true }, "body": body }] });
    let m = IRModule::from_json_str(&m.to_string()).unwrap();
    m.verify().unwrap();
    m.functions[0].clone()
}

#[test]
fn an_outer_loop_that_stores_rows_apart_is_kept_from_the_vectorizer() {
    // Its load `X[i]` is contiguous in `i`, its store is not: vectorized across `i` (LLVM 14,
    // AVX-512) each of the 12 columns was one scatter of 10 lanes.
    let f = row_of_a_broadcast();
    assert_eq!(width_one_loops(&f), 1);
    let o = target_opts(r#"{"kind": "llvm", "mcpu": "skylake-avx512"}"#);
    let m = kiln::codegen::llvm::LlvmModule::jit(&IRModule::from_functions(vec![f.clone()]), &o)
        .unwrap();
    m.wait_optimized().unwrap();
    use kiln::packed_func::Module;
    let asm = m.get_source("asm").unwrap();
    assert!(!asm.contains("vscatter"), "scatters:\n{asm}");
    let shapes = [vec![10], vec![10, 12]];
    assert_eq!(
        jit_last(&f, &shapes, &CodegenOptions::host()),
        interp_last(&f, &shapes)
    );
}

#[test]
fn an_outer_loop_that_walks_a_row_is_left_to_llvm() {
    let f = copy_nest(true);
    assert_eq!(width_one_loops(&f), 0);
    let shapes = [vec![16, 64], vec![16, 64]];
    assert_eq!(
        jit_last(&f, &shapes, &CodegenOptions::host()),
        interp_last(&f, &shapes)
    );
}

#[test]
fn a_parallel_loop_keeps_the_functions_noalias_buffers() {
    // C[i, j] = A[i, j] * C[i, j] + B[i, j] with `i` parallel, in a `noalias` function: the
    // loop's body sees its buffers as `noalias` arguments, so LLVM vectorizes `j` without
    // run-time overlap checks, whose fallback is a scalar copy of the loop (256 is a multiple
    // of every vector width: no scalar rest either).
    use kiln::packed_func::Module;
    let row = |name: &str| json!({ "op": "load", "buffer": name, "indices": [v("i"), v("j")] });
    let inner = json!({ "stmt": "for", "var": { "name": "j", "dtype": "int64" },
        "min": { "const": 0, "dtype": "int64" }, "extent": { "const": 256, "dtype": "int64" },
        "kind": "serial", "body": { "stmt": "store", "buffer": "C", "indices": [v("i"), v("j")],
            "value": { "op": "add", "args": [
                { "op": "mul", "args": [row("A"), row("C")] }, row("B")] } } });
    let body = json!({ "stmt": "for", "var": { "name": "i", "dtype": "int64" },
        "min": { "const": 0, "dtype": "int64" }, "extent": { "const": 64, "dtype": "int64" },
        "kind": "parallel", "body": inner });
    let buf =
        |n: &str| json!({ "kind": "buffer", "name": n, "dtype": "float32", "shape": [64, 256] });
    let m = json!({ "format": "kiln-ir/1", "functions": [{ "name": "f",
        "params": [buf("A"), buf("B"), buf("C")],
        "attrs": { "global_symbol": "f", "noalias": true }, "body": body }] });
    let m = IRModule::from_json_str(&m.to_string()).unwrap();
    m.verify().unwrap();
    let f = m.functions[0].clone();
    let shapes = [vec![64, 256], vec![64, 256], vec![64, 256]];
    assert_eq!(
        jit_last(&f, &shapes, &CodegenOptions::host()),
        interp_last(&f, &shapes)
    );
    let jit = kiln::codegen::llvm::LlvmModule::jit(&m, &CodegenOptions::host()).unwrap();
    let ll = jit.get_source("ll").unwrap();
    assert!(ll.contains("x float>"), "not vectorized:\n{ll}");
    assert!(
        !ll.contains("store float "),
        "a scalar loop left (overlap checks):\n{ll}"
    );
}

/// `C[i, j] = A[i, j] + B[j]` over `C[64, cols]`, rows and columns serial.
fn row_add(cols: i64) -> PrimFunc {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param};
    let t = DataType::f32();
    let a = Buffer::new("A", t, vec![Expr::from(64i64), Expr::from(cols)]);
    let b = Buffer::new("B", t, vec![Expr::from(cols)]);
    let c = Buffer::new("C", t, vec![Expr::from(64i64), Expr::from(cols)]);
    let body = for_range("i", Expr::from(64i64), ForKind::Serial, |i| {
        for_range("j", Expr::from(cols), ForKind::Serial, |j| {
            c.store(
                vec![i.clone(), j.clone()],
                a.load(vec![i, j.clone()]) + b.load(vec![j]),
            )
        })
    });
    PrimFunc::new(
        "row_add",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
    .with_noalias(true)
}

/// A short row of a few vector steps (48 floats: three of 16 lanes) is unrolled into straight
/// code once vectorized (`llvm.loop.vectorize.followup_vectorized`), as TVM's LLVM leaves it;
/// a longer row (256 floats, 16 steps) stays a loop. Results are unchanged.
#[test]
fn a_short_row_of_few_vector_steps_is_straight_code() {
    let unrolled = |f: &PrimFunc| {
        let ir = ir(f);
        ir.contains("\"llvm.loop.vectorize.followup_vectorized\"")
            && ir.contains("\"llvm.loop.unroll.full\"")
    };
    let short = row_add(48);
    assert_eq!(short_loops(&short, 16), 1);
    assert!(unrolled(&short));
    // Optimized: the row's three vector additions in one block, not one in a loop.
    use kiln::packed_func::Module;
    let m = kiln::codegen::llvm::LlvmModule::jit(
        &IRModule::from_functions(vec![short.clone()]),
        &CodegenOptions::host(),
    )
    .unwrap();
    let opt = m.get_source("ll").unwrap();
    let w = host_width(16);
    let adds = opt.matches(&format!("fadd <{w} x float>")).count() as i64;
    assert!(adds >= 48 / w, "{opt}");
    let long = row_add(256);
    assert_eq!(short_loops(&long, 16), 1);
    assert!(!unrolled(&long));
    for (f, cols) in [(short, 48), (long, 256)] {
        let shapes = [vec![64, cols], vec![cols], vec![64, cols]];
        assert_eq!(
            jit_last(&f, &shapes, &CodegenOptions::host()),
            interp_last(&f, &shapes)
        );
    }
}

/// The optimized LLVM IR of `f` for `cpu` (compiled ahead of time, never run: the CPU need not
/// be this machine's).
fn optimized_ir_for(f: &PrimFunc, cpu: &str) -> String {
    let mut o = CodegenOptions::host();
    o.triple = "x86_64-unknown-linux-gnu".into();
    o.cpu = cpu.into();
    o.features = String::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.ll");
    kiln::codegen::llvm::export(&IRModule::from_functions(vec![f.clone()]), &o, &path).unwrap();
    std::fs::read_to_string(path).unwrap()
}

/// LLVM 14's cost model of AMD's Zen 3 (`znver3`, also what LLVM 14 makes of a Zen 4) lets
/// its unroller copy a loop up to 512 operations long, where Intel's models allow 50: a nest
/// of 64 rows of 48 floats became 32 rows of straight code per iteration (6 KiB of code for
/// a 0.3 us operator, run from a cold instruction cache, 0.65x TVM's time). kiln caps the
/// partial unrolling of loops nobody scheduled for every CPU; the row itself is still three
/// vector steps.
#[test]
fn an_elementwise_nest_is_not_unrolled_into_dozens_of_rows_on_any_cpu() {
    let f = row_add(48);
    for (cpu, w) in [("znver3", 8), ("haswell", 8), ("skylake-avx512", 16)] {
        let ll = optimized_ir_for(&f, cpu);
        let adds = ll.matches(&format!("fadd <{w} x float>")).count();
        let per_row = 48 / w;
        assert!(
            (per_row..=8 * per_row).contains(&adds),
            "{cpu}: {adds} vector additions ({per_row} per row of 48 floats), expected at most 8 rows"
        );
    }
}

/// LLVM 14 splits a store wider than a register into register-wide stores in descending
/// address order (the high half first), which a Zen 3 drains slower: `pad`'s rows of 48 floats
/// copied in 16 lanes took 0.34 us, in ascending `ymm` stores 0.28 us. A short row's steps are
/// at most a register wide, interleaved to keep 16 lanes of work a step: one `xmm` for a
/// generic x86-64 (TVM's default target), one `ymm` with AVX2, one `zmm` with AVX-512.
#[test]
fn a_short_row_stores_at_most_a_register_at_a_time() {
    let f = row_add(48);
    for (cpu, w) in [
        ("x86-64", 4),
        ("znver3", 8),
        ("haswell", 8),
        ("skylake-avx512", 16),
    ] {
        let ll = optimized_ir_for(&f, cpu);
        assert!(ll.contains(&format!("store <{w} x float>")), "{cpu}: {ll}");
        for wider in [2 * w, 4 * w] {
            assert!(
                !ll.contains(&format!("store <{wider} x float>")),
                "{cpu}: {ll}"
            );
        }
    }
    let shapes = [vec![64, 48], vec![48], vec![64, 48]];
    assert_eq!(
        jit_last(&f, &shapes, &CodegenOptions::host()),
        interp_last(&f, &shapes)
    );
}

/// `C[i, j] = A[i, clamp(floor((j + 0.5) * 0.8 - 0.5))]`: the source column of a resize of
/// `A[., 16]` to `cols` columns, computed from `float(j)`; `weighted`, the element is scaled by
/// the coordinate's fraction, as a linear resize weighs its neighbours.
fn resize_rows(cols: i64, weighted: bool) -> PrimFunc {
    use kiln::ir::builder::{floor, for_range};
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param};
    let t = DataType::f32();
    let a = Buffer::new("A", t, vec![Expr::from(8i64), Expr::from(16i64)]);
    let c = Buffer::new("C", t, vec![Expr::from(8i64), Expr::from(cols)]);
    let body = for_range("i", Expr::from(8i64), ForKind::Serial, |i| {
        for_range("j", Expr::from(cols), ForKind::Serial, |j| {
            let x = (j.clone().cast(t) + 0.5f32) * 0.8f32 - 0.5f32;
            let col = floor(x.clone()).cast(DataType::i64()).min(15i64).max(0i64);
            let v = a.load(vec![i.clone(), col]);
            let v = if weighted {
                v * (x.clone() - floor(x))
            } else {
                v
            };
            c.store(vec![i, j], v)
        })
    });
    PrimFunc::new(
        "resize_rows",
        vec![Param::Buffer(a), Param::Buffer(c)],
        body,
    )
    .with_noalias(true)
}

/// A short loop (at most 32 iterations) that converts its variable to a float (a resize's
/// source coordinate) is unrolled fully: each iteration's coordinate folds to a constant
/// (`resize_bilinear` of TVM's corpus: 3.5x TVM's time unrolled on a Zen 3, 1.06x as a loop).
/// Where the row only gathers (a nearest-neighbour resize), it is vector code with no loop:
/// one load of the source row's window and a constant shuffle (`tests/codegen_windows.rs`).
/// A longer one stays a loop. Results equal the interpreter's.
#[test]
fn a_short_loop_that_converts_its_variable_to_a_float_is_unrolled() {
    let short = resize_rows(20, true);
    assert!(ir(&short).contains("\"llvm.loop.unroll.full\""));
    let ll = optimized_ir_for(&short, "haswell");
    assert!(
        !ll.contains("llvm.floor"),
        "the coordinates did not fold:\n{ll}"
    );
    let gather = resize_rows(20, false);
    let text = ir(&gather);
    assert!(
        text.contains("shufflevector <16 x float>") && !text.contains("llvm.loop.unroll.full"),
        "{text}"
    );
    let long = resize_rows(40, true);
    assert!(!ir(&long).contains("\"llvm.loop.unroll.full\""));
    for (f, cols) in [(short, 20), (gather, 20), (long, 40)] {
        let shapes = [vec![8, 16], vec![8, cols]];
        assert_eq!(
            jit_last(&f, &shapes, &CodegenOptions::host()),
            interp_last(&f, &shapes)
        );
    }
}

/// A register tile `4 x nr` accumulated over `k` (`C[i, j] += A[i, k] * B[k, j]`).
fn tile(nr: i64) -> PrimFunc {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param};
    let t = DataType::f32();
    let a = Buffer::new("A", t, vec![Expr::from(4i64), Expr::from(64i64)]);
    let b = Buffer::new("B", t, vec![Expr::from(64i64), Expr::from(nr)]);
    let c = Buffer::new("C", t, vec![Expr::from(4i64), Expr::from(nr)]);
    let body = for_range("k", Expr::from(64i64), ForKind::Serial, |k| {
        for_range("i", Expr::from(4i64), ForKind::Unrolled, |i| {
            for_range("j", Expr::from(nr), ForKind::Vectorized, |j| {
                let acc = c.load(vec![i.clone(), j.clone()])
                    + a.load(vec![i.clone(), k.clone()]) * b.load(vec![k.clone(), j.clone()]);
                c.store(vec![i, j], acc)
            })
        })
    });
    PrimFunc::new(
        "tile",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
    .with_noalias(true)
}

/// The lane counts of the vector types in LLVM IR text (`<24 x float>`: 24).
fn vector_lanes(ll: &str) -> Vec<i64> {
    ll.split('<')
        .skip(1)
        .filter_map(|rest| {
            let (n, tail) = rest.split_once(" x ")?;
            (!tail.starts_with('[')).then_some(())?;
            n.parse().ok()
        })
        .collect()
}

/// A vectorized loop of a width that is not a power of two is emitted in pieces that are (24
/// lanes: 16 and 8; 7: 4, 2 and a scalar lane). A `<24 x float>` register tile's accumulators,
/// carried around the `k` loop, were taken apart lane by lane on every iteration by LLVM 14's
/// x86 backend: a 4 x 24 matmul tile ran at a fifth of a 4 x 16 tile's speed. Results are
/// unchanged.
#[test]
fn a_vector_width_that_is_not_a_power_of_two_is_emitted_in_pieces_that_are() {
    for nr in [24, 20, 7, 3, 16] {
        let f = tile(nr);
        let emitted = ir(&f);
        let lanes = vector_lanes(&emitted);
        assert!(!lanes.is_empty(), "nr {nr}: no vectors in {emitted}");
        assert!(
            lanes.iter().all(|n| n.count_ones() == 1),
            "nr {nr}: vector widths {lanes:?}"
        );
        let opt = optimized_ir_for(&f, "znver3");
        assert!(
            vector_lanes(&opt).iter().all(|n| n.count_ones() == 1),
            "nr {nr}: {opt}"
        );
        let shapes = [vec![4, 64], vec![64, nr], vec![4, nr]];
        assert_eq!(
            jit_last(&f, &shapes, &CodegenOptions::host()),
            interp_last(&f, &shapes),
            "nr {nr}"
        );
    }
}

/// The reduction loop of a register tile (a serial loop whose body is only unrolled and
/// vectorized loops, rows unrolled: a matmul's `k` loop around its `mr x nr` tile) is unrolled four times,
/// whatever the CPU's cost model would do (LLVM 14's Zen 3 model unrolled it by up to 24, its
/// Intel models by 2; the cap above would leave it a loop). Results are unchanged.
#[test]
fn a_register_tiles_reduction_loop_is_unrolled_four_times() {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param};
    let t = DataType::f32();
    let f = tile(16);
    assert!(
        ir(&f).contains("\"llvm.loop.unroll.count\", i32 4}"),
        "{}",
        ir(&f)
    );
    let shapes = [vec![4, 64], vec![64, 16], vec![4, 16]];
    assert_eq!(
        jit_last(&f, &shapes, &CodegenOptions::host()),
        interp_last(&f, &shapes)
    );
    // A loop over the vector chunks of a row (no unrolled rows inside) is not a tile.
    let a = Buffer::new("A", t, vec![Expr::from(1024i64)]);
    let c = Buffer::new("C", t, vec![Expr::from(1024i64)]);
    let body = for_range("o", Expr::from(64i64), ForKind::Serial, |o| {
        for_range("i", Expr::from(16i64), ForKind::Vectorized, |i| {
            let x = o.clone() * 16i64 + i;
            c.store(vec![x.clone()], a.load(vec![x]) * 2.0f32)
        })
    });
    let chunks =
        PrimFunc::new("chunks", vec![Param::Buffer(a), Param::Buffer(c)], body).with_noalias(true);
    assert!(!ir(&chunks).contains("llvm.loop.unroll.count"));
}

/// A vector loop whose index is computed in 64 bits and narrowed to a 32-bit buffer index
/// (the copies `cache_read` and `cache_write` add to a TVM function, whose buffers have 32-bit
/// shapes) is contiguous: kiln emits one vector load and one vector store, not a load and an
/// insert per lane with the index recomputed for each (13 700 lines of IR for a packed 512³
/// matmul in TVM's form, 1.3 s of LLVM's time a candidate in `kiln tune`; 2 100 lines and
/// 0.28 s now). Results as the interpreter's.
#[test]
fn an_index_narrowed_to_32_bits_is_still_a_contiguous_vector() {
    use kiln::ir::builder::{for_range, int};
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param};
    let (t, i32t, i64t) = (DataType::f32(), DataType::i32(), DataType::i64());
    let c32 = |v: i64| int(i32t, v);
    let a = Buffer::new("A", t, vec![c32(8), c32(64)]);
    let c = Buffer::new("C", t, vec![c32(8), c32(64)]);
    let body = for_range("i", c32(8), ForKind::Serial, |i| {
        for_range("p", int(i64t, 4), ForKind::Serial, |p| {
            for_range("j", int(i64t, 16), ForKind::Vectorized, |j| {
                let col = (p * int(i64t, 16) + j).cast(i32t);
                c.store(
                    vec![i.clone(), col.clone()],
                    a.load(vec![i.clone(), col]) * Expr::from(2.0f32),
                )
            })
        })
    });
    let f = PrimFunc::new("narrowed", vec![Param::Buffer(a), Param::Buffer(c)], body)
        .with_noalias(true);
    f.verify().unwrap();
    let text = ir(&f);
    assert!(text.contains("load <16 x float>"), "{text}");
    assert!(text.contains("store <16 x float>"), "{text}");
    assert!(!text.contains("load float,"), "{text}");
    assert!(!text.contains("extractelement"), "{text}");
    let shapes = [vec![8, 64], vec![8, 64]];
    assert_eq!(
        jit_last(&f, &shapes, &CodegenOptions::host()),
        interp_last(&f, &shapes)
    );
}

/// `C[i, j] = exp(A[i, j])` over `rows x cols`, both loops serial.
fn exp_rows(rows: i64, cols: i64) -> PrimFunc {
    use kiln::ir::builder::{call, for_range};
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Intrinsic, Param};
    let t = DataType::f32();
    let a = Buffer::new("A", t, vec![Expr::from(rows), Expr::from(cols)]);
    let c = Buffer::new("C", t, vec![Expr::from(rows), Expr::from(cols)]);
    let body = for_range("i", Expr::from(rows), ForKind::Serial, |i| {
        for_range("j", Expr::from(cols), ForKind::Serial, |j| {
            let v = call(Intrinsic::Exp, vec![a.load(vec![i.clone(), j.clone()])]);
            c.store(vec![i, j], v)
        })
    });
    PrimFunc::new("exp_rows", vec![Param::Buffer(a), Param::Buffer(c)], body).with_noalias(true)
}

/// An outer loop around a loop that stays a loop (more than 64 iterations) is not unrolled:
/// LLVM's full unroller had copied TVM's 4 x 128 `tanh` four times, one vectorized loop each
/// (2.5x the compile time, nothing gained). Results equal the interpreter's.
#[test]
fn an_outer_loop_around_a_long_loop_is_not_unrolled() {
    let long = exp_rows(4, 128);
    for cpu in ["haswell", "skylake-avx512"] {
        let ll = optimized_ir_for(&long, cpu);
        let bodies = ll.lines().filter(|l| l.starts_with("vector.body")).count();
        assert_eq!(bodies, 1, "{cpu}: the outer loop was unrolled:\n{ll}");
    }
    let shapes = [vec![4, 128], vec![4, 128]];
    assert_eq!(
        jit_last(&long, &shapes, &CodegenOptions::host()),
        interp_last(&long, &shapes)
    );
}
