//! Lowering shared by the CPU code generators: a reduction nest moved outside the innermost
//! spatial loop around it, so that the spatial loop is the one LLVM vectorizes.
//!
//! An unscheduled reduction (TVM's lowering of `C[i, j] = sum_k A[i, k] * B[k, j]`, of a
//! convolution, of a pooling window) runs its reduction loops innermost. A float reduction
//! cannot be vectorized without reassociating the sum, which changes the result, so LLVM
//! leaves the loop scalar: one dependent add per element. The spatial loop around it is
//! independent per element, and when it is innermost its accesses are contiguous:
//!
//! ```text
//! for j in [m, m + n) { X[.., j] = init; for k.. { X[.., j] = X[.., j] + e } }
//!     ==  for j' in [m, m + n) { X[.., j'] = init[j := j'] };
//!         for k.. { for j in [m, m + n) { X[.., j] = X[.., j] + e } }
//! ```
//!
//! Each element `X[.., j]` is initialized and then updated by the same values in the same order
//! of `k` as before, so the result is the same, bit for bit; only updates of different
//! elements interleave. The rule (all of it, else the nest is left as it is):
//! - `j` is a serial loop of at least [`MIN_LANES`] iterations with constant bounds, whose body
//!   is a reduction nest (serial or unrolled loops, each the only statement of the one outside
//!   it, with bounds free of `j`), optionally preceded by the initialization (as
//!   `codegen::peel` leaves TVM's reductions);
//! - the nest's innermost body is one store `X[I] = v` whose indices `I` use none of the nest's
//!   loops, use `j` only in the last one, as `j` plus a term without `j`, and `X` is contiguous
//!   there; the initialization stores to the same `X[I]` a value that reads no `X`;
//! - `v` reads `X` only at `I` and calls nothing external, and every other load in `v` is free
//!   of `j` or contiguous in `j` in the same way (so the vector loop needs no gather);
//! - `X` is allocated in the function, or the function is `noalias` (so no load reads an alias
//!   of `X`, whose values the new order would change).

use std::collections::{HashMap, HashSet};

use crate::ir::visit::{walk_expr, Visitor};
use crate::ir::{BinOp, Buffer, Expr, ForKind, PrimFunc, Stmt, Var, VarId};

/// The fewest iterations of the spatial loop for which the nest is moved.
pub const MIN_LANES: i64 = 4;

/// `body` (of `f`) with every reduction nest that follows the rule (module docs) moved inside
/// out.
pub fn interchange_reductions(f: &PrimFunc, body: &Stmt) -> Stmt {
    let mut allocated = HashSet::new();
    collect_allocations(body, &mut allocated);
    let unaliased = |b: &Buffer| f.attrs.noalias || allocated.contains(&b.data.id);
    rewrite(body, &unaliased)
}

fn collect_allocations(s: &Stmt, out: &mut HashSet<VarId>) {
    struct Alloc<'a>(&'a mut HashSet<VarId>);
    impl Visitor for Alloc<'_> {
        fn allocate(&mut self, buffer: &Buffer) {
            self.0.insert(buffer.data.id);
        }
    }
    Visitor::stmt(&mut Alloc(out), s);
}

fn rewrite(s: &Stmt, unaliased: &dyn Fn(&Buffer) -> bool) -> Stmt {
    if let Some(r) = interchanged(s, unaliased) {
        return r;
    }
    s.map_children(|c| rewrite(c, unaliased))
}

/// `s` interchanged, if it is a spatial loop around a reduction nest that follows the rule.
fn interchanged(s: &Stmt, unaliased: &dyn Fn(&Buffer) -> bool) -> Option<Stmt> {
    let Stmt::For {
        var: j,
        min,
        extent,
        kind: ForKind::Serial,
        body,
    } = s
    else {
        return None;
    };
    if !matches!(min, Expr::IntImm { .. }) || extent.as_int().is_none_or(|n| n < MIN_LANES) {
        return None;
    }
    let (init, nest) = match body.as_ref() {
        Stmt::Seq(items) if items.len() == 2 => (Some(&items[0]), &items[1]),
        nest @ Stmt::For { .. } => (None, nest),
        _ => return None,
    };
    // The reduction nest, outermost first, and its innermost body.
    let mut loops: Vec<(&Var, &Expr, &Expr, ForKind)> = Vec::new();
    let mut cur = nest;
    while let Stmt::For {
        var,
        min,
        extent,
        kind,
        body,
    } = cur
    {
        if !matches!(kind, ForKind::Serial | ForKind::Unrolled)
            || min.mentions(j)
            || extent.mentions(j)
        {
            return None;
        }
        loops.push((var, min, extent, *kind));
        cur = body;
    }
    if loops.is_empty() {
        return None;
    }
    let Stmt::Store {
        buffer: x,
        indices,
        value,
    } = cur
    else {
        return None;
    };
    let (last, outer) = indices.split_last()?;
    if !unaliased(x)
        || !contiguous_last(x)
        || !unit_stride(last, j)
        || outer.iter().any(|e| e.mentions(j))
        || indices
            .iter()
            .any(|e| loops.iter().any(|(v, ..)| e.mentions(v)))
    {
        return None;
    }
    if !value_ok(value, x, indices, j) {
        return None;
    }
    if let Some(init) = init {
        let Stmt::Store {
            buffer,
            indices: init_indices,
            value: init_value,
        } = init
        else {
            return None;
        };
        if buffer.data.id != x.data.id
            || init_indices != indices
            || reads(init_value, x)
            || calls_extern(init_value)
        {
            return None;
        }
    }
    // The new nest: the reduction loops around the spatial loop around the update.
    let mut inner = spatial_loop(j, min, extent, cur);
    for (var, lo, n, kind) in loops.iter().rev() {
        inner = Stmt::For {
            var: (*var).clone(),
            min: (*lo).clone(),
            extent: (*n).clone(),
            kind: *kind,
            body: Box::new(inner),
        };
    }
    let Some(init) = init else {
        return Some(inner);
    };
    // The initialization gets a loop of its own, over a fresh variable, vectorized as the
    // update is: vectors stored the width they are loaded (a wide load of narrower stores
    // cannot be forwarded from the store buffer; with LLVM's 256-bit stores of the zeros and
    // kiln's 512-bit loads of the sums, a grouped convolution ran at a third of the speed).
    let j2 = Var::new(&format!("{}_init", j.name), j.dtype);
    let map = HashMap::from([(j.id, Expr::Var(j2.clone()))]);
    let init_loop = spatial_loop(
        &j2,
        min,
        extent,
        &crate::ir::rewrite::subst_stmt(init, &map),
    );
    Some(Stmt::Seq(vec![init_loop, inner]))
}

/// The widest vector the spatial loop is split for: 16 lanes, one AVX-512 register of
/// `float32` (two AVX2 ones).
pub const MAX_LANES: i64 = 16;

/// `for j in [min, min + extent) { update }` as the innermost loop of the new nest: when a
/// power of two `w` of 4 to [`MAX_LANES`] lanes divides the extent (the largest such), a
/// vectorized loop of `w` lanes (inside a serial loop over the `extent / w` vectors, where
/// there are several), which kiln's emitter writes as vector code, so the updates of one
/// vector stay in registers across the unrolled reduction loops; else a serial loop for LLVM's
/// vectorizer.
fn spatial_loop(j: &Var, min: &Expr, extent: &Expr, update: &Stmt) -> Stmt {
    let n = extent.as_int().unwrap_or(0);
    let w = if n > 0 {
        (1i64 << n.trailing_zeros()).min(MAX_LANES)
    } else {
        0
    };
    if w < MIN_LANES {
        return Stmt::For {
            var: j.clone(),
            min: min.clone(),
            extent: extent.clone(),
            kind: ForKind::Serial,
            body: Box::new(update.clone()),
        };
    }
    if w == n {
        return Stmt::For {
            var: j.clone(),
            min: min.clone(),
            extent: extent.clone(),
            kind: ForKind::Vectorized,
            body: Box::new(update.clone()),
        };
    }
    let t = j.dtype;
    let c = |v: i64| Expr::IntImm { dtype: t, value: v };
    let outer = Var::new(&format!("{}_o", j.name), t);
    let lane = Var::new(&format!("{}_v", j.name), t);
    let mut index = Expr::binary(
        BinOp::Add,
        Expr::binary(BinOp::Mul, Expr::Var(outer.clone()), c(w)),
        Expr::Var(lane.clone()),
    );
    if min.as_int() != Some(0) {
        index = Expr::binary(BinOp::Add, min.clone(), index);
    }
    let map = HashMap::from([(j.id, index)]);
    Stmt::For {
        var: outer,
        min: c(0),
        extent: c(n / w),
        kind: ForKind::Serial,
        body: Box::new(Stmt::For {
            var: lane,
            min: c(0),
            extent: c(w),
            kind: ForKind::Vectorized,
            body: Box::new(crate::ir::rewrite::subst_stmt(update, &map)),
        }),
    }
}

/// Whether `b`'s last dimension is contiguous (no strides, or a last stride of 1).
fn contiguous_last(b: &Buffer) -> bool {
    match &b.strides {
        None => true,
        Some(s) => s.last().and_then(Expr::as_int) == Some(1),
    }
}

/// Whether `e` is `var`, or `var + t` / `t + var` / `var - t` with `t` free of `var`
/// (recursively).
pub(crate) fn unit_stride(e: &Expr, var: &Var) -> bool {
    match e {
        Expr::Var(v) => v.id == var.id,
        Expr::Binary {
            op: BinOp::Add,
            a,
            b,
        } => (unit_stride(a, var) && !b.mentions(var)) || (unit_stride(b, var) && !a.mentions(var)),
        Expr::Binary {
            op: BinOp::Sub,
            a,
            b,
        } => unit_stride(a, var) && !b.mentions(var),
        _ => false,
    }
}

/// Whether the update's value follows the rule: `X` read only at `at`, nothing external, every
/// other load free of `j` or contiguous in it.
fn value_ok(v: &Expr, x: &Buffer, at: &[Expr], j: &Var) -> bool {
    struct Scan<'a> {
        x: &'a Buffer,
        at: &'a [Expr],
        j: &'a Var,
        ok: bool,
    }
    impl Visitor for Scan<'_> {
        fn expr(&mut self, e: &Expr) {
            match e {
                Expr::Load { buffer, indices } if buffer.data.id == self.x.data.id => {
                    self.ok &= indices.as_slice() == self.at;
                }
                Expr::Load { buffer, indices } => {
                    if let Some((last, outer)) = indices.split_last() {
                        let free = !last.mentions(self.j);
                        self.ok &= outer.iter().all(|i| !i.mentions(self.j))
                            && (free || (unit_stride(last, self.j) && contiguous_last(buffer)));
                    }
                }
                Expr::CallExtern { .. } => self.ok = false,
                _ => {}
            }
            walk_expr(self, e);
        }
    }
    let mut s = Scan { x, at, j, ok: true };
    s.expr(v);
    s.ok
}

fn reads(e: &Expr, x: &Buffer) -> bool {
    struct Find<'a>(&'a Buffer, bool);
    impl Visitor for Find<'_> {
        fn expr(&mut self, e: &Expr) {
            if let Expr::Load { buffer, .. } = e {
                self.1 |= buffer.data.id == self.0.data.id;
            }
            walk_expr(self, e);
        }
    }
    let mut f = Find(x, false);
    f.expr(e);
    f.1
}

fn calls_extern(e: &Expr) -> bool {
    struct Find(bool);
    impl Visitor for Find {
        fn expr(&mut self, e: &Expr) {
            self.0 |= matches!(e, Expr::CallExtern { .. });
            walk_expr(self, e);
        }
    }
    let mut f = Find(false);
    f.expr(e);
    f.0
}
