//! Math intrinsics: calls of LLVM intrinsics (`llvm.<name>.<fN>`) and of libm, integer
//! intrinsics, float predicates, and the float32 `fast_exp` polynomial shared by scalar and
//! vector code.

use crate::ir::{DataType, Intrinsic, TypeCode};

use super::{float_const, is_signed, reg_ty, unsupported, Emitter, Val, R};

impl Emitter<'_> {
    pub(super) fn intr_suffix(ty: &str) -> &'static str {
        match ty {
            "half" => "f16",
            "float" => "f32",
            _ => "f64",
        }
    }

    /// Calls `llvm.<name>.<fN>`.
    pub(super) fn call_intr(&mut self, name: &str, ty: &str, args: &[Val]) -> Val {
        if self.opts.nvptx && super::kernel::needs_libdevice(name) {
            return self.call_libm(name, ty, args);
        }
        // LLVM 14's NVPTX backend cannot select `roundeven` (it aborts); `rint` rounds the same
        // way in the default rounding mode, which a kernel never changes.
        let name = if self.opts.nvptx && name == "roundeven" {
            "rint"
        } else {
            name
        };
        let sfx = Self::intr_suffix(ty);
        let params = vec![ty; args.len()].join(", ");
        self.m
            .declares
            .insert(format!("declare {ty} @llvm.{name}.{sfx}({params})"));
        let a = args.iter().map(Val::typed).collect::<Vec<_>>().join(", ");
        let fm = self.fm();
        self.assign(ty, format!("call {fm}{ty} @llvm.{name}.{sfx}({a})"))
    }

    /// Calls a libm function in float or double (half goes through float).
    pub(super) fn call_libm(&mut self, name: &str, ty: &str, args: &[Val]) -> Val {
        let cty = if ty == "half" { "float" } else { ty }.to_owned();
        let mut xs = Vec::new();
        for x in args {
            xs.push(if ty == "half" {
                self.assign("float", format!("fpext half {} to float", x.v))
            } else {
                x.clone()
            });
        }
        let fname = if self.opts.nvptx {
            super::kernel::libdevice_name(name, &cty)
        } else if cty == "float" {
            format!("{name}f")
        } else {
            name.to_owned()
        };
        let params = vec![cty.as_str(); xs.len()].join(", ");
        self.m
            .declares
            .insert(format!("declare {cty} @{fname}({params})"));
        let a = xs
            .iter()
            .map(|x| format!("{cty} {}", x.v))
            .collect::<Vec<_>>()
            .join(", ");
        let r = self.assign(&cty, format!("call {cty} @{fname}({a})"));
        if ty == "half" {
            self.assign("half", format!("fptrunc float {} to half", r.v))
        } else {
            r
        }
    }

    pub(super) fn intrinsic(&mut self, op: Intrinsic, t: DataType, a: &[Val]) -> R<Val> {
        let ty = reg_ty(t);
        if a.len() != op.arity() {
            return Err(unsupported(format!(
                "intrinsic `{}` takes {} arguments, got {}",
                op.name(),
                op.arity(),
                a.len()
            )));
        }
        if t.code != TypeCode::Float && t.code != TypeCode::BFloat {
            if op == Intrinsic::Abs {
                let neg = self.assign(&ty, format!("sub {ty} 0, {}", a[0].v));
                let lt = if is_signed(t) {
                    self.assign("i1", format!("icmp slt {}, 0", a[0].typed()))
                } else {
                    Val::new("i1", "false")
                };
                return Ok(self.assign(
                    &ty,
                    format!("select i1 {}, {}, {}", lt.v, neg.typed(), a[0].typed()),
                ));
            }
            if op.is_integer() && t.is_int() {
                let x = a[0].typed();
                return Ok(match op {
                    Intrinsic::BitwiseNot => self.assign(&ty, format!("xor {x}, -1")),
                    Intrinsic::Clz => {
                        self.m
                            .declares
                            .insert(format!("declare {ty} @llvm.ctlz.{ty}({ty}, i1)"));
                        self.assign(&ty, format!("call {ty} @llvm.ctlz.{ty}({x}, i1 false)"))
                    }
                    _ => {
                        self.m
                            .declares
                            .insert(format!("declare {ty} @llvm.ctpop.{ty}({ty})"));
                        self.assign(&ty, format!("call {ty} @llvm.ctpop.{ty}({x})"))
                    }
                });
            }
            return Err(unsupported(format!("intrinsic `{}` on {t}", op.name())));
        }
        if op.is_predicate() {
            let x = a[0].clone();
            if op == Intrinsic::IsNan {
                return Ok(self.assign("i1", format!("fcmp uno {}, {}", x.typed(), x.v)));
            }
            let rt = match ty.as_str() {
                "half" => DataType::f16(),
                "float" => DataType::f32(),
                _ => DataType::f64(),
            };
            let inf = float_const(rt, f64::INFINITY);
            let sfx = Self::intr_suffix(&ty);
            self.m
                .declares
                .insert(format!("declare {ty} @llvm.fabs.{sfx}({ty})"));
            let ab = self.assign(&ty, format!("call {ty} @llvm.fabs.{sfx}({})", x.typed()));
            let p = if op == Intrinsic::IsInf { "oeq" } else { "one" };
            return Ok(self.assign("i1", format!("fcmp {p} {}, {inf}", ab.typed())));
        }
        let fm = self.fm();
        let one = float_const(
            if ty == "half" {
                DataType::f16()
            } else if ty == "float" {
                DataType::f32()
            } else {
                DataType::f64()
            },
            1.0,
        );
        let x = a[0].clone();
        let r = match op {
            Intrinsic::Exp | Intrinsic::FastExp
                if t == DataType::f32() && (op == Intrinsic::FastExp || self.fast_exp()) =>
            {
                self.fast_exp_poly("float", "float", 1, x)
            }
            Intrinsic::Exp if t == DataType::f32() && self.inline_exp() => {
                self.exp_accurate_poly("float", "float", 1, x)
            }
            Intrinsic::Exp | Intrinsic::FastExp => self.call_intr("exp", &ty, &[x]),
            Intrinsic::Log => self.call_intr("log", &ty, &[x]),
            Intrinsic::Sqrt => self.call_intr("sqrt", &ty, &[x]),
            Intrinsic::Rsqrt => {
                let s = self.call_intr("sqrt", &ty, &[x]);
                self.assign(&ty, format!("fdiv {fm}{ty} {one}, {}", s.v))
            }
            Intrinsic::Tanh => self.call_libm("tanh", &ty, &[x]),
            Intrinsic::Erf if t == DataType::f32() && self.inline_exp() => {
                self.erf_poly("float", "float", 1, x)
            }
            Intrinsic::Erf => self.call_libm("erf", &ty, &[x]),
            Intrinsic::Sigmoid => {
                let n = self.assign(&ty, format!("fneg {fm}{}", x.typed()));
                let e = if t == DataType::f32() && self.inline_exp() {
                    self.exp_accurate_poly("float", "float", 1, n)
                } else {
                    self.call_intr("exp", &ty, &[n])
                };
                let d = self.assign(&ty, format!("fadd {fm}{ty} {one}, {}", e.v));
                self.assign(&ty, format!("fdiv {fm}{ty} {one}, {}", d.v))
            }
            Intrinsic::Pow => self.call_intr("pow", &ty, a),
            Intrinsic::Abs => self.call_intr("fabs", &ty, &[x]),
            Intrinsic::Floor => self.call_intr("floor", &ty, &[x]),
            Intrinsic::Ceil => self.call_intr("ceil", &ty, &[x]),
            Intrinsic::Round => self.call_intr("roundeven", &ty, &[x]),
            Intrinsic::Fma => self.call_intr("fma", &ty, a),
            Intrinsic::Copysign => self.call_intr("copysign", &ty, a),
            Intrinsic::Trunc => self.call_intr("trunc", &ty, &[x]),
            Intrinsic::Nearbyint => self.call_intr("nearbyint", &ty, &[x]),
            Intrinsic::Sin => self.call_intr("sin", &ty, &[x]),
            Intrinsic::Cos => self.call_intr("cos", &ty, &[x]),
            Intrinsic::Log2 => self.call_intr("log2", &ty, &[x]),
            Intrinsic::Log10 => self.call_intr("log10", &ty, &[x]),
            Intrinsic::Exp2 => self.call_intr("exp2", &ty, &[x]),
            Intrinsic::Tan => self.call_libm("tan", &ty, a),
            Intrinsic::Asin => self.call_libm("asin", &ty, a),
            Intrinsic::Acos => self.call_libm("acos", &ty, a),
            Intrinsic::Atan => self.call_libm("atan", &ty, a),
            Intrinsic::Atan2 => self.call_libm("atan2", &ty, a),
            Intrinsic::Sinh => self.call_libm("sinh", &ty, a),
            Intrinsic::Cosh => self.call_libm("cosh", &ty, a),
            Intrinsic::Asinh => self.call_libm("asinh", &ty, a),
            Intrinsic::Acosh => self.call_libm("acosh", &ty, a),
            Intrinsic::Atanh => self.call_libm("atanh", &ty, a),
            Intrinsic::Log1p => self.call_libm("log1p", &ty, a),
            Intrinsic::Exp10 => self.call_libm("exp10", &ty, a),
            Intrinsic::Expm1 => self.call_libm("expm1", &ty, a),
            Intrinsic::Hypot => self.call_libm("hypot", &ty, a),
            Intrinsic::BitwiseNot
            | Intrinsic::Clz
            | Intrinsic::Popcount
            | Intrinsic::IsNan
            | Intrinsic::IsInf
            | Intrinsic::IsFinite => unreachable!("handled above"),
        };
        Ok(if t.code == TypeCode::BFloat {
            self.round_bf16(r)
        } else {
            r
        })
    }

    /// Whether `exp` on float32 (and `sigmoid`'s) is the inline full-range polynomial rather
    /// than a call: on CPUs, where libm's `expf` is a call per element that keeps the loop
    /// scalar. NVPTX has libdevice's `__nv_expf`.
    pub(super) fn inline_exp(&self) -> bool {
        !self.opts.nvptx
    }

    /// Whether `exp` on float32 may use the polynomial (fast math that allows approximations).
    pub(super) fn fast_exp(&self) -> bool {
        self.opts.fast_math == "fast"
    }

    /// `fast_exp(x)` in float32 (scalar `float` or vector `<n x float>` type `ty`): exactly the
    /// sequence of [`crate::ir::approx::fast_exp_f32`] (clamp, Cody-Waite range reduction, a
    /// degree-6 polynomial by fused multiply-adds, `2^k` in the exponent bits; a NaN input
    /// gives a NaN), so the result is the interpreter's bit for bit. Also `exp` under fast math.
    pub(super) fn fast_exp_poly(&mut self, ty: &str, sty: &str, n: i64, x: Val) -> Val {
        self.exp_poly(ty, sty, n, x, false)
    }

    /// `exp(x)` in float32 by the same reduction and polynomial as `fast_exp`, over the whole
    /// range: the input is clamped to [-104, 89] (beyond which `e^x` rounds to 0 or overflows
    /// to ∞ anyway), and `2^k` (`k` in [-150, 128]) is applied as two factors `2^(k>>1)` and
    /// `2^(k - (k>>1))`, each a normal float, so the result rounds once into the subnormal
    /// range or overflows to ∞ as `e^x` does. Within 2 ulp of `e^x` (the bound tested), with
    /// no call: LLVM's loop vectorizer vectorizes it where it cannot vectorize libm's `expf`.
    pub(super) fn exp_accurate_poly(&mut self, ty: &str, sty: &str, n: i64, x: Val) -> Val {
        self.exp_poly(ty, sty, n, x, true)
    }

    /// `erf(x)` in float32 (scalar or vector type `ty`) with no call, so loops of it vectorize:
    /// `x * P(x^2)` for `|x| < 0.921875`, else `±(1 - exp(-a^2) * R(a - c))` with `a = min(|x|,
    /// 3.92)` (`erf` is ±1 in float32 beyond) and the inline `exp`; NaN gives NaN. Within 4 ulp
    /// of `erf` (the bound tested); the coefficients are in [`crate::ir::approx`].
    pub(super) fn erf_poly(&mut self, ty: &str, sty: &str, n: i64, x: Val) -> Val {
        use crate::ir::approx::{ERF_CENTER, ERF_CLAMP, ERF_LARGE_POLY, ERF_SMALL_POLY, ERF_SPLIT};
        let l = F32Lanes { n, sty };
        let c = |v: f64| l.constant(v);
        let (bty, sfx) = (l.of("i1"), l.suffix());
        // `fmuladd`: fused where the CPU has FMA, else a multiply and an add (not libm's `fmaf`).
        for (f, args) in [("fmuladd", 3), ("fabs", 1), ("copysign", 2)] {
            let params = vec![ty; args].join(", ");
            self.m
                .declares
                .insert(format!("declare {ty} @llvm.{f}.{sfx}({params})"));
        }
        let horner = |e: &mut Self, coefs: &[f64], t: &Val| -> Val {
            let (last, rest) = coefs.split_last().expect("a polynomial");
            let mut p = Val::new(ty, c(*last));
            for &k in rest.iter().rev() {
                p = e.assign(
                    ty,
                    format!(
                        "call {ty} @llvm.fmuladd.{sfx}({ty} {}, {ty} {}, {ty} {})",
                        p.v,
                        t.v,
                        c(k)
                    ),
                );
            }
            p
        };
        let ax = self.assign(ty, format!("call {ty} @llvm.fabs.{sfx}({})", x.typed()));
        // |x| < split: x * P(x^2)
        let t = self.assign(ty, format!("fmul {ty} {}, {}", x.v, x.v));
        let ps = horner(self, &ERF_SMALL_POLY, &t);
        let small = self.assign(ty, format!("fmul {ty} {}, {}", x.v, ps.v));
        // else: 1 - exp(-a^2) * R(a - center), with the sign of x
        let over = self.assign(&bty, format!("fcmp ogt {ty} {}, {}", ax.v, c(ERF_CLAMP)));
        let a = self.assign(
            ty,
            format!(
                "select {bty} {}, {ty} {}, {ty} {}",
                over.v,
                c(ERF_CLAMP),
                ax.v
            ),
        );
        let u = self.assign(ty, format!("fsub {ty} {}, {}", a.v, c(ERF_CENTER)));
        let pl = horner(self, &ERF_LARGE_POLY, &u);
        let aa = self.assign(ty, format!("fmul {ty} {}, {}", a.v, a.v));
        let neg = self.assign(ty, format!("fneg {ty} {}", aa.v));
        let e = self.exp_accurate_poly(ty, sty, n, neg);
        let tail = self.assign(ty, format!("fmul {ty} {}, {}", e.v, pl.v));
        let large = self.assign(ty, format!("fsub {ty} {}, {}", c(1.0), tail.v));
        let signed = self.assign(
            ty,
            format!(
                "call {ty} @llvm.copysign.{sfx}({ty} {}, {ty} {})",
                large.v, x.v
            ),
        );
        let is_small = self.assign(&bty, format!("fcmp olt {ty} {}, {}", ax.v, c(ERF_SPLIT)));
        let r = self.assign(
            ty,
            format!(
                "select {bty} {}, {ty} {}, {ty} {}",
                is_small.v, small.v, signed.v
            ),
        );
        let nan = self.assign(&bty, format!("fcmp uno {ty} {}, {}", x.v, x.v));
        self.assign(
            ty,
            format!("select {bty} {}, {ty} {}, {ty} {}", nan.v, x.v, r.v),
        )
    }

    fn exp_poly(&mut self, ty: &str, sty: &str, n: i64, x: Val, full_range: bool) -> Val {
        let l = F32Lanes { n, sty };
        let c = |v: f64| l.constant(v);
        let (ity, bty, sfx) = (l.of("i32"), l.of("i1"), l.suffix());
        // The full-range `exp` is no bit-exact definition: `fmuladd` lets LLVM fuse where the
        // CPU has FMA and multiply and add where it has not (`llvm.fma` would be a call of
        // libm's software `fmaf` there: x86-64 without `-mcpu`, TVM's default `llvm`).
        let fma_name = if full_range { "fmuladd" } else { "fma" };
        for f in [fma_name, "floor"] {
            let params = if f == fma_name {
                format!("{ty}, {ty}, {ty}")
            } else {
                ty.to_owned()
            };
            self.m
                .declares
                .insert(format!("declare {ty} @llvm.{f}.{sfx}({params})"));
        }
        use crate::ir::approx::{
            EXP_HI, EXP_LO, EXP_ROUND, FAST_EXP_HI, FAST_EXP_LO, FAST_EXP_POLY, LN2_HI, LN2_LO,
            LOG2_E,
        };
        let (clamp_hi, clamp_lo) = if full_range {
            (EXP_HI, EXP_LO)
        } else {
            (FAST_EXP_HI, FAST_EXP_LO)
        };
        // No fast-math flags here: the sequence is the IR's definition, bit for bit.
        let hi = self.assign(&bty, format!("fcmp ogt {ty} {}, {}", x.v, c(clamp_hi)));
        let x1 = self.assign(
            ty,
            format!("select {bty} {}, {ty} {}, {ty} {}", hi.v, c(clamp_hi), x.v),
        );
        let lo = self.assign(&bty, format!("fcmp olt {ty} {}, {}", x1.v, c(clamp_lo)));
        let x2 = self.assign(
            ty,
            format!("select {bty} {}, {ty} {}, {ty} {}", lo.v, c(clamp_lo), x1.v),
        );
        // `k`, and `kf` = k + 1.5 * 2^23, whose low mantissa bits hold `k` as an integer: `k`
        // is taken from them below, with no float-to-int conversion (a NaN's would be poison,
        // and would need the input kept to the end to be selected back; here a NaN `x` stays
        // NaN in `y`, and so in the result).
        let (k, kf) = if full_range {
            // k = round(x * log2(e)) by adding 1.5 * 2^23 (exact: one rounding of the fma
            // puts the integer in the low mantissa bits).
            let kf = self.assign(
                ty,
                format!(
                    "call {ty} @llvm.{fma_name}.{sfx}({ty} {}, {ty} {}, {ty} {})",
                    x2.v,
                    c(LOG2_E),
                    c(EXP_ROUND)
                ),
            );
            let k = self.assign(ty, format!("fsub {ty} {}, {}", kf.v, c(EXP_ROUND)));
            (k, kf)
        } else {
            // k = floor(x * log2(e) + 0.5); k + 1.5 * 2^23 is exact for the clamped k.
            let fx = self.assign(
                ty,
                format!(
                    "call {ty} @llvm.fma.{sfx}({ty} {}, {ty} {}, {ty} {})",
                    x2.v,
                    c(LOG2_E),
                    c(0.5)
                ),
            );
            let k = self.assign(ty, format!("call {ty} @llvm.floor.{sfx}({ty} {})", fx.v));
            let kf = self.assign(ty, format!("fadd {ty} {}, {}", k.v, c(EXP_ROUND)));
            (k, kf)
        };
        let fma = |e: &mut Self, a: &str, b: &str, cc: &str| -> Val {
            e.assign(
                ty,
                format!("call {ty} @llvm.{fma_name}.{sfx}({ty} {a}, {ty} {b}, {ty} {cc})"),
            )
        };
        // r = x - k ln2 (ln2 in two parts)
        let r1 = fma(self, &k.v, &c(-LN2_HI), &x2.v);
        let r = fma(self, &k.v, &c(LN2_LO), &r1.v);
        let mut p = fma(self, &c(FAST_EXP_POLY[0]), &r.v, &c(FAST_EXP_POLY[1]));
        for &coef in &FAST_EXP_POLY[2..] {
            p = fma(self, &p.v, &r.v, &c(coef));
        }
        let rr = self.assign(ty, format!("fmul {ty} {}, {}", r.v, r.v));
        let y0 = fma(self, &p.v, &rr.v, &r.v);
        let y = self.assign(ty, format!("fadd {ty} {}, {}", y0.v, c(1.0)));
        let ic = |v: &str| -> String {
            if n > 1 {
                Self::splat_const(n, "i32", v)
            } else {
                v.to_owned()
            }
        };
        // The bits of 1.5 * 2^23 + k are those of 1.5 * 2^23 plus k.
        let bits = self.assign(&ity, format!("bitcast {ty} {} to {ity}", kf.v));
        let ki = self.assign(
            &ity,
            format!(
                "sub {ity} {}, {}",
                bits.v,
                ic(&(EXP_ROUND as f32).to_bits().to_string())
            ),
        );
        let (c127, c23) = (ic("127"), ic("23"));
        let pow2 = |e: &mut Self, k: &Val| -> Val {
            let kb = e.assign(&ity, format!("add {ity} {}, {c127}", k.v));
            let sh = e.assign(&ity, format!("shl {ity} {}, {c23}", kb.v));
            e.assign(ty, format!("bitcast {ity} {} to {ty}", sh.v))
        };
        if full_range {
            // 2^k = 2^k1 * 2^k2, both normal: y * 2^k1 is exact, the second product rounds.
            let k1 = self.assign(&ity, format!("ashr {ity} {}, {}", ki.v, ic("1")));
            let k2 = self.assign(&ity, format!("sub {ity} {}, {}", ki.v, k1.v));
            let s1 = pow2(self, &k1);
            let s2 = pow2(self, &k2);
            let y1 = self.assign(ty, format!("fmul {ty} {}, {}", y.v, s1.v));
            return self.assign(ty, format!("fmul {ty} {}, {}", y1.v, s2.v));
        }
        // A NaN input passes the clamp's selects and makes `y` NaN, so the product is NaN
        // whatever bits its `k` gave the scale.
        let scale = pow2(self, &ki);
        self.assign(ty, format!("fmul {ty} {}, {}", y.v, scale.v))
    }
}

/// The types and constants of float32 code of `n` lanes (`n == 1`: scalar code), for the
/// inline `exp` and `erf`.
struct F32Lanes<'a> {
    n: i64,
    /// The scalar float type's name.
    sty: &'a str,
}

impl F32Lanes<'_> {
    /// The float32 constant `v`, splat across the lanes.
    fn constant(&self, v: f64) -> String {
        let s = float_const(DataType::f32(), v);
        if self.n > 1 {
            Emitter::splat_const(self.n, self.sty, &s)
        } else {
            s
        }
    }

    /// The type of `n` values of scalar type `elem`.
    fn of(&self, elem: &str) -> String {
        if self.n > 1 {
            format!("<{} x {elem}>", self.n)
        } else {
            elem.to_owned()
        }
    }

    /// The suffix of LLVM's float32 intrinsics for these lanes (`f32`, `v16f32`).
    fn suffix(&self) -> String {
        if self.n > 1 {
            format!("v{}f32", self.n)
        } else {
            "f32".to_owned()
        }
    }
}
