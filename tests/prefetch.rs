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
