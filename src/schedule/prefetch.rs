//! `prefetch`: fetch what a later iteration of an outer loop reads while this one computes.
//!
//! TVM's `prefetch(tensor, var, offset)` puts all of an iteration's prefetches at the top of
//! the loop `var`, a burst that stalls on the memory system as the loads it is meant to help
//! would. kiln's places them next to the loads of a loop `at` inside `var` (or `var` itself):
//! each store in `at` that loads the buffer gets, just before it, a prefetch of each of its
//! loads with `var` advanced by `offset`. In a vectorized loop that is one prefetch per cache
//! line of the vector (`codegen/llvm/emit/prefetch.rs`), spread over the loop's work.
//!
//! Softmax is the case it was made for. Each row is read from memory by the max pass, which
//! then waits on memory, and read again from L1 by the `exp` pass, which computes while the
//! memory system idles. A prefetch of the next row in the `exp` pass overlaps the two:
//! `prefetch("je_o", "A", "i", 1)`.
//!
//! `prefetch_next` is for data that no load of the loop reads: what a copy (a `cache_read`'s
//! fill) will read in the next iteration of an outer loop. A matmul that packs its slice of
//! `B` a `k` pass at a time reads the next pass's rows only in the next pass's copy, which then
//! waits on memory with nothing to compute. The primitive enumerates the cache lines that copy
//! reads (one per 64 bytes of each contiguous run of its innermost loop), numbers the
//! iterations of the loops between the outer loop and a loop `at` of the compute as slots, and
//! puts one line's prefetch in each slot, `at` split so that the slots are as few iterations
//! apart as the lines allow: the next pass's rows arrive spread over this pass's work.

use std::collections::HashMap;

/// Bytes one prefetch brings in: a cache line on every CPU kiln targets.
const LINE_BYTES: i64 = 64;

/// The most cache lines `prefetch_next` fetches (256 MiB of source), and the longest loop it
/// spreads them over.
const MAX_LINES: i64 = 1 << 22;

/// The most prefetches `prefetch_next` puts in one slot (each is a statement of the loop body).
const MAX_PER_SLOT: i64 = 64;

use super::{cast_to, guard, imm, parts, Schedule, ScheduleResult};
use crate::ir::rewrite::{rw_expr, rw_stmt, subst_stmt, Rewriter};
use crate::ir::{BinOp, Buffer, DataType, Expr, Stmt, TypeCode, Var, VarId};

/// The loads of buffer `name` in an expression, in order, each once.
struct Loads<'a> {
    name: &'a str,
    found: Vec<(Buffer, Vec<Expr>)>,
}

impl Rewriter for Loads<'_> {
    fn post_expr(&mut self, e: Expr) -> Expr {
        if let Expr::Load { buffer, indices } = &e {
            if buffer.name == self.name && !self.found.iter().any(|(_, i)| i == indices) {
                self.found.push((buffer.clone(), indices.clone()));
            }
        }
        e
    }
}

/// Puts the prefetches before each store that loads the buffer.
struct Insert<'a> {
    name: &'a str,
    shift: &'a HashMap<crate::ir::VarId, Expr>,
    count: usize,
}

impl Rewriter for Insert<'_> {
    fn post_store(&mut self, buffer: Buffer, indices: Vec<Expr>, value: Expr) -> Stmt {
        let mut loads = Loads {
            name: self.name,
            found: Vec::new(),
        };
        for e in indices.iter().chain(std::iter::once(&value)) {
            rw_expr(&mut loads, e);
        }
        let store = Stmt::Store {
            buffer,
            indices,
            value,
        };
        if loads.found.is_empty() {
            return store;
        }
        let mut v: Vec<Stmt> = loads
            .found
            .into_iter()
            .map(|(buffer, indices)| {
                let p = Stmt::Prefetch { buffer, indices };
                subst_stmt(&p, self.shift)
            })
            .collect();
        self.count += v.len();
        v.push(store);
        Stmt::Seq(v)
    }
}

impl Schedule {
    /// The body of [`Schedule::prefetch`] (which records it in the trace).
    pub(super) fn prefetch_untraced(
        &mut self,
        at: &str,
        buffer: &str,
        var: &str,
        offset: i64,
    ) -> ScheduleResult<usize> {
        if offset == 0 {
            return Err(self.form(
                "prefetch",
                "needs an offset other than 0 (0 prefetches what the load itself reads)",
            ));
        }
        let known = self.find_buffer(buffer).is_some() || {
            let mut names = Vec::new();
            crate::ir::rewrite::allocated(&self.func.body, &mut names);
            names.iter().any(|n| n == buffer)
        };
        if !known {
            return Err(self.form(
                "prefetch",
                format!("buffer `{buffer}` is neither a parameter nor allocated in the function"),
            ));
        }
        let mut outcome: Result<usize, String> = Ok(0);
        self.edit(at, &mut |s, enc| {
            let (v, ..) = parts(s);
            let Some(target) = std::iter::once(v)
                .chain(enc.iter().rev().map(|(x, _, _)| x))
                .find(|x| &*x.name == var)
                .cloned()
            else {
                outcome = Err(format!(
                    "needs `{var}` to be loop `{at}` or a loop around it; it is not"
                ));
                return Ok(s.clone());
            };
            let shift = HashMap::from([(
                target.id,
                Expr::Var(target.clone()) + imm(target.dtype, offset),
            )]);
            let mut ins = Insert {
                name: buffer,
                shift: &shift,
                count: 0,
            };
            let out = rw_stmt(&mut ins, s);
            if ins.count == 0 {
                outcome = Err(format!(
                    "found no store in loop `{at}` whose value or indices load `{buffer}`"
                ));
                return Ok(s.clone());
            }
            outcome = Ok(ins.count);
            Ok(out)
        })?;
        outcome.map_err(|m| self.form("prefetch", m))
    }
}

/// A copy nest (`cache_read`'s fill): its loops, outermost first, as (variable, extent), the
/// buffer it reads, and the indices of that load.
struct Fill {
    loops: Vec<(Var, i64)>,
    src: Buffer,
    indices: Vec<Expr>,
    /// The variables of the loops around the nest, outermost first.
    around: Vec<Var>,
}

/// The fills of `cache` in `s`: perfect nests of loops of constant bounds from 0 whose one
/// store writes `cache` with a load of another buffer.
fn fills(s: &Stmt, cache: &str, around: &mut Vec<Var>, out: &mut Vec<Fill>) {
    match s {
        Stmt::For { var, body, .. } => {
            let mut loops = Vec::new();
            let mut at = s;
            while let Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } = at
            {
                match (min.as_int(), extent.as_int()) {
                    (Some(0), Some(e)) if e >= 1 => loops.push((var.clone(), e)),
                    _ => break,
                }
                at = body;
            }
            if let Stmt::Store {
                buffer,
                value:
                    Expr::Load {
                        buffer: src,
                        indices,
                    },
                ..
            } = at
            {
                if *buffer.name == *cache && src.name != buffer.name {
                    out.push(Fill {
                        loops,
                        src: src.clone(),
                        indices: indices.clone(),
                        around: around.clone(),
                    });
                    return;
                }
            }
            around.push(var.clone());
            fills(body, cache, around, out);
            around.pop();
        }
        Stmt::Allocate { body, .. } | Stmt::Let { body, .. } => fills(body, cache, around, out),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => {
            fills(then_case, cache, around, out);
            if let Some(e) = else_case {
                fills(e, cache, around, out);
            }
        }
        Stmt::Seq(v) => v.iter().for_each(|x| fills(x, cache, around, out)),
        _ => {}
    }
}

impl Schedule {
    /// The body of [`Schedule::prefetch_next`] (which records it in the trace).
    pub(super) fn prefetch_next_untraced(
        &mut self,
        cache: &str,
        var: &str,
        at: &str,
    ) -> ScheduleResult<usize> {
        let prim = "prefetch_next";
        let mut found = Vec::new();
        fills(&self.func.body, cache, &mut Vec::new(), &mut found);
        let fill = match found.len() {
            1 => found.pop().expect("one fill"),
            n => {
                return Err(self.form(
                    prim,
                    format!(
                        "needs exactly one copy into `{cache}` (a nest of loops from 0 of constant extents whose one store writes `{cache}` with a load of another buffer), found {n}"
                    ),
                ))
            }
        };
        let esize = (fill.src.dtype.bytes() as i64).max(1);
        let (inner, inner_ext) = fill.loops.last().cloned().expect("a fill has a loop");
        // The innermost loop's elements: contiguous in the source where only its last index
        // moves with it, by 1; then one prefetch per line of the run, else one per element.
        let moves = |e: &Expr| e.mentions(&inner);
        let n = fill.indices.len();
        // The last index's terms that move with the loop (others, such as a fused task's
        // `floormod`, are an offset) must be the loop's variable, once.
        let contiguous = n >= 1 && fill.indices[..n - 1].iter().all(|e| !moves(e)) && {
            let mut terms = Vec::new();
            add_terms(&fill.indices[n - 1], &mut terms);
            let moving: Vec<&Expr> = terms.into_iter().filter(|e| moves(e)).collect();
            moving.len() == 1
                && crate::ir::rewrite::linear(moving[0]).is_some_and(|l| {
                    l.terms.len() == 1 && l.terms[0].0.id == inner.id && l.terms[0].1 == 1
                })
        };
        // Elements a line holds, and lines per run of the innermost loop.
        let step = if contiguous {
            (LINE_BYTES / esize).max(1)
        } else {
            1
        };
        let per_run = (inner_ext + step - 1) / step;
        let lines = fill.loops[..fill.loops.len() - 1]
            .iter()
            .try_fold(per_run, |acc, (_, e)| acc.checked_mul(*e))
            .filter(|&l| l <= MAX_LINES)
            .ok_or_else(|| {
                self.form(
                    prim,
                    format!("the copy into `{cache}` reads more than {MAX_LINES} cache lines"),
                )
            })?;
        // Where the prefetches go: the loops from inside `var` down to `at`, their iterations
        // the slots.
        let mut plan: Result<(i64, i64), String> = Err(String::new());
        let (around, indices) = (&fill.around, &fill.indices);
        self.edit(at, &mut |s, enc| {
            let (v, min, extent, ..) = parts(s);
            let Some(p) = enc.iter().position(|(x, _, _)| &*x.name == var) else {
                plan = Err(format!("needs `{var}` to be a loop around `{at}`; it is not"));
                return Ok(s.clone());
            };
            let var_id = enc[p].0.id;
            let Some(q) = around.iter().position(|x| x.id == var_id) else {
                plan = Err(format!(
                    "needs `{var}` to be a loop around the copy into `{cache}`; it is not"
                ));
                return Ok(s.clone());
            };
            // The load must read nothing bound between `var` and the copy, which `at` does not see.
            if let Some(x) = around[q + 1..]
                .iter()
                .find(|x| indices.iter().any(|e| e.mentions(x)))
            {
                plan = Err(format!(
                    "needs the copy into `{cache}` to read with the loops of `{var}` and around it and its own only, but it reads `{}` between them",
                    x.name
                ));
                return Ok(s.clone());
            }
            let mut outer = 1i64;
            for (x, lo, e) in enc[p + 1..].iter() {
                match (lo.as_int(), e.as_int()) {
                    (Some(0), Some(e)) if e >= 1 => outer = outer.saturating_mul(e),
                    _ => {
                        plan = Err(format!(
                            "needs the loops between `{var}` and `{at}` to run from 0 to a constant; `{}` does not",
                            x.name
                        ));
                        return Ok(s.clone());
                    }
                }
            }
            let Some(ext) = extent
                .as_int()
                .filter(|e| (1..=MAX_LINES).contains(e) && min.as_int() == Some(0))
            else {
                plan = Err(format!(
                    "needs loop `{}` to run from 0 to a constant of at most {MAX_LINES}",
                    v.name
                ));
                return Ok(s.clone());
            };
            plan = Ok((outer, ext));
            Ok(s.clone())
        })?;
        let (outer, ext) = plan.map_err(|m| self.form(prim, m))?;
        // As thin as the slots allow: the most iterations of `at` per slot that still leave a
        // slot for each line; where even one iteration a slot is too few, several per slot.
        let every = (1..=ext)
            .rev()
            .find(|g| ext % g == 0 && outer.saturating_mul(ext / g) >= lines)
            .unwrap_or(1);
        let slots = outer.saturating_mul(ext / every);
        let per_slot = (lines + slots - 1) / slots;
        if per_slot > MAX_PER_SLOT {
            return Err(self.form(
                prim,
                format!(
                    "would put {per_slot} prefetches in each of the {slots} iterations from `{var}` down to `{at}` (at most {MAX_PER_SLOT}): {lines} lines are too many for them"
                ),
            ));
        }
        // Past the last line (slots to spare): nothing.
        let needs_guard = slots.saturating_mul(per_slot) > lines;
        let at_slot = if every > 1 {
            self.split_untraced(at, every)?.0
        } else {
            at.to_string()
        };
        self.edit(&at_slot, &mut |s, enc| {
            let (v, min, extent, kind, body) = parts(s);
            let Some(p_at) = enc.iter().position(|(x, _, _)| &*x.name == var) else {
                return Ok(s.clone());
            };
            // The slot: the loops inside `var` down to this one, as one mixed-radix number.
            let mut slot: Option<Expr> = None;
            for (x, _, e) in enc[p_at + 1..].iter().chain(std::iter::once(&(
                v.clone(),
                min.clone(),
                extent.clone(),
            ))) {
                let xv = cast_to(Expr::Var(x.clone()), DataType::i64());
                slot = Some(match slot {
                    None => xv,
                    Some(acc) => acc * imm(DataType::i64(), e.as_int().unwrap_or(1)) + xv,
                });
            }
            let slot = slot.expect("at least the loop itself");
            let var_v = enc[p_at].0.clone();
            let mut stmts = Vec::new();
            let int = |v: i64| imm(DataType::i64(), v);
            for t in 0..per_slot {
                let l = slot.clone() * int(per_slot) + int(t);
                // The line's run and its line within the run, then each loop of the copy.
                let mut map: HashMap<VarId, Expr> = HashMap::new();
                map.insert(
                    inner.id,
                    cast_to(
                        Expr::binary(BinOp::FloorMod, l.clone(), int(per_run)) * int(step),
                        inner.dtype,
                    ),
                );
                let mut rest = Expr::binary(BinOp::FloorDiv, l.clone(), int(per_run));
                for (x, e) in fill.loops[..fill.loops.len() - 1].iter().rev() {
                    map.insert(
                        x.id,
                        cast_to(
                            Expr::binary(BinOp::FloorMod, rest.clone(), int(*e)),
                            x.dtype,
                        ),
                    );
                    rest = Expr::binary(BinOp::FloorDiv, rest, int(*e));
                }
                map.insert(var_v.id, Expr::Var(var_v.clone()) + imm(var_v.dtype, 1));
                let pf = Stmt::Prefetch {
                    buffer: fill.src.clone(),
                    indices: fill
                        .indices
                        .iter()
                        .map(|e| crate::ir::rewrite::fold(crate::ir::rewrite::subst_expr(e, &map)))
                        .collect(),
                };
                stmts.push(if needs_guard {
                    guard(l.lt(int(lines)), pf)
                } else {
                    pf
                });
            }
            stmts.push(body.clone());
            Ok(Stmt::For {
                var: v.clone(),
                min: min.clone(),
                extent: extent.clone(),
                kind,
                body: Box::new(Stmt::Seq(stmts)),
            })
        })?;
        Ok(usize::try_from(lines).unwrap_or(usize::MAX))
    }
}

/// The terms of a sum, `a + b + ...`, in order, through conversions between integer types (a
/// TVM function's `int32` indices computed in `int64`): an index in bounds has the same value
/// in either.
fn add_terms<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
    match e {
        Expr::Cast { dtype, value, .. }
            if dtype.code == TypeCode::Int && value.dtype().code == TypeCode::Int =>
        {
            add_terms(value, out);
        }
        Expr::Binary {
            op: BinOp::Add,
            a,
            b,
        } => {
            add_terms(a, out);
            add_terms(b, out);
        }
        _ => out.push(e),
    }
}
