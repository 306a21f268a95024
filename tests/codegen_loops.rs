//! Loop metadata the LLVM emitter writes for serial loops nobody scheduled: an outer loop
//! whose accesses all stride by a row (its variable in no buffer's last index) is kept from
//! LLVM's loop vectorizer, which on AVX-512 would gather and scatter after unrolling the inner
//! loops; a loop that walks a row is left to it. Results are unchanged (interpreter vs JIT).

mod common;

use common::{interp_last, jit_last};
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

/// The number of loops the emitter gives a vector width of `w` lanes, uninterleaved and not
/// unrolled (a short innermost loop of constant length).
fn short_loops(f: &PrimFunc, w: i64) -> usize {
    let ir = ir(f);
    let n = ir
        .matches(&format!("\"llvm.loop.vectorize.width\", i32 {w}}}"))
        .count();
    if n > 0 {
        assert!(
            ir.contains("\"llvm.loop.interleave.count\", i32 1}"),
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
    assert!(opt.matches("fadd <16 x float>").count() >= 3, "{opt}");
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
