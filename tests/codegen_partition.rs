//! Loops split at their `if_then_else` bounds (`kiln::codegen::partition`): compiled code gives
//! the interpreter's results on the loop as written, every comparison form and bound (inside,
//! outside and across the iteration space, empty ranges), with a guarded load that would be out
//! of bounds outside the condition; nests split level by level; and the split applies exactly
//! where its rule says.

mod common;

use kiln::codegen::partition::partition_loops;
use kiln::ir::builder::{constant, if_then_else_expr};
use kiln::ir::interp::{self, HostBuffer, InterpArg};
use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, PrimFunc, Stmt, Var};
use proptest::prelude::*;

/// `lo <= i` written one of four ways.
fn lower_bound(form: u8, i: &Expr, lo: i64) -> Expr {
    match form % 4 {
        0 => i.clone().ge(Expr::from(lo)),
        1 => Expr::from(lo).le(i.clone()),
        2 => i.clone().gt(Expr::from(lo - 1)),
        _ => Expr::from(lo - 1).lt(i.clone()),
    }
}

/// `i < hi` written one of four ways.
fn upper_bound(form: u8, i: &Expr, hi: i64) -> Expr {
    match form % 4 {
        0 => i.clone().lt(Expr::from(hi)),
        1 => Expr::from(hi).gt(i.clone()),
        2 => i.clone().le(Expr::from(hi - 1)),
        _ => Expr::from(hi - 1).ge(i.clone()),
    }
}

/// `O[i] = if_then_else(lo <= i && i < hi [&& n > 3], A[i - lo], -1)` for `i` in `[0, n)`,
/// `A` holding exactly `hi - lo` elements (TVM's padding: the load is out of bounds wherever
/// the condition is false).
fn pad(lo: i64, hi: i64, forms: (u8, u8), with_rest: bool) -> PrimFunc {
    let n = Var::new("n", DataType::i64());
    let k = Var::new("k", DataType::i64());
    let a = Buffer::new("A", DataType::f32(), vec![Expr::Var(k)]);
    let o = Buffer::new("O", DataType::f32(), vec![Expr::Var(n.clone())]);
    let i = Var::new("i", DataType::i64());
    let iv = Expr::Var(i.clone());
    let mut cond = lower_bound(forms.0, &iv, lo).and(upper_bound(forms.1, &iv, hi));
    if with_rest {
        cond = cond.and(Expr::Var(n.clone()).gt(Expr::from(3i64)));
    }
    let value = if_then_else_expr(
        cond,
        a.load(vec![iv.clone() - Expr::from(lo)]),
        constant(DataType::f32(), -1.0),
    );
    let body = Stmt::For {
        var: i,
        min: Expr::from(0i64),
        extent: Expr::Var(n),
        kind: ForKind::Serial,
        body: Box::new(o.store(vec![iv], value)),
    };
    PrimFunc::new("pad", vec![Param::Buffer(a), Param::Buffer(o)], body)
}

fn split(f: &PrimFunc) -> bool {
    partition_loops(&f.body) != f.body
}

fn check(f: &PrimFunc, bufs: &[Vec<f32>], shapes: &[Vec<i64>]) -> Result<(), TestCaseError> {
    let mut iargs: Vec<InterpArg> = bufs
        .iter()
        .zip(shapes)
        .map(|(b, s)| InterpArg::Buffer(HostBuffer::from_slice(s, b)))
        .collect();
    let hosts: Vec<HostBuffer> = iargs.iter().map(|a| a.buffer().unwrap().clone()).collect();
    interp::run(f, &mut iargs).unwrap();
    let got = common::run_jit(f, &hosts);
    for (k, g) in got.iter().enumerate() {
        prop_assert_eq!(g, &iargs[k].buffer().unwrap().data, "buffer {}\n{}", k, f);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Bounds before, inside, after and across `[0, n)`, empty ranges, every comparison form.
    #[test]
    fn split_loops_match_the_interpreter(
        n in 0i64..40,
        lo in -5i64..45,
        len in -3i64..45,
        forms in (0u8..4, 0u8..4),
        with_rest in any::<bool>(),
    ) {
        let hi = lo + len;
        let f = pad(lo, hi, forms, with_rest);
        f.verify().unwrap();
        prop_assert!(split(&f));
        let k = (hi - lo).max(0);
        let a: Vec<f32> = (0..k).map(|x| x as f32 + 0.5).collect();
        let o = vec![7.0f32; n as usize];
        check(&f, &[a, o], &[vec![k], vec![n]])?;
    }
}

/// TVM's 2-D padding: `P[r, c] = if_then_else(1 <= r && r < R + 1 && 1 <= c && c < C + 1,
/// X[r - 1, c - 1], 0)`: the row loop splits, then the column loop inside its middle part.
#[test]
fn two_dimensional_padding_splits_level_by_level() {
    let (rows, cols) = (5i64, 7i64);
    let x = Buffer::new(
        "X",
        DataType::f32(),
        vec![Expr::from(rows), Expr::from(cols)],
    );
    let p = Buffer::new(
        "P",
        DataType::f32(),
        vec![Expr::from(rows + 2), Expr::from(cols + 2)],
    );
    let (r, c) = (
        Var::new("r", DataType::i64()),
        Var::new("c", DataType::i64()),
    );
    let (rv, cv) = (Expr::Var(r.clone()), Expr::Var(c.clone()));
    let cond = Expr::from(1i64)
        .le(rv.clone())
        .and(rv.clone().lt(Expr::from(rows + 1)))
        .and(Expr::from(1i64).le(cv.clone()))
        .and(cv.clone().lt(Expr::from(cols + 1)));
    let value = if_then_else_expr(
        cond,
        x.load(vec![
            rv.clone() - Expr::from(1i64),
            cv.clone() - Expr::from(1i64),
        ]),
        constant(DataType::f32(), 0.0),
    );
    let inner = Stmt::For {
        var: c,
        min: Expr::from(0i64),
        extent: Expr::from(cols + 2),
        kind: ForKind::Serial,
        body: Box::new(p.store(vec![rv, cv], value)),
    };
    let body = Stmt::For {
        var: r,
        min: Expr::from(0i64),
        extent: Expr::from(rows + 2),
        kind: ForKind::Serial,
        body: Box::new(inner),
    };
    let f = PrimFunc::new("pad2", vec![Param::Buffer(x), Param::Buffer(p)], body);
    f.verify().unwrap();
    let lowered = partition_loops(&f.body);
    let text = format!(
        "{}",
        PrimFunc::new("pad2", f.params.clone(), lowered.clone())
    );
    assert!(!text.contains("if_then_else"), "{text}");
    let xs: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
    let ps = vec![9.0f32; ((rows + 2) * (cols + 2)) as usize];
    check(&f, &[xs, ps], &[vec![rows, cols], vec![rows + 2, cols + 2]]).unwrap();
}

/// Where the rule does not hold, the loop is compiled as written.
#[test]
fn the_split_applies_only_where_its_rule_holds() {
    let i = Var::new("i", DataType::i64());
    let iv = Expr::Var(i.clone());
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(8i64)]);
    let o = Buffer::new("O", DataType::f32(), vec![Expr::from(8i64)]);
    let func = |cond: Expr, kind: ForKind| {
        let value = if_then_else_expr(
            cond,
            a.load(vec![iv.clone()]),
            constant(DataType::f32(), 0.0),
        );
        PrimFunc::new(
            "f",
            vec![Param::Buffer(a.clone()), Param::Buffer(o.clone())],
            Stmt::For {
                var: i.clone(),
                min: Expr::from(0i64),
                extent: Expr::from(8i64),
                kind,
                body: Box::new(o.store(vec![iv.clone()], value)),
            },
        )
    };
    assert!(split(&func(
        iv.clone().lt(Expr::from(4i64)),
        ForKind::Serial
    )));
    // Not a serial loop.
    assert!(!split(&func(
        iv.clone().lt(Expr::from(4i64)),
        ForKind::Parallel
    )));
    // A conjunct that uses `i` other than as a bound.
    assert!(!split(&func(
        iv.clone()
            .lt(Expr::from(4i64))
            .and((iv.clone() % Expr::from(2i64)).eq_(Expr::from(0i64))),
        ForKind::Serial
    )));
    // A disjunction.
    assert!(!split(&func(
        iv.clone()
            .lt(Expr::from(2i64))
            .or(iv.clone().gt(Expr::from(5i64))),
        ForKind::Serial
    )));
    // A bound read from memory (it may change inside the loop).
    assert!(!split(&func(
        iv.clone()
            .lt(o.load(vec![Expr::from(0i64)]).cast(DataType::i64())),
        ForKind::Serial
    )));
    // No condition on `i`.
    assert!(!split(&func(
        Expr::from(1i64).lt(Expr::from(4i64)),
        ForKind::Serial
    )));
}
