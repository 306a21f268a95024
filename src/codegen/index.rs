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
//!   usual form of a reshape over three or more dimensions merges step by step.
//!
//! The merged offset is the same integer as the original one (each index is widened to 64 bits
//! before it is scaled, as before), so the generated code reads the same element. Indices that
//! call external functions are never merged: two calls may return different values.

use crate::ir::{BinOp, Expr};

/// One dimension of a contiguous access after merging: its index and the extents the offset of
/// the dimensions before it is multiplied by (ignored for the first dimension).
pub(crate) struct Dim<'a> {
    /// The index.
    pub index: &'a Expr,
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
            index,
            extents: vec![e],
        })
        .collect();
    let mut k = 1;
    while k < dims.len() {
        let merged = const_product(&dims[k].extents)
            .and_then(|c| merge(dims[k - 1].index, dims[k].index, c));
        match merged {
            Some(index) => {
                let lo = dims.remove(k);
                let hi = &mut dims[k - 1];
                hi.index = index;
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
fn const_product(extents: &[&Expr]) -> Option<i64> {
    extents
        .iter()
        .try_fold(1i64, |p, e| e.as_int().and_then(|c| p.checked_mul(c)))
}

/// `y` when `hi` is `div(y, c)` and `lo` is `mod(y, c)`, or `div(z, a)` when `hi` is
/// `div(z, a * c)` and `lo` is `mod(div(z, a), c)` (divisions of one kind, positive constants).
fn merge<'a>(hi: &'a Expr, lo: &'a Expr, c: i64) -> Option<&'a Expr> {
    let (mod_op, y, lc) = split(lo)?;
    let div_op = match mod_op {
        BinOp::FloorMod => BinOp::FloorDiv,
        BinOp::Mod => BinOp::Div,
        _ => return None,
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{builder::int, DataType, Var};

    fn i32c(v: i64) -> Expr {
        int(DataType::i32(), v)
    }

    fn indices_of(dims: &[Dim<'_>]) -> Vec<Expr> {
        dims.iter().map(|d| d.index.clone()).collect()
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
}
