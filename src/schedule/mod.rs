//! Schedule primitives: IR-to-IR loop transformations that turn a plain loop nest into a fast one.
//!
//! # Design
//!
//! A [`Schedule`] owns a [`PrimFunc`] and rewrites its body in place. Loops are named by their loop
//! variable (`"i"`, `"k0"`), so schedules apply equally to functions built in Rust and to functions
//! read from JSON; every primitive that creates loops returns their names. Each primitive is a
//! plain IR rewrite (with the IR rewriter's helpers, `ir/rewrite.rs`): the result is an ordinary `PrimFunc`, which the verifier checks
//! ([`Schedule::finish`]), the interpreter runs and the JSON writer saves, and a [`Step`] list
//! (serde) replays a schedule from JSON with [`Schedule::apply`].
//!
//! | primitive | effect |
//! |---|---|
//! | [`split`](Schedule::split) | `for i` → `for i_o { for i_i }` (guarded when the factor does not divide) |
//! | [`tile`](Schedule::tile) | split two loops and order them `i_o, j_o, i_i, j_i` |
//! | [`reorder`](Schedule::reorder) | permute loops of one perfect nest |
//! | [`fuse`](Schedule::fuse) | `for i { for j }` → `for i_j` |
//! | [`fission`](Schedule::fission) | `for i { a; b }` → `for i { a }; for i_1 { b }` (e.g. split a reduction's init from its update) |
//! | [`decompose_reduction`](Schedule::decompose_reduction) | `for k { if k == 0 { init }; update }` (TVM's form of every reduction) → `init; for k { update }` |
//! | [`parallel`](Schedule::parallel), [`vectorize`](Schedule::vectorize), [`unroll`](Schedule::unroll) | set the loop kind |
//! | [`transform_layout`](Schedule::transform_layout) | pack a read-only buffer into a workspace with another layout (e.g. `B[k, n]` → `Bp[n/16, k, n%16]`) |
//! | [`cache_write`](Schedule::cache_write) | accumulate a buffer's region touched by one iteration of a loop in a `local` buffer (registers), then write it back |
//! | [`cache_read`](Schedule::cache_read) | copy a buffer's region read by one iteration of a loop into a `local` buffer first (packing a panel where a task uses it) |
//! | [`rfactor`](Schedule::rfactor) | turn a reduction over `for r_o { for r_i }` into per-lane partial results `rf[r_i]` plus a final reduction |
//! | [`bind`](Schedule::bind) | bind a loop to `blockIdx.*` / `threadIdx.*` (device kernels) |
//! | [`cache_read_shared`](Schedule::cache_read_shared) | stage the tile one iteration of a loop reads in a `shared` buffer, loaded by the block's threads between barriers |
//! | [`block_reduce`](Schedule::block_reduce) | a reduction over `for o { for t }` done by `t` threads: per-thread partials, then a tree in `shared` memory |
//! | [`compute_inline`](Schedule::compute_inline) | replace each read of a buffer the function computes by the expression that computed it, removing its nest and its memory (a convolution's padding copy) |
//! | [`prefetch`](Schedule::prefetch) | before each load of a buffer in a loop, prefetch what the same load reads some iterations of an enclosing loop later |
//!
//! The primitives check the *shape* of what they transform (perfect nests, constant extents,
//! affine indices). Like TVM's, they trust the caller about dependences: `parallel`, `vectorize`,
//! `reorder` and `fission` are legal only when the iterations they reorder are independent.
//!
//!
//! # Files
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`Schedule`], [`ScheduleError`], and the loop lookup every primitive edits through |
//! | `loops.rs` | loop structure: `split`, `tile`, `reorder`, `fuse`, `partition`, `fission`, `decompose_reduction` |
//! | `kinds.rs` | loop kinds: `parallel`, `vectorize`, `unroll` (and the nesting rule they keep) |
//! | `layout.rs` | `transform_layout` and its [`AxisMap`] |
//! | `cache.rs` | `cache_write`, `cache_read` |
//! | `reduce.rs` | `rfactor` |
//! | `device.rs` | device kernels: `bind`, `cache_read_shared`, `block_reduce` |
//! | `inline.rs` | `compute_inline` |
//! | `prefetch.rs` | `prefetch` |
//! | `step.rs` | [`Step`], the JSON form of a schedule, and [`Schedule::apply`] |
//! | `kernels.rs` | scheduled versions of the kernels of [`crate::ir::kernels`] |
//! # Example
//!
//! ```
//! use kiln::ir::{kernels, interp};
//! use kiln::schedule::Schedule;
//!
//! let mut s = Schedule::new(kernels::rowsum_sized(8, 64));
//! let (_ko, ki) = s.split("k0", 16)?;          // k0 -> k0_o, k0_i
//! let rf = s.rfactor("k0_o", &ki)?;           // partial sums rf[16], vectorizable
//! s.vectorize(&ki)?;
//! s.parallel("i")?;
//! let f = s.finish()?;                        // verified
//! assert!(f.to_string().contains("vectorized"));
//! # let _ = rf;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod auto;
mod cache;
mod device;
mod inline;
pub use inline::inline_copies;
mod kinds;
mod layout;
mod loops;
mod prefetch;
mod reduce;
mod step;

use crate::ir::rewrite;

pub mod kernels;

use crate::ir::{Buffer, DataType, Expr, ForKind, Param, PrimFunc, Stmt, Var};
use rewrite::loop_names;

pub use layout::AxisMap;
pub use step::Step;

/// Why a schedule primitive refused to transform the function. Fix the schedule.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// No loop (or several loops) has this name.
    #[error("schedule of `{func}`: {message}")]
    Loop {
        /// The function.
        func: String,
        /// What was looked for and found.
        message: String,
    },
    /// The loops or statements do not have the form the primitive needs.
    #[error("schedule of `{func}`: `{primitive}` {message}")]
    Form {
        /// The function.
        func: String,
        /// The primitive.
        primitive: &'static str,
        /// What was expected and what was seen.
        message: String,
    },
    /// The scheduled function does not verify (a bug in a primitive).
    #[error("schedule of `{func}` produced invalid IR: {source}")]
    Verify {
        /// The function.
        func: String,
        /// The verifier's error.
        source: crate::ir::IrError,
    },
}

/// `Result` of the schedule primitives.
pub type ScheduleResult<T> = Result<T, ScheduleError>;

/// A function being scheduled.
#[derive(Clone, Debug)]
pub struct Schedule {
    func: PrimFunc,
    /// The primitives applied so far, as steps ([`Schedule::trace`]).
    trace: Vec<Step>,
    /// Nesting of primitive calls: a primitive that calls others is one step.
    depth: u32,
}

type Enclosing = Vec<(Var, Expr, Expr)>;

/// Finds the loop `name` in `s`; `f` rebuilds it. `Ok(None)`: not in `s`.
fn edit_loop(
    s: &Stmt,
    name: &str,
    enc: &mut Enclosing,
    f: &mut dyn FnMut(&Stmt, &Enclosing) -> ScheduleResult<Stmt>,
) -> ScheduleResult<Option<Stmt>> {
    Ok(match s {
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => {
            if &*var.name == name {
                return f(s, enc).map(Some);
            }
            enc.push((var.clone(), min.clone(), extent.clone()));
            let r = edit_loop(body, name, enc, f);
            enc.pop();
            r?.map(|b| Stmt::For {
                var: var.clone(),
                min: min.clone(),
                extent: extent.clone(),
                kind: *kind,
                body: Box::new(b),
            })
        }
        Stmt::Allocate { buffer, body } => edit_loop(body, name, enc, f)?.map(|b| Stmt::Allocate {
            buffer: buffer.clone(),
            body: Box::new(b),
        }),
        Stmt::Let { var, value, body } => edit_loop(body, name, enc, f)?.map(|b| Stmt::Let {
            var: var.clone(),
            value: value.clone(),
            body: Box::new(b),
        }),
        Stmt::IfThenElse {
            cond,
            then_case,
            else_case,
        } => {
            if let Some(t) = edit_loop(then_case, name, enc, f)? {
                Some(Stmt::IfThenElse {
                    cond: cond.clone(),
                    then_case: Box::new(t),
                    else_case: else_case.clone(),
                })
            } else if let Some(e) = else_case {
                edit_loop(e, name, enc, f)?.map(|e| Stmt::IfThenElse {
                    cond: cond.clone(),
                    then_case: then_case.clone(),
                    else_case: Some(Box::new(e)),
                })
            } else {
                None
            }
        }
        Stmt::Seq(v) => {
            for (k, c) in v.iter().enumerate() {
                if let Some(n) = edit_loop(c, name, enc, f)? {
                    let mut v = v.clone();
                    v[k] = n;
                    return Ok(Some(Stmt::Seq(v)));
                }
            }
            None
        }
        _ => None,
    })
}

/// `f` with every loop named once: the second loop named `j` (in the order the body is
/// written) becomes `j_1`, the third `j_2` (or the next free names), so that a primitive can
/// name each. A function's own names are kept where they are unique, so a schedule written for
/// them applies unchanged.
fn unique_loop_names(mut f: PrimFunc) -> PrimFunc {
    let mut all = Vec::new();
    loop_names(&f.body, &mut all);
    let mut seen = std::collections::HashSet::new();
    if all.iter().all(|n| seen.insert(n.clone())) {
        return f;
    }
    rewrite::allocated(&f.body, &mut all);
    all.extend(f.params.iter().map(|p| match p {
        Param::Buffer(b) => b.name.clone(),
        Param::Scalar(v) => v.name.to_string(),
    }));
    let mut taken: std::collections::HashSet<String> = all.into_iter().collect();
    let mut named = std::collections::HashSet::new();
    f.body = rename_repeats(&f.body, &mut named, &mut taken);
    f
}

fn rename_repeats(
    s: &Stmt,
    named: &mut std::collections::HashSet<String>,
    taken: &mut std::collections::HashSet<String>,
) -> Stmt {
    let Stmt::For {
        var,
        min,
        extent,
        kind,
        body,
    } = s
    else {
        return s.map_children(|c| rename_repeats(c, named, taken));
    };
    if named.insert(var.name.to_string()) {
        return s.map_children(|c| rename_repeats(c, named, taken));
    }
    let fresh = (1..)
        .map(|k| format!("{}_{k}", var.name))
        .find(|n| !taken.contains(n))
        .expect("a free name");
    taken.insert(fresh.clone());
    named.insert(fresh.clone());
    let v = Var::new(&fresh, var.dtype);
    let map = std::collections::HashMap::from([(var.id, Expr::Var(v.clone()))]);
    let body = rename_repeats(&rewrite::subst_stmt(body, &map), named, taken);
    for_(v, min.clone(), extent.clone(), *kind, body)
}

fn parts(s: &Stmt) -> (&Var, &Expr, &Expr, ForKind, &Stmt) {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => (var, min, extent, *kind, body),
        _ => unreachable!("edit_loop only passes loops"),
    }
}

fn for_(var: Var, min: Expr, extent: Expr, kind: ForKind, body: Stmt) -> Stmt {
    Stmt::For {
        var,
        min,
        extent,
        kind,
        body: Box::new(body),
    }
}

fn imm(t: DataType, v: i64) -> Expr {
    Expr::IntImm { dtype: t, value: v }
}

/// `e` as type `t`: itself where it has that type already, else converted.
fn cast_to(e: Expr, t: DataType) -> Expr {
    if e.dtype() == t {
        e
    } else {
        e.cast(t)
    }
}

fn guard(cond: Expr, body: Stmt) -> Stmt {
    Stmt::IfThenElse {
        cond,
        then_case: Box::new(body),
        else_case: None,
    }
}

impl Schedule {
    /// Starts scheduling `func`.
    pub fn new(func: PrimFunc) -> Schedule {
        Schedule {
            func: unique_loop_names(func),
            trace: Vec::new(),
            depth: 0,
        }
    }

    /// The primitives applied so far, as [`Step`]s that [`Schedule::apply`] replays on the
    /// same function (a primitive that applies others is recorded once, as itself). A hand
    /// schedule written in Rust thus becomes data: a tuning record, a search's starting point.
    pub fn trace(&self) -> &[Step] {
        &self.trace
    }

    /// Runs a primitive and records it when it succeeds at the outermost level.
    fn traced<T>(
        &mut self,
        step: impl FnOnce() -> Step,
        f: impl FnOnce(&mut Self) -> ScheduleResult<T>,
    ) -> ScheduleResult<T> {
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        if r.is_ok() && self.depth == 0 {
            self.trace.push(step());
        }
        r
    }

    /// The function as scheduled so far (not verified).
    pub fn func(&self) -> &PrimFunc {
        &self.func
    }

    /// Verifies and returns the scheduled function.
    ///
    /// # Errors
    /// [`ScheduleError::Verify`] if a primitive produced ill-formed IR.
    pub fn finish(self) -> ScheduleResult<PrimFunc> {
        self.func.verify().map_err(|source| ScheduleError::Verify {
            func: self.func.name.clone(),
            source,
        })?;
        Ok(self.func)
    }

    fn form(&self, primitive: &'static str, message: impl Into<String>) -> ScheduleError {
        ScheduleError::Form {
            func: self.func.name.clone(),
            primitive,
            message: message.into(),
        }
    }

    fn names(&self) -> Vec<String> {
        let mut v = Vec::new();
        loop_names(&self.func.body, &mut v);
        v
    }

    /// A loop name not used yet, based on `base`.
    fn fresh(&self, base: &str, taken: &[String]) -> String {
        let names = self.names();
        let used = |n: &str| names.iter().chain(taken).any(|m| m == n);
        if !used(base) {
            return base.to_owned();
        }
        (1..)
            .map(|k| format!("{base}_{k}"))
            .find(|n| !used(n))
            .expect("some suffix is free")
    }

    /// A prefix for new loops named `{prefix}{tag}{d}` (a tag of `tags`, `d` a number): `base`,
    /// else `base_1`, `base_2`, ..., the first with which no loop of the function is named so.
    fn fresh_prefix(&self, base: &str, tags: &[&str]) -> String {
        let names = self.names();
        let clashes = |p: &str| {
            names.iter().any(|n| {
                n.strip_prefix(p).is_some_and(|rest| {
                    tags.iter().any(|t| {
                        rest.strip_prefix(t)
                            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                    })
                })
            })
        };
        std::iter::once(base.to_owned())
            .chain((1..).map(|k| format!("{base}_{k}")))
            .find(|p| !clashes(p))
            .expect("some suffix is free")
    }

    /// A buffer name free in the function: `base`, else `base1`, `base2`, ... (not a parameter,
    /// an allocation or a loop name).
    fn fresh_buffer(&self, base: &str) -> String {
        let mut names = self.names();
        rewrite::allocated(&self.func.body, &mut names);
        let free = |n: &String| self.find_buffer(n).is_none() && !names.contains(n);
        std::iter::once(base.to_owned())
            .chain((1..).map(|k| format!("{base}{k}")))
            .find(free)
            .expect("some suffix is free")
    }

    fn edit(
        &mut self,
        name: &str,
        f: &mut dyn FnMut(&Stmt, &Enclosing) -> ScheduleResult<Stmt>,
    ) -> ScheduleResult<()> {
        let count = self.names().iter().filter(|n| *n == name).count();
        if count != 1 {
            return Err(ScheduleError::Loop {
                func: self.func.name.clone(),
                message: format!(
                    "expected exactly one loop named `{name}`, found {count} (loops: {})",
                    self.names().join(", ")
                ),
            });
        }
        let body =
            edit_loop(&self.func.body, name, &mut Vec::new(), f)?.expect("the loop was counted");
        self.func.body = body;
        Ok(())
    }

    fn find_buffer(&self, name: &str) -> Option<Buffer> {
        self.func.params.iter().find_map(|p| match p {
            Param::Buffer(b) if b.name == name => Some(b.clone()),
            _ => None,
        })
    }
}
