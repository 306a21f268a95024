//! Scalar expressions: [`Emitter::expr`], the conversions between register and memory forms
//! (bool as a byte, bf16 as its 16 bits), element addresses and index widening.

use crate::codegen::index::reads_memory;
use crate::ir::{BinOp, Buffer, DataType, Expr, TypeCode, Var};

use super::arith::minmax_by_constant;
use super::{float_const, is_signed, mem_ty, reg_ty, unsupported, Emitter, Val, R};

impl Emitter<'_> {
    pub fn expr(&mut self, e: &Expr) -> R<Val> {
        Ok(match e {
            Expr::IntImm { dtype, value } => {
                let ty = reg_ty(*dtype);
                if dtype.code == TypeCode::Bool {
                    Val::new(ty, if *value != 0 { "true" } else { "false" })
                } else {
                    // LLVM reads the literal at the type's width: truncate to it.
                    let bits = u32::from(dtype.bits);
                    let v = if bits >= 64 {
                        *value
                    } else {
                        (*value << (64 - bits)) >> (64 - bits)
                    };
                    Val::new(ty, v.to_string())
                }
            }
            Expr::FloatImm { dtype, value } => {
                Val::new(reg_ty(*dtype), float_const(*dtype, *value))
            }
            Expr::Var(v) => {
                self.vars.get(&v.id).cloned().ok_or_else(|| {
                    unsupported(format!("variable `{}` is not bound here", v.name))
                })?
            }
            Expr::Binary { op, a, b } => {
                let t = a.dtype();
                if let Some((var, c, cv)) = minmax_by_constant(*op, a, b) {
                    let x = self.expr(var)?;
                    let y = self.expr(c)?;
                    let r = self.fminmax_const(*op == BinOp::Min, "i1", x, y, cv);
                    return Ok(if t.code == TypeCode::BFloat {
                        self.round_bf16(r)
                    } else {
                        r
                    });
                }
                let x = self.expr(a)?;
                let y = self.expr(b)?;
                self.binary(*op, t, x, y, b)?
            }
            Expr::Not(a) => {
                let x = self.expr(a)?;
                self.assign("i1", format!("xor i1 {}, true", x.v))
            }
            Expr::Select { cond, t, f } => {
                let c = self.expr(cond)?;
                let x = self.expr(t)?;
                let y = self.expr(f)?;
                let ty = x.ty.clone();
                self.assign(
                    &ty,
                    format!("select i1 {}, {}, {}", c.v, x.typed(), y.typed()),
                )
            }
            Expr::Cast {
                dtype,
                value,
                saturate,
            } => {
                let from = value.dtype();
                let x = self.expr(value)?;
                let in_range = self.in_range_casts.contains(&(e as *const Expr as usize));
                if in_range || !*saturate {
                    let op = if is_signed(*dtype) {
                        "fptosi"
                    } else {
                        "fptoui"
                    };
                    let tt = reg_ty(*dtype);
                    let c = self.assign(&tt, format!("{op} {} to {tt}", x.typed()));
                    if in_range {
                        // Provably in range and not NaN (`codegen::bounds`): nothing saturates.
                        return Ok(c);
                    }
                    // Unsaturated (the verifier allows it only float → integer): the
                    // conversion's poison out of range or at NaN is frozen into some value of
                    // the type, so no later use is undefined. One `cvttps2dq` on x86, one
                    // `cvt.rzi` (which saturates) on NVPTX.
                    return Ok(self.assign(&tt, format!("freeze {}", c.typed())));
                }
                self.cast(from, *dtype, x)
            }
            Expr::Load { buffer, indices } => {
                self.host_access(buffer)?;
                let addr = self.address(buffer, indices)?;
                let mt = mem_ty(buffer.dtype);
                let align = buffer.dtype.bytes().max(1);
                let g = self.access_groups();
                let raw = self.assign(&mt, format!("load {mt}, {mt}* {}, align {align}{g}", addr));
                self.mem_to_reg(buffer.dtype, raw)
            }
            Expr::Let { var, value, body } => {
                let v = self.expr(value)?;
                let old = self.vars.insert(var.id, v);
                let r = self.expr(body);
                self.restore(var.id, old);
                r?
            }
            Expr::Call { op, args } => {
                let t = args.first().map(Expr::dtype).unwrap_or(DataType::f32());
                let vals = args.iter().map(|a| self.expr(a)).collect::<R<Vec<_>>>()?;
                self.intrinsic(*op, t, &vals)?
            }
            Expr::IfThenElse { cond, t, f } => {
                // Branches and a phi: only the chosen arm runs (it may guard a load).
                let c = self.expr(cond)?;
                let th = self.new_label("ite_then");
                let el = self.new_label("ite_else");
                let end = self.new_label("ite_end");
                self.line(format!("br i1 {}, label %{th}, label %{el}", c.v));
                self.start_block(&th);
                let x = self.expr(t)?;
                let xb = self.cur_block.clone();
                self.line(format!("br label %{end}"));
                self.start_block(&el);
                let y = self.expr(f)?;
                let yb = self.cur_block.clone();
                self.line(format!("br label %{end}"));
                self.start_block(&end);
                let ty = x.ty.clone();
                self.assign(
                    &ty,
                    format!("phi {ty} [ {}, %{xb} ], [ {}, %{yb} ]", x.v, y.v),
                )
            }
            Expr::Reinterpret { dtype, value } => {
                let from = value.dtype();
                let x = self.expr(value)?;
                let m = self.reg_to_mem(from, x);
                let (fmt_, tmt) = (mem_ty(from), mem_ty(*dtype));
                let b = if fmt_ == tmt {
                    Val::new(tmt, m.v)
                } else {
                    self.assign(&tmt, format!("bitcast {} to {tmt}", m.typed()))
                };
                self.mem_to_reg(*dtype, b)
            }
            Expr::CallExtern {
                dtype,
                symbol,
                args,
            } => {
                if self.opts.nvptx && !symbol.starts_with("__nv_") {
                    return Err(self.not_in_kernel(&format!(
                        "call_extern `{symbol}` calls a host function; a kernel can call libdevice (`__nv_*`) only"
                    )));
                }
                let vals = args.iter().map(|a| self.expr(a)).collect::<R<Vec<_>>>()?;
                let c_ty = |t: DataType| -> R<String> {
                    let ext = match t.code {
                        TypeCode::Bool => "zeroext ",
                        TypeCode::Int if t.bits < 32 => "signext ",
                        TypeCode::UInt if t.bits < 32 => "zeroext ",
                        TypeCode::Float if t.bits >= 32 => "",
                        TypeCode::Int | TypeCode::UInt => "",
                        _ => {
                            return Err(unsupported(format!(
                                "call_extern `{symbol}`: {t} is not a C scalar type"
                            )))
                        }
                    };
                    Ok(format!("{ext}{}", reg_ty(t)))
                };
                let rt = reg_ty(*dtype);
                let ret = c_ty(*dtype)?;
                let mut params = Vec::new();
                let mut call_args = Vec::new();
                for (a, v) in args.iter().zip(&vals) {
                    let pt = c_ty(a.dtype())?;
                    call_args.push(format!("{pt} {}", v.v));
                    params.push(pt);
                }
                let decl = format!("declare {ret} @{symbol}({})", params.join(", "));
                let prefix = format!(" @{symbol}(");
                if let Some(other) = self
                    .m
                    .declares
                    .iter()
                    .find(|d| d.contains(&prefix) && **d != decl)
                {
                    return Err(unsupported(format!(
                        "call_extern `{symbol}` is declared twice with different signatures: `{other}` and `{decl}`"
                    )));
                }
                self.m.declares.insert(decl);
                self.assign(
                    &rt,
                    format!("call {ret} @{symbol}({})", call_args.join(", ")),
                )
            }
        })
    }

    /// Rounds a bf16 value held in `float` to bf16 precision (nearest, ties to even; NaN kept).
    pub(super) fn round_bf16(&mut self, x: Val) -> Val {
        let bits = self.assign("i32", format!("bitcast float {} to i32", x.v));
        let lsb0 = self.assign("i32", format!("lshr i32 {}, 16", bits.v));
        let lsb = self.assign("i32", format!("and i32 {}, 1", lsb0.v));
        let bias = self.assign("i32", format!("add i32 {}, 32767", lsb.v));
        let sum = self.assign("i32", format!("add i32 {}, {}", bits.v, bias.v));
        let r = self.assign("i32", format!("and i32 {}, -65536", sum.v));
        let nan = self.assign("i1", format!("fcmp uno float {}, 0.0", x.v));
        let q = self.assign("i32", format!("or i32 {}, 4194304", bits.v));
        let qn = self.assign("i32", format!("and i32 {}, -65536", q.v));
        let sel = self.assign(
            "i32",
            format!("select i1 {}, i32 {}, i32 {}", nan.v, qn.v, r.v),
        );
        self.assign("float", format!("bitcast i32 {} to float", sel.v))
    }

    pub(super) fn mem_to_reg(&mut self, t: DataType, raw: Val) -> Val {
        match t.code {
            TypeCode::Bool => self.assign("i1", format!("icmp ne i8 {}, 0", raw.v)),
            TypeCode::BFloat => {
                let w = self.assign("i32", format!("zext i16 {} to i32", raw.v));
                let s = self.assign("i32", format!("shl i32 {}, 16", w.v));
                self.assign("float", format!("bitcast i32 {} to float", s.v))
            }
            _ => raw,
        }
    }

    pub(super) fn reg_to_mem(&mut self, t: DataType, v: Val) -> Val {
        match t.code {
            TypeCode::Bool => self.assign("i8", format!("zext i1 {} to i8", v.v)),
            TypeCode::BFloat => {
                let r = self.round_bf16(v);
                let b = self.assign("i32", format!("bitcast float {} to i32", r.v));
                let s = self.assign("i32", format!("lshr i32 {}, 16", b.v));
                self.assign("i16", format!("trunc i32 {} to i16", s.v))
            }
            _ => v,
        }
    }

    /// The element address `buffer[indices]` as a typed pointer.
    pub(super) fn address(&mut self, buffer: &Buffer, indices: &[Expr]) -> R<String> {
        self.address_with(buffer, indices, true)
    }

    /// [`Self::address`] with each variable of `bound` taking its value (a vector's lane 0,
    /// a tile's first row) for this address only.
    pub(super) fn address_at(
        &mut self,
        buffer: &Buffer,
        indices: &[Expr],
        bound: &[(&Var, Val)],
    ) -> R<String> {
        self.address_with_at(buffer, indices, true, bound)
    }

    /// [`Self::address_with`] with the variables of `bound` bound, as [`Self::address_at`].
    pub(super) fn address_with_at(
        &mut self,
        buffer: &Buffer,
        indices: &[Expr],
        exact: bool,
        bound: &[(&Var, Val)],
    ) -> R<String> {
        let old: Vec<Option<Val>> = bound
            .iter()
            .map(|(v, x)| self.vars.insert(v.id, x.clone()))
            .collect();
        let a = self.address_with(buffer, indices, exact);
        for ((v, _), o) in bound.iter().zip(old).rev() {
            self.restore(v.id, o);
        }
        a
    }

    /// [`Self::address`]; with `exact` false, computed without `nsw` and `inbounds`, so that an
    /// address outside the buffer is an address, not poison (a prefetch's, `prefetch.rs`).
    pub(super) fn address_with(
        &mut self,
        buffer: &Buffer,
        indices: &[Expr],
        exact: bool,
    ) -> R<String> {
        let (nsw, inb) = if exact {
            ("nsw ", "inbounds ")
        } else {
            ("", "")
        };
        let base =
            self.bufs.get(&buffer.data.id).cloned().ok_or_else(|| {
                unsupported(format!("buffer `{}` is not bound here", buffer.name))
            })?;
        if indices.len() != buffer.shape.len() {
            return Err(unsupported(format!(
                "buffer `{}` has {} dimensions, indexed with {}",
                buffer.name,
                buffer.shape.len(),
                indices.len()
            )));
        }
        let mut off: Option<Val> = None;
        let mut last: Option<Val> = None;
        // An index read from memory is checked against its extent (`index_in_bounds`).
        let checked = exact && !self.opts.nvptx && indices.iter().any(reads_memory);
        match &buffer.strides {
            Some(strides) => {
                for (d, (i, s)) in indices.iter().zip(strides).enumerate() {
                    let iv = self.index64(i)?;
                    if checked && reads_memory(i) {
                        let dims = [&buffer.shape[d]];
                        self.index_in_bounds("i64", &iv, &dims, buffer, d)?;
                    }
                    let sv = self.index64(s)?;
                    let p = self.assign("i64", format!("mul {nsw}i64 {}, {}", iv.v, sv.v));
                    off = Some(match off {
                        None => p,
                        Some(o) => self.assign("i64", format!("add {nsw}i64 {}, {}", o.v, p.v)),
                    });
                }
            }
            None => {
                // Dimensions whose indices split one value are merged (`codegen::index`). The
                // offset is 64-bit arithmetic, or 32-bit for a data-dependent access (a gather,
                // for the vectorizer) into fewer than 2^31 elements (`narrow_offsets`), as TVM
                // computes it, widened once: LLVM then gathers with 32-bit indices, 16 lanes on
                // AVX-512 rather than 8. An in-bounds access's partial sums lie between 0 and
                // its offset, so `nsw` holds; an out-of-bounds access is undefined anyway
                // (docs/ir.md).
                let w = if narrow_offsets(buffer, indices) {
                    "i32"
                } else {
                    "i64"
                };
                let dims = crate::codegen::index::contiguous_dims(indices, &buffer.shape);
                let n = dims.len();
                let mut axis = 0;
                for (d, dim) in dims.iter().enumerate() {
                    let iv = self.index_as(w, &dim.index)?;
                    if checked && reads_memory(&dim.index) {
                        self.index_in_bounds(w, &iv, &dim.extents, buffer, axis)?;
                    }
                    axis += dim.extents.len();
                    let Some(mut o) = off.take() else {
                        off = Some(iv);
                        continue;
                    };
                    for e in &dim.extents {
                        let ext = self.index_as(w, e)?;
                        o = self.assign(w, format!("mul {nsw}{w} {}, {}", o.v, ext.v));
                    }
                    if d + 1 == n {
                        // The row's pointer, then the element in it: a second `getelementptr`
                        // rather than a sum, so that a column index that unrolling makes a
                        // constant is an address displacement. As a sum, LLVM 14 rewrote
                        // `row * 16 + 3` into `row * 16 | 3` and the SLP vectorizer built the
                        // addresses of an unrolled row in a vector and extracted each
                        // (TOPI's `resize_nearest` on AVX2: 3-4x TVM's time).
                        off = Some(o);
                        last = Some(iv);
                    } else {
                        off = Some(self.assign(w, format!("add {nsw}{w} {}, {}", o.v, iv.v)));
                    }
                }
                if w == "i32" {
                    let wide = |e: &mut Self, v: Val| {
                        e.assign("i64", format!("sext {} to i64", v.typed()))
                    };
                    off = off.map(|v| wide(self, v));
                    last = last.map(|v| wide(self, v));
                }
            }
        }
        let off = off.unwrap_or_else(|| Val::new("i64", "0"));
        let mt = mem_ty(buffer.dtype);
        let mut p = base;
        for o in std::iter::once(off).chain(last) {
            p = self.assign(
                &Self::ptr(&mt),
                format!("getelementptr {inb}{mt}, {}, i64 {}", p.typed(), o.v),
            );
        }
        Ok(p.v)
    }

    /// Raises an `IndexError` unless `0 <= iv < e0 * e1 * ...` (`extents`: the extents of the
    /// axes from `axis` on that the index `iv`, of type `w`, spans after merging), for an
    /// index read from memory: a gather's, a scatter's or an embedding's index comes from the
    /// caller's data, and out of bounds it would read or write outside the buffer.
    fn index_in_bounds(
        &mut self,
        w: &str,
        iv: &Val,
        extents: &[&Expr],
        buffer: &Buffer,
        axis: usize,
    ) -> R<()> {
        let mut total: Option<Val> = None;
        for e in extents {
            let x = self.index_as(w, e)?;
            total = Some(match total {
                None => x,
                Some(t) => self.assign(w, format!("mul {w} {}, {}", t.v, x.v)),
            });
        }
        let Some(total) = total else { return Ok(()) };
        let ok = self.assign("i1", format!("icmp ult {w} {}, {}", iv.v, total.v));
        let axes = if extents.len() == 1 {
            format!("axis {axis}")
        } else {
            format!("axes {axis}-{} (merged)", axis + extents.len() - 1)
        };
        let size = extents
            .iter()
            .map(|e| e.as_int())
            .try_fold(1i64, |p, e| e.and_then(|e| p.checked_mul(e)))
            .map_or_else(
                || {
                    let parts: Vec<String> = extents.iter().map(|e| e.to_string()).collect();
                    format!("extent {}", parts.join(" * "))
                },
                |n| format!("extent {n}"),
            );
        let msg = format!(
            "index out of bounds in `{}`: an index read from memory is outside {axes} of `{}` ({size})",
            self.kernel_name, buffer.name
        );
        self.check(&ok.v, "IndexError", &msg);
        Ok(())
    }

    /// An index expression as an integer of type `w` (`i32` or `i64`): widened by its sign, or
    /// truncated (a 32-bit offset's constant extents).
    fn index_as(&mut self, w: &str, e: &Expr) -> R<Val> {
        if w == "i64" {
            return self.index64(e);
        }
        let t = e.dtype();
        let v = self.expr(e)?;
        Ok(match v.ty.as_str() {
            "i32" => v,
            "i64" => self.assign("i32", format!("trunc {} to i32", v.typed())),
            _ => {
                let op = if is_signed(t) { "sext" } else { "zext" };
                self.assign("i32", format!("{op} {} to i32", v.typed()))
            }
        })
    }

    /// An index expression widened to i64.
    pub fn index64(&mut self, e: &Expr) -> R<Val> {
        let t = e.dtype();
        let v = self.expr(e)?;
        Ok(self.widen64(t, v))
    }

    pub fn widen64(&mut self, t: DataType, v: Val) -> Val {
        if v.ty == "i64" {
            return v;
        }
        let op = if is_signed(t) { "sext" } else { "zext" };
        self.assign("i64", format!("{op} {} to i64", v.typed()))
    }
}

/// Whether the offset of `buffer[indices]` is computed in 32 bits: a compact buffer of constant
/// shape with fewer than 2^31 elements, indexed by integers of 8 to 32 bits, one of which
/// depends on data (a load, or a float converted to an integer: `take`, `resize`), so that the
/// vectorizer can only gather. Affine and `div`/`mod` indices keep 64-bit arithmetic: narrowed,
/// LLVM 14 vectorized `reshape` and the pools worse (0.78 -> 0.41x, 0.90 -> 0.61x TVM's time).
fn narrow_offsets(buffer: &Buffer, indices: &[Expr]) -> bool {
    let mut n: i64 = 1;
    for d in &buffer.shape {
        match d.as_int() {
            Some(e) if e >= 0 => match n.checked_mul(e) {
                Some(m) if m < 1 << 31 => n = m,
                _ => return false,
            },
            _ => return false,
        }
    }
    let small_int = |t: DataType| {
        t.lanes == 1
            && matches!(t.code, TypeCode::Int | TypeCode::UInt)
            && (8..=32).contains(&t.bits)
    };
    indices.iter().all(|i| small_int(i.dtype())) && indices.iter().any(data_dependent)
}

/// Whether `e` reads memory or converts a float to an integer.
fn data_dependent(e: &Expr) -> bool {
    use crate::ir::visit::{walk_expr, Visitor};
    struct Find(bool);
    impl Visitor for Find {
        fn expr(&mut self, e: &Expr) {
            match e {
                Expr::Load { .. } | Expr::CallExtern { .. } => self.0 = true,
                Expr::Cast { value, .. }
                    if matches!(value.dtype().code, TypeCode::Float | TypeCode::BFloat) =>
                {
                    self.0 = true
                }
                _ => walk_expr(self, e),
            }
        }
    }
    let mut f = Find(false);
    f.expr(e);
    f.0
}
