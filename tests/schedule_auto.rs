//! `kiln::schedule::auto::auto_parallel`: which loops become parallel (only those whose
//! iterations provably touch disjoint elements of what they write), and that the parallel
//! function computes exactly what the serial one does (interpreter against the JIT).

mod common;

use common::{interp_last, jit_last};
use kiln::codegen::llvm::CodegenOptions;
use kiln::ir::{IRModule, PrimFunc};
use kiln::schedule::auto::{auto_parallel, DEFAULT_MIN_WORK};
use serde_json::{json, Value};

fn v(name: &str) -> Value {
    json!({ "var": name })
}
fn c(x: i64) -> Value {
    json!({ "const": x, "dtype": "int64" })
}
fn ld(buf: &str, idx: Vec<Value>) -> Value {
    json!({ "op": "load", "buffer": buf, "indices": idx })
}
fn op(name: &str, a: Value, b: Value) -> Value {
    json!({ "op": name, "args": [a, b] })
}
fn st(buf: &str, idx: Vec<Value>, value: Value) -> Value {
    json!({ "stmt": "store", "buffer": buf, "indices": idx, "value": value })
}
fn for_(var: &str, extent: i64, body: Value) -> Value {
    json!({ "stmt": "for", "var": { "name": var, "dtype": "int64" }, "min": c(0),
            "extent": c(extent), "kind": "serial", "body": body })
}
fn buf(name: &str, shape: &[i64]) -> Value {
    json!({ "kind": "buffer", "name": name, "dtype": "float32", "shape": shape })
}

fn func(params: Vec<Value>, body: Value, noalias: bool) -> PrimFunc {
    let m = json!({ "format": "kiln-ir/1", "functions": [{
        "name": "f", "params": params,
        "attrs": { "global_symbol": "f", "noalias": noalias }, "body": body }] });
    let m = IRModule::from_json_str(&m.to_string()).unwrap();
    m.verify().unwrap();
    m.functions[0].clone()
}

/// `C[i, j] = A[i, j] * 2 + B[j]` over 256 x 256.
fn elementwise(noalias: bool) -> PrimFunc {
    let body = for_(
        "i",
        256,
        for_(
            "j",
            256,
            st(
                "C",
                vec![v("i"), v("j")],
                op(
                    "add",
                    op(
                        "mul",
                        ld("A", vec![v("i"), v("j")]),
                        json!({ "const": 2.0, "dtype": "float32" }),
                    ),
                    ld("B", vec![v("j")]),
                ),
            ),
        ),
    );
    func(
        vec![
            buf("A", &[256, 256]),
            buf("B", &[256]),
            buf("C", &[256, 256]),
        ],
        body,
        noalias,
    )
}

/// `C = A @ B` (96 x 64 x 80) with its zeroing inside the reduction, as TVM's LowerInitBlock
/// writes it.
fn matmul() -> PrimFunc {
    let init = json!({ "stmt": "if", "cond": op("eq", v("k"), c(0)),
        "then": st("C", vec![v("i"), v("j")], json!({ "const": 0.0, "dtype": "float32" })) });
    let upd = st(
        "C",
        vec![v("i"), v("j")],
        op(
            "add",
            ld("C", vec![v("i"), v("j")]),
            op(
                "mul",
                ld("A", vec![v("i"), v("k")]),
                ld("B", vec![v("k"), v("j")]),
            ),
        ),
    );
    let body = for_(
        "i",
        96,
        for_(
            "j",
            80,
            for_("k", 64, json!({ "stmt": "seq", "stmts": [init, upd] })),
        ),
    );
    func(
        vec![
            buf("A", &[96, 64]),
            buf("B", &[64, 80]),
            buf("C", &[96, 80]),
        ],
        body,
        true,
    )
}

fn same_results(serial: &PrimFunc, parallel: &PrimFunc, shapes: &[Vec<i64>]) {
    let want = interp_last(serial, shapes);
    let got = jit_last(parallel, shapes, &CodegenOptions::host());
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "[{i}] {g} vs {w}");
    }
}

#[test]
fn an_elementwise_nest_runs_its_outer_loop_in_parallel() {
    let f = elementwise(true);
    let r = auto_parallel(&f, DEFAULT_MIN_WORK);
    assert_eq!(r.loops, ["i"]);
    assert!(r.func.to_string().contains("parallel"), "{}", r.func);
    same_results(&f, &r.func, &[vec![256, 256], vec![256], vec![256, 256]]);
}

#[test]
fn a_matmul_with_its_init_inside_the_reduction_is_parallel_over_rows() {
    let f = matmul();
    let r = auto_parallel(&f, 1);
    assert_eq!(r.loops, ["i"]);
    same_results(&f, &r.func, &[vec![96, 64], vec![64, 80], vec![96, 80]]);
}

#[test]
fn without_noalias_or_below_the_work_threshold_nothing_changes() {
    let f = elementwise(false);
    let r = auto_parallel(&f, 1);
    assert!(r.loops.is_empty());
    assert_eq!(r.func, f);
    let f = elementwise(true);
    let r = auto_parallel(&f, 256 * 256 + 1);
    assert!(r.loops.is_empty());
    assert_eq!(r.func, f);
}

#[test]
fn a_loop_carried_write_stays_serial_and_the_search_goes_inside() {
    // S[0] += A[i, j] over i: iterations of i share S[0]; the inner loop over j writes
    // T[i, j] only, but sits under the serial i... and S[0] is written in the same body, so
    // j is not independent either (S[0] has no j). Nothing is parallel.
    let sum = st(
        "S",
        vec![c(0)],
        op("add", ld("S", vec![c(0)]), ld("A", vec![v("i"), v("j")])),
    );
    let f = func(
        vec![buf("A", &[256, 256]), buf("S", &[1])],
        for_("i", 256, for_("j", 256, sum)),
        true,
    );
    let r = auto_parallel(&f, 1);
    assert!(r.loops.is_empty(), "{:?}", r.loops);

    // Column sums: R[j] += A[i, j]. `i` carries R, but within one i every j writes its own
    // R[j]: the inner loop is parallel (per iteration of i).
    let col = st(
        "R",
        vec![v("j")],
        op("add", ld("R", vec![v("j")]), ld("A", vec![v("i"), v("j")])),
    );
    let f = func(
        vec![buf("A", &[256, 256]), buf("R", &[256])],
        for_("i", 256, for_("j", 256, col)),
        true,
    );
    let r = auto_parallel(&f, 1);
    assert_eq!(r.loops, ["j"]);
    same_results(&f, &r.func, &[vec![256, 256], vec![256]]);
}

#[test]
fn reading_a_neighbour_of_what_is_written_is_not_independent() {
    // A[i, j] = A[i + 1, j] * 0.5: iteration i reads the row iteration i + 1 writes.
    let body = for_(
        "i",
        255,
        for_(
            "j",
            256,
            st(
                "A",
                vec![v("i"), v("j")],
                op(
                    "mul",
                    ld("A", vec![op("add", v("i"), c(1)), v("j")]),
                    json!({ "const": 0.5, "dtype": "float32" }),
                ),
            ),
        ),
    );
    let f = func(vec![buf("A", &[256, 256])], body, true);
    let r = auto_parallel(&f, 1);
    // `j` is independent within one `i` (it reads and writes column j only at row i and i + 1).
    assert_eq!(r.loops, ["j"]);
    same_results(&f, &r.func, &[vec![256, 256]]);
}

#[test]
fn a_loop_of_one_iteration_is_looked_through() {
    let body = for_(
        "b",
        1,
        for_(
            "i",
            256,
            for_(
                "j",
                256,
                st(
                    "C",
                    vec![v("b"), v("i"), v("j")],
                    ld("A", vec![v("b"), v("j"), v("i")]),
                ),
            ),
        ),
    );
    let f = func(
        vec![buf("A", &[1, 256, 256]), buf("C", &[1, 256, 256])],
        body,
        true,
    );
    let r = auto_parallel(&f, 1);
    assert_eq!(r.loops, ["i"]);
    same_results(&f, &r.func, &[vec![1, 256, 256], vec![1, 256, 256]]);
}

#[test]
fn a_scheduled_function_is_left_alone() {
    // An elementwise nest whose inner loop someone made parallel: the outer loop, though
    // independent, is not touched (a parallel loop may not nest in a parallel one, and the
    // schedule is someone's choice).
    let mut f = elementwise(true);
    let kiln::ir::Stmt::For { body, .. } = &mut f.body else {
        unreachable!()
    };
    let kiln::ir::Stmt::For { kind, .. } = body.as_mut() else {
        unreachable!()
    };
    *kind = kiln::ir::ForKind::Parallel;
    let r = auto_parallel(&f, 1);
    assert!(r.loops.is_empty());
    assert_eq!(r.func, f);
}

// ---- The default device schedule (`bind_default`, TVM's `DefaultGPUSchedule`) ----

use kiln::schedule::auto::{bind_default, device_default};
use kiln::schedule::Schedule;

/// `f` with the default device schedule, checked in the interpreter (which runs thread-bound
/// loops as a device would, and reports races on shared memory) against `f` itself.
fn bound_like(f: &PrimFunc, shapes: &[Vec<i64>], max_threads: i64) -> PrimFunc {
    let g = device_default(f, max_threads).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(interp_last(&g, shapes), interp_last(f, shapes), "{g}");
    g
}

#[test]
fn the_default_device_schedule_fuses_the_independent_loops_into_threads() {
    let g = bound_like(
        &elementwise(true),
        &[vec![256, 256], vec![256], vec![256, 256]],
        1024,
    );
    let text = g.to_string();
    // i and j fused (65536 iterations), 256 threads a block.
    assert!(text.contains("i_j"), "{text}");
    assert!(
        text.contains("blockIdx.x") && text.contains("threadIdx.x"),
        "{text}"
    );
    // The target's limit wins when it is lower.
    let g = device_default(&elementwise(true), 64).unwrap();
    assert!(!g.to_string().contains(", 256)"), "{g}");
}

#[test]
fn the_default_device_schedule_keeps_reductions_in_the_thread_and_host_loops_on_the_host() {
    // matmul: i and j fused into threads, k serial in each.
    let m = kiln::ir::kernels::matmul_sized(13, 40, 5);
    let g = bound_like(&m, &[vec![13, 5], vec![5, 40], vec![13, 40]], 256);
    let text = g.to_string();
    assert!(text.contains("i_j"), "{text}");
    // A small nest gets as many threads as it has iterations: 13 * 40 = 520 > 256, so 256.
    // TVM's form (the init guarded in the first iteration of k) too.
    let t = kiln::ir::kernels::matmul_tvm_form(7, 9, 4);
    bound_like(&t, &[vec![7, 4], vec![4, 9], vec![7, 9]], 256);
    // `for k { for i { C[i] += A[k, i] } }`: k is not independent, so it stays a host loop
    // launching a kernel over i each iteration.
    let body = for_(
        "k",
        8,
        for_(
            "i",
            100,
            st(
                "C",
                vec![v("i")],
                op("add", ld("C", vec![v("i")]), ld("A", vec![v("k"), v("i")])),
            ),
        ),
    );
    let f = func(vec![buf("A", &[8, 100]), buf("C", &[100])], body, true);
    let g = bound_like(&f, &[vec![8, 100], vec![100]], 256);
    let text = g.to_string();
    assert!(text.contains("for k"), "{text}");
    // 100 iterations: one block of 100 threads, no guard.
    assert!(!text.contains("if "), "{text}");
}

#[test]
fn a_nest_with_no_independent_loop_runs_on_one_thread() {
    // `for k { S[0] += A[k] }`
    let body = for_(
        "k",
        64,
        st(
            "S",
            vec![c(0)],
            op("add", ld("S", vec![c(0)]), ld("A", vec![v("k")])),
        ),
    );
    let f = func(vec![buf("A", &[64]), buf("S", &[1])], body, true);
    let g = bound_like(&f, &[vec![64], vec![1]], 256);
    let text = g.to_string();
    assert!(
        text.contains("blockIdx.x") && !text.contains("threadIdx"),
        "{text}"
    );
}

#[test]
fn the_default_device_schedule_leaves_kernels_and_host_statements_alone() {
    // Bound already: nothing changes.
    let k = kiln::schedule::kernels::opencl_vadd().unwrap();
    let mut s = Schedule::new(k.clone());
    assert!(bind_default(&mut s, 256).unwrap().is_empty());
    assert!(s.trace().is_empty());
    assert_eq!(s.finish().unwrap(), k);
    // A store outside any loop stays where it is (the build then says the host cannot
    // touch device memory).
    let one = json!({ "const": 1.0, "dtype": "float32" });
    let f = func(vec![buf("S", &[1])], st("S", vec![c(0)], one), true);
    let mut s = Schedule::new(f);
    assert!(bind_default(&mut s, 256).unwrap().is_empty());
    // No threads at all is a clear error.
    let mut s = Schedule::new(elementwise(true));
    let e = bind_default(&mut s, 0).unwrap_err().to_string();
    assert!(e.contains("at least one thread per block, found 0"), "{e}");
}

#[test]
fn the_default_device_schedule_replays_from_its_trace() {
    let f = kiln::ir::kernels::softmax_sized(4, 32);
    let mut s = Schedule::new(f.clone());
    let loops = bind_default(&mut s, 256).unwrap();
    assert_eq!(loops, ["i"]);
    let steps = s.trace().to_vec();
    let g = s.finish().unwrap();
    let mut r = Schedule::new(f);
    r.apply(&steps).unwrap();
    assert_eq!(r.finish().unwrap().to_string(), g.to_string());
}
