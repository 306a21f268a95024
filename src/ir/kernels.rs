//! Reference kernels built with the [`builder`](super::builder): the benchmark set
//! (`examples/kernels/*.json` are these functions at their benchmark sizes) and a 2-D convolution.
//! All are float32, plain loop nests (no schedule), with `noalias` set.

use super::builder::{compute, exp, for_range, int, reduce, size_var, Reducer};
use super::dtype::DataType;
use super::expr::Expr;
use super::func::{Buffer, Param, PrimFunc, StorageScope};
use super::stmt::{ForKind, Stmt};

fn dims(d: &[i64]) -> Vec<Expr> {
    d.iter().map(|v| Expr::from(*v)).collect()
}

fn f32_buffer(name: &str, shape: &[i64]) -> Buffer {
    Buffer::new(name, DataType::f32(), dims(shape))
}

fn func(name: &str, bufs: Vec<Buffer>, body: Stmt) -> PrimFunc {
    PrimFunc::new(name, bufs.into_iter().map(Param::Buffer).collect(), body).with_noalias(true)
}

/// `vadd(A[n], B[n], C[n])`: `C = A + B`, `n` symbolic (`int64`).
pub fn vadd() -> PrimFunc {
    let n = size_var("n");
    let buf = |name| Buffer::new(name, DataType::f32(), vec![Expr::from(&n)]);
    let (a, b, c) = (buf("A"), buf("B"), buf("C"));
    let body = compute(&c, |i| a.load(i) + b.load(i));
    func("vadd", vec![a, b, c], body)
}

/// `matmul(A[m,k], B[k,n], C[m,n])`: `C = A @ B`.
pub fn matmul_sized(m: i64, n: i64, k: i64) -> PrimFunc {
    let a = f32_buffer("A", &[m, k]);
    let b = f32_buffer("B", &[k, n]);
    let c = f32_buffer("C", &[m, n]);
    let body = reduce(&c, Reducer::Sum, &dims(&[k]), |ix, r| {
        a.load(&[ix[0].clone(), r[0].clone()]) * b.load(&[r[0].clone(), ix[1].clone()])
    });
    func("matmul", vec![a, b, c], body)
}

/// `matmul(A[m,k], B[k,n], C[m,n])` in the form TVM 0.27's lowering gives `te.compute` with
/// `te.sum` (what `kiln.to_kiln` converts): `int32` loops `i, j, k`, and the reduction's
/// initialization inside the reduction loop, `if k == 0 { C[i, j] = 0 }`.
pub fn matmul_tvm_form(m: i64, n: i64, k: i64) -> PrimFunc {
    let a = f32_buffer("A", &[m, k]);
    let b = f32_buffer("B", &[k, n]);
    let c = f32_buffer("C", &[m, n]);
    let i32t = DataType::i32();
    let body = for_range("i", int(i32t, m), ForKind::Serial, |i| {
        for_range("j", int(i32t, n), ForKind::Serial, |j| {
            for_range("k", int(i32t, k), ForKind::Serial, |r| {
                let ij = [i.clone(), j.clone()];
                Stmt::Seq(vec![
                    Stmt::IfThenElse {
                        cond: r.clone().eq_(int(i32t, 0)),
                        then_case: Box::new(c.store(ij.clone(), 0.0f32)),
                        else_case: None,
                    },
                    c.store(
                        ij.clone(),
                        c.load(ij) + a.load([i.clone(), r.clone()]) * b.load([r, j.clone()]),
                    ),
                ])
            })
        })
    });
    func("matmul", vec![a, b, c], body)
}

/// The benchmark matmul: 1024 x 1024 x 1024.
pub fn matmul() -> PrimFunc {
    matmul_sized(1024, 1024, 1024)
}

/// `rowsum(A[rows, cols], B[rows])`: `B[i] = sum_j A[i, j]`.
pub fn rowsum_sized(rows: i64, cols: i64) -> PrimFunc {
    let a = f32_buffer("A", &[rows, cols]);
    let b = f32_buffer("B", &[rows]);
    let body = reduce(&b, Reducer::Sum, &dims(&[cols]), |ix, r| {
        a.load(&[ix[0].clone(), r[0].clone()])
    });
    func("rowsum", vec![a, b], body)
}

/// The benchmark rowsum: 4096 x 4096.
pub fn rowsum() -> PrimFunc {
    rowsum_sized(4096, 4096)
}

/// `softmax(A[rows, cols], B[rows, cols])`, row-wise and max-subtracted, with two `local`
/// one-element temporaries per row (running max and sum).
pub fn softmax_sized(rows: i64, cols: i64) -> PrimFunc {
    let a = f32_buffer("A", &[rows, cols]);
    let b = f32_buffer("B", &[rows, cols]);
    let f32t = DataType::f32();
    let body = for_range("i", Expr::from(rows), ForKind::Serial, |i| {
        let maxv = Buffer::temp("maxv", f32t, dims(&[1]), StorageScope::Local);
        let sum = Buffer::temp("sum", f32t, dims(&[1]), StorageScope::Local);
        let z = [Expr::from(0i64)];
        let at = |j: &Expr| [i.clone(), j.clone()];
        let body = Stmt::Seq(vec![
            maxv.store(&z, Reducer::Max.init(f32t)),
            for_range("j", Expr::from(cols), ForKind::Serial, |j| {
                maxv.store(&z, maxv.load(&z).max(a.load(at(&j))))
            }),
            sum.store(&z, 0.0f32),
            for_range("j", Expr::from(cols), ForKind::Serial, |j| {
                Stmt::Seq(vec![
                    b.store(at(&j), exp(a.load(at(&j)) - maxv.load(&z))),
                    sum.store(&z, sum.load(&z) + b.load(at(&j))),
                ])
            }),
            for_range("j", Expr::from(cols), ForKind::Serial, |j| {
                b.store(at(&j), b.load(at(&j)) / sum.load(&z))
            }),
        ]);
        maxv.allocate(sum.allocate(body))
    });
    func("softmax", vec![a, b], body)
}

/// The benchmark softmax: 4096 x 4096.
pub fn softmax() -> PrimFunc {
    softmax_sized(4096, 4096)
}

/// `conv2d(I[n, c, h, w], W[k, c, r, s], O[n, k, h-r+1, w-s+1])`: NCHW, stride 1, no padding.
pub fn conv2d(n: i64, c: i64, h: i64, w: i64, k: i64, r: i64, s: i64) -> PrimFunc {
    let input = f32_buffer("I", &[n, c, h, w]);
    let weight = f32_buffer("W", &[k, c, r, s]);
    let out = f32_buffer("O", &[n, k, h - r + 1, w - s + 1]);
    let body = reduce(&out, Reducer::Sum, &dims(&[c, r, s]), |o, red| {
        let (b, oc, y, x) = (&o[0], &o[1], &o[2], &o[3]);
        let (ic, dy, dx) = (&red[0], &red[1], &red[2]);
        input.load(&[b.clone(), ic.clone(), y + dy, x + dx])
            * weight.load(&[oc.clone(), ic.clone(), dy.clone(), dx.clone()])
    });
    func("conv2d", vec![input, weight, out], body)
}
