//! Primitives that set a loop's kind: parallel, vectorize, unroll (`bind`, for device kernels,
//! is in `device.rs`).

use super::{for_, parts, Schedule, ScheduleResult};
use crate::ir::{Expr, ForKind, Stmt};

impl Schedule {
    pub(super) fn set_kind(&mut self, name: &str, kind: ForKind) -> ScheduleResult<()> {
        let Some(old) = self.replace_kind(name, kind)? else {
            return Err(self.form(
                if kind == ForKind::Vectorized {
                    "vectorize"
                } else {
                    "unroll"
                },
                format!("needs loop `{name}` to have a constant extent"),
            ));
        };
        // Parallel loops do not nest in parallel or vectorized ones (the verifier's rule): say
        // so at the step that would break it, and keep the function as it was. Only a loop
        // made parallel or vectorized can break it.
        if matches!(kind, ForKind::Parallel | ForKind::Vectorized) {
            if let Some((inner, outer, outer_kind)) = parallel_in_parallel(&self.func.body) {
                self.replace_kind(name, old)?;
                return Err(self.form(
                    if kind == ForKind::Parallel {
                        "parallel"
                    } else {
                        "vectorize"
                    },
                    format!(
                        "would put the parallel loop `{inner}` inside the {} loop `{outer}`; a \
                         parallel loop may not be nested in a parallel or vectorized one",
                        outer_kind.name()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Gives loop `name` the kind `kind` and returns the kind it had; `None`, and the loop left
    /// as it was, when `kind` is vectorized or unrolled and the extent is not a constant.
    fn replace_kind(&mut self, name: &str, kind: ForKind) -> ScheduleResult<Option<ForKind>> {
        let needs_constant = matches!(kind, ForKind::Vectorized | ForKind::Unrolled);
        let mut old = None;
        self.edit(name, &mut |s, _| {
            let (var, min, extent, k, body) = parts(s);
            if needs_constant && extent.as_int().is_none() {
                return Ok(s.clone());
            }
            old = Some(k);
            Ok(for_(
                var.clone(),
                min.clone(),
                extent.clone(),
                kind,
                body.clone(),
            ))
        })?;
        Ok(old)
    }

    /// The body of [`Schedule::parallel`] (which records it in the trace).
    pub(super) fn parallel_untraced(&mut self, name: &str) -> ScheduleResult<()> {
        self.set_kind(name, ForKind::Parallel)
    }

    /// The body of [`Schedule::vectorize`] (which records it in the trace).
    pub(super) fn vectorize_untraced(&mut self, name: &str) -> ScheduleResult<()> {
        self.set_kind(name, ForKind::Vectorized)
    }

    /// The body of [`Schedule::unroll`] (which records it in the trace).
    pub(super) fn unroll_untraced(&mut self, name: &str) -> ScheduleResult<()> {
        self.set_kind(name, ForKind::Unrolled)
    }
}

/// The first parallel loop nested in a parallel or vectorized loop, as (inner, outer, the
/// outer's kind).
fn parallel_in_parallel(s: &Stmt) -> Option<(String, String, ForKind)> {
    use crate::ir::visit::{walk_stmt, Visitor};
    #[derive(Default)]
    struct Nest {
        /// The enclosing loops (name, kind).
        enc: Vec<(String, ForKind)>,
        found: Option<(String, String, ForKind)>,
    }
    impl Visitor for Nest {
        fn stmt(&mut self, s: &Stmt) {
            if self.found.is_some() {
                return;
            }
            let Stmt::For { var, kind, .. } = s else {
                return walk_stmt(self, s);
            };
            if *kind == ForKind::Parallel {
                if let Some((outer, k)) = self
                    .enc
                    .iter()
                    .find(|(_, k)| matches!(k, ForKind::Parallel | ForKind::Vectorized))
                {
                    self.found = Some((var.name.to_string(), outer.clone(), *k));
                    return;
                }
            }
            self.enc.push((var.name.to_string(), *kind));
            walk_stmt(self, s);
            self.enc.pop();
        }
        fn expr(&mut self, _: &Expr) {}
    }
    let mut v = Nest::default();
    v.stmt(s);
    v.found
}
