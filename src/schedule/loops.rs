//! Primitives that change the loop structure: split, tile, reorder, fuse, partition, fission.

use std::collections::HashMap;

use super::{for_, guard, imm, parts, Schedule, ScheduleError, ScheduleResult};
use crate::ir::rewrite::{self, subst_stmt};
use crate::ir::{BinOp, Expr, ForKind, Stmt, Var};

impl Schedule {
    /// The body of [`Schedule::split`] (which records it in the trace).
    pub(super) fn split_untraced(
        &mut self,
        name: &str,
        factor: i64,
    ) -> ScheduleResult<(String, String)> {
        if factor < 1 {
            return Err(self.form("split", format!("needs a factor >= 1, found {factor}")));
        }
        let on = self.fresh(&format!("{name}_o"), &[]);
        let inn = self.fresh(&format!("{name}_i"), std::slice::from_ref(&on));
        let (o2, i2) = (on.clone(), inn.clone());
        let func = self.func.name.clone();
        self.edit(name, &mut |s, _| {
            let (var, min, extent, kind, body) = parts(s);
            let t = var.dtype;
            // A factor above a constant extent: one outer iteration of the whole extent (an
            // inner loop of `factor` iterations, nearly all guarded off, would only cost).
            let factor = match extent.as_int() {
                Some(e) if e >= 1 => factor.min(e),
                _ => factor,
            };
            if t.bits < 64 && factor > i64::from(i32::MAX) {
                return Err(ScheduleError::Form {
                    func: func.clone(),
                    primitive: "split",
                    message: format!(
                        "needs a factor that fits the loop variable's type {t}, found {factor}"
                    ),
                });
            }
            let vo = Var::new(&o2, t);
            let vi = Var::new(&i2, t);
            let idx = Expr::binary(
                BinOp::Add,
                Expr::binary(BinOp::Mul, Expr::Var(vo.clone()), imm(t, factor)),
                Expr::Var(vi.clone()),
            );
            let full = rewrite::fold(Expr::binary(BinOp::Add, min.clone(), idx.clone()));
            let map = HashMap::from([(var.id, full)]);
            let mut nb = subst_stmt(body, &map);
            nb = rewrite::simplify_divmod(&nb, &HashMap::from([(vi.id, (0, factor))]));
            let outer_ext = match extent.as_int() {
                Some(e) if e % factor == 0 => imm(t, e / factor),
                Some(e) => {
                    nb = guard(idx.clone().lt(extent.clone()), nb);
                    // ceil(e / factor), without the overflow of e + factor - 1.
                    imm(
                        t,
                        e.div_euclid(factor) + i64::from(e.rem_euclid(factor) != 0),
                    )
                }
                None => {
                    nb = guard(idx.clone().lt(extent.clone()), nb);
                    (extent.clone() + imm(t, factor - 1)).floordiv(imm(t, factor))
                }
            };
            let inner = sink_guards(for_(vi, imm(t, 0), imm(t, factor), ForKind::Serial, nb));
            Ok(for_(vo, imm(t, 0), outer_ext, kind, inner))
        })?;
        Ok((on, inn))
    }

    /// Splits `a` by `fa` and `b` by `fb` (`b` nested in `a`) and orders the loops
    /// `a_o, b_o, a_i, b_i`, returning those four names.
    ///
    /// # Errors
    /// As [`split`](Self::split) and [`reorder`](Self::reorder).
    pub fn tile(&mut self, a: &str, b: &str, fa: i64, fb: i64) -> ScheduleResult<[String; 4]> {
        let (ao, ai) = self.split(a, fa)?;
        let (bo, bi) = self.split(b, fb)?;
        self.reorder(&[&ao, &bo, &ai, &bi])?;
        Ok([ao, bo, ai, bi])
    }

    /// The body of [`Schedule::reorder`] (which records it in the trace).
    pub(super) fn reorder_untraced(&mut self, order: &[&str]) -> ScheduleResult<()> {
        let names = self.names();
        let Some(first) = names.iter().find(|n| order.contains(&n.as_str())).cloned() else {
            return Err(self.form("reorder", format!("found none of the loops {order:?}")));
        };
        let err = self.form(
            "reorder",
            format!("needs the loops {order:?} in one perfect nest (each loop's body the next loop), with independent bounds"),
        );
        let mut failed = false;
        self.edit(&first, &mut |s, _| {
            // Collect the chain down to the last named loop.
            let mut chain: Vec<(Var, Expr, Expr, ForKind)> = Vec::new();
            let mut cur = s;
            let mut seen = 0;
            while let Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } = cur
            {
                chain.push((var.clone(), min.clone(), extent.clone(), *kind));
                if order.contains(&&*var.name) {
                    seen += 1;
                }
                cur = body;
                if seen == order.len() {
                    break;
                }
            }
            let inner_body = cur.clone();
            let indep = chain.iter().all(|(_, mn, ex, _)| {
                chain
                    .iter()
                    .all(|(v, ..)| !mn.mentions(v) && !ex.mentions(v))
            });
            if seen != order.len() || !indep {
                failed = true;
                return Ok(s.clone());
            }
            let mut named = order.iter().map(|n| {
                chain
                    .iter()
                    .find(|(v, ..)| &*v.name == *n)
                    .cloned()
                    .expect("seen")
            });
            let new_chain: Vec<_> = chain
                .iter()
                .map(|l| {
                    if order.contains(&&*l.0.name) {
                        named.next().expect("same count")
                    } else {
                        l.clone()
                    }
                })
                .collect();
            Ok(new_chain
                .into_iter()
                .rev()
                .fold(inner_body, |b, (v, mn, ex, k)| for_(v, mn, ex, k, b)))
        })?;
        if failed {
            return Err(err);
        }
        Ok(())
    }

    /// The body of [`Schedule::fuse`] (which records it in the trace).
    pub(super) fn fuse_untraced(&mut self, outer: &str, inner: &str) -> ScheduleResult<String> {
        let name = self.fresh(&format!("{outer}_{inner}"), &[]);
        let mut bad = None;
        let n2 = name.clone();
        self.edit(outer, &mut |s, _| {
            let (vo, mo, eo, kind, body) = parts(s);
            let Stmt::For {
                var: vi,
                min: mi,
                extent: ei,
                body: ib,
                ..
            } = body
            else {
                bad = Some("needs the inner loop to be the whole body of the outer loop");
                return Ok(s.clone());
            };
            if &*vi.name != inner || mi.mentions(vo) || ei.mentions(vo) {
                bad = Some("needs the inner loop, with bounds independent of the outer loop, as the outer loop's body");
                return Ok(s.clone());
            }
            let t = vo.dtype;
            let ei = if ei.dtype() == t {
                ei.clone()
            } else {
                ei.clone().cast(t)
            };
            let f = Var::new(&n2, t);
            let fo = Expr::Var(f.clone()).floordiv(ei.clone());
            let fi = Expr::Var(f.clone()).floormod(ei.clone());
            let fi = if vi.dtype == t { fi } else { fi.cast(vi.dtype) };
            let map = HashMap::from([
                (vo.id, rewrite::fold(mo.clone() + fo)),
                (vi.id, rewrite::fold(mi.clone() + fi)),
            ]);
            let ext = match (eo.as_int(), ei.as_int()) {
                (Some(a), Some(b)) => imm(t, a * b),
                _ => eo.clone() * ei.clone(),
            };
            Ok(for_(f, imm(t, 0), ext, kind, subst_stmt(ib, &map)))
        })?;
        match bad {
            Some(m) => Err(self.form("fuse", m)),
            None => Ok(name),
        }
    }

    /// The body of [`Schedule::partition`] (which records it in the trace).
    pub(super) fn partition_untraced(
        &mut self,
        name: &str,
        at: i64,
    ) -> ScheduleResult<HashMap<String, String>> {
        let mut renamed: Vec<(String, String)> = Vec::new();
        let mut problem: Option<String> = None;
        let me = self.clone();
        self.edit(name, &mut |s, _| {
            let (var, min, extent, kind, body) = parts(s);
            let (Some(lo), Some(ext)) = (min.as_int(), extent.as_int()) else {
                problem = Some(format!("needs loop `{name}` to have constant bounds"));
                return Ok(s.clone());
            };
            if at <= 0 || at >= ext {
                problem = Some(format!(
                    "needs 0 < at < {ext} (the extent of `{name}`), found at = {at}"
                ));
                return Ok(s.clone());
            }
            struct Binds(bool);
            impl crate::ir::visit::Visitor for Binds {
                fn stmt(&mut self, st: &Stmt) {
                    self.0 |= matches!(st, Stmt::Allocate { .. } | Stmt::Let { .. });
                    crate::ir::visit::walk_stmt(self, st);
                }
                fn expr(&mut self, _: &Expr) {}
            }
            let mut binds = Binds(false);
            crate::ir::visit::Visitor::stmt(&mut binds, body);
            if binds.0 {
                problem = Some(format!(
                    "needs the body of `{name}` free of allocations and lets (partition it \
                     before cache_write and the like)"
                ));
                return Ok(s.clone());
            }
            let t = var.dtype;
            let second = me.fresh(&format!("{name}_p"), &[]);
            let mut taken = vec![second.clone()];
            renamed.push((name.to_owned(), second.clone()));
            let v = Var::new(&second, t);
            let shifted = Expr::Var(v.clone()) + imm(t, lo + at);
            let copy = subst_stmt(body, &HashMap::from([(var.id, shifted)]));
            let copy = rename_loops(&copy, &me, &mut taken, &mut renamed);
            Ok(Stmt::Seq(vec![
                for_(var.clone(), min.clone(), imm(t, at), kind, body.clone()),
                for_(v, imm(t, 0), imm(t, ext - at), kind, copy),
            ]))
        })?;
        match problem {
            Some(m) => Err(self.form("partition", m)),
            None => Ok(renamed.into_iter().collect()),
        }
    }

    /// The body of [`Schedule::fission`] (which records it in the trace).
    pub(super) fn fission_untraced(&mut self, name: &str) -> ScheduleResult<Vec<String>> {
        let mut out = Vec::new();
        let mut bad = false;
        let me = self.clone();
        self.edit(name, &mut |s, _| {
            let (var, min, extent, kind, body) = parts(s);
            // A guard around the sequence guards each statement.
            let distributed;
            let stmts = match body {
                Stmt::Seq(stmts) => stmts,
                Stmt::IfThenElse {
                    cond,
                    then_case,
                    else_case: None,
                } if matches!(&**then_case, Stmt::Seq(_)) => {
                    let Stmt::Seq(v) = &**then_case else {
                        unreachable!("matched")
                    };
                    distributed = v
                        .iter()
                        .map(|st| sink_guards(guard(cond.clone(), st.clone())))
                        .collect::<Vec<_>>();
                    &distributed
                }
                _ => {
                    bad = true;
                    return Ok(s.clone());
                }
            };
            let mut loops = Vec::new();
            for (k, st) in stmts.iter().enumerate() {
                let n = if k == 0 {
                    name.to_owned()
                } else {
                    me.fresh(&format!("{name}_{k}"), &out)
                };
                let v = Var::new(&n, var.dtype);
                let map = HashMap::from([(var.id, Expr::Var(v.clone()))]);
                loops.push(for_(
                    v,
                    min.clone(),
                    extent.clone(),
                    kind,
                    subst_stmt(st, &map),
                ));
                out.push(n);
            }
            Ok(Stmt::Seq(loops))
        })?;
        if bad {
            return Err(self.form(
                "fission",
                format!("needs loop `{name}` to have a sequence as its body"),
            ));
        }
        Ok(out)
    }
}

/// Moves guards without `else` inward through loops (`if c { for x { b } }` becomes
/// `for x { if c { b } }`) and merges nested guards, so split loops stay perfect nests.
fn sink_guards(s: Stmt) -> Stmt {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => for_(var, min, extent, kind, sink_guards(*body)),
        Stmt::IfThenElse {
            cond,
            then_case,
            else_case: None,
        } => match *then_case {
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => for_(var, min, extent, kind, sink_guards(guard(cond, *body))),
            Stmt::IfThenElse {
                cond: c2,
                then_case: t2,
                else_case: None,
            } => sink_guards(guard(cond.and(c2), *t2)),
            other => guard(cond, other),
        },
        other => other,
    }
}

/// `s` with every loop given a fresh variable named `<name>_p` (or the first free `<name>_p_1`,
/// ... among the schedule's loops and `taken`); the renames are appended to `renamed`.
fn rename_loops(
    s: &Stmt,
    sched: &Schedule,
    taken: &mut Vec<String>,
    renamed: &mut Vec<(String, String)>,
) -> Stmt {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => {
            let n = sched.fresh(&format!("{}_p", var.name), taken);
            taken.push(n.clone());
            renamed.push((var.name.to_string(), n.clone()));
            let v = Var::new(&n, var.dtype);
            let body = subst_stmt(body, &HashMap::from([(var.id, Expr::Var(v.clone()))]));
            for_(
                v,
                min.clone(),
                extent.clone(),
                *kind,
                rename_loops(&body, sched, taken, renamed),
            )
        }
        other => other.map_children(|c| rename_loops(c, sched, taken, renamed)),
    }
}

impl Schedule {
    /// The body of [`Schedule::decompose_reduction`] (which records it in the trace).
    pub(super) fn decompose_reduction_untraced(&mut self, name: &str) -> ScheduleResult<()> {
        let mut problem: Option<String> = None;
        self.edit(name, &mut |s, _| {
            // The chain of perfectly nested loops from `name` down to the one whose body is
            // `seq { if cond { init }; rest.. }`.
            let mut chain: Vec<(&Var, &Expr, &Expr)> = Vec::new();
            let mut cur = s;
            let (init, cond, rest) = loop {
                match cur {
                    Stmt::For {
                        var,
                        min,
                        extent,
                        body,
                        ..
                    } => {
                        chain.push((var, min, extent));
                        cur = body;
                    }
                    Stmt::Seq(v) => match v.split_first() {
                        Some((
                            Stmt::IfThenElse {
                                cond,
                                then_case,
                                else_case: None,
                            },
                            rest,
                        )) if !rest.is_empty() => break (&**then_case, cond, rest),
                        _ => {
                            problem = Some(
                                "needs the innermost body to start with `if <loops> == <min> \
                                 { init }` followed by the update"
                                    .into(),
                            );
                            return Ok(s.clone());
                        }
                    },
                    _ => {
                        problem = Some(
                            "needs a chain of loops ending in a body `if <loops> == <min> \
                             { init }; update`"
                                .into(),
                        );
                        return Ok(s.clone());
                    }
                }
            };
            // `cond` must be exactly `v == min` for every loop of the chain, and the loops must
            // run at least once (the init runs once, before them, instead of in their first
            // iteration).
            let parts = cond.conjuncts();
            let mut covered = vec![false; chain.len()];
            for c in &parts {
                let hit = match c {
                    Expr::Binary {
                        op: BinOp::Eq,
                        a,
                        b,
                    } => chain.iter().position(|(v, mn, _)| {
                        let is_v = |e: &Expr| matches!(e, Expr::Var(w) if w.id == v.id);
                        let is_min = |e: &Expr| e.as_int().is_some() && e.as_int() == mn.as_int();
                        (is_v(a) && is_min(b)) || (is_v(b) && is_min(a))
                    }),
                    _ => None,
                };
                match hit {
                    Some(p) if !covered[p] => covered[p] = true,
                    _ => {
                        problem = Some(format!(
                            "needs the init's condition to be `<loop> == <min>` for each loop \
                             from `{name}` inward and nothing else, found `{c}`"
                        ));
                        return Ok(s.clone());
                    }
                }
            }
            if let Some(p) = covered.iter().position(|c| !c) {
                problem = Some(format!(
                    "needs the init's condition to test loop `{}` (every loop from `{name}` \
                     inward); decompose at the outermost reduction loop",
                    chain[p].0.name
                ));
                return Ok(s.clone());
            }
            if let Some((v, ..)) = chain
                .iter()
                .find(|(_, _, ex)| ex.as_int().is_none_or(|e| e < 1))
            {
                problem = Some(format!(
                    "needs loop `{}` to have a constant extent of at least 1",
                    v.name
                ));
                return Ok(s.clone());
            }
            if let Some((v, ..)) = chain.iter().find(|(v, ..)| init.mentions(v)) {
                problem = Some(format!("needs the init not to use loop `{}`", v.name));
                return Ok(s.clone());
            }
            // Rebuild the chain without the guarded init.
            fn strip(s: &Stmt, rest: &[Stmt]) -> Stmt {
                match s {
                    Stmt::For { .. } => s.map_children(|b| strip(b, rest)),
                    _ if rest.len() == 1 => rest[0].clone(),
                    _ => Stmt::Seq(rest.to_vec()),
                }
            }
            Ok(Stmt::Seq(vec![init.clone(), strip(s, rest)]))
        })?;
        match problem {
            Some(m) => Err(self.form("decompose_reduction", m)),
            None => Ok(()),
        }
    }
}
