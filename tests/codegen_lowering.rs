//! The CPU code generators' lowering of loops nobody scheduled (TVM's lowered operators):
//! first-iteration guards hoisted out of reduction loops (`codegen::peel`), reduction nests
//! moved outside the spatial loop around them (`codegen::interchange`). Each rewrite is checked
//! on its own (what it does, and what it must leave alone), and compiled code with the
//! rewrites is compared with the interpreter bit for bit (multiply-add contraction off, so
//! both round every operation).

mod common;

use kiln::codegen::interchange::interchange_reductions;
use kiln::codegen::llvm::CodegenOptions;
use kiln::codegen::peel::hoist_first_iteration_guards;
use kiln::ir::builder::exp;
use kiln::ir::interp::{HostBuffer, InterpArg};
use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, PrimFunc, Stmt, StorageScope, Var};
use kiln::target::Target;

fn int(v: i64) -> Expr {
    Expr::from(v as i32)
}

fn for_(var: &Var, extent: Expr, body: Stmt) -> Stmt {
    Stmt::For {
        var: var.clone(),
        min: int(0),
        extent,
        kind: ForKind::Serial,
        body: Box::new(body),
    }
}

fn var(name: &str) -> Var {
    Var::new(name, DataType::i32())
}

fn buf(name: &str, shape: &[i64]) -> Buffer {
    Buffer::new(
        name,
        DataType::f32(),
        shape.iter().map(|&d| int(d)).collect(),
    )
}

/// TVM's lowering of a reduction: `for k { if k == 0 { X[at] = 0 }; X[at] = X[at] + e }`.
fn tvm_reduction(k: &Var, extent: Expr, x: &Buffer, at: Vec<Expr>, e: Expr) -> Stmt {
    for_(
        k,
        extent,
        Stmt::Seq(vec![
            Stmt::IfThenElse {
                cond: Expr::Var(k.clone()).eq_(0i32),
                then_case: Box::new(x.store(at.clone(), Expr::from(0.0f32))),
                else_case: None,
            },
            x.store(at.clone(), x.load(at) + e),
        ]),
    )
}

/// TVM's `matmul` (`C[i, j] = sum_k A[i, k] * B[k, j]`), or with `B` transposed (`dense`:
/// `B[j, k]`).
fn matmul(m: i64, n: i64, kk: i64, transposed: bool) -> PrimFunc {
    let (a, c) = (buf("A", &[m, kk]), buf("C", &[m, n]));
    let b = if transposed {
        buf("B", &[n, kk])
    } else {
        buf("B", &[kk, n])
    };
    let (i, j, k) = (var("i"), var("j"), var("k"));
    let (iv, jv, kv) = (
        Expr::Var(i.clone()),
        Expr::Var(j.clone()),
        Expr::Var(k.clone()),
    );
    let bl = if transposed {
        b.load(vec![jv.clone(), kv.clone()])
    } else {
        b.load(vec![kv.clone(), jv.clone()])
    };
    let body = for_(
        &i,
        int(m),
        for_(
            &j,
            int(n),
            tvm_reduction(
                &k,
                int(kk),
                &c,
                vec![iv.clone(), jv],
                a.load(vec![iv, kv]) * bl,
            ),
        ),
    );
    PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
    .with_noalias(true)
}

/// A 3x3 depthwise convolution without padding: `O[c, y, x] = sum_{r, s} I[c, y + r, x + s] *
/// W[c, r, s]`, with TVM's two-loop guard `if r == 0 && s == 0`.
fn depthwise(ch: i64, h: i64, w: i64) -> PrimFunc {
    window(ch, h, w, 1, false)
}

/// A 3x3 window of stride 1 or 2 over `I[c, (h - 1) stride + 3, (w - 1) stride + 3]`: `O[c,
/// y, x] = sum_{r, s} I[c, stride y + r, stride x + s] * W[c, r, s]` (a depthwise
/// convolution), or with `max` the max pool `O[c, y, x] = max_{r, s} I[c, stride y + r, stride
/// x + s]`; TVM's two-loop guard `if r == 0 && s == 0`.
fn window(ch: i64, h: i64, w: i64, stride: i64, max: bool) -> PrimFunc {
    let (inp, wt, out) = (
        buf("I", &[ch, (h - 1) * stride + 3, (w - 1) * stride + 3]),
        buf("W", &[ch, 3, 3]),
        buf("O", &[ch, h, w]),
    );
    let (c, y, x, r, s) = (var("c"), var("y"), var("x"), var("r"), var("s"));
    let e = |v: &Var| Expr::Var(v.clone());
    let scaled = |v: &Var| {
        if stride == 1 {
            e(v)
        } else {
            e(v) * int(stride)
        }
    };
    let at = vec![e(&c), e(&y), e(&x)];
    let elem = inp.load(vec![e(&c), scaled(&y) + e(&r), scaled(&x) + e(&s)]);
    let (value, init) = if max {
        (out.load(at.clone()).max(elem), Expr::from(-3.0e38f32))
    } else {
        (
            out.load(at.clone()) + elem * wt.load(vec![e(&c), e(&r), e(&s)]),
            Expr::from(0.0f32),
        )
    };
    let update = out.store(at.clone(), value);
    let guard = Stmt::IfThenElse {
        cond: e(&r).eq_(0i32).and(e(&s).eq_(0i32)),
        then_case: Box::new(out.store(at, init)),
        else_case: None,
    };
    let body = for_(
        &c,
        int(ch),
        for_(
            &y,
            int(h),
            for_(
                &x,
                int(w),
                for_(&r, int(3), for_(&s, int(3), Stmt::Seq(vec![guard, update]))),
            ),
        ),
    );
    PrimFunc::new(
        "f",
        vec![Param::Buffer(inp), Param::Buffer(wt), Param::Buffer(out)],
        body,
    )
    .with_noalias(true)
}

/// Inputs with full mantissas, so that a sum taken in another order rounds differently.
fn inputs(shapes: &[Vec<i64>]) -> Vec<Vec<f32>> {
    shapes
        .iter()
        .enumerate()
        .map(|(b, s)| {
            let n: i64 = s.iter().product();
            (0..n)
                .map(|i| {
                    let h = (i as u64 * 2_654_435_761 + b as u64 * 40_503) % 1_000_003;
                    h as f32 / 1_000_003.0 * 2.0 - 1.0
                })
                .collect()
        })
        .collect()
}

/// Compiled without contraction, on [`inputs`]; returns the last buffer.
fn compiled(f: &PrimFunc, shapes: &[Vec<i64>]) -> Vec<f32> {
    let t = Target::parse(r#"{"kind": "llvm", "mcpu": "native", "fast-math-contract": false}"#)
        .unwrap();
    let opts = CodegenOptions::from_target(&t).unwrap();
    common::jit_last_on(f, shapes, &opts, &inputs(shapes))
}

/// The interpreter on [`inputs`]; returns the last buffer.
fn interpreted(f: &PrimFunc, shapes: &[Vec<i64>]) -> Vec<f32> {
    let mut args: Vec<InterpArg> = inputs(shapes)
        .iter()
        .zip(shapes)
        .map(|(v, s)| InterpArg::Buffer(HostBuffer::from_slice(s, v)))
        .collect();
    kiln::ir::interp::run(f, &mut args).unwrap();
    args.last()
        .unwrap()
        .buffer()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

fn assert_same_bits(f: &PrimFunc, shapes: &[Vec<i64>]) {
    let (got, want) = (compiled(f, shapes), interpreted(f, shapes));
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{}: element {k}: {g} vs {w}",
            f.name
        );
    }
}

/// The loops of `s`, outermost first, as `name:kind:extent`.
fn loops(s: &Stmt) -> Vec<String> {
    let mut out = Vec::new();
    fn go(s: &Stmt, out: &mut Vec<String>) {
        if let Stmt::For {
            var, kind, extent, ..
        } = s
        {
            out.push(format!(
                "{}:{}:{}",
                var.name,
                kind.name(),
                extent.as_int().map_or("?".into(), |n| n.to_string())
            ));
        }
        let _ = s.map_children(|c| {
            go(c, out);
            c.clone()
        });
    }
    go(s, &mut out);
    out
}

#[test]
fn the_first_iteration_guard_leaves_the_loop() {
    let f = matmul(4, 8, 5, false);
    let peeled = hoist_first_iteration_guards(&f.body);
    // i { j { C = 0; k { C += A * B } } }: no `if` is left.
    let text = format!("{peeled:?}");
    assert!(!text.contains("IfThenElse"), "{text}");
    assert_eq!(loops(&peeled), ["i:serial:4", "j:serial:8", "k:serial:5"]);
    // Through a nest of reduction loops: `if r == 0 && s == 0` leaves both.
    let d = depthwise(2, 4, 8);
    let peeled = hoist_first_iteration_guards(&d.body);
    assert!(!format!("{peeled:?}").contains("IfThenElse"));
}

#[test]
fn a_guard_that_is_not_the_first_iteration_stays() {
    let k = var("k");
    let x = buf("X", &[1]);
    let guarded = |cond: Expr, else_case: Option<Box<Stmt>>| {
        for_(
            &k,
            int(8),
            Stmt::Seq(vec![
                Stmt::IfThenElse {
                    cond,
                    then_case: Box::new(x.store(vec![int(0)], Expr::from(0.0f32))),
                    else_case,
                },
                x.store(vec![int(0)], x.load(vec![int(0)]) + Expr::from(1.0f32)),
            ]),
        )
    };
    let kv = || Expr::Var(k.clone());
    for s in [
        guarded(kv().eq_(1i32), None),
        guarded(kv().lt(1i32), None),
        guarded(
            kv().eq_(0i32),
            Some(Box::new(x.store(vec![int(0)], Expr::from(2.0f32)))),
        ),
    ] {
        assert_eq!(hoist_first_iteration_guards(&s), s);
    }
    // A loop of symbolic length runs the hoisted initialization only when it runs at all.
    let n = var("n");
    let s = tvm_reduction(
        &k,
        Expr::Var(n.clone()),
        &x,
        vec![int(0)],
        Expr::from(1.0f32),
    );
    let text = format!("{:?}", hoist_first_iteration_guards(&s));
    assert!(text.contains("op: Gt"), "{text}");
}

#[test]
fn a_reduction_nest_moves_outside_the_spatial_loop() {
    // Five rows, which no jam of 2, 3 or 4 rows divides: the nest moves, the rows stay apart.
    for (cols, k, want) in [
        // 40 columns: 2 vectors of 16 and one of the other 8, for the initialization and in
        // the reduction loop.
        (
            40,
            5,
            &[
                "j_init_o:serial:2",
                "j_init_v:vectorized:16",
                "j_init_t:vectorized:8",
                "k:serial:5",
                "j_o:serial:2",
                "j_v:vectorized:16",
                "j_t:vectorized:8",
            ][..],
        ),
        // 16 columns: one vector, no loop over vectors.
        (
            16,
            5,
            &["j_init:vectorized:16", "k:serial:5", "j:vectorized:16"][..],
        ),
        // 6 columns: one vector of 6 lanes (the emitter's pieces: 4 + 2).
        (
            6,
            5,
            &["j_init:vectorized:6", "k:serial:5", "j:vectorized:6"][..],
        ),
        // 55 columns: 3 vectors of 16 and one of the other 7.
        (
            55,
            3,
            &[
                "j_init_o:serial:3",
                "j_init_v:vectorized:16",
                "j_init_t:vectorized:7",
                "k:serial:3",
                "j_o:serial:3",
                "j_v:vectorized:16",
                "j_t:vectorized:7",
            ][..],
        ),
    ] {
        let f = matmul(5, cols, k, false);
        let body = interchange_reductions(&f, &hoist_first_iteration_guards(&f.body));
        let mut full = vec!["i:serial:5".to_string()];
        full.extend(want.iter().map(|w| w.to_string()));
        assert_eq!(loops(&body), full, "{cols} columns");
    }
    // Windows of two reduction loops: `a_window_moves_and_agrees_with_the_interpreter`.
}

#[test]
fn short_rows_are_jammed_into_the_reduction() {
    for (rows, cols, want) in [
        // 16 rows of 16 columns: 4 rows (64 elements) side by side in the reduction loop.
        (
            16,
            16,
            &[
                "i_o:serial:4",
                "i_r_init:serial:4",
                "j_init:vectorized:16",
                "k:serial:5",
                "i_r:unrolled:4",
                "j:vectorized:16",
            ][..],
        ),
        // Rows of 20 (TOPI's batch_matmul): 2 rows at a time; the vectors of a row unrolled.
        (
            16,
            20,
            &[
                "i_o:serial:8",
                "i_r_init:serial:2",
                "j_init_o:serial:1",
                "j_init_v:vectorized:16",
                "j_init_t:vectorized:4",
                "k:serial:5",
                "i_r:unrolled:2",
                "j_o:unrolled:1",
                "j_v:vectorized:16",
                "j_t:vectorized:4",
            ][..],
        ),
        // 9 rows of 6: 3 at a time.
        (
            9,
            6,
            &[
                "i_o:serial:3",
                "i_r_init:serial:3",
                "j_init:vectorized:6",
                "k:serial:5",
                "i_r:unrolled:3",
                "j:vectorized:6",
            ][..],
        ),
    ] {
        let f = matmul(rows, cols, 5, false);
        let body = interchange_reductions(&f, &hoist_first_iteration_guards(&f.body));
        assert_eq!(loops(&body), want, "{rows} x {cols}");
    }
    // Rows of 48 (3 vectors of 16) are wide enough alone: 2 of them would be 96 elements.
    let f = matmul(4, 48, 5, false);
    let body = interchange_reductions(&f, &hoist_first_iteration_guards(&f.body));
    assert_eq!(loops(&body)[0], "i:serial:4");
}

#[test]
fn rows_that_share_their_elements_are_not_jammed() {
    // `C[j] += A[i, k] * B[k, j]` over rows `i` and `k`: every row updates the same elements, so
    // jamming rows would reorder the updates of one element. The inner nest still moves.
    let (a, b, c) = (buf("A", &[4, 5]), buf("B", &[5, 16]), buf("C", &[16]));
    let (i, j, k) = (var("i"), var("j"), var("k"));
    let e = |v: &Var| Expr::Var(v.clone());
    let update = c.store(
        vec![e(&j)],
        c.load(vec![e(&j)]) + a.load(vec![e(&i), e(&k)]) * b.load(vec![e(&k), e(&j)]),
    );
    let body = for_(&i, int(4), for_(&j, int(16), for_(&k, int(5), update)));
    let f = PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
    .with_noalias(true);
    let moved = interchange_reductions(&f, &f.body);
    assert_eq!(
        loops(&moved),
        ["i:serial:4", "k:serial:5", "j:vectorized:16"],
    );
    assert_same_bits(&f, &[vec![4, 5], vec![5, 16], vec![16]]);
    // A strided accumulator: rows 4 elements apart overlap, so they are not jammed either.
    let (a, b) = (buf("A", &[4, 5]), buf("B", &[5, 16]));
    let c = buf("C", &[4, 16]).with_strides(vec![int(4), int(1)]);
    let update = tvm_reduction(
        &k,
        int(5),
        &c,
        vec![e(&i), e(&j)],
        a.load(vec![e(&i), e(&k)]) * b.load(vec![e(&k), e(&j)]),
    );
    let body = for_(&i, int(4), for_(&j, int(16), update));
    let f = PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
    .with_noalias(true);
    let moved = interchange_reductions(&f, &hoist_first_iteration_guards(&f.body));
    assert_eq!(loops(&moved)[0], "i:serial:4");
}

#[test]
fn a_nest_that_breaks_the_rule_stays() {
    // B transposed: the spatial loop would gather B's columns.
    let f = matmul(4, 16, 5, true);
    let peeled = hoist_first_iteration_guards(&f.body);
    assert_eq!(interchange_reductions(&f, &peeled), peeled);
    // Buffers that may alias: the new order could read a C that A aliases.
    let f = matmul(4, 16, 5, false).with_noalias(false);
    let peeled = hoist_first_iteration_guards(&f.body);
    assert_eq!(interchange_reductions(&f, &peeled), peeled);
    // Too few columns to vectorize.
    let f = matmul(4, 3, 5, false);
    let peeled = hoist_first_iteration_guards(&f.body);
    assert_eq!(interchange_reductions(&f, &peeled), peeled);
    // The update reads the accumulator elsewhere (`C[i, j] + C[i, 0]`).
    let mut f = matmul(4, 16, 5, false);
    let Param::Buffer(c) = f.params[2].clone() else {
        unreachable!()
    };
    if let Stmt::For { body, .. } = &mut f.body {
        if let Stmt::For { body, .. } = body.as_mut() {
            if let Stmt::For { body, .. } = body.as_mut() {
                if let Stmt::Seq(items) = body.as_mut() {
                    if let Stmt::Store { value, .. } = &mut items[1] {
                        *value = value.clone() + c.load(vec![int(0), int(0)]);
                    }
                }
            }
        }
    }
    let peeled = hoist_first_iteration_guards(&f.body);
    assert_eq!(interchange_reductions(&f, &peeled), peeled);
}

#[test]
fn compiled_lowered_reductions_agree_with_the_interpreter_bit_for_bit() {
    // Jammed rows among them: 3 x 16 (3 rows at a time), 16 x 20 and 8 x 20 (2 at a time),
    // 4 x 6 (4 at a time).
    for (m, n, k) in [
        (4, 40, 5),
        (3, 16, 7),
        (5, 6, 3),
        (2, 48, 33),
        (1, 1, 1),
        (16, 20, 24),
        (8, 20, 7),
        (4, 6, 9),
    ] {
        for transposed in [false, true] {
            let f = matmul(m, n, k, transposed);
            let b = if transposed { vec![n, k] } else { vec![k, n] };
            assert_same_bits(&f, &[vec![m, k], b, vec![m, n]]);
        }
    }
    for (ch, h, w) in [(2, 4, 8), (3, 5, 16), (1, 3, 7), (2, 16, 16)] {
        let f = depthwise(ch, h, w);
        assert_same_bits(
            &f,
            &[vec![ch, h + 2, w + 2], vec![ch, 3, 3], vec![ch, h, w]],
        );
    }
}

#[test]
fn a_sum_of_exponentials_agrees_with_the_interpreter() {
    // `S[i] = sum_k exp(A[i, k])` (log_softmax's sum): the guard leaves the loop, the sum
    // stays scalar and in order; compiled `exp` is within 2 ulp of the interpreter's, so
    // the sums agree to a few ulp of the sum.
    let (a, s) = (buf("A", &[6, 48]), buf("S", &[6]));
    let (i, k) = (var("i"), var("k"));
    let (iv, kv) = (Expr::Var(i.clone()), Expr::Var(k.clone()));
    let body = for_(
        &i,
        int(6),
        tvm_reduction(&k, int(48), &s, vec![iv.clone()], exp(a.load(vec![iv, kv]))),
    );
    let f = PrimFunc::new("f", vec![Param::Buffer(a), Param::Buffer(s)], body).with_noalias(true);
    let shapes = [vec![6, 48], vec![6]];
    let (got, want) = (compiled(&f, &shapes), interpreted(&f, &shapes));
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 4e-7 * w.abs(), "{g} vs {w}");
    }
}

#[test]
fn a_transposed_operand_is_copied_so_the_nest_moves() {
    use kiln::codegen::interchange::pack_transposed_operands;
    let f = matmul(4, 16, 5, true);
    let peeled = hoist_first_iteration_guards(&f.body);
    let packed = pack_transposed_operands(&f, &peeled);
    let body = interchange_reductions(&f, &packed);
    let printed = kiln::ir::IRModule::from_functions(vec![PrimFunc {
        body: body.clone(),
        ..f.clone()
    }])
    .to_string();
    // B (16 x 5) copied to B_t[k, j] in front of the row loop, then the nest interchanged
    // and its 4 rows jammed.
    assert!(printed.contains("B_t"), "{printed}");
    assert_eq!(
        loops(&body),
        [
            "B_t_k:serial:5",
            "B_t_j:serial:16",
            "i_o:serial:1",
            "i_r_init:serial:4",
            "j_init:vectorized:16",
            "k:serial:5",
            "i_r:unrolled:4",
            "j:vectorized:16"
        ],
        "{printed}"
    );
}

#[test]
fn a_copy_in_front_of_a_parallel_loop_is_shared_by_its_threads() {
    // `dense` with its row loop on the thread pool (`auto_parallel`): the copy of `B` is made
    // once, in front of the parallel loop, and every thread reads it.
    for (m, n, k) in [(64, 16, 5), (200, 24, 7)] {
        let mut f = matmul(m, n, k, true);
        if let Stmt::For { kind, .. } = &mut f.body {
            *kind = ForKind::Parallel;
        }
        assert_same_bits(&f, &[vec![m, k], vec![n, k], vec![m, n]]);
    }
}

/// A stride-2 window sum between two workspace buffers (TVM's `avg_pool2d` with padding:
/// `pad_temp` and `pool_sum` are both allocated in the function): `T = X`, `S[o] = T[2o] +
/// T[2o + 1] + T[2o + 2]`, `Y = S`. Each workspace has `room` elements at least (the rest
/// unused): over 32 KiB they come from the workspace pool, not the stack.
fn window_sum_through_workspaces(n: i64, room: i64) -> PrimFunc {
    let (x, y) = (buf("X", &[2 * n + 2]), buf("Y", &[n]));
    let t = buf("T", &[(2 * n + 2).max(room)]).with_scope(StorageScope::Workspace);
    let s = buf("S", &[n.max(room)]).with_scope(StorageScope::Workspace);
    let (i, o, r, j) = (var("i"), var("o"), var("r"), var("j"));
    let e = |v: &Var| Expr::Var(v.clone());
    let body = Stmt::Seq(vec![
        for_(
            &i,
            int(2 * n + 2),
            t.store(vec![e(&i)], x.load(vec![e(&i)])),
        ),
        for_(
            &o,
            int(n),
            tvm_reduction(
                &r,
                int(3),
                &s,
                vec![e(&o)],
                t.load(vec![e(&o) * 2i32 + e(&r)]),
            ),
        ),
        for_(&j, int(n), y.store(vec![e(&j)], s.load(vec![e(&j)]))),
    ]);
    let body = Stmt::Allocate {
        buffer: t,
        body: Box::new(Stmt::Allocate {
            buffer: s,
            body: Box::new(body),
        }),
    };
    PrimFunc::new("f", vec![Param::Buffer(x), Param::Buffer(y)], body).with_noalias(true)
}

/// The window sum of three outputs through workspaces of `room` elements at least
/// ([`window_sum_through_workspaces`]), checked against the interpreter bit for bit; its
/// optimized LLVM IR for this machine, compiled in memory.
fn window_sum_ir(room: i64) -> String {
    use kiln::packed_func::Module;
    let n = 3;
    let f = window_sum_through_workspaces(n, room);
    assert_same_bits(&f, &[vec![2 * n + 2], vec![n]]);
    kiln::codegen::llvm::LlvmModule::jit(
        &kiln::ir::IRModule::from_functions(vec![f]),
        &CodegenOptions::host(),
    )
    .unwrap()
    .get_source("ll")
    .unwrap()
}

#[test]
fn workspace_buffers_do_not_alias_each_other() {
    // Two allocations from the workspace pool (36 KiB each, more than a function keeps on
    // its stack) never overlap, and LLVM is told so: the window's sum stays in a register
    // and `S[o]` is stored once per `o`, not once per tap (a store after every add made
    // `avg_pool2d` 1.4x slower than TVM's build).
    // Three outputs (`window_sum_ir`): too few for `codegen::interchange` to move the window
    // outside them (the nest it makes stores every tap, a vector at a time, by design).
    let ll = window_sum_ir(9216);
    assert!(ll.contains("@__kiln_alloc_workspace"), "{ll}");
    // With `S` kept in a register, the window's three adds come between two scalar stores;
    // stored per tap, one add would.
    let most_adds_between_stores = ll
        .split("store float")
        .skip(1)
        .map(|seg| seg.matches("fadd float").count())
        .max()
        .unwrap_or(0);
    assert!(
        most_adds_between_stores >= 3,
        "the window sum was stored per tap:\n{ll}"
    );
}

#[test]
fn small_constant_workspaces_live_on_the_stack() {
    // The same function with workspaces of 32 and 12 bytes: on the stack, no call of the
    // workspace allocator, and LLVM keeps both in registers: the only stores left are the
    // outputs', after all nine adds.
    let ll = window_sum_ir(0);
    assert!(!ll.contains("call i8* @__kiln_alloc_workspace"), "{ll}");
    let stores = ll.matches("store float").count();
    assert_eq!(stores, 3, "{ll}");
    let adds_before_first_store = ll
        .split("store float")
        .next()
        .map_or(0, |seg| seg.matches("fadd float").count());
    assert_eq!(adds_before_first_store, 9, "{ll}");
}

#[test]
fn an_index_cast_of_known_range_is_a_plain_conversion() {
    // TOPI's bilinear resize computes its source column as `int32(floor((x + 0.5) * 0.8 -
    // 0.5))`, in [-1, 15] for x in [0, 20): no saturation is emitted for it (`codegen::bounds`),
    // while the cast of a loaded value keeps it. Both agree with the interpreter.
    use kiln::codegen::llvm::{generate_ir, Linkage};
    use kiln::ir::builder::floor;
    let (src, out) = (buf("X", &[16]), buf("Y", &[20]));
    let x = var("x");
    let e = |v: &Var| Expr::Var(v.clone());
    let col = floor((e(&x).cast(DataType::f32()) + 0.5f32) * 0.8f32 - 0.5f32).cast(DataType::i32());
    let clamped = col.clone().min(15i32).max(0i32);
    let data = src.load(vec![clamped.clone()]) * 100.0f32;
    let value = src.load(vec![clamped])
        + col.cast(DataType::f32())
        + data.cast(DataType::i32()).cast(DataType::f32());
    let f = PrimFunc::new(
        "f",
        vec![Param::Buffer(src), Param::Buffer(out.clone())],
        for_(&x, int(20), out.store(vec![e(&x)], value)),
    )
    .with_noalias(true);
    assert_same_bits(&f, &[vec![16], vec![20]]);
    let ir = generate_ir(
        &kiln::ir::IRModule::from_functions(vec![f]),
        &CodegenOptions::host(),
        &Linkage::Export,
    )
    .unwrap();
    // 2^31 as a float is the upper test of a saturating conversion to int32: once, for the
    // loaded value.
    assert_eq!(ir.matches("0x41E0000000000000").count(), 1, "{ir}");
}

/// `Y[a, b] = X[b, a] * 2 + 1` over `Y[ea, eb]`, `a` of `kind`.
fn transpose(ea: i64, eb: i64, kind: ForKind) -> PrimFunc {
    let (x, y) = (buf("X", &[eb, ea]), buf("Y", &[ea, eb]));
    let (a, b) = (var("a"), var("b"));
    let e = |v: &Var| Expr::Var(v.clone());
    let store = y.store(
        vec![e(&a), e(&b)],
        x.load(vec![e(&b), e(&a)]) * 2.0f32 + 1.0f32,
    );
    let body = Stmt::For {
        var: a.clone(),
        min: int(0),
        extent: int(ea),
        kind,
        body: Box::new(for_(&b, int(eb), store)),
    };
    PrimFunc::new("f", vec![Param::Buffer(x), Param::Buffer(y)], body).with_noalias(true)
}

#[test]
fn a_transposing_copy_walks_its_source_in_blocks_of_a_cache_line() {
    use kiln::codegen::block::block_strided_copies;
    let blocked = |f: &PrimFunc| loops(&block_strided_copies(f, &f.body));
    // X is 96 x 256 floats (96 KiB, more than an L1 cache).
    let f = transpose(256, 96, ForKind::Serial);
    assert_eq!(
        blocked(&f),
        ["b_o:serial:6", "a:serial:256", "b_i:serial:16"]
    );
    assert_same_bits(&f, &[vec![96, 256], vec![256, 96]]);
    // A parallel row loop hands its threads to the blocks.
    let f = transpose(256, 96, ForKind::Parallel);
    assert_eq!(
        blocked(&f),
        ["b_o:parallel:6", "a:serial:256", "b_i:serial:16"]
    );
    assert_same_bits(&f, &[vec![96, 256], vec![256, 96]]);
    // Left alone: a row that is not a multiple of a line, a source that fits in L1, a function
    // that may alias, and a copy that walks no column (`Y[a, b] = X[a, b]`).
    let f = transpose(256, 100, ForKind::Serial);
    assert_eq!(blocked(&f), ["a:serial:256", "b:serial:100"]);
    assert_same_bits(&f, &[vec![100, 256], vec![256, 100]]);
    let f = transpose(40, 48, ForKind::Serial);
    assert_eq!(blocked(&f), ["a:serial:40", "b:serial:48"]);
    let f = transpose(256, 96, ForKind::Serial).with_noalias(false);
    assert_eq!(blocked(&f), ["a:serial:256", "b:serial:96"]);
    let (x, y) = (buf("X", &[256, 96]), buf("Y", &[256, 96]));
    let (a, b) = (var("a"), var("b"));
    let e = |v: &Var| Expr::Var(v.clone());
    let copy = y.store(vec![e(&a), e(&b)], x.load(vec![e(&a), e(&b)]));
    let copy = PrimFunc::new(
        "f",
        vec![Param::Buffer(x), Param::Buffer(y)],
        for_(&a, int(256), for_(&b, int(96), copy)),
    )
    .with_noalias(true);
    assert_eq!(blocked(&copy), ["a:serial:256", "b:serial:96"]);
}

#[test]
fn a_gather_computes_its_offset_in_32_bits_and_agrees_with_the_interpreter() {
    // Y[i, j] = X[clamp(int32(I[i] * 4)), j] + X[int32(floor(j * 0.6)), 2 j % 20]: two
    // data-dependent accesses into a small buffer, whose offsets are 32-bit arithmetic widened
    // once (`mul nsw i32` by the row length), as TVM computes them.
    use kiln::codegen::llvm::{generate_ir, Linkage};
    use kiln::ir::builder::floor;
    let (x, idx, y) = (buf("X", &[20, 20]), buf("I", &[16]), buf("Y", &[16, 20]));
    let (i, j) = (var("i"), var("j"));
    let e = |v: &Var| Expr::Var(v.clone());
    let row = (idx.load(vec![e(&i)]) * 4.0f32)
        .cast(DataType::i32())
        .min(19i32)
        .max(0i32);
    let col_row = floor(e(&j).cast(DataType::f32()) * 0.6f32).cast(DataType::i32());
    let value = x.load(vec![row, e(&j)]) + x.load(vec![col_row, (e(&j) * 2i32).floormod(20i32)]);
    let f = PrimFunc::new(
        "f",
        vec![
            Param::Buffer(x),
            Param::Buffer(idx),
            Param::Buffer(y.clone()),
        ],
        for_(
            &i,
            int(16),
            for_(&j, int(20), y.store(vec![e(&i), e(&j)], value)),
        ),
    )
    .with_noalias(true);
    assert_same_bits(&f, &[vec![20, 20], vec![16], vec![16, 20]]);
    let ir = generate_ir(
        &kiln::ir::IRModule::from_functions(vec![f]),
        &CodegenOptions::host(),
        &Linkage::Export,
    )
    .unwrap();
    assert_eq!(ir.matches("mul nsw i32").count(), 2, "{ir}");
}

#[test]
fn an_unrolled_row_of_constant_columns_loads_at_displacements() {
    // Nearest-neighbour resize (TOPI's `resize2d`), Y[r, c] = X[row(r), col(c)]: the column
    // loop is unrolled and each column index folds to a constant. The load's last dimension is
    // its own `getelementptr` off the row, so each constant is an address displacement. As
    // `row * 16 + c`, LLVM 14 built the addresses in a vector register and extracted every
    // lane (`extractelement`) on AVX2.
    use kiln::ir::builder::floor;
    use kiln::packed_func::Module;
    let (x, y) = (buf("X", &[16, 16]), buf("Y", &[24, 20]));
    let (r, c) = (var("r"), var("c"));
    let e = |v: &Var| Expr::Var(v.clone());
    let at = |v: &Var, scale: f32| {
        floor(e(v).cast(DataType::f32()) * scale + 1.0e-5f32)
            .cast(DataType::i32())
            .min(15i32)
            .max(0i32)
    };
    let store = y.store(
        vec![e(&r), e(&c)],
        x.load(vec![at(&r, 0.6667), at(&c, 0.8)]),
    );
    let f = PrimFunc::new(
        "f",
        vec![Param::Buffer(x), Param::Buffer(y)],
        for_(&r, int(24), for_(&c, int(20), store)),
    )
    .with_noalias(true);
    assert_same_bits(&f, &[vec![16, 16], vec![24, 20]]);
    let t = Target::parse(r#"{"kind": "llvm", "mcpu": "haswell"}"#).unwrap();
    let m = kiln::codegen::llvm::LlvmModule::jit(
        &kiln::ir::IRModule::from_functions(vec![f]),
        &CodegenOptions::from_target(&t).unwrap(),
    )
    .unwrap();
    let ll = m.get_source("ll").unwrap();
    // Addresses extracted from a vector of 32- or 64-bit integers (floats extracted from a
    // combined load are fine: that is LLVM reading a few neighbouring columns at once, and
    // four floats of a row's window moved as one `i128`). The row is a window load and a
    // shuffle (`emit/vector.rs`, `tests/codegen_windows.rs`).
    let address_extracts = ll
        .split("extractelement <")
        .skip(1)
        .filter(|rest| {
            rest.split('>')
                .next()
                .is_some_and(|t| t.ends_with(" x i32") || t.ends_with(" x i64"))
        })
        .count();
    assert_eq!(address_extracts, 0, "{ll}");
    assert!(ll.contains("shufflevector <16 x float>"), "{ll}");
}

/// A convolution window of two reduction loops, and a sum or a max over a stride-2 window,
/// move outside the output's columns (a stride-2 vector loads them as two vectors and a
/// shuffle, `emit/vector.rs`), 4 rows of 8 outputs jammed; the stride-2 windows give the
/// interpreter's bits: rows of 8, 16, 7 (pieces of 4 + 2 + 1) and 19 (a vector of 16 and one
/// of 3) outputs
/// (`tests/codegen_reduce.rs` has a strided max over NaN and signed zeros).
#[test]
fn a_window_moves_and_agrees_with_the_interpreter() {
    for (stride, max) in [(1, false), (2, false), (2, true)] {
        let f = window(2, 4, 8, stride, max);
        let body = interchange_reductions(&f, &hoist_first_iteration_guards(&f.body));
        assert_eq!(
            loops(&body),
            [
                "c:serial:2",
                "y_o:serial:1",
                "y_r_init:serial:4",
                "x_init:vectorized:8",
                "r:serial:3",
                "s:serial:3",
                "y_r:unrolled:4",
                "x:vectorized:8"
            ]
        );
    }
    for (ch, h, w) in [(2, 4, 8), (3, 5, 16), (1, 3, 7), (1, 2, 19)] {
        for max in [false, true] {
            let f = window(ch, h, w, 2, max);
            assert_same_bits(
                &f,
                &[
                    vec![ch, 2 * h + 1, 2 * w + 1],
                    vec![ch, 3, 3],
                    vec![ch, h, w],
                ],
            );
        }
    }
}

/// `f(X[4, 8], Y[4, 8])`: `T` (a workspace) copies `X` unchanged, then
/// `Y[a, b] = T[a, b] * 2 + T[a, (b + 1) % 8]`; `noalias` or not.
fn copied_input(noalias: bool) -> PrimFunc {
    let (x, y) = (buf("X", &[4, 8]), buf("Y", &[4, 8]));
    let t =
        Buffer::new("T", DataType::f32(), vec![int(4), int(8)]).with_scope(StorageScope::Workspace);
    let (i, j, a, b) = (var("i"), var("j"), var("a"), var("b"));
    let e = |v: &Var| Expr::Var(v.clone());
    let copy = for_(
        &i,
        int(4),
        for_(
            &j,
            int(8),
            t.store(vec![e(&i), e(&j)], x.load(vec![e(&i), e(&j)])),
        ),
    );
    let next = (e(&b) + int(1)).floormod(int(8));
    let use_ = for_(
        &a,
        int(4),
        for_(
            &b,
            int(8),
            y.store(
                vec![e(&a), e(&b)],
                t.load(vec![e(&a), e(&b)]) * 2.0f32 + t.load(vec![e(&a), next]),
            ),
        ),
    );
    PrimFunc::new(
        "f",
        vec![Param::Buffer(x), Param::Buffer(y)],
        t.allocate(Stmt::Seq(vec![copy, use_])),
    )
    .with_noalias(noalias)
}

#[test]
fn a_workspace_that_copies_a_parameter_unchanged_is_read_in_place() {
    // TOPI's `conv2d_nchw` with no padding copies its input into `pad_temp` first. In a
    // `noalias` function the copy is read in place (`schedule::inline_copies`): no workspace,
    // no copy loop; without `noalias` it stays (the parameter might be another name for the
    // output, whose writes the copy's snapshot does not see). Both agree with the interpreter.
    use kiln::codegen::llvm::{generate_ir, Linkage};
    for noalias in [true, false] {
        let f = copied_input(noalias);
        assert_same_bits(&f, &[vec![4, 8], vec![4, 8]]);
        let ir = generate_ir(
            &kiln::ir::IRModule::from_functions(vec![f.clone()]),
            &CodegenOptions::host(),
            &Linkage::Export,
        )
        .unwrap();
        // `T` (32 floats) would be on the stack.
        assert_eq!(!ir.contains("alloca float, i64 32"), noalias, "{ir}");
        match kiln::schedule::inline_copies(&f) {
            Some((g, steps)) => {
                assert!(noalias);
                assert_eq!(steps.len(), 1, "{steps:?}");
                assert!(!g.to_string().contains("allocate T"), "{g}");
            }
            None => assert!(!noalias),
        }
    }
}
