//! NVPTX kernels: the device side of a launch, written by the same emitter as host code.
//!
//! [`kernel_module`] turns the [`KernelPlan`]s of a module into one LLVM module for the
//! `nvptx64-nvidia-cuda` triple. Expressions, statements, loads, stores, casts, serial,
//! unrolled and vectorized loops are the emitter's own (the IR means the same on both sides);
//! what differs inside a kernel is here and in the few `self.opts.nvptx` branches:
//!
//! - **Kernels.** Each plan becomes `define void @<name>(...)` marked as a kernel in
//!   `!nvvm.annotations` (a PTX `.entry`), with the plan's parameters in order: buffers as
//!   generic pointers (the NVPTX backend turns them into `ld.global`/`st.global`), `noalias`
//!   when the function says its buffers do not alias; scalars by value, `bool` as an `i32` (the
//!   launch ABI's size), bf16 as its 16 bits. The body is an internal `<name>.body` returning
//!   the emitter's status, inlined into the entry. With constant launch extents the kernel
//!   states them (`maxntid`), which lets ptxas budget registers.
//! - **Thread-bound loops** are not loops: the launch runs exactly `grid * block` threads, so
//!   the loop variable is `min + id`, the id read from `llvm.nvvm.read.ptx.sreg.{tid,ctaid}.*`
//!   (32 bits, widened to the variable's type).
//! - **Shared memory** is address space 3: each `shared` allocation an internal
//!   `addrspace(3)` array, reached through a generic pointer (`addrspacecast`; LLVM's
//!   address-space inference turns the accesses back into `ld.shared`/`st.shared`). A kernel
//!   whose shared memory exceeds the 48 KiB a static declaration may use takes it all from
//!   the dynamic shared memory of the launch instead (one `extern` array, each allocation at a
//!   16-byte-aligned offset; [`shared_layout`]); the kernel table records the bytes and the
//!   runtime raises the function's limit before launching it. `local` allocations of constant
//!   size are per-thread stack arrays.
//! - **Barriers** are `llvm.nvvm.barrier0` (`bar.sync 0`).
//! - **Math** that LLVM 14's NVPTX backend cannot select (`exp`, `log`, `sin`, `pow`, ...: it
//!   aborts the process, it does not return an error) is never handed to it: every such
//!   function is a call of libdevice's `__nv_<name>f` / `__nv_<name>`, linked in by the caller
//!   ([`KernelModule::libdevice`]). `fast_exp` is the emitter's own polynomial (fused
//!   multiply-adds and `floor`, native), bit-identical to the interpreter's.
//! - **No error path.** A kernel cannot raise: an integer division or modulo by zero gives 0
//!   (as OpenCL kernels do), and `assert`, `return`, parallel loops, workspace allocations and
//!   calls of host functions inside a kernel are errors at build time. As a last line, a
//!   module that would still reference a host service of the runtime is refused.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::codegen::device::{KernelParam, KernelPlan};
use crate::ir::{Buffer, Expr, IRModule, Stmt, StorageScope, ThreadTag, Var, VarId};

use super::stmt::MAX_STACK_BYTES;
use super::{fn_attrs, mem_ty, reg_ty, unsupported, EmitOptions, Emitter, ModuleText, Val, R};

/// The most shared memory a kernel may declare statically (CUDA's limit for static
/// `__shared__` data, on every architecture); more is dynamic shared memory.
const STATIC_SHARED_LIMIT: u64 = 48 * 1024;

/// The LLVM module of a set of NVPTX kernels.
#[derive(Debug, Clone)]
pub(crate) struct KernelModule {
    /// LLVM IR text (triple `nvptx64-nvidia-cuda`).
    pub text: String,
    /// Whether the kernels call libdevice (`__nv_*`), which must be linked in.
    pub libdevice: bool,
    /// Bytes of dynamic shared memory of each kernel, in plan order (0: its shared memory,
    /// if any, is static).
    pub dyn_shared_bytes: Vec<u64>,
}

/// The `shared` allocations of a kernel's nest in order, each at a 16-byte-aligned byte offset,
/// and their total bytes: the layout of the kernel's dynamic shared memory when the total is
/// over [`STATIC_SHARED_LIMIT`].
///
/// # Errors
/// A `shared` allocation whose size is not a constant.
fn shared_layout(kernel: &str, nest: &Stmt) -> R<(HashMap<VarId, u64>, u64)> {
    let mut offsets = HashMap::new();
    let mut total = 0u64;
    let mut err = None;
    crate::ir::device::visit_stmts(nest, &mut |s| {
        if let Stmt::Allocate { buffer, .. } = s {
            if buffer.scope != StorageScope::Shared || err.is_some() {
                return;
            }
            match buffer.const_numel() {
                Some(n) => {
                    let bytes = (n.max(1) as u64) * (buffer.dtype.bytes().max(1) as u64);
                    offsets.insert(buffer.data.id, total);
                    total = (total + bytes).div_ceil(16) * 16;
                }
                None => {
                    err = Some(unsupported(format!(
                        "CUDA kernel `{kernel}`: shared allocation `{}` needs a constant size",
                        buffer.name
                    )))
                }
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok((offsets, total)),
    }
}

/// The NVPTX kernels of `plans` (kernels of `module`) for `cpu` (`sm_86`) with `features`
/// (`+ptx75`, or empty for LLVM's default PTX version of the `cpu`).
///
/// # Errors
/// What a kernel cannot do ([`CodegenError::Unsupported`], naming the kernel and the
/// construct).
///
/// [`CodegenError::Unsupported`]: crate::codegen::CodegenError::Unsupported
pub(crate) fn kernel_module(
    module: &IRModule,
    plans: &[KernelPlan],
    cpu: &str,
    features: &str,
) -> R<KernelModule> {
    let opts = EmitOptions {
        cpu: cpu.to_owned(),
        features: features.to_owned(),
        fast_math: String::new(),
        device_type: crate::packed_func::DLDeviceType::CUDA.0,
        device_name: "cuda".into(),
        kernels: Vec::new(),
        device_host: false,
        stream_store_bytes: None,
        nvptx: true,
        // Short rows in steps of 16 `float32` lanes, as before widths followed the target.
        vector_bits: 512,
        stack_probes: false,
    };
    let attrs = fn_attrs(&opts);
    let mut mt = ModuleText::default();
    let mut metadata = vec![
        "!0 = !{!\"branch_weights\", i32 1048576, i32 1}".to_string(),
        "!1 = !{!\"branch_weights\", i32 1, i32 1048576}".to_string(),
    ];
    let mut md_next = 2usize;
    let mut dyn_shared_bytes = Vec::with_capacity(plans.len());
    // (kernel signature type, name, launch extents if constant)
    let mut entries: Vec<(String, String, Option<[i64; 3]>)> = Vec::new();
    for p in plans {
        let noalias = module.get(&p.func).is_some_and(|f| f.attrs.noalias);
        let na = if noalias { " noalias" } else { "" };
        let (offsets, total) = shared_layout(&p.name, &p.nest)?;
        let mut params = Vec::new();
        let mut param_tys = Vec::new();
        let mut args = Vec::new();
        let body = {
            let mut e = Emitter::new(&mut mt, &opts, &p.name, &mut metadata, &mut md_next);
            let dynamic = total > STATIC_SHARED_LIMIT;
            dyn_shared_bytes.push(if dynamic { total } else { 0 });
            if dynamic {
                e.dyn_shared = Some(offsets);
            }
            for kp in &p.params {
                match kp {
                    KernelParam::Buffer(b) => {
                        let t = format!("{}*", mem_ty(b.dtype));
                        let n = format!("%buf{}", b.data.id.0);
                        params.push(format!("{t}{na} {n}"));
                        args.push(format!("{t} {n}"));
                        param_tys.push(t.clone());
                        e.bufs.insert(b.data.id, Val::new(t, n));
                    }
                    KernelParam::Scalar(v) => {
                        let n = format!("%arg{}", v.id.0);
                        let pt = if v.dtype.is_bool() {
                            "i32".to_owned()
                        } else {
                            mem_ty(v.dtype)
                        };
                        params.push(format!("{pt} {n}"));
                        args.push(format!("{pt} {n}"));
                        param_tys.push(pt.clone());
                        let val = if v.dtype.is_bool() {
                            e.assign("i1", format!("icmp ne i32 {n}, 0"))
                        } else {
                            e.mem_to_reg(v.dtype, Val::new(pt, n))
                        };
                        e.vars.insert(v.id, val);
                    }
                }
            }
            e.stmt(&p.nest)?;
            e.line("ret i32 0");
            e.finish()
        };
        let name = &p.name;
        mt.functions.push(format!(
            "define internal i32 @\"{name}.body\"({}) {attrs} alwaysinline {{\n{body}}}\n",
            params.join(", ")
        ));
        mt.functions.push(format!(
            "define void @\"{name}\"({}) {attrs} {{\nentry:\n  %r = call i32 @\"{name}.body\"({})\n  ret void\n}}\n",
            params.join(", "),
            args.join(", ")
        ));
        let consts = |es: &[Expr; 3]| -> Option<[i64; 3]> {
            Some([es[0].as_int()?, es[1].as_int()?, es[2].as_int()?])
        };
        entries.push((
            format!("void ({})*", param_tys.join(", ")),
            name.clone(),
            consts(&p.block),
        ));
    }
    // A kernel has no runtime services: nothing may reach the host's.
    if let Some(d) = mt.declares.iter().find(|d| {
        let callee = d.split('@').nth(1).unwrap_or("");
        !(callee.starts_with("llvm.") || callee.starts_with("__nv_"))
    }) {
        return Err(unsupported(format!(
            "a CUDA kernel would call a function of the host (`{d}`); kernels can only call libdevice (`__nv_*`)"
        )));
    }
    if mt.uses_workspace || mt.uses_parallel || mt.uses_device {
        return Err(unsupported(
            "a CUDA kernel would use a host service (workspace, thread pool or a launch)",
        ));
    }
    let libdevice = mt.declares.iter().any(|d| d.contains("@__nv_"));
    let mut out = String::from(
        "; NVPTX kernels generated by kiln\ntarget triple = \"nvptx64-nvidia-cuda\"\n\n",
    );
    mt.write_body(&mut out);
    let mut annotations = Vec::new();
    for (ty, name, block) in &entries {
        let n = md_next;
        md_next += 1;
        metadata.push(format!("!{n} = !{{{ty} @\"{name}\", !\"kernel\", i32 1}}"));
        annotations.push(format!("!{n}"));
        if let Some(b) = block {
            for (axis, v) in ["x", "y", "z"].iter().zip(b) {
                let n = md_next;
                md_next += 1;
                metadata.push(format!(
                    "!{n} = !{{{ty} @\"{name}\", !\"maxntid{axis}\", i32 {v}}}"
                ));
                annotations.push(format!("!{n}"));
            }
        }
    }
    let flag = md_next;
    metadata.push(format!(
        "!{flag} = !{{i32 4, !\"nvvm-reflect-ftz\", i32 0}}"
    ));
    let _ = writeln!(out, "!nvvm.annotations = !{{{}}}", annotations.join(", "));
    let _ = writeln!(out, "!llvm.module.flags = !{{!{flag}}}");
    for m in &metadata {
        out.push_str(m);
        out.push('\n');
    }
    Ok(KernelModule {
        text: out,
        libdevice,
        dyn_shared_bytes,
    })
}

/// The libdevice name of a math function of the IR (`exp` -> `__nv_expf` in float32).
pub(super) fn libdevice_name(name: &str, float_ty: &str) -> String {
    if float_ty == "double" {
        format!("__nv_{name}")
    } else {
        format!("__nv_{name}f")
    }
}

/// LLVM math intrinsics that LLVM 14's NVPTX backend cannot select (it aborts): they go to
/// libdevice instead.
pub(super) fn needs_libdevice(intrinsic: &str) -> bool {
    matches!(
        intrinsic,
        "exp" | "exp2" | "log" | "log2" | "log10" | "pow" | "sin" | "cos"
    )
}

impl Emitter<'_> {
    /// A thread-bound loop inside a kernel: `var = min + id` for the thread's id of `tag`.
    pub(super) fn thread_index(
        &mut self,
        var: &Var,
        min: &Expr,
        tag: ThreadTag,
        body: &Stmt,
    ) -> R<()> {
        let reg = if tag.is_thread() { "tid" } else { "ctaid" };
        let axis = ["x", "y", "z"][tag.axis().min(2)];
        let f = format!("llvm.nvvm.read.ptx.sreg.{reg}.{axis}");
        self.m.declares.insert(format!("declare i32 @{f}()"));
        let id = self.assign("i32", format!("call i32 @{f}()"));
        let ty = reg_ty(var.dtype);
        if !var.dtype.is_int() || var.dtype.lanes != 1 {
            return Err(unsupported(format!(
                "CUDA kernel `{}`: thread-bound loop variable `{}` must be an integer, found {}",
                self.fname, var.name, var.dtype
            )));
        }
        let id = match var.dtype.bits {
            32 => id,
            b if b > 32 => self.assign(&ty, format!("zext i32 {} to {ty}", id.v)),
            _ => self.assign(&ty, format!("trunc i32 {} to {ty}", id.v)),
        };
        let v = if min.as_int() == Some(0) {
            id
        } else {
            let lo = self.expr(min)?;
            self.assign(&ty, format!("add {ty} {}, {}", lo.v, id.v))
        };
        let old = self.vars.insert(var.id, v);
        let r = self.stmt(body);
        self.restore(var.id, old);
        r
    }

    /// `bar.sync 0`: every thread of the block waits for the others.
    pub(super) fn kernel_barrier(&mut self) {
        self.m
            .declares
            .insert("declare void @llvm.nvvm.barrier0()".into());
        self.line("call void @llvm.nvvm.barrier0()");
    }

    /// An allocation inside a kernel: `shared` in address space 3 (static, or at its offset in
    /// the dynamic shared memory), `local` on the thread's stack.
    pub(super) fn kernel_allocate(&mut self, buffer: &Buffer, body: &Stmt) -> R<()> {
        let mt = mem_ty(buffer.dtype);
        let elem = buffer.dtype.bytes().max(1) as i64;
        let numel = buffer.const_numel().ok_or_else(|| {
            unsupported(format!(
                "CUDA kernel `{}`: allocation `{}` needs a constant size inside a kernel",
                self.fname, buffer.name
            ))
        })?;
        let n = numel.max(1);
        let ptr = match buffer.scope {
            StorageScope::Shared => match self.dyn_shared.as_ref().map(|m| m.get(&buffer.data.id)) {
                Some(Some(&off)) => {
                    let g = "@__kiln_dyn_shared";
                    let decl = format!("{g} = external addrspace(3) global [0 x i8], align 16");
                    if !self.m.globals.contains(&decl) {
                        self.m.globals.push(decl);
                    }
                    let p = self.assign(
                        "[0 x i8]*",
                        format!("addrspacecast [0 x i8] addrspace(3)* {g} to [0 x i8]*"),
                    );
                    let b = self.assign(
                        "i8*",
                        format!("getelementptr inbounds [0 x i8], [0 x i8]* {}, i64 0, i64 {off}", p.v),
                    );
                    self.assign(&Self::ptr(&mt), format!("bitcast i8* {} to {mt}*", b.v))
                }
                Some(None) => {
                    return Err(unsupported(format!(
                        "kiln bug: shared allocation `{}` of kernel `{}` has no offset",
                        buffer.name, self.fname
                    )))
                }
                None => {
                    let g = format!("@__kiln_shared_{}", self.m.globals.len());
                    self.m.globals.push(format!(
                        "{g} = internal addrspace(3) global [{n} x {mt}] undef, align 16"
                    ));
                    let p = self.assign(
                        &format!("[{n} x {mt}]*"),
                        format!("addrspacecast [{n} x {mt}] addrspace(3)* {g} to [{n} x {mt}]*"),
                    );
                    self.assign(
                        &Self::ptr(&mt),
                        format!(
                            "getelementptr inbounds [{n} x {mt}], [{n} x {mt}]* {}, i64 0, i64 0",
                            p.v
                        ),
                    )
                }
            },
            StorageScope::Local => {
                if n * elem > MAX_STACK_BYTES {
                    return Err(unsupported(format!(
                        "CUDA kernel `{}`: local allocation `{}` is {} bytes per thread, more than the {MAX_STACK_BYTES} kiln allows; use `shared` memory or smaller tiles",
                        self.fname, buffer.name, n * elem
                    )));
                }
                let a = format!("%alloca{}", self.label + 1);
                self.label += 1;
                let _ = writeln!(self.entry_allocas, "  {a} = alloca {mt}, i64 {n}, align 16");
                Val::new(Self::ptr(&mt), a)
            }
            other => {
                return Err(unsupported(format!(
                    "CUDA kernel `{}`: a `{}` allocation (`{}`) inside a kernel; use `shared` or `local`",
                    self.fname,
                    other.name(),
                    buffer.name
                )))
            }
        };
        self.bufs.insert(buffer.data.id, ptr);
        let r = self.stmt(body);
        self.bufs.remove(&buffer.data.id);
        r
    }

    /// Refuses what a kernel cannot do, naming it.
    pub(super) fn not_in_kernel(&self, what: &str) -> crate::codegen::CodegenError {
        unsupported(format!("CUDA kernel `{}`: {what}", self.fname))
    }
}
