//! Helpers shared by the `ir_*` tests: snapshot files with `KILN_BLESS=1`, and a function that
//! uses every IR construct.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kiln::ir::builder::*;
use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, PrimFunc, Stmt, StorageScope, Var};

/// `tests/ir/<rel>` (or any path relative to the crate root when it starts with `examples/`).
pub fn data_path(rel: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if rel.starts_with("examples/") {
        root.join(rel)
    } else {
        root.join("tests/ir").join(rel)
    }
}

/// Compares `actual` with the file; with `KILN_BLESS=1` rewrites the file instead.
pub fn check_snapshot(rel: &str, actual: &str) {
    let path = data_path(rel);
    if std::env::var("KILN_BLESS").is_ok_and(|v| v == "1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected != actual {
        panic!(
            "snapshot {} differs (- expected, + actual); rerun with KILN_BLESS=1 to update it:\n{}",
            path.display(),
            diff(&expected, actual)
        );
    }
}

/// A line diff: `-` lines only in `a`, `+` lines only in `b`, two lines of context.
pub fn diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    // Longest common subsequence table.
    let mut l = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            l[i][j] = if a[i] == b[j] {
                l[i + 1][j + 1] + 1
            } else {
                l[i + 1][j].max(l[i][j + 1])
            };
        }
    }
    let mut ops = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || l[i + 1][j] >= l[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    let near = |k: usize| {
        ops[k.saturating_sub(2)..(k + 3).min(ops.len())]
            .iter()
            .any(|(c, _)| *c != ' ')
    };
    let mut out = String::new();
    let mut skipped = false;
    for (k, (c, line)) in ops.iter().enumerate() {
        if near(k) {
            if skipped {
                out.push_str("@@ ... @@\n");
                skipped = false;
            }
            out.push_str(&format!("{c}{line}\n"));
        } else {
            skipped = true;
        }
    }
    out
}

/// A function that uses every expression, statement, loop kind, scope and most types.
pub fn all_constructs() -> PrimFunc {
    let n = Var::new("n", DataType::i32());
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(&n), Expr::from(4i64)])
        .with_strides(vec![Expr::from(4i64), Expr::from(1i64)]);
    let h = Buffer::new("H", DataType::f16(), vec![Expr::from(8i64)]);
    let x = Var::new("x", DataType::i32());
    let flag = Var::new("flag", DataType::bool());
    let xe = Expr::from(&x);
    let i64t = DataType::i64();

    let ints = Stmt::Seq(vec![
        Stmt::Evaluate(xe.clone().floordiv(3).floormod(-2) + (xe.clone() / 2) % 5 - xe.clone() * 7),
        Stmt::Evaluate(xe.clone().min(1).max(-1).cast(DataType::u8())),
        Stmt::Evaluate(
            Expr::from(&flag)
                .and(xe.clone().lt(1))
                .or(!xe.clone().le(2)),
        ),
        Stmt::Evaluate(
            xe.clone()
                .gt(3)
                .and(xe.clone().ge(4))
                .and(xe.clone().eq_(5))
                .and(xe.clone().ne_(6)),
        ),
        Stmt::Evaluate(int(DataType::u64(), -1)),
        Stmt::Evaluate(int(DataType::i8(), -128)),
        Stmt::Evaluate(abs(xe.clone())),
        Stmt::Evaluate(let_expr("y", xe.clone() + 1, |y| y.clone() * y)),
    ]);
    let f = |v: f32| Expr::from(v);
    let maths = Stmt::Seq(vec![
        Stmt::Evaluate(exp(f(1.0)) + log(f(2.0)) + sqrt(f(4.0)) + rsqrt(f(4.0))),
        Stmt::Evaluate(tanh(f(0.5)) + sigmoid(f(0.5)) + pow(f(2.0), f(3.0)) + abs(f(-1.5))),
        Stmt::Evaluate(f(2.5).cast(DataType::i32()) + f(-2.5).cast_unsaturated(DataType::i32())),
        Stmt::Evaluate(
            floor(f(1.5))
                + ceil(f(1.5))
                + round(f(2.5))
                + erf(f(0.5))
                + fma(f(1.0), f(2.0), f(3.0)),
        ),
        Stmt::Evaluate(select(
            Expr::from(&flag),
            Expr::from(f64::INFINITY),
            Expr::from(f64::NAN),
        )),
        Stmt::Evaluate(constant(DataType::bf16(), -0.5) + constant(DataType::bf16(), 1.0e-3)),
    ]);
    let loops = for_range("i", Expr::from(&n).cast(i64t), ForKind::Parallel, |i| {
        let tmp = Buffer::temp(
            "T",
            DataType::f32(),
            vec![Expr::from(4i64)],
            StorageScope::Local,
        );
        let body = Stmt::Seq(vec![
            for_range("j", Expr::from(4i64), ForKind::Vectorized, |j| {
                tmp.store([j.clone()], a.load([i.clone(), j]) * 2.0f32)
            }),
            for_range("j", Expr::from(4i64), ForKind::Unrolled, |j| {
                a.store(&[i.clone(), j.clone()], tmp.load(&[j]) + 1.0f32)
            }),
        ]);
        tmp.allocate(body)
    });
    // Workspace shapes are variables or constants: bind the length first.
    let ws_block = let_stmt("len", Expr::from(&n).cast(i64t), |len| {
        let ws = Buffer::temp(
            "W",
            DataType::f16(),
            vec![len.clone()],
            StorageScope::Workspace,
        );
        ws.allocate(for_range("k", len, ForKind::Serial, |k| {
            ws.store(
                [k.clone()],
                h.load(&[k.floormod(8i64)]) * constant(DataType::f16(), 0.5),
            )
        }))
    });
    let control = Stmt::Seq(vec![
        Stmt::Assert {
            cond: Expr::from(&n).ge(0),
            message: "n must be non-negative".into(),
        },
        if_then_else(
            Expr::from(&flag),
            Stmt::Return(xe.clone()),
            Some(Stmt::Evaluate(Expr::from(0i32))),
        ),
        if_then_else(xe.clone().eq_(0), Stmt::Return(Expr::from(1i32)), None),
        Stmt::While {
            cond: xe.clone().lt(0),
            body: Box::new(Stmt::Return(Expr::from(3i32))),
        },
        Stmt::Return(Expr::from(2i32)),
    ]);
    PrimFunc::new(
        "constructs",
        vec![
            Param::Buffer(a),
            Param::Scalar(x),
            Param::Scalar(flag),
            Param::Buffer(h),
        ],
        Stmt::Seq(vec![ints, maths, loops, ws_block, control]),
    )
    .with_noalias(true)
    .with_ret_type(DataType::i32())
}
