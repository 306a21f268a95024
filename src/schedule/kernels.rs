//! The benchmark kernels with their fast schedules (`examples/kernels/*.json` are these at the
//! benchmark sizes; `KILN_BLESS=1 cargo test --test schedule` rewrites them).
//!
//! They expect the target `{"kind": "llvm", "mcpu": "native", "fast-math": true}`: fast math
//! lets LLVM contract `a * b + c` into FMAs and gives `exp` the vector polynomial. They are
//! correct on any target and for any input alignment (vector loads and stores only assume the
//! element alignment).
//!
//! | kernel | schedule |
//! |---|---|
//! | `vadd` | one parallel loop (each thread a contiguous chunk, vectorized by LLVM) |
//! | `matmul` | `B` packed into 32-column panels; `i` tiled 64 x 8, `j` by 32; the 8 x 32 block of `C` accumulated in registers (`cache_write`) over the whole `k` loop, rows unrolled, columns vectorized; row blocks in parallel |
//! | `rowsum` | reduction split by 64 and `rfactor`ed into 64 vector lanes; rows in parallel |
//! | `softmax` | rows in parallel; max and sum reductions `rfactor`ed into 64 lanes; `exp` and the scaling vectorized by 16 |

use super::{AxisMap, Schedule, ScheduleResult};
use crate::ir::builder::{exp, for_range, Reducer};
use crate::ir::kernels as plain;
use crate::ir::{Buffer, DataType, Expr, ForKind, Param, PrimFunc, Stmt, StorageScope};

/// Rows of `C` per register block of `matmul`.
pub const MATMUL_MR: i64 = 8;
/// Columns of `C` per register block of `matmul` (two 16-lane vectors).
pub const MATMUL_NR: i64 = 32;
/// Rows per parallel task block of `matmul` (an L2-sized block of `A`).
pub const MATMUL_MB: i64 = 64;

/// Scheduled `vadd(A[n], B[n], C[n])`.
///
/// # Errors
/// None in practice (the schedule fits the kernel).
pub fn vadd() -> ScheduleResult<PrimFunc> {
    let mut s = Schedule::new(plain::vadd());
    s.parallel("i")?;
    s.finish()
}

/// Scheduled `matmul(A[m,k], B[k,n], C[m,n])`; `n` must be a multiple of [`MATMUL_NR`] (other
/// `m` and `k` are fine).
///
/// # Errors
/// `n` not a multiple of [`MATMUL_NR`].
pub fn matmul_sized(m: i64, n: i64, k: i64) -> ScheduleResult<PrimFunc> {
    let mut s = Schedule::new(plain::matmul_sized(m, n, k));
    let nr = MATMUL_NR;
    // Bp[n / nr, k, n % nr]: each register block reads one contiguous k x nr panel.
    let fill = s.transform_layout(
        "B",
        "Bp",
        &[AxisMap::outer(1, nr), AxisMap::id(0), AxisMap::inner(1, nr)],
    )?;
    // Fill one panel row (nr contiguous floats of B into nr contiguous floats of Bp) at a time,
    // eight panels per row of B: eight write streams (of 32 if a whole row of B went at once,
    // all mapping to the same cache sets, the panels being 128 KiB apart), and each thread
    // fills whole panels.
    let (fill_o, fill_j) = s.split(&fill[1], nr)?;
    s.vectorize(&fill_j)?;
    let (fill_oo, fill_oi) = s.split(&fill_o, 8.min(n / nr))?;
    s.reorder(&[&fill_oo, &fill[0], &fill_oi, &fill_j])?;
    s.parallel(&fill_oo)?;
    let (io, ii) = s.split("i", MATMUL_MB.min(m))?;
    let (it, ir) = s.split(&ii, MATMUL_MR)?;
    let (jo, ji) = s.split("j", nr)?;
    s.reorder(&[&io, &jo, &it, &ir, &ji])?;
    s.parallel(&io)?;
    s.cache_write("C", &it)?;
    // Separate the zeroing of the accumulators from the k loop, then move k outside the block.
    let j_loops = s.fission(&ji)?;
    let i_loops = s.fission(&ir)?;
    s.reorder(&["k0", &i_loops[1], &j_loops[1]])?;
    for l in &i_loops {
        s.unroll(l)?;
    }
    for l in &j_loops {
        s.vectorize(l)?;
    }
    s.finish()
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

/// The softmax algorithm the schedule starts from: per row, a max reduction, `exp` of the
/// shifted row, a sum reduction, and a scaling by the sum's reciprocal. Loops `i`, `jm`, `je`,
/// `js`, `jn`.
pub fn softmax_algorithm(rows: i64, cols: i64) -> PrimFunc {
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
                b.store(at(&j), exp(a.load(at(&j)) - maxv.load(&z)))
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

/// Scheduled `softmax(A[rows, cols], B[rows, cols])`; `cols` must be a multiple of 64.
///
/// # Errors
/// `cols` not a multiple of 64.
pub fn softmax_sized(rows: i64, cols: i64) -> ScheduleResult<PrimFunc> {
    let mut s = Schedule::new(softmax_algorithm(rows, cols));
    for (l, f) in [("jm", 64), ("js", 64)] {
        let (o, i) = s.split(l, f)?;
        s.rfactor(&o, &i)?;
        s.vectorize(&i)?;
    }
    for l in ["je", "jn"] {
        let (_, i) = s.split(l, 16)?;
        s.vectorize(&i)?;
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
