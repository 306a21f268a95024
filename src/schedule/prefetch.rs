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

use std::collections::HashMap;

use super::{imm, parts, Schedule, ScheduleResult};
use crate::ir::rewrite::{rw_expr, rw_stmt, subst_stmt, Rewriter};
use crate::ir::{Buffer, Expr, Stmt};

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
