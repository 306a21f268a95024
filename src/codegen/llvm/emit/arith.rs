//! Arithmetic: binary operators (comparisons, logic, float and integer arithmetic), integer
//! division with its zero check, float `min`/`max` with the IR's semantics, and casts
//! (saturating float-to-integer conversions included).

use crate::ir::{BinOp, DataType, Expr, TypeCode};

use super::{float_const, is_signed, reg_ty, Emitter, Val, R};

/// A float `min`/`max` with one constant operand that is not NaN: `(other operand, constant,
/// its value rounded to the type)`. `min` and `max` are commutative in the IR's semantics.
pub(super) fn minmax_by_constant<'e>(
    op: BinOp,
    a: &'e Expr,
    b: &'e Expr,
) -> Option<(&'e Expr, &'e Expr, f64)> {
    if !matches!(op, BinOp::Min | BinOp::Max) {
        return None;
    }
    let value = |e: &Expr| match e {
        Expr::FloatImm { dtype, value } => {
            let v = crate::ir::interp::round_to(*dtype, *value);
            (!v.is_nan()).then_some(v)
        }
        _ => None,
    };
    if let Some(v) = value(b) {
        return Some((a, b, v));
    }
    value(a).map(|v| (b, a, v))
}

fn float_width(ty: &str) -> u32 {
    match ty {
        "half" => 16,
        "float" => 32,
        _ => 64,
    }
}

impl Emitter<'_> {
    pub(super) fn binary(
        &mut self,
        op: BinOp,
        t: DataType,
        x: Val,
        y: Val,
        bexpr: &Expr,
    ) -> R<Val> {
        let ty = x.ty.clone();
        let fm = self.fm();
        if op.is_comparison() {
            let pred = if t.code == TypeCode::Float || t.code == TypeCode::BFloat {
                let p = match op {
                    BinOp::Eq => "oeq",
                    BinOp::Ne => "une",
                    BinOp::Lt => "olt",
                    BinOp::Le => "ole",
                    BinOp::Gt => "ogt",
                    _ => "oge",
                };
                return Ok(self.assign("i1", format!("fcmp {fm}{p} {}, {}", x.typed(), y.v)));
            } else {
                let s = is_signed(t);
                match op {
                    BinOp::Eq => "eq",
                    BinOp::Ne => "ne",
                    BinOp::Lt if s => "slt",
                    BinOp::Le if s => "sle",
                    BinOp::Gt if s => "sgt",
                    BinOp::Ge if s => "sge",
                    BinOp::Lt => "ult",
                    BinOp::Le => "ule",
                    BinOp::Gt => "ugt",
                    _ => "uge",
                }
            };
            return Ok(self.assign("i1", format!("icmp {pred} {}, {}", x.typed(), y.v)));
        }
        if t.code == TypeCode::Bool {
            let o = match op {
                BinOp::And | BinOp::Mul | BinOp::Min => "and",
                BinOp::Or | BinOp::Max => "or",
                _ => "xor",
            };
            return Ok(self.assign("i1", format!("{o} i1 {}, {}", x.v, y.v)));
        }
        if t.code == TypeCode::Float || t.code == TypeCode::BFloat {
            let r = match op {
                BinOp::Add => self.assign(&ty, format!("fadd {fm}{}, {}", x.typed(), y.v)),
                BinOp::Sub => self.assign(&ty, format!("fsub {fm}{}, {}", x.typed(), y.v)),
                BinOp::Mul => self.assign(&ty, format!("fmul {fm}{}, {}", x.typed(), y.v)),
                BinOp::Div => self.assign(&ty, format!("fdiv {fm}{}, {}", x.typed(), y.v)),
                // LLVM 14's NVPTX backend expands `frem` as `x - trunc(x / y) * y`: the
                // division rounds (wrong digits once the quotient is large) and the sign of a
                // zero result is lost (`fmod(-1, -1)` is -0, the expansion gives +0), as a run
                // on an H100 showed. A kernel calls libdevice's exact `fmod` instead.
                BinOp::Mod if self.opts.nvptx => self.call_libm("fmod", &ty, &[x, y]),
                BinOp::Mod => self.assign(&ty, format!("frem {fm}{}, {}", x.typed(), y.v)),
                BinOp::FloorDiv => {
                    let q = self.assign(&ty, format!("fdiv {fm}{}, {}", x.typed(), y.v));
                    self.call_intr("floor", &ty, &[q])
                }
                BinOp::FloorMod => {
                    let q = self.assign(&ty, format!("fdiv {fm}{}, {}", x.typed(), y.v));
                    let f = self.call_intr("floor", &ty, &[q]);
                    let m = self.assign(&ty, format!("fmul {fm}{}, {}", f.typed(), y.v));
                    self.assign(&ty, format!("fsub {fm}{}, {}", x.typed(), m.v))
                }
                BinOp::Min | BinOp::Max => self.fminmax(op == BinOp::Min, &ty, x, y),
                _ => unreachable!("comparisons and logic handled above"),
            };
            return Ok(if t.code == TypeCode::BFloat {
                self.round_bf16(r)
            } else {
                r
            });
        }
        // Integers.
        let s = is_signed(t);
        Ok(match op {
            BinOp::Add => self.assign(&ty, format!("add {}, {}", x.typed(), y.v)),
            BinOp::Sub => self.assign(&ty, format!("sub {}, {}", x.typed(), y.v)),
            BinOp::Mul => self.assign(&ty, format!("mul {}, {}", x.typed(), y.v)),
            BinOp::Min | BinOp::Max => {
                let p = match (op == BinOp::Min, s) {
                    (true, true) => "slt",
                    (true, false) => "ult",
                    (false, true) => "sgt",
                    (false, false) => "ugt",
                };
                let c = self.assign("i1", format!("icmp {p} {}, {}", x.typed(), y.v));
                self.assign(
                    &ty,
                    format!("select i1 {}, {}, {}", c.v, x.typed(), y.typed()),
                )
            }
            BinOp::Div | BinOp::Mod | BinOp::FloorDiv | BinOp::FloorMod => {
                self.int_div(op, t, x, y, bexpr)?
            }
            BinOp::BitAnd => self.assign(&ty, format!("and {}, {}", x.typed(), y.v)),
            BinOp::BitOr => self.assign(&ty, format!("or {}, {}", x.typed(), y.v)),
            BinOp::BitXor => self.assign(&ty, format!("xor {}, {}", x.typed(), y.v)),
            BinOp::Shl | BinOp::Shr => {
                // The amount is taken modulo the width: never poison.
                let k = self.assign(&ty, format!("and {}, {}", y.typed(), t.bits - 1));
                let o = match (op, s) {
                    (BinOp::Shl, _) => "shl",
                    (_, true) => "ashr",
                    _ => "lshr",
                };
                self.assign(&ty, format!("{o} {}, {}", x.typed(), k.v))
            }
            _ => unreachable!("logic ops on integers are rejected by the verifier"),
        })
    }

    fn int_div(&mut self, op: BinOp, t: DataType, x: Val, y: Val, bexpr: &Expr) -> R<Val> {
        let ty = x.ty.clone();
        let const_b = bexpr.as_int();
        if self.opts.nvptx {
            // A kernel cannot raise: a zero divisor gives 0 (computed with divisor 1).
            if const_b == Some(0) {
                return Ok(Val::new(ty, "0"));
            }
            if const_b.is_none() {
                let z = self.assign("i1", format!("icmp eq {}, 0", y.typed()));
                let y1 = self.assign(&ty, format!("select i1 {}, {ty} 1, {}", z.v, y.typed()));
                let r = self.int_div_nonzero(op, t, x, y1, None)?;
                return Ok(self.assign(&ty, format!("select i1 {}, {ty} 0, {}", z.v, r.typed())));
            }
        }
        if const_b != Some(0) && const_b.is_none() {
            let nz = self.assign("i1", format!("icmp ne {}, 0", y.typed()));
            let msg = format!(
                "integer division by zero ({t} `{}`) in `{}`",
                op.name(),
                self.kernel_name
            );
            self.check(&nz.v, "RuntimeError", &msg);
        } else if const_b == Some(0) {
            let msg = format!(
                "integer division by zero ({t} `{}`) in `{}`",
                op.name(),
                self.kernel_name
            );
            self.raise("RuntimeError", &msg);
            self.free_live();
            self.line("ret i32 -1");
            let dead = self.new_label("dead");
            self.start_block(&dead);
            return Ok(Val::new(ty, "0"));
        }
        self.int_div_nonzero(op, t, x, y, const_b)
    }

    /// `x op y` for a divisor that is not zero (`const_b`: its value if constant).
    fn int_div_nonzero(
        &mut self,
        op: BinOp,
        t: DataType,
        x: Val,
        y: Val,
        const_b: Option<i64>,
    ) -> R<Val> {
        let ty = x.ty.clone();
        let s = is_signed(t);
        if !s {
            let o = if matches!(op, BinOp::Div | BinOp::FloorDiv) {
                "udiv"
            } else {
                "urem"
            };
            return Ok(self.assign(&ty, format!("{o} {}, {}", x.typed(), y.v)));
        }
        // Signed: INT_MIN / -1 wraps (quotient INT_MIN, remainder 0) instead of being UB.
        let (yd, m1) = if const_b.is_some() {
            (y.clone(), None)
        } else {
            let m1 = self.assign("i1", format!("icmp eq {}, -1", y.typed()));
            let yd = self.assign(&ty, format!("select i1 {}, {ty} 1, {}", m1.v, y.typed()));
            (yd, Some(m1))
        };
        let q0 = self.assign(&ty, format!("sdiv {}, {}", x.typed(), yd.v));
        let r0 = self.assign(&ty, format!("srem {}, {}", x.typed(), yd.v));
        let (q, r) = match &m1 {
            Some(m1) => {
                let neg = self.assign(&ty, format!("sub {ty} 0, {}", x.v));
                let q = self.assign(
                    &ty,
                    format!("select i1 {}, {ty} {}, {}", m1.v, neg.v, q0.typed()),
                );
                let r = self.assign(&ty, format!("select i1 {}, {ty} 0, {}", m1.v, r0.typed()));
                (q, r)
            }
            None => (q0, r0),
        };
        Ok(match op {
            BinOp::Div => q,
            BinOp::Mod => r,
            _ => {
                // Floor: adjust when the remainder is non-zero and its sign differs from b's.
                let rnz = self.assign("i1", format!("icmp ne {}, 0", r.typed()));
                let rneg = self.assign("i1", format!("icmp slt {}, 0", r.typed()));
                let bneg = self.assign("i1", format!("icmp slt {}, 0", y.typed()));
                let diff = self.assign("i1", format!("xor i1 {}, {}", rneg.v, bneg.v));
                let adj = self.assign("i1", format!("and i1 {}, {}", rnz.v, diff.v));
                if op == BinOp::FloorDiv {
                    let qm = self.assign(&ty, format!("sub {}, 1", q.typed()));
                    self.assign(
                        &ty,
                        format!("select i1 {}, {}, {}", adj.v, qm.typed(), q.typed()),
                    )
                } else {
                    let rb = self.assign(&ty, format!("add {}, {}", r.typed(), y.v));
                    self.assign(
                        &ty,
                        format!("select i1 {}, {}, {}", adj.v, rb.typed(), r.typed()),
                    )
                }
            }
        })
    }

    /// `min(x, c)` / `max(x, c)` for a constant `c` (value `cv`, not NaN) with the IR's
    /// semantics in one compare and one select, which vectorizes and keeps a reduction's
    /// dependency chain short (relu and clip are `max(x, 0)`, `min(max(x, lo), hi)`): a NaN `x`
    /// is returned; between equal operands only `max(-0, +0)` and `min(+0, -0)` differ from
    /// "keep `x`", so `c = +0` for max and `c = -0` for min take the other ordered test.
    /// `bt` is the predicate type (`i1` or `<n x i1>`).
    pub(super) fn fminmax_const(&mut self, min: bool, bt: &str, x: Val, c: Val, cv: f64) -> Val {
        let zero_sign_matters = cv == 0.0 && (cv.is_sign_negative() == min);
        // (predicate, x when true) — x is kept when the predicate holds.
        let pred = match (min, zero_sign_matters) {
            (false, true) => "ugt",  // max(x, +0): x if x > 0 or NaN, else +0
            (true, true) => "ult",   // min(x, -0): x if x < 0 or NaN, else -0
            (false, false) => "uge", // max(x, c): x unless x < c
            (true, false) => "ule",  // min(x, c): x unless x > c
        };
        let k = self.assign(bt, format!("fcmp {pred} {}, {}", x.typed(), c.v));
        let ty = x.ty.clone();
        self.assign(
            &ty,
            format!("select {bt} {}, {}, {}", k.v, x.typed(), c.typed()),
        )
    }

    /// IEEE minimum/maximum: NaN if either is NaN, -0 below +0.
    fn fminmax(&mut self, min: bool, ty: &str, x: Val, y: Val) -> Val {
        let ibits = match ty {
            "half" => "i16",
            "float" => "i32",
            _ => "i64",
        };
        let qnan = if ty == "half" {
            "0xH7E00"
        } else {
            "0x7FF8000000000000"
        };
        self.minmax_by_lanes(min, "i1", ibits, &format!("{ty} {qnan}"), x, y)
    }

    /// IEEE minimum/maximum of two values of one float type, scalar or vector (`bt` the
    /// type of a comparison's result, `ity` the integer type of the same width, `qnan` the
    /// typed quiet NaN); with `nnan nsz` fast math, a plain compare and select.
    ///
    /// Written without logic on the comparisons' `i1`s: `a = x > y ? x : y` and
    /// `b = y > x ? y : x` are equal unless `x == y` or one is NaN; between equal operands
    /// the AND (max) or the OR (min) of their bits picks the right zero, and a final select
    /// puts NaN where either operand is NaN. Each step is one instruction per vector on
    /// x86 (`maxps`, `andps`, `cmpunordps`, `blendvps`), where `and`/`or` of wide `<N x i1>`
    /// vectors, without AVX-512's mask registers, are packed to bytes and back (kiln's
    /// softmax spent most of its time there on AVX2).
    pub(super) fn minmax_by_lanes(
        &mut self,
        min: bool,
        bt: &str,
        ity: &str,
        qnan: &str,
        x: Val,
        y: Val,
    ) -> Val {
        let fm = self.fm();
        let ty = x.ty.clone();
        let p = if min { "olt" } else { "ogt" };
        let c = self.assign(bt, format!("fcmp {fm}{p} {}, {}", x.typed(), y.v));
        let a = self.assign(
            &ty,
            format!("select {fm}{bt} {}, {}, {}", c.v, x.typed(), y.typed()),
        );
        if self.opts.fast_math == "fast"
            || (self.opts.fast_math.contains("nnan") && self.opts.fast_math.contains("nsz"))
        {
            // No NaNs and no signed zeros: a compare and select (a min/max reduction for LLVM).
            return a;
        }
        let c2 = self.assign(bt, format!("fcmp {fm}{p} {}, {}", y.typed(), x.v));
        let b = self.assign(
            &ty,
            format!("select {fm}{bt} {}, {}, {}", c2.v, y.typed(), x.typed()),
        );
        let ab = self.assign(ity, format!("bitcast {} to {ity}", a.typed()));
        let bb = self.assign(ity, format!("bitcast {} to {ity}", b.typed()));
        let op = if min { "or" } else { "and" };
        let rb = self.assign(ity, format!("{op} {}, {}", ab.typed(), bb.v));
        let r = self.assign(&ty, format!("bitcast {} to {ty}", rb.typed()));
        let nan = self.assign(bt, format!("fcmp uno {}, {}", x.typed(), y.v));
        self.assign(&ty, format!("select {bt} {}, {qnan}, {}", nan.v, r.typed()))
    }

    /// A saturating float→int conversion (NaN → 0, out of range → the limit) as a plain
    /// conversion and three selects, for `float`/`double` to a scalar integer, else `None`.
    ///
    /// Same results as `llvm.fpto[su]i.sat`, which LLVM 14's loop vectorizer does not widen
    /// (a loop of it stays scalar: TOPI's `cast` ran at 2.4x TVM's time). The conversion's
    /// result is poison where `x` is out of range or NaN, and exactly there a select takes
    /// another value (a select's unchosen operand may be poison): `x >= 2^k` (the maximum + 1)
    /// the maximum, `x < lo` the minimum, NaN 0. Selects on the result, rather than clamping
    /// `x` first with `maxnum`/`minnum` (three instructions each in AVX2 vector code, for NaN):
    /// a vectorized cast went from about 13 instructions per vector to 7. No fast-math flags:
    /// they could drop the NaN test.
    fn saturating_to_int(&mut self, ft: &str, tt: &str, to: DataType, x: &Val) -> Option<Val> {
        if !matches!(ft, "float" | "double") {
            return None;
        }
        if to.lanes != 1 || !tt.starts_with('i') || to.bits > 64 || to.bits < 8 {
            return None;
        }
        let signed = is_signed(to);
        let k = u32::from(to.bits) - u32::from(signed); // 2^k = the maximum + 1
        let lo = if signed { -(2f64.powi(k as i32)) } else { 0.0 };
        let two_k = 2f64.powi(k as i32);
        let fdt = if ft == "float" {
            DataType::f32()
        } else {
            DataType::f64()
        };
        let op = if signed { "fptosi" } else { "fptoui" };
        let mut r = self.assign(tt, format!("{op} {} to {tt}", x.typed()));
        // The maximum and the minimum as LLVM reads them (an unsigned maximum is all ones).
        let (max, min) = if signed {
            (((1u64 << k) - 1).to_string(), format!("-{}", 1u64 << k))
        } else {
            ("-1".to_string(), "0".to_string())
        };
        for (pred, bound, limit) in [("oge", two_k, max), ("olt", lo, min)] {
            let out = self.assign(
                "i1",
                format!("fcmp {pred} {}, {}", x.typed(), float_const(fdt, bound)),
            );
            r = self.assign(
                tt,
                format!("select i1 {}, {tt} {limit}, {}", out.v, r.typed()),
            );
        }
        let nan = self.assign("i1", format!("fcmp uno {}, 0.0", x.typed()));
        Some(self.assign(tt, format!("select i1 {}, {tt} 0, {}", nan.v, r.typed())))
    }

    pub(super) fn cast(&mut self, from: DataType, to: DataType, x: Val) -> Val {
        let (ft, tt) = (reg_ty(from), reg_ty(to));
        let from_float = matches!(from.code, TypeCode::Float | TypeCode::BFloat);
        let to_float = matches!(to.code, TypeCode::Float | TypeCode::BFloat);
        let v = if to.code == TypeCode::Bool {
            if from.code == TypeCode::Bool {
                return x;
            }
            if from_float {
                return self.assign("i1", format!("fcmp une {}, 0.0", x.typed()));
            }
            return self.assign("i1", format!("icmp ne {}, 0", x.typed()));
        } else if from_float && to_float {
            let fw = float_width(&ft);
            let tw = float_width(&tt);
            if fw < tw {
                self.assign(&tt, format!("fpext {} to {tt}", x.typed()))
            } else if fw > tw {
                self.assign(&tt, format!("fptrunc {} to {tt}", x.typed()))
            } else {
                x
            }
        } else if from_float {
            if let Some(v) = self.saturating_to_int(&ft, &tt, to, &x) {
                return v;
            }
            let sat = if is_signed(to) { "fptosi" } else { "fptoui" };
            let name = format!("llvm.{sat}.sat.{tt}.{}", Self::intr_suffix(&ft));
            self.m
                .declares
                .insert(format!("declare {tt} @{name}({ft})"));
            self.assign(&tt, format!("call {tt} @{name}({})", x.typed()))
        } else if to_float {
            let op = if is_signed(from) { "sitofp" } else { "uitofp" };
            self.assign(&tt, format!("{op} {} to {tt}", x.typed()))
        } else {
            let fb = if from.code == TypeCode::Bool {
                1
            } else {
                u32::from(from.bits)
            };
            let tb = u32::from(to.bits);
            if fb < tb {
                let op = if is_signed(from) { "sext" } else { "zext" };
                self.assign(&tt, format!("{op} {} to {tt}", x.typed()))
            } else if fb > tb {
                self.assign(&tt, format!("trunc {} to {tt}", x.typed()))
            } else {
                Val::new(tt, x.v)
            }
        };
        if to.code == TypeCode::BFloat {
            self.round_bf16(v)
        } else {
            v
        }
    }
}
