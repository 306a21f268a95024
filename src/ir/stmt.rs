//! Statements: loops, stores, allocations, bindings, control flow.

use super::expr::{Expr, Var};
use super::func::Buffer;

/// How a loop's iterations may be executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForKind {
    /// One after the other, in order.
    Serial,
    /// Iterations are independent and may run on several threads (at most one level: a parallel
    /// loop may not be nested in another parallel or a vectorized loop).
    Parallel,
    /// Iterations are independent and may run as SIMD lanes (constant extent required).
    Vectorized,
    /// Serial, with a hint to unroll (constant extent required).
    Unrolled,
}

impl ForKind {
    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            ForKind::Serial => "serial",
            ForKind::Parallel => "parallel",
            ForKind::Vectorized => "vectorized",
            ForKind::Unrolled => "unrolled",
        }
    }

    /// The kind with this JSON name.
    pub fn from_name(s: &str) -> Option<ForKind> {
        [
            ForKind::Serial,
            ForKind::Parallel,
            ForKind::Vectorized,
            ForKind::Unrolled,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// A statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    /// `for var in [min, min + extent)`, step 1. `min` and `extent` are evaluated once, before the
    /// first iteration; an extent <= 0 runs no iteration.
    For {
        /// The loop variable (`int32` or `int64`), bound in `body`.
        var: Var,
        /// First value (same type as `var`).
        min: Expr,
        /// Number of iterations (same type as `var`).
        extent: Expr,
        /// Serial, parallel, vectorized or unrolled.
        kind: ForKind,
        /// The loop body.
        body: Box<Stmt>,
    },
    /// `buffer[indices] = value`.
    Store {
        /// The buffer written (a parameter or an enclosing allocation).
        buffer: Buffer,
        /// One index per dimension.
        indices: Vec<Expr>,
        /// The value (of the buffer's dtype).
        value: Expr,
    },
    /// A temporary buffer, live in `body` only; its contents start undefined (the interpreter
    /// zero-fills). Its scope (`local` or `workspace`) is `buffer.scope`.
    Allocate {
        /// The buffer: compact, shape of constants or variables in scope.
        buffer: Buffer,
        /// Where it is used.
        body: Box<Stmt>,
    },
    /// `let var = value` in `body`.
    Let {
        /// The variable bound in `body`.
        var: Var,
        /// Its value.
        value: Expr,
        /// The scope of the binding.
        body: Box<Stmt>,
    },
    /// `if cond { then_case } else { else_case }`.
    IfThenElse {
        /// A bool.
        cond: Expr,
        /// Runs when `cond` is true.
        then_case: Box<Stmt>,
        /// Runs when `cond` is false.
        else_case: Option<Box<Stmt>>,
    },
    /// Statements in order.
    Seq(Vec<Stmt>),
    /// Evaluates an expression for its effects (errors) and discards the value.
    Evaluate(Expr),
    /// Stops with an error (`RuntimeError` in generated code) carrying `message` if `cond` is false.
    Assert {
        /// A bool.
        cond: Expr,
        /// The error message.
        message: String,
    },
    /// Returns a scalar from the function (type = the function's `ret_type`).
    Return(Expr),
}

impl Stmt {
    /// A sequence; a single statement stays as it is.
    pub fn seq(mut stmts: Vec<Stmt>) -> Stmt {
        if stmts.len() == 1 {
            stmts.pop().expect("length checked")
        } else {
            Stmt::Seq(stmts)
        }
    }
}
