//! Queries over IR trees that lowering passes need, e.g. what a parallel loop body captures.

use std::collections::HashSet;

use super::expr::{Expr, Var, VarId};
use super::func::Buffer;
use super::stmt::Stmt;

/// What a statement uses from its surroundings: the variables and buffers it refers to without
/// binding or allocating them itself, each once, in order of first use.
///
/// `vars` includes the variables in the shapes and strides of those buffers (needed to compute
/// addresses), but not buffer data pointers: those come with `buffers`. This is the capture list
/// of a closure made from the statement (a parallel loop body in codegen).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FreeUses {
    /// Free variables (scalars, loop variables of enclosing loops, shape variables).
    pub vars: Vec<Var>,
    /// Buffers used but not allocated inside.
    pub buffers: Vec<Buffer>,
}

impl Stmt {
    /// The variables and buffers this statement uses but does not define; see [`FreeUses`].
    ///
    /// ```
    /// use kiln::ir::kernels;
    /// let f = kernels::vadd();
    /// let uses = f.body.free_uses();
    /// let names: Vec<&str> = uses.buffers.iter().map(|b| b.name.as_str()).collect();
    /// assert_eq!(names, ["C", "A", "B"]);
    /// assert_eq!(uses.vars.len(), 1); // n
    /// ```
    pub fn free_uses(&self) -> FreeUses {
        let mut c = Collector::default();
        c.stmt(self);
        c.out
    }
}

impl Expr {
    /// The variables and buffers this expression uses but does not bind; see [`FreeUses`].
    pub fn free_uses(&self) -> FreeUses {
        let mut c = Collector::default();
        c.expr(self);
        c.out
    }
}

#[derive(Default)]
struct Collector {
    bound: HashSet<VarId>,
    local_buffers: HashSet<VarId>,
    seen_vars: HashSet<VarId>,
    seen_buffers: HashSet<VarId>,
    out: FreeUses,
}

impl Collector {
    fn var(&mut self, v: &Var) {
        if !self.bound.contains(&v.id) && self.seen_vars.insert(v.id) {
            self.out.vars.push(v.clone());
        }
    }

    fn dims(&mut self, b: &Buffer) {
        for d in b.shape.iter().chain(b.strides.iter().flatten()) {
            self.expr(d);
        }
    }

    fn buffer(&mut self, b: &Buffer) {
        if !self.local_buffers.contains(&b.data.id) && self.seen_buffers.insert(b.data.id) {
            self.out.buffers.push(b.clone());
            self.dims(b);
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                self.expr(min);
                self.expr(extent);
                self.bound.insert(var.id);
                self.stmt(body);
            }
            Stmt::Store {
                buffer,
                indices,
                value,
            } => {
                self.buffer(buffer);
                indices.iter().for_each(|i| self.expr(i));
                self.expr(value);
            }
            Stmt::Allocate { buffer, body } => {
                self.dims(buffer);
                self.local_buffers.insert(buffer.data.id);
                self.stmt(body);
            }
            Stmt::Let { var, value, body } => {
                self.expr(value);
                self.bound.insert(var.id);
                self.stmt(body);
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                self.expr(cond);
                self.stmt(then_case);
                if let Some(e) = else_case {
                    self.stmt(e);
                }
            }
            Stmt::Seq(v) => v.iter().for_each(|s| self.stmt(s)),
            Stmt::Evaluate(e) | Stmt::Return(e) | Stmt::Assert { cond: e, .. } => self.expr(e),
            Stmt::Barrier => {}
        }
    }

    fn expr(&mut self, e: &Expr) {
        match e {
            Expr::IntImm { .. } | Expr::FloatImm { .. } => {}
            Expr::Var(v) => self.var(v),
            Expr::Binary { a, b, .. } => {
                self.expr(a);
                self.expr(b);
            }
            Expr::Not(a) | Expr::Cast { value: a, .. } | Expr::Reinterpret { value: a, .. } => {
                self.expr(a)
            }
            Expr::Select { cond, t, f } | Expr::IfThenElse { cond, t, f } => {
                self.expr(cond);
                self.expr(t);
                self.expr(f);
            }
            Expr::Load { buffer, indices } => {
                self.buffer(buffer);
                indices.iter().for_each(|i| self.expr(i));
            }
            Expr::Let { var, value, body } => {
                self.expr(value);
                self.bound.insert(var.id);
                self.expr(body);
            }
            Expr::Call { args, .. } | Expr::CallExtern { args, .. } => {
                args.iter().for_each(|a| self.expr(a))
            }
        }
    }
}
