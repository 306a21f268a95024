//! Device kernels inside a [`PrimFunc`]: the execution model, finding kernels, and the
//! target-limit check.
//!
//! # Execution model
//!
//! A *kernel* is an outermost thread-bound loop nest: a [`Stmt::For`] of kind
//! [`ForKind::ThreadBinding`] that is not inside another thread-bound loop. The host runs the
//! rest of the function and *launches* each kernel when control reaches it:
//!
//! - the extents of the kernel's `blockIdx.{x,y,z}` loops are the grid, those of its
//!   `threadIdx.{x,y,z}` loops the block (work-group) size (a tag the kernel does not use has
//!   extent 1). The verifier guarantees one extent per tag per kernel, made only of variables
//!   bound outside the kernel, so the host can compute the launch before it starts;
//! - every block runs the kernel body on `block size` threads. A thread-bound loop does not
//!   iterate: its variable *is* the block's or thread's coordinate on that axis. Statements of the
//!   kernel outside a `threadIdx` loop run in every thread of the block (redundantly, as on the
//!   hardware), so guard single-writer side effects with `if tx == 0` inside the thread loop;
//! - `shared` allocations exist once per block and are visible to all its threads; `local`
//!   allocations exist once per thread; `workspace` allocations are not allowed in kernels;
//! - [`Stmt::Barrier`] synchronises the threads of a block: every thread reaches it before any
//!   passes it, and shared-memory writes before it are visible to every thread after it. Blocks
//!   never synchronise with each other, and a kernel launch finishes before the host goes on.
//!
//! The verifier (`docs/ir.md`, "Device code") enforces the structural rules; the reference
//! interpreter ([`super::interp`]) runs kernels block by block with the threads of a block in
//! lock-step and reports shared-memory data races. What the verifier cannot know, the limits of
//! the device, is checked by [`check_device_limits`].

use std::collections::BTreeMap;

use super::error::{IrError, IrResult};
use super::expr::Expr;
use super::func::{PrimFunc, StorageScope};
use super::stmt::{ForKind, Stmt, ThreadTag};

/// The kernels of `func`, in node order: each one's node path (`$.body.stmts[1]`, the syntax of
/// verifier errors for a function verified alone) and its outermost thread-bound `for`.
///
/// ```
/// use kiln::ir::{builder::*, device, Buffer, DataType, Expr, Param, PrimFunc, Stmt, ThreadTag};
/// let a = Buffer::new("A", DataType::f32(), vec![Expr::from(256i64)]);
/// let body = thread_for("bx", Expr::from(4i64), ThreadTag::Block(0), |bx| {
///     thread_for("tx", Expr::from(64i64), ThreadTag::Thread(0), |tx| {
///         a.store([bx * 64i64 + tx], Expr::from(1.0f32))
///     })
/// });
/// let f = PrimFunc::new("fill", vec![Param::Buffer(a)], Stmt::Seq(vec![body]));
/// let ks = device::kernels(&f);
/// assert_eq!(ks.len(), 1);
/// assert_eq!(ks[0].0, "$.body.stmts[0]");
/// ```
pub fn kernels(func: &PrimFunc) -> Vec<(String, &Stmt)> {
    let mut out = Vec::new();
    find_kernels(&func.body, &mut "$.body".to_string(), &mut out);
    out
}

fn find_kernels<'a>(s: &'a Stmt, path: &mut String, out: &mut Vec<(String, &'a Stmt)>) {
    let mut sub = |seg: &str, child: &'a Stmt, out: &mut Vec<(String, &'a Stmt)>| {
        let len = path.len();
        path.push_str(seg);
        find_kernels(child, path, out);
        path.truncate(len);
    };
    match s {
        Stmt::For {
            kind: ForKind::ThreadBinding(_),
            ..
        } => out.push((path.clone(), s)),
        Stmt::For { body, .. }
        | Stmt::Allocate { body, .. }
        | Stmt::Let { body, .. }
        | Stmt::While { body, .. } => sub(".body", body, out),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => {
            sub(".then", then_case, out);
            if let Some(e) = else_case {
                sub(".else", e, out);
            }
        }
        Stmt::Seq(v) => {
            for (i, st) in v.iter().enumerate() {
                sub(&format!(".stmts[{i}]"), st, out);
            }
        }
        Stmt::Store { .. }
        | Stmt::Evaluate(_)
        | Stmt::Assert { .. }
        | Stmt::Return(_)
        | Stmt::Prefetch { .. }
        | Stmt::Barrier => {}
    }
}

/// The launch extents of a kernel: the extent of the first loop of each tag inside `kernel`
/// (the verifier guarantees that every loop of a tag in one kernel has this extent). Tags the
/// kernel does not use are absent.
pub fn launch_extents(kernel: &Stmt) -> BTreeMap<ThreadTag, &Expr> {
    let mut out = BTreeMap::new();
    visit_stmts(kernel, &mut |s| {
        if let Stmt::For {
            kind: ForKind::ThreadBinding(tag),
            extent,
            ..
        } = s
        {
            out.entry(*tag).or_insert(extent);
        }
    });
    out
}

/// Calls `f` on `s` and every statement inside it, in node order.
pub(crate) fn visit_stmts<'a>(s: &'a Stmt, f: &mut impl FnMut(&'a Stmt)) {
    f(s);
    match s {
        Stmt::For { body, .. }
        | Stmt::Allocate { body, .. }
        | Stmt::Let { body, .. }
        | Stmt::While { body, .. } => visit_stmts(body, f),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => {
            visit_stmts(then_case, f);
            if let Some(e) = else_case {
                visit_stmts(e, f);
            }
        }
        Stmt::Seq(v) => v.iter().for_each(|st| visit_stmts(st, f)),
        _ => {}
    }
}

/// Checks every kernel of `func` against a device's limits (TVM target attributes
/// `max_num_threads` and `max_shared_memory_per_block`):
///
/// - threads per block, the product of the kernel's `threadIdx` extents, must not exceed
///   `max_threads_per_block`. The check needs constant `threadIdx` extents: a symbolic one is an
///   error (the launch could not be checked before run time);
/// - the bytes of all `shared` allocations in the kernel (the verifier requires constant shapes),
///   summed whether or not they are live at the same time, must not exceed `max_shared_bytes`.
///
/// The function should be verified first. Errors are [`IrError::Verify`] with the kernel's node
/// path, e.g. `function `f`: $.body.stmts[1]: kernel: 2048 threads per block (threadIdx.x 64 ×
/// threadIdx.y 32) exceed the target's max_num_threads 1024`.
///
/// # Errors
/// The first kernel that does not fit.
pub fn check_device_limits(
    func: &PrimFunc,
    max_threads_per_block: i64,
    max_shared_bytes: i64,
) -> IrResult<()> {
    let err = |path: &str, message: String| IrError::Verify {
        func: func.name.clone(),
        path: path.to_string(),
        message,
    };
    for (path, kernel) in kernels(func) {
        let mut threads: i64 = 1;
        let mut parts = Vec::new();
        for (tag, extent) in launch_extents(kernel) {
            if !tag.is_thread() {
                continue;
            }
            let Some(n) = extent.as_int() else {
                return Err(err(
                    &path,
                    format!(
                        "kernel: threads per block must be constant for the device limits check, \
                         {tag} has extent `{extent}`"
                    ),
                ));
            };
            threads = threads.saturating_mul(n.max(0));
            parts.push(format!("{tag} {n}"));
        }
        if threads > max_threads_per_block {
            return Err(err(
                &path,
                format!(
                    "kernel: {threads} threads per block ({}) exceed the target's max_num_threads \
                     {max_threads_per_block}",
                    parts.join(" × ")
                ),
            ));
        }
        let mut bytes: i64 = 0;
        let mut allocs = Vec::new();
        let mut symbolic = None;
        visit_stmts(kernel, &mut |s| {
            if let Stmt::Allocate { buffer, .. } = s {
                if buffer.scope == StorageScope::Shared {
                    match buffer.const_numel() {
                        Some(n) => {
                            let b = n.saturating_mul(buffer.dtype.bytes() as i64);
                            bytes = bytes.saturating_add(b);
                            allocs.push(format!("{} {b}", buffer.name));
                        }
                        None => symbolic = symbolic.take().or(Some(buffer.name.clone())),
                    }
                }
            }
        });
        if let Some(name) = symbolic {
            return Err(err(
                &path,
                format!("kernel: shared buffer `{name}` has a non-constant shape"),
            ));
        }
        if bytes > max_shared_bytes {
            return Err(err(
                &path,
                format!(
                    "kernel: {bytes} bytes of shared memory ({}) exceed the target's \
                     max_shared_memory_per_block {max_shared_bytes}",
                    allocs.join(", ")
                ),
            ));
        }
    }
    Ok(())
}
