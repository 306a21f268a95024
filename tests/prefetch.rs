//! `Stmt::Prefetch` and `Schedule::prefetch`: the IR form (JSON, printer, verifier,
//! interpreter), the schedule primitive and its errors and replay, and the LLVM code: one
//! `llvm.prefetch` per cache line of a vector, an address past the buffer's end that runs,
//! and results equal to the interpreter's.

mod common;

use kiln::codegen::llvm::{generate_ir, CodegenOptions, Linkage};
use kiln::ir::interp::{run, HostBuffer, InterpArg};
use kiln::ir::{
    builder::for_range, Buffer, DataType, Expr, ForKind, IRModule, Intrinsic, Param, PrimFunc, Stmt,
};
use kiln::schedule::{kernels as sk, Schedule, ScheduleError, Step};

/// `B[i, j] = A[i, j] * 2` over `rows x cols`.
fn scale(rows: i64, cols: i64) -> PrimFunc {
    let t = DataType::f32();
    let a = Buffer::new("A", t, vec![Expr::from(rows), Expr::from(cols)]);
    let b = Buffer::new("B", t, vec![Expr::from(rows), Expr::from(cols)]);
    let body = for_range("i", Expr::from(rows), ForKind::Serial, |i| {
        for_range("j", Expr::from(cols), ForKind::Serial, |j| {
            b.store(
                vec![i.clone(), j.clone()],
                a.load(vec![i.clone(), j.clone()]) * Expr::from(2.0f32),
            )
        })
    });
    PrimFunc::new("scale", vec![Param::Buffer(a), Param::Buffer(b)], body).with_noalias(true)
}

fn emitted(f: &PrimFunc) -> String {
    generate_ir(
        &IRModule::from_functions(vec![f.clone()]),
        &CodegenOptions::host(),
        &Linkage::Export,
    )
    .unwrap()
}

fn prefetches(ir: &str) -> usize {
    ir.matches("call void @llvm.prefetch").count()
}

#[test]
fn the_primitive_puts_a_prefetch_of_the_next_row_before_the_load() {
    let mut s = Schedule::new(scale(4, 64));
    assert_eq!(s.prefetch("j", "A", "i", 1).unwrap(), 1);
    let f = s.finish().unwrap();
    let text = f.to_string();
    assert!(text.contains("prefetch A[i + 1i64, j]"), "{text}");
    // Advancing the loop itself: the element 8 iterations ahead.
    let mut s = Schedule::new(scale(4, 64));
    s.prefetch("j", "A", "j", 8).unwrap();
    let text = s.finish().unwrap().to_string();
    assert!(text.contains("prefetch A[i, j + 8i64]"), "{text}");
}

#[test]
fn prefetches_change_no_result_even_past_the_last_row() {
    for lanes in [0, 8, 16, 32] {
        let mut s = Schedule::new(scale(5, 96));
        let at = if lanes == 0 {
            "j".to_string()
        } else {
            let (o, i) = s.split("j", lanes).unwrap();
            s.vectorize(&i).unwrap();
            o
        };
        // Two rows ahead: the last two rows prefetch rows 5 and 6, which do not exist.
        s.prefetch(&at, "A", "i", 2).unwrap();
        let f = s.finish().unwrap();
        let shapes = vec![vec![5, 96], vec![5, 96]];
        let want = common::interp_last(&f, &shapes);
        let got = common::jit_last(&f, &shapes, &CodegenOptions::host());
        assert_eq!(got, want, "{lanes} lanes");
        assert_eq!(want, common::interp_last(&scale(5, 96), &shapes));
    }
}

#[test]
fn a_vector_gets_one_prefetch_per_cache_line_and_no_inbounds_address() {
    for (lanes, want) in [(8, 1), (16, 1), (32, 2), (64, 4)] {
        let mut s = Schedule::new(scale(4, 128));
        let (o, i) = s.split("j", lanes).unwrap();
        s.vectorize(&i).unwrap();
        s.prefetch(&o, "A", "i", 1).unwrap();
        let ir = emitted(&s.finish().unwrap());
        assert_eq!(prefetches(&ir), want, "{lanes} lanes:\n{ir}");
        // The prefetch's address is computed without `inbounds`: past the end it is an
        // address, not poison.
        let line = ir
            .lines()
            .position(|l| l.contains("call void @llvm.prefetch"))
            .unwrap();
        let before: Vec<&str> = ir.lines().take(line).collect();
        let gep = before
            .iter()
            .rev()
            .find(|l| l.contains("getelementptr") && l.contains("float*"))
            .unwrap();
        assert!(!gep.contains("inbounds"), "{gep}");
    }
    // A scalar loop: one per iteration.
    let mut s = Schedule::new(scale(4, 128));
    s.prefetch("j", "A", "i", 1).unwrap();
    assert_eq!(prefetches(&emitted(&s.finish().unwrap())), 1);
}

#[test]
fn the_softmax_schedules_prefetch_the_next_row_and_match_the_interpreter() {
    for lanes in [sk::SoftmaxLanes::AVX512, sk::SoftmaxLanes::AVX2] {
        let f = sk::softmax_with(3, 128, lanes).unwrap();
        assert!(f.to_string().contains("prefetch A[i + 1i64, "), "{f}");
        let shapes = vec![vec![3, 128], vec![3, 128]];
        let want = common::interp_last(&sk::softmax_algorithm(3, 128, Intrinsic::FastExp), &shapes);
        let got = common::jit_last(&f, &shapes, &CodegenOptions::host());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6, "{lanes:?}: {g} against {w}");
        }
    }
}

#[test]
fn the_interpreter_ignores_a_prefetch_whose_index_would_fail() {
    // An index that divides by zero: a load would fail, a prefetch does nothing.
    let t = DataType::f32();
    let a = Buffer::new("A", t, vec![Expr::from(4i64)]);
    let b = Buffer::new("B", t, vec![Expr::from(4i64)]);
    let zero = Expr::from(0i64);
    let body = for_range("i", Expr::from(4i64), ForKind::Serial, |i| {
        Stmt::Seq(vec![
            Stmt::Prefetch {
                buffer: a.clone(),
                indices: vec![(i.clone() + Expr::from(1000i64)).floordiv(zero.clone())],
            },
            b.store(vec![i.clone()], a.load(vec![i.clone()])),
        ])
    });
    let f = PrimFunc::new("f", vec![Param::Buffer(a), Param::Buffer(b)], body);
    f.verify().unwrap();
    let mut args = vec![
        InterpArg::Buffer(HostBuffer::from_slice(&[4], &[1.0f32, 2.0, 3.0, 4.0])),
        InterpArg::Buffer(HostBuffer::zeros(t, &[4])),
    ];
    run(&f, &mut args).unwrap();
    assert_eq!(args[1].to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn json_round_trips_a_prefetch_and_rejects_a_malformed_one() {
    let mut s = Schedule::new(scale(2, 16));
    s.prefetch("j", "A", "i", 1).unwrap();
    let m = IRModule::from_functions(vec![s.finish().unwrap()]);
    let text = serde_json::to_string(&m.to_json()).unwrap();
    assert!(text.contains("\"stmt\":\"prefetch\""), "{text}");
    let back = IRModule::from_json_str(&text).unwrap();
    assert_eq!(serde_json::to_string(&back.to_json()).unwrap(), text);

    // A buffer that is not in scope, and an extra field: errors that say where.
    let bad = text.replace(
        "\"stmt\":\"prefetch\",\"buffer\":\"A\"",
        "\"stmt\":\"prefetch\",\"buffer\":\"Q\"",
    );
    let e = IRModule::from_json_str(&bad).unwrap_err().to_string();
    assert!(e.contains('Q') && e.contains("body"), "{e}");
    let bad = text.replace("\"stmt\":\"prefetch\",", "\"stmt\":\"prefetch\",\"rw\":1,");
    let e = IRModule::from_json_str(&bad).unwrap_err().to_string();
    assert!(e.contains("rw"), "{e}");
}

#[test]
fn the_verifier_checks_a_prefetch_like_a_load() {
    let t = DataType::f32();
    let a = Buffer::new("A", t, vec![Expr::from(4i64), Expr::from(4i64)]);
    let f = PrimFunc::new(
        "f",
        vec![Param::Buffer(a.clone())],
        Stmt::Prefetch {
            buffer: a,
            indices: vec![Expr::from(1i64)],
        },
    );
    let e = f.verify().unwrap_err().to_string();
    assert!(e.contains("rank 2") && e.contains("1 indices"), "{e}");
    let a = Buffer::new("A", t, vec![Expr::from(4i64)]);
    let f = PrimFunc::new(
        "f",
        vec![Param::Buffer(a.clone())],
        Stmt::Prefetch {
            buffer: a,
            indices: vec![Expr::from(1.5f32)],
        },
    );
    let e = f.verify().unwrap_err().to_string();
    assert!(e.contains("indices are int32 or int64"), "{e}");
}

#[test]
fn the_primitive_says_what_it_needs() {
    let err = |at: &str, buf: &str, var: &str, off: i64| -> String {
        let mut s = Schedule::new(scale(4, 16));
        let e = s.prefetch(at, buf, var, off).unwrap_err();
        assert!(matches!(
            e,
            ScheduleError::Form { .. } | ScheduleError::Loop { .. }
        ));
        assert!(s.trace().is_empty(), "a failed prefetch is not recorded");
        e.to_string()
    };
    assert!(err("j", "A", "i", 0).contains("offset other than 0"));
    assert!(err("j", "Z", "i", 1).contains("buffer `Z`"));
    assert!(err("i", "A", "j", 1).contains("`j` to be loop `i` or a loop around it"));
    assert!(err("j", "B", "i", 1).contains("no store in loop `j` whose value or indices load `B`"));
    assert!(err("k", "A", "i", 1).contains("loop named `k`"));
}

#[test]
fn a_prefetch_step_replays_from_json() {
    let mut s = Schedule::new(scale(4, 64));
    let (o, i) = s.split("j", 16).unwrap();
    s.vectorize(&i).unwrap();
    s.prefetch(&o, "A", "i", 1).unwrap();
    let steps = s.trace().to_vec();
    let json = serde_json::to_string(&steps).unwrap();
    assert!(
        json.contains(r#"{"prefetch":{"at":"j_o","buffer":"A","loop":"i","offset":1}}"#),
        "{json}"
    );
    let back: Vec<Step> = serde_json::from_str(&json).unwrap();
    let mut r = Schedule::new(scale(4, 64));
    r.apply(&back).unwrap();
    assert_eq!(
        r.finish().unwrap().to_string(),
        s.finish().unwrap().to_string()
    );
}

/// The matmul of `m x n x k` with `B` packed by each task, `panels` at a time, `k` in passes
/// of `kc`, the next pass's slice prefetched or not ([`sk::PackB::InTask`] `ahead`).
fn packed(m: i64, n: i64, k: i64, kc: i64, panels: i64, ahead: bool) -> Schedule {
    common::packed_matmul(
        [m, n, k],
        [4, 16, m, kc],
        sk::PackB::InTask { panels, ahead },
        sk::PackA::InPlace,
    )
}

/// `f` with each prefetch of `B` made a store of a mark into a buffer `H` of `B`'s columns and
/// `extra` more rows (a prefetch may name the rows past the end), a parameter after the others:
/// what the interpreter then leaves in `H` shows which elements were prefetched.
fn marking_prefetches(f: &PrimFunc, rows: i64, cols: i64) -> PrimFunc {
    marking_prefetches_of(f, "B", rows, cols)
}

/// [`marking_prefetches`] of buffer `b`.
fn marking_prefetches_of(f: &PrimFunc, b: &str, rows: i64, cols: i64) -> PrimFunc {
    fn mark(v: &mut serde_json::Value, b: &str) {
        match v {
            serde_json::Value::Object(o) => {
                if o.get("stmt").and_then(|s| s.as_str()) == Some("prefetch") {
                    assert_eq!(o["buffer"], b);
                    let indices = o["indices"].clone();
                    *v = serde_json::json!({"stmt": "store", "buffer": "H", "indices": indices,
                        "value": {"const": MARK, "dtype": "float32"}});
                    return;
                }
                o.values_mut().for_each(|x| mark(x, b));
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| mark(x, b)),
            _ => {}
        }
    }
    let mut j = IRModule::from_functions(vec![f.clone()]).to_json();
    mark(&mut j["functions"][0]["body"], b);
    j["functions"][0]["params"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"kind": "buffer", "name": "H", "dtype": "float32", "shape": [rows, cols]}));
    IRModule::from_json(&j).unwrap().functions.remove(0)
}

const MARK: f32 = 12345.0;

#[test]
fn prefetch_next_fetches_every_line_of_the_next_pass_spread_over_the_tiles() {
    for (m, n, k, kc, panels) in [(16, 96, 64, 16, 2), (8, 64, 48, 8, 4), (12, 48, 32, 16, 1)] {
        let s = packed(m, n, k, kc, panels, true);
        assert!(
            s.trace()
                .iter()
                .any(|t| matches!(t, Step::PrefetchNext { .. })),
            "{:?}",
            s.trace()
        );
        let f = s.finish().unwrap();
        let text = f.to_string();
        // Spread over the register tiles' `k` loop, split into slots: not in the copy.
        assert!(text.contains("prefetch B["), "{text}");
        assert!(text.contains("k0_i_o"), "{text}");
        // The same results, JIT-compiled and interpreted.
        let shapes = vec![vec![m, k], vec![k, n], vec![m, n]];
        let want = common::interp_last(&kiln::ir::kernels::matmul_sized(m, n, k), &shapes);
        let got = common::jit_last(&f, &shapes, &CodegenOptions::host());
        for (x, y) in got.iter().zip(&want) {
            assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "{x} vs {y}");
        }
        // Which elements the prefetches name: every 16-float line of every row of every pass
        // but the first (which nothing precedes), once each, and the rows of the pass past
        // the end; nothing of the first pass.
        let rows = k + kc;
        let marked = marking_prefetches(&f, rows, n);
        let mut shapes = shapes.clone();
        shapes.push(vec![rows, n]);
        let h = common::interp_last(&marked, &shapes);
        for r in 0..rows {
            for c in (0..n).step_by(16) {
                let hit = h[(r * n + c) as usize] == MARK;
                assert_eq!(hit, r >= kc, "{m}x{n}x{k}, kc {kc}: row {r}, column {c}");
            }
        }
        let hits = h.iter().filter(|&&x| x == MARK).count() as i64;
        assert_eq!(hits, k * n / 16, "{m}x{n}x{k}: each line once");
    }
}

#[test]
fn prefetch_next_refuses_what_it_cannot_spread_and_replays() {
    let (m, n, k) = (16, 96, 64);
    let plain = || packed(m, n, k, 16, 2, false);
    let msg = |e: ScheduleError| e.to_string();
    // No copy into that buffer.
    let e = msg(plain()
        .prefetch_next("A_local", "k0_o", "k0_i")
        .unwrap_err());
    assert!(
        e.contains("exactly one copy into `A_local`") && e.contains("found 0"),
        "{e}"
    );
    // `loop` not around `at`.
    let e = msg(plain()
        .prefetch_next("B_local", "k0_i", "k0_i")
        .unwrap_err());
    assert!(e.contains("needs `k0_i` to be a loop around `k0_i`"), "{e}");
    // `loop` around `at` but not around the copy (the copy's own loop).
    let e = msg(plain()
        .prefetch_next("B_local", "B_cr0", "k0_i")
        .unwrap_err());
    assert!(e.contains("`B_cr0`"), "{e}");
    // An unknown loop.
    assert!(plain().prefetch_next("B_local", "k0_o", "nope").is_err());
    // A refused step leaves the schedule as it was; a good one replays from its JSON.
    let mut s = plain();
    let before = s.func().to_string();
    assert!(s.prefetch_next("B_local", "k0_o", "nope").is_err());
    assert_eq!(s.func().to_string(), before);
    let lines = s.prefetch_next("B_local", "k0_o", "k0_i").unwrap();
    assert_eq!(lines, 16 * 2, "16 rows of 2 panels of one line each");
    let json = serde_json::to_string(s.trace()).unwrap();
    assert!(
        json.contains(r#"{"prefetch_next":{"cache":"B_local","loop":"k0_o","at":"k0_i"}}"#),
        "{json}"
    );
    let steps: Vec<Step> = serde_json::from_str(&json).unwrap();
    let mut again = Schedule::new(kiln::ir::kernels::matmul_sized(m, n, k));
    again.apply(&steps).unwrap();
    assert_eq!(again.func().to_string(), s.func().to_string());
}

/// TVM's form (the corpus's `matmul`, 64 x 40 x 48, `int32` shapes: its indices are computed in
/// `int64` and converted back): the copy's rows are still seen as contiguous runs, one prefetch
/// per line, not one per element.
#[test]
fn prefetch_next_sees_runs_through_tvms_int32_indices() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tvm027_topi_corpus.json"
    ))
    .unwrap();
    let module = IRModule::from_json_str(&text).unwrap();
    let f = module
        .functions
        .iter()
        .find(|f| f.name == "matmul")
        .unwrap()
        .clone();
    let mm = kiln::tune::templates::match_matmul(&f).unwrap();
    let [m, n, k] = mm.shape;
    let (kc, nr, panels) = (16, 8, 5);
    let mut s = Schedule::new(f.clone());
    s.apply(&mm.prefix).unwrap();
    let s = sk::matmul_tiled_packing(
        s,
        &mm.parts,
        mm.shape,
        sk::MatmulTiles {
            mr: 4,
            nr,
            mb: m,
            kc,
        },
        sk::PackB::InTask {
            panels,
            ahead: true,
        },
        sk::PackA::InPlace,
    )
    .unwrap();
    let g = s.finish().unwrap();
    let text = g.to_string();
    assert!(text.contains("prefetch Bm["), "{text}");
    let shapes = vec![vec![m, k], vec![k, n], vec![m, n]];
    let want = common::interp_last(&f, &shapes);
    let got = common::jit_last(&g, &shapes, &CodegenOptions::host());
    for (x, y) in got.iter().zip(&want) {
        assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "{x} vs {y}");
    }
    let rows = k + kc;
    let marked = marking_prefetches_of(&g, "Bm", rows, n);
    let mut shapes = shapes;
    shapes.push(vec![rows, n]);
    let h = common::interp_last(&marked, &shapes);
    for r in 0..rows {
        let cols: Vec<i64> = (0..n)
            .filter(|&c| h[(r * n + c) as usize] == MARK)
            .collect();
        if r < kc {
            assert!(cols.is_empty(), "row {r}: {cols:?}");
        } else {
            // One prefetch per panel's run of 8 floats (32 bytes, in one line), at its start.
            assert_eq!(
                cols,
                (0..n).step_by(nr as usize).collect::<Vec<_>>(),
                "row {r}"
            );
        }
    }
}

/// On a plain copy (`cache_read` of a row): a prefetch every 16 iterations of the row's loop
/// fetches the next row a line at a time; a loop of one iteration cannot hold 128 lines (more
/// than 64 prefetches a slot) and is refused, the schedule unchanged.
#[test]
fn prefetch_next_spreads_a_row_and_refuses_too_few_slots() {
    let mut s = Schedule::new(scale(4, 2048));
    let cache = s.cache_read("A", "i").unwrap();
    let lines = s.prefetch_next(&cache, "i", "j").unwrap();
    assert_eq!(lines, 2048 * 4 / 64);
    let f = s.finish().unwrap();
    let text = f.to_string();
    assert!(
        text.contains("j_o: int64 in serial(0i64, 128i64)"),
        "{text}"
    );
    assert_eq!(text.matches("prefetch A[").count(), 1, "{text}");
    let shapes = vec![vec![4, 2048], vec![4, 2048]];
    assert_eq!(
        common::jit_last(&f, &shapes, &CodegenOptions::host()),
        common::interp_last(&scale(4, 2048), &shapes)
    );
    let mut s = Schedule::new(scale(4, 2048));
    let cache = s.cache_read("A", "i").unwrap();
    let (jo, _) = s.split("j", 2048).unwrap();
    let before = s.func().to_string();
    let e = s.prefetch_next(&cache, "i", &jo).unwrap_err().to_string();
    assert!(e.contains("would put 128 prefetches"), "{e}");
    assert_eq!(s.func().to_string(), before);
}

/// A copy that reads a loop between `loop` and itself (its rows' block, here) cannot be
/// prefetched from `at`, which does not see that loop: refused, naming it.
#[test]
fn prefetch_next_names_a_loop_the_copy_reads_between() {
    let mut s = Schedule::new(scale(4, 2048));
    let (jo, ji) = s.split("j", 256).unwrap();
    let cache = s.cache_read("A", &jo).unwrap();
    let before = s.func().to_string();
    let e = s.prefetch_next(&cache, "i", &ji).unwrap_err().to_string();
    assert!(e.contains(&format!("reads `{jo}` between them")), "{e}");
    assert_eq!(s.func().to_string(), before);
}

/// The bounds: a copy of more than 4 M cache lines (a row of 2^28 floats, 16 M lines) and a
/// loop `at` of more than 4 M iterations (a row of 2^23) are refused with what was seen, no
/// overflow and no panic, the schedule unchanged; a row of 2^21 floats (128 K lines over 2 M
/// iterations) is within them.
#[test]
fn prefetch_next_refuses_copies_and_loops_past_its_bounds() {
    let mut s = Schedule::new(scale(2, 1 << 28));
    let cache = s.cache_read("A", "i").unwrap();
    let before = s.func().to_string();
    let e = s.prefetch_next(&cache, "i", "j").unwrap_err().to_string();
    assert!(e.contains("reads more than 4194304 cache lines"), "{e}");
    assert_eq!(s.func().to_string(), before);

    let mut s = Schedule::new(scale(2, 1 << 23));
    let cache = s.cache_read("A", "i").unwrap();
    let before = s.func().to_string();
    let e = s.prefetch_next(&cache, "i", "j").unwrap_err().to_string();
    assert!(
        e.contains("needs loop `j` to run from 0 to a constant of at most 4194304"),
        "{e}"
    );
    assert_eq!(s.func().to_string(), before);

    let mut s = Schedule::new(scale(2, 1 << 21));
    let cache = s.cache_read("A", "i").unwrap();
    assert_eq!(
        s.prefetch_next(&cache, "i", "j").unwrap(),
        (1 << 21) * 4 / 64
    );
}
