//! JIT-compiled kernels against the reference interpreter, and the packed-API argument checks.

mod common;

use common::HostArray;
use kiln::codegen::llvm::{CodegenOptions, LlvmModule};
use kiln::ir::interp::{self, HostBuffer, InterpArg};
use kiln::ir::{kernels, IRModule};
use kiln::packed_func::{AnyView, Module};

fn jit(f: kiln::ir::PrimFunc) -> LlvmModule {
    let m = IRModule::from_functions(vec![f]);
    m.verify().unwrap();
    LlvmModule::jit(&m, &CodegenOptions::host()).unwrap()
}

#[test]
fn vadd_matches_a_plain_loop() {
    let m = jit(kernels::vadd());
    common::check_vadd(&m.require_function("vadd").unwrap(), 1003);
}

#[test]
fn matmul_and_softmax_match_the_interpreter() {
    for (f, shapes) in [
        (
            kernels::matmul_sized(17, 13, 9),
            vec![vec![17i64, 9], vec![9, 13], vec![17, 13]],
        ),
        (
            kernels::softmax_sized(5, 33),
            vec![vec![5, 33], vec![5, 33]],
        ),
        (kernels::rowsum_sized(7, 19), vec![vec![7, 19], vec![7]]),
    ] {
        let m = jit(f.clone());
        let pf = m.require_function(&f.name).unwrap();
        let mut arrays: Vec<HostArray> = shapes
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let n: i64 = s.iter().product();
                let v: Vec<f32> = (0..n)
                    .map(|i| ((i * 7 + k as i64 * 3) % 11) as f32 * 0.25 - 1.0)
                    .collect();
                HostArray::f32(s, &v)
            })
            .collect();
        let mut iargs: Vec<InterpArg> = arrays
            .iter()
            .map(|a| InterpArg::Buffer(HostBuffer::from_slice(&a.shape, &a.to_f32())))
            .collect();
        interp::run(&f, &mut iargs).unwrap();
        let dls: Vec<_> = arrays.iter_mut().map(|a| a.dl()).collect();
        let views: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
        pf.call(&views).unwrap();
        let last = arrays.last().unwrap().to_f32();
        let want = iargs.last().unwrap().to_vec::<f32>().unwrap();
        for (i, (g, w)) in last.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{}: [{i}] {g} vs {w}",
                f.name
            );
        }
    }
}

#[test]
fn workspaces_are_freed_on_every_exit_path_errors_included() {
    use kiln::device_api::{workspace, Device};
    use kiln::ir::builder::{for_range, if_then_else};
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, PrimFunc, Stmt, StorageScope, Var};
    // f(x: int64, out[4]) -> int64: T (64 KiB, workspace) = ...; assert x != 1; if x == 2 return 7;
    // out[0] = 10 / (x - 3); return T[5]
    let x = Var::new("x", DataType::i64());
    let out = Buffer::new("out", DataType::i64(), vec![Expr::from(4i64)]);
    let t = Buffer::temp(
        "T",
        DataType::i64(),
        vec![Expr::from(8192i64)],
        StorageScope::Local,
    );
    let xe = Expr::from(&x);
    let body = t.allocate(Stmt::Seq(vec![
        for_range("i", 8192i64, ForKind::Serial, |i| {
            t.store(vec![i.clone()], i)
        }),
        Stmt::Assert {
            cond: xe.clone().ne_(Expr::from(1i64)),
            message: "x must not be 1".into(),
        },
        if_then_else(
            xe.clone().eq_(Expr::from(2i64)),
            Stmt::Return(Expr::from(7i64)),
            None,
        ),
        out.store(
            vec![Expr::from(0i64)],
            Expr::from(10i64) / (xe.clone() - Expr::from(3i64)),
        ),
        Stmt::Return(t.load(vec![Expr::from(5i64)])),
    ]));
    let f = PrimFunc::new("ws_exits", vec![Param::Scalar(x), Param::Buffer(out)], body)
        .with_ret_type(DataType::i64());
    let m = jit(f);
    let pf = m.require_function("ws_exits").unwrap();
    let mut o = HostArray::zeros(
        &[4],
        kiln::packed_func::DLDataType {
            code: kiln::packed_func::ffi::DLDataTypeCode::INT,
            bits: 64,
            lanes: 1,
        },
        8,
    );
    let d = o.dl();
    let live = || workspace::thread_stats(Device::cpu()).map_or(0, |s| s.live_blocks);
    let before = live();
    let r = pf.call_typed::<_, i64>((5i64, &d)).unwrap();
    assert_eq!(r, 5, "normal return reads the workspace");
    assert_eq!(live(), before);
    let used = workspace::thread_stats(Device::cpu()).map_or(0, |s| s.hits + s.misses);
    assert!(used > 0, "the 64 KiB buffer came from the workspace pool");
    let e = pf.call_typed::<_, i64>((1i64, &d)).unwrap_err();
    assert_eq!(e.to_string(), "RuntimeError: x must not be 1");
    assert_eq!(live(), before, "freed after a failed assert");
    assert_eq!(pf.call_typed::<_, i64>((2i64, &d)).unwrap(), 7);
    assert_eq!(live(), before, "freed after an early return");
    let e = pf.call_typed::<_, i64>((3i64, &d)).unwrap_err();
    assert!(e.to_string().contains("integer division by zero"), "{e}");
    assert_eq!(live(), before, "freed after a division by zero");
}

/// `vadd` with its body replaced by `c = a - b` (same name, same signature).
fn vsub() -> kiln::ir::PrimFunc {
    use kiln::ir::builder::compute;
    use kiln::ir::{Buffer, DataType, Param, PrimFunc};
    let n = kiln::ir::builder::size_var("n");
    let mk = |s: &str| Buffer::new(s, DataType::f32(), vec![n.clone().into()]);
    let (a, b, c) = (mk("A"), mk("B"), mk("C"));
    let body = compute(&c, |i| a.load(i) - b.load(i));
    PrimFunc::new(
        "vadd",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
}

#[test]
fn jit_modules_with_the_same_function_names_live_side_by_side_and_die_alone() {
    let add = jit(kernels::vadd());
    let sub = jit(vsub());
    let (fa, fs) = (
        add.require_function("vadd").unwrap(),
        sub.require_function("vadd").unwrap(),
    );
    let run = |f: &kiln::packed_func::PackedFunc| {
        let (mut ta, mut tb, mut tc) = (
            HostArray::f32(&[3], &[1.0, 2.0, 3.0]),
            HostArray::f32(&[3], &[10.0, 20.0, 30.0]),
            HostArray::f32(&[3], &[0.0; 3]),
        );
        let (da, db, dc) = (ta.dl(), tb.dl(), tc.dl());
        f.call(&[AnyView::from(&da), AnyView::from(&db), AnyView::from(&dc)])
            .unwrap();
        tc.to_f32()
    };
    assert_eq!(run(&fa), vec![11.0, 22.0, 33.0]);
    assert_eq!(run(&fs), vec![-9.0, -18.0, -27.0]);
    // Dropping one module (and its function) leaves the other's code in place.
    drop(fa);
    drop(add);
    let again = jit(kernels::vadd());
    assert_eq!(run(&fs), vec![-9.0, -18.0, -27.0]);
    assert_eq!(
        run(&again.require_function("vadd").unwrap()),
        vec![11.0, 22.0, 33.0]
    );
    // A function outlives its module.
    drop(sub);
    assert_eq!(run(&fs), vec![-9.0, -18.0, -27.0]);
}

#[test]
fn the_first_failing_calls_from_many_threads_all_get_the_precise_error() {
    // The checkers of a JIT module are compiled when a call first fails: concurrent first
    // failures share that compilation and each gets TVM's message.
    let m = jit(kernels::vadd());
    let f = m.require_function("vadd").unwrap();
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (1..=4i64)
            .map(|k| {
                let f = f.clone();
                s.spawn(move || {
                    let mut ta = HostArray::f32(&[3], &[0.0; 3]);
                    let mut tb = HostArray::f32(&[3 + k], &vec![0.0; 3 + k as usize]);
                    let mut tc = HostArray::f32(&[3], &[0.0; 3]);
                    let (da, db, dc) = (ta.dl(), tb.dl(), tc.dl());
                    f.call(&[AnyView::from(&da), AnyView::from(&db), AnyView::from(&dc)])
                        .unwrap_err()
                        .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want = "ValueError: Mismatched B.shape[0] on argument #1 when calling:\n  \
                `vadd(A: Tensor([n], float32), B: Tensor([n], float32), C: Tensor([n], float32))`,\n  \
                expected to match A.shape[0]";
    for e in errors {
        assert_eq!(e, want);
    }
    // And a good call still runs after the error path was compiled.
    let (mut ta, mut tb, mut tc) = (
        HostArray::f32(&[2], &[1.0, 2.0]),
        HostArray::f32(&[2], &[3.0, 4.0]),
        HostArray::f32(&[2], &[0.0; 2]),
    );
    let (da, db, dc) = (ta.dl(), tb.dl(), tc.dl());
    f.call(&[AnyView::from(&da), AnyView::from(&db), AnyView::from(&dc)])
        .unwrap();
    assert_eq!(tc.to_f32(), vec![4.0, 6.0]);
}

#[test]
fn innermost_loops_start_on_a_cache_line() {
    // A hot loop's offset within a 64-byte line moves kernels by up to 10% between builds;
    // kiln aligns innermost loop headers to 64 bytes (x86).
    let m = jit(kernels::vadd());
    if !m.options().triple.starts_with("x86_64") {
        return;
    }
    let asm = m.get_source("asm").unwrap();
    assert!(
        asm.contains(".p2align\t6"),
        "no 64-byte loop alignment in:\n{asm}"
    );
}
