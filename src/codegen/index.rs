//! Flat element offsets of contiguous buffers, shared by the code generators.
//!
//! A contiguous buffer's element `b[i0, ..., in]` is at `((i0 * e1 + i1) * e2 + ...) * en + in`
//! (the `e`s are its extents). A reshape written in TIR indexes its source by the pieces of one
//! flat position: `X[floordiv(x, 16), floormod(x, 16)]` over extents `[_, 16]`, so the offset is
//! `floordiv(x, 16) * 16 + floormod(x, 16)`, which is `x`. LLVM does not see that identity
//! through the sign corrections of floor division and the sums it is spread over, and vectorizes
//! such a copy with gathers instead of contiguous loads (a 4 x 4 x 256 reshape: 480 masked gathers
//! and 175 ms of compilation on an AVX-512 target, 3.5x TVM's run time).
//!
//! [`contiguous_dims`] merges such neighbouring dimensions before the offset is computed:
//! - `div(y, c)` over extent `e` followed by `mod(y, c)` over extents multiplying to the constant
//!   `c > 0` become `y` over extents `e, c`: `div(y, c) * c + mod(y, c) == y` for every `y`,
//!   for floor division and modulo (`floordiv`/`floormod`) as for truncating ones (`div`/`mod`),
//!   as long as both are of the same kind;
//! - `div(z, a * c)` followed by `mod(div(z, a), c)` become `div(z, a)`, since
//!   `div(div(z, a), c) == div(z, a * c)` for positive `a` and `c` (both kinds), so that the
//!   usual form of a reshape over three or more dimensions merges step by step;
//! - `div(x, c)` over extent `e` followed by `mod(x, c) * k + y` over extents multiplying to the
//!   constant `c * k` (`k > 0`; `y` anything, or absent) become `x * k + y` over extents
//!   `e, c * k`: `div(x, c) * c * k + mod(x, c) * k + y == x * k + y` for every `x` and `y`.
//!   A reshape that moves a split between dimensions (`[2, 8, ...]` read as `[4, 4, ...]`:
//!   `X[floordiv(a, 2), floormod(a, 2) * 4 + b]`) indexes its source this way, and merged, the
//!   offset `a * 4 + b` is affine in the loops (a contiguous copy, `llvm/emit/copy.rs`).
//!
//! The merged offset is the same integer as the original one (each index is widened to 64 bits
//! before it is scaled, as before), so the generated code reads the same element. Indices that
//! call external functions are never merged: two calls may return different values.

use std::borrow::Cow;

use crate::ir::{BinOp, Expr};

/// One dimension of a contiguous access after merging: its index and the extents the offset of
/// the dimensions before it is multiplied by (ignored for the first dimension).
pub(crate) struct Dim<'a> {
    /// The index (a new expression where a merge built one).
    pub index: Cow<'a, Expr>,
    /// The extents of the (merged) dimension, outermost first.
    pub extents: Vec<&'a Expr>,
}

/// The dimensions of the access `indices` into a contiguous buffer of `shape`, with neighbouring
/// dimensions merged where their indices split one value (see the module documentation).
pub(crate) fn contiguous_dims<'a>(indices: &'a [Expr], shape: &'a [Expr]) -> Vec<Dim<'a>> {
    let mut dims: Vec<Dim<'a>> = indices
        .iter()
        .zip(shape)
        .map(|(index, e)| Dim {
            index: Cow::Borrowed(index),
            extents: vec![e],
        })
        .collect();
    // Whether an in-bounds offset fits in 31 bits with room to spare, so that an index of a
    // 32-bit type scaled by a merge cannot overflow where the original pieces did not.
    let small = const_product(shape).is_some_and(|n| n <= 1 << 30);
    let mut k = 1;
    while k < dims.len() {
        let merged = const_product(dims[k].extents.iter().copied())
            .and_then(|c| merge(&dims[k - 1].index, &dims[k].index, c, small));
        match merged {
            Some(index) => {
                let lo = dims.remove(k);
                let hi = &mut dims[k - 1];
                hi.index = Cow::Owned(index);
                hi.extents.extend(lo.extents);
                // The merged dimension may split a value with the one before it.
                k = k.saturating_sub(1).max(1);
            }
            None => k += 1,
        }
    }
    dims
}

/// The product of constant extents, if they all are.
fn const_product<'e>(extents: impl IntoIterator<Item = &'e Expr>) -> Option<i64> {
    extents
        .into_iter()
        .try_fold(1i64, |p, e| e.as_int().and_then(|c| p.checked_mul(c)))
}

/// `y` when `hi` is `div(y, c)` and `lo` is `mod(y, c)`, or `div(z, a)` when `hi` is
/// `div(z, a * c)` and `lo` is `mod(div(z, a), c)` (divisions of one kind, positive constants),
/// or `x * k + y` when `hi` is `div(x, c / k)` and `lo` is `mod(x, c / k) * k + y`.
/// The last needs `small` (the buffer's offsets fit in 31 bits) unless `x` is 64-bit.
fn merge(hi: &Expr, lo: &Expr, c: i64, small: bool) -> Option<Expr> {
    merge_split(hi, lo, c)
        .cloned()
        .or_else(|| merge_scaled(hi, lo, c, small))
}

/// The first two rules of [`merge`].
fn merge_split<'a>(hi: &'a Expr, lo: &'a Expr, c: i64) -> Option<&'a Expr> {
    let (mod_op, y, lc) = split(lo)?;
    let div_op = div_of(mod_op)?;
    let (hop, y1, c1) = split(hi)?;
    if hop != div_op || lc != c || c <= 0 || !pure(y) {
        return None;
    }
    if y1 == y && c1 == c {
        return Some(y);
    }
    // `y` is itself `div(z, a)`: `div(z, a * c)` is `div(y, c)`.
    let (yop, z, a) = split(y)?;
    (yop == div_op && a > 0 && y1 == z && a.checked_mul(c) == Some(c1)).then_some(y)
}

/// The division matching a modulo: `FloorDiv` for `FloorMod`, `Div` for `Mod`.
fn div_of(mod_op: BinOp) -> Option<BinOp> {
    match mod_op {
        BinOp::FloorMod => Some(BinOp::FloorDiv),
        BinOp::Mod => Some(BinOp::Div),
        _ => None,
    }
}

/// `x * k + y` when `hi` is `div(x, d)` and `lo` is `mod(x, d) * k + y` (or `k * mod(x, d)`,
/// either order of the sum, or no `y`) with `d * k == c` and `d`, `k` positive; the product is
/// in `x`'s type, as the original offset's pieces are.
fn merge_scaled(hi: &Expr, lo: &Expr, c: i64, small: bool) -> Option<Expr> {
    // `lo` as `(scaled, y)`.
    let (scaled, y) = match lo {
        Expr::Binary {
            op: BinOp::Add,
            a,
            b,
        } if a.dtype().is_int() => {
            if scaled_mod(a).is_some() {
                (&**a, Some(&**b))
            } else {
                (&**b, Some(&**a))
            }
        }
        _ => (lo, None),
    };
    let (mod_op, x, d, k) = scaled_mod(scaled)?;
    let (hop, x1, d1) = split(hi)?;
    if Some(hop) != div_of(mod_op)
        || x1 != x
        || d1 != d
        || d <= 0
        || k <= 0
        || d.checked_mul(k) != Some(c)
        || !pure(x)
        || y.is_some_and(|y| !pure(y))
        || (x.dtype().bits < 64 && !small)
    {
        return None;
    }
    let t = x.dtype();
    let xk = if k == 1 {
        x.clone()
    } else {
        Expr::binary(BinOp::Mul, x.clone(), crate::ir::builder::int(t, k))
    };
    Some(match y {
        Some(y) if y.dtype() == t => Expr::binary(BinOp::Add, xk, y.clone()),
        Some(_) => return None,
        None => xk,
    })
}

/// `(op, x, d, k)` when `e` is `op(x, d) * k` or `k * op(x, d)` (or `op(x, d)`, `k` = 1) with
/// `op` a modulo and `d`, `k` constants.
fn scaled_mod(e: &Expr) -> Option<(BinOp, &Expr, i64, i64)> {
    let (m, k) = match e {
        Expr::Binary {
            op: BinOp::Mul,
            a,
            b,
        } => match (a.as_int(), b.as_int()) {
            (None, Some(k)) => (&**a, k),
            (Some(k), None) => (&**b, k),
            _ => return None,
        },
        _ => (e, 1),
    };
    let (op, x, d) = split(m)?;
    div_of(op)?;
    Some((op, x, d, k))
}

/// `(op, a, c)` when `e` is the integer operation `op(a, c)` with a constant `c`.
fn split(e: &Expr) -> Option<(BinOp, &Expr, i64)> {
    match e {
        Expr::Binary { op, a, b } if a.dtype().is_int() => Some((*op, a, b.as_int()?)),
        _ => None,
    }
}

/// Whether `e` calls no external function (two evaluations give the same value).
fn pure(e: &Expr) -> bool {
    match e {
        Expr::IntImm { .. } | Expr::FloatImm { .. } | Expr::Var(_) => true,
        Expr::CallExtern { .. } => false,
        Expr::Binary { a, b, .. } => pure(a) && pure(b),
        Expr::Not(a) | Expr::Cast { value: a, .. } | Expr::Reinterpret { value: a, .. } => pure(a),
        Expr::Select { cond, t, f } | Expr::IfThenElse { cond, t, f } => {
            pure(cond) && pure(t) && pure(f)
        }
        Expr::Load { indices, .. } => indices.iter().all(pure),
        Expr::Let { value, body, .. } => pure(value) && pure(body),
        Expr::Call { args, .. } => args.iter().all(pure),
    }
}

/// Whether `e` reads memory (a load, or an external call): an index that comes from the
/// caller's data, which the generated code checks against the buffer's extent.
pub(crate) fn reads_memory(e: &Expr) -> bool {
    use crate::ir::visit::{walk_expr, Visitor};
    struct Find(bool);
    impl Visitor for Find {
        fn expr(&mut self, e: &Expr) {
            match e {
                Expr::Load { .. } | Expr::CallExtern { .. } => self.0 = true,
                _ => walk_expr(self, e),
            }
        }
    }
    let mut f = Find(false);
    f.expr(e);
    f.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{builder::int, DataType, Var};

    fn i32c(v: i64) -> Expr {
        int(DataType::i32(), v)
    }

    fn indices_of(dims: &[Dim<'_>]) -> Vec<Expr> {
        dims.iter().map(|d| d.index.clone().into_owned()).collect()
    }

    #[test]
    fn a_floor_split_of_one_value_merges() {
        let x: Expr = Var::new("x", DataType::i32()).into();
        let idx = [x.clone().floordiv(i32c(16)), x.clone().floormod(i32c(16))];
        let shape = [i32c(16), i32c(16)];
        let dims = contiguous_dims(&idx, &shape);
        assert_eq!(indices_of(&dims), vec![x]);
        assert_eq!(dims[0].extents.len(), 2);
    }

    #[test]
    fn three_dimensions_of_one_value_merge_step_by_step() {
        let x: Expr = Var::new("x", DataType::i32()).into();
        let idx = [
            x.clone().floordiv(i32c(256)),
            x.clone().floordiv(i32c(16)).floormod(i32c(16)),
            x.clone().floormod(i32c(16)),
        ];
        let shape = [i32c(4), i32c(16), i32c(16)];
        let dims = contiguous_dims(&idx, &shape);
        assert_eq!(indices_of(&dims), vec![x]);
        assert_eq!(dims[0].extents.len(), 3);
    }

    #[test]
    fn a_split_moved_between_dimensions_merges_into_an_affine_index() {
        let a: Expr = Var::new("a", DataType::i32()).into();
        let b: Expr = Var::new("b", DataType::i32()).into();
        let x: Expr = Var::new("x", DataType::i32()).into();
        // X[2, 8, 16, 16] read as [4, 4, 256]: X[a / 2, a % 2 * 4 + b, x / 16, x % 16].
        let idx = [
            a.clone().floordiv(i32c(2)),
            a.clone().floormod(i32c(2)) * i32c(4) + b.clone(),
            x.clone().floordiv(i32c(16)),
            x.clone().floormod(i32c(16)),
        ];
        let shape = [i32c(2), i32c(8), i32c(16), i32c(16)];
        let dims = contiguous_dims(&idx, &shape);
        assert_eq!(
            indices_of(&dims),
            vec![a.clone() * i32c(4) + b.clone(), x.clone()]
        );
        // Every (a, b, x): the merged offset is the original one.
        let off = |a: i64, b: i64, x: i64| -> [i64; 2] {
            let orig = (((a / 2) * 8 + (a % 2) * 4 + b) * 16 + x / 16) * 16 + x % 16;
            let merged = (a * 4 + b) * 256 + x;
            [orig, merged]
        };
        for a in 0..4 {
            for b in 0..4 {
                for x in 0..256 {
                    let [o, m] = off(a, b, x);
                    assert_eq!(o, m);
                }
            }
        }
        // The product alone (no `y`), the scale first, the sum the other way round.
        for lo in [
            i32c(4) * a.clone().floormod(i32c(2)),
            b.clone() + a.clone().floormod(i32c(2)) * i32c(4),
        ] {
            let idx = [a.clone().floordiv(i32c(2)), lo];
            assert_eq!(contiguous_dims(&idx, &[i32c(2), i32c(8)]).len(), 1);
        }
        // Mismatches: another divisor, a product that is not the extent, truncating division
        // with floor modulo, a buffer too large for a 32-bit product.
        let cases = [
            [
                a.clone().floordiv(i32c(4)),
                a.clone().floormod(i32c(2)) * i32c(4) + b.clone(),
            ],
            [
                a.clone().floordiv(i32c(2)),
                a.clone().floormod(i32c(2)) * i32c(2) + b.clone(),
            ],
            [
                Expr::binary(BinOp::Div, a.clone(), i32c(2)),
                a.clone().floormod(i32c(2)) * i32c(4) + b.clone(),
            ],
        ];
        for idx in &cases {
            assert_eq!(
                contiguous_dims(idx, &[i32c(2), i32c(8)]).len(),
                2,
                "{idx:?}"
            );
        }
        let big = [
            a.clone().floordiv(i32c(2)),
            a.clone().floormod(i32c(2)) * i32c(4) + b.clone(),
            x.clone(),
        ];
        assert_eq!(
            contiguous_dims(&big, &[i32c(2), i32c(8), i32c(1 << 28)]).len(),
            3
        );
    }

    #[test]
    fn mismatches_stay_apart() {
        let x: Expr = Var::new("x", DataType::i32()).into();
        let y: Expr = Var::new("y", DataType::i32()).into();
        let shape = [i32c(8), i32c(16)];
        let cases = [
            // Another extent.
            [x.clone().floordiv(i32c(8)), x.clone().floormod(i32c(8))],
            // Another value.
            [x.clone().floordiv(i32c(16)), y.clone().floormod(i32c(16))],
            // Truncating division with floor modulo.
            [
                Expr::binary(BinOp::Div, x.clone(), i32c(16)),
                x.clone().floormod(i32c(16)),
            ],
        ];
        for idx in &cases {
            assert_eq!(contiguous_dims(idx, &shape).len(), 2, "{idx:?}");
        }
        // A symbolic extent.
        let n: Expr = Var::new("n", DataType::i32()).into();
        let idx = [x.clone().floordiv(n.clone()), x.clone().floormod(n.clone())];
        assert_eq!(contiguous_dims(&idx, &[i32c(4), n]).len(), 2);
    }

    /// `e` with the variables `vars` bound to `vals` (integer arithmetic of the forms the merges
    /// see: floor and truncating division and modulo, sums and products).
    fn eval(e: &Expr, vars: &[Var], vals: &[i64]) -> i64 {
        match e {
            Expr::IntImm { value, .. } => *value,
            Expr::Var(v) => vals[vars.iter().position(|w| w.id == v.id).unwrap()],
            Expr::Binary { op, a, b } => {
                let (x, y) = (eval(a, vars, vals), eval(b, vars, vals));
                match op {
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div => x / y,
                    BinOp::Mod => x % y,
                    BinOp::FloorDiv => x.div_euclid(y) - i64::from(y < 0 && x.rem_euclid(y) != 0),
                    BinOp::FloorMod => {
                        x - y * (x.div_euclid(y) - i64::from(y < 0 && x.rem_euclid(y) != 0))
                    }
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        }
    }

    /// The flat offset of `dims` (each merged dimension's index scaled by the extents after it).
    fn offset(dims: &[Dim<'_>], vars: &[Var], vals: &[i64]) -> i64 {
        let mut off = 0i64;
        for (d, dim) in dims.iter().enumerate() {
            if d > 0 {
                for e in &dim.extents {
                    off *= e.as_int().unwrap();
                }
            }
            off += eval(&dim.index, vars, vals);
        }
        off
    }

    proptest::proptest! {
        /// Whatever the indices (the forms a reshape writes, near misses, floor or truncating
        /// division, any constants) and whatever the variables' values (negative ones too),
        /// the merged dimensions give the original offset.
        #[test]
        fn merging_never_changes_an_offset(
            forms in proptest::collection::vec(
                (0usize..6, 0usize..2, 0usize..3, 1i64..5, 1i64..5, proptest::bool::ANY),
                2..5,
            ),
            // Per dimension: an extent, or (`None`) the one its index's own split fills
            // exactly (`d * k`, `d`), which is when the merges apply.
            extents in proptest::collection::vec(proptest::option::of(1i64..9), 5),
            vals in proptest::collection::vec(-40i64..40, 3),
        ) {
            let vars: Vec<Var> = ["a", "b", "c"].iter().map(|n| Var::new(n, DataType::i32())).collect();
            let v = |i: usize| -> Expr { vars[i].clone().into() };
            let indices: Vec<Expr> = forms
                .iter()
                .map(|&(form, x, y, d, k, floor)| {
                    let (dop, mop) = if floor { (BinOp::FloorDiv, BinOp::FloorMod) } else { (BinOp::Div, BinOp::Mod) };
                    let dv = Expr::binary(dop, v(x), i32c(d));
                    let mv = Expr::binary(mop, v(x), i32c(d));
                    match form {
                        0 => v(x),
                        1 => dv,
                        2 => mv,
                        3 => mv * i32c(k) + v(y),
                        4 => v(y) + i32c(k) * mv,
                        _ => Expr::binary(mop, dv, i32c(k)),
                    }
                })
                .collect();
            let shape: Vec<Expr> = forms
                .iter()
                .zip(&extents)
                .map(|(&(form, _, _, d, k, _), e)| {
                    i32c(e.unwrap_or(match form {
                        3 | 4 => d * k,
                        2 => d,
                        5 => k,
                        _ => 4,
                    }))
                })
                .collect();
            let plain: Vec<Dim<'_>> = indices
                .iter()
                .zip(&shape)
                .map(|(i, e)| Dim { index: Cow::Borrowed(i), extents: vec![e] })
                .collect();
            let merged = contiguous_dims(&indices, &shape);
            proptest::prop_assert_eq!(offset(&merged, &vars, &vals), offset(&plain, &vars, &vals));
        }
    }
}
