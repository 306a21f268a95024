//! Streaming stores (`stream.rs` of the backend has the rule): a loop whose only store writes
//! a streamed output contiguously is emitted as a scalar head up to the output's first 64-byte
//! boundary, 64-byte vector steps with non-temporal aligned stores, a scalar tail, and an
//! `sfence`.

use std::collections::{BTreeSet, HashSet};

use crate::ir::{Buffer, Expr, Stmt, TypeCode, Var, VarId};

use super::parallel::collect_vars;
use super::vector::{unit_stride, vec_body_ok};
use super::{mem_ty, reg_ty, Emitter, Val, R};

/// Bytes per vector store of a streaming loop, and their alignment: one cache line.
pub(super) const STREAM_ALIGN: i64 = 64;
/// Loops of a constant extent that write fewer bytes than this (or than the threshold, if it is
/// smaller) are not streamed: at most 64 bytes of scalar head and tail against at least 448
/// bytes of vector steps.
const STREAM_MIN_LOOP_BYTES: i64 = 8 * STREAM_ALIGN;

/// The number of stores in `s`.
fn count_stores(s: &Stmt) -> usize {
    match s {
        Stmt::Seq(v) => v.iter().map(count_stores).sum(),
        Stmt::Let { body, .. } | Stmt::Allocate { body, .. } | Stmt::For { body, .. } => {
            count_stores(body)
        }
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => count_stores(then_case) + else_case.as_deref().map_or(0, count_stores),
        Stmt::Store { .. } => 1,
        // A store in a `while` may run any number of times: never one store.
        Stmt::While { body, .. } => count_stores(body).saturating_mul(2),
        _ => 0,
    }
}

/// The stores in `s` (through sequences, lets and conditions) to buffers in `bufs` whose
/// address moves by one element per step of `id` (last index coefficient 1, others 0).
fn stream_stores<'s>(s: &'s Stmt, id: VarId, bufs: &HashSet<VarId>, out: &mut Vec<&'s Stmt>) {
    match s {
        Stmt::Seq(v) => v.iter().for_each(|s| stream_stores(s, id, bufs, out)),
        Stmt::Let { body, .. } => stream_stores(body, id, bufs, out),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => {
            stream_stores(then_case, id, bufs, out);
            if let Some(e) = else_case {
                stream_stores(e, id, bufs, out);
            }
        }
        Stmt::Store {
            buffer, indices, ..
        } if bufs.contains(&buffer.data.id) && unit_stride(buffer, indices, id) => out.push(s),
        _ => {}
    }
}

/// Whether `buffer` has a constant size below `threshold` bytes: an output that never streams.
pub(super) fn below_threshold(buffer: &Buffer, threshold: u64) -> bool {
    buffer
        .const_numel()
        .and_then(|n| n.checked_mul(buffer.dtype.bytes() as i64))
        .is_some_and(|b| (b.max(0) as u64) < threshold)
}

impl Emitter<'_> {
    /// The streamed store of a loop over `var` with `body`, if the loop gets the streaming form.
    pub(super) fn stream_store(
        &self,
        var: &Var,
        body: &Stmt,
        extent: Option<i64>,
    ) -> Option<(Buffer, Vec<Expr>)> {
        let threshold = self.opts.stream_store_bytes?;
        if self.opts.device_host
            || self.m.stream_bufs.is_empty()
            || var.dtype.code != TypeCode::Int
            || !vec_body_ok(body, var.id)
        {
            return None;
        }
        let mut found = Vec::new();
        stream_stores(body, var.id, &self.m.stream_bufs, &mut found);
        // The streamed store must be the body's only store: then no iteration reads what
        // another wrote (the output is never read), and computing the iterations out of order
        // and 16 at a time gives what the serial loop gives.
        let Some(Stmt::Store {
            buffer, indices, ..
        }) = found.first()
        else {
            return None;
        };
        if count_stores(body) != 1 {
            return None;
        }
        // A short loop of known length (rows of a narrow output) would run mostly in the scalar
        // head and tail: left to LLVM's vectorizer.
        let min_bytes = STREAM_MIN_LOOP_BYTES.min(threshold.min(i64::MAX as u64) as i64);
        if extent.is_some_and(|e| e.saturating_mul(buffer.dtype.bytes() as i64) < min_bytes) {
            return None;
        }
        // Its address is computed before the loop (to align it): only variables bound outside
        // the body, and the loop variable, may appear in it.
        let mut used = BTreeSet::new();
        for i in indices {
            collect_vars(&Stmt::Evaluate(i.clone()), &mut used);
        }
        if !used
            .iter()
            .all(|id| *id == var.id || self.vars.contains_key(id))
        {
            return None;
        }
        // A constant size below the threshold never streams.
        if below_threshold(buffer, threshold) {
            return None;
        }
        Some(((*buffer).clone(), indices.clone()))
    }

    /// The loop in streaming form; when the output's shape is symbolic, its vector part has two
    /// forms, with and without non-temporal stores, chosen by the output's size at run time
    /// (two simple vector loops compile in less time than the loop LLVM would vectorize).
    pub(super) fn stream_loop(
        &mut self,
        var: &Var,
        lo: Val,
        end: Val,
        body: &Stmt,
        buffer: &Buffer,
        indices: &[Expr],
    ) -> R<()> {
        let threshold = self
            .opts
            .stream_store_bytes
            .unwrap_or(0)
            .min(i64::MAX as u64);
        if buffer.shape.iter().all(|d| d.as_int().is_some()) {
            return self.stream_body(var, lo, end, body, buffer, indices, None);
        }
        let mut bytes = Val::new("i64", buffer.dtype.bytes().to_string());
        for d in &buffer.shape {
            let x = self.index64(d)?;
            bytes = self.assign("i64", format!("mul i64 {}, {}", bytes.v, x.v));
        }
        let big = self.assign("i1", format!("icmp sge i64 {}, {threshold}", bytes.v));
        self.stream_body(var, lo, end, body, buffer, indices, Some(big))
    }

    /// From the output's first 64-byte boundary, vector steps of 64 bytes with non-temporal
    /// aligned stores (with `big`: where it is true; ordinary stores otherwise); then the
    /// iterations before that boundary and after the last whole step in one scalar loop; then
    /// an `sfence`.
    #[allow(clippy::too_many_arguments)]
    fn stream_body(
        &mut self,
        var: &Var,
        lo: Val,
        end: Val,
        body: &Stmt,
        buffer: &Buffer,
        indices: &[Expr],
        big: Option<Val>,
    ) -> R<()> {
        let elem = buffer.dtype.bytes().max(1) as i64;
        let lanes = STREAM_ALIGN / elem;
        let lo64 = self.widen64(var.dtype, lo.clone());
        let end64 = self.widen64(var.dtype, end.clone());
        let ext0 = self.assign("i64", format!("sub i64 {}, {}", end64.v, lo64.v));
        let neg = self.assign("i1", format!("icmp slt i64 {}, 0", ext0.v));
        let ext = self.assign("i64", format!("select i1 {}, i64 0, i64 {}", neg.v, ext0.v));
        // The address of the first iteration's store.
        let addr = self.address_at(buffer, indices, &[(var, lo.clone())])?;
        let mt = mem_ty(buffer.dtype);
        let a = self.assign("i64", format!("ptrtoint {mt}* {addr} to i64"));
        let mis = self.assign("i64", format!("and i64 {}, {}", a.v, STREAM_ALIGN - 1));
        let to_line = self.assign("i64", format!("sub i64 {STREAM_ALIGN}, {}", mis.v));
        let to_line = self.assign(
            "i64",
            format!("and i64 {}, {}", to_line.v, STREAM_ALIGN - 1),
        );
        let head0 = self.assign("i64", format!("udiv i64 {}, {elem}", to_line.v));
        // An output not aligned to its element never reaches a 64-byte boundary: all scalar.
        let lowbits = self.assign("i64", format!("and i64 {}, {}", a.v, elem - 1));
        let aligned = self.assign("i1", format!("icmp eq i64 {}, 0", lowbits.v));
        let head1 = self.assign(
            "i64",
            format!("select i1 {}, i64 {}, i64 {}", aligned.v, head0.v, ext.v),
        );
        let short = self.assign("i1", format!("icmp ult i64 {}, {}", head1.v, ext.v));
        let head = self.assign(
            "i64",
            format!("select i1 {}, i64 {}, i64 {}", short.v, head1.v, ext.v),
        );
        let rest = self.assign("i64", format!("sub i64 {}, {}", ext.v, head.v));
        let nvec = self.assign("i64", format!("udiv i64 {}, {lanes}", rest.v));
        let vbytes = self.assign("i64", format!("mul i64 {}, {lanes}", nvec.v));
        let mstart = self.assign("i64", format!("add i64 {}, {}", lo64.v, head.v));
        let mend = self.assign("i64", format!("add i64 {}, {}", mstart.v, vbytes.v));
        // Vector part.
        match big {
            None => self.vector_steps(var, &mstart, &mend, lanes, body, Some(buffer))?,
            Some(big) => {
                let (nt, plain, join) = (
                    self.new_label("nt"),
                    self.new_label("no_nt"),
                    self.new_label("nt_join"),
                );
                self.line(format!("br i1 {}, label %{nt}, label %{plain}", big.v));
                self.start_block(&nt);
                self.vector_steps(var, &mstart, &mend, lanes, body, Some(buffer))?;
                self.line(format!("br label %{join}"));
                self.start_block(&plain);
                self.vector_steps(var, &mstart, &mend, lanes, body, None)?;
                self.line(format!("br label %{join}"));
                self.start_block(&join);
            }
        }
        // Head and tail (each fewer than 64 bytes of the output) in one scalar loop: one copy of
        // the body less to compile.
        let tail = self.assign("i64", format!("sub i64 {}, {}", end64.v, mend.v));
        let count = self.assign("i64", format!("add i64 {}, {}", head.v, tail.v));
        self.edge_steps(var, &lo64, &head, &mend, &count, body)?;
        // Non-temporal stores are weakly ordered: fence them before this thread says it is done.
        self.m
            .declares
            .insert("declare void @llvm.x86.sse.sfence()".into());
        self.line("call void @llvm.x86.sse.sfence()");
        Ok(())
    }
}

impl Emitter<'_> {
    /// `body` for `var` in `[start, end)` (i64 values, `end - start` a multiple of `lanes`),
    /// `lanes` at a time as vector code; contiguous stores to `nontemporal` are non-temporal
    /// and 64-byte aligned (the caller has aligned `start` for it).
    fn vector_steps(
        &mut self,
        var: &Var,
        start: &Val,
        end: &Val,
        lanes: i64,
        body: &Stmt,
        nontemporal: Option<&Buffer>,
    ) -> R<()> {
        let ty = reg_ty(var.dtype);
        // Vector code already; as a streaming loop bound by memory bandwidth, unrolling would
        // only cost compile time.
        self.kept_loop("vs", &start.v, &end.v, lanes, |e, j| {
            let jv = if ty == "i64" {
                Val::new("i64", j)
            } else {
                e.assign(&ty, format!("trunc i64 {j} to {ty}"))
            };
            let saved = std::mem::replace(&mut e.stream_buf, nontemporal.map(|b| b.data.id));
            let r = e.vstmt(var, &jv, lanes, body);
            e.stream_buf = saved;
            r
        })
    }

    /// `for (k = start; k < end; k += step) body(k)` over i64 values, as a loop that LLVM
    /// neither vectorizes nor unrolls (labels `<prefix>_head`, `_body`, `_latch`, `_end`).
    fn kept_loop(
        &mut self,
        prefix: &str,
        start: &str,
        end: &str,
        step: i64,
        body: impl FnOnce(&mut Self, &str) -> R<()>,
    ) -> R<()> {
        let (lh, lb, ll, lx) = (
            self.new_label(&format!("{prefix}_head")),
            self.new_label(&format!("{prefix}_body")),
            self.new_label(&format!("{prefix}_latch")),
            self.new_label(&format!("{prefix}_end")),
        );
        let pre = self.cur_block.clone();
        self.line(format!("br label %{lh}"));
        self.start_block(&lh);
        let k = self.tmp();
        let kn = self.tmp();
        self.line(format!(
            "{k} = phi i64 [ {start}, %{pre} ], [ {kn}, %{ll} ]"
        ));
        let c = self.assign("i1", format!("icmp slt i64 {k}, {end}"));
        self.line(format!("br i1 {}, label %{lb}, label %{lx}", c.v));
        self.start_block(&lb);
        body(self, &k)?;
        self.line(format!("br label %{ll}"));
        self.start_block(&ll);
        self.line(format!("{kn} = add nsw i64 {k}, {step}"));
        let md = self.no_unroll_metadata();
        self.line(format!("br label %{lh}{md}"));
        self.start_block(&lx);
        Ok(())
    }
}

impl Emitter<'_> {
    /// `body` for `var` = `lo + k` for `k < head`, then `mend + k - head`, for `k` in
    /// `[0, count)` (i64 values), one iteration at a time, as a loop LLVM keeps as it is.
    fn edge_steps(
        &mut self,
        var: &Var,
        lo: &Val,
        head: &Val,
        mend: &Val,
        count: &Val,
        body: &Stmt,
    ) -> R<()> {
        let ty = reg_ty(var.dtype);
        self.kept_loop("edge", "0", &count.v, 1, |e, k| {
            let in_head = e.assign("i1", format!("icmp slt i64 {k}, {}", head.v));
            let a = e.assign("i64", format!("add i64 {}, {k}", lo.v));
            let t0 = e.assign("i64", format!("sub i64 {k}, {}", head.v));
            let b = e.assign("i64", format!("add i64 {}, {}", mend.v, t0.v));
            let i64v = e.assign(
                "i64",
                format!("select i1 {}, i64 {}, i64 {}", in_head.v, a.v, b.v),
            );
            let iv = if ty == "i64" {
                i64v
            } else {
                e.assign(&ty, format!("trunc i64 {} to {ty}", i64v.v))
            };
            let old = e.vars.insert(var.id, iv);
            let r = e.stmt(body);
            e.restore(var.id, old);
            r
        })
    }
}
