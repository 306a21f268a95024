//! The benchmark kernels with their fast schedules (`examples/kernels/*.json` are these at the
//! benchmark sizes; `KILN_BLESS=1 cargo test --test schedule` rewrites them).
//!
//! They are fast under the default target (`{"kind": "llvm", "mcpu": "native"}`): LLVM contracts
//! `a * b + c` into FMAs by default (as TVM), and softmax asks for `fast_exp` itself (as TVM's
//! `fast_softmax`), which is a vector polynomial on every target. They are correct on any target
//! and for any input alignment (vector loads and stores only assume the element alignment).
//!
//! | kernel | schedule |
//! |---|---|
//! | `vadd` | one parallel loop (each thread a contiguous chunk, vectorized by LLVM) |
//! | `matmul` | `B` packed into `nr`-column panels; `i` tiled `mb` x `mr`, `j` by `nr`; the `mr` x `nr` block of `C` accumulated in registers (`cache_write`) over the whole `k` loop, rows unrolled, columns vectorized; (row block, column panel) pairs in parallel. 8 x 32 with AVX-512 (32 zmm), 6 x 16 with AVX2 (16 ymm) ([`MatmulTiles::for_target`]); `mb` rows of `A` fit in half the L2 ([`MatmulTiles::for_target_and_depth`]: for `k` = 1024, 256 rows with a 2 MiB L2 and AVX-512, 128 with 1 MiB; at least 120 rows, the whole `k` loop in one pass); rows split into parts (whole blocks, whole tiles, the last `m % mr` rows) so that no split leaves a bounds guard in the `k` loop |
//! | `rowsum` | reduction split by 64 and `rfactor`ed into 64 vector lanes; rows in parallel |
//! | `softmax` | rows in parallel; max and sum reductions `rfactor`ed into 64 lanes (the max in 32 with AVX2, [`SoftmaxLanes`]); `exp` and the scaling vectorized by 16 (`exp` by 32 with AVX2); the next row prefetched in the `exp` loop |
//!
//! The `opencl_*` functions are the same kernels scheduled for GPU-style devices with the device
//! primitives ([`Schedule::bind`], [`Schedule::cache_read_shared`], [`Schedule::block_reduce`]):
//! 256 threads per work-group and at most 8 KiB of shared memory (the `opencl` target's defaults
//! allow 256 and 16 KiB). `examples/kernels/opencl/*.json` are these at the benchmark sizes
//! (`KILN_BLESS=1 cargo test --test schedule_device` rewrites them).
//!
//! | kernel | schedule |
//! |---|---|
//! | [`opencl_vadd`] | `i` split by 256: `blockIdx.x` x `threadIdx.x`, the split's guard for the tail |
//! | [`opencl_matmul_sized`] | 64 x 64 blocks of `C` per work-group, 16 x 16 threads with 4 x 4 register tiles; 64 x 16 tiles of `A` and 16 x 64 of `B` staged in shared memory per `k` step of 16 |
//! | [`opencl_rowsum_sized`] | a work-group per row; strided per-thread partial sums, a tree reduction in shared memory |
//! | [`opencl_softmax_sized`] | a work-group per row; block reductions for the max and the sum, `exp` and the scaling with one column in 256 per thread |
//!
//! The `cuda_*` functions are the kernels for the `cuda` target (`examples/kernels/cuda/*.json`,
//! same bless command): vadd, rowsum and softmax are the schedules above (256 threads per block
//! suits both), and [`cuda_matmul_sized`] is the same matmul schedule with CUDA's SGEMM blocking
//! (128 x 128 blocks of `C`, 8 x 8 register tiles, `k` by 8).

use super::{AxisMap, Schedule, ScheduleResult};
use crate::ir::builder::{call, for_range, Reducer};
use crate::ir::kernels as plain;
use crate::ir::{
    Buffer, DataType, Expr, ForKind, Intrinsic, Param, PrimFunc, Stmt, StorageScope, ThreadTag,
};

/// Rows of `C` per register block of `matmul`.
pub const MATMUL_MR: i64 = 8;
/// Columns of `C` per register block of `matmul` (two 16-lane vectors).
pub const MATMUL_NR: i64 = 32;
/// Rows per parallel task block of `matmul` in the fixed tiles ([`MatmulTiles::AVX512`], the
/// schedule of `examples/kernels/matmul.json`): 128 rows of `A` (`k` = 1024) fill half of a
/// 1 MiB L2, the smallest of the AVX-512 CPUs these tiles are for ([`block_rows`]).
pub const MATMUL_MB: i64 = 128;
/// The most rows per task block [`block_rows`] picks: 256 keeps four tasks for a 1024-row `C`.
pub const MATMUL_MB_MAX: i64 = 256;

/// Scheduled `vadd(A[n], B[n], C[n])`.
///
/// # Errors
/// None in practice (the schedule fits the kernel).
pub fn vadd() -> ScheduleResult<PrimFunc> {
    let mut s = Schedule::new(plain::vadd());
    s.parallel("i")?;
    s.finish()
}

/// The register blocking of `matmul` for one CPU: an `mr` x `nr` block of `C` in vector
/// registers over the `k` loop (or over `kc` steps of it at a time), `mb` rows of `A` per
/// parallel task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulTiles {
    /// Rows of `C` per register block.
    pub mr: i64,
    /// Columns of `C` per register block (a multiple of the vector width).
    pub nr: i64,
    /// Rows per parallel task block (a multiple of `mr`).
    pub mb: i64,
    /// Steps of `k` per pass over a block of `C` (a divisor of `k`): `C` is zeroed first, then
    /// each pass adds an `mb x kc` block of `A` (in the L2) times `kc x nr` slices of the `B`
    /// panels (in the L1) into it. 0, or `k` and above: the whole `k` loop in one pass, the
    /// accumulators starting at zero.
    pub kc: i64,
}

impl MatmulTiles {
    /// 32 vector registers of 16 floats (AVX-512): 8 x 32, sixteen zmm accumulators, two for
    /// the `B` panel row, one broadcast of `A`. 12 x 32 (24 accumulators) ran 2-4 % faster
    /// (1024^3 on a Xeon, Sapphire Rapids class, 2 cores, interleaved runs: 366 against 353
    /// GFLOP/s, 387 against 380), but 1024 rows are not a multiple of 12: the row parts that
    /// avoid a bounds guard ([`matmul_tiled`]) are copies of the loop nest, and the build took
    /// 18-29 ms to the first tier against 10-14 ms. 14 x 32 was no better than 12 x 32.
    pub const AVX512: MatmulTiles = MatmulTiles {
        mr: MATMUL_MR,
        nr: MATMUL_NR,
        mb: MATMUL_MB,
        kc: 0,
    };
    /// 16 vector registers of 8 floats (AVX2, and SSE machines, which LLVM lowers the 8-lane
    /// vectors for): 6 x 16, twelve ymm accumulators (more than two FMA ports x four or five
    /// cycles of latency need), two for the `B` panel row, one broadcast of `A`, nothing
    /// spilled. Measured on a Xeon built for `haswell`, interleaved runs, 1024^3: 6 x 16 against
    /// 4 x 16 (eight accumulators) 207 / 199 GFLOP/s with 60- / 64-row blocks, 219 / 203 with
    /// 120 / 128, 188 / 192 with 30 / 32. 8 x 32 needs 32 ymm accumulators and spills (108
    /// GFLOP/s against 176). Row counts that are not a multiple of 6 cost nothing in the hot
    /// loop: the last rows are a part of their own ([`matmul_tiled`]).
    pub const AVX2: MatmulTiles = MatmulTiles {
        mr: 6,
        nr: 16,
        mb: 60,
        kc: 0,
    };

    /// The tiles for a target: AVX-512 when its CPU has it (`mcpu` `native` resolved to the
    /// host, a named CPU by [`crate::target::cpu_has_avx512`], `mattr` `+avx512f`/`-avx512f`
    /// deciding over both), else AVX2's.
    pub fn for_target(t: &crate::target::Target) -> MatmulTiles {
        if crate::target::has_avx512(t) {
            MatmulTiles::AVX512
        } else {
            MatmulTiles::AVX2
        }
    }

    /// The tiles for a target and a depth `k`: the register tiles of [`MatmulTiles::for_target`],
    /// and as many rows per task block (`mb`, a multiple of `mr`, at most [`MATMUL_MB_MAX`]) as keep the
    /// block of `A` (`mb x k` floats, reused by every panel of `B`) in half the L2 cache
    /// ([`crate::target::l2_bytes`]: the host's, whatever CPU the target names; a named CPU's,
    /// or 256 KiB, where the host's cannot be read), and at least [`MATMUL_MB_MIN`] rows
    /// (rounded down to whole tiles), the whole `k` loop in one pass.
    ///
    /// Where the block of `A` does not fit (a small L2, or a deep `k`), the rows stay at
    /// [`MATMUL_MB_MIN`] and `A` streams from beyond the L2 while each panel of `B` stays
    /// there, rather than `k` being taken in passes ([`depth_block`], which the tuner still
    /// tries): passes reload every register tile of `C` once per pass, and were never faster.
    /// Measured with AVX2's tiles: on an AMD EPYC Zen 3 (512 KiB L2, 2 cores; paired with numpy
    /// in one process) one pass of 126 rows ran 1.011x numpy at 1024³ against 0.956x for 126
    /// rows in passes of 512, and 0.97x against 0.94x at 2048³; on a Zen 4, passes ran 10 %
    /// slower; on a Xeon with 2 MiB of L2, alike (120 rows: 219 and 221 GFLOP/s).
    pub fn for_target_and_depth(t: &crate::target::Target, k: i64) -> MatmulTiles {
        let tiles = MatmulTiles::for_target(t);
        let l2 = crate::target::l2_bytes(t);
        let least = (MATMUL_MB_MIN / tiles.mr * tiles.mr).max(tiles.mr);
        MatmulTiles {
            mb: block_rows(l2, k, tiles.mr).max(least),
            kc: 0,
            ..tiles
        }
    }
}

/// The fewest rows per task block ([`MatmulTiles::for_target_and_depth`]): below it, the `B`
/// panels are loaded from beyond the L2 once per few rows. Measured on a Xeon built for `haswell` (6 x 16 tiles, 1024^3,
/// interleaved runs): 30 / 60 / 120 / 252 rows ran 208 / 207 / 219 / 222 GFLOP/s, and 120 rows
/// in passes of 256 steps 221.
pub const MATMUL_MB_MIN: i64 = 120;

/// The steps of `k` per pass that would keep [`MATMUL_MB_MIN`] rows of `A` in half of `l2`
/// bytes of L2 ([`MatmulTiles::kc`]; a starting point of the tuner's, not the default): 0 (one
/// pass) when they fit at depth `k`; else `k / p` for the
/// fewest passes `p` that make them fit, when `p` divides `k` (a pass of another length would
/// need a bounds guard in the inner loop), and 0 when none does up to 64-step passes.
pub fn depth_block(l2: u64, k: i64) -> i64 {
    let budget = l2 / 2 / (MATMUL_MB_MIN as u64 * 4);
    if k <= 0 || (k as u64) <= budget {
        return 0;
    }
    let passes = (k as u64).div_ceil(budget.max(1)) as i64;
    (passes..=k / 64).find(|p| k % p == 0).map_or(0, |p| k / p)
}

/// The rows of a block of `A` (`rows x k` floats) that fit in half of `l2` bytes, a multiple of
/// `mr` between `mr` and [`MATMUL_MB_MAX`].
///
/// Larger blocks load each panel of `B` from beyond the L2 fewer times. Measured on a Xeon
/// (Sapphire Rapids class, 2 MiB L2, 2 cores), 1024^3: 8 x 32 tiles at 64 / 128 / 256 / 512
/// rows ran 339 / 360 / 372 / 367 GFLOP/s; 4 x 16 (haswell) tiles 198 / 204 / 208 / 202.
pub fn block_rows(l2: u64, k: i64, mr: i64) -> i64 {
    let row = (k.max(1) as u64).saturating_mul(4);
    let rows = (l2 / 2 / row).min(MATMUL_MB_MAX as u64) as i64;
    (rows / mr * mr).max(mr)
}

/// Scheduled `matmul(A[m,k], B[k,n], C[m,n])` with the AVX-512 tiles
/// ([`MatmulTiles::AVX512`]); `n` must be a multiple of [`MATMUL_NR`] (other `m` and `k` are
/// fine). [`matmul_tiled`] takes the tiles of another CPU.
///
/// # Errors
/// `n` not a multiple of [`MATMUL_NR`].
pub fn matmul_sized(m: i64, n: i64, k: i64) -> ScheduleResult<PrimFunc> {
    matmul_tiled(m, n, k, MatmulTiles::AVX512)
}

/// Scheduled `matmul` with the register blocking `tiles` (e.g. [`MatmulTiles::for_target`]);
/// when `n` is not a multiple of `tiles.nr`, the last `n % nr` columns get a narrower tile.
///
/// # Errors
/// None in practice.
pub fn matmul_tiled(m: i64, n: i64, k: i64, tiles: MatmulTiles) -> ScheduleResult<PrimFunc> {
    matmul_tiled_schedule(m, n, k, tiles)?.finish()
}

/// The schedule of [`matmul_tiled`], before [`Schedule::finish`]: its [`Schedule::trace`] is
/// the hand schedule as steps (what `kiln tune` starts its search of a matmul from).
///
/// # Errors
/// None in practice.
pub fn matmul_tiled_schedule(
    m: i64,
    n: i64,
    k: i64,
    tiles: MatmulTiles,
) -> ScheduleResult<Schedule> {
    matmul_tiled_on(
        Schedule::new(plain::matmul_sized(m, n, k)),
        &MatmulParts::default(),
        [m, n, k],
        tiles,
    )
}

/// The loops and buffers of a matmul `C[i, j] = sum_k A[i, k] * B[k, j]` written as `for i {
/// for j { C[i, j] = 0; for k { C[i, j] += A[i, k] * B[k, j] } } }` (the form of
/// [`plain::matmul_sized`], and of a TVM matmul after [`Schedule::decompose_reduction`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatmulParts {
    /// The row loop.
    pub i: String,
    /// The column loop.
    pub j: String,
    /// The reduction loop.
    pub k: String,
    /// The `[m, k]` operand.
    pub a: String,
    /// The `[k, n]` operand (packed into panels).
    pub b: String,
    /// The output.
    pub c: String,
}

impl Default for MatmulParts {
    /// The names of [`plain::matmul_sized`].
    fn default() -> Self {
        MatmulParts {
            i: "i".into(),
            j: "j".into(),
            k: "k0".into(),
            a: "A".into(),
            b: "B".into(),
            c: "C".into(),
        }
    }
}

/// The schedule of [`matmul_tiled`] applied to the matmul `parts` of `s`, of shape `[m, n, k]`.
/// When `n` is not a multiple of `tiles.nr`, the last `n % nr` columns are a part of their own
/// (a register tile that many columns wide, reading the last, partly filled panel).
///
/// # Errors
/// A loop or buffer `parts` names that is not there, or a nest of another form.
pub fn matmul_tiled_on(
    s: Schedule,
    parts: &MatmulParts,
    shape: [i64; 3],
    tiles: MatmulTiles,
) -> ScheduleResult<Schedule> {
    matmul_tiled_packing(s, parts, shape, tiles, PackB::Whole, PackA::InPlace)
}

/// Whether a matmul's `A` is packed into row panels ([`matmul_tiled_packing`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PackA {
    /// Not packed: a register tile reads its `mr` rows of `A` where they are, `k` floats apart
    /// (8 KiB for `k` = 2048: `mr` streams through the caches and the TLB at once).
    #[default]
    InPlace,
    /// All of `A`, up front, in parallel (`transform_layout` into `Ap[m / mr, k, mr]`, as
    /// OpenBLAS packs its `A` panels): each register tile then reads one contiguous `k x mr`
    /// panel. Measured on a Zen 4 built for `haswell`: 2048^3 +8 %, 1024^3 -2 % (the copy of
    /// all of `A` on every call); which one wins is the tuner's to find.
    Whole,
    /// The task's block of rows, by the task, a pass of `k` at a time (all of `k` in one
    /// pass), into row panels `[mb / mr, kc, mr]` (`cache_read_panels_of`), as GotoBLAS packs
    /// `A`: the block is copied where it is used, and with `k` in passes its `mb x kc` slice
    /// can stay in the L2 while the task's column panels of `B` pass through the L1 against
    /// it. With `B` packed up front or read in place, a task is a whole block of rows (all
    /// its columns), so that each block is packed once a pass; with `B` packed in the task, a
    /// task is a block of rows and a group of column panels, and each task packs its block's
    /// rows again. Measured on a Zen 4 built for `haswell` (2048^3, against `Whole` with `k`
    /// in one pass): one pass 1.00-1.02x, passes of 256 0.94-0.96x; the tuner finds where it
    /// wins.
    InTask,
}

/// Where a matmul's `B` is packed into contiguous panels ([`matmul_tiled_packing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PackB {
    /// All of `B`, up front, in parallel (`transform_layout`): each panel once, then read by
    /// every row block.
    Whole,
    /// The slice a parallel task is about to use, by that task, as BLAS packs: a task covers
    /// `panels` column panels (fewer where they do not divide the panels of `B`), and packs
    /// their `kc x nr` slices at the start of each `k` pass (or all of `k` when it is one
    /// pass) with one sweep over each row (`cache_read_panels`); each register tile then reads
    /// one contiguous panel slice, in the L1. `B` is read once per row block, with no up-front
    /// copy of all of it (64 MiB for a 64 x 4096 x 4096 matmul of 2 GFLOP).
    InTask {
        /// Column panels per task.
        panels: i64,
        /// With `k` in passes: each pass's register tiles prefetch the rows of `B` the next
        /// pass packs, one cache line every few `k` steps ([`Schedule::prefetch_next`]), so
        /// that the copy finds them in the cache instead of waiting on memory with nothing to
        /// compute (64 x 4096 x 4096 for AVX2 on a Zen 3, both cores, 5 panels of 24 a task,
        /// passes of 128, paired with numpy in one process on its arrays, in 2 MiB pages:
        /// 0.93-0.95x numpy's speed without, 0.98-0.99x with; on 4 KiB pages it loses). No
        /// effect with `k` in one pass.
        ahead: bool,
    },
    /// Not packed: every register tile reads `B` where it is.
    InPlace,
}

/// [`matmul_tiled_on`], with `B` packed up front, in each task, or not at all ([`PackB`]), and
/// `A` packed up front or not ([`PackA`]): a matmul with few rows reads each panel of `B` a few
/// times only, and packing all of `B` on every call (64 x 4096 x 4096: 64 MiB read and
/// written for 2 GFLOP) costs more than the strided reads it saves; packing in the task saves
/// both.
///
/// # Errors
/// As [`matmul_tiled_on`].
pub fn matmul_tiled_packing(
    mut s: Schedule,
    parts: &MatmulParts,
    [m, n, k]: [i64; 3],
    tiles: MatmulTiles,
    pack: PackB,
    pack_a: PackA,
) -> ScheduleResult<Schedule> {
    if pack == PackB::Whole {
        pack_panels(&mut s, &parts.b, n, tiles.nr.max(1))?;
    }
    if pack_a == PackA::Whole && m >= 1 && k >= 1 {
        pack_rows(&mut s, &parts.a, m, tiles.mr.clamp(1, m))?;
    }
    let a_in_task = (pack_a == PackA::InTask && k >= 1).then_some(parts.a.as_str());
    if m < 1 || n < 1 {
        // No rows or columns: nothing to tile.
        return Ok(s);
    }
    let in_task = match pack {
        PackB::InTask { panels, ahead } => Some((panels.max(1), ahead)),
        _ => None,
    };
    matmul_columns(s, parts, [m, n, k], tiles, in_task, a_in_task)
}

/// Packs `b` (`[k, n]`) into column panels `Bp[n / nr, k, n % nr]`, each register block then
/// reading one contiguous `k x nr` panel, filled in parallel.
fn pack_panels(s: &mut Schedule, b: &str, n: i64, nr: i64) -> ScheduleResult<()> {
    let packed = s.fresh_buffer(&format!("{b}p"));
    let fill = s.transform_layout(
        b,
        &packed,
        &[AxisMap::outer(1, nr), AxisMap::id(0), AxisMap::inner(1, nr)],
    )?;
    // The whole panels apart from the last, partly filled one (its columns past `n` are
    // never read): split with no bounds guard, their fill is vector loads and stores. With a
    // guard in it (2048 columns in panels of 24), LLVM filled element by element, a compare
    // and branch each (2048^3 in 4 x 24 tiles for `haswell` on a Zen 4, paired: 82.7 ms with
    // the guard, 81.5 without).
    let whole = n / nr * nr;
    if whole == 0 {
        return Ok(());
    }
    let mut rows = fill[0].clone();
    if whole < n {
        // The columns' loop in two parts, then the rows' loop around each (the last panel's
        // few columns: a short loop of its own, left serial).
        s.partition(&fill[1], whole)?;
        rows = s.fission(&rows)?[0].clone();
    }
    // Fill one panel row (nr contiguous floats of B into nr contiguous floats of Bp) at a time,
    // up to eight panels per row of B (a number that divides the panels): up to eight write
    // streams (32 if a whole row of B went at once, all mapping to the same cache sets, the
    // panels being 128 KiB apart), and each thread fills whole panels.
    let panels = whole / nr;
    let group = (1..=8.min(panels))
        .rev()
        .find(|g| panels % g == 0)
        .unwrap_or(1);
    let (fill_o, fill_j) = s.split(&fill[1], nr)?;
    s.vectorize(&fill_j)?;
    let (fill_oo, fill_oi) = s.split(&fill_o, group)?;
    s.reorder(&[&fill_oo, &rows, &fill_oi, &fill_j])?;
    s.parallel(&fill_oo)?;
    Ok(())
}

/// Packs `a` (`[m, k]`) into row panels `Ap[m / mr, k, mr]`, each register tile then reading
/// one contiguous `k x mr` panel. The fill is partitioned at the last whole panel, so that the
/// whole panels' fill has no bounds guard (with one, LLVM leaves it scalar: 0.7 ms against
/// 0.07 for 4 MiB); row panels in parallel, each panel's `mr` rows read along `k` in vectors
/// and interleaved into the panel.
fn pack_rows(s: &mut Schedule, a: &str, m: i64, mr: i64) -> ScheduleResult<()> {
    let packed = s.fresh_buffer(&format!("{a}p"));
    let fill = s.transform_layout(
        a,
        &packed,
        &[AxisMap::outer(0, mr), AxisMap::id(1), AxisMap::inner(0, mr)],
    )?;
    let whole = m / mr * mr;
    if whole == 0 {
        return Ok(());
    }
    if whole < m {
        s.partition(&fill[0], whole)?;
    }
    let (o, r) = s.split(&fill[0], mr)?;
    s.reorder(&[&o, &fill[1], &r])?;
    s.unroll(&r)?;
    s.parallel(&o)?;
    Ok(())
}

/// The column parts of [`matmul_tiled_packing`]: whole panels, then the last `n % nr` columns
/// as a narrower tile, each tiled by [`matmul_rows`].
fn matmul_columns(
    mut s: Schedule,
    parts: &MatmulParts,
    [m, n, k]: [i64; 3],
    tiles: MatmulTiles,
    pack_in_task: Option<(i64, bool)>,
    a_in_task: Option<&str>,
) -> ScheduleResult<Schedule> {
    let nr = tiles.nr.max(1);
    let (i, j, k0) = (parts.i.clone(), parts.j.clone(), parts.k.clone());
    let mut column_parts = vec![(i.clone(), j.clone(), k0.clone(), nr.min(n))];
    if n > nr && n % nr != 0 {
        let map = s.partition(&j, n / nr * nr)?;
        let il = s.fission(&i)?;
        column_parts[0].0 = il[0].clone();
        column_parts.push((il[1].clone(), map[&j].clone(), map[&k0].clone(), n % nr));
    }
    let whole_panels = n / nr;
    for (i, j, k0, width) in column_parts {
        // Panels per task: the most up to the request that divide this part's panels (the
        // narrow last part is one panel).
        let b = pack_in_task.map(|(g, ahead)| {
            let count = if width == nr { whole_panels.max(1) } else { 1 };
            let g = (1..=g.min(count))
                .rev()
                .find(|g| count % g == 0)
                .unwrap_or(1);
            (parts.b.as_str(), g, ahead)
        });
        matmul_rows(
            &mut s,
            (&parts.c, b, a_in_task),
            (i, j, k0),
            [m, k],
            tiles,
            width,
        )?;
    }
    Ok(s)
}

/// `B` packed in each task ([`PackB::InTask`]): the operand, the panels per task and whether
/// the next pass's slice is prefetched.
type BInTask<'a> = Option<(&'a str, i64, bool)>;

/// The row parts, register tiles and parallel tasks of one column part of [`matmul_tiled_on`];
/// `b`: the operand to pack in each task, the panels per task and whether the next pass's
/// slice is prefetched ([`PackB::InTask`]); `a`: the operand whose block of rows each task
/// packs ([`PackA::InTask`]).
fn matmul_rows(
    s: &mut Schedule,
    (c, b, a): (&str, BInTask, Option<&str>),
    (i, j, k0): (String, String, String),
    [m, k]: [i64; 2],
    tiles: MatmulTiles,
    nr: i64,
) -> ScheduleResult<()> {
    // Rows in up to three parts, each tiled without a bounds guard: whole blocks of `mb` rows,
    // then whole `mr`-row tiles, then the last `m % mr` rows as one narrower tile. (A guard
    // from a split that does not divide would sit in the k loop of every tile.)
    let parts = row_parts(m, tiles.mb, tiles.mr);
    let mut names = [(i, j, k0)].to_vec();
    for (p, &(rows, _, _)) in parts.iter().enumerate().take(parts.len().saturating_sub(1)) {
        let (i, j, k0) = names[p].clone();
        let map = s.partition(&i, rows)?;
        names.push((map[&i].clone(), map[&j].clone(), map[&k0].clone()));
    }
    let passes = tiles.kc > 0 && tiles.kc < k && k % tiles.kc == 0;
    // A task is a whole block of rows where it packs its rows of `A` and `B` is not packed by
    // tasks: its block is then packed once a pass, not once for every column panel.
    let rows_only = a.is_some() && b.is_none();
    for ((i, j, k0), &(_, mr, mb)) in names.iter().zip(&parts) {
        let (mut i, mut j) = (i.clone(), j.clone());
        if passes {
            // The zeroing of C becomes a pass of its own (rows in parallel, columns
            // vectorized); the product adds into C.
            let jl = s.fission(&j)?;
            let il = s.fission(&i)?;
            s.vectorize(&jl[0])?;
            s.parallel(&il[0])?;
            (i, j) = (il[1].clone(), jl[1].clone());
        }
        let (io, ii) = s.split(&i, mb)?;
        let (it, ir) = s.split(&ii, mr)?;
        let (jo, ji) = s.split(&j, nr)?;
        // The task's column loop: the panel loop, or groups of `g` panels when B is packed by
        // the task (`jg`: the panels of a group).
        let (jt, jg) = match b {
            Some((_, g, _)) if g > 1 => {
                let (jt, jg) = s.split(&jo, g)?;
                (jt, Some(jg))
            }
            _ => (jo.clone(), None),
        };
        // The cache packed at `at`, if any.
        let pack_at = |s: &mut Schedule, at: &str| -> ScheduleResult<Option<String>> {
            match b {
                Some((b, g, _)) if g > 1 => s.cache_read_panels(b, at, nr).map(Some),
                Some((b, _, _)) => s.cache_read(b, at).map(Some),
                None => Ok(None),
            }
        };
        if passes {
            // Per block and panel, k in passes of kc: the register tile is loaded from C,
            // accumulates kc steps, and is stored back.
            let (ko, ki) = s.split(k0, tiles.kc)?;
            match &jg {
                Some(jg) => s.reorder(&[&io, &jt, &ko, jg, &it, &ir, &ji, &ki])?,
                None if rows_only => s.reorder(&[&io, &ko, &jo, &it, &ir, &ji, &ki])?,
                None => s.reorder(&[&io, &jo, &ko, &it, &ir, &ji, &ki])?,
            }
            s.cache_write(c, &it)?;
            s.reorder(&[&ki, &ir, &ji])?;
            s.unroll(&ir)?;
            s.vectorize(&ji)?;
            if let (Some(cache), Some((_, _, true))) = (pack_at(s, &ko)?, b) {
                s.prefetch_next(&cache, &ko, &ki)?;
            }
            if let Some(a) = a {
                // The block's `mb x kc` slice of `A` in row panels, a pass at a time.
                s.cache_read_panels_of(a, &ko, mr, 0)?;
            }
        } else {
            match &jg {
                Some(jg) => s.reorder(&[&io, &jt, jg, &it, &ir, &ji])?,
                None => s.reorder(&[&io, &jo, &it, &ir, &ji])?,
            }
            s.cache_write(c, &it)?;
            // Separate the zeroing of the accumulators from the k loop, then move k outside
            // the block.
            let j_loops = s.fission(&ji)?;
            let i_loops = s.fission(&ir)?;
            s.reorder(&[k0, &i_loops[1], &j_loops[1]])?;
            for l in &i_loops {
                s.unroll(l)?;
            }
            for l in &j_loops {
                s.vectorize(l)?;
            }
            pack_at(s, &jt)?;
            if let Some(a) = a {
                // The block's rows of `A` in row panels, all of `k`, once per task.
                s.cache_read_panels_of(a, if rows_only { &io } else { &jt }, mr, 0)?;
            }
        }
        if rows_only {
            s.parallel(&io)?;
            continue;
        }
        // The (row block, column panel) pairs as one parallel loop: as many tasks as pairs,
        // so the threads share the work evenly whatever the number of row blocks (5 blocks of
        // 204 rows on 2 threads: 331 GFLOP/s with the blocks in parallel, 398 with the pairs,
        // on a Xeon with AVX-512). Each task reads its block of `A` through its own core's L2.
        let pairs = s.fuse(&io, &jt)?;
        s.parallel(&pairs)?;
    }
    Ok(())
}

/// The row parts of a `matmul` with `m` rows, as (rows, rows per register tile, rows per task
/// block): whole blocks of `mb` rows (`mb` rounded down to a multiple of `mr`, at least `mr`),
/// whole `mr`-row tiles of the rest in one block, and the last `m % mr` rows as one tile. Every
/// split then divides its loop. Where a block of between 3/4 of `mb` and `mb` rows divides the
/// whole tiles, it is used instead, leaving no middle part (and where all `m` rows, at most
/// 5/4 of `mb`, are whole tiles, one block of them): each part is a copy of the loop
/// nest, and build time grows with them (1024 rows of 12 x 32 tiles: 85 tiles in 5 blocks of
/// 204 rows and 4 rows apart build in 18 ms to the first tier, 8 blocks of 120 rows, 60 and 4
/// apart in 28 ms).
fn row_parts(m: i64, mb: i64, mr: i64) -> Vec<(i64, i64, i64)> {
    let mr = mr.clamp(1, m.max(1));
    let mut mb = (mb / mr * mr).max(mr);
    let (tiles, per_block) = (m / mr, mb / mr);
    if let Some(t) = ((per_block * 3 + 3) / 4..=per_block)
        .rev()
        .find(|t| tiles % t == 0)
    {
        mb = t * mr;
    } else if m % mr == 0 && m <= mb + mb / 4 {
        // A little more than a block, in whole tiles: one block (64 rows in 4-row tiles with
        // 60-row blocks), not a second copy of the nest for the last tile.
        mb = m;
    }
    let full = m / mb * mb;
    let rest = m - full;
    let whole = rest / mr * mr;
    let tail = rest - whole;
    [(full, mr, mb), (whole, mr, whole), (tail, tail, tail)]
        .into_iter()
        .filter(|&(rows, _, _)| rows > 0)
        .collect()
}

/// The benchmark matmul, 1024 x 1024 x 1024.
///
/// # Errors
/// None in practice.
pub fn matmul() -> ScheduleResult<PrimFunc> {
    matmul_sized(1024, 1024, 1024)
}

/// Scheduled `rowsum(A[rows, cols], B[rows])`; `cols` must be a multiple of 64.
///
/// # Errors
/// `cols` not a multiple of 64.
pub fn rowsum_sized(rows: i64, cols: i64) -> ScheduleResult<PrimFunc> {
    let mut s = Schedule::new(plain::rowsum_sized(rows, cols));
    let (ko, ki) = s.split("k0", 64)?;
    s.rfactor(&ko, &ki)?;
    s.vectorize(&ki)?;
    s.parallel("i")?;
    s.finish()
}

/// The benchmark rowsum, 4096 x 4096.
///
/// # Errors
/// None in practice.
pub fn rowsum() -> ScheduleResult<PrimFunc> {
    rowsum_sized(4096, 4096)
}

/// The softmax algorithm the schedules start from: per row, a max reduction, `exp_op`
/// ([`Intrinsic::Exp`] or [`Intrinsic::FastExp`]) of the shifted row, a sum reduction, and a
/// scaling by the sum's reciprocal. Loops `i`, `jm`, `je`, `js`, `jn`.
pub fn softmax_algorithm(rows: i64, cols: i64, exp_op: Intrinsic) -> PrimFunc {
    let f32t = DataType::f32();
    let shape = vec![Expr::from(rows), Expr::from(cols)];
    let a = Buffer::new("A", f32t, shape.clone());
    let b = Buffer::new("B", f32t, shape);
    let body = for_range("i", Expr::from(rows), ForKind::Serial, |i| {
        let maxv = Buffer::temp("maxv", f32t, vec![Expr::from(1i64)], StorageScope::Local);
        let sum = Buffer::temp("sum", f32t, vec![Expr::from(1i64)], StorageScope::Local);
        let z = [Expr::from(0i64)];
        let at = |j: &Expr| [i.clone(), j.clone()];
        let cols_e = Expr::from(cols);
        let body = Stmt::Seq(vec![
            maxv.store(&z, Reducer::Max.init(f32t)),
            for_range("jm", cols_e.clone(), ForKind::Serial, |j| {
                maxv.store(&z, maxv.load(&z).max(a.load(at(&j))))
            }),
            for_range("je", cols_e.clone(), ForKind::Serial, |j| {
                b.store(at(&j), call(exp_op, vec![a.load(at(&j)) - maxv.load(&z)]))
            }),
            sum.store(&z, 0.0f32),
            for_range("js", cols_e.clone(), ForKind::Serial, |j| {
                sum.store(&z, sum.load(&z) + b.load(at(&j)))
            }),
            for_range("jn", cols_e, ForKind::Serial, |j| {
                b.store(at(&j), b.load(at(&j)) * (Expr::from(1.0f32) / sum.load(&z)))
            }),
        ]);
        maxv.allocate(sum.allocate(body))
    });
    PrimFunc::new("softmax", vec![Param::Buffer(a), Param::Buffer(b)], body).with_noalias(true)
}

/// The vector widths of [`softmax_with`]: the lanes of the max and the sum reductions
/// (`rfactor`ed), and of the `exp` and the scaling loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftmaxLanes {
    /// Lanes of the max reduction.
    pub max: i64,
    /// Lanes of the sum reduction.
    pub sum: i64,
    /// Lanes of the `exp` loop.
    pub exp: i64,
    /// Lanes of the scaling loop.
    pub scale: i64,
}

impl SoftmaxLanes {
    /// AVX-512: both reductions in 64 lanes (four zmm accumulators), 16-lane `exp` and scaling.
    pub const AVX512: SoftmaxLanes = SoftmaxLanes {
        max: 64,
        sum: 64,
        exp: 16,
        scale: 16,
    };
    /// AVX2: the max in 32 lanes. kiln's `max` is IEEE's (NaN propagates, -0 below +0), five
    /// instructions a vector; 64 lanes are eight ymm accumulators and spill the sixteen
    /// registers. `exp` in 32 lanes. Measured on an AMD EPYC (Zen 3), 4096 x 4096, interleaved,
    /// 2 threads: 9.1 against 10.2 ms for the AVX-512 lanes, without the prefetch; with it,
    /// 7.2 against 8.3 ms.
    pub const AVX2: SoftmaxLanes = SoftmaxLanes {
        max: 32,
        sum: 64,
        exp: 32,
        scale: 16,
    };
}

/// Scheduled `softmax(A[rows, cols], B[rows, cols])` with `fast_exp` (TVM's `fast_softmax`:
/// within 2 ulp of `exp`, a vector polynomial under any target), with AVX-512's lanes
/// ([`softmax_with`]); `cols` must be a multiple of 64.
///
/// # Errors
/// `cols` not a multiple of 64.
pub fn softmax_sized(rows: i64, cols: i64) -> ScheduleResult<PrimFunc> {
    softmax_with(rows, cols, SoftmaxLanes::AVX512)
}

/// Scheduled softmax with the given lanes: rows in parallel; the max and the sum `rfactor`ed
/// into `lanes.max` and `lanes.sum` lanes; the `exp` and the scaling loops vectorized; and in
/// the `exp` loop of row `i` a prefetch of row `i + 1` ([`Schedule::prefetch`]), so that the
/// max pass of the next row, which otherwise waits on memory, finds it in the cache (1.17x on
/// a Zen 3, 2 threads: 7.2 against 8.4 ms). The widths must divide `cols`.
///
/// # Errors
/// A width that does not divide `cols`.
pub fn softmax_with(rows: i64, cols: i64, lanes: SoftmaxLanes) -> ScheduleResult<PrimFunc> {
    let mut s = Schedule::new(softmax_algorithm(rows, cols, Intrinsic::FastExp));
    for (l, f) in [("jm", lanes.max), ("js", lanes.sum)] {
        let (o, i) = s.split(l, f)?;
        s.rfactor(&o, &i)?;
        s.vectorize(&i)?;
    }
    for (l, f) in [("je", lanes.exp), ("jn", lanes.scale)] {
        let (o, i) = s.split(l, f)?;
        s.vectorize(&i)?;
        if l == "je" {
            s.prefetch(&o, "A", "i", 1)?;
        }
    }
    s.parallel("i")?;
    s.finish()
}

/// The benchmark softmax, 4096 x 4096.
///
/// # Errors
/// None in practice.
pub fn softmax() -> ScheduleResult<PrimFunc> {
    softmax_sized(4096, 4096)
}

/// Threads per work-group of the OpenCL kernels (the `opencl` target's default
/// `max_num_threads`).
pub const OPENCL_THREADS: i64 = 256;
/// Rows and columns of `C` per work-group of [`opencl_matmul_sized`] (16 x 16 threads, each a
/// 4 x 4 register tile).
pub const OPENCL_MATMUL_TILE: i64 = 64;
/// The `k` step of [`opencl_matmul_sized`]: `A` (64 x 16) and `B` (16 x 64) tiles in shared
/// memory, 8 KiB.
pub const OPENCL_MATMUL_KTILE: i64 = 16;

/// `vadd(A[n], B[n], C[n])` for the `opencl` target: `i` split by 256, `blockIdx.x` x
/// `threadIdx.x`; the split's guard `i_o * 256 + i_i < n` idles the threads past the end.
///
/// # Errors
/// None in practice.
pub fn opencl_vadd() -> ScheduleResult<PrimFunc> {
    let mut s = Schedule::new(plain::vadd());
    let (bo, ti) = s.split("i", OPENCL_THREADS)?;
    s.bind(&bo, ThreadTag::Block(0))?;
    s.bind(&ti, ThreadTag::Thread(0))?;
    s.finish()
}

/// `matmul(A[m,k], B[k,n], C[m,n])` for the `opencl` target. `m` and `n` must be multiples of
/// [`OPENCL_MATMUL_TILE`], `k` of [`OPENCL_MATMUL_KTILE`]. A work-group (`blockIdx.y`,
/// `blockIdx.x`) computes a 64 x 64 block of `C` with 16 x 16 threads (`threadIdx.y`,
/// `threadIdx.x`), each a 4 x 4 register tile (`cache_write`); `k` advances by 16, the
/// 64 x 16 tile of `A` and the 16 x 64 tile of `B` staged in shared memory
/// (`cache_read_shared`, four elements per thread each).
///
/// # Errors
/// Sizes that are not multiples of the tiles.
pub fn opencl_matmul_sized(m: i64, n: i64, k: i64) -> ScheduleResult<PrimFunc> {
    gpu_matmul(
        "opencl_matmul_sized",
        m,
        n,
        k,
        OPENCL_MATMUL_TILE,
        OPENCL_MATMUL_KTILE,
    )
}

/// Rows and columns of `C` per block of [`cuda_matmul_sized`] (16 x 16 threads, each an 8 x 8
/// register tile: 64 accumulators, well within a CUDA thread's 255 registers).
pub const CUDA_MATMUL_TILE: i64 = 128;
/// The `k` step of [`cuda_matmul_sized`]: `A` (128 x 8) and `B` (8 x 128) tiles in shared
/// memory, 8 KiB.
pub const CUDA_MATMUL_KTILE: i64 = 8;

/// `matmul(A[m,k], B[k,n], C[m,n])` for the `cuda` target: the schedule of
/// [`opencl_matmul_sized`] with the classic CUDA SGEMM blocking, 128 x 128 blocks of `C` per
/// thread block, 16 x 16 threads with 8 x 8 register tiles, `k` by 8. `m` and `n` must be
/// multiples of [`CUDA_MATMUL_TILE`], `k` of [`CUDA_MATMUL_KTILE`].
///
/// # Errors
/// Sizes that are not multiples of the tiles.
pub fn cuda_matmul_sized(m: i64, n: i64, k: i64) -> ScheduleResult<PrimFunc> {
    gpu_matmul(
        "cuda_matmul_sized",
        m,
        n,
        k,
        CUDA_MATMUL_TILE,
        CUDA_MATMUL_KTILE,
    )
}

/// The CUDA benchmark matmul, 1024 x 1024 x 1024.
///
/// # Errors
/// None in practice.
pub fn cuda_matmul() -> ScheduleResult<PrimFunc> {
    cuda_matmul_sized(1024, 1024, 1024)
}

/// A GPU matmul: `tile` x `tile` blocks of `C` per block of 16 x 16 threads, each thread a
/// `tile / 16` square register tile; `k` by `kt`, both input tiles staged in shared memory.
fn gpu_matmul(
    what: &'static str,
    m: i64,
    n: i64,
    k: i64,
    tile: i64,
    kt: i64,
) -> ScheduleResult<PrimFunc> {
    let s = Schedule::new(plain::matmul_sized(m, n, k));
    gpu_matmul_on(s, &MatmulParts::default(), [m, n, k], tile, kt)
        .map_err(|e| match e {
            crate::schedule::ScheduleError::Form {
                func,
                message,
                primitive: "gpu_matmul",
            } => crate::schedule::ScheduleError::Form {
                func,
                primitive: what,
                message,
            },
            e => e,
        })?
        .finish()
}

/// The schedule of [`opencl_matmul_sized`] and [`cuda_matmul_sized`] applied to the matmul
/// `parts` of `s` (in kiln's form: the init beside the `k` loop), of shape `[m, n, k]`: blocks
/// of `tile` x `tile` elements of `C`, 16 x 16 threads each computing a `tile / 16` square
/// register tile, `k` by `kt` with both input tiles staged in shared memory. `m` and `n` must
/// be multiples of `tile` (itself a multiple of 16), `k` of `kt`.
///
/// # Errors
/// Sizes that are not multiples of the tiles; loops or buffers `parts` names that are not
/// there.
pub fn gpu_matmul_on(
    mut s: Schedule,
    parts: &MatmulParts,
    [m, n, k]: [i64; 3],
    tile: i64,
    kt: i64,
) -> ScheduleResult<Schedule> {
    if tile < 16 || tile % 16 != 0 || kt < 1 {
        return Err(s.form(
            "gpu_matmul",
            format!("needs a tile that is a multiple of 16 and a k step of 1 or more, found {tile} and {kt}"),
        ));
    }
    if m % tile != 0 || n % tile != 0 || k % kt != 0 {
        return Err(s.form(
            "gpu_matmul",
            format!("needs m and n multiples of {tile} and k of {kt}, found {m} x {n} x {k}"),
        ));
    }
    let r = tile / 16;
    let (io, ii) = s.split(&parts.i, tile)?;
    let (ty, ri) = s.split(&ii, r)?;
    let (jo, ji) = s.split(&parts.j, tile)?;
    let (tx, ci) = s.split(&ji, r)?;
    s.reorder(&[&io, &jo, &ty, &tx, &ri, &ci])?;
    s.bind(&io, ThreadTag::Block(1))?;
    s.bind(&jo, ThreadTag::Block(0))?;
    s.bind(&ty, ThreadTag::Thread(1))?;
    s.bind(&tx, ThreadTag::Thread(0))?;
    // The thread's register tile of C over the whole k loop.
    s.cache_write(&parts.c, &tx)?;
    let c_loops = s.fission(&ci)?;
    let r_loops = s.fission(&ri)?;
    s.reorder(&[&parts.k, &r_loops[1], &c_loops[1]])?;
    let (ko, _ki) = s.split(&parts.k, kt)?;
    s.cache_read_shared(&parts.a, &ko)?;
    s.cache_read_shared(&parts.b, &ko)?;
    // The register tile unrolled (so it stays in registers); the steps over the shared tiles
    // are not: on PoCL (Intel Xeon, AVX-512) unrolling them too made the kernel 1.2x slower
    // (140 vs 115 ms), the work-item loops PoCL builds around the body vectorizing worse.
    for l in r_loops.iter().chain(&c_loops) {
        s.unroll(l)?;
    }
    Ok(s)
}

/// `vadd` for the `cuda` target: the schedule of [`opencl_vadd`] (256 threads per block).
///
/// # Errors
/// None in practice.
pub fn cuda_vadd() -> ScheduleResult<PrimFunc> {
    opencl_vadd()
}

/// `rowsum` for the `cuda` target: the schedule of [`opencl_rowsum_sized`] (a block of 256
/// threads per row, a tree reduction in shared memory), 4096 x 4096.
///
/// # Errors
/// None in practice.
pub fn cuda_rowsum() -> ScheduleResult<PrimFunc> {
    opencl_rowsum_sized(4096, 4096)
}

/// `softmax` for the `cuda` target: the schedule of [`opencl_softmax_sized`], 4096 x 4096;
/// its `exp` is libdevice's `__nv_expf`.
///
/// # Errors
/// None in practice.
pub fn cuda_softmax() -> ScheduleResult<PrimFunc> {
    opencl_softmax_sized(4096, 4096)
}

/// The OpenCL benchmark matmul, 1024 x 1024 x 1024.
///
/// # Errors
/// None in practice.
pub fn opencl_matmul() -> ScheduleResult<PrimFunc> {
    opencl_matmul_sized(1024, 1024, 1024)
}

/// `rowsum(A[rows, cols], B[rows])` for the `opencl` target; `cols` must be a multiple of 256.
/// One work-group per row (`blockIdx.x`), 256 threads: thread `t` sums the columns `t, t + 256,
/// ...` (coalesced), then a tree reduction in shared memory (`block_reduce`); thread 0 writes
/// `B[i]`.
///
/// # Errors
/// `cols` not a multiple of 256.
pub fn opencl_rowsum_sized(rows: i64, cols: i64) -> ScheduleResult<PrimFunc> {
    let mut s = Schedule::new(plain::rowsum_sized(rows, cols));
    s.bind("i", ThreadTag::Block(0))?;
    let (ko, ki) = split_exact(&mut s, "k0", cols)?;
    s.block_reduce(&ko, &ki)?;
    s.finish()
}

/// The OpenCL benchmark rowsum, 4096 x 4096.
///
/// # Errors
/// None in practice.
pub fn opencl_rowsum() -> ScheduleResult<PrimFunc> {
    opencl_rowsum_sized(4096, 4096)
}

fn split_exact(s: &mut Schedule, l: &str, extent: i64) -> ScheduleResult<(String, String)> {
    if extent % OPENCL_THREADS != 0 {
        return Err(s.form(
            "split",
            format!("needs loop `{l}`'s extent {extent} to be a multiple of {OPENCL_THREADS}"),
        ));
    }
    s.split(l, OPENCL_THREADS)
}

/// `softmax(A[rows, cols], B[rows, cols])` for the `opencl` target ([`softmax_algorithm`]);
/// `cols` must be a multiple of 256. One work-group per row (`blockIdx.x`), 256 threads; the
/// row max and the sum are `block_reduce`s (every thread gets the result: `maxv` and `sum` are
/// per-thread `local`s), `exp` and the scaling have thread `t` on columns `t, t + 256, ...`, so
/// each thread reads back only what it wrote.
///
/// # Errors
/// `cols` not a multiple of 256.
pub fn opencl_softmax_sized(rows: i64, cols: i64) -> ScheduleResult<PrimFunc> {
    let mut s = Schedule::new(softmax_algorithm(rows, cols, Intrinsic::Exp));
    s.bind("i", ThreadTag::Block(0))?;
    for l in ["jm", "js"] {
        let (o, i) = split_exact(&mut s, l, cols)?;
        s.block_reduce(&o, &i)?;
    }
    for l in ["je", "jn"] {
        let (_, i) = split_exact(&mut s, l, cols)?;
        s.bind(&i, ThreadTag::Thread(0))?;
    }
    s.finish()
}

/// The OpenCL benchmark softmax, 4096 x 4096.
///
/// # Errors
/// None in practice.
pub fn opencl_softmax() -> ScheduleResult<PrimFunc> {
    opencl_softmax_sized(4096, 4096)
}
