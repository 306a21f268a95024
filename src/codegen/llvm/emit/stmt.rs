//! Statements: [`Emitter::stmt`], conditionals, `return`, serial loops and their `llvm.loop`
//! metadata, and allocations (on the stack, or in the workspace, freed on every exit).

use std::fmt::Write as _;

use crate::codegen::CodegenError;
use crate::ir::{Buffer, Expr, ForKind, Stmt, StorageScope, TypeCode, Var};

use super::{is_signed, mem_ty, reg_ty, unsupported, Emitter, Val, R};

/// Local allocations up to this size live on the stack; larger ones use the workspace.
pub(super) const MAX_STACK_BYTES: i64 = 16 * 1024;

/// The most bytes of constant-size CPU `workspace` allocations a function keeps on its stack,
/// instead of a call of the workspace allocator and its free per call (TVM keeps up to 1 KiB
/// on the stack): `abs_negative` of the TOPI corpus (a 12 KiB intermediate) took 0.62 us a
/// call with the workspace pool, 0.53 us with it on the stack; `max_pool2d_pad` (its 20 KiB
/// padded copy) 1.92 against 1.76 us (Zen 3, one process). Frames this large are probed page
/// by page on x86 (`fn_attrs`), so a deep stack ends at its guard page, not past it.
const MAX_STACK_WORKSPACE_BYTES: i64 = 32 * 1024;

impl Emitter<'_> {
    pub fn stmt(&mut self, s: &Stmt) -> R<()> {
        match s {
            Stmt::Seq(v) => {
                for s in v {
                    self.stmt(s)?;
                }
            }
            Stmt::Evaluate(e) => {
                self.expr(e)?;
            }
            Stmt::Prefetch { buffer, indices } => self.prefetch(buffer, indices)?,
            Stmt::Store {
                buffer,
                indices,
                value,
            } => {
                self.host_access(buffer)?;
                let v = self.expr(value)?;
                let v = self.reg_to_mem(buffer.dtype, v);
                let addr = self.address(buffer, indices)?;
                let align = buffer.dtype.bytes().max(1);
                let g = self.access_groups();
                self.line(format!(
                    "store {}, {}* {addr}, align {align}{g}",
                    v.typed(),
                    v.ty
                ));
            }
            Stmt::Let { var, value, body } => {
                let v = self.expr(value)?;
                let old = self.vars.insert(var.id, v);
                self.stmt(body)?;
                self.restore(var.id, old);
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                let c = self.expr(cond)?;
                self.if_then_else(&c.v, "", then_case, else_case.as_deref(), Self::stmt)?;
            }
            Stmt::While { cond, body } => {
                let head = self.new_label("while_head");
                let bodyl = self.new_label("while_body");
                let exit = self.new_label("while_end");
                self.line(format!("br label %{head}"));
                self.start_block(&head);
                let c = self.expr(cond)?;
                self.line(format!("br i1 {}, label %{bodyl}, label %{exit}", c.v));
                self.start_block(&bodyl);
                self.stmt(body)?;
                self.line(format!("br label %{head}"));
                self.start_block(&exit);
            }
            Stmt::Assert { message, .. } if self.opts.nvptx => {
                return Err(self.not_in_kernel(&format!(
                    "`assert` (\"{message}\") inside a kernel: a kernel cannot raise an error; check on the host, before the kernel"
                )))
            }
            Stmt::Return(_) if self.opts.nvptx => {
                return Err(self.not_in_kernel("`return` inside a kernel"))
            }
            Stmt::Barrier if self.opts.nvptx => self.kernel_barrier(),
            Stmt::Allocate { buffer, body } if self.opts.nvptx => {
                self.kernel_allocate(buffer, body)?
            }
            Stmt::Assert { cond, message } => {
                let c = self.expr(cond)?;
                self.check(&c.v, "RuntimeError", message);
            }
            Stmt::Return(e) => self.ret(e)?,
            Stmt::Barrier => {
                return Err(CodegenError::Unsupported(
                    "a barrier outside a device kernel (it belongs under threadIdx loops)".into(),
                ))
            }
            Stmt::Allocate { buffer, body } => self.allocate(buffer, body)?,
            // A nest that only copies a contiguous region: one `memcpy` (`copy.rs`).
            Stmt::For { .. } if self.copy_loop(s)? => {}
            // A nest that transposes: 8 x 8 tiles in registers (`transpose.rs`).
            Stmt::For { .. } if self.transpose_loop(s)? => {}
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => match kind {
                ForKind::ThreadBinding(tag) if self.opts.nvptx => {
                    self.thread_index(var, min, *tag, body)?
                }
                ForKind::ThreadBinding(_) => self.launch_kernel(s)?,
                ForKind::Parallel if self.opts.nvptx => {
                    return Err(self.not_in_kernel(&format!(
                        "a `parallel` loop (`{}`) inside a kernel; bind it to a thread axis or make it serial",
                        var.name
                    )))
                }
                ForKind::Parallel => self.parallel_for(var, min, extent, body)?,
                // A vectorized loop that writes a streamed output (the write-back of a
                // `cache_write`) takes the streaming form, itself vectorized.
                ForKind::Vectorized
                    if self.stream_store(var, body, extent.as_int()).is_none()
                        && self.vector_for(var, min, extent, body)? => {}
                ForKind::Unrolled if self.unrolled_for(var, min, extent, body)? => {}
                ForKind::Serial if self.window_row(var, min, extent, body)? => {}
                _ => self.serial_for(var, min, extent, *kind, body)?,
            },
        }
        Ok(())
    }

    /// `if cond { then } else { other }` with blocks named `<prefix>then<k>`..., each arm
    /// emitted by `arm` (scalar or vector statements).
    pub(super) fn if_then_else(
        &mut self,
        cond: &str,
        prefix: &str,
        then_case: &Stmt,
        else_case: Option<&Stmt>,
        mut arm: impl FnMut(&mut Self, &Stmt) -> R<()>,
    ) -> R<()> {
        let th = self.new_label(&format!("{prefix}then"));
        let el = self.new_label(&format!("{prefix}else"));
        let end = self.new_label(&format!("{prefix}endif"));
        let other = if else_case.is_some() { &el } else { &end };
        self.line(format!("br i1 {cond}, label %{th}, label %{other}"));
        self.start_block(&th);
        arm(self, then_case)?;
        self.line(format!("br label %{end}"));
        if let Some(e) = else_case {
            self.start_block(&el);
            arm(self, e)?;
            self.line(format!("br label %{end}"));
        }
        self.start_block(&end);
        Ok(())
    }

    fn ret(&mut self, e: &Expr) -> R<()> {
        let slot = self.ret_slot.clone().ok_or_else(|| {
            unsupported("`return` inside a parallel loop or in a function without a return type")
        })?;
        let t = e.dtype();
        let v = self.expr(e)?;
        let (index, bits) = match t.code {
            TypeCode::Bool => {
                let z = self.assign("i64", format!("zext i1 {} to i64", v.v));
                (2, z.v)
            }
            TypeCode::Int | TypeCode::UInt => (1, self.widen64(t, v).v),
            TypeCode::Float | TypeCode::BFloat => {
                let d = if v.ty == "double" {
                    v
                } else {
                    self.assign("double", format!("fpext {} to double", v.typed()))
                };
                let b = self.assign("i64", format!("bitcast double {} to i64", d.v));
                (3, b.v)
            }
            TypeCode::Handle => {
                let p = self.assign("i64", format!("ptrtoint {} to i64", v.typed()));
                (4, p.v)
            }
        };
        let ti = self.assign("i32*", format!("bitcast i8* {slot} to i32*"));
        self.line(format!("store i32 {index}, i32* {}, align 8", ti.v));
        let pad = self.assign(
            "i8*",
            format!("getelementptr inbounds i8, i8* {slot}, i64 4"),
        );
        let padp = self.assign("i32*", format!("bitcast i8* {} to i32*", pad.v));
        self.line(format!("store i32 0, i32* {}, align 4", padp.v));
        let val = self.assign(
            "i8*",
            format!("getelementptr inbounds i8, i8* {slot}, i64 8"),
        );
        let valp = self.assign("i64*", format!("bitcast i8* {} to i64*", val.v));
        self.line(format!("store i64 {bits}, i64* {}, align 8", valp.v));
        self.free_live();
        self.line("ret i32 0");
        let dead = self.new_label("after_return");
        self.start_block(&dead);
        Ok(())
    }

    fn loop_metadata(&mut self, kind: ForKind, group: Option<&str>) -> String {
        match kind {
            ForKind::Vectorized => {
                let g = group.unwrap_or("!{}").to_owned();
                let enable =
                    self.md(|n| format!("!{n} = !{{!\"llvm.loop.vectorize.enable\", i1 true}}"));
                let par = self.md(|n| format!("!{n} = !{{!\"llvm.loop.parallel_accesses\", {g}}}"));
                let id = self.md(|n| format!("!{n} = distinct !{{!{n}, !{enable}, !{par}}}"));
                format!(", !llvm.loop !{id}")
            }
            ForKind::Unrolled => self.full_unroll_metadata(),
            _ => String::new(),
        }
    }

    /// `!llvm.loop` metadata that unrolls a loop fully.
    fn full_unroll_metadata(&mut self) -> String {
        let full = self.md(|n| format!("!{n} = !{{!\"llvm.loop.unroll.full\"}}"));
        let id = self.md(|n| format!("!{n} = distinct !{{!{n}, !{full}}}"));
        format!(", !llvm.loop !{id}")
    }

    /// `!llvm.loop` metadata that keeps LLVM's loop vectorizer off a loop (width 1), and
    /// unrolls it `unroll` times when given (else LLVM's unroller decides; `Some(1)`: never).
    fn unvectorized_metadata(&mut self, unroll: Option<i64>) -> String {
        let w = self.md(|n| format!("!{n} = !{{!\"llvm.loop.vectorize.width\", i32 1}}"));
        let count = match unroll {
            Some(1) => {
                let c = self.md(|n| format!("!{n} = !{{!\"llvm.loop.unroll.disable\"}}"));
                format!(", !{c}")
            }
            Some(k) => {
                let c = self.md(|n| format!("!{n} = !{{!\"llvm.loop.unroll.count\", i32 {k}}}"));
                format!(", !{c}")
            }
            None => String::new(),
        };
        let id = self.md(|n| format!("!{n} = distinct !{{!{n}, !{w}{count}}}"));
        format!(", !llvm.loop !{id}")
    }

    /// `!llvm.loop` metadata that keeps a loop as it is: not vectorized, interleaved or unrolled.
    pub(super) fn no_unroll_metadata(&mut self) -> String {
        self.fixed_width_metadata(1, 1, false)
    }

    /// `!llvm.loop` metadata for a loop vectorized `width` lanes wide (1: not vectorized),
    /// `interleave` vectors a step, and not unrolled.
    ///
    /// With `unroll_vectorized`, the loop LLVM's vectorizer makes of it is unrolled fully
    /// afterwards (`llvm.loop.vectorize.followup_vectorized`): a few vector steps as straight
    /// code, with no loop branch per row.
    fn fixed_width_metadata(
        &mut self,
        width: i64,
        interleave: i64,
        unroll_vectorized: bool,
    ) -> String {
        let w = self.md(|n| format!("!{n} = !{{!\"llvm.loop.vectorize.width\", i32 {width}}}"));
        let il =
            self.md(|n| format!("!{n} = !{{!\"llvm.loop.interleave.count\", i32 {interleave}}}"));
        let un = self.md(|n| format!("!{n} = !{{!\"llvm.loop.unroll.disable\"}}"));
        let follow = if unroll_vectorized {
            let full = self.md(|n| format!("!{n} = !{{!\"llvm.loop.unroll.full\"}}"));
            let vid = self.md(|n| format!("!{n} = distinct !{{!{n}, !{full}}}"));
            let f = self.md(|n| {
                format!("!{n} = !{{!\"llvm.loop.vectorize.followup_vectorized\", !{vid}}}")
            });
            format!(", !{f}")
        } else {
            String::new()
        };
        let id = self.md(|n| format!("!{n} = distinct !{{!{n}, !{w}, !{il}, !{un}{follow}}}"));
        format!(", !llvm.loop !{id}")
    }

    fn serial_for(
        &mut self,
        var: &Var,
        min: &Expr,
        extent: &Expr,
        kind: ForKind,
        body: &Stmt,
    ) -> R<()> {
        let ty = reg_ty(var.dtype);
        let lo = self.expr(min)?;
        let n = self.expr(extent)?;
        let end = self.assign(&ty, format!("add {}, {}", lo.typed(), n.v));
        self.next_extent = extent.as_int();
        self.counted_loop(var, lo, end, kind, body)
    }

    /// `for var in [lo, end)` (values of the loop variable's type); in streaming form when its
    /// body writes a streamed output (`stream.rs`).
    pub(super) fn counted_loop(
        &mut self,
        var: &Var,
        lo: Val,
        end: Val,
        kind: ForKind,
        body: &Stmt,
    ) -> R<()> {
        let extent = self.next_extent.take();
        if matches!(
            kind,
            ForKind::Serial | ForKind::Parallel | ForKind::Vectorized
        ) {
            if let Some((buffer, indices)) = self.stream_store(var, body, extent) {
                return self.stream_loop(var, lo, end, body, &buffer, &indices);
            }
        }
        self.plain_loop(var, lo, end, kind, body, extent)
    }

    /// `for var in [lo, end)`, as written.
    fn plain_loop(
        &mut self,
        var: &Var,
        lo: Val,
        end: Val,
        kind: ForKind,
        body: &Stmt,
        extent: Option<i64>,
    ) -> R<()> {
        let ty = reg_ty(var.dtype);
        let head = self.new_label("for_head");
        let bodyl = self.new_label("for_body");
        let latch = self.new_label("for_latch");
        let exit = self.new_label("for_end");
        let pre = self.cur_block.clone();
        self.line(format!("br label %{head}"));
        self.start_block(&head);
        let i = self.tmp();
        let next = self.tmp();
        self.line(format!(
            "{i} = phi {ty} [ {}, %{pre} ], [ {next}, %{latch} ]",
            lo.v
        ));
        let s = is_signed(var.dtype);
        let c = self.assign(
            "i1",
            format!("icmp {} {ty} {i}, {}", if s { "slt" } else { "ult" }, end.v),
        );
        self.line(format!("br i1 {}, label %{bodyl}, label %{exit}", c.v));
        self.start_block(&bodyl);
        let group = if kind == ForKind::Vectorized {
            let g = self.md(|n| format!("!{n} = distinct !{{}}"));
            let g = format!("!{g}");
            self.groups.push(g.clone());
            Some(g)
        } else {
            None
        };
        let old = self.vars.insert(var.id, Val::new(&ty, &i));
        let r = self.stmt(body);
        self.restore(var.id, old);
        if group.is_some() {
            self.groups.pop();
        }
        r?;
        self.line(format!("br label %{latch}"));
        self.start_block(&latch);
        let nsw = if s { "nsw" } else { "nuw" };
        self.line(format!("{next} = add {nsw} {ty} {i}, 1"));
        let md = if kind == ForKind::Serial && register_tile_loop(body) {
            // The reduction loop of a register tile (a matmul's `k` around its `mr x nr`
            // accumulators): unrolled a fixed number of times, not as the CPU's cost model
            // would (LLVM 14's Zen 3 model unrolled it up to 24 times, its Intel models twice,
            // and the process-wide cap on partial unrolling, `init_llvm`, would leave it a
            // loop: `matmul_avx2.json` 7 % slower on a Zen 3), and not vectorized across `k`
            // (its accesses stride by a row, as below).
            self.unvectorized_metadata(Some(REGISTER_TILE_UNROLL))
        } else if kind == ForKind::Serial && strided_outer_loop(var, body) {
            // LLVM may fully unroll the loops inside and then vectorize this one, where every
            // access strides by a row: with AVX-512, LLVM 14 takes gathers and scatters for
            // that (a row copy of `split` ran at 0.22x TVM's time); the inner loops' own
            // vectorization (or SLP's) is what such a nest wants.
            self.unvectorized_metadata(holds_long_loop(body).then_some(1))
        } else if kind == ForKind::Serial && holds_long_loop(body) {
            self.unvectorized_metadata(Some(1))
        } else if let Some((width, interleave)) =
            short_loop_width(kind, extent, var, body, self.opts.vector_bits)
        {
            // A short innermost loop of known length whose accesses are contiguous: vectorized
            // by a width that divides its length, not unrolled first, so no scalar remainder
            // is left. LLVM 14 unrolls such a loop fully and vectorizes the straight-line
            // code, or vectorizes 32 lanes where the row has 48: a row of 48 int8 values
            // computed in int32 ran 32 lanes vectorized and 16 scalar, 0.4x TVM's time (whose
            // LLVM 22 takes three 16-lane vectors).
            // A row of a few vector steps (48 floats: three of 16 lanes) is straight code
            // after vectorizing, as TVM's LLVM leaves it: a loop of three steps per row cost
            // 50 ns of a 0.3 us elementwise operator (64 x 48, AVX2).
            let steps = extent.map_or(i64::MAX, |n| n / (width * interleave));
            self.fixed_width_metadata(width, interleave, steps <= SHORT_LOOP_UNROLLED_STEPS)
        } else if folds_when_unrolled(kind, extent, var, body) {
            // A short loop whose variable is converted to a float (the source coordinate of a
            // resize, `floor((i + 0.5) * scale)`): unrolled, each iteration's coordinate, its
            // clamp and its weights fold to constants and the loads become fixed offsets
            // (`resize_bilinear` at 3.5-4x TVM's speed on a Zen 3, 1.06x as a loop).
            self.full_unroll_metadata()
        } else {
            self.loop_metadata(kind, group.as_deref())
        };
        self.line(format!("br label %{head}{md}"));
        self.start_block(&exit);
        Ok(())
    }

    fn allocate(&mut self, buffer: &Buffer, body: &Stmt) -> R<()> {
        let mt = mem_ty(buffer.dtype);
        let elem = buffer.dtype.bytes().max(1) as i64;
        let const_bytes = buffer.const_numel().and_then(|n| n.checked_mul(elem));
        let small = matches!(const_bytes, Some(b) if b <= MAX_STACK_BYTES);
        // A CPU workspace (not a device target's: that is device memory) of a constant size,
        // while the function's share of the stack for them lasts.
        let cpu_workspace = buffer.scope == StorageScope::Workspace
            && !self.opts.device_host
            && !self.opts.nvptx
            && self.opts.device_type == crate::packed_func::DLDeviceType::CPU.0;
        let ws_on_stack = cpu_workspace
            && const_bytes
                .is_some_and(|b| self.stack_workspace_bytes + b <= MAX_STACK_WORKSPACE_BYTES);
        if ws_on_stack {
            self.stack_workspace_bytes += const_bytes.unwrap_or(0);
        }
        let on_stack = (buffer.scope == StorageScope::Local && small) || ws_on_stack;
        if self.opts.device_host && buffer.scope == StorageScope::Local && !on_stack {
            return Err(unsupported(format!(
                "function `{}`: host allocation `{}` must be `local` with a constant size of at most {MAX_STACK_BYTES} bytes (host code of a device target has no host workspace); use `workspace` for device memory",
                self.fname, buffer.name
            )));
        }
        let ptr;
        if on_stack {
            let n = buffer.const_numel().unwrap_or(1).max(1);
            let a = format!("%alloca{}", self.label + 1);
            self.label += 1;
            let _ = writeln!(self.entry_allocas, "  {a} = alloca {mt}, i64 {n}, align 64");
            ptr = a;
            self.bufs
                .insert(buffer.data.id, Val::new(Self::ptr(&mt), &ptr));
            self.stmt(body)?;
        } else {
            let mut numel = Val::new("i64", "1");
            for d in &buffer.shape {
                let dv = self.index64(d)?;
                numel = self.assign("i64", format!("mul i64 {}, {}", numel.v, dv.v));
            }
            let neg = self.assign("i1", format!("icmp sge i64 {}, 0", numel.v));
            self.check(
                &neg.v,
                "RuntimeError",
                &format!("allocation `{}` has a negative size", buffer.name),
            );
            let bytes = self.assign("i64", format!("mul i64 {}, {elem}", numel.v));
            let raw = self.alloc_workspace(&bytes.v, buffer);
            let ok = self.assign("i1", format!("icmp ne i8* {raw}, null"));
            let msg = format!(
                "cannot allocate workspace `{}` in `{}`",
                buffer.name, self.fname
            );
            self.check(&ok.v, "RuntimeError", &msg);
            let typed = self.assign(&Self::ptr(&mt), format!("bitcast i8* {raw} to {mt}*"));
            self.bufs.insert(buffer.data.id, typed);
            self.live_ws.push(raw.clone());
            self.stmt(body)?;
            self.live_ws.pop();
            self.free_workspace(&raw);
        }
        self.bufs.remove(&buffer.data.id);
        Ok(())
    }

    fn alloc_workspace(&mut self, nbytes: &str, buffer: &Buffer) -> String {
        self.m.uses_workspace = true;
        let code = buffer.dtype.code as u8;
        let bits = buffer.dtype.bits;
        let dt = self.opts.device_type;
        let dev = self.device_id();
        let r = self.assign(
            "i8*",
            format!("call i8* @__kiln_alloc_workspace(i32 {dt}, i32 {dev}, i64 {nbytes}, i32 {code}, i32 {bits})"),
        );
        r.v
    }

    pub(super) fn free_workspace(&mut self, p: &str) {
        let dt = self.opts.device_type;
        let dev = self.device_id();
        self.line(format!(
            "call void @__kiln_free_workspace(i32 {dt}, i32 {dev}, i8* {p})"
        ));
    }

    /// The device id of the function's tensors: `%devid` in a device target's host code
    /// (passed by the packed wrapper), 0 on the CPU.
    fn device_id(&self) -> &'static str {
        if self.opts.device_host {
            "%devid"
        } else {
            "0"
        }
    }
}

/// Whether `for var { body }` holds a loop and indexes some buffer with `var` in a dimension
/// other than its last (contiguous) one: vectorizing it (after unrolling the loops inside)
/// would gather that load or scatter that store. A load that uses `var` only in its last
/// dimension does not make the loop a good one to vectorize: TOPI's `one_hot` (`out[i, j] =
/// select(I[i] == j, ...)`, 10 x 12) reads `I[i]` contiguously, and LLVM 14 made its `i` loop
/// twelve AVX-512 scatters of ten lanes: 0.06 us, 0.01 us with the rule (AMD EPYC Zen 5).
fn strided_outer_loop(var: &Var, body: &Stmt) -> bool {
    use crate::ir::visit::{walk_expr, walk_stmt, Visitor};
    struct Scan<'v> {
        var: &'v Var,
        has_loop: bool,
        strided: bool,
    }
    impl Scan<'_> {
        fn indices(&mut self, indices: &[Expr]) {
            let last = indices.len().saturating_sub(1);
            self.strided |= indices[..last].iter().any(|e| e.mentions(self.var));
        }
    }
    impl Visitor for Scan<'_> {
        fn stmt(&mut self, s: &Stmt) {
            match s {
                Stmt::For { .. } => self.has_loop = true,
                Stmt::Store { indices, .. } => self.indices(indices),
                _ => {}
            }
            walk_stmt(self, s);
        }
        fn expr(&mut self, e: &Expr) {
            if let Expr::Load { indices, .. } = e {
                self.indices(indices);
            }
            walk_expr(self, e);
        }
    }
    let mut s = Scan {
        var,
        has_loop: false,
        strided: false,
    };
    s.stmt(body);
    s.has_loop && s.strided
}

/// The longest constant trip count for which an innermost serial loop gets its vector width
/// from kiln (`short_loop_width`).
const SHORT_LOOP: i64 = 1024;

/// The most vector steps of a short loop (`short_loop_width`) that are unrolled into straight
/// code once vectorized (a step of 16 lanes may be two interleaved vectors of 8).
const SHORT_LOOP_UNROLLED_STEPS: i64 = 4;

/// The widest vector `short_loop_width` picks (16 lanes: one AVX-512 register of `float32`).
const SHORT_LOOP_LANES: i64 = 16;

/// The vector width for `for var { body }` (of `kind` and constant `extent`) when kiln picks
/// it: a serial innermost loop of 16 to [`SHORT_LOOP`] iterations whose every load and store
/// indexes with `var` only in its last dimension, as `var` plus a term without `var` (so the
/// vector accesses are contiguous: never a gather), and every store with `var` (no
/// reduction); the lanes of a step are the largest power of two that divides the trip count,
/// at most [`SHORT_LOOP_LANES`] and at least 4. Returns the vector width and the vectors a
/// step interleaves: a step whose widest store would not fit one register of `vector_bits`
/// is that many register-wide vectors.
fn short_loop_width(
    kind: ForKind,
    extent: Option<i64>,
    var: &Var,
    body: &Stmt,
    vector_bits: u32,
) -> Option<(i64, i64)> {
    use crate::ir::visit::{walk_expr, walk_stmt, Visitor};
    let n = extent?;
    if kind != ForKind::Serial || !(16..=SHORT_LOOP).contains(&n) || has_loop(body) {
        return None;
    }
    let lanes = (1i64 << n.trailing_zeros()).min(SHORT_LOOP_LANES);
    if lanes < 4 {
        return None;
    }
    struct Scan<'v> {
        var: &'v Var,
        ok: bool,
        store_bits: u32,
    }
    impl Scan<'_> {
        fn indices(&mut self, indices: &[Expr]) {
            let last = indices.len().saturating_sub(1);
            for (d, e) in indices.iter().enumerate() {
                if e.mentions(self.var)
                    && (d != last || !crate::codegen::interchange::unit_stride(e, self.var))
                {
                    self.ok = false;
                }
            }
        }
    }
    impl Visitor for Scan<'_> {
        fn stmt(&mut self, s: &Stmt) {
            match s {
                // A store to one place in every iteration (a reduction) stays scalar: an
                // in-order vector reduction of floats is slower than the scalar loop.
                Stmt::Store {
                    buffer, indices, ..
                } => {
                    self.ok &= indices.iter().any(|e| e.mentions(self.var));
                    let bits = u32::from(buffer.dtype.bits) * u32::from(buffer.dtype.lanes);
                    self.store_bits = self.store_bits.max(bits);
                    self.indices(indices)
                }
                // Effects a vector loop would reorder or repeat.
                Stmt::Assert { .. } | Stmt::Return(_) | Stmt::Evaluate(_) => self.ok = false,
                _ => {}
            }
            walk_stmt(self, s);
        }
        fn expr(&mut self, e: &Expr) {
            match e {
                Expr::Load { indices, .. } => self.indices(indices),
                Expr::CallExtern { .. } => self.ok = false,
                // A call of libm (`pow`, `log`, ...) stays a call per element: forced vector
                // code would only add extracts and inserts around the calls (`power` ran at
                // 0.81x TVM's time so, 1.0x as LLVM unrolls it).
                Expr::Call { op, args } if !inline_call(*op, args) => self.ok = false,
                _ => {}
            }
            walk_expr(self, e);
        }
    }
    let mut scan = Scan {
        var,
        ok: true,
        store_bits: 1,
    };
    scan.stmt(body);
    // A store wider than a register is split by LLVM 14 into register-wide stores in
    // descending address order, which the store buffer drains slower (`pad`'s rows of 48
    // `float32` in 16 lanes, two `ymm` stores each, high half first: 0.34 us against 0.28 us
    // with the halves ascending, Zen 3). A narrower width unrolls to ascending stores.
    // Interleaved vectors keep the step's independent work (the polynomial of an `exp`
    // in 16 lanes: `softmax` at 0.7x the speed in one vector of 8).
    let fit = i64::from(vector_bits / scan.store_bits);
    let width = lanes.min(fit).max(4);
    scan.ok.then_some((width, lanes / width))
}

/// Whether the intrinsic call `op(args)` is compiled to code LLVM can vectorize (LLVM
/// intrinsics with vector forms, and kiln's inline `float32` `exp`, `sigmoid` and `erf`),
/// rather than a call of libm per element.
fn inline_call(op: crate::ir::Intrinsic, args: &[Expr]) -> bool {
    use crate::ir::Intrinsic as I;
    let f32_arg = args
        .first()
        .is_some_and(|a| a.dtype() == crate::ir::DataType::f32());
    match op {
        I::Sqrt
        | I::Rsqrt
        | I::Abs
        | I::Floor
        | I::Ceil
        | I::Round
        | I::Fma
        | I::Copysign
        | I::Trunc
        | I::Nearbyint
        | I::FastExp
        | I::BitwiseNot
        | I::Clz
        | I::Popcount
        | I::IsNan
        | I::IsInf
        | I::IsFinite => true,
        I::Exp | I::Sigmoid | I::Erf => f32_arg,
        _ => false,
    }
}

/// How many times [`register_tile_loop`]s are unrolled.
const REGISTER_TILE_UNROLL: i64 = 4;

/// The most elements a [`register_tile_loop`]'s tile holds (AVX-512's 8 x 32 floats: 256).
const REGISTER_TILE_ELEMENTS: i64 = 512;

/// Whether `body` is a register tile: it holds loops, every one of them unrolled or vectorized
/// with a constant extent, at least one unrolled (the tile's rows), their extents multiplying
/// to at most [`REGISTER_TILE_ELEMENTS`] (the `k` loop of a matmul's `mr x nr` tile; not a
/// loop over the vector chunks of a row).
fn register_tile_loop(body: &Stmt) -> bool {
    use crate::ir::visit::{walk_stmt, Visitor};
    struct Scan {
        elements: i64,
        unrolled: bool,
        ok: bool,
    }
    impl Visitor for Scan {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::For { kind, extent, .. } = s {
                self.unrolled |= *kind == ForKind::Unrolled;
                self.ok &= matches!(kind, ForKind::Unrolled | ForKind::Vectorized);
                match extent.as_int() {
                    Some(n) if n > 0 => self.elements = self.elements.saturating_mul(n),
                    _ => self.ok = false,
                }
            }
            walk_stmt(self, s);
        }
        fn expr(&mut self, _: &Expr) {}
    }
    let mut s = Scan {
        elements: 1,
        unrolled: false,
        ok: true,
    };
    s.stmt(body);
    s.ok && s.unrolled && s.elements <= REGISTER_TILE_ELEMENTS
}

/// The longest serial loop [`folds_when_unrolled`] unrolls.
const FOLDED_LOOP: i64 = 32;

/// Whether `for var { body }` (serial, constant `extent` of 2 to [`FOLDED_LOOP`], innermost)
/// converts `var` to a float: LLVM cannot see that each unrolled iteration's float arithmetic
/// folds to a constant (its unroller analyzes at most ten iterations), so it keeps the loop,
/// with a conversion, a rounding and a clamp per element.
fn folds_when_unrolled(kind: ForKind, extent: Option<i64>, var: &Var, body: &Stmt) -> bool {
    use crate::ir::visit::{walk_expr, Visitor};
    struct Scan<'v> {
        var: &'v Var,
        found: bool,
    }
    impl Visitor for Scan<'_> {
        fn expr(&mut self, e: &Expr) {
            if let Expr::Cast { dtype, value, .. } = e {
                if matches!(dtype.code, TypeCode::Float | TypeCode::BFloat)
                    && dtype.lanes == 1
                    && value.mentions(self.var)
                {
                    self.found = true;
                }
            }
            walk_expr(self, e);
        }
    }
    if kind != ForKind::Serial
        || !matches!(extent, Some(n) if (2..=FOLDED_LOOP).contains(&n))
        || has_loop(body)
    {
        return false;
    }
    let mut s = Scan { var, found: false };
    s.stmt(body);
    s.found
}

/// The most iterations of an inner loop that may still become straight code (the emitter's
/// unrolling and vectorized rows, a short row of a few vector steps).
const STRAIGHT_LOOP: i64 = 64;

/// Whether `s` holds a serial or vectorized loop that stays a loop (longer than
/// [`STRAIGHT_LOOP`] or of unknown length) and is big ([`code_size`]). An outer loop around
/// one is kept a loop (not unrolled): unrolled, it only copies the inner loop, which multiplies
/// the code and the compile time. LLVM's full unroller, which runs before the vectorizer,
/// copied TVM's `tanh` of 4 x 128 (one inline `exp` a row element) four times, one vectorized
/// loop each: 67 against 26.5 ms to compile (`kiln build`). Small bodies are left to LLVM,
/// whose copies of them cost little compile time.
fn holds_long_loop(s: &Stmt) -> bool {
    use crate::ir::visit::{walk_stmt, Visitor};
    struct Scan(bool);
    impl Visitor for Scan {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::For {
                extent,
                kind: ForKind::Serial | ForKind::Vectorized,
                ..
            } = s
            {
                self.0 |= extent.as_int().is_none_or(|n| n > STRAIGHT_LOOP);
            }
            walk_stmt(self, s);
        }
        fn expr(&mut self, _: &Expr) {}
    }
    let mut scan = Scan(false);
    scan.stmt(s);
    scan.0 && code_size(s) >= BIG_BODY
}

/// The size, in [`code_size`]'s units, of a loop body whose copies cost compile time.
const BIG_BODY: usize = 32;

/// A rough size of the code `s` becomes: one per expression node, [`BIG_BODY`] per
/// transcendental call (kiln's inline `exp`, `erf` and `sigmoid` are polynomials of a few dozen
/// instructions; the others call libm).
fn code_size(s: &Stmt) -> usize {
    use crate::ir::visit::{walk_expr, Visitor};
    struct Size(usize);
    impl Visitor for Size {
        fn expr(&mut self, e: &Expr) {
            self.0 += match e {
                Expr::Call { op, .. }
                    if !matches!(
                        op,
                        crate::ir::Intrinsic::Abs
                            | crate::ir::Intrinsic::Floor
                            | crate::ir::Intrinsic::Ceil
                            | crate::ir::Intrinsic::Round
                            | crate::ir::Intrinsic::Fma
                            | crate::ir::Intrinsic::Sqrt
                    ) =>
                {
                    BIG_BODY
                }
                _ => 1,
            };
            walk_expr(self, e);
        }
    }
    let mut size = Size(0);
    size.stmt(s);
    size.0
}

/// Whether `s` holds a loop.
pub(super) fn has_loop(s: &Stmt) -> bool {
    let mut found = false;
    crate::ir::visit::for_each_loop(s, |_, _, _| found = true);
    found
}
