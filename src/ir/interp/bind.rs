//! Binding the arguments: each is checked against its parameter as generated code checks it
//! (kinds, dtype, rank, shapes and strides, size), and shape variables are bound on the way.

use super::value::{HostBuffer, InterpArg, Scalar};
use super::{cast, BufState, Interp};
use crate::ir::dtype::DataType;
use crate::ir::error::{IrError, IrResult};
use crate::ir::expr::Expr;
use crate::ir::func::{Buffer, Param};
use crate::util::compact_strides;

impl Interp<'_> {
    pub(super) fn bind_params(&mut self, args: &mut [InterpArg]) -> IrResult<()> {
        let params = &self.func.params;
        if args.len() != params.len() {
            return Err(self.error(format!(
                "expected {} arguments, got {}",
                params.len(),
                args.len()
            )));
        }
        for (i, (p, a)) in params.iter().zip(args.iter_mut()).enumerate() {
            match (p, a) {
                (Param::Scalar(v), InterpArg::Scalar(s)) => {
                    let value = self.convert_arg(i, &v.name, v.dtype, *s)?;
                    self.bind_dim(
                        &Expr::Var(v.clone()),
                        value.as_i128(),
                        Some(value),
                        &format!("argument #{i} `{}`", v.name),
                    )?;
                }
                (Param::Buffer(b), InterpArg::Buffer(h)) => {
                    let data = std::mem::take(&mut h.data);
                    let r = self.bind_buffer(i, b, h, data);
                    if let Err((e, data)) = r {
                        h.data = data;
                        return Err(e);
                    }
                }
                (Param::Buffer(b), InterpArg::Scalar(_)) => {
                    return Err(self.error(format!(
                        "argument #{i} `{}`: expected a buffer, got a scalar",
                        b.name
                    )))
                }
                (Param::Scalar(v), InterpArg::Buffer(_)) => {
                    return Err(self.error(format!(
                        "argument #{i} `{}`: expected a {} scalar, got a buffer",
                        v.name, v.dtype
                    )))
                }
            }
        }
        Ok(())
    }

    fn convert_arg(&self, i: usize, name: &str, t: DataType, s: Scalar) -> IrResult<Scalar> {
        let from = s.dtype();
        let ok = if t.is_float() {
            !from.is_handle()
        } else {
            from.is_int() || from.is_bool()
        };
        if !ok {
            return Err(self.error(format!(
                "argument #{i} `{name}`: expected {t}, got a {from} scalar"
            )));
        }
        Ok(cast(t, s))
    }

    /// Binds or checks one shape/stride entry (or a scalar parameter) against a value.
    fn bind_dim(
        &mut self,
        dim: &Expr,
        value: i128,
        scalar: Option<Scalar>,
        what: &str,
    ) -> IrResult<()> {
        match dim {
            Expr::IntImm { value: k, .. } => {
                if *k as i128 != value {
                    return Err(self.error(format!("{what}: expected {k}, got {value}")));
                }
            }
            Expr::Var(v) => {
                let s = scalar.unwrap_or_else(|| Scalar::from_int(v.dtype, value));
                match self.env.get(&v.id) {
                    Some(prev) if *prev != s => {
                        return Err(self.error(format!(
                            "{what}: `{}` is {} from an earlier argument, got {}",
                            v.name,
                            prev.as_i128(),
                            s.as_i128()
                        )))
                    }
                    Some(_) => {}
                    None => {
                        self.env.insert(v.id, s);
                    }
                }
            }
            _ => return Err(self.error(format!("{what}: unsupported shape expression"))),
        }
        Ok(())
    }

    #[allow(clippy::result_large_err)]
    fn bind_buffer(
        &mut self,
        i: usize,
        b: &Buffer,
        h: &HostBuffer,
        data: Vec<u8>,
    ) -> Result<(), (IrError, Vec<u8>)> {
        macro_rules! fail {
            ($($t:tt)*) => { return Err((self.error(format!("argument #{i} `{}`: {}", b.name, format!($($t)*))), data)) };
        }
        if h.dtype != b.dtype {
            fail!("expected dtype {}, got {}", b.dtype, h.dtype);
        }
        if h.shape.len() != b.shape.len() {
            fail!(
                "expected {} dimensions, got {}",
                b.shape.len(),
                h.shape.len()
            );
        }
        if h.shape.iter().any(|d| *d < 0) {
            fail!("negative extent in shape {:?}", h.shape);
        }
        let strides = match &h.strides {
            Some(s) if s.len() != h.shape.len() => {
                fail!("{} strides for {} dimensions", s.len(), h.shape.len())
            }
            Some(s) if s.iter().any(|x| *x < 0) => fail!("negative strides {s:?}"),
            Some(s) => s.clone(),
            None => compact_strides(&h.shape),
        };
        for (d, (dim, v)) in b.shape.iter().zip(&h.shape).enumerate() {
            if let Err(e) = self.bind_dim(
                dim,
                *v as i128,
                None,
                &format!("argument #{i} `{}` shape[{d}]", b.name),
            ) {
                return Err((e, data));
            }
        }
        match &b.strides {
            Some(decl) => {
                for (d, (dim, v)) in decl.iter().zip(&strides).enumerate() {
                    if let Err(e) = self.bind_dim(
                        dim,
                        *v as i128,
                        None,
                        &format!("argument #{i} `{}` strides[{d}]", b.name),
                    ) {
                        return Err((e, data));
                    }
                }
            }
            None => {
                let compact = compact_strides(&h.shape);
                // The strides of an empty tensor are not checked, as in generated code
                // (numpy gives such tensors any strides; no element is ever addressed).
                let empty = h.shape.contains(&0);
                if !empty
                    && strides
                        .iter()
                        .zip(&compact)
                        .zip(&h.shape)
                        .any(|((s, c), n)| *n != 1 && s != c)
                {
                    fail!(
                        "expected a compact array, got strides {strides:?} for shape {:?}",
                        h.shape
                    );
                }
            }
        }
        // Saturating: absurd shapes or strides must give an error, not an overflow.
        let needed: i128 = if h.shape.contains(&0) {
            0
        } else {
            h.shape
                .iter()
                .zip(&strides)
                .fold(1i128, |acc, (n, s)| {
                    acc.saturating_add((*n as i128 - 1) * *s as i128)
                })
                .saturating_mul(b.dtype.bytes() as i128)
        };
        if needed > data.len() as i128 {
            fail!(
                "needs {needed} bytes for shape {:?}, holds {}",
                h.shape,
                data.len()
            );
        }
        self.bufs.insert(
            b.data.id,
            BufState {
                name: b.name.clone(),
                dtype: b.dtype,
                shape: h.shape.clone(),
                strides,
                data,
            },
        );
        Ok(())
    }
}
