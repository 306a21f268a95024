//! Lowering shared by the CPU code generators: the first-iteration guard of a serial loop
//! (TVM's form of every reduction's initialization) hoisted in front of the loop.
//!
//! TVM lowers `C[i] = sum_k e(k)` to `for k { if k == 0 { C[i] = 0 }; C[i] = C[i] + e(k) }`.
//! Compiled as written, the guard is a compare and a masked move of the accumulator in every
//! iteration, on the loop-carried chain of the reduction; LLVM 14 neither peels nor unswitches
//! it. The rule, which holds for every serial (or unrolled) loop:
//!
//! ```text
//! for k in [m, m + n) { if k == m && rest { A }; B }
//!     ==  if n > 0 { if rest[k := m] { A[k := m] } }; for k in [m, m + n) { B }
//! ```
//!
//! The same statements run in the same order: `A` (only ever run in the first iteration, where
//! `k` is `m`) now runs just before that iteration's `B`. Loops are handled inner first, so the
//! guard of a nest of reduction loops (`if k1 == 0 && k2 == 0`) climbs out of every loop it
//! names. The loop's `min` and `extent` must be constants or variables (evaluated again in
//! front of the loop, so they must not read memory); parallel, vectorized and thread-bound
//! loops are left alone, and so is a guard with an `else`.
//!
//! Kept in kiln's IR (not left to LLVM) so the rule is tested on its own and applies to every
//! CPU build: exported libraries, the JIT and the tuner's candidates.

use std::collections::HashMap;

use crate::ir::rewrite::subst_stmt;
use crate::ir::{BinOp, DataType, Expr, ForKind, Stmt, Var};

/// `s` with every first-iteration guard that follows the rule (module docs) hoisted out of its
/// loop.
pub fn hoist_first_iteration_guards(s: &Stmt) -> Stmt {
    let s = s.map_children(hoist_first_iteration_guards);
    let Stmt::For {
        var,
        min,
        extent,
        kind: kind @ (ForKind::Serial | ForKind::Unrolled),
        body,
    } = &s
    else {
        return s;
    };
    let pure = |e: &Expr| matches!(e, Expr::IntImm { .. } | Expr::Var(_));
    if !pure(min) || !pure(extent) {
        return s;
    }
    if matches!(extent, Expr::IntImm { value, .. } if *value <= 0) {
        return s;
    }
    let Stmt::Seq(items) = body.as_ref() else {
        return s;
    };
    let Some((
        Stmt::IfThenElse {
            cond,
            then_case,
            else_case: None,
        },
        rest_of_body,
    )) = items.split_first()
    else {
        return s;
    };
    if rest_of_body.is_empty() {
        return s;
    }
    let conjuncts = cond.conjuncts();
    let Some(at) = conjuncts
        .iter()
        .position(|c| is_first_iteration(c, var, min))
    else {
        return s;
    };
    let others: Vec<Expr> = conjuncts
        .iter()
        .enumerate()
        .filter(|(k, _)| *k != at)
        .map(|(_, c)| (*c).clone())
        .collect();
    let mut guarded = then_case.as_ref().clone();
    if let Some(c) = others.into_iter().reduce(|a, b| a.and(b)) {
        guarded = Stmt::IfThenElse {
            cond: c,
            then_case: Box::new(guarded),
            else_case: None,
        };
    }
    let map = HashMap::from([(var.id, min.clone())]);
    let mut hoisted = subst_stmt(&guarded, &map);
    if !matches!(extent, Expr::IntImm { .. }) {
        let zero = if extent.dtype() == DataType::i64() {
            Expr::from(0i64)
        } else {
            Expr::from(0i32)
        };
        hoisted = Stmt::IfThenElse {
            cond: Expr::binary(BinOp::Gt, extent.clone(), zero),
            then_case: Box::new(hoisted),
            else_case: None,
        };
    }
    let body = if rest_of_body.len() == 1 {
        rest_of_body[0].clone()
    } else {
        Stmt::Seq(rest_of_body.to_vec())
    };
    Stmt::Seq(vec![
        hoisted,
        Stmt::For {
            var: var.clone(),
            min: min.clone(),
            extent: extent.clone(),
            kind: *kind,
            body: Box::new(body),
        },
    ])
}

/// Whether `c` is `var == min` or `min == var`.
fn is_first_iteration(c: &Expr, var: &Var, min: &Expr) -> bool {
    let Expr::Binary {
        op: BinOp::Eq,
        a,
        b,
    } = c
    else {
        return false;
    };
    let is_var = |e: &Expr| matches!(e, Expr::Var(v) if v.id == var.id);
    (is_var(a) && b.as_ref() == min) || (is_var(b) && a.as_ref() == min)
}
