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
    /// Bound to a GPU-style thread index (`"thread_binding"` in JSON): the loop variable *is*
    /// that index, every value in `[0, extent)` runs on its own block or thread. `min` must be 0.
    /// Used in device kernels only (see `docs/ir.md`, "Device code").
    ThreadBinding(ThreadTag),
}

/// The thread index a [`ForKind::ThreadBinding`] loop is bound to, as in TVM and CUDA:
/// `blockIdx.{x,y,z}` (work-group ids) and `threadIdx.{x,y,z}` (ids within a block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ThreadTag {
    /// `blockIdx.x|y|z` (axis 0, 1, 2).
    Block(u8),
    /// `threadIdx.x|y|z` (axis 0, 1, 2).
    Thread(u8),
}

impl ThreadTag {
    /// All six tags.
    pub const ALL: [ThreadTag; 6] = [
        ThreadTag::Block(0),
        ThreadTag::Block(1),
        ThreadTag::Block(2),
        ThreadTag::Thread(0),
        ThreadTag::Thread(1),
        ThreadTag::Thread(2),
    ];

    /// The TVM spelling (`blockIdx.x`, `threadIdx.y`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ThreadTag::Block(0) => "blockIdx.x",
            ThreadTag::Block(1) => "blockIdx.y",
            ThreadTag::Block(_) => "blockIdx.z",
            ThreadTag::Thread(0) => "threadIdx.x",
            ThreadTag::Thread(1) => "threadIdx.y",
            ThreadTag::Thread(_) => "threadIdx.z",
        }
    }

    /// The tag with this TVM spelling.
    pub fn from_name(s: &str) -> Option<ThreadTag> {
        ThreadTag::ALL.into_iter().find(|t| t.name() == s)
    }

    /// The axis: 0 for x, 1 for y, 2 for z.
    pub fn axis(self) -> usize {
        match self {
            ThreadTag::Block(a) | ThreadTag::Thread(a) => a as usize,
        }
    }

    /// Whether this is a `threadIdx` tag.
    pub fn is_thread(self) -> bool {
        matches!(self, ThreadTag::Thread(_))
    }
}

impl std::fmt::Display for ThreadTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl ForKind {
    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            ForKind::Serial => "serial",
            ForKind::Parallel => "parallel",
            ForKind::Vectorized => "vectorized",
            ForKind::Unrolled => "unrolled",
            ForKind::ThreadBinding(_) => "thread_binding",
        }
    }

    /// The kind with this JSON name (`thread_binding` needs its tag: not found here).
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
    /// `while cond { body }`: `cond` is evaluated before every iteration, and the loop ends the
    /// first time it is false (TVM's `While`, as in its binary searches: `searchsorted`, NMS).
    /// Always serial: no schedule primitive applies to it, it may not sit inside a vectorized
    /// loop (a verifier error), and a parallel loop around it runs it in each task. `{"stmt":
    /// "while", "cond": ..., "body": ...}` in JSON.
    While {
        /// A bool, over variables and buffers the body may change.
        cond: Expr,
        /// The loop body.
        body: Box<Stmt>,
    },
    /// Statements in order.
    Seq(Vec<Stmt>),
    /// Evaluates an expression for its effects (errors) and discards the value.
    Evaluate(Expr),
    /// A hint: fetch the cache line of `buffer[indices]` ahead of a later load (TVM's
    /// `prefetch`; LLVM's `llvm.prefetch`, for reading, kept in all cache levels). It never
    /// changes a result and never faults: the element need not exist (a prefetch of the row
    /// after the last is allowed), the interpreter does nothing, and a back end without
    /// prefetches (OpenCL, CUDA) emits nothing. `{"stmt": "prefetch", "buffer": ..., "indices":
    /// [...]}` in JSON; [`Schedule::prefetch`](crate::schedule::Schedule::prefetch) inserts it.
    Prefetch {
        /// The buffer (a parameter or an enclosing allocation).
        buffer: Buffer,
        /// One index per dimension (integers).
        indices: Vec<Expr>,
    },
    /// Stops with an error (`RuntimeError` in generated code) carrying `message` if `cond` is false.
    Assert {
        /// A bool.
        cond: Expr,
        /// The error message.
        message: String,
    },
    /// Returns a scalar from the function (type = the function's `ret_type`).
    Return(Expr),
    /// A work-group barrier inside a device kernel: every thread of the block reaches it before
    /// any passes it, and `shared` memory written before it is visible to all threads after it
    /// (TVM's `tvm_storage_sync("shared")`). `{"stmt": "barrier"}` in JSON.
    Barrier,
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
