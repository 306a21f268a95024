//! Host code of a device target: the check that it never touches device memory, and the launch
//! of a thread-bound loop nest as a device kernel (`__kiln_device_launch`).

use std::fmt::Write as _;

use crate::ir::{Buffer, DataType, Stmt, StorageScope, TypeCode};

use super::{unsupported, Emitter, Val, R};

impl Emitter<'_> {
    /// Host code of a device target never touches device memory.
    pub(super) fn host_access(&self, buffer: &Buffer) -> R<()> {
        if self.opts.device_host
            && matches!(buffer.scope, StorageScope::Global | StorageScope::Workspace)
        {
            return Err(unsupported(format!(
                "function `{}`: host code accesses `{}`, which is in {} device memory; put the access inside a thread-bound loop nest (a kernel)",
                self.fname, buffer.name, self.opts.device_name
            )));
        }
        Ok(())
    }

    /// A thread-bound nest in host code: launch its kernel on the current stream.
    pub(super) fn launch_kernel(&mut self, nest: &Stmt) -> R<()> {
        // Found by the nest itself: an unrolled host loop emits one nest several times, and
        // two equal nests compile to the same kernel.
        let fname = self.fname.clone();
        let Some((index, plan)) = self
            .opts
            .kernels
            .iter()
            .enumerate()
            .find(|(_, p)| p.func == fname && p.nest == *nest)
        else {
            return Err(unsupported(format!(
                "function `{fname}`: thread-bound loops (`thread_binding`) run on a device; target `{}` has none (use a device target such as `opencl`)",
                self.opts.device_name
            )));
        };
        let plan = plan.clone();
        self.m.uses_device = true;
        let n = plan.params.len().max(1);
        let args = format!("%kargs{}", self.label + 1);
        self.label += 1;
        let _ = writeln!(
            self.entry_allocas,
            "  {args} = alloca [{n} x {{ i64, i64 }}], align 16"
        );
        for (i, p) in plan.params.iter().enumerate() {
            let (value, extra) = match p {
                crate::codegen::device::KernelParam::Buffer(b) => {
                    let base = self.bufs.get(&b.data.id).cloned().ok_or_else(|| {
                        unsupported(format!("buffer `{}` is not bound here", b.name))
                    })?;
                    let v = self.assign("i64", format!("ptrtoint {} to i64", base.typed()));
                    let span = crate::codegen::device::span_elements(b);
                    let el = self.index64(&span)?;
                    let bytes = self.assign(
                        "i64",
                        format!("mul i64 {}, {}", el.v, b.dtype.bytes().max(1)),
                    );
                    (v, bytes)
                }
                crate::codegen::device::KernelParam::Scalar(var) => {
                    let x = self.vars.get(&var.id).cloned().ok_or_else(|| {
                        unsupported(format!("variable `{}` is not bound here", var.name))
                    })?;
                    let t = var.dtype;
                    let bits = if t.is_float() {
                        let ity = format!("i{}", t.bits);
                        let b = self.assign(&ity, format!("bitcast {} to {ity}", x.typed()));
                        self.widen64(DataType::new(TypeCode::UInt, t.bits, 1), b)
                    } else if t.is_bool() {
                        self.assign("i64", format!("zext {} to i64", x.typed()))
                    } else {
                        self.widen64(t, x)
                    };
                    (bits, Val::new("i64", "0"))
                }
            };
            for (field, v) in [(0, &value), (1, &extra)] {
                let p = self.assign(
                    "i64*",
                    format!("getelementptr inbounds [{n} x {{ i64, i64 }}], [{n} x {{ i64, i64 }}]* {args}, i64 0, i64 {i}, i32 {field}"),
                );
                self.line(format!("store i64 {}, i64* {}, align 8", v.v, p.v));
            }
        }
        let dims = format!("%kdims{}", self.label + 1);
        self.label += 1;
        let _ = writeln!(self.entry_allocas, "  {dims} = alloca [6 x i64], align 16");
        for (i, e) in plan.grid.iter().chain(plan.block.iter()).enumerate() {
            let v = self.index64(e)?;
            let p = self.assign(
                "i64*",
                format!("getelementptr inbounds [6 x i64], [6 x i64]* {dims}, i64 0, i64 {i}"),
            );
            self.line(format!("store i64 {}, i64* {}, align 8", v.v, p.v));
        }
        let a = self.assign(
            "i8*",
            format!("bitcast [{n} x {{ i64, i64 }}]* {args} to i8*"),
        );
        let d = self.assign("i64*", format!("bitcast [6 x i64]* {dims} to i64*"));
        let rc = self.assign(
            "i32",
            format!(
                "call i32 @__kiln_device_launch(i32 {index}, i32 %devid, i8* {}, i32 {}, i64* {})",
                a.v,
                plan.params.len(),
                d.v
            ),
        );
        self.propagate(&rc.v);
        Ok(())
    }
}
