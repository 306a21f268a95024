//! Expression evaluation, and the bounds-checked addressing of buffer elements.

use super::value::{read_scalar, Scalar};
use super::{binary, cast, fits_int, intrinsic, reinterpret, Interp};
use crate::ir::error::IrResult;
use crate::ir::expr::Expr;
use crate::ir::func::{Buffer, StorageScope};

impl Interp<'_> {
    /// The byte offset of element `indices` of `b`, every index checked against its extent.
    pub(super) fn offset(&mut self, b: &Buffer, indices: &[Expr]) -> IrResult<usize> {
        let mut idx = Vec::with_capacity(indices.len());
        for x in indices {
            idx.push(self.expr(x)?.as_i128());
        }
        let st = self
            .bufs
            .get(&b.data.id)
            .ok_or_else(|| self.error(format!("buffer `{}` is not live", b.name)))?;
        let mut off: i128 = 0;
        for (d, ((i, n), s)) in idx.iter().zip(&st.shape).zip(&st.strides).enumerate() {
            if *i < 0 || *i >= *n as i128 {
                let shown: Vec<String> = idx.iter().map(|v| v.to_string()).collect();
                return Err(self.error(format!(
                    "index {i} out of bounds for dimension {d} of `{}` (extent {n}) in {}[{}]",
                    st.name,
                    st.name,
                    shown.join(", ")
                )));
            }
            off = off.saturating_add(i * *s as i128);
        }
        let n = st.dtype.bytes() as i128;
        if off.saturating_add(1).saturating_mul(n) > st.data.len() as i128 {
            return Err(self.error(format!(
                "access at element {off} is beyond the storage of `{}`",
                st.name
            )));
        }
        Ok((off * n) as usize)
    }

    /// The value of `e` in the current environment.
    pub(super) fn expr(&mut self, e: &Expr) -> IrResult<Scalar> {
        Ok(match e {
            Expr::IntImm { dtype, value } => Scalar::from_int(*dtype, *value as i128),
            Expr::FloatImm { dtype, value } => Scalar::from_float(*dtype, *value),
            Expr::Var(v) => *self
                .env
                .get(&v.id)
                .ok_or_else(|| self.error(format!("variable `{}` has no value", v.name)))?,
            Expr::Binary { op, a, b } => {
                let x = self.expr(a)?;
                let y = self.expr(b)?;
                binary(*op, x, y).map_err(|m| self.error(m))?
            }
            Expr::Not(a) => Scalar::Bool(!self.expr(a)?.as_bool()),
            Expr::Select { cond, t, f } => {
                let c = self.expr(cond)?.as_bool();
                let x = self.expr(t)?;
                let y = self.expr(f)?;
                if c {
                    x
                } else {
                    y
                }
            }
            Expr::Cast {
                dtype,
                value,
                saturate,
            } => {
                let v = self.expr(value)?;
                if !*saturate {
                    if let Scalar::Float(_, f) = v {
                        if !fits_int(*dtype, f) {
                            return Err(self.error(format!(
                                "cast of {f} to {dtype} has no specified result: the value is out \
                                 of the type's range or NaN, and the cast does not saturate \
                                 (`\"saturate\": false`, TVM's conversion)"
                            )));
                        }
                    }
                }
                cast(*dtype, v)
            }
            Expr::Load { buffer, indices } => {
                let off = self.offset(buffer, indices)?;
                if buffer.scope == StorageScope::Shared {
                    self.shared_access(buffer, off, None)?;
                }
                let st = self
                    .bufs
                    .get(&buffer.data.id)
                    .ok_or_else(|| self.error(format!("buffer `{}` is not live", buffer.name)))?;
                let n = st.dtype.bytes();
                read_scalar(st.dtype, &st.data[off..off + n])
            }
            Expr::Let { var, value, body } => {
                let v = self.expr(value)?;
                self.env.insert(var.id, v);
                let r = self.expr(body);
                self.env.remove(&var.id);
                r?
            }
            Expr::Call { op, args } => {
                let mut vals = Vec::with_capacity(args.len());
                for a in args {
                    vals.push(self.expr(a)?);
                }
                intrinsic(*op, &vals)
            }
            Expr::IfThenElse { cond, t, f } => {
                // Only the chosen arm is evaluated.
                if self.expr(cond)?.as_bool() {
                    self.expr(t)?
                } else {
                    self.expr(f)?
                }
            }
            Expr::Reinterpret { dtype, value } => reinterpret(*dtype, self.expr(value)?),
            Expr::CallExtern { symbol, .. } => {
                return Err(self.error(format!(
                    "call_extern `{symbol}` calls external code, which the interpreter cannot run"
                )))
            }
        })
    }
}
