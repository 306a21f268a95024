//! Float `max`/`min` reductions in integer-key form (`kiln::codegen::reduce`): compiled code
//! gives what the reference interpreter gives on the loop as written — bit for bit, NaN for
//! NaN — on NaN, ±0, ±inf, subnormals and random values, with and without TVM's in-loop
//! initialization, for constant and symbolic extents (0 included); and the lowering applies
//! exactly where its rule says.

mod common;

use kiln::codegen::reduce::lower_minmax_reductions;
use kiln::ir::builder::constant;
use kiln::ir::interp::{self, HostBuffer, InterpArg};
use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, PrimFunc, Stmt, StorageScope, Var};
use proptest::prelude::*;

/// How the reduction is written.
#[derive(Clone, Copy, Debug)]
struct Shape {
    is_max: bool,
    dtype: DataType,
    /// TVM's form: `if k == 0 { R[i] = init }` inside the loop.
    init: bool,
    /// `A`'s columns a shape variable rather than a constant.
    symbolic: bool,
    /// The element is `A[i, k]` on the left of `max(_, _)`.
    swapped: bool,
    noalias: bool,
}

/// `R[i] = max_k A[i, k]` (or `min`) over `cols` columns, for `rows` rows.
fn rowreduce(s: Shape, rows: i64, cols: i64) -> PrimFunc {
    let n = Var::new("n", DataType::i64());
    let cols_e = if s.symbolic {
        Expr::Var(n)
    } else {
        Expr::from(cols)
    };
    let a = Buffer::new("A", s.dtype, vec![Expr::from(rows), cols_e.clone()]);
    let r = Buffer::new("R", s.dtype, vec![Expr::from(rows)]);
    let i = Var::new("i", DataType::i64());
    let k = Var::new("k", DataType::i64());
    let (iv, kv) = (Expr::Var(i.clone()), Expr::Var(k.clone()));
    let acc = r.load(vec![iv.clone()]);
    let elem = a.load(vec![iv.clone(), kv.clone()]);
    let (x, y) = if s.swapped { (elem, acc) } else { (acc, elem) };
    let value = if s.is_max { x.max(y) } else { x.min(y) };
    let update = r.store(vec![iv.clone()], value);
    let body = if s.init {
        let lowest = constant(s.dtype, if s.is_max { -3.0e38 } else { 3.0e38 });
        Stmt::Seq(vec![
            Stmt::IfThenElse {
                cond: kv.eq_(Expr::from(0i64)),
                then_case: Box::new(r.store(vec![iv.clone()], lowest)),
                else_case: None,
            },
            update,
        ])
    } else {
        update
    };
    let inner = Stmt::For {
        var: k,
        min: Expr::from(0i64),
        extent: cols_e,
        kind: ForKind::Serial,
        body: Box::new(body),
    };
    let outer = Stmt::For {
        var: i,
        min: Expr::from(0i64),
        extent: Expr::from(rows),
        kind: ForKind::Serial,
        body: Box::new(inner),
    };
    PrimFunc::new("rowreduce", vec![Param::Buffer(a), Param::Buffer(r)], outer)
        .with_noalias(s.noalias)
}

fn lowered(f: &PrimFunc) -> bool {
    lower_minmax_reductions(f) != f.body
}

/// Bit patterns worth reducing over, as f64 (converted to the element type).
fn special(k: usize) -> f64 {
    const V: [f64; 12] = [
        f64::NAN,
        -f64::NAN,
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1.0e-310,
        -1.0e-310,
        3.0e38,
        -3.0e38,
        1.5,
        -2.5,
    ];
    V[k % V.len()]
}

/// `n` floats: element `i` is special value `k = i * step % modulus` where `k < 12`, else
/// `smooth(i)`.
fn with_specials(n: i64, step: i64, modulus: i64, smooth: impl Fn(f32) -> f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let k = (i * step % modulus) as usize;
            if k < 12 {
                special(k) as f32
            } else {
                smooth(i as f32)
            }
        })
        .collect()
}

fn host(dtype: DataType, shape: &[i64], vals: &[f64]) -> HostBuffer {
    if dtype == DataType::f32() {
        let v: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
        HostBuffer::from_slice(shape, &v)
    } else {
        HostBuffer::from_slice(shape, vals)
    }
}

/// Compiled against interpreted: each element of `R` bit for bit, or both NaN.
fn check(s: Shape, rows: i64, cols: i64, a: &[f64], r0: &[f64]) -> Result<(), TestCaseError> {
    let f = rowreduce(s, rows, cols);
    f.verify().unwrap();
    let bufs = vec![host(s.dtype, &[rows, cols], a), host(s.dtype, &[rows], r0)];
    let mut iargs: Vec<InterpArg> = bufs.iter().cloned().map(InterpArg::Buffer).collect();
    interp::run(&f, &mut iargs).unwrap();
    let want = iargs[1].buffer().unwrap();
    let got = common::run_jit(&f, &bufs);
    let eb = s.dtype.bytes();
    for row in 0..rows as usize {
        let g = HostBuffer {
            data: got[1][row * eb..(row + 1) * eb].to_vec(),
            shape: vec![1],
            ..want.clone()
        };
        let (gv, wv) = (g.get(0).unwrap(), want.get(row).unwrap());
        let both_nan = gv.as_f64().is_nan() && wv.as_f64().is_nan();
        prop_assert!(
            both_nan || g.data == want.data[row * eb..(row + 1) * eb],
            "row {row}: compiled {gv:?}, interpreted {wv:?} ({s:?}, {cols} columns)\n{f}"
        );
    }
    Ok(())
}

fn shapes() -> impl Strategy<Value = Shape> {
    (
        any::<bool>(),
        prop_oneof![Just(DataType::f32()), Just(DataType::f64())],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(is_max, dtype, init, symbolic, swapped)| Shape {
            is_max,
            dtype,
            init,
            symbolic,
            swapped,
            noalias: true,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random rows mixing special values and random ones, 0 to 70 columns (vector bodies,
    /// their tails, and loops that do not run).
    #[test]
    fn compiled_reductions_match_the_interpreter(
        s in shapes(),
        cols in 0i64..70,
        picks in proptest::collection::vec((0usize..24, -1.0e3f64..1.0e3), 4 * 70),
        start in 0usize..12,
    ) {
        prop_assert!(lowered(&rowreduce(s, 4, cols)));
        let a: Vec<f64> = picks
            .iter()
            .take((4 * cols) as usize)
            .map(|&(k, x)| if k < 12 { special(k) } else { x })
            .collect();
        // R's values before the loop: what a reduction without init starts from.
        let r0: Vec<f64> = (0..4).map(|k| special(start + 3 * k)).collect();
        check(s, 4, cols, &a, &r0)?;
    }
}

#[test]
fn nan_anywhere_wins_and_signed_zeros_are_ordered() {
    for dtype in [DataType::f32(), DataType::f64()] {
        for is_max in [true, false] {
            let s = Shape {
                is_max,
                dtype,
                init: true,
                symbolic: false,
                swapped: false,
                noalias: true,
            };
            // Row 0: a NaN last; row 1: a NaN first; row 2: -0 and +0 only; row 3: +0 then -0.
            let a = [
                1.0,
                2.0,
                3.0,
                f64::NAN,
                f64::NAN,
                1.0,
                2.0,
                3.0,
                -0.0,
                0.0,
                -0.0,
                -0.0,
                0.0,
                -0.0,
                0.0,
                0.0,
            ];
            check(s, 4, 4, &a, &[0.0; 4]).unwrap();
        }
    }
}

/// Where the rule does not hold, the loop is compiled as written.
#[test]
fn the_lowering_applies_only_where_its_rule_holds() {
    let base = Shape {
        is_max: true,
        dtype: DataType::f32(),
        init: true,
        symbolic: false,
        swapped: false,
        noalias: true,
    };
    assert!(lowered(&rowreduce(base, 4, 8)));
    // An output parameter of a function whose buffers may overlap.
    assert!(!lowered(&rowreduce(
        Shape {
            noalias: false,
            ..base
        },
        4,
        8
    )));
    // Integers: a plain max is already one instruction.
    assert!(!lowered(&rowreduce(
        Shape {
            dtype: DataType::i32(),
            init: false,
            ..base
        },
        4,
        8
    )));
    // The element reads the output.
    let f = rowreduce(base, 4, 8);
    let Stmt::For { body, .. } = &f.body else {
        unreachable!()
    };
    let Stmt::For {
        var: k,
        min,
        extent,
        body: inner,
        ..
    } = &**body
    else {
        unreachable!()
    };
    let Stmt::Seq(parts) = &**inner else {
        unreachable!()
    };
    let Stmt::Store {
        buffer, indices, ..
    } = &parts[1]
    else {
        unreachable!()
    };
    let reads_out = Stmt::Store {
        buffer: buffer.clone(),
        indices: indices.clone(),
        value: buffer
            .load(indices.clone())
            .max(buffer.load(vec![Expr::from(0i64)])),
    };
    let mk = |kind: ForKind, body: Stmt| {
        let inner = Stmt::For {
            var: k.clone(),
            min: min.clone(),
            extent: extent.clone(),
            kind,
            body: Box::new(body),
        };
        PrimFunc::new(
            "f",
            f.params.clone(),
            Stmt::For {
                var: Var::new("i", DataType::i64()),
                min: Expr::from(0i64),
                extent: Expr::from(4i64),
                kind: ForKind::Serial,
                body: Box::new(inner),
            },
        )
        .with_noalias(true)
    };
    assert!(!lowered(&mk(ForKind::Serial, reads_out)));
    // Not a serial loop.
    assert!(!lowered(&mk(ForKind::Unrolled, parts[1].clone())));
    // A local accumulator needs no `noalias`: softmax's row max, as the TVM bridge writes it.
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(8i64)]);
    let out = Buffer::new("O", DataType::f32(), vec![Expr::from(1i64)]);
    let acc = Buffer::temp(
        "acc",
        DataType::f32(),
        vec![Expr::from(1i64)],
        StorageScope::Local,
    );
    let z = vec![Expr::from(0i64)];
    let j = Var::new("j", DataType::i64());
    let body = acc.allocate(Stmt::Seq(vec![
        acc.store(z.clone(), constant(DataType::f32(), f64::NEG_INFINITY)),
        Stmt::For {
            var: j.clone(),
            min: Expr::from(0i64),
            extent: Expr::from(8i64),
            kind: ForKind::Serial,
            body: Box::new(acc.store(
                z.clone(),
                acc.load(z.clone()).max(a.load(vec![Expr::Var(j)])),
            )),
        },
        out.store(z.clone(), acc.load(z.clone())),
    ]));
    let g = PrimFunc::new("g", vec![Param::Buffer(a), Param::Buffer(out)], body);
    assert!(lowered(&g));
}

/// `R[i] = max over (k1, k2)` of `A[i, k1, k2]` (or `min`), `A`'s last two extents shape
/// variables, with TVM's initialization of a reduction over two loops
/// (`if k1 == 0 && k2 == 0`), or with one naming only `k2`, which resets `R[i]` at every `k1`.
fn window(is_max: bool, dtype: DataType, reset_per_row: bool) -> PrimFunc {
    let (n1, n2) = (
        Var::new("n1", DataType::i64()),
        Var::new("n2", DataType::i64()),
    );
    let a = Buffer::new(
        "A",
        dtype,
        vec![
            Expr::from(3i64),
            Expr::Var(n1.clone()),
            Expr::Var(n2.clone()),
        ],
    );
    let r = Buffer::new("R", dtype, vec![Expr::from(3i64)]);
    let (i, k1, k2) = (
        Var::new("i", DataType::i64()),
        Var::new("k1", DataType::i64()),
        Var::new("k2", DataType::i64()),
    );
    let (iv, k1v, k2v) = (
        Expr::Var(i.clone()),
        Expr::Var(k1.clone()),
        Expr::Var(k2.clone()),
    );
    let acc = r.load(vec![iv.clone()]);
    let elem = a.load(vec![iv.clone(), k1v.clone(), k2v.clone()]);
    let value = if is_max { acc.max(elem) } else { acc.min(elem) };
    let first = if reset_per_row {
        k2v.clone().eq_(Expr::from(0i64))
    } else {
        k1v.clone()
            .eq_(Expr::from(0i64))
            .and(k2v.clone().eq_(Expr::from(0i64)))
    };
    let body = Stmt::Seq(vec![
        Stmt::IfThenElse {
            cond: first,
            then_case: Box::new(r.store(vec![iv.clone()], constant(dtype, 7.0))),
            else_case: None,
        },
        r.store(vec![iv], value),
    ]);
    let nest = |var: Var, extent: Var, body: Stmt| Stmt::For {
        var,
        min: Expr::from(0i64),
        extent: Expr::Var(extent),
        kind: ForKind::Serial,
        body: Box::new(body),
    };
    let body = Stmt::For {
        var: i,
        min: Expr::from(0i64),
        extent: Expr::from(3i64),
        kind: ForKind::Serial,
        body: Box::new(nest(k1, n1, nest(k2, n2, body))),
    };
    PrimFunc::new("window", vec![Param::Buffer(a), Param::Buffer(r)], body).with_noalias(true)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Reductions over two loops (pooling windows), 0 to 4 steps each.
    #[test]
    fn window_reductions_match_the_interpreter(
        is_max in any::<bool>(),
        f64t in any::<bool>(),
        reset_per_row in any::<bool>(),
        n1 in 0i64..5,
        n2 in 0i64..5,
        picks in proptest::collection::vec((0usize..24, -1.0e3f64..1.0e3), 3 * 16),
    ) {
        let dtype = if f64t { DataType::f64() } else { DataType::f32() };
        let f = window(is_max, dtype, reset_per_row);
        f.verify().unwrap();
        prop_assert!(lowered(&f));
        let a: Vec<f64> = picks
            .iter()
            .take((3 * n1 * n2) as usize)
            .map(|&(k, x)| if k < 12 { special(k) } else { x })
            .collect();
        let bufs = vec![host(dtype, &[3, n1, n2], &a), host(dtype, &[3], &[-4.0, f64::NAN, -0.0])];
        let mut iargs: Vec<InterpArg> = bufs.iter().cloned().map(InterpArg::Buffer).collect();
        interp::run(&f, &mut iargs).unwrap();
        let want = iargs[1].buffer().unwrap();
        let got = common::run_jit(&f, &bufs);
        let eb = dtype.bytes();
        for row in 0..3 {
            let g = HostBuffer { data: got[1][row * eb..(row + 1) * eb].to_vec(), shape: vec![1], ..want.clone() };
            let (gv, wv) = (g.get(0).unwrap(), want.get(row).unwrap());
            prop_assert!(
                (gv.as_f64().is_nan() && wv.as_f64().is_nan()) || g.data == want.data[row * eb..(row + 1) * eb],
                "row {row}: compiled {gv:?}, interpreted {wv:?} ({n1} x {n2})\n{f}"
            );
        }
    }
}

/// `f(A, R)` (float32, `A` of `shape` holding `a`, `R` of `n` zeros) compiled and interpreted:
/// each element of `R` the same bits, or both NaN (`what` names the case in a failure).
fn same_as_interpreter(f: &PrimFunc, shape: &[i64], a: &[f32], n: i64, what: &str) {
    let bufs = vec![
        HostBuffer::from_slice(shape, a),
        HostBuffer::from_slice(&[n], &vec![0f32; n as usize]),
    ];
    let mut iargs: Vec<InterpArg> = bufs.iter().cloned().map(InterpArg::Buffer).collect();
    interp::run(f, &mut iargs).unwrap();
    let want = iargs[1].buffer().unwrap();
    let got = common::run_jit(f, &bufs);
    for c in 0..n as usize {
        let g = f32::from_le_bytes(got[1][4 * c..4 * c + 4].try_into().unwrap());
        let w = f32::from_le_bytes(want.data[4 * c..4 * c + 4].try_into().unwrap());
        assert!(
            (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits(),
            "output {c}: compiled {g:?}, interpreted {w:?} ({what})"
        );
    }
}

/// `R[j] = max_k A[k, j]` (TVM's `max(A, axis=0)`, with its in-loop initialization): the
/// reduction runs down the columns, so each element it reads is a row away from the last.
fn colreduce(is_max: bool, rows: i64, cols: i64) -> PrimFunc {
    let a = Buffer::new(
        "A",
        DataType::f32(),
        vec![Expr::from(rows), Expr::from(cols)],
    );
    let r = Buffer::new("R", DataType::f32(), vec![Expr::from(cols)]);
    let j = Var::new("j", DataType::i64());
    let k = Var::new("k", DataType::i64());
    let (jv, kv) = (Expr::Var(j.clone()), Expr::Var(k.clone()));
    let acc = r.load(vec![jv.clone()]);
    let elem = a.load(vec![kv.clone(), jv.clone()]);
    let value = if is_max { acc.max(elem) } else { acc.min(elem) };
    let lowest = constant(DataType::f32(), if is_max { -3.0e38 } else { 3.0e38 });
    let body = Stmt::Seq(vec![
        Stmt::IfThenElse {
            cond: kv.eq_(Expr::from(0i64)),
            then_case: Box::new(r.store(vec![jv.clone()], lowest)),
            else_case: None,
        },
        r.store(vec![jv], value),
    ]);
    let inner = Stmt::For {
        var: k,
        min: Expr::from(0i64),
        extent: Expr::from(rows),
        kind: ForKind::Serial,
        body: Box::new(body),
    };
    let outer = Stmt::For {
        var: j,
        min: Expr::from(0i64),
        extent: Expr::from(cols),
        kind: ForKind::Serial,
        body: Box::new(inner),
    };
    PrimFunc::new("colreduce", vec![Param::Buffer(a), Param::Buffer(r)], outer).with_noalias(true)
}

/// A column reduction is moved inside out (`codegen::interchange`: the columns innermost,
/// loaded a vector at a time) before the integer-key lowering could take it, whose vectors
/// along `k` gathered an element per row (TOPI's `max(A, axis=0)` at 0.82x TVM's time, now
/// 2.9x, Zen 3); its results are still the interpreter's, bit for bit, NaN for NaN.
#[test]
fn column_reductions_are_interchanged_and_match_the_interpreter() {
    for is_max in [true, false] {
        let (rows, cols) = (13, 37);
        let f = colreduce(is_max, rows, cols);
        f.verify().unwrap();
        let a = with_specials(rows * cols, 7, 29, |i| (i * 0.37).sin() * 100.0);
        same_as_interpreter(&f, &[rows, cols], &a, cols, &format!("max: {is_max}"));
        // The optimized code loads `A` a vector at a time and inserts no element into one.
        use kiln::packed_func::Module;
        let m = kiln::codegen::llvm::LlvmModule::jit(
            &kiln::ir::IRModule::from_functions(vec![f.clone()]),
            &kiln::codegen::llvm::CodegenOptions::host(),
        )
        .unwrap();
        let ll = m.get_source("ll").unwrap();
        assert!(ll.contains("x float>, <"), "no vector load:\n{ll}");
        assert!(!ll.contains("insertelement <"), "a gather:\n{ll}");
    }
}

/// `R[x] = max_s A[2 x + s]` over a window of 3 (or `min`), TVM's initialization: a stride-2
/// pooling row of `w` outputs, which `codegen::interchange` vectorizes across `x`.
fn strided_pool(is_max: bool, w: i64) -> PrimFunc {
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(2 * w + 1)]);
    let r = Buffer::new("R", DataType::f32(), vec![Expr::from(w)]);
    let x = Var::new("x", DataType::i64());
    let k = Var::new("k", DataType::i64());
    let (xv, kv) = (Expr::Var(x.clone()), Expr::Var(k.clone()));
    let acc = r.load(vec![xv.clone()]);
    let elem = a.load(vec![xv.clone() * Expr::from(2i64) + kv.clone()]);
    let value = if is_max { acc.max(elem) } else { acc.min(elem) };
    let body = Stmt::Seq(vec![
        Stmt::IfThenElse {
            cond: kv.eq_(Expr::from(0i64)),
            then_case: Box::new(r.store(vec![xv.clone()], constant(DataType::f32(), -3.0e38))),
            else_case: None,
        },
        r.store(vec![xv], value),
    ]);
    let inner = Stmt::For {
        var: k,
        min: Expr::from(0i64),
        extent: Expr::from(3i64),
        kind: ForKind::Serial,
        body: Box::new(body),
    };
    let outer = Stmt::For {
        var: x,
        min: Expr::from(0i64),
        extent: Expr::from(w),
        kind: ForKind::Serial,
        body: Box::new(inner),
    };
    PrimFunc::new(
        "strided_pool",
        vec![Param::Buffer(a), Param::Buffer(r)],
        outer,
    )
    .with_noalias(true)
}

/// Stride-2 pooling rows, vectorized across their outputs with IEEE max/min lane by lane: NaN
/// for NaN and the signed zeros ordered as the interpreter orders them, for rows of 4 to 23.
#[test]
fn strided_pools_match_the_interpreter_on_special_values() {
    for is_max in [true, false] {
        for w in [4, 7, 8, 16, 19, 23] {
            let f = strided_pool(is_max, w);
            f.verify().unwrap();
            let n = 2 * w + 1;
            let a = with_specials(n, 5, 17, |i| (i * 0.61).cos() * 10.0);
            same_as_interpreter(&f, &[n], &a, w, &format!("{w} outputs, max: {is_max}"));
        }
    }
}
