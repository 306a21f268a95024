//! Schedule primitives for device kernels (see `docs/ir.md`, "Device code"): binding loops to
//! thread indices, staging tiles in `shared` memory, and block-wide (cross-thread) reductions.
//!
//! | primitive | effect |
//! |---|---|
//! | [`bind`](Schedule::bind) | a loop becomes a `thread_binding` loop (rebased to start at 0) |
//! | [`cache_read_shared`](Schedule::cache_read_shared) | the tile of a read-only buffer that one iteration of a loop reads, over all the block's threads, is loaded cooperatively into a `shared` buffer between two barriers |
//! | [`block_reduce`](Schedule::block_reduce) | `for o { for t { X op= f } }` → per-thread partial results, a tree reduction over a `shared` buffer with barriers, the result combined into `X` |
//!
//! They are the specialised forms the OpenCL kernels of [`super::kernels`] need (TVM's
//! `bind`, `cache_read(.., "shared")` + `compute_at` + a bound load loop, and the cross-thread
//! allreduce), each a plain IR rewrite checked by the verifier like every other primitive.

use std::collections::HashMap;

use super::{for_, guard, imm, parts, Schedule, ScheduleResult};
use crate::ir::builder::Reducer;
use crate::ir::rewrite::{self, linear, rw_stmt, subst_stmt, Lin, Rewriter};
use crate::ir::{
    BinOp, Buffer, DataType, Expr, ForKind, Stmt, StorageScope, ThreadTag, Var, VarId,
};

/// The buffers allocated inside a thread-bound loop (per block or per thread).
fn kernel_locals(s: &Stmt) -> std::collections::HashSet<VarId> {
    struct Find(std::collections::HashSet<VarId>, usize);
    impl crate::ir::visit::Visitor for Find {
        fn stmt(&mut self, s: &Stmt) {
            match s {
                Stmt::For {
                    kind: ForKind::ThreadBinding(_),
                    ..
                } => {
                    self.1 += 1;
                    crate::ir::visit::walk_stmt(self, s);
                    self.1 -= 1;
                    return;
                }
                Stmt::Allocate { buffer, .. } if self.1 > 0 => {
                    self.0.insert(buffer.data.id);
                }
                _ => {}
            }
            crate::ir::visit::walk_stmt(self, s);
        }
        fn expr(&mut self, _: &Expr) {}
    }
    let mut f = Find(Default::default(), 0);
    crate::ir::visit::Visitor::stmt(&mut f, s);
    f.0
}

/// A loop on the way to another: variable, min, extent, kind.
pub(super) type Loop = (Var, Expr, Expr, ForKind);

/// The loops enclosing loop `name` (outermost first) and the loop itself, if it is in `s`.
pub(super) fn loop_path(s: &Stmt, name: &str, path: &mut Vec<Loop>) -> Option<Loop> {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => {
            let me = (var.clone(), min.clone(), extent.clone(), *kind);
            if &*var.name == name {
                return Some(me);
            }
            path.push(me);
            let r = loop_path(body, name, path);
            if r.is_none() {
                path.pop();
            }
            r
        }
        Stmt::Allocate { body, .. } | Stmt::Let { body, .. } => loop_path(body, name, path),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => loop_path(then_case, name, path)
            .or_else(|| else_case.as_ref().and_then(|e| loop_path(e, name, path))),
        Stmt::Seq(v) => v.iter().find_map(|c| loop_path(c, name, path)),
        _ => None,
    }
}

/// Every loop inside `s`: variable id → constant `(min, extent)`, or `None` if not constant.
fn inner_loops(s: &Stmt, out: &mut HashMap<VarId, Option<(i64, i64)>>) {
    crate::ir::visit::for_each_loop(s, |var, min, extent| {
        out.insert(var.id, min.as_int().zip(extent.as_int()));
    });
}

/// Every variable bound by a loop or a `let` in `s`.
fn bound_vars(s: &Stmt, out: &mut HashMap<VarId, ()>) {
    crate::ir::visit::for_each_bound_var(s, |var| {
        out.insert(var.id, ());
    });
}

fn as_i64(e: Expr) -> Expr {
    super::cast_to(e, DataType::i64())
}

/// The linear thread id `tx + ty * ex + tz * ex * ey` of the enclosing `threadIdx` loops, and the
/// number of threads. `None` if an extent is not a positive constant or the count overflows.
fn thread_id(path: &[Loop]) -> Option<(Expr, i64)> {
    let mut by_axis: Vec<(usize, Var, i64)> = Vec::new();
    for (v, _, ex, k) in path {
        if let ForKind::ThreadBinding(t @ ThreadTag::Thread(_)) = k {
            by_axis.push((t.axis(), v.clone(), ex.as_int().filter(|&e| e > 0)?));
        }
    }
    by_axis.sort_by_key(|(a, ..)| *a);
    let mut id: Option<Expr> = None;
    let mut n = 1i64;
    for (_, v, ex) in by_axis {
        let term = rewrite::fold(as_i64(Expr::Var(v)) * imm(DataType::i64(), n));
        id = Some(match id {
            None => term,
            Some(x) => x + term,
        });
        n = n.checked_mul(ex)?;
    }
    Some((id.unwrap_or_else(|| imm(DataType::i64(), 0)), n))
}

impl Schedule {
    /// The body of [`Schedule::bind`] (which records it in the trace).
    pub(super) fn bind_untraced(&mut self, name: &str, tag: ThreadTag) -> ScheduleResult<()> {
        let mut bad = None;
        self.edit(name, &mut |s, _| {
            let (var, min, extent, kind, body) = parts(s);
            if matches!(kind, ForKind::Parallel | ForKind::Vectorized) {
                bad = Some(kind);
                return Ok(s.clone());
            }
            let t = var.dtype;
            if min.as_int() == Some(0) {
                return Ok(for_(
                    var.clone(),
                    min.clone(),
                    extent.clone(),
                    ForKind::ThreadBinding(tag),
                    body.clone(),
                ));
            }
            let nv = Var::new(&var.name, t);
            let map = HashMap::from([(var.id, rewrite::fold(Expr::Var(nv.clone()) + min.clone()))]);
            Ok(for_(
                nv,
                imm(t, 0),
                extent.clone(),
                ForKind::ThreadBinding(tag),
                subst_stmt(body, &map),
            ))
        })?;
        match bad {
            Some(k) => Err(self.form(
                "bind",
                format!(
                    "needs a serial or unrolled loop, found `{name}` of kind {} (bound to {tag})",
                    k.name()
                ),
            )),
            None => Ok(()),
        }
    }

    /// The body of [`Schedule::cache_read_shared`] (which records it in the trace).
    pub(super) fn cache_read_shared_untraced(
        &mut self,
        buffer: &str,
        at: &str,
    ) -> ScheduleResult<String> {
        const P: &str = "cache_read_shared";
        let target = self
            .find_buffer(buffer)
            .ok_or_else(|| self.form(P, format!("found no parameter buffer `{buffer}`")))?;
        let mut path = Vec::new();
        let Some(me) = loop_path(&self.func.body, at, &mut path) else {
            // `edit` reports the missing loop.
            self.edit(at, &mut |s, _| Ok(s.clone()))?;
            unreachable!("edit fails on a missing loop");
        };
        let Some(outer_thread) = path
            .iter()
            .find(|l| matches!(l.3, ForKind::ThreadBinding(ThreadTag::Thread(_))))
            .map(|l| l.0.name.to_string())
        else {
            return Err(self.form(
                P,
                format!("needs loop `{at}` to be inside the threadIdx loops of a device kernel"),
            ));
        };
        let Some((tid, threads)) = thread_id(&path) else {
            return Err(self.form(
                P,
                format!(
                    "needs positive constant threadIdx extents (with a product that fits in \
                     64 bits) around loop `{at}`"
                ),
            ));
        };
        // Known ranges: the enclosing loops and `at` (for the bounds check).
        let mut outer_ranges: HashMap<VarId, (i64, i64)> = HashMap::new();
        for (v, mn, ex, _) in path.iter().chain(std::iter::once(&me)) {
            if let (Some(a), Some(b)) = (mn.as_int(), ex.as_int()) {
                outer_ranges.insert(v.id, (a, b));
            }
        }
        let thread_vars: Vec<VarId> = path
            .iter()
            .filter(|l| matches!(l.3, ForKind::ThreadBinding(ThreadTag::Thread(_))))
            .map(|l| l.0.id)
            .collect();
        // Variables the tile's origin may use: the loops around the tile (not the threads') and
        // variables bound nowhere in the body (shape variables, scalar parameters).
        let mut bound = HashMap::new();
        bound_vars(&self.func.body, &mut bound);
        let uniform_ok = |v: &Var| {
            !bound.contains_key(&v.id)
                || (path
                    .iter()
                    .chain(std::iter::once(&me))
                    .any(|l| l.0.id == v.id)
                    && !thread_vars.contains(&v.id))
        };
        let mut names = self.names();
        rewrite::allocated(&self.func.body, &mut names);
        let sname = {
            let base = format!("{buffer}_shared");
            let mut n = base.clone();
            let mut k = 1;
            while self.find_buffer(&n).is_some() || names.contains(&n) {
                n = format!("{base}{k}");
                k += 1;
            }
            n
        };
        let lname = self.fresh(&format!("{buffer}_l"), &[]);
        let mut problem: Option<String> = None;
        let mut shared: Option<Buffer> = None;
        self.edit(at, &mut |s, _| {
            let (var, min, extent, kind, body) = parts(s);
            let mut inner = HashMap::new();
            inner_loops(body, &mut inner);
            let (mut loads, mut stores) = (vec![], vec![]);
            rewrite::accesses(body, buffer, &mut loads, &mut stores);
            if !stores.is_empty() {
                problem = Some(format!("needs `{buffer}` to be read-only in loop `{at}`"));
                return Ok(s.clone());
            }
            if loads.is_empty() {
                problem = Some(format!("found no read of `{buffer}` in loop `{at}`"));
                return Ok(s.clone());
            }
            // Ranges of the varying variables: loops inside `at` and the threadIdx loops.
            let mut varying: HashMap<VarId, (i64, i64)> = HashMap::new();
            for (id, r) in &inner {
                match r {
                    Some(r) => {
                        varying.insert(*id, *r);
                    }
                    None => {
                        problem = Some(format!(
                            "needs the loops inside `{at}` to have constant bounds"
                        ));
                        return Ok(s.clone());
                    }
                }
            }
            for id in &thread_vars {
                varying.insert(*id, outer_ranges[id]);
            }
            let nd = target.ndim();
            let mut origin: Vec<Lin> = Vec::new();
            let mut shape: Vec<i64> = Vec::new();
            for d in 0..nd {
                let mut o: Option<Lin> = None;
                let (mut lo, mut hi) = (i64::MAX, i64::MIN);
                for acc in &loads {
                    let Some(l) = linear(&acc[d]) else {
                        problem = Some(format!(
                            "needs affine indices of `{buffer}`, found `{}`",
                            acc[d]
                        ));
                        return Ok(s.clone());
                    };
                    let mut u = l.without(|v| varying.contains_key(&v.id));
                    u.c = 0;
                    if let Some((v, _)) = u.terms.iter().find(|(v, _)| !uniform_ok(v)) {
                        problem = Some(format!(
                            "needs the indices of `{buffer}` to use only loops inside `{at}`, the \
                             threadIdx loops and the loops around the tile, found `{}` in `{}`",
                            v.name, acc[d]
                        ));
                        return Ok(s.clone());
                    }
                    match &o {
                        None => o = Some(u.clone()),
                        Some(p) if *p == u => {}
                        Some(p) => {
                            problem = Some(format!(
                                "needs every read of `{buffer}` in `{at}` to have the same origin \
                                 outside the tile, found `{}` and `{}` in dimension {d}",
                                p.to_expr(DataType::i64()),
                                u.to_expr(DataType::i64())
                            ));
                            return Ok(s.clone());
                        }
                    }
                    let rest = l.minus(&u);
                    let Some((a, b)) = rest.range(&varying) else {
                        problem = Some(format!(
                            "needs the loops inside `{at}` that index `{buffer}` to have positive \
                             constant extents and a tile whose bounds fit in 64 bits, found `{}`",
                            acc[d]
                        ));
                        return Ok(s.clone());
                    };
                    lo = lo.min(a);
                    hi = hi.max(b);
                }
                let mut o = o.expect("some read");
                o.c = lo;
                origin.push(o);
                match hi.checked_sub(lo).and_then(|x| x.checked_add(1)) {
                    Some(e) => shape.push(e),
                    None => {
                        problem = Some(format!("tile of `{buffer}` too large for 64 bits"));
                        return Ok(s.clone());
                    }
                }
            }
            let t = DataType::i64();
            let sh = Buffer::shared(&sname, target.dtype, &shape);
            shared = Some(sh.clone());
            // The cooperative load.
            let Some(total) = shape.iter().try_fold(1i64, |a, &b| a.checked_mul(b)) else {
                problem = Some(format!("tile of `{buffer}` too large for 64 bits"));
                return Ok(s.clone());
            };
            let iters = total / threads + i64::from(total % threads != 0);
            let lv = Var::new(&lname, t);
            let e = rewrite::fold(Expr::Var(lv.clone()) * imm(t, threads) + tid.clone());
            // Row-major unflattening of `e` (`e < total`: guarded when threads do not divide).
            let mut local_ix = Vec::new();
            for d in 0..nd {
                let stride: i64 = shape[d + 1..].iter().product();
                let q = if stride == 1 {
                    e.clone()
                } else {
                    e.clone().floordiv(imm(t, stride))
                };
                local_ix.push(if d == 0 {
                    q
                } else {
                    q.floormod(imm(t, shape[d]))
                });
            }
            let mut ranges = outer_ranges.clone();
            ranges.insert(lv.id, (0, iters));
            let mut global_ix = Vec::new();
            let mut cond: Option<Expr> = if total % threads != 0 {
                Some(e.clone().lt(imm(t, total)))
            } else {
                None
            };
            for d in 0..nd {
                let g = rewrite::fold(origin[d].to_expr(t) + local_ix[d].clone());
                let dt = target.shape[d].dtype();
                let g = if dt == t { g } else { g.cast(dt) };
                let range = origin[d].range(&ranges);
                let lo_ok = range.is_some_and(|(lo, _)| lo >= 0);
                let hi_ok = match (target.shape[d].as_int(), range) {
                    (Some(limit), Some((_, hi))) => hi + shape[d] - 1 < limit,
                    _ => false,
                };
                let mut checks = Vec::new();
                if !lo_ok {
                    checks.push(g.clone().ge(Expr::IntImm {
                        dtype: dt,
                        value: 0,
                    }));
                }
                if !hi_ok {
                    checks.push(g.clone().lt(target.shape[d].clone()));
                }
                for c in checks {
                    cond = Some(match cond {
                        None => c,
                        Some(x) => x.and(c),
                    });
                }
                global_ix.push(g);
            }
            let mut st = sh.store(local_ix, target.load(global_ix));
            if let Some(c) = cond {
                st = guard(c, st);
            }
            // `floordiv(l * threads + tid, w)` with `w` dividing `threads` → `l * (threads / w) + ..`.
            let mut small: HashMap<VarId, (i64, i64)> = HashMap::new();
            for id in &thread_vars {
                small.insert(*id, outer_ranges[id]);
            }
            small.insert(lv.id, (0, iters));
            let st = rewrite::simplify_divmod(&st, &small);
            let lk = if iters <= 8 {
                ForKind::Unrolled
            } else {
                ForKind::Serial
            };
            let load = for_(lv, imm(t, 0), imm(t, iters), lk, st);
            // Reads of `buffer` in the body read the tile.
            struct Redirect<'a> {
                name: &'a str,
                sh: &'a Buffer,
                origin: &'a [Lin],
            }
            impl Rewriter for Redirect<'_> {
                fn post_expr(&mut self, e: Expr) -> Expr {
                    match &e {
                        Expr::Load { buffer, indices } if buffer.name == self.name => {
                            let ix: Vec<Expr> = indices
                                .iter()
                                .zip(self.origin)
                                .map(|(i, o)| {
                                    linear(i)
                                        .expect("checked affine")
                                        .minus(o)
                                        .to_expr(DataType::i64())
                                })
                                .collect();
                            self.sh.load(ix)
                        }
                        _ => e,
                    }
                }
            }
            let nbody = rw_stmt(
                &mut Redirect {
                    name: buffer,
                    sh: &sh,
                    origin: &origin,
                },
                body,
            );
            // Share the barriers of an earlier staging at this loop.
            let nbody = match nbody {
                Stmt::Seq(mut v)
                    if v.len() >= 3
                        && v.last() == Some(&Stmt::Barrier)
                        && v[..v.len() - 1].contains(&Stmt::Barrier) =>
                {
                    let p = v.iter().position(|x| *x == Stmt::Barrier).expect("found");
                    v.insert(p, load);
                    Stmt::Seq(v)
                }
                other => Stmt::Seq(vec![load, Stmt::Barrier, other, Stmt::Barrier]),
            };
            Ok(for_(var.clone(), min.clone(), extent.clone(), kind, nbody))
        })?;
        if let Some(m) = problem {
            return Err(self.form(P, m));
        }
        let sh = shared.expect("built");
        self.edit(&outer_thread, &mut |s, _| Ok(sh.allocate(s.clone())))?;
        Ok(sname)
    }

    /// The body of [`Schedule::block_reduce`] (which records it in the trace).
    pub(super) fn block_reduce_untraced(
        &mut self,
        outer: &str,
        inner: &str,
    ) -> ScheduleResult<String> {
        const P: &str = "block_reduce";
        let mut path = Vec::new();
        if loop_path(&self.func.body, outer, &mut path).is_some() {
            let in_block = path
                .iter()
                .any(|l| matches!(l.3, ForKind::ThreadBinding(ThreadTag::Block(_))));
            let in_thread = path
                .iter()
                .any(|l| matches!(l.3, ForKind::ThreadBinding(ThreadTag::Thread(_))));
            if !in_block || in_thread {
                return Err(self.form(
                    P,
                    format!(
                        "needs loop `{outer}` inside a blockIdx loop and outside every threadIdx \
                         loop of a device kernel"
                    ),
                ));
            }
        }
        let rname = self.fresh_buffer("red");
        let pname = self.fresh_buffer(&format!("{rname}_part"));
        let kernel_locals = kernel_locals(&self.func.body);
        let mut problem: Option<String> = None;
        // (X, ix) of the reduction, for folding the init.
        let mut target: Option<(Buffer, Vec<Expr>)> = None;
        self.edit(outer, &mut |s, _| {
            let (vo, mo, eo, ko, body) = parts(s);
            let form = format!(
                "needs `for {outer} {{ for {inner} {{ X[ix] = X[ix] +|max|min f }} }}` with \
                 `{inner}` of constant power-of-two extent starting at 0 and `ix` independent of \
                 both loops"
            );
            let Stmt::For {
                var: vi,
                min: mi,
                extent: ei,
                body: ib,
                ..
            } = body
            else {
                problem = Some(form);
                return Ok(s.clone());
            };
            let ext = match (ei.as_int(), mi.as_int()) {
                (Some(e), Some(0)) if &*vi.name == inner && e > 0 && (e as u64).is_power_of_two() => e,
                _ => {
                    problem = Some(form);
                    return Ok(s.clone());
                }
            };
            let Stmt::Store {
                buffer,
                indices,
                value,
            } = &**ib
            else {
                problem = Some(form);
                return Ok(s.clone());
            };
            let same = |e: &Expr| matches!(e, Expr::Load { buffer: b, indices: i } if b.name == buffer.name && i == indices);
            let (reducer, f) = match value {
                Expr::Binary { op: BinOp::Add, a, b } if same(a) => (Reducer::Sum, (**b).clone()),
                Expr::Binary { op: BinOp::Max, a, b } if same(a) => (Reducer::Max, (**b).clone()),
                Expr::Binary { op: BinOp::Min, a, b } if same(a) => (Reducer::Min, (**b).clone()),
                _ => {
                    problem = Some(form);
                    return Ok(s.clone());
                }
            };
            if indices
                .iter()
                .any(|i| i.mentions(vo) || i.mentions(vi))
            {
                problem = Some(form);
                return Ok(s.clone());
            }
            target = Some((buffer.clone(), indices.clone()));
            let dt = buffer.dtype;
            let t = vi.dtype;
            let tv = Var::new(&vi.name, t);
            let tx = Expr::Var(tv.clone());
            let red = Buffer::shared(&rname, dt, &[ext]);
            let part = Buffer::new(&pname, dt, vec![imm(DataType::i64(), 1)])
                .with_scope(StorageScope::Local);
            let z = || vec![imm(DataType::i64(), 0)];
            let f = subst_stmt(
                &Stmt::Evaluate(f),
                &HashMap::from([(vi.id, tx.clone())]),
            );
            let Stmt::Evaluate(f) = f else {
                unreachable!("substitution keeps the statement")
            };
            let me = as_i64(tx.clone());
            let mut seq = vec![part.allocate(Stmt::Seq(vec![
                part.store(z(), reducer.init(dt)),
                for_(
                    vo.clone(),
                    mo.clone(),
                    eo.clone(),
                    ko,
                    part.store(z(), reducer.combine(part.load(z()), f)),
                ),
                red.store(vec![me.clone()], part.load(z())),
            ]))];
            seq.push(Stmt::Barrier);
            let mut h = ext / 2;
            while h >= 1 {
                seq.push(guard(
                    tx.clone().lt(imm(t, h)),
                    red.store(
                        vec![me.clone()],
                        reducer.combine(
                            red.load(vec![me.clone()]),
                            red.load(vec![me.clone() + imm(DataType::i64(), h)]),
                        ),
                    ),
                ));
                seq.push(Stmt::Barrier);
                h /= 2;
            }
            // Every thread updates X only when X is its own: a `local` allocated inside the
            // kernel. A `local` of the host (one copy, in device memory once a kernel uses it)
            // is updated once, by thread 0, as any other buffer.
            let private = buffer.scope == StorageScope::Local
                && kernel_locals.contains(&buffer.data.id);
            let fin = buffer.store(
                indices.clone(),
                reducer.combine(buffer.load(indices.clone()), red.load(z())),
            );
            seq.push(if private {
                fin
            } else {
                guard(tx.clone().eq_(imm(t, 0)), fin)
            });
            Ok(red.allocate(for_(
                tv,
                imm(t, 0),
                imm(t, ext),
                ForKind::ThreadBinding(ThreadTag::Thread(0)),
                Stmt::Seq(seq),
            )))
        })?;
        if let Some(m) = problem {
            return Err(self.form(P, m));
        }
        let (x, ix) = target.expect("set with the rewrite");
        self.func.body = fold_init(&self.func.body, &rname, &x, &ix);
        Ok(rname)
    }
}

/// In a sequence `[X[ix] = v, allocate <red> { .. }]`, drops the init and reads `v` for `X[ix]`
/// in the reduction (`v` must not read `X`).
fn fold_init(s: &Stmt, red: &str, x: &Buffer, ix: &[Expr]) -> Stmt {
    match s {
        Stmt::Seq(v) => {
            let mut out: Vec<Stmt> = Vec::new();
            let mut k = 0;
            while k < v.len() {
                if let (
                    Stmt::Store {
                        buffer,
                        indices,
                        value,
                    },
                    Some(Stmt::Allocate { buffer: rb, .. }),
                ) = (&v[k], v.get(k + 1))
                {
                    let mut l = vec![];
                    let mut st = vec![];
                    rewrite::accesses(&Stmt::Evaluate(value.clone()), &x.name, &mut l, &mut st);
                    if rb.name == red && buffer.name == x.name && indices == ix && l.is_empty() {
                        struct Init<'a>(&'a Buffer, &'a [Expr], &'a Expr);
                        impl Rewriter for Init<'_> {
                            fn post_expr(&mut self, e: Expr) -> Expr {
                                match &e {
                                    Expr::Load { buffer, indices }
                                        if buffer.name == self.0.name && indices == self.1 =>
                                    {
                                        self.2.clone()
                                    }
                                    _ => e,
                                }
                            }
                        }
                        out.push(rw_stmt(&mut Init(x, ix, value), &v[k + 1]));
                        k += 2;
                        continue;
                    }
                }
                out.push(fold_init(&v[k], red, x, ix));
                k += 1;
            }
            Stmt::Seq(out)
        }
        other => other.map_children(|c| fold_init(c, red, x, ix)),
    }
}
