//! The search space of a device target (`opencl`, `cuda`): how each loop nest becomes a kernel.
//!
//! A CPU schedule chooses tiles, vector widths and parallel loops; a device schedule chooses
//! which loops become the blocks and threads of a kernel, how many threads a block has, how
//! much work a thread does, and what a block stages in shared memory. Each top-level loop nest
//! of the function (after [`super::space::normalize`]) gets one *mode* and its parameters:
//!
//! | mode | for | steps |
//! |---|---|---|
//! | default | every nest | left to [`bind_default`] (TVM's `DefaultGPUSchedule`): the independent loops fused, 256 threads a block |
//! | flat | a nest whose outer loops are independent | those loops fused, split into blocks of `threads` (32-1024) threads, each thread `coarsen` (1-8) elements `threads` apart (coalesced), the inner reduction unrolled by 0-8 |
//! | 2-D | two or more independent outer loops | the last two split by `ty` and `tx`, bound to `threadIdx.y/x` and `blockIdx.y/x` (the ones outside fused into `blockIdx.z`); each thread a 1 x 1, 2 x 2 or 4 x 4 tile of outputs kept in registers over the reduction (`cache_write`); the reduction loop inside split by `kt` and every buffer it reads staged in shared memory a `kt` slice at a time (`cache_read_shared`), or not staged |
//! | rows | a row loop whose body is innermost loops of one extent (softmax's four column loops; rowsum's reduction) | a block per row, `threads` threads (a power of two dividing the extent) sharing each column loop: a reduction becomes a `block_reduce` (a tree in shared memory), a spatial loop is bound to `threadIdx.x` |
//!
//! What rows mode may do is decided before it is offered, from the loops alone, because a
//! race between the threads of a block need not show in one checking run: every buffer a
//! column loop writes is accessed only in column loops, indexed by their own loop variable in
//! one dimension (so each thread reads back only what it wrote: all loops split alike); a
//! reduction's target is a `local` the row allocates (one per thread: every thread gets the
//! result) or touched nowhere else in the row; the statements between the column loops write
//! only such `local` buffers (every thread runs them alike). A `local` the host allocates is one
//! copy for the whole block.
//!
//! Loops whose iterations are independent are found as [`crate::schedule::auto`] finds them
//! for `parallel` loops. Kernels kiln has a hand schedule for come first, as for the CPU:
//! the matmul's shared-memory tiling ([`crate::schedule::kernels::gpu_matmul_on`]) in the
//! tile and `k`-step sizes that divide its shape ([`device_templates`]).

use std::collections::HashMap;

use super::space::{self, LoopInfo, Nest, Rng};
use super::templates::match_matmul;
use crate::ir::visit::{walk_expr, walk_stmt, Visitor};
use crate::ir::{Expr, PrimFunc, Stmt, StorageScope, VarId};
use crate::schedule::auto::{bind_default, independent_chain};
use crate::schedule::{Schedule, ScheduleError, Step};
use crate::target::Target;

/// The mode of one nest (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Left to the default device schedule.
    #[default]
    Default,
    /// Independent loops fused into blocks of threads.
    Flat,
    /// Two independent loops as a 2-D block of threads.
    TwoD,
    /// A block per row.
    Rows,
}

/// The knobs of one nest on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DeviceKnobs {
    /// The mode.
    pub mode: Mode,
    /// Threads per block (flat, rows).
    pub threads: i64,
    /// Elements per thread (flat).
    pub coarsen: i64,
    /// Threads per block along the two loops (2-D): `[ty, tx]`.
    pub block: [i64; 2],
    /// The `k` slice staged in shared memory (2-D; 0: none).
    pub stage: i64,
    /// The side of each thread's register tile of outputs (2-D; 0 or 1: one output a thread).
    pub reg: i64,
    /// Unroll factor of the innermost reduction loop in a thread (flat, 2-D; 0: none).
    pub unroll: i64,
}

/// The knobs of every nest: one candidate.
pub type DeviceChoice = Vec<DeviceKnobs>;

/// One nest and what may be done with it.
#[derive(Clone, Debug)]
pub struct DeviceNest {
    /// The loops.
    pub nest: Nest,
    /// How many of its outermost loops are independent (a perfect chain).
    pub independent: usize,
    /// The innermost loops of the row (below the independent loops) when rows mode is safe,
    /// with their common extent.
    pub rows: Option<(Vec<LoopInfo>, i64)>,
    /// The buffers its innermost reduction loop reads and nothing in the nest writes (the
    /// ones 2-D mode stages).
    pub reads: Vec<String>,
    /// The one buffer the nest writes, when it writes one (what a register tile caches).
    pub output: Option<String>,
}

/// The search space of a function on a device target.
#[derive(Clone, Debug)]
pub struct DeviceSpace {
    /// The function, normalized ([`space::normalize`]).
    pub func: PrimFunc,
    /// Its nests.
    pub nests: Vec<DeviceNest>,
    /// Threads per block at most.
    pub max_threads: i64,
}

const THREADS: [i64; 6] = [32, 64, 128, 256, 512, 1024];

impl DeviceSpace {
    /// The space of `func` (normalized) for a device of at most `max_threads` threads per
    /// block.
    pub fn new(func: &PrimFunc, max_threads: i64) -> Self {
        let mut nests = Vec::new();
        for s in space::nest_stmts(func) {
            let Some(nest) = space::nest_of(s) else {
                continue;
            };
            let chain = independent_chain(s);
            let independent = chain.len();
            let below = chain_body(s, independent);
            let rows = (independent > 0)
                .then(|| below.and_then(row_leaves))
                .flatten()
                .filter(|(leaves, _)| leaves.iter().all(|l| nest_leaf_named(&nest, l)));
            let reads = below.map(reads_of_reduction).unwrap_or_default();
            let mut written: Vec<String> = Vec::new();
            space::for_each_store(s, &mut |b, _| {
                if !written.contains(&b.name) {
                    written.push(b.name.clone())
                }
            });
            let output = (written.len() == 1).then(|| written.remove(0));
            nests.push(DeviceNest {
                nest,
                independent,
                rows,
                reads,
                output,
            });
        }
        DeviceSpace {
            func: func.clone(),
            nests,
            max_threads: max_threads.max(1),
        }
    }

    fn threads(&self) -> Vec<i64> {
        THREADS
            .into_iter()
            .filter(|&t| t <= self.max_threads)
            .collect()
    }

    /// The modes `n` may take.
    fn modes(&self, n: &DeviceNest) -> Vec<Mode> {
        let mut m = vec![Mode::Default];
        if n.independent >= 1 {
            m.push(Mode::Flat);
        }
        if !self.blocks(n).is_empty() {
            m.push(Mode::TwoD);
        }
        if !self.row_threads(n).is_empty() {
            m.push(Mode::Rows);
        }
        m
    }

    /// The extent of the fused independent loops, when constant.
    fn fused_extent(n: &DeviceNest) -> Option<i64> {
        n.nest.loops[..n.independent]
            .iter()
            .try_fold(1i64, |acc, l| acc.checked_mul(l.extent?))
    }

    /// Flat mode's `(threads, coarsen)` pairs.
    fn flat_values(&self, n: &DeviceNest) -> Vec<(i64, i64)> {
        let total = Self::fused_extent(n);
        let mut out = Vec::new();
        for t in self.threads() {
            for c in [1, 2, 4, 8] {
                // Not more threads than elements (but always one size), nor whole blocks idle.
                let ok = total.is_none_or(|e| t * c <= e.max(32) || (t == 32 && c == 1));
                if ok {
                    out.push((t, c));
                }
            }
        }
        out
    }

    /// 2-D mode's `[ty, tx]`: each dividing its loop's constant extent, at most the device's
    /// threads in all, at least 32.
    fn blocks(&self, n: &DeviceNest) -> Vec<[i64; 2]> {
        if n.independent < 2 {
            return Vec::new();
        }
        let (a, b) = (
            &n.nest.loops[n.independent - 2],
            &n.nest.loops[n.independent - 1],
        );
        let (Some(ea), Some(eb)) = (a.extent, b.extent) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for ty in [1, 2, 4, 8, 16, 32] {
            for tx in [4, 8, 16, 32, 64, 128] {
                if ea % ty == 0
                    && eb % tx == 0
                    && ty * tx <= self.max_threads
                    && ty * tx >= 32.min(ea * eb)
                {
                    out.push([ty, tx]);
                }
            }
        }
        out
    }

    /// 2-D mode's register tiles for a block of `[ty, tx]` threads: 1, and 2 or 4 where they
    /// divide the loops and a reduction inside accumulates into the tile.
    fn regs(n: &DeviceNest, block: [i64; 2]) -> Vec<i64> {
        let mut out = vec![1];
        if Self::stage_loop(n).is_none() || n.output.is_none() {
            return out;
        }
        let (a, b) = (
            &n.nest.loops[n.independent - 2],
            &n.nest.loops[n.independent - 1],
        );
        if let (Some(ea), Some(eb)) = (a.extent, b.extent) {
            out.extend(
                [2, 4]
                    .into_iter()
                    .filter(|&r| ea % (block[0] * r) == 0 && eb % (block[1] * r) == 0),
            );
        }
        out
    }

    /// The reduction loop right inside the independent loops, when there is one of constant
    /// extent: what 2-D mode stages.
    fn stage_loop(n: &DeviceNest) -> Option<&LoopInfo> {
        n.nest
            .loops
            .get(n.independent)
            .filter(|l| l.reduction && l.extent.is_some())
    }

    fn stages(n: &DeviceNest) -> Vec<i64> {
        let mut out = vec![0];
        if let Some(e) = Self::stage_loop(n).and_then(|l| l.extent) {
            if !n.reads.is_empty() {
                out.extend(
                    [4, 8, 16, 32]
                        .into_iter()
                        .filter(|&kt| kt < e && e % kt == 0),
                );
            }
        }
        out
    }

    /// The innermost reduction loop inside the independent loops (unrolled in flat and 2-D).
    fn unroll_loop(n: &DeviceNest) -> Option<&LoopInfo> {
        n.nest.loops[n.independent..]
            .iter()
            .rev()
            .find(|l| l.reduction)
            .or_else(|| n.nest.leaves.iter().find(|l| l.reduction))
    }

    fn unrolls(n: &DeviceNest) -> Vec<i64> {
        match Self::unroll_loop(n).map(|l| l.extent) {
            Some(e) => std::iter::once(0)
                .chain([2, 4, 8].into_iter().filter(|&u| e.is_none_or(|e| u < e)))
                .collect(),
            None => vec![0],
        }
    }

    /// Rows mode's thread counts: powers of two dividing the row's extent.
    fn row_threads(&self, n: &DeviceNest) -> Vec<i64> {
        let Some((_, e)) = &n.rows else {
            return Vec::new();
        };
        THREADS
            .into_iter()
            .chain([8, 16])
            .filter(|&t| t <= self.max_threads && e % t == 0 && t <= *e)
            .collect()
    }

    /// Random knobs for nest `n` in mode `mode`.
    fn random_knobs(&self, n: &DeviceNest, mode: Mode, rng: &mut Rng) -> DeviceKnobs {
        let mut k = DeviceKnobs {
            mode,
            ..DeviceKnobs::default()
        };
        match mode {
            Mode::Default => {}
            Mode::Flat => {
                let v = self.flat_values(n);
                if v.is_empty() {
                    k.mode = Mode::Default;
                    return k;
                }
                (k.threads, k.coarsen) = v[rng.below(v.len())];
                k.unroll = rng.pick(&Self::unrolls(n));
            }
            Mode::TwoD => {
                let b = self.blocks(n);
                k.block = b[rng.below(b.len())];
                k.reg = rng.pick(&Self::regs(n, k.block));
                k.stage = rng.pick(&Self::stages(n));
                k.unroll = rng.pick(&Self::unrolls(n));
            }
            Mode::Rows => k.threads = rng.pick(&self.row_threads(n)),
        }
        k
    }

    /// A random choice of every knob.
    pub fn random(&self, rng: &mut Rng) -> DeviceChoice {
        self.nests
            .iter()
            .map(|n| {
                let m = self.modes(n);
                let mode = m[rng.below(m.len())];
                self.random_knobs(n, mode, rng)
            })
            .collect()
    }

    /// `c` with one knob of one nest changed (one time in four, its mode).
    pub fn mutate(&self, c: &DeviceChoice, rng: &mut Rng) -> DeviceChoice {
        let mut out = c.clone();
        if self.nests.is_empty() {
            return out;
        }
        let i = rng.below(self.nests.len());
        let n = &self.nests[i];
        let k = &mut out[i];
        if k.mode == Mode::Default || rng.below(4) == 0 {
            let m = self.modes(n);
            *k = self.random_knobs(n, m[rng.below(m.len())], rng);
            return out;
        }
        let fresh = self.random_knobs(n, k.mode, rng);
        match (k.mode, rng.below(3)) {
            (Mode::Flat, 0) => k.threads = fresh.threads,
            (Mode::Flat, 1) => k.coarsen = fresh.coarsen,
            (Mode::Flat, _) => k.unroll = fresh.unroll,
            (Mode::TwoD, 0) => {
                k.block = fresh.block;
                if !Self::regs(n, k.block).contains(&k.reg) {
                    k.reg = 1;
                }
            }
            (Mode::TwoD, 1) => k.stage = fresh.stage,
            (Mode::TwoD, _) if rng.below(2) == 0 => k.reg = fresh.reg,
            (Mode::TwoD, _) => k.unroll = fresh.unroll,
            _ => *k = fresh,
        }
        // A flat pair that no longer fits takes the fresh one whole.
        if k.mode == Mode::Flat && !self.flat_values(n).contains(&(k.threads, k.coarsen)) {
            *k = fresh;
        }
        out
    }

    /// The first candidates: every nest in each mode's usual shape (flat 256 and 64 threads,
    /// 16 x 16 threads staged by 16 and not, a block of 256 threads or of one warp, 32, per
    /// row), where it has it.
    pub fn seeds(&self) -> Vec<DeviceChoice> {
        let usual = |n: &DeviceNest, which: usize| -> DeviceKnobs {
            let d = DeviceKnobs::default();
            let flat = |t: i64, c: i64| {
                let v = self.flat_values(n);
                v.contains(&(t, c)).then_some(DeviceKnobs {
                    mode: Mode::Flat,
                    threads: t,
                    coarsen: c,
                    ..d
                })
            };
            let two_d = |stage: i64| {
                let b = self.blocks(n);
                let want = [16, 16];
                let block = if b.contains(&want) { want } else { *b.last()? };
                let stages = Self::stages(n);
                let stage = if stages.contains(&stage) { stage } else { 0 };
                let regs = Self::regs(n, block);
                Some(DeviceKnobs {
                    mode: Mode::TwoD,
                    block,
                    stage,
                    reg: if stage > 0 { *regs.last()? } else { 1 },
                    ..d
                })
            };
            let rows = |most: i64| {
                let t = self.row_threads(n);
                let pick = t
                    .iter()
                    .copied()
                    .filter(|&x| x <= most)
                    .max()
                    .or(t.first().copied())?;
                Some(DeviceKnobs {
                    mode: Mode::Rows,
                    threads: pick,
                    ..d
                })
            };
            match which {
                0 => rows(256).or_else(|| two_d(16)),
                1 => rows(32).or_else(|| two_d(16)),
                2 => two_d(16).or_else(|| flat(256, 1)),
                3 => two_d(0).or_else(|| flat(64, 1)),
                4 => flat(256, 1),
                5 => flat(64, 4),
                _ => flat(128, 1),
            }
            .unwrap_or(d)
        };
        let mut out: Vec<DeviceChoice> = Vec::new();
        for which in 0..7 {
            let c: DeviceChoice = self.nests.iter().map(|n| usual(n, which)).collect();
            if !out.contains(&c) {
                out.push(c);
            }
        }
        out
    }

    /// The steps of `choice` (on the normalized function), every nest it leaves alone made a
    /// kernel by [`bind_default`]; or why the primitives refuse it.
    pub fn steps_for(&self, choice: &DeviceChoice) -> Result<Vec<Step>, String> {
        let mut s = Schedule::new(self.func.clone());
        for (n, k) in self.nests.iter().zip(choice) {
            self.apply_nest(&mut s, n, k).map_err(|e| e.to_string())?;
        }
        bind_default(&mut s, self.max_threads).map_err(|e| e.to_string())?;
        let steps = s.trace().to_vec();
        s.finish().map_err(|e| e.to_string())?;
        Ok(steps)
    }

    fn apply_nest(
        &self,
        s: &mut Schedule,
        n: &DeviceNest,
        k: &DeviceKnobs,
    ) -> Result<(), ScheduleError> {
        let names: Vec<&str> = n.nest.loops.iter().map(|l| l.name.as_str()).collect();
        let p = n.independent;
        if k.mode != Mode::Default {
            let chain: Vec<String> = names[..p].iter().map(|x| x.to_string()).collect();
            crate::schedule::auto::make_serial(s, &chain)?;
        }
        let fuse = |s: &mut Schedule, loops: &[&str]| -> Result<String, ScheduleError> {
            let mut f = loops[0].to_owned();
            for inner in &loops[1..] {
                f = s.fuse(&f, inner)?;
            }
            Ok(f)
        };
        match k.mode {
            Mode::Default => Ok(()),
            Mode::Flat => {
                let fused = fuse(s, &names[..p])?;
                let (bo, rest) = s.split(&fused, k.threads * k.coarsen)?;
                let t = if k.coarsen > 1 {
                    let (ci, t) = s.split(&rest, k.threads)?;
                    s.reorder(&[&t, &ci])?;
                    s.unroll(&ci)?;
                    t
                } else {
                    rest
                };
                s.bind(&bo, crate::ir::ThreadTag::Block(0))?;
                s.bind(&t, crate::ir::ThreadTag::Thread(0))?;
                self.unroll(s, n, k.unroll, None)
            }
            Mode::TwoD => {
                let (a, b) = (names[p - 2], names[p - 1]);
                if p > 2 {
                    let z = fuse(s, &names[..p - 2])?;
                    s.bind(&z, crate::ir::ThreadTag::Block(2))?;
                }
                let r = k.reg.max(1);
                let (ao, ai, bo, bi);
                let mut tile = None;
                if r > 1 {
                    // Each thread an r x r tile of outputs, kept in registers over the
                    // reduction (kiln's GPU matmul, for any nest of this shape).
                    let (o, a1) = s.split(a, k.block[0] * r)?;
                    let (i, ri) = s.split(&a1, r)?;
                    (ao, ai) = (o, i);
                    let (o, b1) = s.split(b, k.block[1] * r)?;
                    let (i, ci) = s.split(&b1, r)?;
                    (bo, bi) = (o, i);
                    s.reorder(&[&ao, &bo, &ai, &bi, &ri, &ci])?;
                    tile = Some((ri, ci));
                } else {
                    (ao, ai) = s.split(a, k.block[0])?;
                    (bo, bi) = s.split(b, k.block[1])?;
                    s.reorder(&[&ao, &bo, &ai, &bi])?;
                }
                s.bind(&ao, crate::ir::ThreadTag::Block(1))?;
                s.bind(&bo, crate::ir::ThreadTag::Block(0))?;
                s.bind(&ai, crate::ir::ThreadTag::Thread(1))?;
                s.bind(&bi, crate::ir::ThreadTag::Thread(0))?;
                if let Some((ri, ci)) = &tile {
                    let (Some(red), Some(out)) = (Self::stage_loop(n), &n.output) else {
                        return Err(ScheduleError::Form {
                            func: self.func.name.clone(),
                            primitive: "cache_write",
                            message: "a register tile needs a reduction and one output".into(),
                        });
                    };
                    s.reorder(&[&red.name, ri, ci])?;
                    s.cache_write(out, &bi)?;
                    s.unroll(ri)?;
                    s.unroll(ci)?;
                }
                let mut staged_inner = None;
                if k.stage > 0 {
                    let r = Self::stage_loop(n).ok_or_else(|| ScheduleError::Form {
                        func: self.func.name.clone(),
                        primitive: "cache_read_shared",
                        message: "no reduction loop to stage".into(),
                    })?;
                    let (ko, ki) = s.split(&r.name, k.stage)?;
                    for buf in &n.reads {
                        s.cache_read_shared(buf, &ko)?;
                    }
                    staged_inner = Some(ki);
                }
                self.unroll(s, n, k.unroll, staged_inner)
            }
            Mode::Rows => {
                let Some((leaves, _)) = &n.rows else {
                    return Ok(());
                };
                let row = fuse(s, &names[..p])?;
                s.bind(&row, crate::ir::ThreadTag::Block(0))?;
                for l in leaves {
                    let (o, t) = s.split(&l.name, k.threads)?;
                    if l.reduction {
                        s.block_reduce(&o, &t)?;
                    } else {
                        s.bind(&t, crate::ir::ThreadTag::Thread(0))?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Unrolls the innermost reduction loop of a thread by `u` (its inner part after staging,
    /// `staged`, when there is one).
    fn unroll(
        &self,
        s: &mut Schedule,
        n: &DeviceNest,
        u: i64,
        staged: Option<String>,
    ) -> Result<(), ScheduleError> {
        if u <= 0 {
            return Ok(());
        }
        let name = match staged {
            Some(x) => x,
            None => match Self::unroll_loop(n) {
                Some(l) => l.name.clone(),
                None => return Ok(()),
            },
        };
        let (_, ri) = s.split(&name, u)?;
        s.unroll(&ri)
    }
}

/// Whether `l` is one of the nest's leaves or its innermost chain loop.
fn nest_leaf_named(n: &Nest, l: &LoopInfo) -> bool {
    n.leaves.iter().any(|x| x.name == l.name) || n.loops.last().is_some_and(|x| x.name == l.name)
}

/// The body below the first `depth` loops of the perfect chain at `s`.
fn chain_body(s: &Stmt, depth: usize) -> Option<&Stmt> {
    let mut cur = s;
    for _ in 0..depth {
        match cur {
            Stmt::For { body, .. } => cur = body,
            _ => return None,
        }
    }
    Some(cur)
}

/// Buffers read under the reduction loop `below` starts with and not written in it.
fn reads_of_reduction(below: &Stmt) -> Vec<String> {
    let Stmt::For { .. } = below else {
        return Vec::new();
    };
    let uses = below.free_uses();
    let mut written = Vec::new();
    space::for_each_store(below, &mut |b, _| written.push(b.data.id));
    uses.buffers
        .iter()
        .filter(|b| b.scope == StorageScope::Global && !written.contains(&b.data.id))
        .map(|b| b.name.clone())
        .collect()
}

/// One access in a row body: the buffer, whether it is a store, its indices, and the column
/// loop it is in (`None`: between the column loops).
struct RowAccess {
    buffer: VarId,
    store: bool,
    indices: Vec<Expr>,
    leaf: Option<(VarId, bool)>,
}

/// The column loops of a row body when rows mode is safe for it (see the module
/// documentation), with their common extent.
fn row_leaves(body: &Stmt) -> Option<(Vec<LoopInfo>, i64)> {
    let mut leaves: Vec<(LoopInfo, VarId)> = Vec::new();
    let mut acc: Vec<RowAccess> = Vec::new();
    if !row_walk(body, &mut leaves, &mut acc) || leaves.is_empty() {
        return None;
    }
    // A buffer is a thread's own only when the row allocates it as a `local`: a `local` of the
    // host, outside the row, is one copy that every thread of the block would share.
    let own = row_locals(body);
    let e = leaves[0].0.extent?;
    if e < 2 || leaves.iter().any(|(l, _)| l.extent != Some(e)) {
        return None;
    }
    // Buffers written, and how.
    let mut written: HashMap<VarId, Vec<&RowAccess>> = HashMap::new();
    for a in acc.iter().filter(|a| a.store) {
        written.entry(a.buffer).or_default().push(a);
    }
    for (buf, stores) in &written {
        let all: Vec<&RowAccess> = acc.iter().filter(|a| a.buffer == *buf).collect();
        let local = own.contains(buf);
        let in_spatial = stores.iter().any(|a| a.leaf.is_some_and(|(_, red)| !red));
        let in_reduction = stores.iter().any(|a| a.leaf.is_some_and(|(_, red)| red));
        let between = stores.iter().any(|a| a.leaf.is_none());
        if in_spatial {
            // Only in column loops, by each loop's own variable, in one dimension.
            if in_reduction || between {
                return None;
            }
            let dim = |a: &RowAccess| -> Vec<usize> {
                let Some((v, _)) = a.leaf else {
                    return Vec::new();
                };
                a.indices
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| matches!(x, Expr::Var(w) if w.id == v))
                    .map(|(d, _)| d)
                    .collect()
            };
            let first = dim(stores[0]);
            if !first
                .iter()
                .any(|d| all.iter().all(|a| a.leaf.is_some() && dim(a).contains(d)))
            {
                return None;
            }
        } else if in_reduction {
            // A global target is touched by its own loop only.
            if !local {
                let leaf = stores[0].leaf;
                if all.iter().any(|a| a.leaf.map(|l| l.0) != leaf.map(|l| l.0)) {
                    return None;
                }
            }
        } else if !local {
            // Written between the column loops: every thread runs it.
            return None;
        }
    }
    Some((leaves.into_iter().map(|(l, _)| l).collect(), e))
}

/// Walks a row body: column loops (innermost loops) into `leaves`, every access into `acc`;
/// false for a body of another form (a nested loop, a branch, a non-`local` allocation).
fn row_walk(s: &Stmt, leaves: &mut Vec<(LoopInfo, VarId)>, acc: &mut Vec<RowAccess>) -> bool {
    match s {
        Stmt::Seq(v) => v.iter().all(|x| row_walk(x, leaves, acc)),
        Stmt::Allocate { buffer, body, .. } => {
            buffer.scope == StorageScope::Local && row_walk(body, leaves, acc)
        }
        Stmt::Let { value, body, .. } => {
            accesses(&Stmt::Evaluate(value.clone()), None, acc);
            row_walk(body, leaves, acc)
        }
        Stmt::Store { .. } => {
            accesses(s, None, acc);
            true
        }
        Stmt::For {
            var,
            min,
            extent,
            body,
            kind: crate::ir::ForKind::Serial,
        } => {
            let mut inner = false;
            crate::ir::visit::for_each_loop(body, |_, _, _| inner = true);
            if inner || min.as_int() != Some(0) {
                return false;
            }
            let info = space::loop_info(var, extent, body);
            accesses(body, Some((var.id, info.reduction)), acc);
            leaves.push((info, var.id));
            true
        }
        _ => false,
    }
}

/// The `local` buffers allocated in `s`.
fn row_locals(s: &Stmt) -> Vec<VarId> {
    struct V(Vec<VarId>);
    impl Visitor for V {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::Allocate { buffer, .. } = s {
                if buffer.scope == StorageScope::Local {
                    self.0.push(buffer.data.id);
                }
            }
            walk_stmt(self, s);
        }
    }
    let mut v = V(Vec::new());
    v.stmt(s);
    v.0
}

fn accesses(s: &Stmt, leaf: Option<(VarId, bool)>, acc: &mut Vec<RowAccess>) {
    struct V<'a> {
        leaf: Option<(VarId, bool)>,
        acc: &'a mut Vec<RowAccess>,
    }
    impl V<'_> {
        fn push(&mut self, buffer: &crate::ir::Buffer, indices: &[Expr], store: bool) {
            self.acc.push(RowAccess {
                buffer: buffer.data.id,
                store,
                indices: indices.to_vec(),
                leaf: self.leaf,
            });
        }
    }
    impl Visitor for V<'_> {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::Store {
                buffer, indices, ..
            } = s
            {
                self.push(buffer, indices, true);
            }
            walk_stmt(self, s);
        }
        fn expr(&mut self, e: &Expr) {
            if let Expr::Load { buffer, indices } = e {
                self.push(buffer, indices, false);
            }
            walk_expr(self, e);
        }
    }
    V { leaf, acc }.stmt(s);
}

/// kiln's hand schedules of `f` for a device target, as steps: today the matmul's shared-memory
/// tiling ([`crate::schedule::kernels::gpu_matmul_on`]: 16 x 16 threads, blocks of 32 to 128
/// elements a side, `k` steps of 8 to 32), in every size that divides its shape and fits the
/// target's shared memory, kiln's OpenCL and CUDA sizes first.
pub fn device_templates(f: &PrimFunc, target: &Target) -> Vec<Vec<Step>> {
    let Some(mm) = match_matmul(f) else {
        return Vec::new();
    };
    let mut start = Schedule::new(f.clone());
    if start.apply(&mm.prefix).is_err() {
        return Vec::new();
    }
    let shared = target
        .get_int("max_shared_memory_per_block")
        .unwrap_or(16384);
    let threads = target.get_int("max_num_threads").unwrap_or(256);
    if threads < 256 {
        return Vec::new();
    }
    let sizes = [
        (64, 16),
        (128, 8),
        (64, 8),
        (32, 16),
        (128, 16),
        (64, 32),
        (32, 32),
        (32, 8),
    ];
    sizes
        .into_iter()
        // Two tiles of `tile x kt` floats.
        .filter(|&(tile, kt)| 2 * tile * kt * 4 <= shared)
        .filter_map(|(tile, kt)| {
            crate::schedule::kernels::gpu_matmul_on(start.clone(), &mm.parts, mm.shape, tile, kt)
                .ok()
        })
        .map(|s| s.trace().to_vec())
        .collect()
}
