//! `cache_write` and `cache_read`: a buffer's region touched by one iteration of a loop, held in
//! a `local` buffer. `cache_write` accumulates a tile of an output there (registers) and writes
//! it back; `cache_read` copies a tile of an input in (a panel of `B` packed where a parallel
//! task is about to use it, as BLAS packs a block, instead of the whole buffer up front).
//! Both find the region the same way: per dimension, the one offset the loops outside `at`
//! give every access, and the range the loops inside add to it.

use std::collections::HashMap;

use super::{for_, guard, imm, parts, Schedule, ScheduleResult};
use crate::ir::rewrite::{self, linear, rw_stmt, Lin, Rewriter};
use crate::ir::{BinOp, Buffer, DataType, Expr, ForKind, Stmt, StorageScope, Var};

/// Which of the two caches [`Schedule::cache_untraced`] builds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cache {
    /// Loaded (unless the body overwrites it first), used, written back.
    Write,
    /// Loaded, read only; with a panel width `w`, the region's last dimension (or the
    /// dimension `d` given with it) is cut into panels of `w`, each contiguous (`[E / w, ...,
    /// w]`: `B[k, j]` in column panels `[n / w, k, w]`, `A[i, k]` in row panels `[m / w, k,
    /// w]`); with a dimension `d` alone, that dimension of the region is the cache's last (a
    /// transposed copy: `B[j, k]` read along `j` becomes `[k, j]`).
    Read(Option<i64>, Option<usize>),
}

/// Loops of a copy with at most this many iterations are unrolled; longer ones stay loops (a
/// `cache_read` of a 256-step slice of `B`).
const UNROLL_COPY_MAX: i64 = 16;

/// The longest innermost copy loop made a `vectorized` loop; a longer one is left to LLVM's
/// loop vectorizer.
const VECTOR_COPY_MAX: i64 = 64;

impl Schedule {
    /// The body of [`Schedule::cache_write`] (which records it in the trace).
    pub(super) fn cache_write_untraced(
        &mut self,
        buffer: &str,
        at: &str,
    ) -> ScheduleResult<String> {
        self.cache_untraced(buffer, at, Cache::Write)
    }

    /// The body of [`Schedule::cache_read`] (which records it in the trace).
    pub(super) fn cache_read_untraced(
        &mut self,
        buffer: &str,
        at: &str,
        panel: Option<i64>,
    ) -> ScheduleResult<String> {
        self.cache_untraced(buffer, at, Cache::Read(panel, None))
    }

    /// The body of [`Schedule::cache_read_panels_of`].
    pub(super) fn cache_read_panels_of_untraced(
        &mut self,
        buffer: &str,
        at: &str,
        width: i64,
        dim: usize,
    ) -> ScheduleResult<String> {
        self.cache_untraced(buffer, at, Cache::Read(Some(width), Some(dim)))
    }

    /// The body of [`Schedule::cache_read_transposed`].
    pub(super) fn cache_read_transposed_untraced(
        &mut self,
        buffer: &str,
        at: &str,
        innermost: usize,
    ) -> ScheduleResult<String> {
        self.cache_untraced(buffer, at, Cache::Read(None, Some(innermost)))
    }

    fn cache_untraced(&mut self, buffer: &str, at: &str, mode: Cache) -> ScheduleResult<String> {
        let primitive = match mode {
            Cache::Write => "cache_write",
            Cache::Read(..) => "cache_read",
        };
        let target = self
            .find_buffer(buffer)
            .or_else(|| allocated(&self.func.body, buffer))
            .ok_or_else(|| {
                self.form(
                    primitive,
                    format!("found no parameter or allocated buffer `{buffer}`"),
                )
            })?;
        let cname = self.fresh_buffer(&format!("{buffer}_local"));
        let mut problem: Option<String> = None;
        // The copies' loops are `{prefix}r{d}` and `{prefix}w{d}`: a prefix none of whose loop
        // names is taken yet (a second cache of the same buffer, as in each column part of a
        // matmul, gets `B_c_1r0`, ...), so that every loop name stays unique.
        let prefix = self.fresh_prefix(&format!("{buffer}_c"), &["r", "w"]);
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
            if mode != Cache::Write && !stores.is_empty() {
                problem = Some(format!(
                    "needs `{buffer}` to be only read in loop `{at}`, found a store to it (use cache_write)"
                ));
                return Ok(s.clone());
            }
            // The region's dimensions: the buffer's, a fused loop's pair taken as one.
            let dims = region_dims(&all, &target);
            let vall: Vec<Vec<Expr>> = all.iter().map(|a| virtual_ix(a, &dims)).collect();
            let vshape: Vec<Expr> = dims.iter().map(|d| d.extent(&target)).collect();
            let nd = dims.len();
            let mut base: Vec<Lin> = Vec::new();
            let mut ext: Vec<i64> = Vec::new();
            for d in 0..nd {
                let mut outer: Option<Lin> = None;
                let (mut lo, mut hi) = (i64::MAX, i64::MIN);
                for acc in &vall {
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
            let (panel, innermost) = match mode {
                Cache::Read(p, d) => (p, d),
                Cache::Write => (None, None),
            };
            if let Some(d) = innermost {
                if d >= target.ndim() {
                    let what = if panel.is_some() { "cut into panels" } else { "make innermost" };
                    problem = Some(format!(
                        "needs a dimension of `{buffer}` to {what}, found {d} (it has {})",
                        target.ndim()
                    ));
                    return Ok(s.clone());
                }
            }
            // The region's dimension holding it.
            let innermost = innermost.and_then(|d| dims.iter().position(|x| x.holds(d)));
            // With panels: their width and the region's dimension cut into them (the one given,
            // else the last), and no transposed copy.
            let (panel, innermost) = match panel {
                Some(w) => (Some((w, innermost.unwrap_or(nd.saturating_sub(1)))), None),
                None => (None, innermost),
            };
            if let Some((w, pd)) = panel {
                // Every access's index in that dimension must be the region's start plus
                // `p * w + q` with `q` in [0, w): then panel `p`, column `q`.
                if nd == 0 {
                    problem = Some(format!("needs a buffer with dimensions to cut into panels, found `{buffer}` with none"));
                    return Ok(s.clone());
                }
                let e = ext[pd];
                if w < 1 || e % w != 0 {
                    problem = Some(format!(
                        "needs a panel width that divides the extent of the region of `{buffer}` in the dimension cut into panels ({e}), found {w}"
                    ));
                    return Ok(s.clone());
                }
                for acc in &vall {
                    let rel = linear(&acc[pd]).expect("checked affine").minus(&base[pd]);
                    let (_, q) = rel.div_mod(w);
                    if !q.range(&inner).is_some_and(|(lo, hi)| lo >= 0 && hi < w) {
                        problem = Some(format!(
                            "cannot cut the index `{}` of `{buffer}` into panels of {w}: its part within a panel is not in [0, {w})",
                            acc[pd]
                        ));
                        return Ok(s.clone());
                    }
                }
            }
            let t = DataType::i64();
            let cache_shape: Vec<i64> = match panel {
                Some((w, pd)) => panel_order(ext[pd] / w, &without(&ext, pd), w),
                None => last_order(&ext, innermost),
            };
            let cache = Buffer::new(&cname, target.dtype, cache_shape.iter().map(|&e| imm(t, e)).collect())
                .with_scope(StorageScope::Local);
            // Ranges of the enclosing loops (and `at`) for the bounds check.
            let mut ranges: HashMap<crate::ir::VarId, (i64, i64)> = HashMap::new();
            for (v, mn, ex) in enc.iter().chain(std::iter::once(&(var.clone(), min.clone(), extent.clone()))) {
                if let (Some(a), Some(b)) = (mn.as_int(), ex.as_int()) {
                    ranges.insert(v.id, (a, b));
                }
            }
            let in_bounds = |d: usize| -> bool {
                let Some(limit) = vshape[d].as_int() else { return false };
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
                // The copy's loops: one per dimension of the region (with panels: the dimension
                // cut into them as a panel loop in its place and a column loop innermost. Panels
                // of the last dimension are then filled one row of the region at a time, each
                // row read in one sweep; panels of another, one panel at a time, its `w` rows
                // read side by side along the region's rows and interleaved into it).
                let nv = if panel.is_some() { nd + 1 } else { nd };
                let vars: Vec<Var> = (0..nv).map(|d| Var::new(&format!("{prefix}{tag}{d}"), t)).collect();
                let r: Vec<Expr> = vars.iter().map(|v| Expr::Var(v.clone())).collect();
                let extents: Vec<i64> = match panel {
                    Some((w, pd)) => {
                        let mut e = ext.clone();
                        e[pd] /= w;
                        e.push(w);
                        e
                    }
                    None => ext.clone(),
                };
                let offset = |d: usize| match panel {
                    Some((w, pd)) if d == pd => r[pd].clone() * imm(t, w) + r[nd].clone(),
                    _ => r[d].clone(),
                };
                let gi: Vec<Expr> = (0..nd)
                    .map(|d| {
                        let g = rewrite::fold(base_e[d].clone() + offset(d));
                        if vshape[d].dtype() == t { g } else { g.cast(vshape[d].dtype()) }
                    })
                    .collect();
                let ci: Vec<Expr> = match panel {
                    Some((_, pd)) => panel_order(r[pd].clone(), &without(&r[..nd], pd), r[nd].clone()),
                    None => last_order(&r, innermost),
                };
                let real = real_ix(&gi, &dims);
                let mut st = if to_cache {
                    cache.store(ci, target.load(real))
                } else {
                    target.store(real, cache.load(ci))
                };
                let mut cond: Option<Expr> = None;
                for d in 0..nd {
                    if guarded[d] {
                        let c = gi[d].clone().lt(vshape[d].clone());
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
                    let last = d + 1 == nv;
                    let k = match mode {
                        Cache::Write if last => ForKind::Vectorized,
                        Cache::Write => ForKind::Unrolled,
                        // A transposed copy reads along the buffer and writes across the
                        // cache: left to LLVM.
                        Cache::Read(None, Some(_)) => ForKind::Serial,
                        // The columns of panels across the region's rows read `w` rows: unrolled.
                        Cache::Read(..) if last && panel.is_some_and(|(_, pd)| pd + 1 < nd) => {
                            if extents[d] <= UNROLL_COPY_MAX { ForKind::Unrolled } else { ForKind::Serial }
                        }
                        Cache::Read(..) if last && extents[d] <= VECTOR_COPY_MAX => ForKind::Vectorized,
                        Cache::Read(..) if !last && extents[d] <= UNROLL_COPY_MAX => ForKind::Unrolled,
                        Cache::Read(..) => ForKind::Serial,
                    };
                    st = for_(v, imm(t, 0), imm(t, extents[d]), k, st);
                }
                st
            };
            struct Redirect<'a> {
                name: &'a str,
                dims: &'a [Dim],
                cache: &'a Buffer,
                base: &'a [Lin],
                panel: Option<(i64, usize)>,
                innermost: Option<usize>,
            }
            impl Redirect<'_> {
                fn local(&self, ix: &[Expr]) -> Vec<Expr> {
                    let t = DataType::i64();
                    let mut rel: Vec<Lin> = virtual_ix(ix, self.dims)
                        .iter()
                        .zip(self.base)
                        .map(|(i, b)| linear(i).expect("checked affine").minus(b))
                        .collect();
                    // Panels were checked to have the dimension cut into them.
                    let last = match self.panel {
                        Some((w, pd)) if pd < rel.len() => Some((w, rel.remove(pd))),
                        _ => None,
                    };
                    let rest: Vec<Expr> = rel.iter().map(|l| l.to_expr(t)).collect();
                    match last {
                        Some((w, l)) => {
                            let (p, q) = l.div_mod(w);
                            panel_order(p.to_expr(t), &rest, q.to_expr(t))
                        }
                        None => last_order(&rest, self.innermost),
                    }
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
                &mut Redirect { name: buffer, dims: &dims, cache: &cache, base: &base, panel, innermost },
                body,
            );
            // The read-in is dead when the body's first statement overwrites the whole cache
            // (the init of an accumulation, `C[i, j] = 0`) before anything reads it.
            let read_in = if loads.is_empty()
                || (mode == Cache::Write && overwrites_first(&nbody, &cache, &ext))
            {
                vec![]
            } else {
                vec![copy(true, "r")]
            };
            let mut seq = read_in;
            seq.push(nbody);
            if mode == Cache::Write {
                seq.push(copy(false, "w"));
            }
            Ok(for_(var.clone(), min.clone(), extent.clone(), kind, cache.allocate(Stmt::Seq(seq))))
        })?;
        match problem {
            Some(m) => Err(self.form(primitive, m)),
            None => Ok(cname),
        }
    }
}

/// A dimension of a cached region: one of the buffer's, or two adjacent ones that every access
/// indexes `(floordiv(e, n), floormod(e, n))` with `n` the inner one's constant extent (the
/// indices of a loop fused from two: a convolution's output rows and columns as one loop of
/// pixels), taken as one dimension of index `e` and extent `outer * n`.
#[derive(Clone, Copy, Debug)]
struct Dim {
    /// The buffer's dimension (the outer of a pair).
    first: usize,
    /// For a pair: `n`, the inner dimension's extent.
    merged: Option<i64>,
}

impl Dim {
    /// Whether the buffer's dimension `d` is (in) this one.
    fn holds(&self, d: usize) -> bool {
        d == self.first || (self.merged.is_some() && d == self.first + 1)
    }

    /// Its extent.
    fn extent(&self, target: &Buffer) -> Expr {
        let e = &target.shape[self.first];
        match (self.merged, e.as_int()) {
            (Some(n), Some(outer)) => imm(e.dtype(), outer * n),
            _ => e.clone(),
        }
    }
}

/// `a` when `e` is `op(a, n)`.
fn divmod_of(e: &Expr, op: BinOp, n: i64) -> Option<&Expr> {
    match e {
        Expr::Binary { op: o, a, b } if *o == op && b.as_int() == Some(n) => Some(a),
        _ => None,
    }
}

/// The dimensions of the region `accesses` touch in `target` ([`Dim`]): adjacent pairs merged
/// where every access indexes them as a fused loop does, left to right.
fn region_dims(accesses: &[&Vec<Expr>], target: &Buffer) -> Vec<Dim> {
    let nd = target.ndim();
    let mut out = Vec::new();
    let mut d = 0;
    while d < nd {
        let pair = (d + 1 < nd)
            .then(|| (target.shape[d].as_int(), target.shape[d + 1].as_int()))
            .and_then(|(o, n)| o.zip(n))
            .filter(|&(o, n)| o > 0 && n > 1 && o.checked_mul(n).is_some())
            .map(|(_, n)| n)
            .filter(|&n| {
                accesses.iter().all(|ix| {
                    let q = divmod_of(&ix[d], BinOp::FloorDiv, n);
                    q.is_some() && q == divmod_of(&ix[d + 1], BinOp::FloorMod, n)
                })
            });
        out.push(Dim {
            first: d,
            merged: pair,
        });
        d += if pair.is_some() { 2 } else { 1 };
    }
    out
}

/// An access's indices in the region's dimensions: a merged pair's index `e`.
fn virtual_ix(ix: &[Expr], dims: &[Dim]) -> Vec<Expr> {
    dims.iter()
        .map(|d| match d.merged {
            Some(n) => divmod_of(&ix[d.first], BinOp::FloorDiv, n)
                .cloned()
                .unwrap_or_else(|| ix[d.first].clone()),
            None => ix[d.first].clone(),
        })
        .collect()
}

/// Indices in the region's dimensions as the buffer's: a merged pair's `e` as `(floordiv(e,
/// n), floormod(e, n))`.
fn real_ix(ix: &[Expr], dims: &[Dim]) -> Vec<Expr> {
    let mut out = Vec::new();
    for (e, d) in ix.iter().zip(dims) {
        match d.merged {
            Some(n) => {
                let n = imm(e.dtype(), n);
                out.push(e.clone().floordiv(n.clone()));
                out.push(e.clone().floormod(n));
            }
            None => out.push(e.clone()),
        }
    }
    out
}

/// The buffer named `name` that an `allocate` in `s` declares (a workspace of the function:
/// TVM's padded input of a convolution), whose scope holds every access to it.
pub(super) fn allocated(s: &Stmt, name: &str) -> Option<Buffer> {
    let mut found = None;
    struct V<'a>(&'a str, &'a mut Option<Buffer>);
    impl crate::ir::visit::Visitor for V<'_> {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::Allocate { buffer, .. } = s {
                if buffer.name == self.0 && self.1.is_none() {
                    *self.1 = Some(buffer.clone());
                }
            }
            crate::ir::visit::walk_stmt(self, s);
        }
        fn expr(&mut self, _: &Expr) {}
    }
    crate::ir::visit::Visitor::stmt(&mut V(name, &mut found), s);
    found
}

/// The order of a transposed cache's dimensions: the region's, with dimension `d` (if any)
/// moved last.
fn last_order<T: Clone>(v: &[T], d: Option<usize>) -> Vec<T> {
    match d {
        Some(d) if d < v.len() => v[..d]
            .iter()
            .chain(&v[d + 1..])
            .chain(std::iter::once(&v[d]))
            .cloned()
            .collect(),
        _ => v.to_vec(),
    }
}

/// `v` without its element `d`.
fn without<T: Clone>(v: &[T], d: usize) -> Vec<T> {
    v.iter()
        .enumerate()
        .filter(|&(i, _)| i != d)
        .map(|(_, x)| x.clone())
        .collect()
}

/// The order of a panelled cache's dimensions: the panel, the region's other dimensions, the
/// column within the panel (`[E / w, ..., w]`).
fn panel_order<T: Clone>(panel: T, rest: &[T], column: T) -> Vec<T> {
    std::iter::once(panel)
        .chain(rest.iter().cloned())
        .chain(std::iter::once(column))
        .collect()
}

/// Whether the first thing `s` runs that touches `cache` writes every element of it (extents
/// `ext`) before anything reads it. The statements before it (through `Seq`s, `allocate`s and
/// `let`s) must not touch `cache`: a softmax's row, whose max is found before its exponentials
/// are written. That first thing is a nest of loops with constant bounds (and
/// `Seq`s, entered at their first statement) whose first statement run per iteration is one
/// store to `cache` at indices that are distinct loop variables of the nest plus constants,
/// each loop covering exactly `0..ext[d]` (or the index `0` where `ext[d]` is 1), whose value
/// does not read `cache`, and every other access to `cache` inside the nest is at the same
/// indices. Each iteration then writes its own element
/// before it touches it, and no iteration touches another's (the init of an accumulation:
/// `for i, j { C[i, j] = 0; for k { C[i, j] += .. } }`). The cache's earlier contents are dead.
fn overwrites_first(s: &Stmt, cache: &Buffer, ext: &[i64]) -> bool {
    let Some(root) = first_touch(s, &cache.name) else {
        return false;
    };
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

/// The first statement `s` runs that touches `name` (loads or stores it), found through
/// `Seq`s, `allocate`s and `let`s that run unconditionally; `None` where nothing does.
fn first_touch<'s>(s: &'s Stmt, name: &str) -> Option<&'s Stmt> {
    let touches = |x: &Stmt| {
        let (mut loads, mut stores) = (vec![], vec![]);
        rewrite::accesses(x, name, &mut loads, &mut stores);
        !(loads.is_empty() && stores.is_empty())
    };
    match s {
        Stmt::Seq(v) => v
            .iter()
            .find(|x| touches(x))
            .and_then(|x| first_touch(x, name)),
        Stmt::Let { value, .. } if touches(&Stmt::Evaluate(value.clone())) => Some(s),
        Stmt::Allocate { body, .. } | Stmt::Let { body, .. } => first_touch(body, name),
        _ => touches(s).then_some(s),
    }
}

fn collect_loops(s: &Stmt, out: &mut HashMap<crate::ir::VarId, (i64, i64)>) {
    crate::ir::visit::for_each_loop(s, |var, min, extent| {
        if let (Some(a), Some(b)) = (min.as_int(), extent.as_int()) {
            out.insert(var.id, (a, b));
        }
    });
}
