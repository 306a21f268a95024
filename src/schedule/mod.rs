//! Schedule primitives: IR-to-IR loop transformations that turn a plain loop nest into a fast one.
//!
//! # Design
//!
//! A [`Schedule`] owns a [`PrimFunc`] and rewrites its body in place. Loops are named by their loop
//! variable (`"i"`, `"k0"`), so schedules apply equally to functions built in Rust and to functions
//! read from JSON; every primitive that creates loops returns their names. Each primitive is a
//! plain IR rewrite: the result is an ordinary `PrimFunc`, which the verifier checks
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
//! | [`parallel`](Schedule::parallel), [`vectorize`](Schedule::vectorize), [`unroll`](Schedule::unroll) | set the loop kind |
//! | [`transform_layout`](Schedule::transform_layout) | pack a read-only buffer into a workspace with another layout (e.g. `B[k, n]` → `Bp[n/16, k, n%16]`) |
//! | [`cache_write`](Schedule::cache_write) | accumulate a buffer's region touched by one iteration of a loop in a `local` buffer (registers), then write it back |
//! | [`rfactor`](Schedule::rfactor) | turn a reduction over `for r_o { for r_i }` into per-lane partial results `rf[r_i]` plus a final reduction |
//! | [`bind`](Schedule::bind) | bind a loop to `blockIdx.*` / `threadIdx.*` (device kernels) |
//! | [`cache_read_shared`](Schedule::cache_read_shared) | stage the tile one iteration of a loop reads in a `shared` buffer, loaded by the block's threads between barriers |
//! | [`block_reduce`](Schedule::block_reduce) | a reduction over `for o { for t }` done by `t` threads: per-thread partials, then a tree in `shared` memory |
//!
//! The primitives check the *shape* of what they transform (perfect nests, constant extents,
//! affine indices). Like TVM's, they trust the caller about dependences: `parallel`, `vectorize`,
//! `reorder` and `fission` are legal only when the iterations they reorder are independent.
//!
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

mod device;
pub(crate) mod rewrite;

pub mod kernels;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::ir::builder::Reducer;
use crate::ir::{
    BinOp, Buffer, DataType, Expr, ForKind, Param, PrimFunc, Stmt, StorageScope, ThreadTag, Var,
};
use rewrite::{linear, loop_names, rw_stmt, subst_stmt, Lin, Rewriter};

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

/// One dimension of a transformed layout: new index = `(old[axis] / div) % modulo`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AxisMap {
    /// The old dimension it reads.
    pub axis: usize,
    /// Divisor (1 for none).
    #[serde(default = "one")]
    pub div: i64,
    /// Modulus (none: the whole quotient).
    #[serde(default)]
    pub modulo: Option<i64>,
}

fn one() -> i64 {
    1
}

impl AxisMap {
    /// `old[axis]`.
    pub fn id(axis: usize) -> AxisMap {
        AxisMap {
            axis,
            div: 1,
            modulo: None,
        }
    }
    /// `old[axis] / div`.
    pub fn outer(axis: usize, div: i64) -> AxisMap {
        AxisMap {
            axis,
            div,
            modulo: None,
        }
    }
    /// `old[axis] % modulo`.
    pub fn inner(axis: usize, modulo: i64) -> AxisMap {
        AxisMap {
            axis,
            div: 1,
            modulo: Some(modulo),
        }
    }
}

/// One schedule step, for schedules kept as JSON (`[{"split": {"loop": "i", "factor": 8}}, ...]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// [`Schedule::split`].
    Split {
        /// Loop name.
        #[serde(rename = "loop")]
        loop_: String,
        /// Inner extent.
        factor: i64,
    },
    /// [`Schedule::reorder`].
    Reorder {
        /// Loop names, outermost first.
        loops: Vec<String>,
    },
    /// [`Schedule::fuse`].
    Fuse {
        /// Outer loop.
        outer: String,
        /// Inner loop.
        inner: String,
    },
    /// [`Schedule::partition`].
    Partition {
        /// Loop name.
        #[serde(rename = "loop")]
        loop_: String,
        /// Iterations in the first part.
        at: i64,
    },
    /// [`Schedule::fission`].
    Fission {
        /// Loop name.
        #[serde(rename = "loop")]
        loop_: String,
    },
    /// Sets a loop's kind (`parallel`, `vectorized`, `unrolled`, `serial`).
    Kind {
        /// Loop name.
        #[serde(rename = "loop")]
        loop_: String,
        /// The kind's JSON name.
        kind: String,
    },
    /// [`Schedule::transform_layout`].
    TransformLayout {
        /// The buffer packed.
        buffer: String,
        /// The new buffer's name.
        into: String,
        /// Its dimensions.
        dims: Vec<AxisMap>,
    },
    /// [`Schedule::cache_write`].
    CacheWrite {
        /// The buffer cached.
        buffer: String,
        /// The loop whose body the cache covers.
        at: String,
    },
    /// [`Schedule::rfactor`].
    Rfactor {
        /// The outer reduction loop.
        outer: String,
        /// The inner reduction loop (becomes the factor axis).
        inner: String,
    },
    /// [`Schedule::bind`].
    Bind {
        /// Loop name.
        #[serde(rename = "loop")]
        loop_: String,
        /// `blockIdx.x` .. `threadIdx.z`.
        thread: String,
    },
    /// [`Schedule::cache_read_shared`].
    CacheReadShared {
        /// The buffer staged.
        buffer: String,
        /// The loop whose iterations read one tile.
        at: String,
    },
    /// [`Schedule::block_reduce`].
    BlockReduce {
        /// The outer (per-thread, serial) reduction loop.
        outer: String,
        /// The inner reduction loop (becomes `threadIdx.x`).
        inner: String,
    },
}

/// A function being scheduled.
#[derive(Clone, Debug)]
pub struct Schedule {
    func: PrimFunc,
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

fn expr_mentions(e: &Expr, v: &Var) -> bool {
    rewrite::mentions(&Stmt::Evaluate(e.clone()), v)
}

impl Schedule {
    /// Starts scheduling `func`.
    pub fn new(func: PrimFunc) -> Schedule {
        Schedule { func }
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

    /// Splits loop `name` into `name_o` (outer) and `name_i` (inner, extent `factor`), returning
    /// their names. When `factor` does not divide a constant extent (or the extent is symbolic),
    /// the body is guarded by `if name_o * factor + name_i < extent`. A factor above a constant
    /// extent is taken as the extent (`name_o` then has one iteration).
    ///
    /// # Errors
    /// No such loop, or `factor < 1`.
    pub fn split(&mut self, name: &str, factor: i64) -> ScheduleResult<(String, String)> {
        if factor < 1 {
            return Err(self.form("split", format!("needs a factor >= 1, found {factor}")));
        }
        let on = self.fresh(&format!("{name}_o"), &[]);
        let inn = self.fresh(&format!("{name}_i"), std::slice::from_ref(&on));
        let (o2, i2) = (on.clone(), inn.clone());
        let func = self.func.name.clone();
        self.edit(name, &mut |s, _| {
            let (var, min, extent, kind, body) = parts(s);
            let t = var.dtype;
            // A factor above a constant extent: one outer iteration of the whole extent (an
            // inner loop of `factor` iterations, nearly all guarded off, would only cost).
            let factor = match extent.as_int() {
                Some(e) if e >= 1 => factor.min(e),
                _ => factor,
            };
            if t.bits < 64 && factor > i64::from(i32::MAX) {
                return Err(ScheduleError::Form {
                    func: func.clone(),
                    primitive: "split",
                    message: format!(
                        "needs a factor that fits the loop variable's type {t}, found {factor}"
                    ),
                });
            }
            let vo = Var::new(&o2, t);
            let vi = Var::new(&i2, t);
            let idx = Expr::binary(
                BinOp::Add,
                Expr::binary(BinOp::Mul, Expr::Var(vo.clone()), imm(t, factor)),
                Expr::Var(vi.clone()),
            );
            let full = rewrite::fold(Expr::binary(BinOp::Add, min.clone(), idx.clone()));
            let map = HashMap::from([(var.id, full)]);
            let mut nb = subst_stmt(body, &map);
            nb = rewrite::simplify_divmod(&nb, &HashMap::from([(vi.id, (0, factor))]));
            let outer_ext = match extent.as_int() {
                Some(e) if e % factor == 0 => imm(t, e / factor),
                Some(e) => {
                    nb = guard(idx.clone().lt(extent.clone()), nb);
                    // ceil(e / factor), without the overflow of e + factor - 1.
                    imm(
                        t,
                        e.div_euclid(factor) + i64::from(e.rem_euclid(factor) != 0),
                    )
                }
                None => {
                    nb = guard(idx.clone().lt(extent.clone()), nb);
                    (extent.clone() + imm(t, factor - 1)).floordiv(imm(t, factor))
                }
            };
            let inner = sink_guards(for_(vi, imm(t, 0), imm(t, factor), ForKind::Serial, nb));
            Ok(for_(vo, imm(t, 0), outer_ext, kind, inner))
        })?;
        Ok((on, inn))
    }

    /// Splits `a` by `fa` and `b` by `fb` (`b` nested in `a`) and orders the loops
    /// `a_o, b_o, a_i, b_i`, returning those four names.
    ///
    /// # Errors
    /// As [`split`](Self::split) and [`reorder`](Self::reorder).
    pub fn tile(&mut self, a: &str, b: &str, fa: i64, fb: i64) -> ScheduleResult<[String; 4]> {
        let (ao, ai) = self.split(a, fa)?;
        let (bo, bi) = self.split(b, fb)?;
        self.reorder(&[&ao, &bo, &ai, &bi])?;
        Ok([ao, bo, ai, bi])
    }

    /// Reorders the named loops, which must lie in one perfect nest (each loop's body directly
    /// the next loop) whose bounds do not depend on each other's variables. Loops of the nest
    /// that are not named keep their places.
    ///
    /// # Errors
    /// Unknown loops, or loops that are not one perfect nest.
    pub fn reorder(&mut self, order: &[&str]) -> ScheduleResult<()> {
        let names = self.names();
        let Some(first) = names.iter().find(|n| order.contains(&n.as_str())).cloned() else {
            return Err(self.form("reorder", format!("found none of the loops {order:?}")));
        };
        let err = self.form(
            "reorder",
            format!("needs the loops {order:?} in one perfect nest (each loop's body the next loop), with independent bounds"),
        );
        let mut failed = false;
        self.edit(&first, &mut |s, _| {
            // Collect the chain down to the last named loop.
            let mut chain: Vec<(Var, Expr, Expr, ForKind)> = Vec::new();
            let mut cur = s;
            let mut seen = 0;
            while let Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } = cur
            {
                chain.push((var.clone(), min.clone(), extent.clone(), *kind));
                if order.contains(&&*var.name) {
                    seen += 1;
                }
                cur = body;
                if seen == order.len() {
                    break;
                }
            }
            let inner_body = cur.clone();
            let indep = chain.iter().all(|(_, mn, ex, _)| {
                chain
                    .iter()
                    .all(|(v, ..)| !expr_mentions(mn, v) && !expr_mentions(ex, v))
            });
            if seen != order.len() || !indep {
                failed = true;
                return Ok(s.clone());
            }
            let mut named = order.iter().map(|n| {
                chain
                    .iter()
                    .find(|(v, ..)| &*v.name == *n)
                    .cloned()
                    .expect("seen")
            });
            let new_chain: Vec<_> = chain
                .iter()
                .map(|l| {
                    if order.contains(&&*l.0.name) {
                        named.next().expect("same count")
                    } else {
                        l.clone()
                    }
                })
                .collect();
            Ok(new_chain
                .into_iter()
                .rev()
                .fold(inner_body, |b, (v, mn, ex, k)| for_(v, mn, ex, k, b)))
        })?;
        if failed {
            return Err(err);
        }
        Ok(())
    }

    /// Fuses `outer` and `inner` (the whole body of `outer`, constant-or-independent extents) into
    /// one loop `outer_inner` and returns its name.
    ///
    /// # Errors
    /// The loops are not directly nested, or `inner`'s bounds depend on `outer`.
    pub fn fuse(&mut self, outer: &str, inner: &str) -> ScheduleResult<String> {
        let name = self.fresh(&format!("{outer}_{inner}"), &[]);
        let mut bad = None;
        let n2 = name.clone();
        self.edit(outer, &mut |s, _| {
            let (vo, mo, eo, kind, body) = parts(s);
            let Stmt::For {
                var: vi,
                min: mi,
                extent: ei,
                body: ib,
                ..
            } = body
            else {
                bad = Some("needs the inner loop to be the whole body of the outer loop");
                return Ok(s.clone());
            };
            if &*vi.name != inner || expr_mentions(mi, vo) || expr_mentions(ei, vo) {
                bad = Some("needs the inner loop, with bounds independent of the outer loop, as the outer loop's body");
                return Ok(s.clone());
            }
            let t = vo.dtype;
            let ei = if ei.dtype() == t {
                ei.clone()
            } else {
                ei.clone().cast(t)
            };
            let f = Var::new(&n2, t);
            let fo = Expr::Var(f.clone()).floordiv(ei.clone());
            let fi = Expr::Var(f.clone()).floormod(ei.clone());
            let fi = if vi.dtype == t { fi } else { fi.cast(vi.dtype) };
            let map = HashMap::from([
                (vo.id, rewrite::fold(mo.clone() + fo)),
                (vi.id, rewrite::fold(mi.clone() + fi)),
            ]);
            let ext = match (eo.as_int(), ei.as_int()) {
                (Some(a), Some(b)) => imm(t, a * b),
                _ => eo.clone() * ei.clone(),
            };
            Ok(for_(f, imm(t, 0), ext, kind, subst_stmt(ib, &map)))
        })?;
        match bad {
            Some(m) => Err(self.form("fuse", m)),
            None => Ok(name),
        }
    }

    /// Splits the range of loop `name` at `at` iterations: `for i in [min, min + extent) { b }`
    /// becomes `for i in [min, min + at) { b }; for i_p in [0, extent - at) { b' }`, where `b'`
    /// is `b` with `i` replaced by `i_p + min + at` and every loop inside renamed (`j` ->
    /// `j_p`, or the first free `j_p_1`, ...), so that each part can be scheduled on its own (the
    /// full tiles of a split in one part, the rest in the other, with no bounds guard in the
    /// first: TVM's loop partitioning, by hand). Returns the second part's loop names: the
    /// partitioned loop and each loop inside it, from its name in the first part to its name
    /// in the second.
    ///
    /// # Errors
    /// A loop without constant bounds, `at` not strictly inside the range, or a body that
    /// allocates or binds variables (partition before `cache_write` and the like).
    pub fn partition(&mut self, name: &str, at: i64) -> ScheduleResult<HashMap<String, String>> {
        let mut renamed: Vec<(String, String)> = Vec::new();
        let mut problem: Option<String> = None;
        let me = self.clone();
        self.edit(name, &mut |s, _| {
            let (var, min, extent, kind, body) = parts(s);
            let (Some(lo), Some(ext)) = (min.as_int(), extent.as_int()) else {
                problem = Some(format!("needs loop `{name}` to have constant bounds"));
                return Ok(s.clone());
            };
            if at <= 0 || at >= ext {
                problem = Some(format!(
                    "needs 0 < at < {ext} (the extent of `{name}`), found at = {at}"
                ));
                return Ok(s.clone());
            }
            struct Binds(bool);
            impl crate::ir::visit::Visitor for Binds {
                fn stmt(&mut self, st: &Stmt) {
                    self.0 |= matches!(st, Stmt::Allocate { .. } | Stmt::Let { .. });
                    crate::ir::visit::walk_stmt(self, st);
                }
                fn expr(&mut self, _: &Expr) {}
            }
            let mut binds = Binds(false);
            crate::ir::visit::Visitor::stmt(&mut binds, body);
            if binds.0 {
                problem = Some(format!(
                    "needs the body of `{name}` free of allocations and lets (partition it \
                     before cache_write and the like)"
                ));
                return Ok(s.clone());
            }
            let t = var.dtype;
            let second = me.fresh(&format!("{name}_p"), &[]);
            let mut taken = vec![second.clone()];
            renamed.push((name.to_owned(), second.clone()));
            let v = Var::new(&second, t);
            let shifted = Expr::Var(v.clone()) + imm(t, lo + at);
            let copy = subst_stmt(body, &HashMap::from([(var.id, shifted)]));
            let copy = rename_loops(&copy, &me, &mut taken, &mut renamed);
            Ok(Stmt::Seq(vec![
                for_(var.clone(), min.clone(), imm(t, at), kind, body.clone()),
                for_(v, imm(t, 0), imm(t, ext - at), kind, copy),
            ]))
        })?;
        match problem {
            Some(m) => Err(self.form("partition", m)),
            None => Ok(renamed.into_iter().collect()),
        }
    }

    /// Distributes loop `name` over the statements of its body (a sequence): `for i { a; b }`
    /// becomes `for i { a }; for i_1 { b }`. Returns the new loops' names in order.
    ///
    /// # Errors
    /// The body is not a sequence.
    pub fn fission(&mut self, name: &str) -> ScheduleResult<Vec<String>> {
        let mut out = Vec::new();
        let mut bad = false;
        let me = self.clone();
        self.edit(name, &mut |s, _| {
            let (var, min, extent, kind, body) = parts(s);
            // A guard around the sequence guards each statement.
            let distributed;
            let stmts = match body {
                Stmt::Seq(stmts) => stmts,
                Stmt::IfThenElse {
                    cond,
                    then_case,
                    else_case: None,
                } if matches!(&**then_case, Stmt::Seq(_)) => {
                    let Stmt::Seq(v) = &**then_case else {
                        unreachable!("matched")
                    };
                    distributed = v
                        .iter()
                        .map(|st| sink_guards(guard(cond.clone(), st.clone())))
                        .collect::<Vec<_>>();
                    &distributed
                }
                _ => {
                    bad = true;
                    return Ok(s.clone());
                }
            };
            let mut loops = Vec::new();
            for (k, st) in stmts.iter().enumerate() {
                let n = if k == 0 {
                    name.to_owned()
                } else {
                    me.fresh(&format!("{name}_{k}"), &out)
                };
                let v = Var::new(&n, var.dtype);
                let map = HashMap::from([(var.id, Expr::Var(v.clone()))]);
                loops.push(for_(
                    v,
                    min.clone(),
                    extent.clone(),
                    kind,
                    subst_stmt(st, &map),
                ));
                out.push(n);
            }
            Ok(Stmt::Seq(loops))
        })?;
        if bad {
            return Err(self.form(
                "fission",
                format!("needs loop `{name}` to have a sequence as its body"),
            ));
        }
        Ok(out)
    }

    fn set_kind(&mut self, name: &str, kind: ForKind) -> ScheduleResult<()> {
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

    /// Runs loop `name`'s iterations on the thread pool.
    ///
    /// # Errors
    /// No such loop.
    pub fn parallel(&mut self, name: &str) -> ScheduleResult<()> {
        self.set_kind(name, ForKind::Parallel)
    }

    /// Runs loop `name`'s iterations as SIMD lanes (constant extent).
    ///
    /// # Errors
    /// No such loop, or a symbolic extent.
    pub fn vectorize(&mut self, name: &str) -> ScheduleResult<()> {
        self.set_kind(name, ForKind::Vectorized)
    }

    /// Unrolls loop `name` (constant extent).
    ///
    /// # Errors
    /// No such loop, or a symbolic extent.
    pub fn unroll(&mut self, name: &str) -> ScheduleResult<()> {
        self.set_kind(name, ForKind::Unrolled)
    }

    fn find_buffer(&self, name: &str) -> Option<Buffer> {
        self.func.params.iter().find_map(|p| match p {
            Param::Buffer(b) if b.name == name => Some(b.clone()),
            _ => None,
        })
    }

    /// Packs the read-only parameter buffer `buffer` into a new `workspace` buffer `into` whose
    /// dimension `d` is indexed by `dims[d]` applied to the old indices, filled at the start of
    /// the function by a loop nest named `into_l0, into_l1, ...` (one loop per old dimension,
    /// returned, to be scheduled like any other); every load of `buffer` then reads `into`.
    ///
    /// # Errors
    /// Unknown or written buffer, symbolic shape, or a map that is not one-to-one.
    pub fn transform_layout(
        &mut self,
        buffer: &str,
        into: &str,
        dims: &[AxisMap],
    ) -> ScheduleResult<Vec<String>> {
        let old = self.find_buffer(buffer).ok_or_else(|| {
            self.form(
                "transform_layout",
                format!("found no parameter buffer `{buffer}`"),
            )
        })?;
        let (mut loads, mut stores) = (vec![], vec![]);
        rewrite::accesses(&self.func.body, buffer, &mut loads, &mut stores);
        if !stores.is_empty() {
            return Err(self.form(
                "transform_layout",
                format!("needs `{buffer}` to be read-only"),
            ));
        }
        let shape: Vec<i64> = old
            .shape
            .iter()
            .map(|e| e.as_int())
            .collect::<Option<_>>()
            .ok_or_else(|| {
                self.form(
                    "transform_layout",
                    format!("needs `{buffer}` to have a constant shape"),
                )
            })?;
        let mut taken = self.names();
        rewrite::allocated(&self.func.body, &mut taken);
        if self.find_buffer(into).is_some() || taken.iter().any(|n| n == into) {
            return Err(self.form(
                "transform_layout",
                format!("needs a new name for the packed buffer, found `{into}`, which is taken"),
            ));
        }
        if let Some(m) = dims
            .iter()
            .find(|m| m.div < 1 || m.modulo.is_some_and(|md| md < 1))
        {
            return Err(self.form(
                "transform_layout",
                format!("needs div >= 1 and modulo >= 1, found {m:?}"),
            ));
        }
        // ceil(e / d) for a dimension's extent e >= 0, without the overflow of e + d - 1.
        let ceil_div = |e: i64, d: i64| e.max(0) / d + i64::from(e.max(0) % d != 0);
        let mut new_shape = Vec::new();
        for m in dims {
            let Some(&e) = shape.get(m.axis) else {
                return Err(self.form(
                    "transform_layout",
                    format!(
                        "axis {} is out of range for `{buffer}` of rank {}",
                        m.axis,
                        shape.len()
                    ),
                ));
            };
            let q = ceil_div(e, m.div);
            new_shape.push(m.modulo.map_or(q, |md| md.min(q)));
        }
        // One-to-one: the old axes' strides of the map must cover each old extent exactly.
        for (a, &e) in shape.iter().enumerate() {
            let mut covered: Vec<(i64, i64)> = dims
                .iter()
                .filter(|m| m.axis == a)
                .map(|m| {
                    let reach = m.modulo.unwrap_or_else(|| ceil_div(e, m.div));
                    (m.div, m.div.saturating_mul(reach))
                })
                .collect();
            covered.sort();
            let mut next = 1;
            for (lo, hi) in covered {
                if lo != next {
                    next = -1;
                    break;
                }
                next = hi;
            }
            if next < e {
                return Err(self.form(
                    "transform_layout",
                    format!(
                        "map {dims:?} does not keep every index of axis {a} of `{buffer}` apart"
                    ),
                ));
            }
        }
        let names: Vec<String> = (0..shape.len())
            .map(|d| self.fresh(&format!("{into}_l{d}"), &[]))
            .collect();
        let t = DataType::i64();
        let nb = Buffer::new(
            into,
            old.dtype,
            new_shape.iter().map(|&e| imm(t, e)).collect(),
        )
        .with_scope(StorageScope::Workspace);
        let map_idx = |ix: &[Expr]| -> Vec<Expr> {
            dims.iter()
                .map(|m| {
                    let mut e = ix[m.axis].clone();
                    if ix[m.axis].dtype() != t {
                        e = e.cast(t);
                    }
                    if m.div != 1 {
                        e = e.floordiv(imm(t, m.div));
                    }
                    if let Some(md) = m.modulo {
                        e = e.floormod(imm(t, md));
                    }
                    e
                })
                .collect()
        };
        // The fill nest.
        let vars: Vec<Var> = names.iter().map(|n| Var::new(n, t)).collect();
        let ix: Vec<Expr> = vars.iter().map(|v| Expr::Var(v.clone())).collect();
        let mut fill = nb.store(map_idx(&ix), old.load(ix.clone()));
        for (v, &e) in vars.iter().zip(&shape).rev() {
            fill = for_(v.clone(), imm(t, 0), imm(t, e), ForKind::Serial, fill);
        }
        struct Redirect<'a> {
            name: &'a str,
            nb: &'a Buffer,
            map: &'a dyn Fn(&[Expr]) -> Vec<Expr>,
        }
        impl Rewriter for Redirect<'_> {
            fn post_expr(&mut self, e: Expr) -> Expr {
                match &e {
                    Expr::Load { buffer, indices } if buffer.name == self.name => {
                        self.nb.load((self.map)(indices))
                    }
                    _ => e,
                }
            }
        }
        let body = rw_stmt(
            &mut Redirect {
                name: buffer,
                nb: &nb,
                map: &map_idx,
            },
            &self.func.body,
        );
        self.func.body = nb.allocate(Stmt::Seq(vec![fill, body]));
        Ok(names)
    }

    /// Caches `buffer` over one iteration of loop `at`: the region the body of `at` reads and
    /// writes (indices affine in the loops inside `at`, with constant bounds) gets a `local`
    /// buffer `<buffer>_local`, loaded before the body and written back after it, guarded where
    /// the region may pass the buffer's end. Returns the cache's name.
    ///
    /// # Errors
    /// Non-affine indices, accesses with different offsets outside `at`, or symbolic inner
    /// bounds.
    pub fn cache_write(&mut self, buffer: &str, at: &str) -> ScheduleResult<String> {
        let target = self.find_buffer(buffer).ok_or_else(|| {
            self.form(
                "cache_write",
                format!("found no parameter buffer `{buffer}`"),
            )
        })?;
        let cname = self.fresh_buffer(&format!("{buffer}_local"));
        let mut problem: Option<String> = None;
        let prefix = self.fresh(&format!("{buffer}_c"), &[]);
        self.edit(at, &mut |s, enc| {
            let (var, min, extent, kind, body) = parts(s);
            // Loops inside `at` with constant bounds.
            let mut inner: HashMap<crate::ir::VarId, (i64, i64)> = HashMap::new();
            collect_loops(body, &mut inner);
            let (mut loads, mut stores) = (vec![], vec![]);
            rewrite::accesses(body, buffer, &mut loads, &mut stores);
            let all: Vec<&Vec<Expr>> = loads.iter().chain(&stores).collect();
            if all.is_empty() {
                problem = Some(format!("found no access to `{buffer}` in loop `{at}`"));
                return Ok(s.clone());
            }
            let nd = target.ndim();
            let mut base: Vec<Lin> = Vec::new();
            let mut ext: Vec<i64> = Vec::new();
            for d in 0..nd {
                let mut outer: Option<Lin> = None;
                let (mut lo, mut hi) = (i64::MAX, i64::MIN);
                for acc in &all {
                    let Some(l) = linear(&acc[d]) else {
                        problem = Some(format!("needs affine indices of `{buffer}`, found `{}`", acc[d]));
                        return Ok(s.clone());
                    };
                    let o = l.without(|v| inner.contains_key(&v.id));
                    let o0 = Lin { terms: o.terms.clone(), c: 0 };
                    match &outer {
                        None => outer = Some(o0),
                        Some(p) if *p == o0 => {}
                        Some(_) => {
                            problem = Some(format!("needs every access of `{buffer}` in `{at}` to have the same outer offset"));
                            return Ok(s.clone());
                        }
                    }
                    let (mut a, mut b) = (o.c, o.c);
                    for (v, k) in &l.terms {
                        if let Some(&(mn, ex)) = inner.get(&v.id) {
                            let (x, y) = (k * mn, k * (mn + ex - 1));
                            a += x.min(y);
                            b += x.max(y);
                        }
                    }
                    lo = lo.min(a);
                    hi = hi.max(b);
                }
                let mut o = outer.expect("some access");
                o.c = lo;
                base.push(o);
                ext.push(hi - lo + 1);
            }
            let t = DataType::i64();
            let cache = Buffer::new(&cname, target.dtype, ext.iter().map(|&e| imm(t, e)).collect())
                .with_scope(StorageScope::Local);
            // Ranges of the enclosing loops (and `at`) for the bounds check.
            let mut ranges: HashMap<crate::ir::VarId, (i64, i64)> = HashMap::new();
            for (v, mn, ex) in enc.iter().chain(std::iter::once(&(var.clone(), min.clone(), extent.clone()))) {
                if let (Some(a), Some(b)) = (mn.as_int(), ex.as_int()) {
                    ranges.insert(v.id, (a, b));
                }
            }
            let in_bounds = |d: usize| -> bool {
                let Some(limit) = target.shape[d].as_int() else { return false };
                let mut hi = base[d].c + ext[d] - 1;
                let mut lo = base[d].c;
                for (v, k) in &base[d].terms {
                    let Some(&(mn, ex)) = ranges.get(&v.id) else { return false };
                    let (x, y) = (k * mn, k * (mn + ex - 1));
                    hi += x.max(y);
                    lo += x.min(y);
                }
                lo >= 0 && hi < limit
            };
            let guarded: Vec<bool> = (0..nd).map(|d| !in_bounds(d)).collect();
            let base_e: Vec<Expr> = base.iter().map(|l| l.to_expr(t)).collect();
            let copy = |to_cache: bool, tag: &str| -> Stmt {
                let vars: Vec<Var> = (0..nd).map(|d| Var::new(&format!("{prefix}{tag}{d}"), t)).collect();
                let r: Vec<Expr> = vars.iter().map(|v| Expr::Var(v.clone())).collect();
                let gi: Vec<Expr> = (0..nd)
                    .map(|d| {
                        let g = rewrite::fold(base_e[d].clone() + r[d].clone());
                        if target.shape[d].dtype() == t { g } else { g.cast(target.shape[d].dtype()) }
                    })
                    .collect();
                let mut st = if to_cache {
                    cache.store(r.clone(), target.load(gi.clone()))
                } else {
                    target.store(gi.clone(), cache.load(r.clone()))
                };
                let mut cond: Option<Expr> = None;
                for d in 0..nd {
                    if guarded[d] {
                        let c = gi[d].clone().lt(target.shape[d].clone());
                        cond = Some(match cond {
                            None => c,
                            Some(x) => x.and(c),
                        });
                    }
                }
                if let Some(c) = cond {
                    st = guard(c, st);
                }
                for (d, v) in vars.into_iter().enumerate().rev() {
                    let k = if d + 1 == nd { ForKind::Vectorized } else { ForKind::Unrolled };
                    st = for_(v, imm(t, 0), imm(t, ext[d]), k, st);
                }
                st
            };
            struct Redirect<'a> {
                name: &'a str,
                cache: &'a Buffer,
                base: &'a [Lin],
            }
            impl Redirect<'_> {
                fn local(&self, ix: &[Expr]) -> Vec<Expr> {
                    ix.iter()
                        .zip(self.base)
                        .map(|(i, b)| {
                            let l = linear(i).expect("checked affine");
                            let mut neg = b.clone();
                            neg.terms.iter_mut().for_each(|(_, k)| *k = -*k);
                            neg.c = -neg.c;
                            let mut sum = l;
                            for (v, k) in neg.terms {
                                match sum.terms.iter_mut().find(|(w, _)| *w == v) {
                                    Some((_, c)) => *c += k,
                                    None => sum.terms.push((v, k)),
                                }
                            }
                            sum.terms.retain(|(_, k)| *k != 0);
                            sum.c += neg.c;
                            sum.to_expr(DataType::i64())
                        })
                        .collect()
                }
            }
            impl Rewriter for Redirect<'_> {
                fn post_expr(&mut self, e: Expr) -> Expr {
                    match &e {
                        Expr::Load { buffer, indices } if buffer.name == self.name => {
                            self.cache.load(self.local(indices))
                        }
                        _ => e,
                    }
                }
                fn post_store(&mut self, buffer: Buffer, indices: Vec<Expr>, value: Expr) -> Stmt {
                    if buffer.name == self.name {
                        self.cache.store(self.local(&indices), value)
                    } else {
                        Stmt::Store { buffer, indices, value }
                    }
                }
            }
            let nbody = rw_stmt(
                &mut Redirect { name: buffer, cache: &cache, base: &base },
                body,
            );
            // The read-in is dead when the body's first statement overwrites the whole cache
            // (the init of an accumulation, `C[i, j] = 0`) before anything reads it.
            let read_in = if loads.is_empty() || overwrites_first(&nbody, &cache, &ext) {
                vec![]
            } else {
                vec![copy(true, "r")]
            };
            let mut seq = read_in;
            seq.push(nbody);
            seq.push(copy(false, "w"));
            Ok(for_(var.clone(), min.clone(), extent.clone(), kind, cache.allocate(Stmt::Seq(seq))))
        })?;
        match problem {
            Some(m) => Err(self.form("cache_write", m)),
            None => Ok(cname),
        }
    }

    /// Factors a reduction: `outer` must be `for outer { for inner { X[ix] = X[ix] op f } }` with
    /// `op` a sum, max or min and `ix` independent of both loops. It becomes
    /// `rf[inner] = identity; for outer { for inner { rf[inner] = rf[inner] op f } };
    /// for inner { X[ix] = X[ix] op rf[inner] }`, so the inner loop can be vectorized with
    /// `rf` in registers. When the inner extent is a power of two (>= 4), the final reduction is
    /// a tree of vectorized halvings (`<inner>_t0, <inner>_t1, ...`) instead of the serial loop
    /// `<inner>_r`. Returns the name of the factor-init loop (`<inner>_z`).
    ///
    /// # Errors
    /// The loops do not have this form.
    pub fn rfactor(&mut self, outer: &str, inner: &str) -> ScheduleResult<String> {
        let fin = self.fresh(&format!("{inner}_r"), &[]);
        let init = self.fresh(&format!("{inner}_z"), std::slice::from_ref(&fin));
        let mut tree_names: Vec<String> = Vec::new();
        for k in 0..62 {
            let taken: Vec<String> = [fin.clone(), init.clone()]
                .into_iter()
                .chain(tree_names.iter().cloned())
                .collect();
            tree_names.push(self.fresh(&format!("{inner}_t{k}"), &taken));
        }
        let mut problem = false;
        let rfname = self.fresh_buffer("rf");
        self.edit(outer, &mut |s, _| {
            let (vo, mo, eo, ko, body) = parts(s);
            let Stmt::For { var: vi, min: mi, extent: ei, kind: ki, body: ib } = body else {
                problem = true;
                return Ok(s.clone());
            };
            let (Some(ext), Some(0), true) = (ei.as_int(), mi.as_int(), &*vi.name == inner) else {
                problem = true;
                return Ok(s.clone());
            };
            let Stmt::Store { buffer, indices, value } = &**ib else {
                problem = true;
                return Ok(s.clone());
            };
            let same = |e: &Expr| matches!(e, Expr::Load { buffer: b, indices: i } if b.name == buffer.name && i == indices);
            let (reducer, f) = match value {
                Expr::Binary { op: BinOp::Add, a, b } if same(a) => (Reducer::Sum, (**b).clone()),
                Expr::Binary { op: BinOp::Max, a, b } if same(a) => (Reducer::Max, (**b).clone()),
                Expr::Binary { op: BinOp::Min, a, b } if same(a) => (Reducer::Min, (**b).clone()),
                _ => {
                    problem = true;
                    return Ok(s.clone());
                }
            };
            if indices.iter().any(|i| expr_mentions(i, vo) || expr_mentions(i, vi)) {
                problem = true;
                return Ok(s.clone());
            }
            let t = vi.dtype;
            let rf = Buffer::new(&rfname, buffer.dtype, vec![imm(DataType::i64(), ext)])
                .with_scope(StorageScope::Local);
            let at = |v: &Var| {
                let e = Expr::Var(v.clone());
                vec![if t == DataType::i64() { e } else { e.cast(DataType::i64()) }]
            };
            let vz = Var::new(&init, t);
            let zero = for_(vz.clone(), imm(t, 0), imm(t, ext), ForKind::Vectorized, rf.store(at(&vz), reducer.init(buffer.dtype)));
            let upd = for_(
                vo.clone(),
                mo.clone(),
                eo.clone(),
                ko,
                for_(vi.clone(), mi.clone(), ei.clone(), *ki, rf.store(at(vi), reducer.combine(rf.load(at(vi)), f))),
            );
            let mut seq = vec![zero, upd];
            if ext >= 4 && (ext as u64).is_power_of_two() {
                // A tree of vector halvings, `rf[r] op= rf[r + h]` for h = ext/2 .. 2, then
                // `X op= rf[0] op rf[1]`: log2(ext) dependent steps instead of ext.
                let mut h = ext / 2;
                let mut k = 0;
                while h >= 2 {
                    let v = Var::new(&tree_names[k], t);
                    let r = Expr::Var(v.clone());
                    let r = if t == DataType::i64() { r } else { r.cast(DataType::i64()) };
                    let shifted = vec![r.clone() + imm(DataType::i64(), h)];
                    seq.push(for_(
                        v,
                        imm(t, 0),
                        imm(t, h),
                        ForKind::Vectorized,
                        rf.store(vec![r.clone()], reducer.combine(rf.load(vec![r]), rf.load(shifted))),
                    ));
                    h /= 2;
                    k += 1;
                }
                let z = |i: i64| vec![imm(DataType::i64(), i)];
                seq.push(buffer.store(
                    indices.clone(),
                    reducer.combine(buffer.load(indices.clone()), reducer.combine(rf.load(z(0)), rf.load(z(1)))),
                ));
            } else {
                let vr = Var::new(&fin, t);
                seq.push(for_(
                    vr.clone(),
                    imm(t, 0),
                    imm(t, ext),
                    ForKind::Serial,
                    buffer.store(indices.clone(), reducer.combine(buffer.load(indices.clone()), rf.load(at(&vr)))),
                ));
            }
            Ok(rf.allocate(Stmt::Seq(seq)))
        })?;
        if problem {
            return Err(self.form(
                "rfactor",
                format!("needs `for {outer} {{ for {inner} (min 0, constant extent) {{ X[ix] = X[ix] +|max|min f }} }}` with `ix` independent of both loops"),
            ));
        }
        Ok(init)
    }

    /// Replays `steps` (as read from JSON).
    ///
    /// # Errors
    /// The first failing step's error.
    pub fn apply(&mut self, steps: &[Step]) -> ScheduleResult<()> {
        for s in steps {
            match s {
                Step::Split { loop_, factor } => {
                    self.split(loop_, *factor)?;
                }
                Step::Reorder { loops } => {
                    let v: Vec<&str> = loops.iter().map(String::as_str).collect();
                    self.reorder(&v)?;
                }
                Step::Fuse { outer, inner } => {
                    self.fuse(outer, inner)?;
                }
                Step::Fission { loop_ } => {
                    self.fission(loop_)?;
                }
                Step::Partition { loop_, at } => {
                    self.partition(loop_, *at)?;
                }
                Step::Kind { loop_, kind } => {
                    let k = ForKind::from_name(kind).ok_or_else(|| {
                        self.form(
                            "kind",
                            format!(
                                "expects serial, parallel, vectorized or unrolled, found `{kind}`"
                            ),
                        )
                    })?;
                    self.set_kind(loop_, k)?;
                }
                Step::TransformLayout { buffer, into, dims } => {
                    self.transform_layout(buffer, into, dims)?;
                }
                Step::CacheWrite { buffer, at } => {
                    self.cache_write(buffer, at)?;
                }
                Step::Rfactor { outer, inner } => {
                    self.rfactor(outer, inner)?;
                }
                Step::Bind { loop_, thread } => {
                    let tag = ThreadTag::from_name(thread).ok_or_else(|| {
                        self.form(
                            "bind",
                            format!("expects blockIdx.x|y|z or threadIdx.x|y|z, found `{thread}`"),
                        )
                    })?;
                    self.bind(loop_, tag)?;
                }
                Step::CacheReadShared { buffer, at } => {
                    self.cache_read_shared(buffer, at)?;
                }
                Step::BlockReduce { outer, inner } => {
                    self.block_reduce(outer, inner)?;
                }
            }
        }
        Ok(())
    }
}

/// Moves guards without `else` inward through loops (`if c { for x { b } }` becomes
/// `for x { if c { b } }`) and merges nested guards, so split loops stay perfect nests.
fn sink_guards(s: Stmt) -> Stmt {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => for_(var, min, extent, kind, sink_guards(*body)),
        Stmt::IfThenElse {
            cond,
            then_case,
            else_case: None,
        } => match *then_case {
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => for_(var, min, extent, kind, sink_guards(guard(cond, *body))),
            Stmt::IfThenElse {
                cond: c2,
                then_case: t2,
                else_case: None,
            } => sink_guards(guard(cond.and(c2), *t2)),
            other => guard(cond, other),
        },
        other => other,
    }
}

fn guard(cond: Expr, body: Stmt) -> Stmt {
    Stmt::IfThenElse {
        cond,
        then_case: Box::new(body),
        else_case: None,
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

/// `s` with every loop given a fresh variable named `<name>_p` (or the first free `<name>_p_1`,
/// ... among the schedule's loops and `taken`); the renames are appended to `renamed`.
fn rename_loops(
    s: &Stmt,
    sched: &Schedule,
    taken: &mut Vec<String>,
    renamed: &mut Vec<(String, String)>,
) -> Stmt {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => {
            let n = sched.fresh(&format!("{}_p", var.name), taken);
            taken.push(n.clone());
            renamed.push((var.name.to_string(), n.clone()));
            let v = Var::new(&n, var.dtype);
            let body = subst_stmt(body, &HashMap::from([(var.id, Expr::Var(v.clone()))]));
            for_(
                v,
                min.clone(),
                extent.clone(),
                *kind,
                rename_loops(&body, sched, taken, renamed),
            )
        }
        other => other.map_children(|c| rename_loops(c, sched, taken, renamed)),
    }
}

/// Whether the first thing `s` runs (through `Seq`s) writes every element of `cache`
/// (extents `ext`) before anything reads it. That is a nest of loops with constant bounds (and
/// `Seq`s, entered at their first statement) whose first statement run per iteration is one
/// store to `cache` at indices that are distinct loop variables of the nest plus constants,
/// each loop covering exactly `0..ext[d]` (or the index `0` where `ext[d]` is 1), whose value
/// does not read `cache`, and every other access to `cache` inside the nest is at the same
/// indices. Each iteration then writes its own element
/// before it touches it, and no iteration touches another's (the init of an accumulation:
/// `for i, j { C[i, j] = 0; for k { C[i, j] += .. } }`). The cache's earlier contents are dead.
fn overwrites_first(s: &Stmt, cache: &Buffer, ext: &[i64]) -> bool {
    let mut root = s;
    while let Stmt::Seq(v) = root {
        match v.first() {
            Some(f) => root = f,
            None => return false,
        }
    }
    let mut nest: HashMap<crate::ir::VarId, (i64, i64)> = HashMap::new();
    let mut s = root;
    loop {
        match s {
            Stmt::Seq(v) => match v.first() {
                Some(f) => s = f,
                None => return false,
            },
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                let (Some(a), Some(b)) = (min.as_int(), extent.as_int()) else {
                    return false;
                };
                nest.insert(var.id, (a, b));
                s = body;
            }
            _ => break,
        }
    }
    let Stmt::Store {
        buffer,
        indices,
        value,
    } = s
    else {
        return false;
    };
    if buffer.name != cache.name || indices.len() != ext.len() {
        return false;
    }
    let mut seen = Vec::new();
    for (ix, &e) in indices.iter().zip(ext) {
        let Some(l) = linear(ix) else { return false };
        // A dimension of extent 1 is covered by the constant index 0.
        if l.terms.is_empty() && l.c == 0 && e == 1 {
            continue;
        }
        let [(v, 1)] = l.terms.as_slice() else {
            return false;
        };
        let Some(&(mn, ex)) = nest.get(&v.id) else {
            return false;
        };
        if seen.contains(&v.id) || mn + l.c != 0 || ex != e {
            return false;
        }
        seen.push(v.id);
    }
    let (mut loads, mut stores) = (vec![], vec![]);
    rewrite::accesses(
        &Stmt::Evaluate(value.clone()),
        &cache.name,
        &mut loads,
        &mut stores,
    );
    if !loads.is_empty() {
        return false;
    }
    rewrite::accesses(root, &cache.name, &mut loads, &mut stores);
    loads.iter().chain(&stores).all(|ix| ix == indices)
}

fn collect_loops(s: &Stmt, out: &mut HashMap<crate::ir::VarId, (i64, i64)>) {
    crate::ir::visit::for_each_loop(s, |var, min, extent| {
        if let (Some(a), Some(b)) = (min.as_int(), extent.as_int()) {
            out.insert(var.id, (a, b));
        }
    });
}
