//! Emitter-side unrolling and vectorization.
//!
//! `unrolled` loops with a small constant extent are unrolled here, so every index they feed is a
//! constant before LLVM runs (local arrays indexed by them become registers in the first SROA).
//! `vectorized` loops with a constant extent whose bodies are stores of lane-wise expressions are
//! emitted as straight-line vector code, as TVM does with `Ramp`/`Broadcast`: contiguous accesses
//! become vector loads and stores, lane-invariant subexpressions are computed once and broadcast,
//! float arithmetic, `fma`, `min`/`max`, `sqrt` and (with fast math) `exp` are vector instructions,
//! and anything else is computed lane by lane. Other vectorized loops (reductions into a scalar,
//! nested loops) keep the loop form with `llvm.loop.vectorize.enable`, for LLVM's vectorizer.

use std::collections::BTreeSet;

use crate::ir::{BinOp, Buffer, DataType, Expr, Intrinsic, Stmt, TypeCode, Var, VarId};

use super::arith::minmax_by_constant;
use super::parallel::collect_vars;
use super::streaming::STREAM_ALIGN;
use super::{mem_ty, reg_ty, Emitter, Val, R};
use crate::codegen::index::reads_memory;

/// The most iterations unrolled by the emitter (larger loops get `llvm.loop.unroll.full`).
const MAX_EMIT_UNROLL: i64 = 64;
/// The most lanes of an emitter-vectorized loop.
const MAX_EMIT_LANES: i64 = 64;

/// A value in a vectorized loop body: the same in every lane, or one per lane.
#[derive(Clone, Debug)]
enum Lanes {
    Uniform(Val),
    Vector(Val),
}

fn expr_uses(e: &Expr, id: VarId) -> bool {
    let mut s = BTreeSet::new();
    collect_vars(&Stmt::Evaluate(e.clone()), &mut s);
    s.contains(&id)
}

/// Whether `buffer[indices]` moves by one element per step of `id` (last index coefficient 1,
/// the others 0) in a buffer without strides: the lanes of a vector over `id` are contiguous.
pub(super) fn unit_stride(buffer: &Buffer, indices: &[Expr], id: VarId) -> bool {
    let last = indices.len().wrapping_sub(1);
    buffer.strides.is_none()
        && !indices.is_empty()
        && indices
            .iter()
            .enumerate()
            .all(|(d, i)| lane_coef(i, id) == Some(i64::from(d == last)))
}

/// The coefficient of `id` in the integer expression `e`, if `e` is affine in it.
pub(super) fn lane_coef(e: &Expr, id: VarId) -> Option<i64> {
    if !expr_uses(e, id) {
        return Some(0);
    }
    match e {
        Expr::Var(v) if v.id == id => Some(1),
        Expr::Binary { op, a, b } => {
            let (ca, cb) = (lane_coef(a, id)?, lane_coef(b, id)?);
            match op {
                BinOp::Add => Some(ca + cb),
                BinOp::Sub => Some(ca - cb),
                BinOp::Mul if cb == 0 => Some(ca * b.as_int()?),
                BinOp::Mul if ca == 0 => Some(cb * a.as_int()?),
                _ => None,
            }
        }
        // Widening, or narrowing to 32 bits or more: an index narrowed from 64 to 32 bits
        // (schedule primitives compute the indices of the copies they add in 64 bits, and a
        // TVM buffer's are 32) wraps between two lanes only where a lane's index leaves the
        // 32-bit range, outside any buffer such an index addresses. Without this, a packed
        // copy of `B` in TVM's form was scalarized lane by lane: 13 700 lines of IR that
        // LLVM took 1.3 s to fold back into the vector code of 2 100.
        Expr::Cast { dtype, value, .. }
            if matches!(dtype.code, TypeCode::Int | TypeCode::UInt)
                && matches!(value.dtype().code, TypeCode::Int | TypeCode::UInt)
                && (dtype.bits >= value.dtype().bits || dtype.bits >= 32) =>
        {
            lane_coef(value, id)
        }
        _ => None,
    }
}

fn vec_dtype_ok(t: DataType) -> bool {
    matches!(
        (t.code, t.bits),
        (TypeCode::Float, 32) | (TypeCode::Float, 64)
    )
}

/// Whether the emitter can vectorize a loop over `id` with body `s`.
pub(super) fn vec_body_ok(s: &Stmt, id: VarId) -> bool {
    fn loads_ok(e: &Expr) -> bool {
        match e {
            Expr::Load { buffer, indices } => {
                vec_dtype_ok(buffer.dtype) && indices.iter().all(loads_ok)
            }
            Expr::Binary { a, b, .. } => loads_ok(a) && loads_ok(b),
            Expr::Not(a) | Expr::Cast { value: a, .. } => loads_ok(a),
            Expr::Select { cond, t, f } => loads_ok(cond) && loads_ok(t) && loads_ok(f),
            Expr::Let { value, body, .. } => loads_ok(value) && loads_ok(body),
            Expr::Call { args, .. } => args.iter().all(loads_ok),
            // Branches and external calls stay in scalar loops.
            Expr::IfThenElse { .. } | Expr::CallExtern { .. } => false,
            Expr::Reinterpret { value, .. } => loads_ok(value),
            _ => true,
        }
    }
    match s {
        Stmt::Seq(v) => v.iter().all(|s| vec_body_ok(s, id)),
        Stmt::Store {
            buffer,
            indices,
            value,
        } => {
            let idx_dep = indices.iter().any(|i| expr_uses(i, id));
            // A store to one place from every lane is a reduction: not lane-wise.
            vec_dtype_ok(buffer.dtype)
                && (idx_dep || !expr_uses(value, id))
                && loads_ok(value)
                && indices.iter().all(loads_ok)
        }
        Stmt::Let { value, body, .. } => !expr_uses(value, id) && vec_body_ok(body, id),
        Stmt::Prefetch { indices, .. } => indices.iter().all(loads_ok),
        Stmt::IfThenElse {
            cond,
            then_case,
            else_case,
        } => {
            !expr_uses(cond, id)
                && vec_body_ok(then_case, id)
                && else_case.as_ref().is_none_or(|e| vec_body_ok(e, id))
        }
        _ => false,
    }
}

impl Emitter<'_> {
    /// Unrolls `for var in [min, min + extent)` when the extent is a small constant.
    pub(super) fn unrolled_for(
        &mut self,
        var: &Var,
        min: &Expr,
        extent: &Expr,
        body: &Stmt,
    ) -> R<bool> {
        let Some(n) = extent.as_int() else {
            return Ok(false);
        };
        if n > MAX_EMIT_UNROLL {
            return Ok(false);
        }
        let ty = reg_ty(var.dtype);
        let lo = self.expr(min)?;
        for k in 0..n.max(0) {
            let i = self.assign(&ty, format!("add {}, {k}", lo.typed()));
            let old = self.vars.insert(var.id, i);
            let r = self.stmt(body);
            self.restore(var.id, old);
            r?;
        }
        Ok(true)
    }

    /// Emits a vectorized loop as vector code; `false` when its body is not lane-wise.
    pub(super) fn vector_for(
        &mut self,
        var: &Var,
        min: &Expr,
        extent: &Expr,
        body: &Stmt,
    ) -> R<bool> {
        let Some(n) = extent.as_int() else {
            return Ok(false);
        };
        if !(2..=MAX_EMIT_LANES).contains(&n) || !vec_body_ok(body, var.id) {
            return Ok(false);
        }
        let lo = self.expr(min)?;
        // Lanes in pieces of a power of two each, widest first (24: 16 and 8). A vector of
        // another width is legalized by widening it; as the value of a loop-carried phi (a
        // register tile's accumulators) LLVM 14 then takes it apart lane by lane on every
        // iteration: a 4 x 24 matmul tile ran at a fifth of a 4 x 16 tile's speed.
        for (done, piece) in vector_pieces(n) {
            let at = if done == 0 {
                lo.clone()
            } else {
                self.lane_value(var, &lo, done)
            };
            if piece == 1 {
                let old = self.vars.insert(var.id, at);
                let r = self.stmt(body);
                self.restore(var.id, old);
                r?;
            } else {
                let outer = self.lane_base.take();
                self.lane_base = min.as_int().map(|b| (var.id, b + done));
                let r = self.vstmt(var, &at, piece, body);
                self.lane_base = outer;
                r?;
            }
        }
        Ok(true)
    }

    /// A short serial row that gathers from a row of constant columns (a nearest-neighbour
    /// resize: `Y[.., x] = X[.., int32(floor(0.8 * float32(x)))]`) as vector code
    /// ([`Self::window_load`]); `false`, and nothing emitted, for any other loop. The loop
    /// starts at a constant and has 2 to [`MAX_EMIT_LANES`] iterations, its body is
    /// lane-wise ([`vec_body_ok`]), its variable appears only in indices, each of its stores
    /// is contiguous in it, each load contiguous or a window in every vector piece, and at
    /// least one load is a window. Left as a loop, LLVM unrolls it, folds each column to a
    /// constant and loads and inserts element by element.
    pub(super) fn window_row(
        &mut self,
        var: &Var,
        min: &Expr,
        extent: &Expr,
        body: &Stmt,
    ) -> R<bool> {
        let (Some(base), Some(n)) = (min.as_int(), extent.as_int()) else {
            return Ok(false);
        };
        if self.opts.nvptx
            || self.opts.device_host
            || !(2..=MAX_EMIT_LANES).contains(&n)
            || super::stmt::has_loop(body)
            || !vec_body_ok(body, var.id)
        {
            return Ok(false);
        }
        // The vector pieces `vector_for` cuts the row into, by their first lane's value.
        let pieces: Vec<(i64, i64)> = vector_pieces(n)
            .filter(|&(_, piece)| piece > 1)
            .map(|(done, piece)| (base + done, piece))
            .collect();
        let mut scan = RowScan {
            var,
            pieces: &pieces,
            ok: true,
            windows: 0,
        };
        scan.stmt(body);
        if !scan.ok || scan.windows == 0 {
            return Ok(false);
        }
        self.vector_for(var, min, extent, body)
    }

    fn vty(n: i64, ty: &str) -> String {
        format!("<{n} x {ty}>")
    }

    /// A constant vector with every lane `c` (an LLVM constant spelling).
    pub(super) fn splat_const(n: i64, ty: &str, c: &str) -> String {
        let one = format!("{ty} {c}");
        format!("<{}>", vec![one; n as usize].join(", "))
    }

    fn broadcast(&mut self, n: i64, x: &Val) -> Val {
        let vt = Self::vty(n, &x.ty);
        let a = self.assign(
            &vt,
            format!("insertelement {vt} undef, {}, i32 0", x.typed()),
        );
        self.assign(
            &vt,
            format!(
                "shufflevector {vt} {}, {vt} undef, <{n} x i32> zeroinitializer",
                a.v
            ),
        )
    }

    fn as_vector(&mut self, n: i64, x: Lanes) -> Val {
        match x {
            Lanes::Vector(v) => v,
            Lanes::Uniform(u) => self.broadcast(n, &u),
        }
    }

    /// The loop variable's value in lane `l`.
    pub(super) fn lane_value(&mut self, var: &Var, lo: &Val, l: i64) -> Val {
        let ty = reg_ty(var.dtype);
        self.assign(&ty, format!("add {}, {l}", lo.typed()))
    }

    /// Computes `e` lane by lane and gathers the results into a vector.
    fn scalarize(&mut self, var: &Var, lo: &Val, n: i64, e: &Expr) -> R<Lanes> {
        let ty = reg_ty(e.dtype());
        let vt = Self::vty(n, &ty);
        let mut acc = Val::new(&vt, "undef");
        for l in 0..n {
            let i = self.lane_value(var, lo, l);
            let old = self.vars.insert(var.id, i);
            let x = self.expr(e);
            self.restore(var.id, old);
            let x = x?;
            acc = self.assign(
                &vt,
                format!("insertelement {}, {}, i32 {l}", acc.typed(), x.typed()),
            );
        }
        Ok(Lanes::Vector(acc))
    }

    /// The address of lane 0 of a contiguous access of `n` lanes, or `None` when lanes are not
    /// adjacent. An index read from memory is checked at the first lane and at the last
    /// ([`Emitter::address`]), so that the whole vector is in bounds.
    fn contiguous(
        &mut self,
        var: &Var,
        lo: &Val,
        n: i64,
        buffer: &Buffer,
        indices: &[Expr],
    ) -> R<Option<String>> {
        if !unit_stride(buffer, indices, var.id) {
            return Ok(None);
        }
        let first = self.address_at(buffer, indices, &[(var, lo.clone())])?;
        if n > 1 && indices.iter().any(reads_memory) {
            let end = self.lane_value(var, lo, n - 1);
            self.address_at(buffer, indices, &[(var, end)])?;
        }
        Ok(Some(first))
    }

    /// Lanes `lo .. lo + n` of a load whose last index steps by 2 per lane (a stride-2
    /// window's column; other indices free of `var`, no strides): two contiguous vector loads,
    /// of elements `0 .. n` and `n - 1 .. 2 n - 1` from lane 0's, and one shuffle of their even
    /// elements (`vshufps` and `vpermpd` for 8 floats with AVX2), where lane by lane it was `n`
    /// scalar loads and inserts. The second load ends at the last lane's element, so no element
    /// outside the ones the lanes read is touched. `None` when the access is not of that form.
    fn stride_two_load(
        &mut self,
        var: &Var,
        lo: &Val,
        n: i64,
        buffer: &Buffer,
        indices: &[Expr],
    ) -> R<Option<Val>> {
        let Some((last, outer)) = indices.split_last() else {
            return Ok(None);
        };
        if n < 2
            || buffer.strides.is_some()
            || buffer.dtype.lanes != 1
            || buffer.dtype.code == TypeCode::Bool
            || lane_coef(last, var.id) != Some(2)
            || outer.iter().any(|i| lane_coef(i, var.id) != Some(0))
            || indices.iter().any(reads_memory)
        {
            return Ok(None);
        }
        let addr = self.address_at(buffer, indices, &[(var, lo.clone())])?;
        let mt = mem_ty(buffer.dtype);
        let vt = Self::vty(n, &mt);
        let align = buffer.dtype.bytes().max(1);
        let first = self.assign(&format!("{vt}*"), format!("bitcast {mt}* {addr} to {vt}*"));
        let lo_v = self.assign(&vt, format!("load {vt}, {vt}* {}, align {align}", first.v));
        let mid = self.assign(
            &format!("{mt}*"),
            format!("getelementptr inbounds {mt}, {mt}* {addr}, i64 {}", n - 1),
        );
        let second = self.assign(
            &format!("{vt}*"),
            format!("bitcast {mt}* {} to {vt}*", mid.v),
        );
        let hi_v = self.assign(&vt, format!("load {vt}, {vt}* {}, align {align}", second.v));
        // Lane l is element 2 l from lane 0's: of the first vector below n, else element
        // 2 l - (n - 1) of the second, which `shufflevector` numbers n + 2 l - (n - 1).
        let mask: Vec<String> = (0..n)
            .map(|l| format!("i32 {}", if 2 * l < n { 2 * l } else { 2 * l + 1 }))
            .collect();
        let v = self.assign(
            &vt,
            format!(
                "shufflevector {vt} {}, {vt} {}, <{n} x i32> <{}>",
                lo_v.v,
                hi_v.v,
                mask.join(", ")
            ),
        );
        Ok(Some(v))
    }

    /// Lanes of a load whose last index is a function of the loop variable alone, known in
    /// every lane at compile time (a nearest-neighbour resize's column `int32(floor(0.8 *
    /// float32(x)))`, a reversal, a repeat), the other indices the same in every lane: one
    /// vector load of the row's elements the lanes read (a power of two of them, inside the
    /// row) and one `shufflevector` with the lanes' offsets as its constant mask (`vpermps`).
    /// Lane by lane it was a load and an insert each: a resize's row of 20 from 16 took six
    /// stores and as many shuffles and inserts with AVX2, now two permutes and three stores.
    /// `None` when the loop does not start at a constant or the access is not of that form
    /// ([`window`]).
    fn window_load(
        &mut self,
        var: &Var,
        n: i64,
        buffer: &Buffer,
        indices: &[Expr],
    ) -> R<Option<Val>> {
        let Some(base) = self
            .lane_base
            .and_then(|(id, b)| (id == var.id).then_some(b))
        else {
            return Ok(None);
        };
        let Some(w) = window(buffer, indices, var, base, n) else {
            return Ok(None);
        };
        if indices.iter().any(reads_memory) {
            // Lane by lane, each index checked (`Emitter::address`).
            return Ok(None);
        }
        let (outer, last) = (&indices[..indices.len() - 1], &indices[indices.len() - 1]);
        let mut at = outer.to_vec();
        at.push(Expr::IntImm {
            dtype: last.dtype(),
            value: w.start,
        });
        let addr = self.address_at(buffer, &at, &[])?;
        let mt = mem_ty(buffer.dtype);
        let wt = Self::vty(w.width, &mt);
        let align = buffer.dtype.bytes().max(1);
        let p = self.assign(&format!("{wt}*"), format!("bitcast {mt}* {addr} to {wt}*"));
        let row = self.assign(&wt, format!("load {wt}, {wt}* {}, align {align}", p.v));
        let mask: Vec<String> = w
            .lanes
            .iter()
            .map(|c| format!("i32 {}", c - w.start))
            .collect();
        let vt = Self::vty(n, &mt);
        let v = self.assign(
            &vt,
            format!(
                "shufflevector {wt} {}, {wt} undef, <{n} x i32> <{}>",
                row.v,
                mask.join(", ")
            ),
        );
        Ok(Some(v))
    }

    fn vexpr(&mut self, var: &Var, lo: &Val, n: i64, e: &Expr) -> R<Lanes> {
        if !expr_uses(e, var.id) {
            return Ok(Lanes::Uniform(self.expr(e)?));
        }
        let t = e.dtype();
        let fm = self.fm();
        match e {
            Expr::Load { buffer, indices } => {
                if let Some(addr) = self.contiguous(var, lo, n, buffer, indices)? {
                    let mt = mem_ty(buffer.dtype);
                    let vt = Self::vty(n, &mt);
                    let p =
                        self.assign(&format!("{vt}*"), format!("bitcast {mt}* {addr} to {vt}*"));
                    let align = buffer.dtype.bytes().max(1);
                    let v = self.assign(&vt, format!("load {vt}, {vt}* {}, align {align}", p.v));
                    return Ok(Lanes::Vector(v));
                }
                if let Some(v) = self.stride_two_load(var, lo, n, buffer, indices)? {
                    return Ok(Lanes::Vector(v));
                }
                if let Some(v) = self.window_load(var, n, buffer, indices)? {
                    return Ok(Lanes::Vector(v));
                }
                self.scalarize(var, lo, n, e)
            }
            Expr::Binary { op, a, b }
                if vec_dtype_ok(t)
                    && matches!(
                        op,
                        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Min | BinOp::Max
                    ) =>
            {
                if let Some((v, c, cv)) = minmax_by_constant(*op, a, b) {
                    let x = self.vexpr(var, lo, n, v)?;
                    let y = self.vexpr(var, lo, n, c)?;
                    let x = self.as_vector(n, x);
                    let y = self.as_vector(n, y);
                    let bt = format!("<{n} x i1>");
                    let r = self.fminmax_const(*op == BinOp::Min, &bt, x, y, cv);
                    return Ok(Lanes::Vector(r));
                }
                let x = self.vexpr(var, lo, n, a)?;
                let y = self.vexpr(var, lo, n, b)?;
                let x = self.as_vector(n, x);
                let y = self.as_vector(n, y);
                let vt = x.ty.clone();
                let v = match op {
                    BinOp::Add => self.assign(&vt, format!("fadd {fm}{}, {}", x.typed(), y.v)),
                    BinOp::Sub => self.assign(&vt, format!("fsub {fm}{}, {}", x.typed(), y.v)),
                    BinOp::Mul => self.assign(&vt, format!("fmul {fm}{}, {}", x.typed(), y.v)),
                    BinOp::Div => self.assign(&vt, format!("fdiv {fm}{}, {}", x.typed(), y.v)),
                    _ => self.vminmax(*op == BinOp::Min, n, &reg_ty(t), x, y),
                };
                Ok(Lanes::Vector(v))
            }
            Expr::Call { op, args }
                if vec_dtype_ok(t)
                    && (matches!(op, Intrinsic::Fma | Intrinsic::Sqrt | Intrinsic::Abs)
                        || (t == DataType::f32()
                            && (*op == Intrinsic::FastExp
                                || (matches!(op, Intrinsic::Exp | Intrinsic::Erf)
                                    && (self.fast_exp() || self.inline_exp()))))) =>
            {
                let mut vals = Vec::new();
                for a in args {
                    let x = self.vexpr(var, lo, n, a)?;
                    vals.push(self.as_vector(n, x));
                }
                let sty = reg_ty(t);
                let vt = Self::vty(n, &sty);
                let sfx = format!("v{n}{}", Self::intr_suffix(&sty));
                let v = match op {
                    Intrinsic::Erf => self.erf_poly(&vt, &sty, n, vals[0].clone()),
                    Intrinsic::Exp if !self.fast_exp() => {
                        self.exp_accurate_poly(&vt, &sty, n, vals[0].clone())
                    }
                    Intrinsic::Exp | Intrinsic::FastExp => {
                        self.fast_exp_poly(&vt, &sty, n, vals[0].clone())
                    }
                    _ => {
                        let name = match op {
                            Intrinsic::Fma => "fma",
                            Intrinsic::Sqrt => "sqrt",
                            _ => "fabs",
                        };
                        let params = vec![vt.as_str(); vals.len()].join(", ");
                        self.m
                            .declares
                            .insert(format!("declare {vt} @llvm.{name}.{sfx}({params})"));
                        let a = vals.iter().map(Val::typed).collect::<Vec<_>>().join(", ");
                        self.assign(&vt, format!("call {fm}{vt} @llvm.{name}.{sfx}({a})"))
                    }
                };
                Ok(Lanes::Vector(v))
            }
            _ => self.scalarize(var, lo, n, e),
        }
    }

    /// Lane-wise IEEE minimum/maximum (NaN if either is NaN, -0 below +0); with `nnan nsz` fast
    /// math, a plain compare and select ([`Self::minmax_by_lanes`]).
    fn vminmax(&mut self, min: bool, n: i64, sty: &str, x: Val, y: Val) -> Val {
        let bt = format!("<{n} x i1>");
        let ity = Self::vty(n, if sty == "float" { "i32" } else { "i64" });
        let vt = x.ty.clone();
        let q = format!("{vt} {}", Self::splat_const(n, sty, "0x7FF8000000000000"));
        self.minmax_by_lanes(min, &bt, &ity, &q, x, y)
    }

    /// Emits a lane-wise statement for lanes `lo .. lo + n` of `var`.
    pub(super) fn vstmt(&mut self, var: &Var, lo: &Val, n: i64, s: &Stmt) -> R<()> {
        match s {
            Stmt::Seq(v) => {
                for s in v {
                    self.vstmt(var, lo, n, s)?;
                }
            }
            Stmt::Let {
                var: lv,
                value,
                body,
            } => {
                let v = self.expr(value)?;
                let old = self.vars.insert(lv.id, v);
                self.vstmt(var, lo, n, body)?;
                self.restore(lv.id, old);
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                let c = self.expr(cond)?;
                self.if_then_else(&c.v, "v", then_case, else_case.as_deref(), |e, s| {
                    e.vstmt(var, lo, n, s)
                })?;
            }
            Stmt::Store {
                buffer,
                indices,
                value,
            } => {
                let v = self.vexpr(var, lo, n, value)?;
                let v = self.as_vector(n, v);
                let mt = mem_ty(buffer.dtype);
                let align = buffer.dtype.bytes().max(1);
                if let Some(addr) = self.contiguous(var, lo, n, buffer, indices)? {
                    let vt = Self::vty(n, &mt);
                    let p =
                        self.assign(&format!("{vt}*"), format!("bitcast {mt}* {addr} to {vt}*"));
                    if self.stream_buf == Some(buffer.data.id) {
                        // The streaming loop's vector part: 64 bytes at a 64-byte boundary.
                        let nt = self.md(|k| format!("!{k} = !{{i32 1}}"));
                        self.line(format!(
                            "store {}, {vt}* {}, align {STREAM_ALIGN}, !nontemporal !{nt}",
                            v.typed(),
                            p.v
                        ));
                    } else {
                        self.line(format!("store {}, {vt}* {}, align {align}", v.typed(), p.v));
                    }
                } else {
                    for l in 0..n {
                        let x = self.assign(&mt, format!("extractelement {}, i32 {l}", v.typed()));
                        let i = self.lane_value(var, lo, l);
                        let old = self.vars.insert(var.id, i);
                        let a = self.address(buffer, indices);
                        self.restore(var.id, old);
                        let a = a?;
                        self.line(format!("store {}, {mt}* {a}, align {align}", x.typed()));
                    }
                }
            }
            Stmt::Prefetch { buffer, indices } => self.vprefetch(var, lo, n, buffer, indices)?,
            _ => {
                unreachable!("vec_body_ok admits only stores, prefetches, lets, ifs and sequences")
            }
        }
        Ok(())
    }
}

/// The pieces `vector_for` emits `n` lanes in, as (first lane, lanes): a power of two each,
/// widest first (24: 16 and 8; 7: 4, 2 and 1).
fn vector_pieces(n: i64) -> impl Iterator<Item = (i64, i64)> {
    let mut done = 0;
    std::iter::from_fn(move || {
        (done < n).then(|| {
            let piece = 1_i64 << (63 - (n - done).leading_zeros());
            done += piece;
            (done - piece, piece)
        })
    })
}

/// The elements a [`Emitter::window_load`] reads for lanes `base .. base + n` of `var`.
#[derive(Debug, PartialEq)]
pub(super) struct Window {
    /// The last index of the first element loaded.
    pub start: i64,
    /// Elements loaded: a power of two, all inside the row.
    pub width: i64,
    /// Each lane's last index.
    pub lanes: Vec<i64>,
}

/// The window of `buffer[indices]` over lanes `base .. base + n` of `var`, where the indices
/// other than the last do not change with `var` and the last is computed from `var` and
/// constants alone ([`eval_in_lane`]), inside the row (`0 ..` its constant extent) in every
/// lane. The window is the smallest power of two of elements that holds them, moved left
/// where it would end past the row, so every element it reads is one of the row's, which lies
/// between two elements the lanes read or at most the window's width from one.
pub(super) fn window(
    buffer: &Buffer,
    indices: &[Expr],
    var: &Var,
    base: i64,
    n: i64,
) -> Option<Window> {
    let (last, outer) = indices.split_last()?;
    if buffer.strides.is_some()
        || buffer.dtype.lanes != 1
        || buffer.dtype.code == TypeCode::Bool
        || buffer.shape.len() != indices.len()
        || !expr_uses(last, var.id)
        || outer.iter().any(|i| expr_uses(i, var.id))
    {
        return None;
    }
    let extent = buffer.shape.last()?.as_int()?;
    let mut lanes = Vec::with_capacity(usize::try_from(n).ok()?);
    for l in 0..n {
        let c = eval_in_lane(last, var, base.checked_add(l)?)?;
        if !matches!(c.dtype().code, TypeCode::Int | TypeCode::UInt)
            || !(0..extent).contains(&c.as_i64())
        {
            return None;
        }
        lanes.push(c.as_i64());
    }
    let (lo, hi) = (*lanes.iter().min()?, *lanes.iter().max()?);
    let width = u64::try_from(hi - lo + 1).ok()?.next_power_of_two();
    let width = i64::try_from(width).ok()?;
    if width > extent || width > MAX_EMIT_LANES {
        return None;
    }
    Some(Window {
        start: lo.min(extent - width),
        width,
        lanes,
    })
}

/// The value of `e` where `var` is `value`, when `e` is computed from `var` and constants
/// alone, by the interpreter's rules (`ir::interp`), which are the compiled code's: integer
/// and float arithmetic, each operation rounded (as LLVM folds constants), casts, `floor`,
/// `ceil`, `round`, `abs` and selects. `None` for anything else, and where the value is not
/// specified (a division by zero, an unsaturated cast out of range).
pub(super) fn eval_in_lane(e: &Expr, var: &Var, value: i64) -> Option<crate::ir::interp::Scalar> {
    use crate::ir::interp::{binary, cast, fits_int, intrinsic, Scalar};
    Some(match e {
        Expr::IntImm { dtype, value } => Scalar::from_int(*dtype, i128::from(*value)),
        Expr::FloatImm { dtype, value } => Scalar::from_float(*dtype, *value),
        Expr::Var(v) if v.id == var.id => {
            if !matches!(v.dtype.code, TypeCode::Int | TypeCode::UInt) || v.dtype.lanes != 1 {
                return None;
            }
            Scalar::from_int(v.dtype, i128::from(value))
        }
        Expr::Binary { op, a, b } => binary(
            *op,
            eval_in_lane(a, var, value)?,
            eval_in_lane(b, var, value)?,
        )
        .ok()?,
        Expr::Cast {
            dtype,
            value: x,
            saturate,
        } => {
            if dtype.lanes != 1 {
                return None;
            }
            let v = eval_in_lane(x, var, value)?;
            if let Scalar::Float(_, f) = v {
                if !*saturate && !fits_int(*dtype, f) {
                    return None;
                }
            }
            cast(*dtype, v)
        }
        Expr::Call { op, args }
            if matches!(
                op,
                Intrinsic::Floor | Intrinsic::Ceil | Intrinsic::Round | Intrinsic::Abs
            ) && args.len() == 1 =>
        {
            intrinsic(*op, &[eval_in_lane(&args[0], var, value)?])
        }
        Expr::Select { cond, t, f } => {
            let c = eval_in_lane(cond, var, value)?.as_bool();
            let (x, y) = (eval_in_lane(t, var, value)?, eval_in_lane(f, var, value)?);
            if c {
                x
            } else {
                y
            }
        }
        _ => return None,
    })
}

/// Checks a row's body for [`Emitter::window_row`]: where its variable appears, and how many
/// of its loads are windows.
struct RowScan<'a> {
    var: &'a Var,
    pieces: &'a [(i64, i64)],
    ok: bool,
    windows: usize,
}

impl RowScan<'_> {
    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Seq(v) => v.iter().for_each(|s| self.stmt(s)),
            Stmt::Store {
                buffer,
                indices,
                value,
            } => {
                self.ok &= unit_stride(buffer, indices, self.var.id);
                self.expr(value);
            }
            Stmt::Let { value, body, .. } => {
                self.ok &= !expr_uses(value, self.var.id);
                self.stmt(body);
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                self.ok &= !expr_uses(cond, self.var.id);
                self.stmt(then_case);
                if let Some(e) = else_case {
                    self.stmt(e);
                }
            }
            _ => self.ok = false,
        }
    }

    fn expr(&mut self, e: &Expr) {
        if !self.ok || !expr_uses(e, self.var.id) {
            return;
        }
        match e {
            Expr::Load { buffer, indices } => {
                if unit_stride(buffer, indices, self.var.id) {
                    return;
                }
                if self
                    .pieces
                    .iter()
                    .all(|&(b, n)| window(buffer, indices, self.var, b, n).is_some())
                {
                    self.windows += 1;
                } else {
                    self.ok = false;
                }
            }
            Expr::Binary { a, b, .. } => {
                self.expr(a);
                self.expr(b);
            }
            Expr::Not(a) | Expr::Cast { value: a, .. } | Expr::Reinterpret { value: a, .. } => {
                self.expr(a)
            }
            Expr::Select { cond, t, f } => {
                self.expr(cond);
                self.expr(t);
                self.expr(f);
            }
            Expr::Call { args, .. } => args.iter().for_each(|a| self.expr(a)),
            // The variable itself as a value, or in a `let`: computed lane by lane.
            _ => self.ok = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every window lies inside its row, is a power of two wide, and holds every lane's
    /// element, for the columns of rows reversed, repeated and resized.
    #[test]
    fn windows_hold_their_lanes_inside_the_row() {
        let x = Var::new("x", DataType::i32());
        for extent in 1..=40i64 {
            let b = Buffer::new(
                "X",
                DataType::f32(),
                vec![Expr::from(3i64), Expr::from(extent)],
            );
            let columns = [
                Expr::from(extent as i32 - 1) - Expr::Var(x.clone()),
                Expr::Var(x.clone()).floordiv(Expr::from(3i32)),
                (Expr::Var(x.clone()) * Expr::from(2i32)).min(Expr::from(extent as i32 - 1)),
            ];
            for col in &columns {
                for (base, n) in [(0, 2), (0, 4), (3, 8), (16, 16), (1, 32), (0, 64)] {
                    let idx = [Expr::from(1i64), col.clone()];
                    let Some(w) = window(&b, &idx, &x, base, n) else {
                        continue;
                    };
                    assert!(w.width.count_ones() == 1 && w.width <= extent);
                    assert!(
                        w.start >= 0 && w.start + w.width <= extent,
                        "{w:?} of {extent}"
                    );
                    assert!(w
                        .lanes
                        .iter()
                        .all(|c| (w.start..w.start + w.width).contains(c)));
                    assert_eq!(w.lanes.len() as i64, n);
                }
            }
        }
        // An index outside the row in some lane is no window.
        let b = Buffer::new("X", DataType::f32(), vec![Expr::from(8i64)]);
        assert_eq!(window(&b, &[Expr::Var(x.clone())], &x, 4, 8), None);
        // Nor one that reads anything but the variable and constants.
        let y = Var::new("y", DataType::i32());
        let idx = [Expr::Var(x.clone()) + Expr::Var(y)];
        assert_eq!(window(&b, &idx, &x, 0, 4), None);
    }
}
