//! `compute_inline`: a buffer the function computes and then only reads, replaced at each read
//! by the expression that computed it (TVM's `compute_inline`), so that its loop nest and its
//! memory go away. TOPI's `conv2d_nchw` with no padding copies its whole input into `pad_temp`
//! first; inlined, the convolution reads the input itself.
//!
//! The producer must be a perfect loop nest at the top of the function's body (inside its
//! allocations only) whose one store writes every element once: each index its own loop from 0
//! over the whole dimension (or 0 for a dimension of extent 1). Its value may read only buffers
//! nothing in the function writes, so it gives the same result wherever it is evaluated.

use std::collections::HashMap;

use super::{Schedule, ScheduleResult, Step};
use crate::ir::rewrite::{self, rw_stmt, Rewriter};
use crate::ir::visit::{walk_expr, Visitor};
use crate::ir::{Buffer, Expr, Param, PrimFunc, Stmt, Var, VarId};

const P: &str = "compute_inline";

/// `f` with every buffer it allocates only to copy a parameter into unchanged (`pad_temp[0, c,
/// y, x] = X[0, c, y, x]`: TOPI's padding of a convolution with none) read in place instead
/// ([`Schedule::compute_inline`]), and the steps that did it; `None` where it has no such
/// copy. Only in a `noalias` function: the copy is a snapshot of the parameter, and reading
/// the parameter later gives the same values only when nothing the function writes is another
/// name for it.
pub fn inline_copies(f: &PrimFunc) -> Option<(PrimFunc, Vec<Step>)> {
    if !f.attrs.noalias {
        return None;
    }
    let copies = identity_copies(f);
    if copies.is_empty() {
        return None;
    }
    let mut s = Schedule::new(f.clone());
    for name in copies {
        let mut t = s.clone();
        if t.compute_inline(&name).is_ok() {
            s = t;
        }
    }
    let steps = s.trace().to_vec();
    let g = s.finish().ok()?;
    (!steps.is_empty()).then_some((g, steps))
}

/// The buffers `f` allocates whose producer ([`find_producer`]) stores a parameter's element
/// at the same indices, the two of the same shape and type.
fn identity_copies(f: &PrimFunc) -> Vec<String> {
    let mut names = Vec::new();
    rewrite::allocated(&f.body, &mut names);
    names.retain(|name| {
        let (
            Some(dst),
            Some((
                _,
                ix,
                Expr::Load {
                    buffer: src,
                    indices,
                },
            )),
        ) = (
            super::cache::allocated(&f.body, name),
            find_producer(&f.body, name),
        )
        else {
            return false;
        };
        let is_param = f
            .params
            .iter()
            .any(|p| matches!(p, Param::Buffer(b) if b.name == src.name));
        is_param && indices == ix && src.shape == dst.shape && src.dtype == dst.dtype
    });
    names
}

impl Schedule {
    /// The body of [`Schedule::compute_inline`].
    pub(super) fn compute_inline_untraced(&mut self, buffer: &str) -> ScheduleResult<()> {
        if self.find_buffer(buffer).is_some() {
            return Err(self.form(
                P,
                format!("needs a buffer the function allocates, found the parameter `{buffer}` (its contents are the caller's)"),
            ));
        }
        let Some(target) = super::cache::allocated(&self.func.body, buffer) else {
            return Err(self.form(P, format!("found no allocated buffer `{buffer}`")));
        };
        let (mut loads, mut stores) = (vec![], vec![]);
        rewrite::accesses(&self.func.body, buffer, &mut loads, &mut stores);
        if stores.len() != 1 {
            return Err(self.form(
                P,
                format!(
                    "needs exactly one store to `{buffer}` (the nest that computes it), found {}",
                    stores.len()
                ),
            ));
        }
        let producer = find_producer(&self.func.body, buffer).ok_or_else(|| {
            self.form(
                P,
                format!("needs the store to `{buffer}` in a perfect loop nest at the top of the body (inside allocations only), found it elsewhere"),
            )
        })?;
        let (loops, store_ix, value) = producer;
        let dims = self.check_producer(&target, &loops, &store_ix, &value)?;
        // Nothing before the producer may read the buffer (it would read what is not written yet).
        if read_before(&self.func.body, buffer) {
            return Err(self.form(
                P,
                format!("needs every read of `{buffer}` after the nest that computes it, found one before it"),
            ));
        }
        let body = remove_producer(&self.func.body, buffer);
        let body = rw_stmt(
            &mut Inline {
                name: buffer,
                dims: &dims,
                value: &value,
            },
            &body,
        );
        self.func.body = body;
        Ok(())
    }

    /// The loop variable of each dimension of `target`, after checking that the nest `loops`
    /// (outermost first) with the store `target[ix] = value` writes every element once, and
    /// that `value` reads only buffers nothing writes.
    fn check_producer(
        &self,
        target: &Buffer,
        loops: &[(Var, Expr, Expr)],
        ix: &[Expr],
        value: &Expr,
    ) -> ScheduleResult<Vec<Option<Var>>> {
        let name = &target.name;
        let shown = || {
            let v: Vec<String> = ix.iter().map(ToString::to_string).collect();
            format!("{name}[{}]", v.join(", "))
        };
        let mut dims = Vec::new();
        let mut used: Vec<VarId> = Vec::new();
        for (d, e) in ix.iter().enumerate() {
            let extent = target.shape[d].as_int();
            match e {
                Expr::Var(v) => {
                    let Some((_, mn, ex)) = loops.iter().find(|(lv, _, _)| lv.id == v.id) else {
                        return Err(self.form(
                            P,
                            format!("needs each index of the store `{}` to be a loop of its nest, found `{e}`", shown()),
                        ));
                    };
                    if mn.as_int() != Some(0) || ex.as_int().is_none() || ex.as_int() != extent {
                        let show = |e: &Expr| e.as_int().map_or_else(|| e.to_string(), |x| x.to_string());
                        let range = match (mn.as_int(), ex.as_int()) {
                            (Some(a), Some(b)) => format!("[{a}, {})", a.saturating_add(b)),
                            _ => format!("[{}, {} + {})", show(mn), show(mn), show(ex)),
                        };
                        return Err(self.form(
                            P,
                            format!(
                                "needs the loop `{}` to run from 0 over dimension {d} of `{name}` ({}), found {range}",
                                v.name,
                                show(&target.shape[d])
                            ),
                        ));
                    }
                    if used.contains(&v.id) {
                        return Err(self.form(
                            P,
                            format!("needs each loop to index one dimension of the store `{}`, found `{}` twice", shown(), v.name),
                        ));
                    }
                    used.push(v.id);
                    dims.push(Some(v.clone()));
                }
                _ if e.as_int() == Some(0) && extent == Some(1) => dims.push(None),
                _ => {
                    return Err(self.form(
                        P,
                        format!("needs each index of the store `{}` to be a loop of its nest (or 0 for a dimension of extent 1), found `{e}`", shown()),
                    ))
                }
            }
        }
        if let Some((v, _, _)) = loops.iter().find(|(v, _, _)| !used.contains(&v.id)) {
            return Err(self.form(
                P,
                format!("needs every loop of the nest to index the store `{}`, found `{}` unused (it would store the same elements again)", shown(), v.name),
            ));
        }
        // The value's reads: buffers nothing in the function writes.
        let mut reads: Vec<String> = Vec::new();
        let mut has_let = false;
        struct R<'a>(&'a mut Vec<String>, &'a mut bool);
        impl Visitor for R<'_> {
            fn stmt(&mut self, _: &Stmt) {}
            fn expr(&mut self, e: &Expr) {
                match e {
                    Expr::Load { buffer, .. } => self.0.push(buffer.name.clone()),
                    Expr::Let { .. } => *self.1 = true,
                    _ => {}
                }
                walk_expr(self, e);
            }
        }
        R(&mut reads, &mut has_let).expr(value);
        if has_let {
            return Err(self.form(
                P,
                format!("needs a value without `let` (inlined, it would bind its variable at every read), found `{value}`"),
            ));
        }
        for b in &reads {
            let (mut l, mut s) = (vec![], vec![]);
            rewrite::accesses(&self.func.body, b, &mut l, &mut s);
            if !s.is_empty() {
                return Err(self.form(
                    P,
                    format!("needs a value that reads only buffers nothing writes, found a read of `{b}`, which the function writes (its value would differ where it is read)"),
                ));
            }
        }
        Ok(dims)
    }
}

/// The perfect nest at the top of `s` (through `Seq`s and allocations) that stores `name`:
/// its loops (variable, min, extent), the store's indices and its value.
#[allow(clippy::type_complexity)]
fn find_producer(s: &Stmt, name: &str) -> Option<(Vec<(Var, Expr, Expr)>, Vec<Expr>, Expr)> {
    match s {
        Stmt::Allocate { body, .. } => find_producer(body, name),
        Stmt::Seq(v) => v.iter().find_map(|x| find_producer(x, name)),
        Stmt::For { .. } => {
            let mut loops = Vec::new();
            let mut cur = s;
            while let Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } = cur
            {
                loops.push((var.clone(), min.clone(), extent.clone()));
                cur = body;
            }
            match cur {
                Stmt::Store {
                    buffer,
                    indices,
                    value,
                } if buffer.name == name => Some((loops, indices.clone(), value.clone())),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether a statement of `s` before the producer of `name` reads it.
fn read_before(s: &Stmt, name: &str) -> bool {
    fn reads(s: &Stmt, name: &str) -> bool {
        let (mut l, mut st) = (vec![], vec![]);
        rewrite::accesses(s, name, &mut l, &mut st);
        !l.is_empty()
    }
    match s {
        Stmt::Allocate { body, .. } => read_before(body, name),
        Stmt::Seq(v) => {
            for x in v {
                // The statement holding the producer: what comes before it in there (nothing,
                // for the producer's nest itself).
                if find_producer(x, name).is_some() {
                    return read_before(x, name);
                }
                if reads(x, name) {
                    return true;
                }
            }
            false
        }
        _ => false,
    }
}

/// `s` without the producer of `name` and without its allocation.
fn remove_producer(s: &Stmt, name: &str) -> Stmt {
    match s {
        Stmt::Allocate { buffer, body } if buffer.name == name => remove_producer(body, name),
        Stmt::Allocate { buffer, body } => Stmt::Allocate {
            buffer: buffer.clone(),
            body: Box::new(remove_producer(body, name)),
        },
        Stmt::Seq(v) => Stmt::Seq(
            v.iter()
                .filter(|x| !(matches!(x, Stmt::For { .. }) && find_producer(x, name).is_some()))
                .map(|x| remove_producer(x, name))
                .collect(),
        ),
        Stmt::For { .. } if find_producer(s, name).is_some() => Stmt::Seq(vec![]),
        _ => s.clone(),
    }
}

/// Replaces each load of `name` by `value` with its loop variables bound to the load's indices.
struct Inline<'a> {
    name: &'a str,
    dims: &'a [Option<Var>],
    value: &'a Expr,
}

impl Rewriter for Inline<'_> {
    fn post_expr(&mut self, e: Expr) -> Expr {
        match &e {
            Expr::Load { buffer, indices } if buffer.name == self.name => {
                let map: HashMap<VarId, Expr> = self
                    .dims
                    .iter()
                    .zip(indices)
                    .filter_map(|(v, i)| {
                        v.as_ref().map(|v| {
                            let i = if i.dtype() == v.dtype {
                                i.clone()
                            } else {
                                i.clone().cast(v.dtype)
                            };
                            (v.id, i)
                        })
                    })
                    .collect();
                rewrite::subst_expr(self.value, &map)
            }
            _ => e,
        }
    }
}
