//! Copy nests as one `memcpy`: a nest of loops whose only statement copies a buffer's element
//! into another's, where both sides walk a contiguous region in the nest's order, is emitted as
//! one call of `llvm.memcpy` of the whole region.
//!
//! A reshape lowered from TVM is such a nest (`T[a, b, x] = X[a / 2, a % 2 * 4 + b, x / 16, x
//! % 16]`, offsets `(a * 4 + b) * 256 + x` on both sides once `codegen::index` has merged its
//! dimensions). LLVM would vectorize the innermost loop and unroll the others fully: 512 pairs
//! of vector loads and stores for 16 KiB, against one call of the C library's `memcpy` in TVM's
//! build, which LLVM's loop-idiom pass makes of the same loops (0.35 against 0.29 us on an
//! AVX-512 Xeon). kiln turns that pass off for copies (`llvm/mod.rs`: a transpose's rows as
//! many small `memcpy`s, expanded inline, made instruction selection quadratic), so the rule
//! here is narrower than the pass's: the whole nest, at least [`COPY_MIN_BYTES`], one call.
//! LLVM expands no call of that size inline.
//!
//! The rule, checked on the IR:
//! - serial, vectorized or unrolled loops, each the only statement of the one outside it, from
//!   constant 0 to a constant extent; the innermost body one store whose value is one load;
//! - the same element type on both sides (whole bytes, one lane), two different buffers of a
//!   `noalias` function (so the regions cannot overlap), both compact (no strides), the
//!   destination not a streamed output (`streaming.rs` has those);
//! - indices of variables and constants only (no load, no call);
//! - on each side the flat offset is affine in the loops, with the coefficients of a row-major
//!   walk of the nest: 1 for the innermost loop, its extent for the next, and so on.
//!
//! The addresses of the region's first elements are the accesses' addresses with every loop
//! variable 0, computed as any access is ([`Emitter::address`]).

use std::borrow::Cow;

use crate::ir::{BinOp, Buffer, DataType, Expr, ForKind, Stmt, TypeCode, Var};

use super::streaming::below_threshold;
use super::vector::lane_coef;
use super::{mem_ty, reg_ty, Emitter, Val, R};

/// The fewest bytes a copy nest must move to become a `memcpy`: a smaller one stays loops,
/// which LLVM vectorizes (and a small `memcpy` LLVM would expand inline anyway).
pub(super) const COPY_MIN_BYTES: i64 = 1024;

/// Loops around one element copy ([`Emitter::element_copy`]): the loops (outermost first) with
/// their extents, and the two accesses.
pub(super) struct ElementCopy<'s> {
    pub(super) loops: Vec<(&'s Var, i64)>,
    pub(super) dst: (&'s Buffer, &'s [Expr]),
    pub(super) src: (&'s Buffer, &'s [Expr]),
}

/// A copy nest: its loops (outermost first) and the two accesses.
struct CopyNest<'s> {
    loops: Vec<&'s Var>,
    dst: (&'s Buffer, &'s [Expr]),
    src: (&'s Buffer, &'s [Expr]),
    bytes: i64,
}

/// The flat element offset of `indices` into the compact `buffer` as one expression (64-bit),
/// with the dimensions `codegen::index` merges merged.
pub(super) fn flat_offset(buffer: &Buffer, indices: &[Expr]) -> Expr {
    let wide = |e: Cow<'_, Expr>| -> Expr {
        if let Some(c) = e.as_int() {
            return Expr::from(c);
        }
        let e = e.into_owned();
        if e.dtype() == DataType::i64() {
            e
        } else {
            Expr::Cast {
                dtype: DataType::i64(),
                value: Box::new(e),
                saturate: true,
            }
        }
    };
    let mut off: Option<Expr> = None;
    for dim in crate::codegen::index::contiguous_dims(indices, &buffer.shape) {
        let index = wide(dim.index);
        off = Some(match off {
            None => index,
            Some(mut o) => {
                for e in &dim.extents {
                    o = Expr::binary(BinOp::Mul, o, wide(Cow::Borrowed(*e)));
                }
                Expr::binary(BinOp::Add, o, index)
            }
        });
    }
    off.unwrap_or_else(|| Expr::from(0i64))
}

/// Whether `e` is arithmetic of variables and constants only: no load (which the copy could
/// change, or a `memcpy` read once where the loop read it per element) and no call.
fn arithmetic(e: &Expr) -> bool {
    match e {
        Expr::IntImm { .. } | Expr::Var(_) => true,
        Expr::Binary { a, b, .. } => arithmetic(a) && arithmetic(b),
        Expr::Cast { value, .. } => arithmetic(value),
        _ => false,
    }
}

/// Whether `dtype` is copied byte for byte by a `memcpy` of `bytes()` per element.
fn plain_bytes(dtype: DataType) -> bool {
    dtype.lanes == 1
        && dtype.bits % 8 == 0
        && dtype.bits > 0
        && matches!(
            dtype.code,
            TypeCode::Int | TypeCode::UInt | TypeCode::Float | TypeCode::BFloat
        )
}

impl Emitter<'_> {
    /// Whether stores to `dst` may take the streaming form (`streaming.rs`): an output of the
    /// function that is not known to be smaller than the threshold.
    fn may_stream(&self, dst: &Buffer) -> bool {
        if !self.m.stream_bufs.contains(&dst.data.id) {
            return false;
        }
        self.opts
            .stream_store_bytes
            .is_some_and(|threshold| !below_threshold(dst, threshold))
    }

    /// `s` as loops around one element copy, if it is one: serial, vectorized or unrolled
    /// loops, each the only statement of the one outside it, from 0 to constant extents, around
    /// `dst[..] = src[..]` of the same element type between two different compact buffers of
    /// a host function whose buffers do not alias, indexed by variables and constants, the
    /// destination not a streamed output. The shape both the `memcpy` rule (here) and the
    /// register-tile transpose (`transpose.rs`) start from.
    pub(super) fn element_copy<'s>(&self, s: &'s Stmt) -> Option<ElementCopy<'s>> {
        if self.opts.nvptx || !self.noalias {
            return None;
        }
        let mut loops: Vec<(&Var, i64)> = Vec::new();
        let mut cur = s;
        while let Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } = cur
        {
            if !matches!(
                kind,
                ForKind::Serial | ForKind::Vectorized | ForKind::Unrolled
            ) || min.as_int() != Some(0)
            {
                return None;
            }
            loops.push((var, extent.as_int().filter(|&e| e >= 1)?));
            cur = body;
        }
        let Stmt::Store {
            buffer: dst,
            indices: di,
            value:
                Expr::Load {
                    buffer: src,
                    indices: si,
                },
        } = cur
        else {
            return None;
        };
        if loops.is_empty()
            || dst.dtype != src.dtype
            || dst.data.id == src.data.id
            || dst.strides.is_some()
            || src.strides.is_some()
            || self.may_stream(dst)
            || !di.iter().chain(si.iter()).all(arithmetic)
        {
            return None;
        }
        Some(ElementCopy {
            loops,
            dst: (dst, di),
            src: (src, si),
        })
    }

    /// `s` as a copy nest, if it is one (the module docs have the rule).
    fn copy_nest<'s>(&self, s: &'s Stmt) -> Option<CopyNest<'s>> {
        let ElementCopy { loops, dst, src } = self.element_copy(s)?;
        if !plain_bytes(dst.0.dtype) {
            return None;
        }
        let (dst, di) = dst;
        let (src, si) = src;
        let elems = loops.iter().try_fold(1i64, |p, &(_, e)| p.checked_mul(e))?;
        let bytes = elems.checked_mul(dst.dtype.bytes() as i64)?;
        if bytes < COPY_MIN_BYTES {
            return None;
        }
        for (buffer, indices) in [(dst, di), (src, si)] {
            let flat = flat_offset(buffer, indices);
            let mut stride = 1i64;
            for &(var, extent) in loops.iter().rev() {
                if extent > 1 && lane_coef(&flat, var.id) != Some(stride) {
                    return None;
                }
                stride = stride.checked_mul(extent)?;
            }
        }
        Some(CopyNest {
            loops: loops.into_iter().map(|(v, _)| v).collect(),
            dst: (dst, di),
            src: (src, si),
            bytes,
        })
    }

    /// Emits `s` as one `memcpy` when it is a copy nest; `false` (nothing emitted) otherwise.
    pub(super) fn copy_loop(&mut self, s: &Stmt) -> R<bool> {
        let Some(c) = self.copy_nest(s) else {
            return Ok(false);
        };
        // The first elements: the accesses with every loop variable 0.
        let zeros: Vec<(&Var, Val)> = c
            .loops
            .iter()
            .map(|v| (*v, Val::new(reg_ty(v.dtype), "0")))
            .collect();
        let dst = self.address_at(c.dst.0, c.dst.1, &zeros)?;
        let src = self.address_at(c.src.0, c.src.1, &zeros)?;
        let mt = mem_ty(c.dst.0.dtype);
        let pt = Self::ptr(&mt);
        let d8 = self.assign("i8*", format!("bitcast {pt} {dst} to i8*"));
        let s8 = self.assign("i8*", format!("bitcast {pt} {src} to i8*"));
        self.m
            .declares
            .insert("declare void @llvm.memcpy.p0i8.p0i8.i64(i8* noalias nocapture writeonly, i8* noalias nocapture readonly, i64, i1 immarg)".into());
        self.line(format!(
            "call void @llvm.memcpy.p0i8.p0i8.i64(i8* align {a} {}, i8* align {a} {}, i64 {}, i1 false)",
            d8.v,
            s8.v,
            c.bytes,
            a = c.dst.0.dtype.bytes().max(1)
        ));
        Ok(true)
    }
}
