//! The search space of a function: its loop nests, the knobs of each, and the schedule steps a
//! choice of knobs gives.
//!
//! A function's body is read as a sequence of top-level loop nests (the statements at its root,
//! through `allocate`, `let` and `seq`). Each nest is the chain of loops each of which is the
//! whole body of the one outside it; a loop is *spatial* when the buffers stored under it are
//! indexed by its variable, a *reduction* otherwise. Each nest gets these knobs, the choices a
//! hand schedule makes (TVM's `MultiLevelTiling` and `ParallelizeVectorizeUnroll` in small):
//!
//! | knob | values | steps |
//! |---|---|---|
//! | `tile` | `(ti, tj)`, 0 = none, for the two outer spatial loops of a nest of three or more | split both, reorder to `i_o, j_o, <the rest>, i_i, j_i` |
//! | `vector` | 0, 4, 8, 16, 32 | split the innermost spatial loop, vectorize the inner part |
//! | `unroll` | 0, 2, 4, 8 | split the innermost reduction loop, unroll the inner part |
//! | `parallel` | none, outermost, outer two fused | `parallel` (after `fuse`) |
//! | `leaves` | per innermost loop below the nest's chain (softmax's four column loops inside its row loop; a reduction innermost in the chain, as rowsum's): 0 or a width dividing its extent, 8-64 | a spatial loop: split, vectorize the inner part; a reduction into one element: split, `rfactor`, vectorize the lanes |
//! | `prefetch` | off, on; only where a vectorized spatial leaf re-reads a buffer an earlier leaf read ([`prefetch_leaf`]: softmax's `exp` loop) | [`Schedule::prefetch`] of that buffer in that leaf, for the next iteration of the chain's innermost loop |
//! | `flat` | off, on; only in a perfect nest of two or more spatial loops that index every buffer as adjacent whole dimensions, or not at all ([`Nest::flat`]: an elementwise operator on compact tensors) | `fuse` the whole nest into one loop first, which `vector` (up to 64 lanes) and `parallel` then split: a 64 x 48 `clip` is one loop of 3072 elements, two or four vectors a step, instead of rows of 48 |
//! | `regtile` | `[row, mr, nr, pack, fuse]` or none; only in a perfect nest of spatial loops outside reduction loops ([`regtile_values`]: a batched matmul, a convolution) | with `fuse`, first `fuse` the two innermost spatial loops ([`Nest::fusable`]: a 1 x 1 convolution's pixels); split the row loop by `mr` (where `mr` does not divide it, `partition` it at the last whole tile and give the rest a tile of its own) and the innermost spatial loop by `nr`, move the reductions inside their outer parts, `cache_write` the output inside them (an `mr x nr` tile in registers), unroll the rows, vectorize the columns; with `pack`, the column tiles outermost and the operand the columns read ([`Nest::vector_operand`]) copied per column tile into a contiguous panel (`cache_read`, transposed by [`Schedule::cache_read_transposed`] where needed). The knobs `tile`, `vector` and `leaves` are off with it |
//!
//! A choice becomes [`Step`]s by running the primitives on a [`Schedule`] (so the steps carry
//! the loop names the primitives chose); a choice the primitives refuse is not a candidate.
//! Whether a candidate computes the right thing is not decided here: every candidate is run
//! against the function's default build before it is timed ([`super::measure`]).

use serde::{Deserialize, Serialize};

use crate::ir::visit::{walk_stmt, Visitor};
use crate::ir::{Buffer, Expr, PrimFunc, Stmt, Var};
use crate::schedule::{Schedule, Step};

/// One loop of a nest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopInfo {
    /// Its name.
    pub name: String,
    /// Its constant extent, if it has one.
    pub extent: Option<i64>,
    /// No buffer stored under it is indexed by it.
    pub reduction: bool,
    /// The buffers its body loads, by name, each once, in order.
    pub loads: Vec<String>,
}

/// A top-level loop nest: the perfectly nested chain from its outermost loop down, and the
/// innermost loops below the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nest {
    /// Outermost first.
    pub loops: Vec<LoopInfo>,
    /// Whether the innermost loop of the chain holds no loop.
    pub perfect: bool,
    /// The innermost loops (holding no loop) inside the chain's body when it is not perfect,
    /// or the chain's innermost loop when it is a reduction; at most [`MAX_LEAVES`].
    pub leaves: Vec<LoopInfo>,
    /// The buffers stored in the nest, by name, each once, in order.
    pub stores: Vec<String>,
    /// In a perfect nest, the first buffer its body loads along the innermost spatial loop
    /// (in one of its dimensions, which is given; not a buffer it stores): the operand a
    /// register tile's columns read as vectors, which [`Knobs::regtile`] may pack.
    pub vector_operand: Option<VectorOperand>,
    /// In a perfect nest with three or more spatial loops: whether its two innermost spatial
    /// loops index every buffer of the body as two adjacent dimensions, the inner one over
    /// the whole of its dimension, or not at all (a 1 x 1 convolution's output rows and
    /// columns). Fused, they are one loop of pixels that the caches read as one dimension, so
    /// a register tile's columns need not divide a short row ([`Knobs::regtile`]'s `fuse`).
    pub fusable: bool,
    /// Two or more loops, all spatial, perfectly nested, with constant extents, each adjacent
    /// pair indexing every buffer of the body as two adjacent dimensions, the inner one whole,
    /// or not at all ([`Knobs::flat`]): the nest walks its buffers as one flat range, and
    /// fused into one loop it can be vectorized and split without a row's remainder.
    pub flat: bool,
}

impl Nest {
    /// How many of its loops, from the outermost, are spatial (before the first reduction).
    pub fn spatial(&self) -> usize {
        self.loops.iter().take_while(|l| !l.reduction).count()
    }
}

/// A buffer a nest's body reads along its innermost spatial loop ([`Nest::vector_operand`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VectorOperand {
    /// Its name.
    pub buffer: String,
    /// The dimension the innermost spatial loop indexes.
    pub dim: usize,
    /// Its number of dimensions.
    pub ndim: usize,
}

/// The most innermost loops of a nest that get a knob each.
pub const MAX_LEAVES: usize = 8;

/// The knobs of one nest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Knobs {
    /// Tile factors of the two outer spatial loops (0: no tiling).
    pub tile: [i64; 2],
    /// Vector width of the innermost spatial loop (0: none).
    pub vector: i64,
    /// Unroll factor of the innermost reduction loop (0: none).
    pub unroll: i64,
    /// 0: serial, 1: the outermost loop parallel, 2: the outer two fused and parallel.
    pub parallel: u8,
    /// Per leaf of the nest ([`Nest::leaves`]): 0, or the vector width (a spatial loop) or the
    /// number of lanes of an `rfactor` (a reduction).
    pub leaves: [i64; MAX_LEAVES],
    /// Prefetch, in the vectorized leaf of [`prefetch_leaf`], what it reads for the next
    /// iteration of the chain's innermost loop (absent in records written before it: off).
    #[serde(default)]
    pub prefetch: bool,
    /// A register tile `[row, mr, nr, pack, fuse]` ([`regtile_values`]): the nest's loop `row`
    /// (a spatial loop) split by `mr` and its innermost spatial loop by `nr` (`fuse` 1: the
    /// two innermost spatial loops fused first, [`Nest::fusable`], and the fused loop split),
    /// the reductions moved inside the two outer parts, the `mr x nr` tile of the output accumulated in registers
    /// (`cache_write`), its rows unrolled and its columns vectorized; `mr` 0: none (absent in
    /// records written before it). `pack` 1: the column tiles outside the row tiles, and the
    /// nest's [`Nest::vector_operand`] copied per column tile into a contiguous panel
    /// (`cache_read`, transposed where the buffer's last dimension is not the one the columns
    /// index), which every row tile then reads: BLAS's packing of `B`.
    #[serde(default)]
    pub regtile: [i64; 5],
    /// The whole nest fused into one loop first ([`Nest::flat`]), which the knobs `vector`
    /// and `parallel` then split (absent in records written before it: off).
    #[serde(default)]
    pub flat: bool,
}

/// The knobs of every nest of a function: one candidate.
pub type Choice = Vec<Knobs>;

/// Calls `f` with the buffer and indices of every store in `s`.
pub(crate) fn for_each_store(s: &Stmt, f: &mut dyn FnMut(&Buffer, &[Expr])) {
    struct V<'a>(&'a mut dyn FnMut(&Buffer, &[Expr]));
    impl Visitor for V<'_> {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::Store {
                buffer, indices, ..
            } = s
            {
                (self.0)(buffer, indices);
            }
            walk_stmt(self, s);
        }
        fn expr(&mut self, _: &Expr) {}
    }
    V(f).stmt(s);
}

/// The loop `for var in [.., extent) { body }` described.
pub(crate) fn loop_info(var: &Var, extent: &Expr, body: &Stmt) -> LoopInfo {
    let mut stores: Vec<Vec<Expr>> = Vec::new();
    for_each_store(body, &mut |_, ix| stores.push(ix.to_vec()));
    let reduction = !stores.is_empty() && !stores.iter().flatten().any(|e| e.mentions(var));
    struct Loads(Vec<String>);
    impl Visitor for Loads {
        fn load(&mut self, b: &Buffer) {
            if !self.0.contains(&b.name) {
                self.0.push(b.name.clone());
            }
        }
    }
    let mut loads = Loads(Vec::new());
    loads.stmt(body);
    LoopInfo {
        name: var.name.to_string(),
        extent: extent.as_int(),
        reduction,
        loads: loads.0,
    }
}

/// The leaf of `nest` that reads again a buffer an earlier leaf of the same iteration read
/// (softmax's `exp` loop: the max loop read the row first), and that buffer: the knob
/// [`Knobs::prefetch`] prefetches it there for the next iteration of the chain's innermost
/// loop ([`Schedule::prefetch`]), so that the earlier leaf finds it in the cache. `None` for a
/// perfect nest or when no spatial leaf re-reads a buffer.
pub fn prefetch_leaf(nest: &Nest) -> Option<(usize, String)> {
    if nest.perfect || nest.loops.is_empty() {
        return None;
    }
    nest.leaves.iter().enumerate().find_map(|(j, leaf)| {
        if leaf.reduction {
            return None;
        }
        leaf.loads
            .iter()
            .find(|b| nest.leaves[..j].iter().any(|l| l.loads.contains(b)))
            .map(|b| (j, b.clone()))
    })
}

fn has_loop(s: &Stmt) -> bool {
    let mut found = false;
    crate::ir::visit::for_each_loop(s, |_, _, _| found = true);
    found
}

/// The innermost loops under `s`.
fn leaves_in(s: &Stmt, out: &mut Vec<LoopInfo>) {
    match s {
        Stmt::For {
            var, extent, body, ..
        } => {
            if has_loop(body) {
                leaves_in(body, out)
            } else {
                out.push(loop_info(var, extent, body))
            }
        }
        Stmt::Allocate { body, .. } | Stmt::Let { body, .. } => leaves_in(body, out),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => {
            leaves_in(then_case, out);
            if let Some(e) = else_case {
                leaves_in(e, out);
            }
        }
        Stmt::Seq(v) => v.iter().for_each(|x| leaves_in(x, out)),
        _ => {}
    }
}

/// The nest starting at loop `s`; `None` when `s` is not a loop.
pub(crate) fn nest_of(s: &Stmt) -> Option<Nest> {
    let mut loops = Vec::new();
    let mut vars = Vec::new();
    let mut cur = s;
    while let Stmt::For {
        var, extent, body, ..
    } = cur
    {
        loops.push(loop_info(var, extent, body));
        vars.push(var);
        cur = body;
    }
    if loops.is_empty() {
        return None;
    }
    let perfect = !has_loop(cur);
    let mut stores: Vec<String> = Vec::new();
    for_each_store(s, &mut |b, _| {
        if !stores.contains(&b.name) {
            stores.push(b.name.clone());
        }
    });
    let spatial = loops.iter().take_while(|l| !l.reduction).count();
    let vector_operand = spatial
        .checked_sub(1)
        .filter(|_| perfect)
        .and_then(|col| vector_operand(cur, vars[col], &stores));
    let fusable = perfect
        && spatial >= 3
        && loops[spatial - 2].extent.is_some()
        && loops[spatial - 1]
            .extent
            .is_some_and(|eb| fusable_pair(cur, vars[spatial - 2], vars[spatial - 1], eb));
    let flat = perfect
        && loops.len() >= 2
        && spatial == loops.len()
        && loops.iter().all(|l| l.extent.is_some())
        && (1..loops.len()).all(|d| {
            loops[d]
                .extent
                .is_some_and(|eb| fusable_pair(cur, vars[d - 1], vars[d], eb))
        });
    let mut leaves = Vec::new();
    if perfect {
        leaves.extend(loops.last().filter(|l| l.reduction).cloned());
    } else {
        leaves_in(cur, &mut leaves);
        leaves.truncate(MAX_LEAVES);
    }
    Some(Nest {
        loops,
        perfect,
        leaves,
        stores,
        vector_operand,
        fusable,
        flat,
    })
}

/// Whether every access in `body` indexes with the loops `a` and `b` (extent `eb`) only as
/// `[.., a, b, ..]`, two adjacent dimensions the second of which has extent `eb`, or not at
/// all ([`Nest::fusable`]).
fn fusable_pair(body: &Stmt, a: &Var, b: &Var, eb: i64) -> bool {
    struct V<'a> {
        a: &'a Var,
        b: &'a Var,
        eb: i64,
        ok: bool,
    }
    impl V<'_> {
        fn check(&mut self, buffer: &Buffer, ix: &[Expr]) {
            let at =
                |v: &Var| -> Vec<usize> { (0..ix.len()).filter(|&d| ix[d].mentions(v)).collect() };
            let (pa, pb) = (at(self.a), at(self.b));
            if pa.is_empty() && pb.is_empty() {
                return;
            }
            let good = matches!((pa.as_slice(), pb.as_slice()), ([d], [e]) if *e == *d + 1
                && ix[*d] == Expr::Var(self.a.clone())
                && ix[*e] == Expr::Var(self.b.clone())
                && buffer.shape[*e].as_int() == Some(self.eb));
            self.ok &= good;
        }
    }
    impl Visitor for V<'_> {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::Store {
                buffer, indices, ..
            } = s
            {
                self.check(buffer, indices);
            }
            walk_stmt(self, s);
        }
        fn expr(&mut self, e: &Expr) {
            if let Expr::Load { buffer, indices } = e {
                self.check(buffer, indices);
            }
            crate::ir::visit::walk_expr(self, e);
        }
    }
    let mut v = V { a, b, eb, ok: true };
    v.stmt(body);
    v.ok
}

/// The first buffer `body` loads (and does not store: `stored`) with exactly one index
/// mentioning `col`, and that index's dimension.
fn vector_operand(body: &Stmt, col: &Var, stored: &[String]) -> Option<VectorOperand> {
    struct Loads<'a>(&'a Var, &'a [String], Option<VectorOperand>);
    impl Visitor for Loads<'_> {
        fn expr(&mut self, e: &Expr) {
            if let Expr::Load { buffer, indices } = e {
                let dims: Vec<usize> = (0..indices.len())
                    .filter(|&d| indices[d].mentions(self.0))
                    .collect();
                if self.2.is_none() && dims.len() == 1 && !self.1.contains(&buffer.name) {
                    self.2 = Some(VectorOperand {
                        buffer: buffer.name.clone(),
                        dim: dims[0],
                        ndim: indices.len(),
                    });
                }
            }
            crate::ir::visit::walk_expr(self, e);
        }
    }
    let mut v = Loads(col, stored, None);
    v.stmt(body);
    v.2
}

/// The loops from a top-level loop down to one whose body is a sequence ending in a loop (a
/// reduction's initialization beside its loop), when there is one.
fn imperfect_chain(s: &Stmt) -> Option<Vec<String>> {
    match s {
        Stmt::Allocate { body, .. } | Stmt::Let { body, .. } => imperfect_chain(body),
        Stmt::Seq(v) => v.iter().find_map(imperfect_chain),
        Stmt::For { .. } => {
            let mut names = Vec::new();
            let mut cur = s;
            loop {
                match cur {
                    Stmt::For { var, body, .. } => {
                        names.push(var.name.to_string());
                        cur = body;
                    }
                    Stmt::Seq(v) if v.len() >= 2 && matches!(v.last(), Some(Stmt::For { .. })) => {
                        return Some(names)
                    }
                    _ => return None,
                }
            }
        }
        _ => None,
    }
}

/// `f` with its loop nests made perfect: copies of a parameter into a buffer of its own
/// inlined ([`crate::schedule::inline_copies`]); TVM's reductions (`for k { if k == 0 { init };
/// update }`) decomposed ([`Schedule::decompose_reduction`]); then, where a reduction's
/// initialization sits beside the reduction's loop (`for i { for j { C = 0; for k { C += .. } } }`, the form kiln's builder
/// writes): `fission` from the inside out separates the initialization into a nest of its own,
/// as a hand schedule does first. Returns the function and the steps; `f` itself, with no steps,
/// when there is nothing to separate or a primitive refuses.
pub fn normalize(f: &PrimFunc) -> (PrimFunc, Vec<Step>) {
    // Copies of a parameter, unchanged, read in place.
    let (g, mut steps) =
        crate::schedule::inline_copies(f).unwrap_or_else(|| (f.clone(), Vec::new()));
    let mut s = Schedule::new(g);
    // TVM's reductions (the init guarded in the first iteration) to kiln's form, outermost
    // reduction loops first.
    for _ in 0..16 {
        let mut names = Vec::new();
        crate::ir::rewrite::loop_names(&s.func().body, &mut names);
        let Some((name, t)) = names.iter().find_map(|n| {
            let mut t = s.clone();
            t.decompose_reduction(n).ok().map(|_| (n.clone(), t))
        }) else {
            break;
        };
        s = t;
        steps.push(Step::DecomposeReduction { loop_: name });
    }
    // Innermost loops that both store along their index and reduce into one element (a
    // softmax's `B[i, j] = exp(..); sum += B[i, j]`) split into a loop of each, so that one is
    // vectorized and the other factored.
    for _ in 0..16 {
        let Some(name) = mixed_leaf(&s.func().body) else {
            break;
        };
        let mut t = s.clone();
        if t.fission(&name).is_err() {
            break;
        }
        s = t;
        steps.push(Step::Fission { loop_: name });
    }
    for _ in 0..8 {
        let Some(chain) = imperfect_chain(&s.func().body) else {
            break;
        };
        let mut trial = s.clone();
        let mut more = Vec::new();
        for name in chain.iter().rev() {
            if trial.fission(name).is_err() {
                return finish_or(f, s, steps);
            }
            more.push(Step::Fission {
                loop_: name.clone(),
            });
        }
        s = trial;
        steps.extend(more);
    }
    finish_or(f, s, steps)
}

/// `s` finished with its `steps`, or `f` itself with none if it does not verify.
fn finish_or(f: &PrimFunc, s: Schedule, steps: Vec<Step>) -> (PrimFunc, Vec<Step>) {
    match s.finish() {
        Ok(g) => (g, steps),
        Err(_) => (f.clone(), Vec::new()),
    }
}

/// The first innermost loop whose body is a sequence of stores, some indexed by the loop and
/// some not (a reduction beside an elementwise update).
fn mixed_leaf(s: &Stmt) -> Option<String> {
    match s {
        Stmt::For { var, body, .. } => {
            if let Stmt::Seq(v) = &**body {
                let kinds: Option<Vec<bool>> = v
                    .iter()
                    .map(|st| match st {
                        Stmt::Store { indices, .. } => {
                            Some(indices.iter().any(|e| e.mentions(var)))
                        }
                        _ => None,
                    })
                    .collect();
                if let Some(k) = kinds {
                    if k.len() >= 2 && k.contains(&true) && k.contains(&false) {
                        return Some(var.name.to_string());
                    }
                }
            }
            mixed_leaf(body)
        }
        Stmt::Allocate { body, .. } | Stmt::Let { body, .. } => mixed_leaf(body),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => mixed_leaf(then_case).or_else(|| else_case.as_deref().and_then(mixed_leaf)),
        Stmt::Seq(v) => v.iter().find_map(mixed_leaf),
        _ => None,
    }
}

/// The statements [`nests`] reads its nests from (the top-level loops), in the same order.
pub(crate) fn nest_stmts(f: &PrimFunc) -> Vec<&Stmt> {
    fn go<'s>(s: &'s Stmt, out: &mut Vec<&'s Stmt>) {
        match s {
            Stmt::For { .. } => out.push(s),
            Stmt::Allocate { body, .. } | Stmt::Let { body, .. } => go(body, out),
            Stmt::Seq(v) => v.iter().for_each(|x| go(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    go(&f.body, &mut out);
    out
}

/// The top-level loop nests of `f`.
pub fn nests(f: &PrimFunc) -> Vec<Nest> {
    nest_stmts(f).into_iter().filter_map(nest_of).collect()
}

/// The values each knob of `nest` may take (the first is always "off").
pub fn knob_values(nest: &Nest) -> (Vec<i64>, Vec<i64>, Vec<i64>, Vec<u8>) {
    let fits = |f: i64, e: Option<i64>| e.is_none_or(|e| f < e);
    let spatial: Vec<&LoopInfo> = nest.loops.iter().filter(|l| !l.reduction).collect();
    let tiles = if nest.loops.len() >= 3 && spatial.len() >= 2 {
        std::iter::once(0)
            .chain(
                [8, 16, 32, 64]
                    .into_iter()
                    .filter(|&t| fits(t, spatial[0].extent) && fits(t, spatial[1].extent)),
            )
            .collect()
    } else {
        vec![0]
    };
    let inner_spatial = nest.loops.last().filter(|l| !l.reduction && nest.perfect);
    let vectors = match inner_spatial {
        // A flat nest's widths are those of its fused loop, up to 64 (four AVX-512 vectors).
        Some(_) if nest.flat => std::iter::once(0)
            .chain(
                [4, 8, 16, 32, 64]
                    .into_iter()
                    .filter(|&v| fits(v - 1, flat_extent(nest))),
            )
            .collect(),
        Some(l) => std::iter::once(0)
            .chain(
                [4, 8, 16, 32]
                    .into_iter()
                    .filter(|&v| fits(v - 1, l.extent)),
            )
            .collect(),
        None if spatial.len() >= 2 && nest.perfect => vec![0, 8, 16],
        None => vec![0],
    };
    let unrolls = match nest.loops.iter().rev().find(|l| l.reduction) {
        Some(l) => std::iter::once(0)
            .chain([2, 4, 8].into_iter().filter(|&u| fits(u, l.extent)))
            .collect(),
        None => vec![0],
    };
    let parallel = match nest.loops.as_slice() {
        [a, b, ..] if !a.reduction && !b.reduction => vec![0, 1, 2],
        [a, ..] if !a.reduction => vec![0, 1],
        _ => vec![0],
    };
    (tiles, vectors, unrolls, parallel)
}

/// The iterations of a flat nest fused into one loop ([`Nest::flat`]).
fn flat_extent(nest: &Nest) -> Option<i64> {
    nest.loops
        .iter()
        .try_fold(1i64, |n, l| n.checked_mul(l.extent?))
}

/// The values the knob of each leaf of `nest` may take (the first is always "off"): widths
/// from 8 to 64 that divide the leaf's extent (a split that does not divide leaves a guard,
/// which neither `rfactor` nor a vector loop takes).
pub fn leaf_values(nest: &Nest) -> Vec<Vec<i64>> {
    nest.leaves
        .iter()
        .map(|l| {
            std::iter::once(0)
                .chain(
                    [8, 16, 32, 64]
                        .into_iter()
                        .filter(|&w| l.extent.is_some_and(|e| e > w && e % w == 0)),
                )
                .collect()
        })
        .collect()
}

/// The register tiles of a nest ([`regtile_values`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegTiles {
    /// The loops that may be the rows, as indices into [`Nest::loops`].
    pub rows: Vec<usize>,
    /// Per row loop, the `mr` values that divide it.
    pub mrs: Vec<Vec<i64>>,
    /// The `nr` values that divide the innermost spatial loop.
    pub nrs: Vec<i64>,
    /// The packings: 0 (the operands read in place), and 1 (the vector operand packed per
    /// column tile) where the nest has a [`Nest::vector_operand`].
    pub packs: Vec<i64>,
    /// Where the nest is [`Nest::fusable`]: the tiles with the two innermost spatial loops
    /// fused into the columns (`fuse` 1), whose `nrs` divide the fused loop.
    pub fused: Option<Box<RegTiles>>,
}

impl RegTiles {
    /// The tiles of one columns mode (`fuse` 0 or 1), if the nest has any.
    fn mode(&self, fuse: i64) -> Option<&RegTiles> {
        match fuse {
            0 => Some(self).filter(|r| !r.rows.is_empty() && !r.nrs.is_empty()),
            1 => self.fused.as_deref(),
            _ => None,
        }
    }
}

/// The register tiles a nest may take ([`Knobs::regtile`]): `None` where the nest has no such
/// knob. It has one where the nest is a perfect chain of constant spatial loops (two or more)
/// outside constant reduction loops (one or more) storing one buffer: a matmul, a batched
/// matmul, a convolution as TVM writes them. The columns are the innermost spatial loop (`nr`:
/// 8-48 lanes, or the whole loop up to 64, dividing it), or, in a [`Nest::fusable`] nest, the
/// two innermost fused (a 1 x 1 convolution's 56 x 56 pixels: 16 or 32 of 3136 rather than 8
/// or 56 of 56); the rows any other spatial loop (`mr`: 2-8, dividing it). Which row loop pays
/// is the operand it leaves alone: a convolution's output channels (each a broadcast of one
/// weight against the same input vector), a batched matmul's rows (a row of `A` against the
/// same panel of `B`). Splits that divide their loops leave no bounds guard in the tile.
pub fn regtile_values(nest: &Nest) -> Option<RegTiles> {
    let fused = fused_view(nest)
        .and_then(|v| plain_regtiles(&v))
        .map(Box::new);
    match plain_regtiles(nest) {
        Some(r) => Some(RegTiles { fused, ..r }),
        None => fused.map(|f| RegTiles {
            rows: Vec::new(),
            mrs: Vec::new(),
            nrs: Vec::new(),
            packs: Vec::new(),
            fused: Some(f),
        }),
    }
}

/// `nest` as it is once its two innermost spatial loops are fused (named `outer_inner`, as
/// [`Schedule::fuse`] names it), where it is [`Nest::fusable`].
fn fused_view(nest: &Nest) -> Option<Nest> {
    if !nest.fusable {
        return None;
    }
    let spatial = nest.spatial();
    let (a, b) = (&nest.loops[spatial - 2], &nest.loops[spatial - 1]);
    let extent = a.extent?.checked_mul(b.extent?)?;
    let mut loads = a.loads.clone();
    loads.extend(b.loads.iter().filter(|x| !a.loads.contains(x)).cloned());
    let fused = LoopInfo {
        name: format!("{}_{}", a.name, b.name),
        extent: Some(extent),
        reduction: false,
        loads,
    };
    let mut loops = nest.loops.clone();
    loops.splice(spatial - 2..spatial, [fused]);
    Some(Nest {
        loops,
        fusable: false,
        flat: false,
        ..nest.clone()
    })
}

/// The register tiles of `nest` with its columns as they are ([`regtile_values`]).
fn plain_regtiles(nest: &Nest) -> Option<RegTiles> {
    if !nest.perfect || nest.stores.len() != 1 || nest.loops.iter().any(|l| l.extent.is_none()) {
        return None;
    }
    let spatial = nest.spatial();
    let reductions = nest.loops.len() - spatial;
    if spatial < 2 || reductions == 0 || nest.loops[spatial..].iter().any(|l| !l.reduction) {
        return None;
    }
    let extent = |i: usize| nest.loops[i].extent.unwrap_or(0);
    let col = extent(spatial - 1);
    let mut nrs: Vec<i64> = [8, 16, 24, 32, 48]
        .into_iter()
        .filter(|&w| col >= w && col % w == 0)
        .collect();
    if col <= 64 && col % 4 == 0 && col > 4 && !nrs.contains(&col) {
        nrs.push(col);
    }
    let mut rows = Vec::new();
    let mut mrs = Vec::new();
    for i in 0..spatial - 1 {
        let e = extent(i);
        // An `mr` that does not divide the rows leaves their last `e % mr` to a tile of
        // their own ([`apply_regtile`]).
        let v: Vec<i64> = [2, 3, 4, 6, 8].into_iter().filter(|&m| e >= m).collect();
        if !v.is_empty() {
            rows.push(i);
            mrs.push(v);
        }
    }
    let packs = if nest.vector_operand.is_some() {
        vec![0, 1]
    } else {
        vec![0]
    };
    (!rows.is_empty() && !nrs.is_empty()).then_some(RegTiles {
        rows,
        mrs,
        nrs,
        packs,
        fused: None,
    })
}

/// Whether `t` is a register tile [`regtile_values`] allows for `nest` (`[_, 0, _, _, _]`:
/// none).
fn regtile_ok(nest: &Nest, t: [i64; 5]) -> bool {
    if t[1] == 0 {
        return true;
    }
    let Some(all) = regtile_values(nest) else {
        return false;
    };
    let Some(r) = all.mode(t[4]) else {
        return false;
    };
    r.rows
        .iter()
        .position(|&x| x as i64 == t[0])
        .is_some_and(|p| r.mrs[p].contains(&t[1]))
        && r.nrs.contains(&t[2])
        && r.packs.contains(&t[3])
}

/// A random register tile of `r` (of either columns mode, where the nest has both).
fn draw_regtile(r: &RegTiles, rng: &mut Rng) -> [i64; 5] {
    let fuse = match (r.mode(0), r.mode(1)) {
        (Some(_), Some(_)) => rng.below(2) as i64,
        (None, Some(_)) => 1,
        _ => 0,
    };
    let Some(m) = r.mode(fuse) else {
        return [0; 5];
    };
    let p = rng.below(m.rows.len());
    [
        m.rows[p] as i64,
        rng.pick(&m.mrs[p]),
        rng.pick(&m.nrs),
        rng.pick(&m.packs),
        fuse,
    ]
}

/// A random register tile of `nest` (none where it has no such knob or by chance).
fn random_regtile(nest: &Nest, rng: &mut Rng) -> [i64; 5] {
    match regtile_values(nest) {
        Some(r) if rng.below(2) == 0 => draw_regtile(&r, rng),
        _ => [0; 5],
    }
}

/// The steps of a register tile `[row, mr, nr, pack, fuse]` on `nest` ([`Knobs::regtile`]);
/// returns the nest's loops after it, outermost first.
fn apply_regtile(
    s: &mut Schedule,
    nest: &Nest,
    [row, mr, nr, pack, fuse]: [i64; 5],
    steps: &mut Vec<Step>,
) -> Result<Vec<String>, String> {
    let e = |x: crate::schedule::ScheduleError| x.to_string();
    if !regtile_ok(nest, [row, mr, nr, pack, fuse]) {
        return Err(format!(
            "no register tile {row}, {mr} x {nr}, packing {pack}, fusing {fuse} in this nest"
        ));
    }
    let view;
    let nest = if fuse == 1 {
        let spatial = nest.spatial();
        let (a, b) = (&nest.loops[spatial - 2].name, &nest.loops[spatial - 1].name);
        let name = s.fuse(a, b).map_err(e)?;
        steps.push(Step::Fuse {
            outer: a.clone(),
            inner: b.clone(),
        });
        let mut v = fused_view(nest).ok_or("the nest's columns do not fuse")?;
        v.loops[spatial - 2].name = name;
        view = v;
        &view
    } else {
        nest
    };
    let names: Vec<String> = nest.loops.iter().map(|l| l.name.clone()).collect();
    let row = row as usize;
    let rows = nest.loops[row].extent.unwrap_or(0);
    let rem = rows % mr;
    if rem == 0 {
        return tile_part(s, nest, &names, row, (mr, nr, pack), Part::Whole, steps);
    }
    // The rows `mr` does not divide: the loop partitioned at the last whole tile, the first
    // part tiled `mr x nr`, the rest (`rem` rows) a `rem x nr` tile of its own, which reads
    // its operands in place.
    let at = rows - rem;
    let map = s.partition(&names[row], at).map_err(e)?;
    steps.push(Step::Partition {
        loop_: names[row].clone(),
        at,
    });
    let order = tile_part(s, nest, &names, row, (mr, nr, pack), Part::First, steps)?;
    let rest: Vec<String> = names
        .iter()
        .map(|n| map.get(n).cloned().unwrap_or_else(|| n.clone()))
        .collect();
    tile_part(s, nest, &rest, row, (rem, nr, 0), Part::Rest, steps)?;
    Ok(order)
}

/// Which rows of a nest [`tile_part`] tiles.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    /// All of them (`mr` divides them).
    Whole,
    /// The whole tiles of a row loop partitioned at the last one.
    First,
    /// The rows after them: fewer than `mr`, one tile.
    Rest,
}

/// The steps of an `mr x nr` register tile ([`apply_regtile`]), packed or not (`pack`), on
/// the loops `names` of `nest` (of one part of it, after a partition of the row loop);
/// returns the nest's loops after it, outermost first. In a partitioned nest the loops
/// outside the rows keep their place (their body is the two parts).
fn tile_part(
    s: &mut Schedule,
    nest: &Nest,
    names: &[String],
    row: usize,
    (mr, nr, pack): (i64, i64, i64),
    part: Part,
    steps: &mut Vec<Step>,
) -> Result<Vec<String>, String> {
    let e = |x: crate::schedule::ScheduleError| x.to_string();
    let spatial = nest.spatial();
    let col = spatial - 1;
    // The rest's loop is the tile's rows, not split.
    let (ro, ri) = if part == Part::Rest {
        (None, names[row].clone())
    } else {
        let (ro, ri) = s.split(&names[row], mr).map_err(e)?;
        steps.push(Step::Split {
            loop_: names[row].clone(),
            factor: mr,
        });
        (Some(ro), ri)
    };
    let (co, ci) = s.split(&names[col], nr).map_err(e)?;
    steps.push(Step::Split {
        loop_: names[col].clone(),
        factor: nr,
    });
    let packed = nest.vector_operand.as_ref().filter(|_| pack == 1);
    // The loops outside the rows move inside them only in a nest not partitioned.
    let first = if part == Part::Whole { 0 } else { row + 1 };
    let mut order: Vec<String> = (first..spatial - 1)
        .filter(|&i| i != row)
        .map(|i| names[i].clone())
        .collect();
    // Packed, a column tile's panel is copied once and read by every row tile inside it.
    if packed.is_some() {
        order.push(co.clone());
        order.extend(ro.clone());
    } else {
        order.extend(ro.clone());
        order.push(co.clone());
    }
    order.extend(names[spatial..].iter().cloned());
    order.push(ri.clone());
    order.push(ci.clone());
    let refs: Vec<&str> = order.iter().map(String::as_str).collect();
    s.reorder(&refs).map_err(e)?;
    steps.push(Step::Reorder {
        loops: order.clone(),
    });
    // The accumulators live over the reductions, inside the second of the two tile loops.
    let acc_at = match &ro {
        Some(ro) if packed.is_some() => ro,
        _ => &co,
    };
    let c = &nest.stores[0];
    s.cache_write(c, acc_at).map_err(e)?;
    steps.push(Step::CacheWrite {
        buffer: c.clone(),
        at: acc_at.clone(),
    });
    if let Some(v) = packed {
        let innermost = (v.dim + 1 != v.ndim).then_some(v.dim);
        match innermost {
            Some(d) => s.cache_read_transposed(&v.buffer, &co, d).map_err(e)?,
            None => s.cache_read(&v.buffer, &co).map_err(e)?,
        };
        steps.push(Step::CacheRead {
            buffer: v.buffer.clone(),
            at: co.clone(),
            panel: None,
            innermost,
        });
    }
    s.unroll(&ri).map_err(e)?;
    steps.push(Step::Kind {
        loop_: ri,
        kind: "unrolled".into(),
    });
    s.vectorize(&ci).map_err(e)?;
    steps.push(Step::Kind {
        loop_: ci,
        kind: "vectorized".into(),
    });
    // In a partitioned nest, the loops outside the rows stay outermost.
    let outside = if part == Part::Whole { 0 } else { row };
    let mut out: Vec<String> = names[..outside].to_vec();
    out.extend(order);
    Ok(out)
}

/// Applies `k` to the nest `nest` of the schedule `s`, appending the steps to `steps`.
fn apply_nest(
    s: &mut Schedule,
    nest: &Nest,
    k: &Knobs,
    steps: &mut Vec<Step>,
) -> Result<(), String> {
    let e = |x: crate::schedule::ScheduleError| x.to_string();
    let names: Vec<String> = nest.loops.iter().map(|l| l.name.clone()).collect();
    let spatial: Vec<usize> = (0..names.len())
        .filter(|&i| !nest.loops[i].reduction)
        .collect();
    // The loop that is currently outermost, and the innermost spatial loop, after tiling.
    let mut outer = names[0].clone();
    let mut second: Option<String> = names.get(1).cloned();
    let mut inner_spatial = spatial.last().map(|&i| names[i].clone());
    let innermost_is_spatial = !nest.loops[names.len() - 1].reduction;
    if k.flat {
        if !nest.flat || k.tile != [0, 0] || k.regtile[1] > 0 {
            return Err("a flat nest goes with no tiling, in a nest that can be flat".into());
        }
        let mut fused = names[0].clone();
        for n in &names[1..] {
            let next = s.fuse(&fused, n).map_err(e)?;
            steps.push(Step::Fuse {
                outer: fused,
                inner: n.clone(),
            });
            fused = next;
        }
        outer = fused.clone();
        second = None;
        inner_spatial = Some(fused);
    }
    if k.regtile[1] > 0 {
        if k.tile != [0, 0] || k.vector > 0 || k.leaves.iter().any(|&w| w > 0) {
            return Err("a register tile goes with no other tiling or vector knob".into());
        }
        let order = apply_regtile(s, nest, k.regtile, steps)?;
        outer = order[0].clone();
        second = order.get(1).cloned();
    }
    if k.tile[0] > 0 && k.tile[1] > 0 && spatial.len() >= 2 && spatial[0] == 0 && spatial[1] == 1 {
        let (io, ii) = s.split(&names[0], k.tile[0]).map_err(e)?;
        steps.push(Step::Split {
            loop_: names[0].clone(),
            factor: k.tile[0],
        });
        let (jo, ji) = s.split(&names[1], k.tile[1]).map_err(e)?;
        steps.push(Step::Split {
            loop_: names[1].clone(),
            factor: k.tile[1],
        });
        let mut order = vec![io.clone(), jo.clone()];
        order.extend(names[2..].iter().cloned());
        order.push(ii.clone());
        order.push(ji.clone());
        let refs: Vec<&str> = order.iter().map(String::as_str).collect();
        s.reorder(&refs).map_err(e)?;
        steps.push(Step::Reorder { loops: order });
        outer = io;
        second = Some(jo);
        inner_spatial = Some(ji);
    } else if k.tile != [0, 0] {
        return Err("tiling needs two outer spatial loops".into());
    }
    let tiled = k.tile[0] > 0;
    if k.vector > 0 {
        // The innermost spatial loop, when it is innermost (or was made so by tiling).
        let Some(v) = inner_spatial
            .clone()
            .filter(|_| tiled || innermost_is_spatial)
        else {
            return Err("no innermost spatial loop to vectorize".into());
        };
        let (vo, vi) = s.split(&v, k.vector).map_err(e)?;
        steps.push(Step::Split {
            loop_: v.clone(),
            factor: k.vector,
        });
        // The loop split may be the one `parallel` takes (a nest of one loop, a flat nest, the
        // second of two): it now goes by its outer part's name.
        if outer == v {
            outer = vo.clone();
        }
        if second.as_ref() == Some(&v) {
            second = Some(vo.clone());
        }
        s.vectorize(&vi).map_err(e)?;
        steps.push(Step::Kind {
            loop_: vi,
            kind: "vectorized".into(),
        });
    }
    let prefetch = prefetch_leaf(nest).filter(|_| k.prefetch);
    for (j, (leaf, &w)) in nest.leaves.iter().zip(&k.leaves).enumerate() {
        if w <= 0 {
            continue;
        }
        let (o, i) = s.split(&leaf.name, w).map_err(e)?;
        steps.push(Step::Split {
            loop_: leaf.name.clone(),
            factor: w,
        });
        if leaf.reduction {
            s.rfactor(&o, &i).map_err(e)?;
            steps.push(Step::Rfactor {
                outer: o.clone(),
                inner: i.clone(),
            });
        }
        s.vectorize(&i).map_err(e)?;
        steps.push(Step::Kind {
            loop_: i,
            kind: "vectorized".into(),
        });
        if let Some((_, buffer)) = prefetch.as_ref().filter(|(pj, _)| *pj == j) {
            let row = &nest.loops[nest.loops.len() - 1].name;
            s.prefetch(&o, buffer, row, 1).map_err(e)?;
            steps.push(Step::Prefetch {
                at: o.clone(),
                buffer: buffer.clone(),
                loop_: row.clone(),
                offset: 1,
            });
        }
    }
    if k.unroll > 0 {
        let Some(r) = nest.loops.iter().rev().find(|l| l.reduction) else {
            return Err("no reduction loop to unroll".into());
        };
        if nest
            .leaves
            .iter()
            .zip(&k.leaves)
            .any(|(l, &w)| w > 0 && l.name == r.name)
        {
            return Err("the reduction loop is factored already".into());
        }
        let (_ro, ri) = s.split(&r.name, k.unroll).map_err(e)?;
        steps.push(Step::Split {
            loop_: r.name.clone(),
            factor: k.unroll,
        });
        s.unroll(&ri).map_err(e)?;
        steps.push(Step::Kind {
            loop_: ri,
            kind: "unrolled".into(),
        });
    }
    match k.parallel {
        0 => {}
        1 => {
            s.parallel(&outer).map_err(e)?;
            steps.push(Step::Kind {
                loop_: outer,
                kind: "parallel".into(),
            });
        }
        _ => {
            let Some(second) = second else {
                return Err("no second loop to fuse".into());
            };
            let fused = s.fuse(&outer, &second).map_err(e)?;
            steps.push(Step::Fuse {
                outer,
                inner: second,
            });
            s.parallel(&fused).map_err(e)?;
            steps.push(Step::Kind {
                loop_: fused,
                kind: "parallel".into(),
            });
        }
    }
    Ok(())
}

/// The steps of `choice` for `f`, or why the primitives refuse it.
pub fn steps_for(f: &PrimFunc, nests: &[Nest], choice: &Choice) -> Result<Vec<Step>, String> {
    let mut s = Schedule::new(f.clone());
    let mut steps = Vec::new();
    for (n, k) in nests.iter().zip(choice) {
        apply_nest(&mut s, n, k, &mut steps)?;
    }
    s.finish().map_err(|e| e.to_string())?;
    Ok(steps)
}

/// A small deterministic generator (splitmix64), so that a seed gives the same search.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// An index below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// One of `v` (non-empty).
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())]
    }
}

/// A random choice of every knob.
pub fn random_choice(nests: &[Nest], rng: &mut Rng) -> Choice {
    nests
        .iter()
        .map(|n| {
            let (t, v, u, p) = knob_values(n);
            let mut leaves = [0; MAX_LEAVES];
            for (x, vals) in leaves.iter_mut().zip(leaf_values(n)) {
                *x = rng.pick(&vals);
            }
            let mut k = Knobs {
                tile: [rng.pick(&t), rng.pick(&t)],
                vector: rng.pick(&v),
                unroll: rng.pick(&u),
                parallel: rng.pick(&p),
                leaves,
                prefetch: false,
                regtile: [0; 5],
                flat: false,
            };
            // Drawn only where the knob exists, so other functions' searches are unchanged.
            if prefetch_leaf(n).is_some() {
                k.prefetch = rng.below(2) == 0;
            }
            if regtile_values(n).is_some() {
                k.regtile = random_regtile(n, rng);
            }
            if n.flat {
                k.flat = rng.below(2) == 0;
            }
            sanitize(n, &mut k, rng.below(2) == 0);
            k
        })
        .collect()
}

/// `k` without the combinations the primitives always refuse: one tile factor without the
/// other; a vector width for the inner spatial loop that tiling did not bring innermost; in a
/// perfect nest, a factored innermost reduction (a leaf) together with tiling or with its
/// unrolling (the leaf wins when `prefer_leaf`, else the other knob).
fn sanitize(nest: &Nest, k: &mut Knobs, prefer_leaf: bool) {
    if !regtile_ok(nest, k.regtile) {
        k.regtile = [0; 5];
    }
    k.flat &= nest.flat;
    if k.flat {
        // The fused loop is the nest's only loop: no tiles, nothing second to fuse.
        k.tile = [0, 0];
        k.parallel = k.parallel.min(1);
    } else if nest.flat && k.tile == [0, 0] {
        // A width past the innermost loop's extent is for the fused loop only.
        if nest
            .loops
            .last()
            .and_then(|l| l.extent)
            .is_some_and(|e| k.vector > e)
        {
            k.vector = 0;
        }
    }
    if k.regtile[1] > 0 {
        // The register tile is the nest's tiling and vectorization.
        k.tile = [0, 0];
        k.vector = 0;
        k.leaves = [0; MAX_LEAVES];
        k.prefetch = false;
        // Packed, with the tile's rows and columns the nest's only spatial loops, the
        // outermost loop (the column tiles) holds the panel's copy beside the row tiles: no
        // second loop to fuse with it for the parallel loop.
        let spatial = nest.spatial() - usize::from(k.regtile[4] == 1);
        // Nor in a nest whose rows the tile partitions (the loop outside them holds the two
        // parts).
        let rows = nest.loops[k.regtile[0] as usize].extent.unwrap_or(0);
        let partitioned = rows % k.regtile[1] != 0;
        if ((k.regtile[3] == 1 && spatial == 2) || partitioned) && k.parallel == 2 {
            k.parallel = 1;
        }
        return;
    }
    if (k.tile[0] == 0) != (k.tile[1] == 0) {
        k.tile = [0, 0];
    }
    let innermost_spatial = nest.perfect && nest.loops.last().is_some_and(|l| !l.reduction);
    if k.tile == [0, 0] && !innermost_spatial {
        k.vector = 0;
    }
    // A prefetch only where the knob exists, in a vectorized leaf (a scalar loop would issue
    // one per element).
    if k.prefetch && prefetch_leaf(nest).is_none_or(|(j, _)| k.leaves[j] <= 0) {
        k.prefetch = false;
    }
    if nest.perfect && k.leaves.iter().any(|&w| w > 0) && (k.tile != [0, 0] || k.unroll > 0) {
        if prefer_leaf {
            k.tile = [0, 0];
            k.vector = if innermost_spatial { k.vector } else { 0 };
            k.unroll = 0;
        } else {
            k.leaves = [0; MAX_LEAVES];
        }
    }
}

/// `c` with one knob of one nest changed.
pub fn mutate(nests: &[Nest], c: &Choice, rng: &mut Rng) -> Choice {
    let mut out = c.clone();
    if nests.is_empty() {
        return out;
    }
    let i = rng.below(nests.len());
    let (t, v, u, p) = knob_values(&nests[i]);
    let lv = leaf_values(&nests[i]);
    let k = &mut out[i];
    let leaf_knobs = 5 + usize::from(!lv.is_empty()) * 2;
    let has_prefetch = prefetch_leaf(&nests[i]).is_some();
    let regtile = regtile_values(&nests[i]);
    // The register tile's parts (row loop, mr, nr, packing, and the columns mode where the
    // nest has two) come last, where the knob exists, so that other functions' searches are
    // unchanged.
    let first_regtile = leaf_knobs + usize::from(has_prefetch);
    // Four parts of a register tile, and its columns mode where the nest has two.
    let parts = match &regtile {
        Some(r) if r.mode(0).is_some() && r.mode(1).is_some() => 5,
        Some(_) => 4,
        None => 0,
    };
    // The flat knob last, where it exists.
    let flat_knob = first_regtile + parts;
    let which = rng.below(flat_knob + usize::from(nests[i].flat));
    // A knob the register tile replaces, changed, turns the register tile off.
    if which < 3 || (5..first_regtile).contains(&which) {
        k.regtile = [0; 5];
    }
    match which {
        0 => k.tile[0] = rng.pick(&t),
        1 => k.tile[1] = rng.pick(&t),
        2 => k.vector = rng.pick(&v),
        3 => k.unroll = rng.pick(&u),
        4 => k.parallel = rng.pick(&p),
        w if w == flat_knob => k.flat = !k.flat,
        w if w >= first_regtile => {
            if let Some(r) = &regtile {
                k.regtile = mutate_regtile(k.regtile, r, w - first_regtile, rng);
            }
        }
        w if w == leaf_knobs && has_prefetch => k.prefetch = !k.prefetch,
        _ => {
            let j = rng.below(lv.len());
            k.leaves[j] = rng.pick(&lv[j]);
        }
    }
    // The knob just changed wins over those it cannot go with.
    sanitize(&nests[i], k, which >= 5);
    out
}

/// The register tile `t` with its part `part` (0: the row loop, 1: `mr` or none, 2: `nr`, 3:
/// the packing, 4: the columns mode, fused or not) changed; a tile that is off is drawn whole.
fn mutate_regtile(t: [i64; 5], all: &RegTiles, part: usize, rng: &mut Rng) -> [i64; 5] {
    let Some(r) = all.mode(t[4]).filter(|_| t[1] > 0) else {
        return draw_regtile(all, rng);
    };
    let (rows, mrs, nrs) = (&r.rows, &r.mrs, &r.nrs);
    let Some(p) = rows.iter().position(|&x| x as i64 == t[0]) else {
        return draw_regtile(all, rng);
    };
    // The value of `v` nearest `x`.
    let nearest = |v: &[i64], x: i64| v.iter().copied().min_by_key(|&m| (m - x).abs());
    match part {
        0 => {
            // Another row loop, with the `mr` nearest the current one it allows.
            let q = rng.below(rows.len());
            let mr = nearest(&mrs[q], t[1]).unwrap_or(mrs[q][0]);
            [rows[q] as i64, mr, t[2], t[3], t[4]]
        }
        1 => {
            let m = rng.below(mrs[p].len() + 1);
            match mrs[p].get(m) {
                Some(&mr) => [t[0], mr, t[2], t[3], t[4]],
                None => [0; 5],
            }
        }
        2 => [t[0], t[1], rng.pick(nrs), t[3], t[4]],
        3 => [t[0], t[1], t[2], rng.pick(&r.packs), t[4]],
        _ => {
            // The other columns mode, as near this tile as it allows.
            let fuse = 1 - t[4];
            let Some(o) = all.mode(fuse) else {
                return t;
            };
            let q = o
                .rows
                .iter()
                .position(|&x| x as i64 == t[0])
                .unwrap_or_else(|| rng.below(o.rows.len()));
            let mr = nearest(&o.mrs[q], t[1]).unwrap_or(o.mrs[q][0]);
            let nr = nearest(&o.nrs, t[2]).unwrap_or(o.nrs[0]);
            let pack = if o.packs.contains(&t[3]) { t[3] } else { 0 };
            [o.rows[q] as i64, mr, nr, pack, fuse]
        }
    }
}

/// Starting points with register tiles ([`Knobs::regtile`]), on the choice `usual`: for each
/// row loop, the two tiles with the most accumulators that leave a quarter of the 16 (AVX2)
/// or 32 (AVX-512) vector registers free for the operands (`mr x nr / lanes` at most 12 or 24:
/// AVX2's 6 x 16 matmul tile), the fewer loads per multiply-add first, and the first of them
/// with its vector operand packed.
fn regtile_seeds(nests: &[Nest], usual: &Choice, lanes: i64) -> Vec<Choice> {
    let lanes = lanes.max(1);
    let most = if lanes >= 16 { 24 } else { 12 };
    // Per nest, the ranked tiles of each row loop.
    // Per nest, the ranked tiles of each row loop (of each columns mode: as written, then
    // fused).
    let ranked: Vec<Vec<Vec<[i64; 5]>>> = nests
        .iter()
        .map(|n| {
            let Some(all) = regtile_values(n) else {
                return Vec::new();
            };
            let mut out = Vec::new();
            for fuse in [0, 1] {
                let Some(r) = all.mode(fuse) else {
                    continue;
                };
                for (&row, ms) in r.rows.iter().zip(&r.mrs) {
                    let mut v: Vec<[i64; 5]> = ms
                        .iter()
                        .flat_map(|&m| r.nrs.iter().map(move |&w| [row as i64, m, w, 0, fuse]))
                        .filter(|t| t[1] * ((t[2] + lanes - 1) / lanes) <= most)
                        .collect();
                    // Most accumulators first, then fewest loads and broadcasts per step.
                    v.sort_by_key(|t| {
                        let vecs = (t[2] + lanes - 1) / lanes;
                        (-(t[1] * vecs), t[1] + vecs)
                    });
                    v.truncate(2);
                    // And the first packed, where the nest has an operand to pack.
                    if let Some(&[r0, m, w, _, f]) = v.first().filter(|_| r.packs.contains(&1)) {
                        v.push([r0, m, w, 1, f]);
                    }
                    if !v.is_empty() {
                        out.push(v);
                    }
                }
            }
            out
        })
        .collect();
    let most_rows = ranked.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::new();
    for r in 0..most_rows {
        for which in 0..3 {
            let mut c = usual.clone();
            let mut any = false;
            for ((n, k), tiles) in nests.iter().zip(c.iter_mut()).zip(&ranked) {
                let Some(row) = tiles.get(r.min(tiles.len().saturating_sub(1))) else {
                    continue;
                };
                if let Some(t) = row.get(which) {
                    k.regtile = *t;
                    sanitize(n, k, true);
                    any = true;
                }
            }
            if any && !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// The hand-written starting points: the default (nothing), the usual first schedule
/// (outermost loop parallel, innermost spatial loop vectorized by 8 or 16, and each leaf at
/// the allowed width nearest 16 for a spatial loop, 64 for a reduction: kiln's AVX-512
/// softmax), on it register tiles ([`Knobs::regtile`]: for each row loop, the two that fill
/// three quarters of the vector registers, and the first packed), and leaves four vectors wide
/// with reductions in four or eight (kiln's AVX2 softmax), for vectors of `lanes` elements
/// (8: AVX2's 32 bytes of `float32`; 16: AVX-512's).
pub fn seeds_for_lanes(nests: &[Nest], lanes: i64) -> Vec<Choice> {
    let none: Choice = nests.iter().map(|_| Knobs::default()).collect();
    let mut out = vec![none];
    for width in [8, 16] {
        out.push(usual_seed(nests, width, width, 64));
    }
    out.extend(regtile_seeds(nests, &out[out.len() - 1], lanes));
    // Leaves four vectors wide (AVX2's softmax: its `exp` in 32 lanes, as four chains of the
    // polynomial in flight), the reductions in four vectors or eight (at most 64 lanes): the
    // first schedule's widths are for AVX-512's registers.
    let wide = 4 * lanes.max(1);
    for reduction in [wide, (2 * wide).min(64)] {
        let c = usual_seed(nests, 16, wide, reduction);
        if !out.contains(&c) {
            out.push(c);
        }
    }
    // Flat nests (an elementwise operator) fused into one loop, two and four vectors a step,
    // serial (a small operator: a thread pool's wake-up costs more than its work) and the first
    // in parallel.
    if nests.iter().any(|n| n.flat) {
        for (vectors, parallel) in [(2, 0), (4, 0), (2, 1)] {
            let c: Choice = nests
                .iter()
                .map(|n| {
                    let mut k = Knobs::default();
                    if n.flat {
                        let (_, v, _, _) = knob_values(n);
                        k.flat = true;
                        k.vector = if v.contains(&(vectors * lanes)) {
                            vectors * lanes
                        } else {
                            0
                        };
                        k.parallel = parallel;
                    }
                    k
                })
                .collect();
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// The usual first schedule: outermost loop parallel, innermost spatial loop vectorized by
/// `vector`, each spatial leaf at the allowed width nearest `leaf`, each reduction leaf nearest
/// `reduction`, and the re-read buffer prefetched for the next row (kiln's softmax).
fn usual_seed(nests: &[Nest], vector: i64, leaf: i64, reduction: i64) -> Choice {
    nests
        .iter()
        .map(|n| {
            let (_, v, _, p) = knob_values(n);
            let mut leaves = [0; MAX_LEAVES];
            for ((x, vals), l) in leaves.iter_mut().zip(leaf_values(n)).zip(&n.leaves) {
                let want = if l.reduction { reduction } else { leaf };
                *x = vals
                    .iter()
                    .copied()
                    .min_by_key(|&w| (w - want).abs())
                    .unwrap_or(0);
            }
            let mut k = Knobs {
                vector: if v.contains(&vector) { vector } else { 0 },
                parallel: if p.contains(&1) { 1 } else { 0 },
                leaves,
                prefetch: true,
                ..Knobs::default()
            };
            sanitize(n, &mut k, true);
            k
        })
        .collect()
}

/// [`seeds_for_lanes`] for AVX2's vectors: 8 lanes of `float32`.
pub fn seeds(nests: &[Nest]) -> Vec<Choice> {
    seeds_for_lanes(nests, 8)
}
