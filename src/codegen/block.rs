//! Lowering for CPUs: the copy loops of a transpose walk their source in blocks of a cache line.
//!
//! TVM's `transpose` (and `permute_dims`, which Relax's `nn.Linear` applies to its weight on every
//! call) is `for a { for b { Y[.., a, b] = X[.., b, a] } }`: the stores walk a row of `Y`, the
//! loads a column of `X`, one cache line per element. With a row of `X` a multiple of 512 bytes
//! apart, those lines fall into a few sets of the L1 cache and evict each other before the next
//! `a` comes back for their next element: a 384 x 128 transpose of GPT-2's weights took 1.3 ns an
//! element, every load from L2.
//!
//! [`block_strided_copies`] strip-mines `b` by the elements of a cache line (`T`, 16 `float32`)
//! and moves the block loop outside `a`: `for bo { for a { for bi in T { .. b = bo * T + bi
//! .. } } }`. While `a` walks, the loads touch `T` lines of `X`, each read for `T` consecutive
//! `a`, and the stores write `T` contiguous elements per row of `Y`.
//!
//! The rule (all of it, else the nest is left alone):
//! - the function is `noalias`, and the nest is two loops from 0 of constant extents, `a`
//!   (`serial` or `parallel`: the block loop then takes its threads) outside `b` (`serial`),
//!   whose body holds no loop, allocation, `let`, branch or effect but stores;
//! - `b`'s extent is a multiple of `T` and `a`'s at least `T`;
//! - every store indexes with `b` as its last index, alone, and no body load reads a buffer the
//!   body stores to (the iterations are independent, so their order is free);
//! - some load has `b` in an index other than its last and `a` as its last index, alone (the
//!   column walk that the blocking is for), from a buffer of at least 64 KiB (smaller ones stay
//!   in the L1 cache).
//!
//! Each element is computed by the same expression from the same inputs; only the order of the
//! iterations changes, so results are identical.

use crate::ir::visit::{walk_expr, walk_stmt, Visitor};
use crate::ir::{Expr, ForKind, PrimFunc, Stmt, Var, VarId};

/// `body` (of `f`) with its transposing copy nests blocked (see the module docs).
pub fn block_strided_copies(f: &PrimFunc, body: &Stmt) -> Stmt {
    if !f.attrs.noalias {
        return body.clone();
    }
    rewrite(body)
}

fn rewrite(s: &Stmt) -> Stmt {
    if let Some(b) = blocked(s) {
        return b;
    }
    s.map_children(rewrite)
}

fn blocked(s: &Stmt) -> Option<Stmt> {
    let (a, ea, outer_kind, inner) = counted_loop(s)?;
    let (b, eb, ForKind::Serial, body) = counted_loop(inner)? else {
        return None;
    };
    if !matches!(outer_kind, ForKind::Serial | ForKind::Parallel) {
        return None;
    }
    let t = line_elements(body)?;
    if eb % t != 0 || ea < t || !qualifies(&a, &b, body) {
        return None;
    }
    let bo = Var::new(&format!("{}_o", b.name), b.dtype);
    let bi = Var::new(&format!("{}_i", b.name), b.dtype);
    let int = |v: i64| crate::ir::builder::int(b.dtype, v);
    let mut map = std::collections::HashMap::new();
    map.insert(b.id, Expr::Var(bo.clone()) * int(t) + Expr::Var(bi.clone()));
    let body = crate::ir::rewrite::subst_stmt(body, &map);
    let for_ = |v: &Var, n: i64, kind: ForKind, body: Stmt| Stmt::For {
        var: v.clone(),
        min: crate::ir::builder::int(v.dtype, 0),
        extent: crate::ir::builder::int(v.dtype, n),
        kind,
        body: Box::new(body),
    };
    // A parallel `a` (`schedule::auto`) hands its threads to the blocks: they write disjoint
    // columns, as the rows of `a` were disjoint.
    Some(for_(
        &bo,
        eb / t,
        outer_kind,
        for_(&a, ea, ForKind::Serial, for_(&bi, t, ForKind::Serial, body)),
    ))
}

/// `for var in [0, extent) { body }` of constant extent: its variable, extent, kind and body.
fn counted_loop(s: &Stmt) -> Option<(Var, i64, ForKind, &Stmt)> {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } if min.as_int() == Some(0) => Some((var.clone(), extent.as_int()?, *kind, body)),
        _ => None,
    }
}

/// The elements of a 64-byte cache line, of the body's (first) store's type.
fn line_elements(body: &Stmt) -> Option<i64> {
    let bytes = match body {
        Stmt::Store { buffer, .. } => buffer.dtype.bytes(),
        Stmt::Seq(v) => match v.first()? {
            Stmt::Store { buffer, .. } => buffer.dtype.bytes(),
            _ => return None,
        },
        _ => return None,
    };
    (bytes > 0 && 64 % bytes == 0).then(|| 64 / bytes as i64)
}

/// The smallest source worth blocking: below an L1 data cache (32-48 KiB), every line the column
/// walk touches stays cached anyway, and the blocked loops only cost (the packed copies of
/// `codegen::interchange`, at most 32 KiB, made TOPI's `sum` 1.6x slower blocked).
const MIN_SOURCE_BYTES: i64 = 64 << 10;

/// The size of a buffer of constant shape, in bytes.
fn bytes(b: &crate::ir::Buffer) -> Option<i64> {
    b.shape
        .iter()
        .try_fold(b.dtype.bytes() as i64, |n, d| n.checked_mul(d.as_int()?))
}

fn is_var(e: &Expr, v: &Var) -> bool {
    matches!(e, Expr::Var(x) if x == v)
}

fn qualifies(a: &Var, b: &Var, body: &Stmt) -> bool {
    struct Scan<'v> {
        a: &'v Var,
        b: &'v Var,
        ok: bool,
        stored: Vec<VarId>,
        loaded: Vec<VarId>,
        column_walk: bool,
    }
    impl Visitor for Scan<'_> {
        fn stmt(&mut self, s: &Stmt) {
            match s {
                Stmt::Store {
                    buffer, indices, ..
                } => {
                    self.stored.push(buffer.data.id);
                    let last = indices.len().saturating_sub(1);
                    let ok = indices.last().is_some_and(|e| is_var(e, self.b))
                        && indices[..last].iter().all(|e| !e.mentions(self.b));
                    self.ok &= ok;
                }
                Stmt::Seq(_) => {}
                _ => self.ok = false,
            }
            walk_stmt(self, s);
        }
        fn expr(&mut self, e: &Expr) {
            match e {
                Expr::Load { buffer, indices } => {
                    self.loaded.push(buffer.data.id);
                    let last = indices.len().saturating_sub(1);
                    if indices.last().is_some_and(|e| is_var(e, self.a))
                        && indices[..last].iter().any(|e| e.mentions(self.b))
                        && bytes(buffer).is_some_and(|n| n >= MIN_SOURCE_BYTES)
                    {
                        self.column_walk = true;
                    }
                }
                Expr::CallExtern { .. } | Expr::Let { .. } => self.ok = false,
                _ => {}
            }
            walk_expr(self, e);
        }
    }
    let mut v = Scan {
        a,
        b,
        ok: true,
        stored: Vec::new(),
        loaded: Vec::new(),
        column_walk: false,
    };
    v.stmt(body);
    v.ok && v.column_walk && v.loaded.iter().all(|id| !v.stored.contains(id))
}
