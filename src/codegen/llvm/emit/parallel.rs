//! Parallel loops: each becomes a `<name>_lambda_<k>` function over a closure of the variables
//! and buffers it uses, run inline when the loop has little work and launched through
//! `TVMBackendParallelLaunch` otherwise.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::ir::{Buffer, Expr, ForKind, Stmt, Var, VarId};

use super::{fn_attrs, reg_ty, Emitter, Val, R};

impl Emitter<'_> {
    pub(super) fn parallel_for(
        &mut self,
        var: &Var,
        min: &Expr,
        extent: &Expr,
        body: &Stmt,
    ) -> R<()> {
        self.m.uses_parallel = true;
        let lo = self.expr(min)?;
        let n = self.expr(extent)?;
        let lo64 = self.widen64(var.dtype, lo);
        let n64 = self.widen64(var.dtype, n);
        let ty = reg_ty(var.dtype);
        // Capture every variable and buffer in scope that the body uses.
        let mut used = BTreeSet::new();
        collect_vars(body, &mut used);
        let mut caps: Vec<(VarId, Val, bool)> = Vec::new();
        for id in &used {
            if let Some(v) = self.vars.get(id) {
                caps.push((*id, v.clone(), false));
            } else if let Some(b) = self.bufs.get(id) {
                caps.push((*id, b.clone(), true));
            }
        }
        let mut fields: Vec<String> = vec!["i64".into(), "i64".into()];
        fields.extend(caps.iter().map(|(_, v, _)| v.ty.clone()));
        let sty = format!("{{ {} }}", fields.join(", "));
        // The closure: a static alloca (in the entry block), filled where the lambda is called.
        // The inline call gets its own, which LLVM removes once it inlines the lambda; the
        // pool's escapes into the launch.
        let make_closure = |e: &mut Self| -> Val {
            e.label += 1;
            let clo = format!("%clo{}", e.label);
            let _ = writeln!(e.entry_allocas, "  {clo} = alloca {sty}, align 8");
            let mut store_field = |idx: usize, val: &Val| {
                let p = e.assign(
                    "",
                    format!("getelementptr inbounds {sty}, {sty}* {clo}, i32 0, i32 {idx}"),
                );
                e.line(format!(
                    "store {}, {}* {}, align 8",
                    val.typed(),
                    val.ty,
                    p.v
                ));
            };
            store_field(0, &lo64);
            store_field(1, &n64);
            for (k, (_, v, _)) in caps.iter().enumerate() {
                store_field(k + 2, v);
            }
            e.assign("i8*", format!("bitcast {sty}* {clo} to i8*"))
        };
        self.lambdas += 1;
        let lname = format!("{}_lambda_{}", self.fname, self.lambdas);
        // The lambda body, in its own emitter.
        let text = {
            let mut sub = Emitter::new(self.m, self.opts, &lname, self.metadata, self.md_next);
            sub.kernel_name = self.kernel_name.clone();
            let cd = sub.assign(&format!("{sty}*"), format!("bitcast i8* %cdata to {sty}*"));
            let load_field = |e: &mut Emitter, idx: usize, ty: &str| -> Val {
                let p = e.assign(
                    "",
                    format!(
                        "getelementptr inbounds {sty}, {sty}* {}, i32 0, i32 {idx}",
                        cd.v
                    ),
                );
                e.assign(ty, format!("load {ty}, {ty}* {}, align 8", p.v))
            };
            let lo = load_field(&mut sub, 0, "i64");
            let n = load_field(&mut sub, 1, "i64");
            let fields: Vec<Val> = caps
                .iter()
                .enumerate()
                .map(|(k, (_, v, _))| load_field(&mut sub, k + 2, &v.ty))
                .collect();
            let ntp = sub.assign(
                "i32*",
                "getelementptr inbounds { i8*, i32 }, { i8*, i32 }* %penv, i32 0, i32 1",
            );
            let nt32 = sub.assign("i32", format!("load i32, i32* {}, align 4", ntp.v));
            let nt = sub.assign("i64", format!("sext i32 {} to i64", nt32.v));
            let task = sub.assign("i64", "sext i32 %task to i64");
            // Task `t` of `T` runs iterations [t q + min(t, r), + q + (t < r)), q = n / T,
            // r = n % T: shares that differ by at most one iteration (TVM's ceil(n / T) chunks
            // leave the last tasks short or empty: 34 blocks in 8 tasks on 2 threads ran as 20
            // against 14), with no product that can overflow.
            let q = sub.assign("i64", format!("sdiv i64 {}, {}", n.v, nt.v));
            let r = sub.assign("i64", format!("srem i64 {}, {}", n.v, nt.v));
            let tq = sub.assign("i64", format!("mul i64 {}, {}", task.v, q.v));
            let lt = sub.assign("i1", format!("icmp slt i64 {}, {}", task.v, r.v));
            let mn = sub.assign(
                "i64",
                format!("select i1 {}, i64 {}, i64 {}", lt.v, task.v, r.v),
            );
            let b1 = sub.assign("i64", format!("add i64 {}, {}", tq.v, mn.v));
            let extra = sub.assign("i64", format!("zext i1 {} to i64", lt.v));
            let len = sub.assign("i64", format!("add i64 {}, {}", q.v, extra.v));
            let e1 = sub.assign("i64", format!("add i64 {}, {}", b1.v, len.v));
            let bl = sub.assign("i64", format!("add i64 {}, {}", b1.v, lo.v));
            let el = sub.assign("i64", format!("add i64 {}, {}", e1.v, lo.v));
            let (blv, elv) = if ty == "i64" {
                (bl, el)
            } else {
                let a = sub.assign(&ty, format!("trunc i64 {} to {ty}", bl.v));
                let b = sub.assign(&ty, format!("trunc i64 {} to {ty}", el.v));
                (a, b)
            };
            let args: Vec<String> = [blv.typed(), elv.typed()]
                .into_iter()
                .chain(fields.iter().map(Val::typed))
                .collect();
            let rc = sub.assign(
                "i32",
                format!("call i32 @\"{lname}_body\"({})", args.join(", ")),
            );
            sub.line(format!("ret i32 {}", rc.v));
            sub.finish()
        };
        // The loop itself, in a function of the chunk's bounds and the captured values, inlined
        // into the lambda: a buffer of a `noalias` function is a `noalias` argument, which
        // inlining turns into alias scopes. Loaded from the closure, the pointers were
        // anonymous to LLVM, which then kept the loop's loads and stores in order (TOPI's
        // conv2d in a ResNet block ran at 1.5x its serial time with its channel loop parallel).
        let body_text = {
            let mut inner = Emitter::new(
                self.m,
                self.opts,
                &format!("{lname}_body"),
                self.metadata,
                self.md_next,
            );
            inner.in_range_casts = self.in_range_casts.clone();
            inner.kernel_name = self.kernel_name.clone();
            inner.noalias = self.noalias;
            for (k, (id, v, is_buf)) in caps.iter().enumerate() {
                let val = Val::new(&v.ty, format!("%a{k}"));
                if *is_buf {
                    inner.bufs.insert(*id, val);
                } else {
                    inner.vars.insert(*id, val);
                }
            }
            inner.counted_loop(
                var,
                Val::new(&ty, "%lo"),
                Val::new(&ty, "%hi"),
                ForKind::Serial,
                body,
            )?;
            inner.line("ret i32 0");
            inner.finish()
        };
        let attrs = fn_attrs(self.opts);
        let mut params = vec![format!("{ty} %lo"), format!("{ty} %hi")];
        for (k, (_, v, is_buf)) in caps.iter().enumerate() {
            let na = if *is_buf && self.noalias {
                " noalias"
            } else {
                ""
            };
            params.push(format!("{}{na} %a{k}", v.ty));
        }
        self.m.functions.push(format!(
            "define internal i32 @\"{lname}_body\"({}) {attrs} alwaysinline {{\n{body_text}}}\n",
            params.join(", ")
        ));
        self.m.functions.push(format!(
            "define internal i32 @\"{lname}\"(i32 %task, {{ i8*, i32 }}* %penv, i8* %cdata) {attrs} {{\n{text}}}\n"
        ));
        let lam = format!("i32 (i32, {{ i8*, i32 }}*, i8*)* @\"{lname}\"");
        // The launch on the pool (or the host's), with its own closure.
        let pool_launch = |e: &mut Self| -> Val {
            let cdata = make_closure(e);
            e.assign(
                "i32",
                format!(
                    "call i32 @__kiln_parallel_launch({lam}, i8* {}, i32 0)",
                    cdata.v
                ),
            )
        };
        let rc = match work_per_iteration(body) {
            // Little work in all: one task on this thread, without the pool (whose launch
            // costs microseconds). Unknown work (symbolic inner loops) always goes to the pool.
            // Unsigned: a negative extent (no iteration) goes to the pool, and LLVM knows that
            // the inline task's range is [0, n), which saves its bounds arithmetic.
            Some(w) => {
                let limit = PARALLEL_MIN_WORK.div_ceil(w.max(1));
                let small = self.assign("i1", format!("icmp ult i64 {}, {limit}", n64.v));
                let (inline, pool, join) = (
                    self.new_label("pinline"),
                    self.new_label("ppool"),
                    self.new_label("pjoin"),
                );
                self.line(format!("br i1 {}, label %{inline}, label %{pool}", small.v));
                self.start_block(&inline);
                let env = format!("%penv{}", self.label + 1);
                self.label += 1;
                let _ = writeln!(
                    self.entry_allocas,
                    "  {env} = alloca {{ i8*, i32 }}, align 8"
                );
                self.line(format!(
                    "store {{ i8*, i32 }} {{ i8* null, i32 1 }}, {{ i8*, i32 }}* {env}, align 8"
                ));
                let cdata = make_closure(self);
                // Inlined here (a call-site `alwaysinline`; the pool launch keeps the function):
                // with one task known, the closure's chunk division and loads fold away
                // (an exported 1-element vadd called from a C host: 7.3 -> 4.8 ns).
                let r1 = self.assign(
                    "i32",
                    format!(
                        "call i32 @\"{lname}\"(i32 0, {{ i8*, i32 }}* {env}, i8* {}) alwaysinline",
                        cdata.v
                    ),
                );
                self.line(format!("br label %{join}"));
                self.start_block(&pool);
                let r2 = pool_launch(self);
                self.line(format!("br label %{join}"));
                self.start_block(&join);
                self.assign(
                    "i32",
                    format!("phi i32 [ {}, %{inline} ], [ {}, %{pool} ]", r1.v, r2.v),
                )
            }
            None => pool_launch(self),
        };
        self.propagate(&rc.v);
        Ok(())
    }
}

/// Below this much work in all (iterations x [`work_per_iteration`]), a parallel loop runs on
/// the calling thread: waking a pool and waiting for it costs 1-2 us (kiln's pool, measured by
/// `cargo bench --bench kernels`), about what this many IR operations take on one core.
pub(crate) const PARALLEL_MIN_WORK: u64 = 16_384;

/// A static estimate of the work of one iteration of a loop body: IR nodes evaluated, inner
/// loops of constant extent multiplied out; `None` when an inner loop's extent is not a
/// constant (the work is unknown, so the loop is always worth the pool).
pub(crate) fn work_per_iteration(s: &Stmt) -> Option<u64> {
    fn expr(e: &Expr) -> u64 {
        let sum = |v: &[Expr]| v.iter().map(expr).fold(0u64, u64::saturating_add);
        1 + match e {
            Expr::IntImm { .. } | Expr::FloatImm { .. } | Expr::Var(_) => 0,
            Expr::Binary { a, b, .. } => expr(a).saturating_add(expr(b)),
            Expr::Not(a) | Expr::Cast { value: a, .. } | Expr::Reinterpret { value: a, .. } => {
                expr(a)
            }
            Expr::Select { cond, t, f } | Expr::IfThenElse { cond, t, f } => {
                expr(cond).saturating_add(expr(t)).saturating_add(expr(f))
            }
            Expr::Load { indices, .. } => sum(indices),
            Expr::Let { value, body, .. } => expr(value).saturating_add(expr(body)),
            // A math function is worth several operations.
            Expr::Call { args, .. } => sum(args).saturating_add(8),
            Expr::CallExtern { args, .. } => sum(args).saturating_add(8),
        }
    }
    Some(match s {
        Stmt::Seq(v) => {
            let mut t = 0u64;
            for x in v {
                t = t.saturating_add(work_per_iteration(x)?);
            }
            t
        }
        Stmt::For { extent, body, .. } => {
            let e = u64::try_from(extent.as_int()?).unwrap_or(0);
            e.saturating_mul(work_per_iteration(body)?.saturating_add(1))
        }
        Stmt::Store { indices, value, .. } => {
            1 + expr(value) + indices.iter().map(expr).sum::<u64>()
        }
        Stmt::Let { value, body, .. } => expr(value).saturating_add(work_per_iteration(body)?),
        Stmt::Allocate { body, .. } => work_per_iteration(body)?.saturating_add(4),
        Stmt::IfThenElse {
            cond,
            then_case,
            else_case,
        } => {
            let t = work_per_iteration(then_case)?;
            let e = match else_case {
                Some(e) => work_per_iteration(e)?,
                None => 0,
            };
            expr(cond).saturating_add(t.max(e))
        }
        Stmt::Evaluate(e) => expr(e),
        Stmt::Assert { cond, .. } => expr(cond),
        _ => 1,
    })
}

/// Every variable and buffer-data id a statement mentions (bound inside or not).
pub(crate) fn collect_vars(s: &Stmt, out: &mut BTreeSet<VarId>) {
    fn buf(b: &Buffer, out: &mut BTreeSet<VarId>) {
        out.insert(b.data.id);
        for e in b.shape.iter().chain(b.strides.iter().flatten()) {
            expr(e, out);
        }
    }
    fn expr(e: &Expr, out: &mut BTreeSet<VarId>) {
        match e {
            Expr::IntImm { .. } | Expr::FloatImm { .. } => {}
            Expr::Var(v) => {
                out.insert(v.id);
            }
            Expr::Binary { a, b, .. } => {
                expr(a, out);
                expr(b, out);
            }
            Expr::Not(a) | Expr::Cast { value: a, .. } | Expr::Reinterpret { value: a, .. } => {
                expr(a, out)
            }
            Expr::Select { cond, t, f } | Expr::IfThenElse { cond, t, f } => {
                expr(cond, out);
                expr(t, out);
                expr(f, out);
            }
            Expr::Load { buffer, indices } => {
                buf(buffer, out);
                indices.iter().for_each(|i| expr(i, out));
            }
            Expr::Let { value, body, .. } => {
                expr(value, out);
                expr(body, out);
            }
            Expr::Call { args, .. } | Expr::CallExtern { args, .. } => {
                args.iter().for_each(|a| expr(a, out))
            }
        }
    }
    match s {
        Stmt::For {
            min, extent, body, ..
        } => {
            expr(min, out);
            expr(extent, out);
            collect_vars(body, out);
        }
        Stmt::Store {
            buffer,
            indices,
            value,
        } => {
            buf(buffer, out);
            indices.iter().for_each(|i| expr(i, out));
            expr(value, out);
        }
        Stmt::Allocate { buffer, body } => {
            for e in &buffer.shape {
                expr(e, out);
            }
            collect_vars(body, out);
        }
        Stmt::Let { value, body, .. } => {
            expr(value, out);
            collect_vars(body, out);
        }
        Stmt::IfThenElse {
            cond,
            then_case,
            else_case,
        } => {
            expr(cond, out);
            collect_vars(then_case, out);
            if let Some(e) = else_case {
                collect_vars(e, out);
            }
        }
        Stmt::While { cond, body } => {
            expr(cond, out);
            collect_vars(body, out);
        }
        Stmt::Seq(v) => v.iter().for_each(|s| collect_vars(s, out)),
        Stmt::Evaluate(e) | Stmt::Return(e) => expr(e, out),
        Stmt::Prefetch { buffer, indices } => {
            buf(buffer, out);
            indices.iter().for_each(|i| expr(i, out));
        }
        Stmt::Barrier => {}
        Stmt::Assert { cond, .. } => expr(cond, out),
    }
}
