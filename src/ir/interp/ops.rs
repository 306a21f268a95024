//! The IR's arithmetic on [`Scalar`]s: casts, reinterpretation, binary operators.

use super::value::{read_scalar, write_scalar, Scalar};
use crate::ir::dtype::{DataType, TypeCode};
use crate::ir::expr::BinOp;

/// Converts a value to `t` with the IR's cast rules.
pub fn cast(t: DataType, v: Scalar) -> Scalar {
    match (t.code, v) {
        (TypeCode::Bool, v) => Scalar::Bool(v.as_bool()),
        (TypeCode::Int | TypeCode::UInt, Scalar::Float(_, f)) => {
            let (lo, hi): (i128, i128) = if t.is_uint() {
                (0, (1i128 << t.bits) - 1)
            } else {
                (-(1i128 << (t.bits - 1)), (1i128 << (t.bits - 1)) - 1)
            };
            Scalar::from_int(t, (f as i128).clamp(lo, hi))
        }
        (TypeCode::Int | TypeCode::UInt, v) => Scalar::from_int(t, v.as_i128()),
        (TypeCode::Float | TypeCode::BFloat, Scalar::Float(_, f)) => Scalar::from_float(t, f),
        (TypeCode::Float | TypeCode::BFloat, v) => {
            let i = v.as_i128();
            let f = if t == DataType::f32() {
                i as f32 as f64
            } else {
                i as f64
            };
            Scalar::from_float(t, f)
        }
        (TypeCode::Handle, v) => v,
    }
}

/// Whether the float `f` converts to the integer type `t` without saturating: it is not NaN
/// and its truncation toward zero lies in the type's range.
pub fn fits_int(t: DataType, f: f64) -> bool {
    if !t.is_int() {
        return true;
    }
    if f.is_nan() {
        return false;
    }
    let (lo, hi): (f64, f64) = if t.is_uint() {
        (0.0, 2f64.powi(i32::from(t.bits)))
    } else {
        let h = 2f64.powi(i32::from(t.bits) - 1);
        (-h, h)
    };
    // Truncation toward zero: (lo - 1, hi) exclusive holds exactly the values that fit (`lo`
    // itself named, for 64 bits, where `lo - 1` rounds to `lo`).
    (f > lo - 1.0 || f == lo) && f < hi
}

/// The bits of `v` read as `t`, a type of the same size (NaN payloads may be quieted: the
/// interpreter holds floats as `f64`).
pub fn reinterpret(t: DataType, v: Scalar) -> Scalar {
    let mut bytes = vec![0u8; v.dtype().bytes()];
    write_scalar(v, &mut bytes);
    read_scalar(t, &bytes[..t.bytes().min(bytes.len())])
}

/// Applies `op` in float arithmetic of type `t`: `f32` for types of at most 32 bits, then rounds.
fn float_op(
    t: DataType,
    a: f64,
    b: f64,
    f32op: impl Fn(f32, f32) -> f32,
    f64op: impl Fn(f64, f64) -> f64,
) -> Scalar {
    if t.bits == 64 {
        Scalar::Float(t, f64op(a, b))
    } else {
        Scalar::from_float(t, f32op(a as f32, b as f32) as f64)
    }
}

fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b || (a == b && a.is_sign_positive()) {
        a
    } else {
        b
    }
}

/// Evaluates a binary operator on two values of one type.
///
/// # Errors
/// A message for integer division or modulo by zero.
pub fn binary(op: BinOp, x: Scalar, y: Scalar) -> Result<Scalar, String> {
    let t = x.dtype();
    if op.is_comparison() {
        let r = if t.is_float() {
            let (a, b) = (x.as_f64(), y.as_f64());
            match op {
                BinOp::Eq => a == b,
                BinOp::Ne => a != b,
                BinOp::Lt => a < b,
                BinOp::Le => a <= b,
                BinOp::Gt => a > b,
                _ => a >= b,
            }
        } else {
            let (a, b) = (x.as_i128(), y.as_i128());
            match op {
                BinOp::Eq => a == b,
                BinOp::Ne => a != b,
                BinOp::Lt => a < b,
                BinOp::Le => a <= b,
                BinOp::Gt => a > b,
                _ => a >= b,
            }
        };
        return Ok(Scalar::Bool(r));
    }
    if t.is_bool() {
        let (a, b) = (x.as_bool(), y.as_bool());
        return Ok(Scalar::Bool(match op {
            BinOp::And | BinOp::Mul | BinOp::Min => a && b,
            BinOp::Or | BinOp::Max => a || b,
            _ => a ^ b,
        }));
    }
    if t.is_float() {
        let (a, b) = (x.as_f64(), y.as_f64());
        return Ok(match op {
            BinOp::Add => float_op(t, a, b, |a, b| a + b, |a, b| a + b),
            BinOp::Sub => float_op(t, a, b, |a, b| a - b, |a, b| a - b),
            BinOp::Mul => float_op(t, a, b, |a, b| a * b, |a, b| a * b),
            BinOp::Div => float_op(t, a, b, |a, b| a / b, |a, b| a / b),
            BinOp::Mod => float_op(t, a, b, |a, b| a % b, |a, b| a % b),
            BinOp::FloorDiv => float_op(t, a, b, |a, b| (a / b).floor(), |a, b| (a / b).floor()),
            BinOp::FloorMod => float_op(
                t,
                a,
                b,
                |a, b| a - (a / b).floor() * b,
                |a, b| a - (a / b).floor() * b,
            ),
            BinOp::Min => Scalar::Float(t, fmin(a, b)),
            BinOp::Max => Scalar::Float(t, fmax(a, b)),
            _ => Scalar::Bool(false),
        });
    }
    let (a, b) = (x.as_i128(), y.as_i128());
    let divisor = |b: i128| {
        if b == 0 {
            Err(format!("integer division by zero ({t} `{}`)", op.name()))
        } else {
            Ok(b)
        }
    };
    let r = match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a.wrapping_mul(b),
        BinOp::Div => a / divisor(b)?,
        BinOp::Mod => a % divisor(b)?,
        BinOp::FloorDiv => floor_div(a, divisor(b)?),
        BinOp::FloorMod => {
            let b = divisor(b)?;
            a - floor_div(a, b) * b
        }
        BinOp::Min => a.min(b),
        BinOp::Max => a.max(b),
        BinOp::BitAnd => a & b,
        BinOp::BitOr => a | b,
        BinOp::BitXor => a ^ b,
        BinOp::Shl | BinOp::Shr => {
            let bits = u32::from(t.bits);
            let k = (b as u64 & u64::from(bits - 1)) as u32;
            // `a` is the sign-extended (signed) or zero-extended (unsigned) value.
            if op == BinOp::Shl {
                a << k
            } else {
                a >> k
            }
        }
        _ => 0,
    };
    Ok(Scalar::from_int(t, r))
}

fn floor_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_division_rounds_down() {
        let i = |v| Scalar::i32(v);
        assert_eq!(binary(BinOp::FloorDiv, i(-7), i(2)).unwrap(), i(-4));
        assert_eq!(binary(BinOp::FloorMod, i(-7), i(2)).unwrap(), i(1));
        assert_eq!(binary(BinOp::FloorDiv, i(7), i(-2)).unwrap(), i(-4));
        assert_eq!(binary(BinOp::FloorMod, i(7), i(-2)).unwrap(), i(-1));
        assert_eq!(binary(BinOp::FloorDiv, i(-8), i(-2)).unwrap(), i(4));
        assert_eq!(binary(BinOp::Div, i(-7), i(2)).unwrap(), i(-3));
        assert_eq!(binary(BinOp::Mod, i(-7), i(2)).unwrap(), i(-1));
        assert_eq!(binary(BinOp::Div, i(i32::MIN), i(-1)).unwrap(), i(i32::MIN));
        assert!(binary(BinOp::FloorMod, i(1), i(0)).is_err());
    }
}
