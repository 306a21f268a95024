//! Queries over IR trees that lowering passes need, e.g. what a parallel loop body captures.

use std::collections::HashSet;

use super::expr::{BinOp, Expr, Var, VarId};
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

/// A read-only walk over an IR tree. Implement the hooks a query needs; [`walk_stmt`] and
/// [`walk_expr`] visit every child in evaluation order and call the hooks on the way:
///
/// - [`Visitor::stmt`] / [`Visitor::expr`] for every node (the defaults walk the children:
///   an override that handles some nodes itself calls `walk_*` for the others);
/// - [`Visitor::bind`] when a loop or `let` binds its variable: after the loop bounds or the
///   value, before the body;
/// - [`Visitor::allocate`] before an allocation's body; [`Visitor::store`] and
///   [`Visitor::load`] at each buffer access, before its indices; [`Visitor::var`] at each use
///   of a variable.
pub trait Visitor {
    /// A statement; the default walks its children.
    fn stmt(&mut self, s: &Stmt) {
        walk_stmt(self, s);
    }
    /// An expression; the default walks its children.
    fn expr(&mut self, e: &Expr) {
        walk_expr(self, e);
    }
    /// A loop or `let` binds `var` for its body.
    fn bind(&mut self, _var: &Var) {}
    /// `Stmt::Allocate` allocates `buffer` for its body.
    fn allocate(&mut self, _buffer: &Buffer) {}
    /// A store into `buffer`.
    fn store(&mut self, _buffer: &Buffer) {}
    /// A load from `buffer`.
    fn load(&mut self, _buffer: &Buffer) {}
    /// A use of the variable `var`.
    fn var(&mut self, _var: &Var) {}
}

/// Visits the children of `s` (see [`Visitor`]).
pub fn walk_stmt<V: Visitor + ?Sized>(v: &mut V, s: &Stmt) {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            body,
            ..
        } => {
            v.expr(min);
            v.expr(extent);
            v.bind(var);
            v.stmt(body);
        }
        Stmt::Store {
            buffer,
            indices,
            value,
        } => {
            v.store(buffer);
            indices.iter().for_each(|i| v.expr(i));
            v.expr(value);
        }
        Stmt::Allocate { buffer, body } => {
            v.allocate(buffer);
            v.stmt(body);
        }
        Stmt::Let { var, value, body } => {
            v.expr(value);
            v.bind(var);
            v.stmt(body);
        }
        Stmt::IfThenElse {
            cond,
            then_case,
            else_case,
        } => {
            v.expr(cond);
            v.stmt(then_case);
            if let Some(e) = else_case {
                v.stmt(e);
            }
        }
        Stmt::While { cond, body } => {
            v.expr(cond);
            v.stmt(body);
        }
        Stmt::Seq(ss) => ss.iter().for_each(|s| v.stmt(s)),
        Stmt::Evaluate(e) | Stmt::Return(e) | Stmt::Assert { cond: e, .. } => v.expr(e),
        Stmt::Prefetch { buffer, indices } => {
            // As a load: the buffer is used (captured), never written.
            v.load(buffer);
            indices.iter().for_each(|i| v.expr(i));
        }
        Stmt::Barrier => {}
    }
}

/// Visits the children of `e` (see [`Visitor`]).
pub fn walk_expr<V: Visitor + ?Sized>(v: &mut V, e: &Expr) {
    match e {
        Expr::IntImm { .. } | Expr::FloatImm { .. } => {}
        Expr::Var(x) => v.var(x),
        Expr::Binary { a, b, .. } => {
            v.expr(a);
            v.expr(b);
        }
        Expr::Not(a) | Expr::Cast { value: a, .. } | Expr::Reinterpret { value: a, .. } => {
            v.expr(a)
        }
        Expr::Select { cond, t, f } | Expr::IfThenElse { cond, t, f } => {
            v.expr(cond);
            v.expr(t);
            v.expr(f);
        }
        Expr::Load { buffer, indices } => {
            v.load(buffer);
            indices.iter().for_each(|i| v.expr(i));
        }
        Expr::Let { var, value, body } => {
            v.expr(value);
            v.bind(var);
            v.expr(body);
        }
        Expr::Call { args, .. } | Expr::CallExtern { args, .. } => {
            args.iter().for_each(|a| v.expr(a))
        }
    }
}

impl Stmt {
    /// This statement with `f` applied to each of its statement children (loop, allocation and
    /// `let` bodies, both arms of an `if`, the items of a sequence); everything else is kept.
    /// The building block of statement rewrites that recurse by calling it from `f`.
    pub fn map_children(&self, mut f: impl FnMut(&Stmt) -> Stmt) -> Stmt {
        match self {
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => Stmt::For {
                var: var.clone(),
                min: min.clone(),
                extent: extent.clone(),
                kind: *kind,
                body: Box::new(f(body)),
            },
            Stmt::Seq(v) => Stmt::Seq(v.iter().map(f).collect()),
            Stmt::Allocate { buffer, body } => Stmt::Allocate {
                buffer: buffer.clone(),
                body: Box::new(f(body)),
            },
            Stmt::Let { var, value, body } => Stmt::Let {
                var: var.clone(),
                value: value.clone(),
                body: Box::new(f(body)),
            },
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => Stmt::IfThenElse {
                cond: cond.clone(),
                then_case: Box::new(f(then_case)),
                else_case: else_case.as_ref().map(|e| Box::new(f(e))),
            },
            Stmt::While { cond, body } => Stmt::While {
                cond: cond.clone(),
                body: Box::new(f(body)),
            },
            other => other.clone(),
        }
    }
}

/// Whether anything `visit` walks uses variable `v`.
fn uses(v: &Var, visit: impl FnOnce(&mut dyn Visitor)) -> bool {
    struct Find(VarId, bool);
    impl Visitor for Find {
        fn var(&mut self, w: &Var) {
            self.1 |= w.id == self.0;
        }
    }
    let mut f = Find(v.id, false);
    visit(&mut f);
    f.1
}

impl Stmt {
    /// Whether this statement uses variable `v` (in any expression, bound here or not).
    pub fn mentions(&self, v: &Var) -> bool {
        uses(v, |f| f.stmt(self))
    }
}

impl Expr {
    /// Whether this expression uses variable `v`.
    pub fn mentions(&self, v: &Var) -> bool {
        uses(v, |f| f.expr(self))
    }
}

impl Expr {
    /// The conjuncts of `a && b && ...`, in order, however the `&&`s are grouped; an
    /// expression that is not a conjunction is its own single conjunct.
    pub fn conjuncts(&self) -> Vec<&Expr> {
        fn go<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
            match e {
                Expr::Binary {
                    op: BinOp::And,
                    a,
                    b,
                } => {
                    go(a, out);
                    go(b, out);
                }
                _ => out.push(e),
            }
        }
        let mut out = Vec::new();
        go(self, &mut out);
        out
    }
}

/// Calls `f` with the variable, `min` and `extent` of every loop in `s`, outer loops first.
pub fn for_each_loop(s: &Stmt, f: impl FnMut(&Var, &Expr, &Expr)) {
    struct Loops<F>(F);
    impl<F: FnMut(&Var, &Expr, &Expr)> Visitor for Loops<F> {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::For {
                var, min, extent, ..
            } = s
            {
                (self.0)(var, min, extent);
            }
            walk_stmt(self, s);
        }
        // Expressions hold no loops.
        fn expr(&mut self, _: &Expr) {}
    }
    Loops(f).stmt(s);
}

/// Calls `f` with every variable a loop or a `let` statement in `s` binds (not `let`
/// expressions), outer ones first.
pub fn for_each_bound_var(s: &Stmt, f: impl FnMut(&Var)) {
    struct Bound<F>(F);
    impl<F: FnMut(&Var)> Visitor for Bound<F> {
        fn bind(&mut self, var: &Var) {
            (self.0)(var);
        }
        fn expr(&mut self, _: &Expr) {}
    }
    Bound(f).stmt(s);
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
}

impl Visitor for Collector {
    fn bind(&mut self, var: &Var) {
        self.bound.insert(var.id);
    }

    fn allocate(&mut self, buffer: &Buffer) {
        self.dims(buffer);
        self.local_buffers.insert(buffer.data.id);
    }

    fn store(&mut self, buffer: &Buffer) {
        self.buffer(buffer);
    }

    fn load(&mut self, buffer: &Buffer) {
        self.buffer(buffer);
    }

    fn var(&mut self, v: &Var) {
        if !self.bound.contains(&v.id) && self.seen_vars.insert(v.id) {
            self.out.vars.push(v.clone());
        }
    }
}
