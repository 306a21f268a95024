//! Value ranges of expressions, for float → integer conversions that need no saturation.
//!
//! kiln's float → integer `cast` saturates (NaN → 0, out of range → the limit; `docs/ir.md`).
//! The CPU emitter writes that as a conversion and three selects: seven instructions per AVX2
//! vector where TVM's build has one `vcvttps2dq`, and a `sitofp(fptosi(floor(x)))` that LLVM
//! cannot fold. Most such casts in TVM's operators compute an index from a loop variable, as in
//! `resize`: `int32(floor((float32(i) + 0.5) * 0.8 - 0.5))` with `i` in `[0, 20)` lies in
//! `[-1, 15]`, and never saturates.
//!
//! [`in_range_casts`] finds the float → integer casts of a function body whose operand provably
//! lies well inside the integer type's range and is never NaN or infinite, by interval
//! arithmetic over loop variables of constant bounds (and `let`s of them), integer and float
//! constants, `+ - *`, division by a constant interval that excludes 0, floor division and
//! modulo by a positive constant, `min`/`max`, `select`, integer ↔ float casts and
//! `floor ceil round trunc nearbyint abs`. Anything else (a load, a call, a symbolic extent) is
//! unknown, and its casts keep their saturation. For such a cast the plain conversion gives the
//! same value as the saturating one, so the emitter writes only that.
//!
//! Float arithmetic is bounded in `f64` and widened by a relative 2^-20 (float32 rounds by at
//! most 2^-24 per operation) plus an absolute 2^-100 (subnormal underflow); integer arithmetic
//! is exact in `f64` below 2^53, and wider bounds are unknown. A cast is accepted only when its
//! operand stays within half of the target's range, so rounding in the bounds never decides.
//!
//! Casts are named by their address in the body the emitter walks, which must not change
//! between the analysis and the emission (an expression rebuilt in between is simply not found,
//! and keeps its saturation).

use std::collections::{HashMap, HashSet};

use crate::ir::{BinOp, DataType, Expr, Intrinsic, Stmt, TypeCode, VarId};

/// A closed interval of values, finite and never NaN.
type Iv = (f64, f64);

/// The addresses of the float → integer casts in `body` whose operand provably fits the
/// integer type (see the module docs).
pub(crate) fn in_range_casts(body: &Stmt) -> HashSet<usize> {
    let mut a = Analysis {
        env: HashMap::new(),
        found: HashSet::new(),
    };
    a.stmt(body);
    a.found
}

struct Analysis {
    env: HashMap<VarId, Iv>,
    found: HashSet<usize>,
}

const LIMIT: f64 = 9.007_199_254_740_992e15; // 2^53: beyond, f64 bounds are not exact

fn checked(iv: Iv) -> Option<Iv> {
    (iv.0.is_finite() && iv.1.is_finite() && iv.0 <= iv.1 && iv.0 > -LIMIT && iv.1 < LIMIT)
        .then_some(iv)
}

fn is_float(t: DataType) -> bool {
    matches!(t.code, TypeCode::Float | TypeCode::BFloat)
}

fn is_int(t: DataType) -> bool {
    matches!(t.code, TypeCode::Int | TypeCode::UInt)
}

/// `iv` widened for the rounding of one float operation (nothing for integers).
fn round(t: DataType, iv: Iv) -> Option<Iv> {
    if !is_float(t) {
        return checked(iv);
    }
    let pad = |x: f64| x.abs() * (1.0 / 1_048_576.0) + 1e-30;
    checked((iv.0 - pad(iv.0), iv.1 + pad(iv.1)))
}

/// The range of integers of type `t` (`None` for other types).
fn int_range(t: DataType) -> Option<Iv> {
    if !is_int(t) || t.lanes != 1 || t.bits == 0 || t.bits > 64 {
        return None;
    }
    let bits = i32::from(t.bits);
    Some(if t.code == TypeCode::Int {
        (-(2f64.powi(bits - 1)), 2f64.powi(bits - 1) - 1.0)
    } else {
        (0.0, 2f64.powi(bits) - 1.0)
    })
}

fn hull(a: Iv, b: Iv) -> Iv {
    (a.0.min(b.0), a.1.max(b.1))
}

fn mul(a: Iv, b: Iv) -> Iv {
    let p = [a.0 * b.0, a.0 * b.1, a.1 * b.0, a.1 * b.1];
    (
        p.iter().copied().fold(f64::INFINITY, f64::min),
        p.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

impl Analysis {
    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                let range = match (self.expr(min), self.expr(extent)) {
                    (Some(m), Some(e)) if e.1 >= 1.0 => checked((m.0, m.1 + e.1 - 1.0)),
                    _ => None,
                };
                self.bind(var.id, range, |a| a.stmt(body));
            }
            Stmt::Let { var, value, body } => {
                let v = self.expr(value);
                self.bind(var.id, v, |a| a.stmt(body));
            }
            Stmt::Store { indices, value, .. } => {
                for i in indices {
                    self.expr(i);
                }
                self.expr(value);
            }
            Stmt::Allocate { buffer, body } => {
                for d in &buffer.shape {
                    self.expr(d);
                }
                self.stmt(body);
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                self.expr(cond);
                self.stmt(then_case);
                if let Some(e) = else_case {
                    self.stmt(e);
                }
            }
            Stmt::While { cond, body } => {
                self.expr(cond);
                self.stmt(body);
            }
            Stmt::Seq(v) => v.iter().for_each(|s| self.stmt(s)),
            Stmt::Evaluate(e) | Stmt::Return(e) => {
                self.expr(e);
            }
            Stmt::Assert { cond, .. } => {
                self.expr(cond);
            }
            _ => {}
        }
    }

    /// Runs `f` with `id` bound to `range` (unknown when `None`), then restores the binding.
    fn bind(&mut self, id: VarId, range: Option<Iv>, f: impl FnOnce(&mut Self)) {
        let old = match range {
            Some(r) => self.env.insert(id, r),
            None => self.env.remove(&id),
        };
        f(self);
        match old {
            Some(r) => self.env.insert(id, r),
            None => self.env.remove(&id),
        };
    }

    /// The range of `e`'s value, visiting all of it (so that every cast inside is judged).
    fn expr(&mut self, e: &Expr) -> Option<Iv> {
        match e {
            Expr::IntImm { value, .. } => checked((*value as f64, *value as f64)),
            Expr::FloatImm { value, .. } => checked((*value, *value)),
            Expr::Var(v) => self.env.get(&v.id).copied(),
            Expr::Binary { op, a, b } => {
                let (x, y) = (self.expr(a), self.expr(b));
                let t = e.dtype();
                if t.lanes != 1 || !(is_float(t) || is_int(t)) {
                    return None;
                }
                let (x, y) = (x?, y?);
                let r = match op {
                    BinOp::Add => (x.0 + y.0, x.1 + y.1),
                    BinOp::Sub => (x.0 - y.1, x.1 - y.0),
                    BinOp::Mul => mul(x, y),
                    BinOp::Div if y.0 > 0.0 || y.1 < 0.0 => {
                        let q = mul(x, (1.0 / y.1, 1.0 / y.0));
                        if is_float(t) {
                            q
                        } else {
                            (q.0.floor() - 1.0, q.1.ceil() + 1.0)
                        }
                    }
                    BinOp::FloorDiv if is_int(t) && y.0 > 0.0 && y.0 == y.1 => {
                        ((x.0 / y.0).floor(), (x.1 / y.0).floor())
                    }
                    BinOp::FloorMod if is_int(t) && y.0 > 0.0 && y.0 == y.1 => (0.0, y.0 - 1.0),
                    BinOp::Min => (x.0.min(y.0), x.1.min(y.1)),
                    BinOp::Max => (x.0.max(y.0), x.1.max(y.1)),
                    _ => return None,
                };
                let r = round(t, r)?;
                // An integer result outside its type would wrap: unknown.
                match int_range(t) {
                    Some(lim) if r.0 < lim.0 || r.1 > lim.1 => None,
                    _ => Some(r),
                }
            }
            Expr::Select { cond, t, f } => {
                self.expr(cond);
                let (x, y) = (self.expr(t), self.expr(f));
                Some(hull(x?, y?))
            }
            Expr::Cast { dtype, value, .. } => {
                let x = self.expr(value);
                let from = value.dtype();
                if from.lanes != 1 || dtype.lanes != 1 {
                    return None;
                }
                let x = x?;
                if is_float(from) && is_int(*dtype) {
                    let lim = int_range(*dtype)?;
                    // Half the range either side of 0 (all of [0, half) unsigned): rounding in
                    // the bounds cannot matter.
                    let (lo, hi) = if dtype.code == TypeCode::Int {
                        (lim.0 / 2.0, lim.1 / 2.0)
                    } else {
                        (0.0, lim.1 / 2.0)
                    };
                    if x.0 >= lo && x.1 <= hi {
                        self.found.insert(e as *const Expr as usize);
                        return checked((x.0.trunc(), x.1.trunc()));
                    }
                    None
                } else if is_int(from) && is_float(*dtype) {
                    round(*dtype, x)
                } else if is_int(from) && is_int(*dtype) {
                    let lim = int_range(*dtype)?;
                    (x.0 >= lim.0 && x.1 <= lim.1).then_some(x)
                } else if is_float(from) && is_float(*dtype) {
                    round(*dtype, x)
                } else {
                    None
                }
            }
            Expr::Let { var, value, body } => {
                let v = self.expr(value);
                let mut out = None;
                self.bind(var.id, v, |a| out = a.expr(body));
                out
            }
            Expr::Call { op, args } => {
                let ivs: Vec<Option<Iv>> = args.iter().map(|a| self.expr(a)).collect();
                let t = e.dtype();
                if t.lanes != 1 || !is_float(t) || ivs.len() != 1 {
                    return None;
                }
                let x = ivs[0]?;
                let r = match op {
                    Intrinsic::Floor => (x.0.floor(), x.1.floor()),
                    Intrinsic::Ceil => (x.0.ceil(), x.1.ceil()),
                    Intrinsic::Trunc => (x.0.trunc(), x.1.trunc()),
                    Intrinsic::Round | Intrinsic::Nearbyint => (x.0.floor(), x.1.ceil()),
                    Intrinsic::Abs if x.0 >= 0.0 => x,
                    Intrinsic::Abs if x.1 <= 0.0 => (-x.1, -x.0),
                    Intrinsic::Abs => (0.0, x.1.max(-x.0)),
                    _ => return None,
                };
                checked(r)
            }
            Expr::IfThenElse { cond, t, f } => {
                self.expr(cond);
                let (x, y) = (self.expr(t), self.expr(f));
                Some(hull(x?, y?))
            }
            Expr::Not(a) | Expr::Reinterpret { value: a, .. } => {
                self.expr(a);
                None
            }
            Expr::Load { indices, .. } => {
                for i in indices {
                    self.expr(i);
                }
                None
            }
            Expr::CallExtern { args, .. } => {
                for a in args {
                    self.expr(a);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::builder::{floor, let_expr, select};
    use crate::ir::{Buffer, ForKind, Var};

    /// `out[i] = float(cast(int32, e(i)))` over `i` in `[0, n)`; the cast's address.
    fn one_cast(n: i64, e: impl Fn(Expr) -> Expr) -> (Stmt, usize) {
        let i = Var::new("i", DataType::i32());
        let out = Buffer::new("out", DataType::f32(), vec![Expr::from(n as i32)]);
        let value = e(Expr::Var(i.clone())).cast(DataType::i32());
        let body = out.store(vec![Expr::Var(i.clone())], value.cast(DataType::f32()));
        let s = Stmt::For {
            var: i,
            min: Expr::from(0i32),
            extent: Expr::from(n as i32),
            kind: ForKind::Serial,
            body: Box::new(body),
        };
        let Stmt::For { body, .. } = &s else {
            unreachable!()
        };
        let Stmt::Store { value, .. } = &**body else {
            unreachable!()
        };
        let Expr::Cast { value: inner, .. } = value else {
            unreachable!()
        };
        let addr = &**inner as *const Expr as usize;
        (s, addr)
    }

    fn proven(n: i64, e: impl Fn(Expr) -> Expr) -> bool {
        let (s, addr) = one_cast(n, e);
        in_range_casts(&s).contains(&addr)
    }

    fn f(i: Expr) -> Expr {
        i.cast(DataType::f32())
    }

    #[test]
    fn a_resize_index_needs_no_saturation() {
        // TOPI's bilinear resize: floor((i + 0.5) * 0.8 - 0.5) in [-1, 15].
        assert!(proven(20, |i| floor((f(i) + 0.5f32) * 0.8f32 - 0.5f32)));
        assert!(proven(20, |i| floor(f(i) * 0.8f32)
            .min(15.0f32)
            .max(0.0f32)));
        assert!(proven(20, |i| select(
            i.clone().lt(3i32),
            f(i.clone()),
            -f(i) - 7.0f32
        )));
        assert!(proven(20, |i| let_expr("x", f(i), |x| x.clone() * x)));
        assert!(proven(20, |i| f(i.floordiv(3i32)) / 4.0f32));
    }

    #[test]
    fn a_cast_that_may_saturate_keeps_its_checks() {
        // Within half of int32's range, and beyond it.
        assert!(proven(1000, |i| f(i) * 1.0e6f32));
        assert!(!proven(3000, |i| f(i) * 1.0e6f32));
        // Division by an interval that holds 0, and values that may be NaN or infinite.
        assert!(!proven(20, |i| Expr::from(1.0f32) / f(i)));
        assert!(!proven(20, |i| f(i) * f32::INFINITY));
        assert!(!proven(20, |i| crate::ir::builder::exp(f(i))));
        // Unknown values: a load, a loop of symbolic extent.
        let x = Buffer::new("x", DataType::f32(), vec![Expr::from(20i32)]);
        assert!(!proven(20, |i| x.load(vec![i])));
        let n = Var::new("n", DataType::i32());
        let i = Var::new("i", DataType::i32());
        let c = f(Expr::Var(i.clone())).cast(DataType::i32());
        let s = Stmt::For {
            var: i,
            min: Expr::from(0i32),
            extent: Expr::Var(n),
            kind: ForKind::Serial,
            body: Box::new(Stmt::Evaluate(c)),
        };
        assert!(in_range_casts(&s).is_empty());
    }

    #[test]
    fn unsigned_targets_need_nonnegative_values() {
        let (s, addr) = one_cast(20, |i| f(i) - 1.0f32);
        assert!(in_range_casts(&s).contains(&addr));
        let i = Var::new("i", DataType::i32());
        let c = (f(Expr::Var(i.clone())) - 1.0f32).cast(DataType::u8());
        let u = Stmt::For {
            var: i,
            min: Expr::from(0i32),
            extent: Expr::from(20i32),
            kind: ForKind::Serial,
            body: Box::new(Stmt::Evaluate(c)),
        };
        assert!(in_range_casts(&u).is_empty(), "-1 does not fit uint8");
    }
}
