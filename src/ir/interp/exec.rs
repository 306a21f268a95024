//! Statement execution on the host (device kernels are launched, see `simt.rs`), and
//! allocations.

use super::value::{write_scalar, Scalar};
use super::{BufState, Flow, Interp, MAX_ALLOCATION};
use crate::ir::error::{IrError, IrResult};
use crate::ir::func::{Buffer, StorageScope};
use crate::ir::stmt::{ForKind, Stmt};
use crate::util::compact_strides;

impl Interp<'_> {
    /// A zero-filled allocation of `buffer`, its shape evaluated here.
    pub(super) fn new_buffer(&mut self, buffer: &Buffer) -> IrResult<BufState> {
        let mut shape = Vec::with_capacity(buffer.shape.len());
        for d in &buffer.shape {
            shape.push(self.expr(d)?.as_i64());
        }
        let numel = shape
            .iter()
            .try_fold(1i64, |acc, d| acc.checked_mul((*d).max(0)));
        let bytes = numel.and_then(|n| n.checked_mul(buffer.dtype.bytes() as i64));
        let bytes = match bytes {
            Some(b) if b <= MAX_ALLOCATION => b,
            _ => {
                return Err(self.error(format!(
                    "allocation of `{}` with shape {shape:?} exceeds the interpreter's limit of {MAX_ALLOCATION} bytes",
                    buffer.name
                )))
            }
        };
        let strides = compact_strides(&shape);
        Ok(BufState {
            name: buffer.name.clone(),
            dtype: buffer.dtype,
            shape,
            strides,
            data: vec![0; bytes as usize],
        })
    }

    /// Runs `s`; a kernel (an outermost `thread_binding` loop) is launched.
    pub(super) fn stmt(&mut self, s: &Stmt) -> IrResult<Flow> {
        if let Stmt::For {
            kind: ForKind::ThreadBinding(_),
            ..
        } = s
        {
            self.launch(s)?;
            return Ok(Flow::Normal);
        }
        match s {
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                let lo = self.expr(min)?.as_i128();
                let n = self.expr(extent)?.as_i128();
                let mut k = 0i128;
                while k < n {
                    self.env.insert(var.id, Scalar::from_int(var.dtype, lo + k));
                    let flow = self.stmt(body);
                    if !matches!(flow, Ok(Flow::Normal)) {
                        self.env.remove(&var.id);
                        return flow;
                    }
                    k += 1;
                }
                self.env.remove(&var.id);
                Ok(Flow::Normal)
            }
            Stmt::Store {
                buffer,
                indices,
                value,
            } => {
                let off = self.offset(buffer, indices)?;
                let v = self.expr(value)?;
                if buffer.scope == StorageScope::Shared {
                    self.shared_access(buffer, off, Some(v))?;
                }
                let st = self
                    .bufs
                    .get_mut(&buffer.data.id)
                    .ok_or_else(|| IrError::Interp {
                        func: self.func.name.clone(),
                        message: format!("buffer `{}` is not live", buffer.name),
                    })?;
                let n = st.dtype.bytes();
                write_scalar(v, &mut st.data[off..off + n]);
                Ok(Flow::Normal)
            }
            Stmt::Allocate { buffer, body } => {
                let state = self.new_buffer(buffer)?;
                self.bufs.insert(buffer.data.id, state);
                let flow = self.stmt(body);
                self.bufs.remove(&buffer.data.id);
                flow
            }
            Stmt::Let { var, value, body } => {
                let v = self.expr(value)?;
                self.env.insert(var.id, v);
                let flow = self.stmt(body);
                self.env.remove(&var.id);
                flow
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                if self.expr(cond)?.as_bool() {
                    self.stmt(then_case)
                } else if let Some(e) = else_case {
                    self.stmt(e)
                } else {
                    Ok(Flow::Normal)
                }
            }
            Stmt::While { cond, body } => {
                while self.expr(cond)?.as_bool() {
                    if let Flow::Return(r) = self.stmt(body)? {
                        return Ok(Flow::Return(r));
                    }
                }
                Ok(Flow::Normal)
            }
            Stmt::Seq(v) => {
                for s in v {
                    if let Flow::Return(r) = self.stmt(s)? {
                        return Ok(Flow::Return(r));
                    }
                }
                Ok(Flow::Normal)
            }
            Stmt::Evaluate(e) => {
                self.expr(e)?;
                Ok(Flow::Normal)
            }
            Stmt::Assert { cond, message } => {
                if self.expr(cond)?.as_bool() {
                    Ok(Flow::Normal)
                } else {
                    Err(self.error(format!("assertion failed: {message}")))
                }
            }
            Stmt::Return(e) => Ok(Flow::Return(self.expr(e)?)),
            // A hint with no effect: its indices are not even evaluated (it never faults).
            Stmt::Barrier | Stmt::Prefetch { .. } => Ok(Flow::Normal),
        }
    }
}
