//! Prefetches ([`Stmt::Prefetch`](crate::ir::Stmt::Prefetch)): `llvm.prefetch` of an element's
//! address, for reading, kept in every cache level (`prefetcht0` on x86, `prfm pldl1keep` on
//! AArch64).
//!
//! A prefetch is a hint that never faults, and the IR lets it name an element that does not
//! exist (the row after the last). Its address is therefore computed without `nsw` and
//! `inbounds` ([`Emitter::address_with`]): out of the buffer it is a plain address, never
//! poison. In a vectorized loop the lanes of a contiguous access share cache lines, so the
//! lanes' bytes get one prefetch per 64 bytes from the first lane's address (a 32-float vector:
//! two); lanes that are not contiguous get one each. NVPTX kernels and device memory seen from
//! the host get none.

use crate::ir::{Buffer, Expr, StorageScope, Var};

use super::vector::{lane_coef, unit_stride};
use super::{mem_ty, Emitter, Val, R};

/// Bytes one prefetch brings in: a cache line on every CPU kiln targets.
const LINE_BYTES: i64 = 64;

const DECLARE: &str =
    "declare void @llvm.prefetch.p0i8(i8* nocapture readonly, i32 immarg, i32 immarg, i32 immarg)";

impl Emitter<'_> {
    /// Whether a prefetch of `buffer` is emitted here at all.
    fn prefetches(&self, buffer: &Buffer) -> bool {
        let device_memory = self.opts.device_host
            && matches!(buffer.scope, StorageScope::Global | StorageScope::Workspace);
        !(self.opts.nvptx || device_memory)
    }

    /// `llvm.prefetch` of `addr` (an element pointer of `buffer`) plus `bytes`.
    fn prefetch_at(&mut self, buffer: &Buffer, addr: &str, bytes: i64) {
        let mt = mem_ty(buffer.dtype);
        let p = self.assign("i8*", format!("bitcast {} {addr} to i8*", Self::ptr(&mt)));
        let p = if bytes == 0 {
            p
        } else {
            self.assign("i8*", format!("getelementptr i8, i8* {}, i64 {bytes}", p.v))
        };
        self.m.declares.insert(DECLARE.into());
        // Read (0), keep in all levels (3), data cache (1).
        self.line(format!(
            "call void @llvm.prefetch.p0i8(i8* {}, i32 0, i32 3, i32 1)",
            p.v
        ));
    }

    /// A prefetch in scalar code.
    pub(super) fn prefetch(&mut self, buffer: &Buffer, indices: &[Expr]) -> R<()> {
        if !self.prefetches(buffer) {
            return Ok(());
        }
        let a = self.address_with(buffer, indices, false)?;
        self.prefetch_at(buffer, &a, 0);
        Ok(())
    }

    /// A prefetch for lanes `lo .. lo + n` of `var`.
    pub(super) fn vprefetch(
        &mut self,
        var: &Var,
        lo: &Val,
        n: i64,
        buffer: &Buffer,
        indices: &[Expr],
    ) -> R<()> {
        if !self.prefetches(buffer) {
            return Ok(());
        }
        let unit = unit_stride(buffer, indices, var.id);
        let uniform = indices.iter().all(|i| lane_coef(i, var.id) == Some(0));
        if unit || uniform {
            let a = self.address_with_at(buffer, indices, false, &[(var, lo.clone())])?;
            // The lanes' bytes, one prefetch per line; a uniform address, one.
            let lines = if unit {
                (n * buffer.dtype.bytes() as i64 + LINE_BYTES - 1) / LINE_BYTES
            } else {
                1
            };
            for k in 0..lines {
                self.prefetch_at(buffer, &a, k * LINE_BYTES);
            }
            return Ok(());
        }
        for l in 0..n {
            let i = self.lane_value(var, lo, l);
            let a = self.address_with_at(buffer, indices, false, &[(var, i)])?;
            self.prefetch_at(buffer, &a, 0);
        }
        Ok(())
    }
}
