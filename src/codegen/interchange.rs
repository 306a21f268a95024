//! Lowering shared by the CPU code generators: a reduction nest moved outside the innermost
//! spatial loop around it, so that the spatial loop is the one LLVM vectorizes.
//!
//! An unscheduled reduction (TVM's lowering of `C[i, j] = sum_k A[i, k] * B[k, j]`, of a
//! convolution, of a pooling window) runs its reduction loops innermost. A float reduction
//! cannot be vectorized without reassociating the sum, which changes the result, so LLVM
//! leaves the loop scalar: one dependent add per element. The spatial loop around it is
//! independent per element, and when it is innermost its accesses are contiguous:
//!
//! ```text
//! for j in [m, m + n) { X[.., j] = init; for k.. { X[.., j] = X[.., j] + e } }
//!     ==  for j' in [m, m + n) { X[.., j'] = init[j := j'] };
//!         for k.. { for j in [m, m + n) { X[.., j] = X[.., j] + e } }
//! ```
//!
//! Each element `X[.., j]` is initialized and then updated by the same values in the same order
//! of `k` as before, so the result is the same, bit for bit; only updates of different
//! elements interleave. The rule (all of it, else the nest is left as it is):
//! - `j` is a serial loop of at least [`MIN_LANES`] iterations with constant bounds, whose body
//!   is a reduction nest (serial or unrolled loops, each the only statement of the one outside
//!   it, with bounds free of `j`), optionally preceded by the initialization (as
//!   `codegen::peel` leaves TVM's reductions);
//! - the nest's innermost body is one store `X[I] = v` whose indices `I` use none of the nest's
//!   loops, use `j` only in the last one, as `j` plus a term without `j`, and `X` is contiguous
//!   there; the initialization stores to the same `X[I]` a value that reads no `X`;
//! - `v` reads `X` only at `I` and calls nothing external, and every other load in `v` is free
//!   of `j` or contiguous in `j` in the same way (so the vector loop needs no gather), or at
//!   stride 2 in `j` (a stride-2 window: two vector loads and a shuffle, `emit/vector.rs`);
//! - `X` is allocated in the function, or the function is `noalias` (so no load reads an alias
//!   of `X`, whose values the new order would change).
//!
//! A moved nest inside a row loop whose rows are short (one or two vectors) also has its rows
//! jammed: a few rows go through the reduction side by side, so that the chains of dependent
//! adds of several rows interleave (`jammed`).

use std::collections::{HashMap, HashSet};

use crate::ir::visit::{walk_expr, Visitor};
use crate::ir::{BinOp, Buffer, Expr, ForKind, PrimFunc, Stmt, Var, VarId};

/// The fewest iterations of the spatial loop for which the nest is moved.
pub const MIN_LANES: i64 = 4;

/// `body` (of `f`) with every reduction nest that follows the rule (module docs) moved inside
/// out, and the short rows around such nests jammed (module docs).
pub fn interchange_reductions(f: &PrimFunc, body: &Stmt) -> Stmt {
    let mut allocated = HashSet::new();
    collect_allocations(body, &mut allocated);
    let unaliased = |b: &Buffer| f.attrs.noalias || allocated.contains(&b.data.id);
    rewrite(body, &unaliased)
}

fn collect_allocations(s: &Stmt, out: &mut HashSet<VarId>) {
    struct Alloc<'a>(&'a mut HashSet<VarId>);
    impl Visitor for Alloc<'_> {
        fn allocate(&mut self, buffer: &Buffer) {
            self.0.insert(buffer.data.id);
        }
    }
    Visitor::stmt(&mut Alloc(out), s);
}

fn rewrite(s: &Stmt, unaliased: &dyn Fn(&Buffer) -> bool) -> Stmt {
    if let Some(r) = jammed(s, unaliased) {
        return r;
    }
    if let Some(r) = interchanged(s, unaliased) {
        return r;
    }
    s.map_children(|c| rewrite(c, unaliased))
}

/// A spatial loop around a reduction nest that follows the rule (module docs), as
/// [`analyze`] finds it.
struct Nest<'a> {
    /// The spatial loop's variable, `min` and `extent`.
    j: &'a Var,
    min: &'a Expr,
    extent: &'a Expr,
    /// The initialization in front of the nest, if any.
    init: Option<&'a Stmt>,
    /// The reduction loops, outermost first.
    loops: Vec<NestLoop<'a>>,
    /// The innermost store, `X[I] = v`.
    update: &'a Stmt,
    /// Whether every load in `v` is free of `j` or contiguous in it (else a vector would
    /// gather: the rule holds but for that, which [`pack_transposed_operands`] mends).
    contiguous: bool,
}

/// `s` as a [`Nest`], if it is a spatial loop around a reduction nest that follows the rule
/// with the possible exception of the loads' contiguity.
fn analyze<'a>(s: &'a Stmt, unaliased: &dyn Fn(&Buffer) -> bool) -> Option<Nest<'a>> {
    let Stmt::For {
        var: j,
        min,
        extent,
        kind: ForKind::Serial,
        ..
    } = s
    else {
        return None;
    };
    if !matches!(min, Expr::IntImm { .. }) || extent.as_int().is_none_or(|n| n < MIN_LANES) {
        return None;
    }
    let (init, loops, update) = reduction_parts(s)?;
    if loops.is_empty()
        || loops.iter().any(|(_, min, extent, kind)| {
            !matches!(kind, ForKind::Serial | ForKind::Unrolled)
                || min.mentions(j)
                || extent.mentions(j)
        })
    {
        return None;
    }
    let Stmt::Store {
        buffer: x,
        indices,
        value,
    } = update
    else {
        return None;
    };
    let (last, outer) = indices.split_last()?;
    if !unaliased(x)
        || !contiguous_last(x)
        || !unit_stride(last, j)
        || outer.iter().any(|e| e.mentions(j))
        || indices
            .iter()
            .any(|e| loops.iter().any(|(v, ..)| e.mentions(v)))
    {
        return None;
    }
    let (legal, contiguous) = value_ok(value, x, indices, j);
    if !legal {
        return None;
    }
    if let Some(init) = init {
        let Stmt::Store {
            buffer,
            indices: init_indices,
            value: init_value,
        } = init
        else {
            return None;
        };
        if buffer.data.id != x.data.id
            || init_indices != indices
            || reads(init_value, x)
            || calls_extern(init_value)
        {
            return None;
        }
    }
    Some(Nest {
        j,
        min,
        extent,
        init,
        loops,
        update,
        contiguous,
    })
}

/// `s` interchanged, if it is a spatial loop around a reduction nest that follows the rule.
fn interchanged(s: &Stmt, unaliased: &dyn Fn(&Buffer) -> bool) -> Option<Stmt> {
    let Nest {
        j,
        min,
        extent,
        init,
        loops,
        update,
        contiguous,
    } = analyze(s, unaliased)?;
    if !contiguous {
        return None;
    }
    // The new nest: the reduction loops around the spatial loop around the update.
    let inner = nest_around(&loops, spatial_loop(j, min, extent, update));
    let Some(init) = init else {
        return Some(inner);
    };
    // The initialization gets a loop of its own, over a fresh variable, vectorized as the
    // update is: vectors stored the width they are loaded (a wide load of narrower stores
    // cannot be forwarded from the store buffer; with LLVM's 256-bit stores of the zeros and
    // kiln's 512-bit loads of the sums, a grouped convolution ran at a third of the speed).
    Some(Stmt::Seq(vec![
        init_loop(j, min, extent, init, HashMap::new()),
        inner,
    ]))
}

/// The initialization `init` of the spatial loop `j` as a loop of its own over a fresh
/// variable `j_init` (vectorized as the update is), with `map`'s substitutions as well.
fn init_loop(
    j: &Var,
    min: &Expr,
    extent: &Expr,
    init: &Stmt,
    mut map: HashMap<VarId, Expr>,
) -> Stmt {
    let j2 = Var::new(&format!("{}_init", j.name), j.dtype);
    map.insert(j.id, Expr::Var(j2.clone()));
    spatial_loop(
        &j2,
        min,
        extent,
        &crate::ir::rewrite::subst_stmt(init, &map),
    )
}

/// `inner` inside the reduction loops `loops` (outermost first), as they were.
fn nest_around(loops: &[NestLoop<'_>], inner: Stmt) -> Stmt {
    loops
        .iter()
        .rev()
        .fold(inner, |body, (var, min, extent, kind)| Stmt::For {
            var: (*var).clone(),
            min: (*min).clone(),
            extent: (*extent).clone(),
            kind: *kind,
            body: Box::new(body),
        })
}

/// The most elements of the accumulator `X` that the rows jammed by `jammed` keep in
/// registers across the reduction loops: 64 `float32` are 4 AVX-512 registers or 8 AVX2 ones.
pub const JAM_ELEMENTS: i64 = 64;

/// `s` with its rows jammed into the reduction, if it is a serial loop `for i` around a spatial
/// loop that follows the rule (module docs) and whose store `X[I]` uses `i` in one index other
/// than the last (as `i` plus a term without `i`):
///
/// ```text
/// for i in [a, a + m) { for j { X[.., i, .., j] = init; for k.. { X[.., i, .., j] += e } } }
///     ==  for i_o in [0, m / u) {
///             for i_r in [0, u) { for j' { X[.., i, .., j'] = init } }
///             for k.. { for i_r in [0, u) unrolled { for j { X[.., i, .., j] += e } } }
///         }   (i = a + u i_o + i_r)
/// ```
///
/// One row's reduction is a chain of dependent adds (or FMAs) per vector, one per iteration
/// of `k`: a row of one or two vectors leaves the FMA units waiting on the chain's latency (TOPI's
/// `batch_matmul` rows of 20 columns, a depthwise convolution's rows of 16). `u` rows side by side
/// are `u` times as many independent chains. Each element still gets its initial value and then
/// the same updates in the same order of `k`; only updates of different elements interleave, as
/// in [`interchanged`]. `u` is the largest of 4, 3 and 2 that divides `m` with `u` rows of at
/// most [`JAM_ELEMENTS`] elements. `X` must have no explicit strides, so that different `(i,
/// j)` are different elements, and the nest's bounds must not use `i`.
fn jammed(s: &Stmt, unaliased: &dyn Fn(&Buffer) -> bool) -> Option<Stmt> {
    let Stmt::For {
        var: i,
        min: row_min,
        extent: rows,
        kind: ForKind::Serial,
        body,
    } = s
    else {
        return None;
    };
    let (Some(a), Some(m)) = (row_min.as_int(), rows.as_int()) else {
        return None;
    };
    let Nest {
        j,
        min,
        extent,
        init,
        loops,
        update,
        contiguous,
    } = analyze(body, unaliased)?;
    let n = extent.as_int()?;
    let u = [4, 3, 2]
        .into_iter()
        .find(|&u| m % u == 0 && u * n <= JAM_ELEMENTS)?;
    let Stmt::Store {
        buffer: x, indices, ..
    } = update
    else {
        return None;
    };
    let (last, outer) = indices.split_last()?;
    let with_i: Vec<&Expr> = outer.iter().filter(|e| e.mentions(i)).collect();
    if !contiguous
        || x.strides.is_some()
        || last.mentions(i)
        || with_i.len() != 1
        || !unit_stride(with_i[0], i)
        || loops
            .iter()
            .any(|(_, lo, n, _)| lo.mentions(i) || n.mentions(i))
    {
        return None;
    }
    let t = i.dtype;
    let c = |v: i64| Expr::IntImm { dtype: t, value: v };
    let outer_var = Var::new(&format!("{}_o", i.name), t);
    // Row `a + u i_o + r` for the jammed loop's variable `r`.
    let row = |r: &Var| {
        let mut e = Expr::binary(
            BinOp::Add,
            Expr::binary(BinOp::Mul, Expr::Var(outer_var.clone()), c(u)),
            Expr::Var(r.clone()),
        );
        if a != 0 {
            e = Expr::binary(BinOp::Add, c(a), e);
        }
        HashMap::from([(i.id, e)])
    };
    let jam = Var::new(&format!("{}_r", i.name), t);
    let nest = nest_around(
        &loops,
        Stmt::For {
            var: jam.clone(),
            min: c(0),
            extent: c(u),
            kind: ForKind::Unrolled,
            body: Box::new(spatial_loop_of(
                j,
                min,
                extent,
                &crate::ir::rewrite::subst_stmt(update, &row(&jam)),
                ForKind::Unrolled,
            )),
        },
    );
    let mut items = Vec::with_capacity(2);
    if let Some(init) = init {
        let r2 = Var::new(&format!("{}_init", jam.name), t);
        let body = init_loop(j, min, extent, init, row(&r2));
        items.push(Stmt::For {
            var: r2,
            min: c(0),
            extent: c(u),
            kind: ForKind::Serial,
            body: Box::new(body),
        });
    }
    items.push(nest);
    Some(Stmt::For {
        var: outer_var,
        min: c(0),
        extent: c(m / u),
        kind: ForKind::Serial,
        body: Box::new(Stmt::Seq(items)),
    })
}

/// The widest vector the spatial loop is split for: 16 lanes, one AVX-512 register of
/// `float32` (two AVX2 ones).
pub const MAX_LANES: i64 = 16;

/// `for j in [min, min + extent) { update }` as the innermost loop of the new nest, written by
/// kiln's emitter as vector code so that the updates of a vector stay in registers across the
/// reduction loops: an extent of 4 to [`MAX_LANES`] is one vectorized loop (in power-of-two
/// pieces); a longer one is a loop over vectors of [`MAX_LANES`] lanes and a vectorized loop
/// of the rest (fewer, wider vectors than the largest power of two dividing the extent: a
/// row of 20 is 16 + 4, not 5 x 4); a shorter one stays a serial loop.
fn spatial_loop(j: &Var, min: &Expr, extent: &Expr, update: &Stmt) -> Stmt {
    spatial_loop_of(j, min, extent, update, ForKind::Serial)
}

/// [`spatial_loop`] with the loop over the vectors (where there are several) of kind `over`.
fn spatial_loop_of(j: &Var, min: &Expr, extent: &Expr, update: &Stmt, over: ForKind) -> Stmt {
    let n = extent.as_int().unwrap_or(0);
    let t = j.dtype;
    let c = |v: i64| Expr::IntImm { dtype: t, value: v };
    if n < MIN_LANES {
        return Stmt::For {
            var: j.clone(),
            min: min.clone(),
            extent: extent.clone(),
            kind: ForKind::Serial,
            body: Box::new(update.clone()),
        };
    }
    if n <= MAX_LANES {
        // One vector, in power-of-two pieces where `n` is not one (7 lanes: 4 + 2 + 1; the
        // emitter's `vector_for`): a 3 x 3 stride-2 max pool's row of 7 outputs went from
        // LLVM's vectorization of the serial loop at 0.58x TVM's time to this.
        return Stmt::For {
            var: j.clone(),
            min: min.clone(),
            extent: extent.clone(),
            kind: ForKind::Vectorized,
            body: Box::new(update.clone()),
        };
    }
    // Vectors of `MAX_LANES` and a vector of the rest (55: 3 x 16 + 7). With the largest
    // power of two dividing `n`, TOPI's batch_matmul rows of 20 were 5 vectors of 4: 5 FMAs
    // a step of `k` where 16 + 4 lanes take 2 (3 with AVX2).
    let w = MAX_LANES;
    let at = |base: Expr, lane: &Var| {
        let mut index = Expr::binary(BinOp::Add, base, Expr::Var(lane.clone()));
        if min.as_int() != Some(0) {
            index = Expr::binary(BinOp::Add, min.clone(), index);
        }
        HashMap::from([(j.id, index)])
    };
    let outer = Var::new(&format!("{}_o", j.name), t);
    let lane = Var::new(&format!("{}_v", j.name), t);
    let main = Stmt::For {
        var: outer.clone(),
        min: c(0),
        extent: c(n / w),
        kind: over,
        body: Box::new(Stmt::For {
            var: lane.clone(),
            min: c(0),
            extent: c(w),
            kind: ForKind::Vectorized,
            body: Box::new(crate::ir::rewrite::subst_stmt(
                update,
                &at(Expr::binary(BinOp::Mul, Expr::Var(outer), c(w)), &lane),
            )),
        }),
    };
    let rest = n % w;
    if rest == 0 {
        return main;
    }
    let tail = Var::new(&format!("{}_t", j.name), t);
    Stmt::Seq(vec![
        main,
        Stmt::For {
            var: tail.clone(),
            min: c(0),
            extent: c(rest),
            kind: if rest > 1 {
                ForKind::Vectorized
            } else {
                ForKind::Serial
            },
            body: Box::new(crate::ir::rewrite::subst_stmt(
                update,
                &at(c(n - rest), &tail),
            )),
        },
    ])
}

/// Whether `b`'s last dimension is contiguous (no strides, or a last stride of 1).
fn contiguous_last(b: &Buffer) -> bool {
    match &b.strides {
        None => true,
        Some(s) => s.last().and_then(Expr::as_int) == Some(1),
    }
}

/// Whether `e` is `var`, or `var + t` / `t + var` / `var - t` with `t` free of `var`
/// (recursively).
pub(crate) fn unit_stride(e: &Expr, var: &Var) -> bool {
    step(e, var) == Some(1)
}

/// Whether `e` is `var * 2` (or `2 * var`) plus terms without `var` (a stride-2 window's
/// column: kiln's vector code loads it as two contiguous vectors and a shuffle).
fn stride_two(e: &Expr, var: &Var) -> bool {
    step(e, var) == Some(2)
}

/// How far `e` moves per step of `var` when it is `var` (1) or `var * 2` / `2 * var` (2), plus
/// or minus terms free of `var`, recursively; `None` for any other form.
fn step(e: &Expr, var: &Var) -> Option<i64> {
    let is_var = |x: &Expr| matches!(x, Expr::Var(v) if v.id == var.id);
    match e {
        _ if is_var(e) => Some(1),
        Expr::Binary {
            op: BinOp::Mul,
            a,
            b,
        } if (is_var(a) && b.as_int() == Some(2)) || (is_var(b) && a.as_int() == Some(2)) => {
            Some(2)
        }
        Expr::Binary {
            op: BinOp::Add,
            a,
            b,
        } => {
            if !b.mentions(var) {
                step(a, var)
            } else if !a.mentions(var) {
                step(b, var)
            } else {
                None
            }
        }
        Expr::Binary {
            op: BinOp::Sub,
            a,
            b,
        } if !b.mentions(var) => step(a, var),
        _ => None,
    }
}

/// Whether the update's value follows the rule (`X` read only at `at`, nothing external), and
/// whether every other load is free of `j` or contiguous in it (else a vector would gather).
fn value_ok(v: &Expr, x: &Buffer, at: &[Expr], j: &Var) -> (bool, bool) {
    struct Scan<'a> {
        x: &'a Buffer,
        at: &'a [Expr],
        j: &'a Var,
        legal: bool,
        contiguous: bool,
    }
    impl Visitor for Scan<'_> {
        fn expr(&mut self, e: &Expr) {
            match e {
                Expr::Load { buffer, indices } if buffer.data.id == self.x.data.id => {
                    self.legal &= indices.as_slice() == self.at;
                }
                Expr::Load { buffer, indices } => {
                    if let Some((last, outer)) = indices.split_last() {
                        let free = !last.mentions(self.j);
                        self.contiguous &= outer.iter().all(|i| !i.mentions(self.j))
                            && (free
                                || ((unit_stride(last, self.j) || stride_two(last, self.j))
                                    && contiguous_last(buffer)));
                    }
                }
                Expr::CallExtern { .. } => self.legal = false,
                _ => {}
            }
            walk_expr(self, e);
        }
    }
    let mut s = Scan {
        x,
        at,
        j,
        legal: true,
        contiguous: true,
    };
    s.expr(v);
    (s.legal, s.contiguous)
}

fn reads(e: &Expr, x: &Buffer) -> bool {
    struct Find<'a>(&'a Buffer, bool);
    impl Visitor for Find<'_> {
        fn expr(&mut self, e: &Expr) {
            if let Expr::Load { buffer, .. } = e {
                self.1 |= buffer.data.id == self.0.data.id;
            }
            walk_expr(self, e);
        }
    }
    let mut f = Find(x, false);
    f.expr(e);
    f.1
}

fn calls_extern(e: &Expr) -> bool {
    struct Find(bool);
    impl Visitor for Find {
        fn expr(&mut self, e: &Expr) {
            self.0 |= matches!(e, Expr::CallExtern { .. });
            walk_expr(self, e);
        }
    }
    let mut f = Find(false);
    f.expr(e);
    f.0
}

/// The most bytes a transposed copy of [`pack_transposed_operands`] may take (it is
/// re-filled every time the loops it sits in run again, so it should stay in the L1 cache).
pub const MAX_PACK_BYTES: i64 = 32 << 10;

/// `body` (of `f`) with the transposed operand of every reduction that needs one copied
/// first, so that [`interchange_reductions`] can vectorize the spatial loop.
///
/// TVM's `dense` (`C[i, j] = sum_k A[i, k] * B[j, k]`) and `batch_matmul` read their second
/// operand along `k`, so moving `k` outside `j` would gather `B`'s column `k`. When the spatial
/// loop `j` around the reduction nest follows the rule of [`interchange_reductions`] but for
/// such loads `Y[.., j, .., k]` (`j` alone in one index other than the last, a reduction
/// loop's variable `k` alone in the last, the other indices free of `j` and of the nest's
/// loops, `Y` never stored to in the function), each such `Y` is copied to `Yt[k, j]` (a local
/// buffer of at most [`MAX_PACK_BYTES`]) in front of the outermost loop around `j` whose
/// variables those other indices do not use, and read from there. The copy changes no value
/// read, so the result is the same, bit for bit; it is made once for all iterations of the
/// loops it is in front of (`dense`'s rows, `batch_matmul`'s rows of one batch).
pub fn pack_transposed_operands(f: &PrimFunc, body: &Stmt) -> Stmt {
    let mut allocated = HashSet::new();
    collect_allocations(body, &mut allocated);
    let unaliased = |b: &Buffer| f.attrs.noalias || allocated.contains(&b.data.id);
    let mut stored = HashSet::new();
    collect_stores(body, &mut stored);
    pack_rewrite(body, &unaliased, &stored)
}

fn collect_stores(s: &Stmt, out: &mut HashSet<VarId>) {
    struct Stores<'a>(&'a mut HashSet<VarId>);
    impl Visitor for Stores<'_> {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::Store { buffer, .. } = s {
                self.0.insert(buffer.data.id);
            }
            crate::ir::visit::walk_stmt(self, s);
        }
    }
    Visitor::stmt(&mut Stores(out), s);
}

fn pack_rewrite(s: &Stmt, unaliased: &dyn Fn(&Buffer) -> bool, stored: &HashSet<VarId>) -> Stmt {
    if let Some(r) = packed(s, unaliased, stored) {
        return r;
    }
    s.map_children(|c| pack_rewrite(c, unaliased, stored))
}

/// A load `Y[.., j, .., k]` to copy transposed: the buffer, the index of `j`, the reduction
/// loop of `k` (its variable and constant extent).
struct Transposed {
    buffer: Buffer,
    indices: Vec<Expr>,
    j_dim: usize,
    k: Var,
    k_extent: i64,
}

/// `s` (a serial loop) with the transposed operands of the reduction at the end of its chain
/// of loops copied in front of it, if the rule holds with `s` as the place of the copy.
fn packed(s: &Stmt, unaliased: &dyn Fn(&Buffer) -> bool, stored: &HashSet<VarId>) -> Option<Stmt> {
    // The chain of loops from `s` down to the spatial loop `j` (each the only statement of
    // the one outside it; `j` is the last).
    let mut chain: Vec<&Stmt> = vec![s];
    loop {
        let last = *chain.last()?;
        if reduction_parts(last).is_some() {
            break;
        }
        let Stmt::For { body, .. } = last else {
            return None;
        };
        match body.as_ref() {
            inner @ Stmt::For { .. } => chain.push(inner),
            _ => return None,
        }
    }
    let Nest {
        j,
        min: jmin,
        extent: jext,
        loops,
        update,
        contiguous,
        ..
    } = analyze(chain.last()?, unaliased)?;
    if contiguous {
        return None; // nothing to copy: the interchange applies as it is
    }
    let (n, jlo) = (jext.as_int()?, jmin.as_int()?);
    let Stmt::Store { value, .. } = update else {
        return None;
    };
    let chain_vars: Vec<&Var> = chain
        .iter()
        .filter_map(|l| match l {
            Stmt::For { var, .. } => Some(var),
            _ => None,
        })
        .collect();
    let mut found: Vec<Transposed> = Vec::new();
    let mut ok = true;
    let mut scan = |e: &Expr| {
        let Expr::Load { buffer, indices } = e else {
            return;
        };
        let Some((last, outer)) = indices.split_last() else {
            return;
        };
        let free = !last.mentions(j);
        if outer.iter().all(|i| !i.mentions(j))
            && (free || (unit_stride(last, j) && contiguous_last(buffer)))
        {
            return; // contiguous or invariant: no copy
        }
        let plain = |e: &Expr, v: &Var| matches!(e, Expr::Var(w) if w.id == v.id);
        let j_dims: Vec<usize> = (0..outer.len()).filter(|&d| outer[d].mentions(j)).collect();
        let k = loops.iter().find(|(v, ..)| plain(last, v));
        let (Some((k, kmin, kext, _)), [jd]) = (k, j_dims.as_slice()) else {
            ok = false;
            return;
        };
        let others_free = outer.iter().enumerate().all(|(d, i)| {
            d == *jd
                || (!loops.iter().any(|(v, ..)| i.mentions(v))
                    && !chain_vars.iter().any(|v| i.mentions(v)))
        });
        let Some(kn) = kext.as_int() else {
            ok = false;
            return;
        };
        if !plain(&outer[*jd], j)
            || kmin.as_int() != Some(0)
            || !others_free
            || stored.contains(&buffer.data.id)
            || buffer.strides.is_some()
            || kn * n * i64::from(buffer.dtype.bits / 8) > MAX_PACK_BYTES
        {
            ok = false;
            return;
        }
        if !found
            .iter()
            .any(|t| t.buffer.data.id == buffer.data.id && &t.indices == indices)
        {
            found.push(Transposed {
                buffer: buffer.clone(),
                indices: indices.clone(),
                j_dim: *jd,
                k: (*k).clone(),
                k_extent: kn,
            });
        }
    };
    struct Walk<'a, F: FnMut(&Expr)>(&'a mut F);
    impl<F: FnMut(&Expr)> Visitor for Walk<'_, F> {
        fn expr(&mut self, e: &Expr) {
            (self.0)(e);
            walk_expr(self, e);
        }
    }
    Walk(&mut scan).expr(value);
    if !ok || found.is_empty() {
        return None;
    }
    // The copies, in front of `s`, and `s` reading them.
    let t = j.dtype;
    let c = |v: i64| Expr::IntImm { dtype: t, value: v };
    let mut copies = Vec::new();
    let mut map: Vec<(Transposed, Buffer)> = Vec::new();
    for tr in found {
        let packed = Buffer::new(
            &format!("{}_t", tr.buffer.name),
            tr.buffer.dtype,
            vec![c(tr.k_extent), c(n)],
        )
        .with_scope(crate::ir::StorageScope::Local);
        let (kk, jj) = (
            Var::new(&format!("{}_k", packed.name), t),
            Var::new(&format!("{}_j", packed.name), t),
        );
        let mut src = tr.indices.clone();
        *src.last_mut().expect("indices") = Expr::Var(kk.clone());
        src[tr.j_dim] = if jlo == 0 {
            Expr::Var(jj.clone())
        } else {
            Expr::binary(BinOp::Add, Expr::Var(jj.clone()), c(jlo))
        };
        let copy = Stmt::For {
            var: kk.clone(),
            min: c(0),
            extent: c(tr.k_extent),
            kind: ForKind::Serial,
            body: Box::new(Stmt::For {
                var: jj.clone(),
                min: c(0),
                extent: c(n),
                kind: ForKind::Serial,
                body: Box::new(packed.store(
                    vec![Expr::Var(kk.clone()), Expr::Var(jj.clone())],
                    tr.buffer.load(src),
                )),
            }),
        };
        copies.push(copy);
        map.push((tr, packed));
    }
    let rewritten = replace_loads(s, &map, j, jlo, t);
    let mut out = Stmt::Seq(copies.into_iter().chain([rewritten]).collect());
    for (_, packed) in map.iter().rev() {
        out = packed.allocate(out);
    }
    Some(out)
}

/// A loop of a reduction nest: its variable, `min`, `extent` and kind.
type NestLoop<'a> = (&'a Var, &'a Expr, &'a Expr, ForKind);

/// A spatial loop's initialization (if any), reduction nest and innermost store.
type ReductionParts<'a> = (Option<&'a Stmt>, Vec<NestLoop<'a>>, &'a Stmt);

/// The parts of a spatial loop around a reduction nest: the initialization (if any), the nest's
/// loops and the innermost update; `None` when `s` is not one.
fn reduction_parts(s: &Stmt) -> Option<ReductionParts<'_>> {
    let Stmt::For { body, .. } = s else {
        return None;
    };
    let (init, nest) = match body.as_ref() {
        Stmt::Seq(items) if items.len() == 2 => (Some(&items[0]), &items[1]),
        nest @ Stmt::For { .. } => (None, nest),
        _ => return None,
    };
    let mut loops = Vec::new();
    let mut cur = nest;
    while let Stmt::For {
        var,
        min,
        extent,
        kind,
        body,
    } = cur
    {
        loops.push((var, min, extent, *kind));
        cur = body;
    }
    matches!(cur, Stmt::Store { .. }).then_some((init, loops, cur))
}

/// `s` with every load of a copied operand (at the indices it was found at) read from its
/// transposed copy `Yt[k, j - min]`.
fn replace_loads(
    s: &Stmt,
    map: &[(Transposed, Buffer)],
    j: &Var,
    jlo: i64,
    t: crate::ir::DataType,
) -> Stmt {
    use crate::ir::rewrite::{rw_stmt, Rewriter};
    struct R<'a> {
        map: &'a [(Transposed, Buffer)],
        j: &'a Var,
        jlo: i64,
        t: crate::ir::DataType,
    }
    impl Rewriter for R<'_> {
        fn post_expr(&mut self, e: Expr) -> Expr {
            if let Expr::Load { buffer, indices } = &e {
                for (tr, packed) in self.map {
                    if tr.buffer.data.id == buffer.data.id && &tr.indices == indices {
                        let jj = if self.jlo == 0 {
                            Expr::Var(self.j.clone())
                        } else {
                            Expr::binary(
                                BinOp::Sub,
                                Expr::Var(self.j.clone()),
                                Expr::IntImm {
                                    dtype: self.t,
                                    value: self.jlo,
                                },
                            )
                        };
                        return packed.load(vec![Expr::Var(tr.k.clone()), jj]);
                    }
                }
            }
            e
        }
    }
    rw_stmt(&mut R { map, j, jlo, t }, s)
}
