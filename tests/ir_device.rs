//! Device code in the IR: `thread_binding` loops, `shared` memory and `barrier`. The JSON form,
//! one test per verifier rule (message and node path), the device-limits check, and the
//! interpreter running kernels (vadd, a shared-memory tree reduction, a tiled matmul) against
//! plain Rust, with its shared-memory race detector.

use kiln::ir::builder::*;
use kiln::ir::device::{check_device_limits, kernels};
use kiln::ir::interp::{run, HostBuffer, InterpArg};
use kiln::ir::*;

const BX: ThreadTag = ThreadTag::Block(0);
const BY: ThreadTag = ThreadTag::Block(1);
const TX: ThreadTag = ThreadTag::Thread(0);
const TY: ThreadTag = ThreadTag::Thread(1);

fn c(v: i64) -> Expr {
    Expr::from(v)
}

/// A function over `A: float32[256]` and a scalar `n: int64`, with `body(A, n)`.
fn func_with(body: impl FnOnce(&Buffer, &Expr) -> Stmt) -> PrimFunc {
    let a = Buffer::new("A", DataType::f32(), vec![c(256)]);
    let n = Var::new("n", DataType::i64());
    let body = body(&a, &Expr::from(&n));
    PrimFunc::new("f", vec![Param::Buffer(a), Param::Scalar(n)], body)
}

/// Expects exactly one verifier error, at `path` (below `$.functions[0]`), containing `message`.
fn expect_error(f: PrimFunc, path: &str, message: &str) {
    let m = IRModule::from_functions(vec![f]);
    let errors = m.verify_all();
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}\n{m}");
    match &errors[0] {
        IrError::Verify {
            path: p,
            message: msg,
            ..
        } => {
            assert_eq!(p, &format!("$.functions[0]{path}"), "message: {msg}");
            assert!(msg.contains(message), "expected `{message}` in `{msg}`");
        }
        other => panic!("{other:?}"),
    }
}

fn expect_ok(f: PrimFunc) {
    let m = IRModule::from_functions(vec![f]);
    assert_eq!(m.verify_all(), vec![], "{m}");
}

macro_rules! case {
    ($name:ident, $func:expr, $path:expr, $msg:expr) => {
        #[test]
        fn $name() {
            expect_error($func, $path, $msg);
        }
    };
}

/// `for bx in blockIdx.x(4) { for tx in threadIdx.x(64) { inner(bx, tx) } }`.
fn grid(a: &Buffer, inner: impl FnOnce(&Expr, &Expr) -> Stmt) -> Stmt {
    let _ = a;
    thread_for("bx", c(4), BX, |bx| {
        thread_for("tx", c(64), TX, |tx| inner(&bx, &tx))
    })
}

fn store_a(a: &Buffer, bx: &Expr, tx: &Expr) -> Stmt {
    a.store([bx * 64i64 + tx], Expr::from(1.0f32))
}

// ---- kernels.rs-style programs

/// `C[i] = A[i] + B[i]` for `i < n`, 64 threads per block, `ceil(n / 64)` blocks.
fn vadd_kernel() -> PrimFunc {
    let n = size_var("n");
    let buf = |name| Buffer::new(name, DataType::f32(), vec![Expr::from(&n)]);
    let (a, b, cc) = (buf("A"), buf("B"), buf("C"));
    let blocks = (Expr::from(&n) + 63i64).floordiv(64i64);
    let body = thread_for("bx", blocks, BX, |bx| {
        thread_for("tx", c(64), TX, |tx| {
            let_stmt("i", bx * 64i64 + tx, |i| {
                if_then_else(
                    i.clone().lt(&n),
                    cc.store([i.clone()], a.load([i.clone()]) + b.load([i])),
                    None,
                )
            })
        })
    });
    PrimFunc::new(
        "vadd_gpu",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(cc)],
        body,
    )
}

/// `out[b] = sum(A[b * 128 .. b * 128 + 128])`: a tree reduction in shared memory. With
/// `barriers == false` the barriers between the tree steps are left out (a race).
fn block_sum(blocks: i64, barriers: bool) -> PrimFunc {
    let a = Buffer::new("A", DataType::f32(), vec![c(blocks * 128)]);
    let out = Buffer::new("out", DataType::f32(), vec![c(blocks)]);
    let sh = Buffer::shared("sh", DataType::f32(), &[128]);
    let body = thread_for("bx", c(blocks), BX, |bx| {
        sh.allocate(thread_for("tx", c(128), TX, |tx| {
            let mut steps = vec![
                sh.store([tx.clone()], a.load([&bx * 128i64 + &tx])),
                barrier(),
            ];
            for s in [64i64, 32, 16, 8, 4, 2, 1] {
                steps.push(if_then_else(
                    tx.clone().lt(s),
                    sh.store([tx.clone()], sh.load([tx.clone()]) + sh.load([&tx + s])),
                    None,
                ));
                if barriers {
                    steps.push(barrier());
                }
            }
            steps.push(if_then_else(
                tx.clone().eq_(0i64),
                out.store([bx.clone()], sh.load([c(0)])),
                None,
            ));
            Stmt::Seq(steps)
        }))
    });
    PrimFunc::new(
        "block_sum",
        vec![Param::Buffer(a), Param::Buffer(out)],
        body,
    )
}

/// `C = A × B` (`A: [m, k]`, `B: [k, n]`), 4×4 tiles staged through shared memory. With
/// `second_barrier == false` the barrier after using a tile is left out (a race).
fn tiled_matmul(m: i64, n: i64, k: i64, second_barrier: bool) -> PrimFunc {
    const T: i64 = 4;
    let a = Buffer::new("A", DataType::f32(), vec![c(m), c(k)]);
    let b = Buffer::new("B", DataType::f32(), vec![c(k), c(n)]);
    let cc = Buffer::new("C", DataType::f32(), vec![c(m), c(n)]);
    let a_s = Buffer::shared("As", DataType::f32(), &[T, T]);
    let b_s = Buffer::shared("Bs", DataType::f32(), &[T, T]);
    let acc = Buffer::temp("acc", DataType::f32(), vec![c(1)], StorageScope::Local);
    let body = thread_for("by", c(m / T), BY, |by| {
        thread_for("bx", c(n / T), BX, |bx| {
            a_s.allocate(b_s.allocate(thread_for("ty", c(T), TY, |ty| {
                thread_for("tx", c(T), TX, |tx| {
                    let row = &by * T + &ty;
                    let col = &bx * T + &tx;
                    let tile = for_range("kt", c(k / T), ForKind::Serial, |kt| {
                        let mut s = vec![
                            a_s.store(
                                [ty.clone(), tx.clone()],
                                a.load([row.clone(), &kt * T + &tx]),
                            ),
                            b_s.store(
                                [ty.clone(), tx.clone()],
                                b.load([&kt * T + &ty, col.clone()]),
                            ),
                            barrier(),
                            for_range("kk", c(T), ForKind::Serial, |kk| {
                                acc.store(
                                    [c(0)],
                                    acc.load([c(0)])
                                        + a_s.load([ty.clone(), kk.clone()])
                                            * b_s.load([kk, tx.clone()]),
                                )
                            }),
                        ];
                        if second_barrier {
                            s.push(barrier());
                        }
                        Stmt::Seq(s)
                    });
                    acc.allocate(Stmt::Seq(vec![
                        acc.store([c(0)], Expr::from(0.0f32)),
                        tile,
                        cc.store([row.clone(), col.clone()], acc.load([c(0)])),
                    ]))
                })
            })))
        })
    });
    PrimFunc::new(
        "tiled_matmul",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(cc)],
        body,
    )
}

/// Deterministic pseudo-random small integers as floats (sums are exact in any order).
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 21) as f32 - 10.0
        })
        .collect()
}

fn buffer(shape: &[i64], values: &[f32]) -> InterpArg {
    InterpArg::Buffer(HostBuffer::from_slice(shape, values))
}

fn zeros(shape: &[i64]) -> InterpArg {
    InterpArg::Buffer(HostBuffer::zeros(DataType::f32(), shape))
}

// ---- JSON

#[test]
fn kernels_round_trip_through_json() {
    for f in [
        vadd_kernel(),
        block_sum(2, true),
        tiled_matmul(8, 8, 8, true),
    ] {
        let m = IRModule::from_functions(vec![f]);
        m.verify().unwrap();
        let text = m.to_json().to_string();
        let back = IRModule::from_json_str(&text).unwrap();
        back.verify().unwrap();
        assert_eq!(back.to_json().to_string(), text);
        assert_eq!(back.to_string(), m.to_string());
    }
}

#[test]
fn handwritten_json_kernel_reads_verifies_and_runs() {
    let text = r#"{
      "format": "kiln-ir/1",
      "functions": [{
        "name": "reverse64",
        "params": [{"kind": "buffer", "name": "X", "dtype": "float32", "shape": [64]}],
        "body": {"stmt": "for", "var": {"name": "bx", "dtype": "int64"},
          "min": {"const": 0, "dtype": "int64"}, "extent": {"const": 1, "dtype": "int64"},
          "kind": "thread_binding", "thread": "blockIdx.x",
          "body": {"stmt": "allocate",
            "buffer": {"name": "sh", "dtype": "float32", "shape": [64], "scope": "shared"},
            "body": {"stmt": "for", "var": {"name": "tx", "dtype": "int64"},
              "min": {"const": 0, "dtype": "int64"}, "extent": {"const": 64, "dtype": "int64"},
              "kind": "thread_binding", "thread": "threadIdx.x",
              "body": {"stmt": "seq", "stmts": [
                {"stmt": "store", "buffer": "sh", "indices": [{"var": "tx"}],
                 "value": {"op": "load", "buffer": "X", "indices": [{"var": "tx"}]}},
                {"stmt": "barrier"},
                {"stmt": "store", "buffer": "X", "indices": [{"var": "tx"}],
                 "value": {"op": "load", "buffer": "sh", "indices": [
                   {"op": "sub", "args": [{"const": 63, "dtype": "int64"}, {"var": "tx"}]}]}}
              ]}}}}
      }]
    }"#;
    let m = IRModule::from_json_str(text).unwrap();
    m.verify().unwrap();
    let printed = m.to_string();
    assert!(printed.contains("thread_binding[threadIdx.x]"), "{printed}");
    assert!(printed.contains("barrier"), "{printed}");
    let x: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let mut args = [buffer(&[64], &x)];
    run(&m.functions[0], &mut args).unwrap();
    let want: Vec<f32> = x.iter().rev().copied().collect();
    assert_eq!(args[0].to_vec::<f32>().unwrap(), want);
    // The same kernel without its barrier races.
    let racy = text.replace(r#"{"stmt": "barrier"},"#, "");
    let m = IRModule::from_json_str(&racy).unwrap();
    let mut args = [buffer(&[64], &x)];
    let err = run(&m.functions[0], &mut args).unwrap_err().to_string();
    assert!(
        err.contains("data race on shared buffer `sh` at sh[63] in block (0, 0, 0): thread (0, 0, 0) reads it after thread (63, 0, 0) wrote it"),
        "{err}"
    );
}

// ---- kernels() helper

#[test]
fn kernels_are_listed_with_their_paths() {
    let f = func_with(|a, _| {
        Stmt::Seq(vec![
            a.store([c(0)], Expr::from(0.0f32)),
            grid(a, |bx, tx| store_a(a, bx, tx)),
            if_then_else(Expr::from(true), grid(a, |bx, tx| store_a(a, bx, tx)), None),
        ])
    });
    expect_ok(f.clone());
    let ks = kernels(&f);
    let paths: Vec<&str> = ks.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["$.body.stmts[1]", "$.body.stmts[2].then"]);
    assert!(matches!(
        ks[0].1,
        Stmt::For {
            kind: ForKind::ThreadBinding(ThreadTag::Block(0)),
            ..
        }
    ));
}

// ---- verifier: well-formed device code

#[test]
fn well_formed_device_code_verifies() {
    expect_ok(vadd_kernel());
    expect_ok(block_sum(3, true));
    expect_ok(tiled_matmul(8, 8, 8, true));
    // Sibling loops of one tag with one extent, a symbolic extent from a parameter, vectorized
    // and unrolled loops in a kernel, a barrier under a block-uniform `if` and loop.
    expect_ok(func_with(|a, n| {
        thread_for("bx", n.clone(), BX, |bx| {
            Stmt::Seq(vec![
                thread_for("tx", c(64), TX, |tx| {
                    for_range("v", c(4), ForKind::Vectorized, |_| {
                        store_a(a, &bx.clone().floormod(4i64), &tx)
                    })
                }),
                thread_for("tx2", c(64), TX, |tx| {
                    if_then_else(
                        bx.clone().lt(2i64),
                        for_range("u", bx.clone(), ForKind::Serial, |_| {
                            Stmt::Seq(vec![store_a(a, &c(0), &tx), barrier()])
                        }),
                        None,
                    )
                }),
            ])
        })
    }));
}

// ---- verifier: thread_binding loops
case!(
    thread_binding_starts_at_zero,
    func_with(|a, _| {
        let bx = Var::new("bx", DataType::i64());
        Stmt::For {
            var: bx.clone(),
            min: c(1),
            extent: c(4),
            kind: ForKind::ThreadBinding(BX),
            body: Box::new(a.store([Expr::from(&bx)], Expr::from(0.0f32))),
        }
    }),
    ".body.min",
    "thread_binding loop `bx` (blockIdx.x) must start at 0, found `1"
);
case!(
    thread_idx_needs_an_enclosing_block_idx,
    func_with(|a, _| thread_for("tx", c(64), TX, |tx| store_a(a, &c(0), &tx))),
    ".body.kind",
    "threadIdx.x loop `tx` is not inside a blockIdx loop"
);
case!(
    block_idx_may_not_be_inside_thread_idx,
    func_with(|a, _| grid(a, |_, tx| {
        thread_for("by", c(2), BY, |by| store_a(a, &by, tx))
    })),
    ".body.body.body.kind",
    "blockIdx.y loop `by` is nested inside the threadIdx.x loop `tx`"
);
case!(
    a_tag_may_not_nest_inside_itself,
    func_with(|a, _| grid(a, |bx, _| {
        thread_for("tx2", c(64), TX, |tx| store_a(a, bx, &tx))
    })),
    ".body.body.body.kind",
    "threadIdx.x loop `tx2` is nested inside another threadIdx.x loop `tx`"
);
case!(
    a_tag_has_one_extent_per_kernel,
    func_with(|a, _| thread_for("bx", c(4), BX, |bx| {
        Stmt::Seq(vec![
            thread_for("tx", c(64), TX, |tx| store_a(a, &bx, &tx)),
            thread_for("tx2", c(32), TX, |tx| store_a(a, &bx, &tx)),
        ])
    })),
    ".body.body.stmts[1].extent",
    "threadIdx.x has extent `32"
);
case!(
    launch_extents_use_variables_from_outside_the_kernel,
    func_with(|a, _| thread_for("bx", c(4), BX, |bx| {
        for_range("i", c(4), ForKind::Serial, |i| {
            thread_for("tx", i + 1i64, TX, |tx| store_a(a, &bx, &tx))
        })
    })),
    ".body.body.body.extent",
    "uses `i`, bound inside the kernel; launch extents may only use variables bound outside it"
);
case!(
    no_parallel_loop_inside_a_kernel,
    func_with(|a, _| grid(a, |bx, tx| {
        for_range("p", c(2), ForKind::Parallel, |_| store_a(a, bx, tx))
    })),
    ".body.body.body.kind",
    "parallel loop `p` inside the device kernel at $.functions[0].body"
);
case!(
    no_kernel_inside_a_parallel_loop,
    func_with(|a, _| for_range("p", c(2), ForKind::Parallel, |_| {
        grid(a, |bx, tx| store_a(a, bx, tx))
    })),
    ".body.body.kind",
    "device kernel `bx` (blockIdx.x) is nested inside a parallel loop"
);

// ---- verifier: storage scopes
case!(
    shared_only_inside_kernels,
    func_with(|_, _| {
        let sh = Buffer::shared("sh", DataType::f32(), &[4]);
        sh.allocate(sh.store([c(0)], Expr::from(0.0f32)))
    }),
    ".body.buffer",
    "shared buffer `sh` is allocated outside a device kernel"
);
case!(
    shared_needs_a_constant_shape,
    func_with(|a, n| thread_for("bx", c(4), BX, |bx| {
        let sh = Buffer::temp("sh", DataType::f32(), vec![n.clone()], StorageScope::Shared);
        sh.allocate(thread_for("tx", c(64), TX, |tx| store_a(a, &bx, &tx)))
    })),
    ".body.body.buffer",
    "shared buffer `sh` needs a constant shape, found [n]"
);
case!(
    no_workspace_inside_kernels,
    func_with(|a, _| grid(a, |bx, tx| {
        let w = Buffer::temp("w", DataType::f32(), vec![c(4)], StorageScope::Workspace);
        w.allocate(store_a(a, bx, tx))
    })),
    ".body.body.body.buffer",
    "workspace buffer `w` is allocated inside a device kernel (use local or shared)"
);

// ---- verifier: barriers and return
case!(
    barrier_only_in_kernels,
    func_with(|_, _| barrier()),
    ".body",
    "barrier outside a device kernel"
);
case!(
    barrier_only_inside_thread_loops,
    func_with(|a, _| thread_for("bx", c(4), BX, |bx| {
        Stmt::Seq(vec![
            thread_for("tx", c(64), TX, |tx| store_a(a, &bx, &tx)),
            barrier(),
        ])
    })),
    ".body.body.stmts[1]",
    "barrier outside every threadIdx loop; it must be inside one"
);
case!(
    barrier_not_under_a_thread_dependent_if,
    func_with(|a, _| grid(a, |bx, tx| {
        if_then_else(
            tx.clone().lt(32i64),
            Stmt::Seq(vec![store_a(a, bx, tx), barrier()]),
            None,
        )
    })),
    ".body.body.body.then.stmts[1]",
    "barrier under the thread-dependent `if` at $.functions[0].body.body.body (its condition depends on threadIdx)"
);
case!(
    barrier_not_under_an_if_on_a_let_of_the_thread_index,
    func_with(|a, _| grid(a, |_, tx| {
        let_stmt("half", tx.clone().floordiv(2i64), |h| {
            if_then_else(h.lt(8i64), barrier(), None)
        })
    })),
    ".body.body.body.body.then",
    "barrier under the thread-dependent `if`"
);
case!(
    barrier_not_in_a_loop_with_thread_dependent_bounds,
    func_with(|a, _| grid(a, |_, tx| {
        for_range("i", tx.clone(), ForKind::Serial, |_| barrier())
    })),
    ".body.body.body.body",
    "barrier under the thread-dependent loop `i` at $.functions[0].body.body.body (its bounds depend on threadIdx)"
);
case!(
    barrier_not_under_an_if_on_a_per_thread_local,
    func_with(|a, _| grid(a, |bx, tx| {
        let l = Buffer::temp("l", DataType::i64(), vec![c(1)], StorageScope::Local);
        l.allocate(Stmt::Seq(vec![
            l.store([c(0)], bx.clone()),
            if_then_else(
                l.load([c(0)]).eq_(0i64),
                Stmt::Seq(vec![store_a(a, bx, tx), barrier()]),
                None,
            ),
        ]))
    })),
    ".body.body.body.body.stmts[1].then.stmts[1]",
    "barrier under the thread-dependent `if`"
);

#[test]
fn return_is_not_allowed_in_kernels() {
    let f =
        func_with(|a, _| Stmt::Seq(vec![grid(a, |_, _| Stmt::Return(c(0))), Stmt::Return(c(1))]))
            .with_ret_type(DataType::i64());
    expect_error(
        f,
        ".body.stmts[0].body.body",
        "`return` inside a device kernel",
    );
}

// ---- device limits

/// `threadIdx.y` 32 × `threadIdx.x` `tx_extent(n)`, with `shared` allocations.
fn two_d_kernel(tx_extent: impl FnOnce(&Expr) -> Expr, shared: &[(&str, i64)]) -> PrimFunc {
    func_with(|a, n| {
        let tx_extent = tx_extent(n);
        let inner = thread_for("bx", c(4), BX, |bx| {
            let mut s = thread_for("ty", c(32), TY, |_| {
                thread_for("tx", tx_extent, TX, |tx| store_a(a, &bx, &tx))
            });
            for (name, n) in shared {
                s = Buffer::shared(name, DataType::f32(), &[*n]).allocate(s);
            }
            s
        });
        Stmt::Seq(vec![a.store([c(0)], Expr::from(0.0f32)), inner])
    })
}

#[test]
fn device_limits_count_threads_per_block() {
    let f = two_d_kernel(|_| c(64), &[]);
    expect_ok(f.clone());
    check_device_limits(&f, 2048, 49152).unwrap();
    let err = check_device_limits(&f, 1024, 49152).unwrap_err();
    assert_eq!(
        err.to_string(),
        "function `f`: $.body.stmts[1]: kernel: 2048 threads per block (threadIdx.x 64 × threadIdx.y 32) exceed the target's max_num_threads 1024"
    );
}

#[test]
fn device_limits_need_constant_thread_extents() {
    let f = two_d_kernel(|n| n.clone(), &[]);
    expect_ok(f.clone());
    let err = check_device_limits(&f, 1024, 49152)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("threads per block must be constant for the device limits check, threadIdx.x has extent `n`"),
        "{err}"
    );
}

#[test]
fn device_limits_sum_shared_bytes() {
    let f = two_d_kernel(|_| c(16), &[("sa", 4096), ("sb", 8192)]);
    expect_ok(f.clone());
    check_device_limits(&f, 1024, 49152).unwrap();
    let err = check_device_limits(&f, 1024, 32768).unwrap_err();
    assert_eq!(
        err.to_string(),
        "function `f`: $.body.stmts[1]: kernel: 49152 bytes of shared memory (sb 32768, sa 16384) exceed the target's max_shared_memory_per_block 32768"
    );
}

// ---- interpreter

#[test]
fn vadd_runs_on_blocks_and_threads() {
    for n in [1usize, 64, 100, 300] {
        let (a, b) = (data(n, 1), data(n, 2));
        let nn = n as i64;
        let mut args = [buffer(&[nn], &a), buffer(&[nn], &b), zeros(&[nn])];
        run(&vadd_kernel(), &mut args).unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(args[2].to_vec::<f32>().unwrap(), want);
    }
}

#[test]
fn block_reduction_in_shared_memory_sums_each_block() {
    let blocks = 5;
    let a = data(blocks * 128, 7);
    let mut args = [buffer(&[blocks as i64 * 128], &a), zeros(&[blocks as i64])];
    run(&block_sum(blocks as i64, true), &mut args).unwrap();
    let want: Vec<f32> = a.chunks(128).map(|c| c.iter().sum()).collect();
    assert_eq!(args[1].to_vec::<f32>().unwrap(), want);
}

#[test]
fn tiled_matmul_matches_a_plain_loop() {
    let (m, n, k) = (8usize, 12usize, 16usize);
    let (a, b) = (data(m * k, 3), data(k * n, 4));
    let mut args = [
        buffer(&[m as i64, k as i64], &a),
        buffer(&[k as i64, n as i64], &b),
        zeros(&[m as i64, n as i64]),
    ];
    run(&tiled_matmul(m as i64, n as i64, k as i64, true), &mut args).unwrap();
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for p in 0..k {
                acc += a[i * k + p] * b[p * n + j];
            }
            want[i * n + j] = acc;
        }
    }
    assert_eq!(args[2].to_vec::<f32>().unwrap(), want);
}

#[test]
fn race_detector_flags_a_reduction_without_barriers() {
    let a = data(128, 9);
    let mut args = [buffer(&[128], &a), zeros(&[1])];
    let err = run(&block_sum(1, false), &mut args)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "interpreting `block_sum`: data race on shared buffer `sh` at sh[32] in block (0, 0, 0): \
         thread (0, 0, 0) reads it after thread (32, 0, 0) wrote it, with no barrier in between"
    );
}

#[test]
fn race_detector_flags_a_tile_overwritten_before_all_threads_used_it() {
    let (a, b) = (data(64, 3), data(64, 4));
    let mut args = [buffer(&[8, 8], &a), buffer(&[8, 8], &b), zeros(&[8, 8])];
    let err = run(&tiled_matmul(8, 8, 8, false), &mut args)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("data race on shared buffer `As` at As[0, 0] in block (0, 0, 0): thread (0, 0, 0) writes it after thread (1, 0, 0) read it"),
        "{err}"
    );
}

#[test]
fn code_outside_thread_loops_runs_in_every_thread() {
    // `A[bx] = A[bx] + 1` outside the thread loop runs once per thread of the block (as on the
    // hardware): 64 times per block here.
    let f = func_with(|a, _| {
        thread_for("bx", c(4), BX, |bx| {
            Stmt::Seq(vec![
                a.store([bx.clone()], a.load([bx.clone()]) + 1.0f32),
                thread_for("tx", c(64), TX, |_| Stmt::Seq(vec![])),
            ])
        })
    });
    let mut args = [zeros(&[256]), InterpArg::Scalar(interp::Scalar::i64(0))];
    run(&f, &mut args).unwrap();
    assert_eq!(
        &args[0].to_vec::<f32>().unwrap()[..5],
        &[64.0, 64.0, 64.0, 64.0, 0.0]
    );
}

#[test]
fn the_documented_kernel_runs() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/ir.md")).unwrap();
    let block = doc
        .split("```json\n")
        .find(|b| b.contains("sum64"))
        .unwrap();
    let m = IRModule::from_json_str(block.split("\n```").next().unwrap()).unwrap();
    let x = data(64, 5);
    let mut args = [buffer(&[64], &x), zeros(&[1])];
    run(&m.functions[0], &mut args).unwrap();
    let want = x.iter().fold(0f32, |acc, v| acc + v);
    assert_eq!(args[1].to_vec::<f32>().unwrap(), vec![want]);
    check_device_limits(&m.functions[0], 64, 256).unwrap();
    assert!(check_device_limits(&m.functions[0], 32, 256).is_err());
}
