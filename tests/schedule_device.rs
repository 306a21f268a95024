//! Schedule primitives for device kernels (`bind`, `cache_read_shared`, `block_reduce`) and the
//! OpenCL and CUDA example kernels (`examples/kernels/{opencl,cuda}/*.json`): each verifies, computes in the
//! interpreter (lock-step threads, shared-memory race detector) what the unscheduled program
//! computes, and the full-size kernels fit the `opencl` target's default limits.

mod common;
#[path = "ir/common.rs"]
mod ir_common;

use common::{interp_args, interp_last, schedule_inputs as inputs};

use kiln::ir::interp;
use kiln::ir::{device, kernels, IRModule, PrimFunc, ThreadTag};
use kiln::schedule::{kernels as sk, Schedule, ScheduleError, Step};

const BX: ThreadTag = ThreadTag::Block(0);
const TX: ThreadTag = ThreadTag::Thread(0);

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: [{i}] {g} vs {w}"
        );
    }
}

/// `f` verifies, has kernels, and computes what `plain` computes (both in the interpreter).
fn same_as_plain(plain: &PrimFunc, f: &PrimFunc, shapes: &[Vec<i64>], tol: f32) {
    f.verify().unwrap_or_else(|e| panic!("{e}\n{f}"));
    assert!(!device::kernels(f).is_empty(), "no kernel in\n{f}");
    let want = interp_last(plain, shapes);
    let got = interp_last(f, shapes);
    if tol == 0.0 {
        assert_eq!(got, want, "{} differs bit for bit", f.name);
    } else {
        close(&f.name, &got, &want, tol);
    }
}

#[test]
fn bind_after_split_guards_the_tail() {
    let f = kernels::vadd();
    let mut s = Schedule::new(f.clone());
    let (bo, ti) = s.split("i", 64).unwrap();
    s.bind(&bo, BX).unwrap();
    s.bind(&ti, TX).unwrap();
    let g = s.finish().unwrap();
    let text = g.to_string();
    assert!(text.contains("thread_binding[blockIdx.x]"), "{text}");
    assert!(text.contains("thread_binding[threadIdx.x]"), "{text}");
    assert!(text.contains("if i_o * 64i64 + i_i < n"), "{text}");
    // 1000 = 15 * 64 + 40: the last block has 24 idle threads.
    same_as_plain(&f, &g, &vec![vec![1000]; 3], 0.0);
    same_as_plain(&f, &g, &vec![vec![128]; 3], 0.0);
}

#[test]
fn bind_rebases_a_loop_that_does_not_start_at_zero() {
    use kiln::ir::builder::*;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, Stmt, Var};
    // for i in [3, 3 + 16) { B[i - 3] = A[i] * 2 }
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(32i64)]);
    let b = Buffer::new("B", DataType::f32(), vec![Expr::from(16i64)]);
    let i = Var::new("i", DataType::i64());
    let ie = Expr::from(&i);
    let body = Stmt::For {
        var: i,
        min: Expr::from(3i64),
        extent: Expr::from(16i64),
        kind: ForKind::Serial,
        body: Box::new(b.store([ie.clone() - 3i64], a.load([ie]) * 2.0f32)),
    };
    let plain = PrimFunc::new(
        "shift",
        vec![Param::Buffer(a), Param::Buffer(b)],
        thread_for("bx", Expr::from(1i64), BX, |_| body),
    );
    plain.verify().unwrap();
    let mut s = Schedule::new(plain.clone());
    s.bind("i", TX).unwrap();
    let g = s.finish().unwrap();
    assert!(
        g.to_string()
            .contains("thread_binding[threadIdx.x](0i64, 16i64)"),
        "{g}"
    );
    same_as_plain(&plain, &g, &[vec![32], vec![16]], 0.0);
}

#[test]
fn bind_errors_name_the_loop() {
    let mut s = Schedule::new(kernels::vadd());
    let err = s.bind("nope", BX).unwrap_err().to_string();
    assert!(err.contains("exactly one loop named `nope`"), "{err}");
    s.parallel("i").unwrap();
    let err = s.bind("i", TX).unwrap_err();
    assert!(matches!(err, ScheduleError::Form { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("`i`") && msg.contains("parallel"), "{msg}");
    // A threadIdx loop outside every blockIdx loop is refused by the verifier in `finish`.
    let mut s = Schedule::new(kernels::vadd());
    s.bind("i", TX).unwrap();
    let err = s.finish().unwrap_err().to_string();
    assert!(err.contains("not inside a blockIdx loop"), "{err}");
}

/// Matmul with one element per thread, 8 x 8 threads, `k` by 8: A and B tiles staged.
fn shared_matmul(m: i64, n: i64, k: i64) -> (PrimFunc, Schedule) {
    let f = kernels::matmul_sized(m, n, k);
    let mut s = Schedule::new(f.clone());
    let [io, jo, ii, ji] = s.tile("i", "j", 8, 8).unwrap();
    s.bind(&io, ThreadTag::Block(1)).unwrap();
    s.bind(&jo, BX).unwrap();
    s.bind(&ii, ThreadTag::Thread(1)).unwrap();
    s.bind(&ji, TX).unwrap();
    s.split("k0", 8).unwrap();
    (f, s)
}

#[test]
fn cache_read_shared_stages_tiles_between_barriers() {
    let (f, mut s) = shared_matmul(16, 24, 32);
    let a = s.cache_read_shared("A", "k0_o").unwrap();
    let b = s.cache_read_shared("B", "k0_o").unwrap();
    assert_eq!((a.as_str(), b.as_str()), ("A_shared", "B_shared"));
    let g = s.finish().unwrap();
    let text = g.to_string();
    // The two loads share the barriers: two per k step.
    assert_eq!(text.matches("barrier").count(), 2, "{text}");
    assert!(
        text.contains("+ A_shared[i_i, k0_i] * B_shared[k0_i, j_i]"),
        "A and B are read through the tiles:\n{text}"
    );
    // Same products, same order of the k sum: bit-exact.
    same_as_plain(&f, &g, &[vec![16, 32], vec![32, 24], vec![16, 24]], 0.0);
    device::check_device_limits(&g, 64, 2 * 8 * 8 * 4).unwrap();
    // From JSON steps.
    let steps: Vec<Step> =
        serde_json::from_str(r#"[{"cache_read_shared": {"buffer": "B", "at": "k0_o"}}]"#).unwrap();
    let (_, mut s) = shared_matmul(8, 8, 16);
    s.apply(&steps).unwrap();
    same_as_plain(
        &kernels::matmul_sized(8, 8, 16),
        &s.finish().unwrap(),
        &[vec![8, 16], vec![16, 8], vec![8, 8]],
        0.0,
    );
}

#[test]
fn cache_read_shared_guards_partial_tiles_and_odd_thread_counts() {
    // 12 x 12 threads (144) load 12 x 8 tiles (96 elements: one pass, 48 threads idle); k = 20
    // is not a multiple of 8, so the last tiles pass the end of A and B and their loads are
    // guarded (the split's own guard keeps the consumer off those elements).
    let f = kernels::matmul_sized(24, 24, 20);
    let mut s = Schedule::new(f.clone());
    let [io, jo, ii, ji] = s.tile("i", "j", 12, 12).unwrap();
    s.bind(&io, ThreadTag::Block(1)).unwrap();
    s.bind(&jo, BX).unwrap();
    s.bind(&ii, ThreadTag::Thread(1)).unwrap();
    s.bind(&ji, TX).unwrap();
    let (ko, _) = s.split("k0", 8).unwrap();
    s.cache_read_shared("A", &ko).unwrap();
    s.cache_read_shared("B", &ko).unwrap();
    let g = s.finish().unwrap();
    let text = g.to_string();
    assert!(text.contains("< 96i64"), "{text}");
    assert!(text.contains("< 20i64"), "{text}");
    same_as_plain(&f, &g, &[vec![24, 20], vec![20, 24], vec![24, 24]], 0.0);
}

#[test]
fn cache_read_shared_errors() {
    let (_, mut s) = shared_matmul(8, 8, 16);
    let err = s.cache_read_shared("C", "k0_o").unwrap_err().to_string();
    assert!(err.contains("`C` to be read-only in loop `k0_o`"), "{err}");
    let err = s.cache_read_shared("X", "k0_o").unwrap_err().to_string();
    assert!(err.contains("no parameter buffer `X`"), "{err}");
    let mut s = Schedule::new(kernels::matmul_sized(8, 8, 8));
    let err = s.cache_read_shared("A", "k0").unwrap_err().to_string();
    assert!(
        err.contains("loop `k0` to be inside the threadIdx loops"),
        "{err}"
    );
}

#[test]
fn block_reduce_is_a_tree_in_shared_memory() {
    let f = kernels::rowsum_sized(3, 96);
    let mut s = Schedule::new(f.clone());
    s.bind("i", BX).unwrap();
    let (ko, ki) = s.split("k0", 32).unwrap();
    let red = s.block_reduce(&ko, &ki).unwrap();
    assert_eq!(red, "red");
    let g = s.finish().unwrap();
    let text = g.to_string();
    // log2(32) halvings, each followed by a barrier, plus the one after the partials.
    assert_eq!(text.matches("barrier").count(), 6, "{text}");
    assert!(text.contains("if k0_i == 0i64"), "{text}");
    // The init `B[i] = 0` is folded into the final write.
    assert!(!text.contains("B[i] = 0f"), "{text}");
    same_as_plain(&f, &g, &[vec![3, 96], vec![3]], 1e-5);
    device::check_device_limits(&g, 32, 128).unwrap();
    // Max, from JSON steps; the max is exact whatever the order.
    let f = sk::softmax_algorithm(2, 64, kiln::ir::Intrinsic::Exp);
    let mut s = Schedule::new(f.clone());
    let steps: Vec<Step> = serde_json::from_str(
        r#"[{"bind": {"loop": "i", "thread": "blockIdx.x"}},
            {"split": {"loop": "jm", "factor": 16}},
            {"block_reduce": {"outer": "jm_o", "inner": "jm_i"}},
            {"split": {"loop": "je", "factor": 16}},
            {"bind": {"loop": "je_i", "thread": "threadIdx.x"}},
            {"split": {"loop": "js", "factor": 16}},
            {"block_reduce": {"outer": "js_o", "inner": "js_i"}},
            {"split": {"loop": "jn", "factor": 16}},
            {"bind": {"loop": "jn_i", "thread": "threadIdx.x"}}]"#,
    )
    .unwrap();
    s.apply(&steps).unwrap();
    same_as_plain(&f, &s.finish().unwrap(), &[vec![2, 64], vec![2, 64]], 1e-5);
}

#[test]
fn block_reduce_errors() {
    // Not in a kernel.
    let mut s = Schedule::new(kernels::rowsum_sized(2, 64));
    let (ko, ki) = s.split("k0", 16).unwrap();
    let err = s.block_reduce(&ko, &ki).unwrap_err().to_string();
    assert!(err.contains("inside a blockIdx loop"), "{err}");
    // Not a power of two.
    let mut s = Schedule::new(kernels::rowsum_sized(2, 48));
    s.bind("i", BX).unwrap();
    let (ko, ki) = s.split("k0", 12).unwrap();
    let err = s.block_reduce(&ko, &ki).unwrap_err().to_string();
    assert!(err.contains("power-of-two"), "{err}");
    assert!(err.contains("k0_o") && err.contains("k0_i"), "{err}");
}

fn rust_matmul(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for r in 0..k {
                acc += a[i * k + r] * b[r * n + j];
            }
            c[i * n + j] = acc;
        }
    }
    c
}

#[test]
fn opencl_kernels_compute_what_plain_rust_does() {
    // vadd, with a tail.
    let sh = vec![vec![1000i64]; 3];
    let x = inputs(&sh);
    let want: Vec<f32> = x[0].iter().zip(&x[1]).map(|(a, b)| a + b).collect();
    assert_eq!(interp_last(&sk::opencl_vadd().unwrap(), &sh), want);
    // matmul 64 x 128 x 64 (two work-groups).
    let (m, n, k) = (64usize, 128usize, 64usize);
    let sh = vec![
        vec![m as i64, k as i64],
        vec![k as i64, n as i64],
        vec![m as i64, n as i64],
    ];
    let x = inputs(&sh);
    let f = sk::opencl_matmul_sized(m as i64, n as i64, k as i64).unwrap();
    // Same k order as the Rust loop, products rounded alike: bit-exact.
    assert_eq!(interp_last(&f, &sh), rust_matmul(&x[0], &x[1], m, n, k));
    // rowsum 64 x 256.
    let (r, c) = (64usize, 256usize);
    let sh = vec![vec![r as i64, c as i64], vec![r as i64]];
    let x = inputs(&sh);
    let want: Vec<f32> = x[0].chunks(c).map(|row| row.iter().sum()).collect();
    close(
        "rowsum",
        &interp_last(&sk::opencl_rowsum_sized(r as i64, c as i64).unwrap(), &sh),
        &want,
        1e-5,
    );
    // softmax 16 x 256.
    let (r, c) = (16usize, 256usize);
    let sh = vec![vec![r as i64, c as i64]; 2];
    let x = inputs(&sh);
    let mut want = Vec::new();
    for row in x[0].chunks(c) {
        let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = row.iter().map(|v| (v - mx).exp()).collect();
        let s: f32 = e.iter().sum();
        want.extend(e.iter().map(|v| v * (1.0 / s)));
    }
    close(
        "softmax",
        &interp_last(&sk::opencl_softmax_sized(r as i64, c as i64).unwrap(), &sh),
        &want,
        1e-5,
    );
}

#[test]
fn opencl_kernels_fit_the_opencl_target_limits() {
    for f in [
        sk::opencl_vadd(),
        sk::opencl_matmul(),
        sk::opencl_rowsum(),
        sk::opencl_softmax(),
    ] {
        let f = f.unwrap();
        f.verify().unwrap();
        device::check_device_limits(&f, 256, 16384).unwrap_or_else(|e| panic!("{e}"));
        for (path, k) in device::kernels(&f) {
            let threads: i64 = device::launch_extents(k)
                .iter()
                .filter(|(t, _)| t.is_thread())
                .map(|(_, e)| e.as_int().unwrap())
                .product();
            assert_eq!(threads, 256, "{} {path}", f.name);
        }
    }
    let err = sk::opencl_matmul_sized(100, 64, 16)
        .unwrap_err()
        .to_string();
    assert!(err.contains("multiples of 64"), "{err}");
    let err = sk::opencl_rowsum_sized(4, 100).unwrap_err().to_string();
    assert!(err.contains("multiple of 256"), "{err}");
}

#[test]
fn opencl_examples_are_the_scheduled_kernels() {
    // `KILN_BLESS=1` regenerates examples/kernels/opencl/*.json from `kiln::schedule::kernels`.
    for f in [
        sk::opencl_vadd(),
        sk::opencl_matmul(),
        sk::opencl_rowsum(),
        sk::opencl_softmax(),
    ] {
        let m = IRModule::from_functions(vec![f.unwrap()]);
        m.verify().unwrap();
        let name = &m.functions[0].name;
        let text = m.to_json_string() + "\n";
        ir_common::check_snapshot(&format!("examples/kernels/opencl/{name}.json"), &text);
        // They read back, verify and fit the target.
        let back = IRModule::from_json_str(&text).unwrap();
        back.verify().unwrap();
        device::check_device_limits(&back.functions[0], 256, 16384).unwrap();
    }
}

#[test]
fn cuda_examples_are_the_scheduled_kernels() {
    // `KILN_BLESS=1` regenerates examples/kernels/cuda/*.json from `kiln::schedule::kernels`.
    for f in [
        sk::cuda_vadd(),
        sk::cuda_matmul(),
        sk::cuda_rowsum(),
        sk::cuda_softmax(),
    ] {
        let m = IRModule::from_functions(vec![f.unwrap()]);
        m.verify().unwrap();
        let name = &m.functions[0].name;
        let text = m.to_json_string() + "\n";
        ir_common::check_snapshot(&format!("examples/kernels/cuda/{name}.json"), &text);
        let back = IRModule::from_json_str(&text).unwrap();
        back.verify().unwrap();
        // The `cuda` target's defaults: 1024 threads, 48 KiB of shared memory.
        device::check_device_limits(&back.functions[0], 1024, 48 * 1024).unwrap();
    }
}

#[test]
fn cuda_matmul_computes_what_plain_rust_does() {
    let (m, n, k) = (128usize, 256usize, 16usize);
    let sh = vec![
        vec![m as i64, k as i64],
        vec![k as i64, n as i64],
        vec![m as i64, n as i64],
    ];
    let f = sk::cuda_matmul_sized(m as i64, n as i64, k as i64).unwrap();
    let x = inputs(&sh);
    // Same k order as the Rust loop, products rounded alike: bit-exact.
    assert_eq!(interp_last(&f, &sh), rust_matmul(&x[0], &x[1], m, n, k));
    let err = sk::cuda_matmul_sized(64, 128, 8).unwrap_err().to_string();
    assert!(err.contains("multiples of 128"), "{err}");
}

/// `s` without its barriers (`keep(k)` decides for the `k`-th one, in node order).
fn drop_barriers(
    s: &kiln::ir::Stmt,
    k: &mut usize,
    keep: &dyn Fn(usize) -> bool,
) -> kiln::ir::Stmt {
    use kiln::ir::Stmt;
    let mut rec = |b: &Stmt| Box::new(drop_barriers(b, k, keep));
    match s {
        Stmt::Seq(v) => Stmt::Seq(
            v.iter()
                .filter_map(|c| {
                    if *c == Stmt::Barrier {
                        *k += 1;
                        return keep(*k - 1).then(|| c.clone());
                    }
                    Some(drop_barriers(c, k, keep))
                })
                .collect(),
        ),
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => Stmt::For {
            var: var.clone(),
            min: min.clone(),
            extent: extent.clone(),
            kind: *kind,
            body: rec(body),
        },
        Stmt::Allocate { buffer, body } => Stmt::Allocate {
            buffer: buffer.clone(),
            body: rec(body),
        },
        other => other.clone(),
    }
}

fn race_in(f: &PrimFunc, shapes: &[Vec<i64>]) -> String {
    let mut args = interp_args(shapes);
    interp::run(f, &mut args)
        .expect_err("a data race")
        .to_string()
}

#[test]
fn the_barriers_are_needed() {
    // Without the barrier after the consumer, the next tile overwrites one still being read.
    let (_, s) = shared_matmul(8, 8, 16);
    let mut s = s;
    s.cache_read_shared("A", "k0_o").unwrap();
    let mut g = s.finish().unwrap();
    g.body = drop_barriers(&g.body, &mut 0, &|k| k == 0);
    let err = race_in(&g, &[vec![8, 16], vec![16, 8], vec![8, 8]]);
    assert!(
        err.contains("data race on shared buffer `A_shared`"),
        "{err}"
    );
    // Without the barriers of the tree, a thread reads a partial sum not yet written.
    let mut g = sk::opencl_rowsum_sized(2, 256).unwrap();
    g.body = drop_barriers(&g.body, &mut 0, &|_| false);
    let err = race_in(&g, &[vec![2, 256], vec![2]]);
    assert!(err.contains("data race on shared buffer `red`"), "{err}");
}

#[test]
fn cache_read_shared_refuses_indices_through_lets() {
    use kiln::ir::builder::*;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param};
    // A thread-dependent `let` in the index: the tile's origin would not be uniform.
    let a = Buffer::new(
        "A",
        DataType::f32(),
        vec![Expr::from(8i64), Expr::from(8i64)],
    );
    let c = Buffer::new("C", DataType::f32(), vec![Expr::from(8i64)]);
    let body = thread_for("bx", Expr::from(1i64), BX, |_| {
        thread_for("tx", Expr::from(8i64), TX, |tx| {
            let_stmt("x", tx, |x| {
                for_range("k", Expr::from(8i64), ForKind::Serial, |k| {
                    c.store([x.clone()], c.load([x.clone()]) + a.load([x.clone(), k]))
                })
            })
        })
    });
    let f = PrimFunc::new("lets", vec![Param::Buffer(a), Param::Buffer(c)], body);
    f.verify().unwrap();
    let mut s = Schedule::new(f);
    let err = s.cache_read_shared("A", "k").unwrap_err().to_string();
    assert!(err.contains("found `x`"), "{err}");
}

#[test]
fn the_gpu_matmul_on_a_recognized_matmul_refuses_tiles_it_cannot_use() {
    let s = Schedule::new(kernels::matmul_sized(64, 64, 16));
    let parts = sk::MatmulParts::default();
    let e = sk::gpu_matmul_on(s.clone(), &parts, [64, 64, 16], 24, 8)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "needs a tile that is a multiple of 16 and a k step of 1 or more, found 24 and 8"
        ),
        "{e}"
    );
    let e = sk::gpu_matmul_on(s.clone(), &parts, [64, 64, 16], 32, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("found 32 and 0"), "{e}");
    let e = sk::gpu_matmul_on(s.clone(), &parts, [64, 64, 16], 128, 8)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("needs m and n multiples of 128 and k of 8, found 64 x 64 x 16"),
        "{e}"
    );
    // A size that fits gives the hand schedule, exactly as the interpreter computes the matmul.
    let g = sk::gpu_matmul_on(s, &parts, [64, 64, 16], 32, 8)
        .unwrap()
        .finish()
        .unwrap();
    let sh = vec![vec![64, 16], vec![16, 64], vec![64, 64]];
    assert_eq!(
        interp_last(&g, &sh),
        interp_last(&kernels::matmul_sized(64, 64, 16), &sh)
    );
}
