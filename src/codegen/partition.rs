//! Lowering shared by the CPU code generators: loops split where an `if_then_else` condition
//! on the loop variable changes value (TVM's `LoopPartition`), so that each part runs one arm
//! without a branch.
//!
//! TVM's lowered padding reads `if_then_else(1 <= i && i < 17, X[i - 1], pad)`: only the chosen
//! arm is evaluated (the load is out of bounds where the condition is false), so compiled as
//! written it is a branch per element, and LLVM 14 keeps such a loop scalar (3.7x TVM's time on
//! TOPI's `pad`). Split at the bounds the condition puts on the loop variable, the loop becomes
//! three: before the bounds and after them the `else` arm alone, between them the `then` arm
//! (under what is left of the condition, which no longer depends on the loop variable).
//!
//! The rule: a serial loop over an integer variable `v` whose body holds an `if_then_else`
//! expression whose condition is a conjunction (`&&`) in which every conjunct that uses `v` is
//! `v` compared (`<`, `<=`, `>`, `>=`, either side) with a bound that does not use `v` or any
//! variable bound inside the loop, and reads no buffer and calls no external function. The
//! first such condition is taken; the parts are split again for the next one. Iterations keep
//! their order and each evaluates what it evaluated before, so the results are the same bit for
//! bit.

use crate::ir::builder::int;
use crate::ir::rewrite::{rw_stmt, Rewriter};
use crate::ir::visit::{walk_expr, Visitor};
use crate::ir::{BinOp, Expr, ForKind, Stmt, TypeCode, Var, VarId};

/// `s` with every serial loop that follows the rule (module docs) split.
pub fn partition_loops(s: &Stmt) -> Stmt {
    if let Stmt::For {
        var,
        min,
        extent,
        kind: ForKind::Serial,
        body,
    } = s
    {
        if var.dtype.code == TypeCode::Int && var.dtype.lanes == 1 {
            if let Some(split) = find_split(var, body) {
                return partition_loops(&split.apply(var, min, extent, body));
            }
        }
    }
    s.map_children(partition_loops)
}

/// A condition to split at: the `v`-range where its `v` conjuncts hold is `[lo, hi)`.
struct Split {
    cond: Expr,
    lo: Option<Expr>,
    hi: Option<Expr>,
    /// The conjuncts that do not use `v`.
    rest: Option<Expr>,
}

/// The first `if_then_else` condition in `body` that splits the loop over `v`.
fn find_split(v: &Var, body: &Stmt) -> Option<Split> {
    struct Find<'a> {
        v: &'a Var,
        inner: Vec<VarId>,
        found: Option<Split>,
    }
    impl Visitor for Find<'_> {
        fn expr(&mut self, e: &Expr) {
            if self.found.is_some() {
                return;
            }
            if let Expr::IfThenElse { cond, .. } = e {
                if let Some(s) = split_of(self.v, cond, &self.inner) {
                    self.found = Some(s);
                    return;
                }
            }
            walk_expr(self, e);
        }
    }
    // The variables bound inside the loop, all of them first (a bound may not use any).
    struct Bound<'a>(&'a mut Vec<VarId>);
    impl Visitor for Bound<'_> {
        fn bind(&mut self, var: &Var) {
            self.0.push(var.id);
        }
    }
    let mut inner = Vec::new();
    Bound(&mut inner).stmt(body);
    let mut f = Find {
        v,
        inner,
        found: None,
    };
    f.stmt(body);
    f.found
}

/// The split `cond` gives the loop over `v`, if it follows the rule.
fn split_of(v: &Var, cond: &Expr, inner: &[VarId]) -> Option<Split> {
    let uses_v = |e: &Expr| e.free_uses().vars.iter().any(|x| x.id == v.id);
    let is_v = |e: &Expr| matches!(e, Expr::Var(x) if x.id == v.id);
    let pure_bound = |e: &Expr| {
        let u = e.free_uses();
        u.buffers.is_empty()
            && !u.vars.iter().any(|x| x.id == v.id || inner.contains(&x.id))
            && !calls_extern(e)
    };
    let one = int(v.dtype, 1);
    let (mut lo, mut hi, mut rest): (Option<Expr>, Option<Expr>, Option<Expr>) = (None, None, None);
    for c in cond.conjuncts() {
        if !uses_v(c) {
            rest = Some(match rest {
                None => c.clone(),
                Some(r) => r.and(c.clone()),
            });
            continue;
        }
        let Expr::Binary { op, a, b } = c else {
            return None;
        };
        // `v op bound`, with the comparison turned around when `v` is on the right.
        let (op, bound) = if is_v(a) && pure_bound(b) {
            (*op, (**b).clone())
        } else if is_v(b) && pure_bound(a) {
            let flipped = match op {
                BinOp::Lt => BinOp::Gt,
                BinOp::Le => BinOp::Ge,
                BinOp::Gt => BinOp::Lt,
                BinOp::Ge => BinOp::Le,
                _ => return None,
            };
            (flipped, (**a).clone())
        } else {
            return None;
        };
        let (is_lo, edge) = match op {
            BinOp::Ge => (true, bound),
            BinOp::Gt => (true, bound + one.clone()),
            BinOp::Lt => (false, bound),
            BinOp::Le => (false, bound + one.clone()),
            _ => return None,
        };
        if is_lo {
            lo = Some(lo.map_or(edge.clone(), |l| l.max(edge)));
        } else {
            hi = Some(hi.map_or(edge.clone(), |h| h.min(edge)));
        }
    }
    if lo.is_none() && hi.is_none() {
        return None;
    }
    Some(Split {
        cond: cond.clone(),
        lo,
        hi,
        rest,
    })
}

fn calls_extern(e: &Expr) -> bool {
    struct Ext(bool);
    impl Visitor for Ext {
        fn expr(&mut self, e: &Expr) {
            if matches!(e, Expr::CallExtern { .. }) {
                self.0 = true;
            }
            walk_expr(self, e);
        }
    }
    let mut x = Ext(false);
    x.expr(e);
    x.0
}

/// Replaces each `if_then_else` on `cond` by the arm a part of the loop takes.
struct Resolve<'a> {
    cond: &'a Expr,
    /// The part's value of the condition's `v` conjuncts.
    inside: bool,
    rest: Option<&'a Expr>,
}

impl Rewriter for Resolve<'_> {
    fn post_expr(&mut self, e: Expr) -> Expr {
        match e {
            Expr::IfThenElse { cond, t, f } if *cond == *self.cond => {
                match (self.inside, self.rest) {
                    (false, _) => *f,
                    (true, None) => *t,
                    (true, Some(r)) => Expr::IfThenElse {
                        cond: Box::new(r.clone()),
                        t,
                        f,
                    },
                }
            }
            e => e,
        }
    }
}

impl Split {
    /// The loop over `v` from `min` for `extent` iterations with `body`, as three loops.
    fn apply(&self, v: &Var, min: &Expr, extent: &Expr, body: &Stmt) -> Stmt {
        let start = min.clone();
        let end = min.clone() + extent.clone();
        let clamp = |x: Expr| x.max(start.clone()).min(end.clone());
        let p1 = self.lo.clone().map_or(start.clone(), clamp);
        let p2 = match &self.hi {
            Some(h) => clamp(h.clone()).max(p1.clone()),
            None => end.clone(),
        };
        // Bounds folded to constants where they are (the emitter gives a loop of constant
        // length its own vector width).
        let part = |from: Expr, to: Expr, inside: bool| Stmt::For {
            var: v.clone(),
            min: crate::ir::rewrite::fold_all(&from),
            extent: crate::ir::rewrite::fold_all(&(to - from)),
            kind: ForKind::Serial,
            body: Box::new(rw_stmt(
                &mut Resolve {
                    cond: &self.cond,
                    inside,
                    rest: self.rest.as_ref(),
                },
                body,
            )),
        };
        let mut parts = Vec::new();
        if self.lo.is_some() {
            parts.push(part(start.clone(), p1.clone(), false));
        }
        parts.push(part(p1, p2.clone(), true));
        if self.hi.is_some() {
            parts.push(part(p2, end, false));
        }
        Stmt::Seq(parts)
    }
}
