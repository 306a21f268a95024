//! IR to LLVM 14 textual IR.
//!
//! kiln writes LLVM IR as text and lets LLVM parse it (`LLVMParseIRInContext` through inkwell).
//! Text is the one interface of LLVM 14 that reaches everything the code generator needs:
//! per-instruction fast-math flags (the C API has no setter before LLVM 18), self-referential
//! `llvm.loop` metadata and `llvm.access.group`s for vectorized loops, and `noalias` and
//! alignment attributes. It is also what `--emit ll` shows, so what you read is what was compiled.
//! (An LLVM upgrade changes the pointer syntax: `float*` becomes `ptr`; the emitter spells
//! pointer types in one place, [`Emitter::ptr`].)
//!
//! Each `PrimFunc` becomes:
//! - `__tvm_ffi_<name>`: the packed wrapper (see `packed.rs`), which checks and decodes arguments;
//! - `<name>_compute_`: an internal function over the decoded values (data pointers, shape and
//!   stride variables, scalars, the result slot), whose pointers are `noalias` when the function
//!   says so;
//! - one `<name>_lambda_<k>` per parallel loop, launched through `TVMBackendParallelLaunch`.
//!
//! Every function returns `i32`: 0, or -1 after raising an error (integer division by zero,
//! failed assertions, workspace exhaustion) and freeing the workspaces live at that point.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use crate::ir::{
    BinOp, Buffer, DataType, Expr, ForKind, Intrinsic, Stmt, StorageScope, TypeCode, Var, VarId,
};

use super::super::CodegenError;

/// How runtime services are reached, and how the module's symbols are named.
#[derive(Clone, Debug)]
pub enum Linkage {
    /// In-process JIT: the context slots (`slots`, from `library::context_symbols`) are
    /// constants holding the addresses of the services registered in this process, so LLVM
    /// folds them into direct calls. The argument checkers (the error path of each wrapper)
    /// are not compiled with the module: a failed check calls `check.0`
    /// (`jit::kiln_jit_check_args`) with `check.1` as its context, which compiles them on first
    /// use ([`Linkage::Checkers`]). Every exported symbol ends with `suffix`, unique per module
    /// in the process.
    Jit {
        /// The context slots and their addresses.
        slots: Vec<(String, usize)>,
        /// The lazy checker entry point and its context.
        check: (usize, usize),
        /// The address of the module's table of compute functions: one pointer-sized slot per
        /// function with a global symbol, in module order. A wrapper loads its compute function
        /// from its slot on every call, so that re-optimized code can replace the first code
        /// while the module is in use (`tiering.rs`).
        calls: usize,
        /// Appended to every exported symbol.
        suffix: String,
    },
    /// The argument checkers of a [`Linkage::Jit`] module alone, as
    /// `__kiln_check_<symbol><suffix>` functions with the safe-call signature that return 0, or
    /// raise the error and return -1.
    Checkers {
        /// The context slots and their addresses.
        slots: Vec<(String, usize)>,
        /// Appended to every exported symbol.
        suffix: String,
    },
    /// An exported library: exported, zero-initialized context slots that the loader fills,
    /// with fallbacks when it does not (a weak `TVMFFIErrorSetRaisedFromCStr`, serial parallel
    /// loops, `aligned_alloc`/`free` workspaces). The checkers are internal functions of the
    /// library.
    Export,
}

impl Linkage {
    /// The context slots of an in-process module (`None` for an exported one).
    pub fn slots(&self) -> Option<&[(String, usize)]> {
        match self {
            Linkage::Jit { slots, .. } | Linkage::Checkers { slots, .. } => Some(slots),
            Linkage::Export => None,
        }
    }

    /// The same linkage with `suffix` after every exported symbol (an exported library's
    /// symbols have none).
    pub(crate) fn with_suffix(&self, suffix: &str) -> Linkage {
        let mut l = self.clone();
        if let Linkage::Jit { suffix: s, .. } | Linkage::Checkers { suffix: s, .. } = &mut l {
            *s = suffix.to_owned();
        }
        l
    }

    /// What follows the name of every exported symbol.
    pub fn suffix(&self) -> &str {
        match self {
            Linkage::Jit { suffix, .. } | Linkage::Checkers { suffix, .. } => suffix,
            Linkage::Export => "",
        }
    }
}

/// What the emitter needs to know about the target.
#[derive(Clone, Debug)]
pub struct EmitOptions {
    /// `target-cpu` function attribute.
    pub cpu: String,
    /// `target-features` function attribute.
    pub features: String,
    /// Fast-math flags put on every floating-point instruction (`""` for none, e.g. `"fast"`).
    pub fast_math: String,
    /// The DLPack device type the arguments must be on.
    pub device_type: i32,
    /// The device name in messages (`cpu`).
    pub device_name: String,
    /// With a device target: the kernels of the module's functions (the host/device split),
    /// each thread-bound nest replaced by a launch of its kernel. Empty on the CPU.
    pub kernels: Vec<crate::codegen::device::KernelPlan>,
    /// Whether this module is a device target's host code (even with no kernel).
    pub device_host: bool,
    /// Outputs of at least this many bytes are written with streaming stores (x86; `None`:
    /// never); see `stream.rs`.
    pub stream_store_bytes: Option<u64>,
}

/// Local allocations up to this size live on the stack; larger ones use the workspace.
const MAX_STACK_BYTES: i64 = 16 * 1024;

/// An LLVM value: its type and its spelling (`%t3`, `42`, `0x3FF0000000000000`).
#[derive(Clone, Debug)]
pub(crate) struct Val {
    pub ty: String,
    pub v: String,
}

impl Val {
    pub(crate) fn new(ty: impl Into<String>, v: impl Into<String>) -> Self {
        Val {
            ty: ty.into(),
            v: v.into(),
        }
    }
    pub(crate) fn typed(&self) -> String {
        format!("{} {}", self.ty, self.v)
    }
}

/// The register type of a dtype (bf16 is computed in `float`).
pub(crate) fn reg_ty(t: DataType) -> String {
    match t.code {
        TypeCode::Bool => "i1".into(),
        TypeCode::Int | TypeCode::UInt => format!("i{}", t.bits),
        TypeCode::Float => match t.bits {
            16 => "half".into(),
            32 => "float".into(),
            _ => "double".into(),
        },
        TypeCode::BFloat => "float".into(),
        TypeCode::Handle => "i8*".into(),
    }
}

/// The in-memory type of a dtype (bool is a byte, bf16 its 16 bits).
pub(crate) fn mem_ty(t: DataType) -> String {
    match t.code {
        TypeCode::Bool => "i8".into(),
        TypeCode::BFloat => "i16".into(),
        _ => reg_ty(t),
    }
}

fn is_signed(t: DataType) -> bool {
    t.code == TypeCode::Int
}

/// An LLVM float constant of type `t` with value `v` (rounded to `t`).
fn float_const(t: DataType, v: f64) -> String {
    match (t.code, t.bits) {
        (TypeCode::Float, 16) => format!("0xH{:04X}", half::f16::from_f64(v).to_bits()),
        (TypeCode::Float, 64) => format!("0x{:016X}", v.to_bits()),
        (TypeCode::BFloat, _) => format!(
            "0x{:016X}",
            (half::bf16::from_f64(v).to_f32() as f64).to_bits()
        ),
        _ => format!("0x{:016X}", ((v as f32) as f64).to_bits()),
    }
}

/// A float `min`/`max` with one constant operand that is not NaN: `(other operand, constant,
/// its value rounded to the type)`. `min` and `max` are commutative in the IR's semantics.
fn minmax_by_constant<'e>(
    op: BinOp,
    a: &'e Expr,
    b: &'e Expr,
) -> Option<(&'e Expr, &'e Expr, f64)> {
    if !matches!(op, BinOp::Min | BinOp::Max) {
        return None;
    }
    let value = |e: &Expr| match e {
        Expr::FloatImm { dtype, value } => {
            let v = crate::ir::interp::round_to(*dtype, *value);
            (!v.is_nan()).then_some(v)
        }
        _ => None,
    };
    if let Some(v) = value(b) {
        return Some((a, b, v));
    }
    value(a).map(|v| (b, a, v))
}

/// Escapes bytes for an LLVM `c"..."` string.
pub(crate) fn c_string(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes().chain(std::iter::once(0)) {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            o.push(b as char);
        } else {
            let _ = write!(o, "\\{b:02X}");
        }
    }
    o
}

/// Module-level state shared by every function: string constants, declarations, functions.
#[derive(Default)]
pub(crate) struct ModuleText {
    pub globals: Vec<String>,
    pub functions: Vec<String>,
    strings: HashMap<String, String>,
    pub declares: BTreeSet<String>,
    pub uses_workspace: bool,
    pub uses_parallel: bool,
    /// Whether a function launches device kernels (`__kiln_device_launch`).
    pub uses_device: bool,
    /// The data variables of the outputs that may be written with streaming stores (of every
    /// function of the module: ids are unique), from `stream::stream_outputs`.
    pub stream_bufs: HashSet<VarId>,
}

impl ModuleText {
    /// A pointer to a NUL-terminated constant string.
    pub fn cstr(&mut self, s: &str) -> String {
        let n = self.strings.len();
        let len = s.len() + 1;
        let name = self
            .strings
            .entry(s.to_owned())
            .or_insert_with(|| format!("@.str.{n}"))
            .clone();
        if self.strings.len() > n {
            self.globals.push(format!(
                "{name} = private unnamed_addr constant [{len} x i8] c\"{}\", align 1",
                c_string(s)
            ));
        }
        format!("i8* getelementptr inbounds ([{len} x i8], [{len} x i8]* {name}, i64 0, i64 0)")
    }
}

/// A function being written.
pub(crate) struct Emitter<'m> {
    pub m: &'m mut ModuleText,
    pub opts: &'m EmitOptions,
    /// The function's name, for lambdas and messages.
    pub fname: String,
    body: String,
    entry_allocas: String,
    tmp: usize,
    label: usize,
    pub cur_block: String,
    /// Variables in scope.
    pub vars: HashMap<VarId, Val>,
    /// Typed data pointers of buffers in scope, by data variable.
    pub bufs: HashMap<VarId, Val>,
    /// Workspace pointers live at this point (freed on every exit).
    live_ws: Vec<String>,
    /// Access groups of the enclosing vectorized loops.
    groups: Vec<String>,
    /// The result slot (`TVMFFIAny*`), where `return` is allowed.
    pub ret_slot: Option<String>,
    pub ret_type: Option<DataType>,
    lambdas: usize,
    metadata: &'m mut Vec<String>,
    md_next: &'m mut usize,
    /// In the vector part of a streaming loop: the output whose contiguous stores are
    /// non-temporal and 64-byte aligned.
    stream_buf: Option<VarId>,
    /// The constant extent of the serial loop `counted_loop` is about to emit, if known (set
    /// by `serial_for`, taken by `counted_loop`).
    next_extent: Option<i64>,
}

type R<T> = Result<T, CodegenError>;

fn unsupported(what: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported(what.into())
}

impl<'m> Emitter<'m> {
    pub fn new(
        m: &'m mut ModuleText,
        opts: &'m EmitOptions,
        fname: &str,
        metadata: &'m mut Vec<String>,
        md_next: &'m mut usize,
    ) -> Self {
        Emitter {
            m,
            opts,
            fname: fname.to_owned(),
            body: String::new(),
            entry_allocas: String::new(),
            tmp: 0,
            label: 0,
            cur_block: "entry".into(),
            vars: HashMap::new(),
            bufs: HashMap::new(),
            live_ws: Vec::new(),
            groups: Vec::new(),
            ret_slot: None,
            ret_type: None,
            lambdas: 0,
            metadata,
            md_next,
            stream_buf: None,
            next_extent: None,
        }
    }

    /// The finished body: `entry:` with the hoisted allocas, then everything else.
    pub fn finish(self) -> String {
        format!("entry:\n{}{}", self.entry_allocas, self.body)
    }

    pub fn tmp(&mut self) -> String {
        self.tmp += 1;
        format!("%t{}", self.tmp)
    }

    pub fn new_label(&mut self, base: &str) -> String {
        self.label += 1;
        format!("{base}{}", self.label)
    }

    pub fn line(&mut self, s: impl AsRef<str>) {
        self.body.push_str("  ");
        self.body.push_str(s.as_ref());
        self.body.push('\n');
    }

    pub fn start_block(&mut self, label: &str) {
        let _ = writeln!(self.body, "{label}:");
        self.cur_block = label.to_owned();
    }

    /// `%t = <rhs>` returning `%t` typed `ty`.
    pub fn assign(&mut self, ty: &str, rhs: impl AsRef<str>) -> Val {
        let t = self.tmp();
        self.line(format!("{t} = {}", rhs.as_ref()));
        Val::new(ty, t)
    }

    fn md(&mut self, text: impl FnOnce(usize) -> String) -> usize {
        let n = *self.md_next;
        *self.md_next += 1;
        self.metadata.push(text(n));
        n
    }

    pub fn ptr(ty: &str) -> String {
        format!("{ty}*")
    }

    fn fm(&self) -> String {
        if self.opts.fast_math.is_empty() {
            String::new()
        } else {
            format!("{} ", self.opts.fast_math)
        }
    }

    // ----- errors and exits -------------------------------------------------------------------

    /// Frees the live workspaces (innermost first) without popping them.
    fn free_live(&mut self) {
        for p in self.live_ws.clone().iter().rev() {
            self.free_workspace(p);
        }
    }

    /// Emits: if `!ok` then raise (kind, msg), free live workspaces, return -1.
    pub fn check(&mut self, ok: &str, kind: &str, msg: &str) {
        let fail = self.new_label("fail");
        let cont = self.new_label("ok");
        self.line(format!(
            "br i1 {ok}, label %{cont}, label %{fail}, !prof !0"
        ));
        self.start_block(&fail);
        self.raise(kind, msg);
        self.free_live();
        self.line("ret i32 -1");
        self.start_block(&cont);
    }

    pub fn raise(&mut self, kind: &str, msg: &str) {
        let k = self.m.cstr(kind);
        let s = self.m.cstr(msg);
        self.line(format!("call void @__kiln_raise({k}, {s})"));
    }

    /// Propagates a non-zero status `rc` (an error already raised by the callee).
    fn propagate(&mut self, rc: &str) {
        let bad = self.assign("i1", format!("icmp ne i32 {rc}, 0"));
        let fail = self.new_label("callfail");
        let cont = self.new_label("ok");
        self.line(format!(
            "br i1 {}, label %{fail}, label %{cont}, !prof !1",
            bad.v
        ));
        self.start_block(&fail);
        self.free_live();
        self.line(format!("ret i32 {rc}"));
        self.start_block(&cont);
    }

    // ----- expressions ------------------------------------------------------------------------

    pub fn expr(&mut self, e: &Expr) -> R<Val> {
        Ok(match e {
            Expr::IntImm { dtype, value } => {
                let ty = reg_ty(*dtype);
                if dtype.code == TypeCode::Bool {
                    Val::new(ty, if *value != 0 { "true" } else { "false" })
                } else {
                    // LLVM reads the literal at the type's width: truncate to it.
                    let bits = u32::from(dtype.bits);
                    let v = if bits >= 64 {
                        *value
                    } else {
                        (*value << (64 - bits)) >> (64 - bits)
                    };
                    Val::new(ty, v.to_string())
                }
            }
            Expr::FloatImm { dtype, value } => {
                Val::new(reg_ty(*dtype), float_const(*dtype, *value))
            }
            Expr::Var(v) => {
                self.vars.get(&v.id).cloned().ok_or_else(|| {
                    unsupported(format!("variable `{}` is not bound here", v.name))
                })?
            }
            Expr::Binary { op, a, b } => {
                let t = a.dtype();
                if let Some((var, c, cv)) = minmax_by_constant(*op, a, b) {
                    let x = self.expr(var)?;
                    let y = self.expr(c)?;
                    let r = self.fminmax_const(*op == BinOp::Min, "i1", x, y, cv);
                    return Ok(if t.code == TypeCode::BFloat {
                        self.round_bf16(r)
                    } else {
                        r
                    });
                }
                let x = self.expr(a)?;
                let y = self.expr(b)?;
                self.binary(*op, t, x, y, b)?
            }
            Expr::Not(a) => {
                let x = self.expr(a)?;
                self.assign("i1", format!("xor i1 {}, true", x.v))
            }
            Expr::Select { cond, t, f } => {
                let c = self.expr(cond)?;
                let x = self.expr(t)?;
                let y = self.expr(f)?;
                let ty = x.ty.clone();
                self.assign(
                    &ty,
                    format!("select i1 {}, {}, {}", c.v, x.typed(), y.typed()),
                )
            }
            Expr::Cast { dtype, value } => {
                let from = value.dtype();
                let x = self.expr(value)?;
                self.cast(from, *dtype, x)
            }
            Expr::Load { buffer, indices } => {
                self.host_access(buffer)?;
                let addr = self.address(buffer, indices)?;
                let mt = mem_ty(buffer.dtype);
                let align = buffer.dtype.bytes().max(1);
                let g = self.access_groups();
                let raw = self.assign(&mt, format!("load {mt}, {mt}* {}, align {align}{g}", addr));
                self.mem_to_reg(buffer.dtype, raw)
            }
            Expr::Let { var, value, body } => {
                let v = self.expr(value)?;
                let old = self.vars.insert(var.id, v);
                let r = self.expr(body);
                self.restore(var.id, old);
                r?
            }
            Expr::Call { op, args } => {
                let t = args.first().map(Expr::dtype).unwrap_or(DataType::f32());
                let vals = args.iter().map(|a| self.expr(a)).collect::<R<Vec<_>>>()?;
                self.intrinsic(*op, t, &vals)?
            }
            Expr::IfThenElse { cond, t, f } => {
                // Branches and a phi: only the chosen arm runs (it may guard a load).
                let c = self.expr(cond)?;
                let th = self.new_label("ite_then");
                let el = self.new_label("ite_else");
                let end = self.new_label("ite_end");
                self.line(format!("br i1 {}, label %{th}, label %{el}", c.v));
                self.start_block(&th);
                let x = self.expr(t)?;
                let xb = self.cur_block.clone();
                self.line(format!("br label %{end}"));
                self.start_block(&el);
                let y = self.expr(f)?;
                let yb = self.cur_block.clone();
                self.line(format!("br label %{end}"));
                self.start_block(&end);
                let ty = x.ty.clone();
                self.assign(
                    &ty,
                    format!("phi {ty} [ {}, %{xb} ], [ {}, %{yb} ]", x.v, y.v),
                )
            }
            Expr::Reinterpret { dtype, value } => {
                let from = value.dtype();
                let x = self.expr(value)?;
                let m = self.reg_to_mem(from, x);
                let (fmt_, tmt) = (mem_ty(from), mem_ty(*dtype));
                let b = if fmt_ == tmt {
                    Val::new(tmt, m.v)
                } else {
                    self.assign(&tmt, format!("bitcast {} to {tmt}", m.typed()))
                };
                self.mem_to_reg(*dtype, b)
            }
            Expr::CallExtern {
                dtype,
                symbol,
                args,
            } => {
                let vals = args.iter().map(|a| self.expr(a)).collect::<R<Vec<_>>>()?;
                let c_ty = |t: DataType| -> R<String> {
                    let ext = match t.code {
                        TypeCode::Bool => "zeroext ",
                        TypeCode::Int if t.bits < 32 => "signext ",
                        TypeCode::UInt if t.bits < 32 => "zeroext ",
                        TypeCode::Float if t.bits >= 32 => "",
                        TypeCode::Int | TypeCode::UInt => "",
                        _ => {
                            return Err(unsupported(format!(
                                "call_extern `{symbol}`: {t} is not a C scalar type"
                            )))
                        }
                    };
                    Ok(format!("{ext}{}", reg_ty(t)))
                };
                let rt = reg_ty(*dtype);
                let ret = c_ty(*dtype)?;
                let mut params = Vec::new();
                let mut call_args = Vec::new();
                for (a, v) in args.iter().zip(&vals) {
                    let pt = c_ty(a.dtype())?;
                    call_args.push(format!("{pt} {}", v.v));
                    params.push(pt);
                }
                let decl = format!("declare {ret} @{symbol}({})", params.join(", "));
                let prefix = format!(" @{symbol}(");
                if let Some(other) = self
                    .m
                    .declares
                    .iter()
                    .find(|d| d.contains(&prefix) && **d != decl)
                {
                    return Err(unsupported(format!(
                        "call_extern `{symbol}` is declared twice with different signatures: `{other}` and `{decl}`"
                    )));
                }
                self.m.declares.insert(decl);
                self.assign(
                    &rt,
                    format!("call {ret} @{symbol}({})", call_args.join(", ")),
                )
            }
        })
    }

    /// `if cond { then } else { other }` with blocks named `<prefix>then<k>`..., each arm
    /// emitted by `arm` (scalar or vector statements).
    fn if_then_else(
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

    fn restore(&mut self, id: VarId, old: Option<Val>) {
        match old {
            Some(v) => {
                self.vars.insert(id, v);
            }
            None => {
                self.vars.remove(&id);
            }
        }
    }

    fn access_groups(&self) -> String {
        match self.groups.len() {
            0 => String::new(),
            1 => format!(", !llvm.access.group {}", self.groups[0]),
            _ => format!(", !llvm.access.group !{{{}}}", self.groups.join(", ")),
        }
    }

    /// Rounds a bf16 value held in `float` to bf16 precision (nearest, ties to even; NaN kept).
    fn round_bf16(&mut self, x: Val) -> Val {
        let bits = self.assign("i32", format!("bitcast float {} to i32", x.v));
        let lsb0 = self.assign("i32", format!("lshr i32 {}, 16", bits.v));
        let lsb = self.assign("i32", format!("and i32 {}, 1", lsb0.v));
        let bias = self.assign("i32", format!("add i32 {}, 32767", lsb.v));
        let sum = self.assign("i32", format!("add i32 {}, {}", bits.v, bias.v));
        let r = self.assign("i32", format!("and i32 {}, -65536", sum.v));
        let nan = self.assign("i1", format!("fcmp uno float {}, 0.0", x.v));
        let q = self.assign("i32", format!("or i32 {}, 4194304", bits.v));
        let qn = self.assign("i32", format!("and i32 {}, -65536", q.v));
        let sel = self.assign(
            "i32",
            format!("select i1 {}, i32 {}, i32 {}", nan.v, qn.v, r.v),
        );
        self.assign("float", format!("bitcast i32 {} to float", sel.v))
    }

    fn mem_to_reg(&mut self, t: DataType, raw: Val) -> Val {
        match t.code {
            TypeCode::Bool => self.assign("i1", format!("icmp ne i8 {}, 0", raw.v)),
            TypeCode::BFloat => {
                let w = self.assign("i32", format!("zext i16 {} to i32", raw.v));
                let s = self.assign("i32", format!("shl i32 {}, 16", w.v));
                self.assign("float", format!("bitcast i32 {} to float", s.v))
            }
            _ => raw,
        }
    }

    fn reg_to_mem(&mut self, t: DataType, v: Val) -> Val {
        match t.code {
            TypeCode::Bool => self.assign("i8", format!("zext i1 {} to i8", v.v)),
            TypeCode::BFloat => {
                let r = self.round_bf16(v);
                let b = self.assign("i32", format!("bitcast float {} to i32", r.v));
                let s = self.assign("i32", format!("lshr i32 {}, 16", b.v));
                self.assign("i16", format!("trunc i32 {} to i16", s.v))
            }
            _ => v,
        }
    }

    /// The element address `buffer[indices]` as a typed pointer.
    fn address(&mut self, buffer: &Buffer, indices: &[Expr]) -> R<String> {
        let base =
            self.bufs.get(&buffer.data.id).cloned().ok_or_else(|| {
                unsupported(format!("buffer `{}` is not bound here", buffer.name))
            })?;
        if indices.len() != buffer.shape.len() {
            return Err(unsupported(format!(
                "buffer `{}` has {} dimensions, indexed with {}",
                buffer.name,
                buffer.shape.len(),
                indices.len()
            )));
        }
        let mut off: Option<Val> = None;
        match &buffer.strides {
            Some(strides) => {
                for (i, s) in indices.iter().zip(strides) {
                    let iv = self.index64(i)?;
                    let sv = self.index64(s)?;
                    let p = self.assign("i64", format!("mul nsw i64 {}, {}", iv.v, sv.v));
                    off = Some(match off {
                        None => p,
                        Some(o) => self.assign("i64", format!("add nsw i64 {}, {}", o.v, p.v)),
                    });
                }
            }
            None => {
                // Dimensions whose indices split one value are merged (`codegen::index`).
                for dim in crate::codegen::index::contiguous_dims(indices, &buffer.shape) {
                    let iv = self.index64(dim.index)?;
                    off = Some(match off {
                        None => iv,
                        Some(mut o) => {
                            for e in &dim.extents {
                                let ext = self.index64(e)?;
                                o = self.assign("i64", format!("mul nsw i64 {}, {}", o.v, ext.v));
                            }
                            self.assign("i64", format!("add nsw i64 {}, {}", o.v, iv.v))
                        }
                    });
                }
            }
        }
        let off = off.unwrap_or_else(|| Val::new("i64", "0"));
        let mt = mem_ty(buffer.dtype);
        let p = self.assign(
            &Self::ptr(&mt),
            format!(
                "getelementptr inbounds {mt}, {}, i64 {}",
                base.typed(),
                off.v
            ),
        );
        Ok(p.v)
    }

    /// An index expression widened to i64.
    pub fn index64(&mut self, e: &Expr) -> R<Val> {
        let t = e.dtype();
        let v = self.expr(e)?;
        Ok(self.widen64(t, v))
    }

    pub fn widen64(&mut self, t: DataType, v: Val) -> Val {
        if v.ty == "i64" {
            return v;
        }
        let op = if is_signed(t) { "sext" } else { "zext" };
        self.assign("i64", format!("{op} {} to i64", v.typed()))
    }

    fn binary(&mut self, op: BinOp, t: DataType, x: Val, y: Val, bexpr: &Expr) -> R<Val> {
        let ty = x.ty.clone();
        let fm = self.fm();
        if op.is_comparison() {
            let pred = if t.code == TypeCode::Float || t.code == TypeCode::BFloat {
                let p = match op {
                    BinOp::Eq => "oeq",
                    BinOp::Ne => "une",
                    BinOp::Lt => "olt",
                    BinOp::Le => "ole",
                    BinOp::Gt => "ogt",
                    _ => "oge",
                };
                return Ok(self.assign("i1", format!("fcmp {fm}{p} {}, {}", x.typed(), y.v)));
            } else {
                let s = is_signed(t);
                match op {
                    BinOp::Eq => "eq",
                    BinOp::Ne => "ne",
                    BinOp::Lt if s => "slt",
                    BinOp::Le if s => "sle",
                    BinOp::Gt if s => "sgt",
                    BinOp::Ge if s => "sge",
                    BinOp::Lt => "ult",
                    BinOp::Le => "ule",
                    BinOp::Gt => "ugt",
                    _ => "uge",
                }
            };
            return Ok(self.assign("i1", format!("icmp {pred} {}, {}", x.typed(), y.v)));
        }
        if t.code == TypeCode::Bool {
            let o = match op {
                BinOp::And | BinOp::Mul | BinOp::Min => "and",
                BinOp::Or | BinOp::Max => "or",
                _ => "xor",
            };
            return Ok(self.assign("i1", format!("{o} i1 {}, {}", x.v, y.v)));
        }
        if t.code == TypeCode::Float || t.code == TypeCode::BFloat {
            let r = match op {
                BinOp::Add => self.assign(&ty, format!("fadd {fm}{}, {}", x.typed(), y.v)),
                BinOp::Sub => self.assign(&ty, format!("fsub {fm}{}, {}", x.typed(), y.v)),
                BinOp::Mul => self.assign(&ty, format!("fmul {fm}{}, {}", x.typed(), y.v)),
                BinOp::Div => self.assign(&ty, format!("fdiv {fm}{}, {}", x.typed(), y.v)),
                BinOp::Mod => self.assign(&ty, format!("frem {fm}{}, {}", x.typed(), y.v)),
                BinOp::FloorDiv => {
                    let q = self.assign(&ty, format!("fdiv {fm}{}, {}", x.typed(), y.v));
                    self.call_intr("floor", &ty, &[q])
                }
                BinOp::FloorMod => {
                    let q = self.assign(&ty, format!("fdiv {fm}{}, {}", x.typed(), y.v));
                    let f = self.call_intr("floor", &ty, &[q]);
                    let m = self.assign(&ty, format!("fmul {fm}{}, {}", f.typed(), y.v));
                    self.assign(&ty, format!("fsub {fm}{}, {}", x.typed(), m.v))
                }
                BinOp::Min | BinOp::Max => self.fminmax(op == BinOp::Min, &ty, x, y),
                _ => unreachable!("comparisons and logic handled above"),
            };
            return Ok(if t.code == TypeCode::BFloat {
                self.round_bf16(r)
            } else {
                r
            });
        }
        // Integers.
        let s = is_signed(t);
        Ok(match op {
            BinOp::Add => self.assign(&ty, format!("add {}, {}", x.typed(), y.v)),
            BinOp::Sub => self.assign(&ty, format!("sub {}, {}", x.typed(), y.v)),
            BinOp::Mul => self.assign(&ty, format!("mul {}, {}", x.typed(), y.v)),
            BinOp::Min | BinOp::Max => {
                let p = match (op == BinOp::Min, s) {
                    (true, true) => "slt",
                    (true, false) => "ult",
                    (false, true) => "sgt",
                    (false, false) => "ugt",
                };
                let c = self.assign("i1", format!("icmp {p} {}, {}", x.typed(), y.v));
                self.assign(
                    &ty,
                    format!("select i1 {}, {}, {}", c.v, x.typed(), y.typed()),
                )
            }
            BinOp::Div | BinOp::Mod | BinOp::FloorDiv | BinOp::FloorMod => {
                self.int_div(op, t, x, y, bexpr)?
            }
            BinOp::BitAnd => self.assign(&ty, format!("and {}, {}", x.typed(), y.v)),
            BinOp::BitOr => self.assign(&ty, format!("or {}, {}", x.typed(), y.v)),
            BinOp::BitXor => self.assign(&ty, format!("xor {}, {}", x.typed(), y.v)),
            BinOp::Shl | BinOp::Shr => {
                // The amount is taken modulo the width: never poison.
                let k = self.assign(&ty, format!("and {}, {}", y.typed(), t.bits - 1));
                let o = match (op, s) {
                    (BinOp::Shl, _) => "shl",
                    (_, true) => "ashr",
                    _ => "lshr",
                };
                self.assign(&ty, format!("{o} {}, {}", x.typed(), k.v))
            }
            _ => unreachable!("logic ops on integers are rejected by the verifier"),
        })
    }

    fn int_div(&mut self, op: BinOp, t: DataType, x: Val, y: Val, bexpr: &Expr) -> R<Val> {
        let ty = x.ty.clone();
        let s = is_signed(t);
        let const_b = bexpr.as_int();
        if const_b != Some(0) && const_b.is_none() {
            let nz = self.assign("i1", format!("icmp ne {}, 0", y.typed()));
            let msg = format!(
                "integer division by zero ({t} `{}`) in `{}`",
                op.name(),
                self.fname
            );
            self.check(&nz.v, "RuntimeError", &msg);
        } else if const_b == Some(0) {
            let msg = format!(
                "integer division by zero ({t} `{}`) in `{}`",
                op.name(),
                self.fname
            );
            self.raise("RuntimeError", &msg);
            self.free_live();
            self.line("ret i32 -1");
            let dead = self.new_label("dead");
            self.start_block(&dead);
            return Ok(Val::new(ty, "0"));
        }
        if !s {
            let o = if matches!(op, BinOp::Div | BinOp::FloorDiv) {
                "udiv"
            } else {
                "urem"
            };
            return Ok(self.assign(&ty, format!("{o} {}, {}", x.typed(), y.v)));
        }
        // Signed: INT_MIN / -1 wraps (quotient INT_MIN, remainder 0) instead of being UB.
        let (yd, m1) = if const_b.is_some() {
            (y.clone(), None)
        } else {
            let m1 = self.assign("i1", format!("icmp eq {}, -1", y.typed()));
            let yd = self.assign(&ty, format!("select i1 {}, {ty} 1, {}", m1.v, y.typed()));
            (yd, Some(m1))
        };
        let q0 = self.assign(&ty, format!("sdiv {}, {}", x.typed(), yd.v));
        let r0 = self.assign(&ty, format!("srem {}, {}", x.typed(), yd.v));
        let (q, r) = match &m1 {
            Some(m1) => {
                let neg = self.assign(&ty, format!("sub {ty} 0, {}", x.v));
                let q = self.assign(
                    &ty,
                    format!("select i1 {}, {ty} {}, {}", m1.v, neg.v, q0.typed()),
                );
                let r = self.assign(&ty, format!("select i1 {}, {ty} 0, {}", m1.v, r0.typed()));
                (q, r)
            }
            None => (q0, r0),
        };
        Ok(match op {
            BinOp::Div => q,
            BinOp::Mod => r,
            _ => {
                // Floor: adjust when the remainder is non-zero and its sign differs from b's.
                let rnz = self.assign("i1", format!("icmp ne {}, 0", r.typed()));
                let rneg = self.assign("i1", format!("icmp slt {}, 0", r.typed()));
                let bneg = self.assign("i1", format!("icmp slt {}, 0", y.typed()));
                let diff = self.assign("i1", format!("xor i1 {}, {}", rneg.v, bneg.v));
                let adj = self.assign("i1", format!("and i1 {}, {}", rnz.v, diff.v));
                if op == BinOp::FloorDiv {
                    let qm = self.assign(&ty, format!("sub {}, 1", q.typed()));
                    self.assign(
                        &ty,
                        format!("select i1 {}, {}, {}", adj.v, qm.typed(), q.typed()),
                    )
                } else {
                    let rb = self.assign(&ty, format!("add {}, {}", r.typed(), y.v));
                    self.assign(
                        &ty,
                        format!("select i1 {}, {}, {}", adj.v, rb.typed(), r.typed()),
                    )
                }
            }
        })
    }

    /// `min(x, c)` / `max(x, c)` for a constant `c` (value `cv`, not NaN) with the IR's
    /// semantics in one compare and one select, which vectorizes and keeps a reduction's
    /// dependency chain short (relu and clip are `max(x, 0)`, `min(max(x, lo), hi)`): a NaN `x`
    /// is returned; between equal operands only `max(-0, +0)` and `min(+0, -0)` differ from
    /// "keep `x`", so `c = +0` for max and `c = -0` for min take the other ordered test.
    /// `bt` is the predicate type (`i1` or `<n x i1>`).
    fn fminmax_const(&mut self, min: bool, bt: &str, x: Val, c: Val, cv: f64) -> Val {
        let zero_sign_matters = cv == 0.0 && (cv.is_sign_negative() == min);
        // (predicate, x when true) — x is kept when the predicate holds.
        let pred = match (min, zero_sign_matters) {
            (false, true) => "ugt",  // max(x, +0): x if x > 0 or NaN, else +0
            (true, true) => "ult",   // min(x, -0): x if x < 0 or NaN, else -0
            (false, false) => "uge", // max(x, c): x unless x < c
            (true, false) => "ule",  // min(x, c): x unless x > c
        };
        let k = self.assign(bt, format!("fcmp {pred} {}, {}", x.typed(), c.v));
        let ty = x.ty.clone();
        self.assign(
            &ty,
            format!("select {bt} {}, {}, {}", k.v, x.typed(), c.typed()),
        )
    }

    /// IEEE minimum/maximum: NaN if either is NaN, -0 below +0.
    fn fminmax(&mut self, min: bool, ty: &str, x: Val, y: Val) -> Val {
        let fm = self.fm();
        let p = if min { "olt" } else { "ogt" };
        let c = self.assign("i1", format!("fcmp {fm}{p} {}, {}", x.typed(), y.v));
        if self.opts.fast_math == "fast"
            || (self.opts.fast_math.contains("nnan") && self.opts.fast_math.contains("nsz"))
        {
            // No NaNs and no signed zeros: a compare and select (a min/max reduction for LLVM).
            return self.assign(
                ty,
                format!("select {fm}i1 {}, {}, {}", c.v, x.typed(), y.typed()),
            );
        }
        let eq = self.assign("i1", format!("fcmp oeq {}, {}", x.typed(), y.v));
        let ibits = match ty {
            "half" => "i16",
            "float" => "i32",
            _ => "i64",
        };
        let xb = self.assign(ibits, format!("bitcast {} to {ibits}", x.typed()));
        let sgn = self.assign("i1", format!("icmp slt {ibits} {}, 0", xb.v));
        let want = if min {
            sgn.v.clone()
        } else {
            self.assign("i1", format!("xor i1 {}, true", sgn.v)).v
        };
        let tie = self.assign("i1", format!("and i1 {}, {}", eq.v, want));
        let pick = self.assign("i1", format!("or i1 {}, {}", c.v, tie.v));
        let r = self.assign(
            ty,
            format!("select i1 {}, {}, {}", pick.v, x.typed(), y.typed()),
        );
        let nan = self.assign("i1", format!("fcmp uno {}, {}", x.typed(), y.v));
        let qnan = if ty == "half" {
            "0xH7E00"
        } else {
            "0x7FF8000000000000"
        };
        self.assign(
            ty,
            format!("select i1 {}, {ty} {qnan}, {}", nan.v, r.typed()),
        )
    }

    fn intr_suffix(ty: &str) -> &'static str {
        match ty {
            "half" => "f16",
            "float" => "f32",
            _ => "f64",
        }
    }

    /// Calls `llvm.<name>.<fN>`.
    fn call_intr(&mut self, name: &str, ty: &str, args: &[Val]) -> Val {
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
    fn call_libm(&mut self, name: &str, ty: &str, args: &[Val]) -> Val {
        let cty = if ty == "half" { "float" } else { ty }.to_owned();
        let mut xs = Vec::new();
        for x in args {
            xs.push(if ty == "half" {
                self.assign("float", format!("fpext half {} to float", x.v))
            } else {
                x.clone()
            });
        }
        let fname = if cty == "float" {
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

    fn intrinsic(&mut self, op: Intrinsic, t: DataType, a: &[Val]) -> R<Val> {
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
            Intrinsic::Exp | Intrinsic::FastExp => self.call_intr("exp", &ty, &[x]),
            Intrinsic::Log => self.call_intr("log", &ty, &[x]),
            Intrinsic::Sqrt => self.call_intr("sqrt", &ty, &[x]),
            Intrinsic::Rsqrt => {
                let s = self.call_intr("sqrt", &ty, &[x]);
                self.assign(&ty, format!("fdiv {fm}{ty} {one}, {}", s.v))
            }
            Intrinsic::Tanh => self.call_libm("tanh", &ty, &[x]),
            Intrinsic::Erf => self.call_libm("erf", &ty, &[x]),
            Intrinsic::Sigmoid => {
                let n = self.assign(&ty, format!("fneg {fm}{}", x.typed()));
                let e = self.call_intr("exp", &ty, &[n]);
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

    /// A saturating float→int conversion (NaN → 0, out of range → the limit) as a clamp, a
    /// plain conversion and two selects, for `float`/`double` to a scalar integer, else `None`.
    ///
    /// Same results as `llvm.fpto[su]i.sat`, which LLVM 14's loop vectorizer does not widen
    /// (a loop of it stays scalar: TOPI's `cast` ran at 2.4x TVM's time). The clamp
    /// `min(max(x, lo), hi)` keeps the conversion in range: `lo` is the type's minimum (exact in
    /// `float` and `double`), `hi` the largest float not above its maximum. When the maximum
    /// itself is not a float, every `x >= 2^k` (the maximum + 1) selects the maximum. NaN, which
    /// `maxnum` turns into `lo`, selects 0. No fast-math flags: they could drop the NaN test.
    fn saturating_to_int(&mut self, ft: &str, tt: &str, to: DataType, x: &Val) -> Option<Val> {
        let p = match ft {
            "float" => 24,
            "double" => 53,
            _ => return None,
        };
        if to.lanes != 1 || !tt.starts_with('i') || to.bits > 64 || to.bits < 8 {
            return None;
        }
        let signed = is_signed(to);
        let k = u32::from(to.bits) - u32::from(signed); // 2^k = the maximum + 1
        let lo = if signed { -(2f64.powi(k as i32)) } else { 0.0 };
        let two_k = 2f64.powi(k as i32);
        // The largest float below 2^k: 2^k - 1 when exact, else 2^k - 2^(k - p).
        let (hi, exact) = if k <= p {
            (two_k - 1.0, true)
        } else {
            (two_k - 2f64.powi(k as i32 - p as i32), false)
        };
        let fdt = if ft == "float" {
            DataType::f32()
        } else {
            DataType::f64()
        };
        let sfx = Self::intr_suffix(ft);
        for f in ["maxnum", "minnum"] {
            self.m
                .declares
                .insert(format!("declare {ft} @llvm.{f}.{sfx}({ft}, {ft})"));
        }
        let a = self.assign(
            ft,
            format!(
                "call {ft} @llvm.maxnum.{sfx}({}, {ft} {})",
                x.typed(),
                float_const(fdt, lo)
            ),
        );
        let b = self.assign(
            ft,
            format!(
                "call {ft} @llvm.minnum.{sfx}({}, {ft} {})",
                a.typed(),
                float_const(fdt, hi)
            ),
        );
        let op = if signed { "fptosi" } else { "fptoui" };
        let mut r = self.assign(tt, format!("{op} {} to {tt}", b.typed()));
        if !exact {
            let max = if signed {
                ((1u64 << k) - 1).to_string()
            } else {
                // The all-ones pattern, as LLVM reads an unsigned maximum.
                "-1".to_string()
            };
            let big = self.assign(
                "i1",
                format!("fcmp oge {}, {}", x.typed(), float_const(fdt, two_k)),
            );
            r = self.assign(
                tt,
                format!("select i1 {}, {tt} {max}, {}", big.v, r.typed()),
            );
        }
        let nan = self.assign("i1", format!("fcmp uno {}, 0.0", x.typed()));
        Some(self.assign(tt, format!("select i1 {}, {tt} 0, {}", nan.v, r.typed())))
    }

    fn cast(&mut self, from: DataType, to: DataType, x: Val) -> Val {
        let (ft, tt) = (reg_ty(from), reg_ty(to));
        let from_float = matches!(from.code, TypeCode::Float | TypeCode::BFloat);
        let to_float = matches!(to.code, TypeCode::Float | TypeCode::BFloat);
        let v = if to.code == TypeCode::Bool {
            if from.code == TypeCode::Bool {
                return x;
            }
            if from_float {
                return self.assign("i1", format!("fcmp une {}, 0.0", x.typed()));
            }
            return self.assign("i1", format!("icmp ne {}, 0", x.typed()));
        } else if from_float && to_float {
            let fw = float_width(&ft);
            let tw = float_width(&tt);
            if fw < tw {
                self.assign(&tt, format!("fpext {} to {tt}", x.typed()))
            } else if fw > tw {
                self.assign(&tt, format!("fptrunc {} to {tt}", x.typed()))
            } else {
                x
            }
        } else if from_float {
            if let Some(v) = self.saturating_to_int(&ft, &tt, to, &x) {
                return v;
            }
            let sat = if is_signed(to) { "fptosi" } else { "fptoui" };
            let name = format!("llvm.{sat}.sat.{tt}.{}", Self::intr_suffix(&ft));
            self.m
                .declares
                .insert(format!("declare {tt} @{name}({ft})"));
            self.assign(&tt, format!("call {tt} @{name}({})", x.typed()))
        } else if to_float {
            let op = if is_signed(from) { "sitofp" } else { "uitofp" };
            self.assign(&tt, format!("{op} {} to {tt}", x.typed()))
        } else {
            let fb = if from.code == TypeCode::Bool {
                1
            } else {
                u32::from(from.bits)
            };
            let tb = u32::from(to.bits);
            if fb < tb {
                let op = if is_signed(from) { "sext" } else { "zext" };
                self.assign(&tt, format!("{op} {} to {tt}", x.typed()))
            } else if fb > tb {
                self.assign(&tt, format!("trunc {} to {tt}", x.typed()))
            } else {
                Val::new(tt, x.v)
            }
        };
        if to.code == TypeCode::BFloat {
            self.round_bf16(v)
        } else {
            v
        }
    }

    // ----- statements -------------------------------------------------------------------------

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
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => match kind {
                ForKind::ThreadBinding(_) => self.launch_kernel(s)?,
                ForKind::Parallel => self.parallel_for(var, min, extent, body)?,
                ForKind::Vectorized if self.vector_for(var, min, extent, body)? => {}
                ForKind::Unrolled if self.unrolled_for(var, min, extent, body)? => {}
                _ => self.serial_for(var, min, extent, *kind, body)?,
            },
        }
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
            ForKind::Unrolled => {
                let full = self.md(|n| format!("!{n} = !{{!\"llvm.loop.unroll.full\"}}"));
                let id = self.md(|n| format!("!{n} = distinct !{{!{n}, !{full}}}"));
                format!(", !llvm.loop !{id}")
            }
            _ => String::new(),
        }
    }

    /// `!llvm.loop` metadata that keeps a loop as it is: not vectorized, interleaved or unrolled.
    fn no_unroll_metadata(&mut self) -> String {
        let w = self.md(|n| format!("!{n} = !{{!\"llvm.loop.vectorize.width\", i32 1}}"));
        let il = self.md(|n| format!("!{n} = !{{!\"llvm.loop.interleave.count\", i32 1}}"));
        let un = self.md(|n| format!("!{n} = !{{!\"llvm.loop.unroll.disable\"}}"));
        let id = self.md(|n| format!("!{n} = distinct !{{!{n}, !{w}, !{il}, !{un}}}"));
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
    fn counted_loop(&mut self, var: &Var, lo: Val, end: Val, kind: ForKind, body: &Stmt) -> R<()> {
        let extent = self.next_extent.take();
        if matches!(kind, ForKind::Serial | ForKind::Parallel) {
            if let Some((buffer, indices)) = self.stream_store(var, body, extent) {
                return self.stream_loop(var, lo, end, body, &buffer, &indices);
            }
        }
        self.plain_loop(var, lo, end, kind, body)
    }

    /// `for var in [lo, end)`, as written.
    fn plain_loop(&mut self, var: &Var, lo: Val, end: Val, kind: ForKind, body: &Stmt) -> R<()> {
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
        let md = self.loop_metadata(kind, group.as_deref());
        self.line(format!("br label %{head}{md}"));
        self.start_block(&exit);
        Ok(())
    }

    fn allocate(&mut self, buffer: &Buffer, body: &Stmt) -> R<()> {
        let mt = mem_ty(buffer.dtype);
        let elem = buffer.dtype.bytes().max(1) as i64;
        let const_bytes = buffer.const_numel().and_then(|n| n.checked_mul(elem));
        let on_stack = buffer.scope == StorageScope::Local
            && matches!(const_bytes, Some(b) if b <= MAX_STACK_BYTES);
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

    fn free_workspace(&mut self, p: &str) {
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

    /// Host code of a device target never touches device memory.
    fn host_access(&self, buffer: &Buffer) -> R<()> {
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
    fn launch_kernel(&mut self, nest: &Stmt) -> R<()> {
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

    fn parallel_for(&mut self, var: &Var, min: &Expr, extent: &Expr, body: &Stmt) -> R<()> {
        self.m.uses_parallel = true;
        let lo = self.expr(min)?;
        let n = self.expr(extent)?;
        let lo64 = self.widen64(var.dtype, lo);
        let n64 = self.widen64(var.dtype, n);
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
            for (k, (id, v, is_buf)) in caps.iter().enumerate() {
                let val = load_field(&mut sub, k + 2, &v.ty);
                if *is_buf {
                    sub.bufs.insert(*id, val);
                } else {
                    sub.vars.insert(*id, val);
                }
            }
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
            let ty = reg_ty(var.dtype);
            let (blv, elv) = if ty == "i64" {
                (bl, el)
            } else {
                let a = sub.assign(&ty, format!("trunc i64 {} to {ty}", bl.v));
                let b = sub.assign(&ty, format!("trunc i64 {} to {ty}", el.v));
                (a, b)
            };
            sub.counted_loop(var, blv, elv, ForKind::Serial, body)?;
            sub.line("ret i32 0");
            sub.finish()
        };
        let attrs = fn_attrs(self.opts);
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

fn float_width(ty: &str) -> u32 {
    match ty {
        "half" => 16,
        "float" => 32,
        _ => 64,
    }
}

/// The attribute group text of every generated function.
pub(crate) fn fn_attrs(o: &EmitOptions) -> String {
    let mut a = format!("nounwind \"target-cpu\"=\"{}\"", o.cpu);
    if !o.features.is_empty() {
        let _ = write!(a, " \"target-features\"=\"{}\"", o.features);
    }
    // The backend's function-wide assumptions, each only when its flag is on (`contract`
    // alone, the default, changes none of them).
    let flags: Vec<&str> = o.fast_math.split_whitespace().collect();
    let all = flags.contains(&"fast");
    for (flag, attr) in [
        ("nnan", "no-nans-fp-math"),
        ("ninf", "no-infs-fp-math"),
        ("nsz", "no-signed-zeros-fp-math"),
    ] {
        if all || flags.contains(&flag) {
            let _ = write!(a, " \"{attr}\"=\"true\"");
        }
    }
    if all {
        a.push_str(" \"unsafe-fp-math\"=\"true\"");
    }
    a
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
        Stmt::Seq(v) => v.iter().for_each(|s| collect_vars(s, out)),
        Stmt::Evaluate(e) | Stmt::Return(e) => expr(e, out),
        Stmt::Barrier => {}
        Stmt::Assert { cond, .. } => expr(cond, out),
    }
}

// ----- emitter-side unrolling and vectorization ---------------------------------------------------
//
// `unrolled` loops with a small constant extent are unrolled here, so every index they feed is a
// constant before LLVM runs (local arrays indexed by them become registers in the first SROA).
// `vectorized` loops with a constant extent whose bodies are stores of lane-wise expressions are
// emitted as straight-line vector code, as TVM does with `Ramp`/`Broadcast`: contiguous accesses
// become vector loads and stores, lane-invariant subexpressions are computed once and broadcast,
// float arithmetic, `fma`, `min`/`max`, `sqrt` and (with fast math) `exp` are vector instructions,
// and anything else is computed lane by lane. Other vectorized loops (reductions into a scalar,
// nested loops) keep the loop form with `llvm.loop.vectorize.enable`, for LLVM's vectorizer.

/// The most iterations unrolled by the emitter (larger loops get `llvm.loop.unroll.full`).
const MAX_EMIT_UNROLL: i64 = 64;
/// The most lanes of an emitter-vectorized loop.
const MAX_EMIT_LANES: i64 = 64;

/// A value in a vectorized loop body: the same in every lane, or one per lane.
#[derive(Clone, Debug)]
enum Lanes {
    Uniform(Val),
    Vector(Val),
}

fn expr_uses(e: &Expr, id: VarId) -> bool {
    let mut s = BTreeSet::new();
    collect_vars(&Stmt::Evaluate(e.clone()), &mut s);
    s.contains(&id)
}

/// The coefficient of `id` in the integer expression `e`, if `e` is affine in it.
fn lane_coef(e: &Expr, id: VarId) -> Option<i64> {
    if !expr_uses(e, id) {
        return Some(0);
    }
    match e {
        Expr::Var(v) if v.id == id => Some(1),
        Expr::Binary { op, a, b } => {
            let (ca, cb) = (lane_coef(a, id)?, lane_coef(b, id)?);
            match op {
                BinOp::Add => Some(ca + cb),
                BinOp::Sub => Some(ca - cb),
                BinOp::Mul if cb == 0 => Some(ca * b.as_int()?),
                BinOp::Mul if ca == 0 => Some(cb * a.as_int()?),
                _ => None,
            }
        }
        Expr::Cast { dtype, value }
            if matches!(dtype.code, TypeCode::Int | TypeCode::UInt)
                && matches!(value.dtype().code, TypeCode::Int | TypeCode::UInt)
                && dtype.bits >= value.dtype().bits =>
        {
            lane_coef(value, id)
        }
        _ => None,
    }
}

fn vec_dtype_ok(t: DataType) -> bool {
    matches!(
        (t.code, t.bits),
        (TypeCode::Float, 32) | (TypeCode::Float, 64)
    )
}

/// Whether the emitter can vectorize a loop over `id` with body `s`.
fn vec_body_ok(s: &Stmt, id: VarId) -> bool {
    fn loads_ok(e: &Expr) -> bool {
        match e {
            Expr::Load { buffer, indices } => {
                vec_dtype_ok(buffer.dtype) && indices.iter().all(loads_ok)
            }
            Expr::Binary { a, b, .. } => loads_ok(a) && loads_ok(b),
            Expr::Not(a) | Expr::Cast { value: a, .. } => loads_ok(a),
            Expr::Select { cond, t, f } => loads_ok(cond) && loads_ok(t) && loads_ok(f),
            Expr::Let { value, body, .. } => loads_ok(value) && loads_ok(body),
            Expr::Call { args, .. } => args.iter().all(loads_ok),
            // Branches and external calls stay in scalar loops.
            Expr::IfThenElse { .. } | Expr::CallExtern { .. } => false,
            Expr::Reinterpret { value, .. } => loads_ok(value),
            _ => true,
        }
    }
    match s {
        Stmt::Seq(v) => v.iter().all(|s| vec_body_ok(s, id)),
        Stmt::Store {
            buffer,
            indices,
            value,
        } => {
            let idx_dep = indices.iter().any(|i| expr_uses(i, id));
            // A store to one place from every lane is a reduction: not lane-wise.
            vec_dtype_ok(buffer.dtype)
                && (idx_dep || !expr_uses(value, id))
                && loads_ok(value)
                && indices.iter().all(loads_ok)
        }
        Stmt::Let { value, body, .. } => !expr_uses(value, id) && vec_body_ok(body, id),
        Stmt::IfThenElse {
            cond,
            then_case,
            else_case,
        } => {
            !expr_uses(cond, id)
                && vec_body_ok(then_case, id)
                && else_case.as_ref().is_none_or(|e| vec_body_ok(e, id))
        }
        _ => false,
    }
}

impl Emitter<'_> {
    /// Unrolls `for var in [min, min + extent)` when the extent is a small constant.
    fn unrolled_for(&mut self, var: &Var, min: &Expr, extent: &Expr, body: &Stmt) -> R<bool> {
        let Some(n) = extent.as_int() else {
            return Ok(false);
        };
        if n > MAX_EMIT_UNROLL {
            return Ok(false);
        }
        let ty = reg_ty(var.dtype);
        let lo = self.expr(min)?;
        for k in 0..n.max(0) {
            let i = self.assign(&ty, format!("add {}, {k}", lo.typed()));
            let old = self.vars.insert(var.id, i);
            let r = self.stmt(body);
            self.restore(var.id, old);
            r?;
        }
        Ok(true)
    }

    /// Emits a vectorized loop as vector code; `false` when its body is not lane-wise.
    fn vector_for(&mut self, var: &Var, min: &Expr, extent: &Expr, body: &Stmt) -> R<bool> {
        let Some(n) = extent.as_int() else {
            return Ok(false);
        };
        if !(2..=MAX_EMIT_LANES).contains(&n) || !vec_body_ok(body, var.id) {
            return Ok(false);
        }
        let lo = self.expr(min)?;
        self.vstmt(var, &lo, n, body)?;
        Ok(true)
    }

    fn vty(n: i64, ty: &str) -> String {
        format!("<{n} x {ty}>")
    }

    /// A constant vector with every lane `c` (an LLVM constant spelling).
    fn splat_const(n: i64, ty: &str, c: &str) -> String {
        let one = format!("{ty} {c}");
        format!("<{}>", vec![one; n as usize].join(", "))
    }

    fn broadcast(&mut self, n: i64, x: &Val) -> Val {
        let vt = Self::vty(n, &x.ty);
        let a = self.assign(
            &vt,
            format!("insertelement {vt} undef, {}, i32 0", x.typed()),
        );
        self.assign(
            &vt,
            format!(
                "shufflevector {vt} {}, {vt} undef, <{n} x i32> zeroinitializer",
                a.v
            ),
        )
    }

    fn as_vector(&mut self, n: i64, x: Lanes) -> Val {
        match x {
            Lanes::Vector(v) => v,
            Lanes::Uniform(u) => self.broadcast(n, &u),
        }
    }

    /// The loop variable's value in lane `l`.
    fn lane_value(&mut self, var: &Var, lo: &Val, l: i64) -> Val {
        let ty = reg_ty(var.dtype);
        self.assign(&ty, format!("add {}, {l}", lo.typed()))
    }

    /// Computes `e` lane by lane and gathers the results into a vector.
    fn scalarize(&mut self, var: &Var, lo: &Val, n: i64, e: &Expr) -> R<Lanes> {
        let ty = reg_ty(e.dtype());
        let vt = Self::vty(n, &ty);
        let mut acc = Val::new(&vt, "undef");
        for l in 0..n {
            let i = self.lane_value(var, lo, l);
            let old = self.vars.insert(var.id, i);
            let x = self.expr(e);
            self.restore(var.id, old);
            let x = x?;
            acc = self.assign(
                &vt,
                format!("insertelement {}, {}, i32 {l}", acc.typed(), x.typed()),
            );
        }
        Ok(Lanes::Vector(acc))
    }

    /// The address of lane 0 of a contiguous access, or `None` when lanes are not adjacent.
    fn contiguous(
        &mut self,
        var: &Var,
        lo: &Val,
        buffer: &Buffer,
        indices: &[Expr],
    ) -> R<Option<String>> {
        if buffer.strides.is_some() || indices.is_empty() {
            return Ok(None);
        }
        let last = indices.len() - 1;
        for (d, i) in indices.iter().enumerate() {
            let want = if d == last { 1 } else { 0 };
            if lane_coef(i, var.id) != Some(want) {
                return Ok(None);
            }
        }
        let old = self.vars.insert(var.id, lo.clone());
        let a = self.address(buffer, indices);
        self.restore(var.id, old);
        Ok(Some(a?))
    }

    fn vexpr(&mut self, var: &Var, lo: &Val, n: i64, e: &Expr) -> R<Lanes> {
        if !expr_uses(e, var.id) {
            return Ok(Lanes::Uniform(self.expr(e)?));
        }
        let t = e.dtype();
        let fm = self.fm();
        match e {
            Expr::Load { buffer, indices } => {
                if let Some(addr) = self.contiguous(var, lo, buffer, indices)? {
                    let mt = mem_ty(buffer.dtype);
                    let vt = Self::vty(n, &mt);
                    let p =
                        self.assign(&format!("{vt}*"), format!("bitcast {mt}* {addr} to {vt}*"));
                    let align = buffer.dtype.bytes().max(1);
                    let v = self.assign(&vt, format!("load {vt}, {vt}* {}, align {align}", p.v));
                    return Ok(Lanes::Vector(v));
                }
                self.scalarize(var, lo, n, e)
            }
            Expr::Binary { op, a, b }
                if vec_dtype_ok(t)
                    && matches!(
                        op,
                        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Min | BinOp::Max
                    ) =>
            {
                if let Some((v, c, cv)) = minmax_by_constant(*op, a, b) {
                    let x = self.vexpr(var, lo, n, v)?;
                    let y = self.vexpr(var, lo, n, c)?;
                    let x = self.as_vector(n, x);
                    let y = self.as_vector(n, y);
                    let bt = format!("<{n} x i1>");
                    let r = self.fminmax_const(*op == BinOp::Min, &bt, x, y, cv);
                    return Ok(Lanes::Vector(r));
                }
                let x = self.vexpr(var, lo, n, a)?;
                let y = self.vexpr(var, lo, n, b)?;
                let x = self.as_vector(n, x);
                let y = self.as_vector(n, y);
                let vt = x.ty.clone();
                let v = match op {
                    BinOp::Add => self.assign(&vt, format!("fadd {fm}{}, {}", x.typed(), y.v)),
                    BinOp::Sub => self.assign(&vt, format!("fsub {fm}{}, {}", x.typed(), y.v)),
                    BinOp::Mul => self.assign(&vt, format!("fmul {fm}{}, {}", x.typed(), y.v)),
                    BinOp::Div => self.assign(&vt, format!("fdiv {fm}{}, {}", x.typed(), y.v)),
                    _ => self.vminmax(*op == BinOp::Min, n, &reg_ty(t), x, y),
                };
                Ok(Lanes::Vector(v))
            }
            Expr::Call { op, args }
                if vec_dtype_ok(t)
                    && (matches!(op, Intrinsic::Fma | Intrinsic::Sqrt | Intrinsic::Abs)
                        || (t == DataType::f32()
                            && (*op == Intrinsic::FastExp
                                || (*op == Intrinsic::Exp && self.fast_exp())))) =>
            {
                let mut vals = Vec::new();
                for a in args {
                    let x = self.vexpr(var, lo, n, a)?;
                    vals.push(self.as_vector(n, x));
                }
                let sty = reg_ty(t);
                let vt = Self::vty(n, &sty);
                let sfx = format!("v{n}{}", Self::intr_suffix(&sty));
                let v = match op {
                    Intrinsic::Exp | Intrinsic::FastExp => {
                        self.fast_exp_poly(&vt, &sty, n, vals[0].clone())
                    }
                    _ => {
                        let name = match op {
                            Intrinsic::Fma => "fma",
                            Intrinsic::Sqrt => "sqrt",
                            _ => "fabs",
                        };
                        let params = vec![vt.as_str(); vals.len()].join(", ");
                        self.m
                            .declares
                            .insert(format!("declare {vt} @llvm.{name}.{sfx}({params})"));
                        let a = vals.iter().map(Val::typed).collect::<Vec<_>>().join(", ");
                        self.assign(&vt, format!("call {fm}{vt} @llvm.{name}.{sfx}({a})"))
                    }
                };
                Ok(Lanes::Vector(v))
            }
            _ => self.scalarize(var, lo, n, e),
        }
    }

    /// Lane-wise IEEE minimum/maximum (NaN if either is NaN, -0 below +0); with `nnan nsz` fast
    /// math, a plain compare and select.
    fn vminmax(&mut self, min: bool, n: i64, sty: &str, x: Val, y: Val) -> Val {
        let vt = x.ty.clone();
        let bt = format!("<{n} x i1>");
        let p = if min { "olt" } else { "ogt" };
        let fm = self.fm();
        let c = self.assign(&bt, format!("fcmp {fm}{p} {}, {}", x.typed(), y.v));
        let relaxed = self.opts.fast_math == "fast"
            || (self.opts.fast_math.contains("nnan") && self.opts.fast_math.contains("nsz"));
        if relaxed {
            return self.assign(
                &vt,
                format!("select {fm}{bt} {}, {}, {}", c.v, x.typed(), y.typed()),
            );
        }
        let ity = Self::vty(n, if sty == "float" { "i32" } else { "i64" });
        let eq = self.assign(&bt, format!("fcmp oeq {}, {}", x.typed(), y.v));
        let xb = self.assign(&ity, format!("bitcast {} to {ity}", x.typed()));
        let sgn = self.assign(&bt, format!("icmp slt {ity} {}, zeroinitializer", xb.v));
        let want = if min {
            sgn.v.clone()
        } else {
            let ones = Self::splat_const(n, "i1", "true");
            self.assign(&bt, format!("xor {bt} {}, {ones}", sgn.v)).v
        };
        let tie = self.assign(&bt, format!("and {bt} {}, {want}", eq.v));
        let pick = self.assign(&bt, format!("or {bt} {}, {}", c.v, tie.v));
        let r = self.assign(
            &vt,
            format!("select {bt} {}, {}, {}", pick.v, x.typed(), y.typed()),
        );
        let nan = self.assign(&bt, format!("fcmp uno {}, {}", x.typed(), y.v));
        let q = Self::splat_const(n, sty, "0x7FF8000000000000");
        self.assign(
            &vt,
            format!("select {bt} {}, {vt} {q}, {}", nan.v, r.typed()),
        )
    }

    /// Whether `exp` on float32 may use the polynomial (fast math that allows approximations).
    fn fast_exp(&self) -> bool {
        self.opts.fast_math == "fast"
    }

    /// `fast_exp(x)` in float32 (scalar `float` or vector `<n x float>` type `ty`): exactly the
    /// sequence of [`crate::ir::approx::fast_exp_f32`] (clamp, Cody-Waite range reduction, a
    /// degree-6 polynomial by fused multiply-adds, `2^k` in the exponent bits; a NaN input is
    /// returned), so the result is the interpreter's bit for bit. Also `exp` under fast math.
    fn fast_exp_poly(&mut self, ty: &str, sty: &str, n: i64, x: Val) -> Val {
        let vec = n > 1;
        let c = |v: f64| -> String {
            let s = float_const(DataType::f32(), v);
            if vec {
                Self::splat_const(n, sty, &s)
            } else {
                s
            }
        };
        let (ity, bty) = if vec {
            (format!("<{n} x i32>"), format!("<{n} x i1>"))
        } else {
            ("i32".to_owned(), "i1".to_owned())
        };
        let sfx = if vec {
            format!("v{n}f32")
        } else {
            "f32".to_owned()
        };
        for f in ["fma", "floor"] {
            let params = if f == "fma" {
                format!("{ty}, {ty}, {ty}")
            } else {
                ty.to_owned()
            };
            self.m
                .declares
                .insert(format!("declare {ty} @llvm.{f}.{sfx}({params})"));
        }
        use crate::ir::approx::{FAST_EXP_HI, FAST_EXP_LO, FAST_EXP_POLY, LN2_HI, LN2_LO, LOG2_E};
        // No fast-math flags here: the sequence is the IR's definition, bit for bit.
        let hi = self.assign(&bty, format!("fcmp ogt {ty} {}, {}", x.v, c(FAST_EXP_HI)));
        let x1 = self.assign(
            ty,
            format!(
                "select {bty} {}, {ty} {}, {ty} {}",
                hi.v,
                c(FAST_EXP_HI),
                x.v
            ),
        );
        let lo = self.assign(&bty, format!("fcmp olt {ty} {}, {}", x1.v, c(FAST_EXP_LO)));
        let x2 = self.assign(
            ty,
            format!(
                "select {bty} {}, {ty} {}, {ty} {}",
                lo.v,
                c(FAST_EXP_LO),
                x1.v
            ),
        );
        // k = floor(x * log2(e) + 0.5)
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
        let fma = |e: &mut Self, a: &str, b: &str, cc: &str| -> Val {
            e.assign(
                ty,
                format!("call {ty} @llvm.fma.{sfx}({ty} {a}, {ty} {b}, {ty} {cc})"),
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
        let ki = self.assign(&ity, format!("fptosi {ty} {} to {ity}", k.v));
        let (c127, c23) = if vec {
            (
                Self::splat_const(n, "i32", "127"),
                Self::splat_const(n, "i32", "23"),
            )
        } else {
            ("127".to_owned(), "23".to_owned())
        };
        let kb = self.assign(&ity, format!("add {ity} {}, {c127}", ki.v));
        let sh = self.assign(&ity, format!("shl {ity} {}, {c23}", kb.v));
        let scale = self.assign(ty, format!("bitcast {ity} {} to {ty}", sh.v));
        let e = self.assign(ty, format!("fmul {ty} {}, {}", y.v, scale.v));
        // A NaN input is the result (its k, converted above, is poison, which a select of the
        // other arm never lets through).
        let nan = self.assign(&bty, format!("fcmp uno {ty} {}, {}", x.v, x.v));
        self.assign(
            ty,
            format!("select {bty} {}, {ty} {}, {ty} {}", nan.v, x.v, e.v),
        )
    }

    /// Emits a lane-wise statement for lanes `lo .. lo + n` of `var`.
    fn vstmt(&mut self, var: &Var, lo: &Val, n: i64, s: &Stmt) -> R<()> {
        match s {
            Stmt::Seq(v) => {
                for s in v {
                    self.vstmt(var, lo, n, s)?;
                }
            }
            Stmt::Let {
                var: lv,
                value,
                body,
            } => {
                let v = self.expr(value)?;
                let old = self.vars.insert(lv.id, v);
                self.vstmt(var, lo, n, body)?;
                self.restore(lv.id, old);
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                let c = self.expr(cond)?;
                self.if_then_else(&c.v, "v", then_case, else_case.as_deref(), |e, s| {
                    e.vstmt(var, lo, n, s)
                })?;
            }
            Stmt::Store {
                buffer,
                indices,
                value,
            } => {
                let v = self.vexpr(var, lo, n, value)?;
                let v = self.as_vector(n, v);
                let mt = mem_ty(buffer.dtype);
                let align = buffer.dtype.bytes().max(1);
                if let Some(addr) = self.contiguous(var, lo, buffer, indices)? {
                    let vt = Self::vty(n, &mt);
                    let p =
                        self.assign(&format!("{vt}*"), format!("bitcast {mt}* {addr} to {vt}*"));
                    if self.stream_buf == Some(buffer.data.id) {
                        // The streaming loop's vector part: 64 bytes at a 64-byte boundary.
                        let nt = self.md(|k| format!("!{k} = !{{i32 1}}"));
                        self.line(format!(
                            "store {}, {vt}* {}, align {STREAM_ALIGN}, !nontemporal !{nt}",
                            v.typed(),
                            p.v
                        ));
                    } else {
                        self.line(format!("store {}, {vt}* {}, align {align}", v.typed(), p.v));
                    }
                } else {
                    for l in 0..n {
                        let x = self.assign(&mt, format!("extractelement {}, i32 {l}", v.typed()));
                        let i = self.lane_value(var, lo, l);
                        let old = self.vars.insert(var.id, i);
                        let a = self.address(buffer, indices);
                        self.restore(var.id, old);
                        let a = a?;
                        self.line(format!("store {}, {mt}* {a}, align {align}", x.typed()));
                    }
                }
            }
            _ => unreachable!("vec_body_ok admits only stores, lets, ifs and sequences"),
        }
        Ok(())
    }
}

// ----- streaming stores (`stream.rs` has the rule) ------------------------------------------------

/// Bytes per vector store of a streaming loop, and their alignment: one cache line.
const STREAM_ALIGN: i64 = 64;
/// Loops of a constant extent that write fewer bytes than this (or than the threshold, if it is
/// smaller) are not streamed: at most 64 bytes of scalar head and tail against at least 448
/// bytes of vector steps.
const STREAM_MIN_LOOP_BYTES: i64 = 8 * STREAM_ALIGN;

/// The number of stores in `s`.
fn count_stores(s: &Stmt) -> usize {
    match s {
        Stmt::Seq(v) => v.iter().map(count_stores).sum(),
        Stmt::Let { body, .. } | Stmt::Allocate { body, .. } | Stmt::For { body, .. } => {
            count_stores(body)
        }
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => count_stores(then_case) + else_case.as_deref().map_or(0, count_stores),
        Stmt::Store { .. } => 1,
        _ => 0,
    }
}

/// The stores in `s` (through sequences, lets and conditions) to buffers in `bufs` whose
/// address moves by one element per step of `id` (last index coefficient 1, others 0).
fn stream_stores<'s>(s: &'s Stmt, id: VarId, bufs: &HashSet<VarId>, out: &mut Vec<&'s Stmt>) {
    match s {
        Stmt::Seq(v) => v.iter().for_each(|s| stream_stores(s, id, bufs, out)),
        Stmt::Let { body, .. } => stream_stores(body, id, bufs, out),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => {
            stream_stores(then_case, id, bufs, out);
            if let Some(e) = else_case {
                stream_stores(e, id, bufs, out);
            }
        }
        Stmt::Store {
            buffer, indices, ..
        } if bufs.contains(&buffer.data.id) && buffer.strides.is_none() => {
            let last = indices.len().wrapping_sub(1);
            let unit = !indices.is_empty()
                && indices
                    .iter()
                    .enumerate()
                    .all(|(d, i)| lane_coef(i, id) == Some(i64::from(d == last)));
            if unit {
                out.push(s);
            }
        }
        _ => {}
    }
}

impl Emitter<'_> {
    /// The streamed store of a loop over `var` with `body`, if the loop gets the streaming form.
    fn stream_store(
        &self,
        var: &Var,
        body: &Stmt,
        extent: Option<i64>,
    ) -> Option<(Buffer, Vec<Expr>)> {
        let threshold = self.opts.stream_store_bytes?;
        if self.opts.device_host
            || self.m.stream_bufs.is_empty()
            || var.dtype.code != TypeCode::Int
            || !vec_body_ok(body, var.id)
        {
            return None;
        }
        let mut found = Vec::new();
        stream_stores(body, var.id, &self.m.stream_bufs, &mut found);
        // The streamed store must be the body's only store: then no iteration reads what
        // another wrote (the output is never read), and computing the iterations out of order
        // and 16 at a time gives what the serial loop gives.
        let Some(Stmt::Store {
            buffer, indices, ..
        }) = found.first()
        else {
            return None;
        };
        if count_stores(body) != 1 {
            return None;
        }
        // A short loop of known length (rows of a narrow output) would run mostly in the scalar
        // head and tail: left to LLVM's vectorizer.
        let min_bytes = STREAM_MIN_LOOP_BYTES.min(threshold.min(i64::MAX as u64) as i64);
        if extent.is_some_and(|e| e.saturating_mul(buffer.dtype.bytes() as i64) < min_bytes) {
            return None;
        }
        // Its address is computed before the loop (to align it): only variables bound outside
        // the body, and the loop variable, may appear in it.
        let mut used = BTreeSet::new();
        for i in indices {
            collect_vars(&Stmt::Evaluate(i.clone()), &mut used);
        }
        if !used
            .iter()
            .all(|id| *id == var.id || self.vars.contains_key(id))
        {
            return None;
        }
        // A constant size below the threshold never streams.
        let mut bytes = Some(buffer.dtype.bytes() as i64);
        for d in &buffer.shape {
            bytes = bytes.and_then(|b| d.as_int().and_then(|x| b.checked_mul(x)));
        }
        if bytes.is_some_and(|b| (b.max(0) as u64) < threshold) {
            return None;
        }
        Some(((*buffer).clone(), indices.clone()))
    }

    /// The loop in streaming form; when the output's shape is symbolic, its vector part has two
    /// forms, with and without non-temporal stores, chosen by the output's size at run time
    /// (two simple vector loops compile in less time than the loop LLVM would vectorize).
    fn stream_loop(
        &mut self,
        var: &Var,
        lo: Val,
        end: Val,
        body: &Stmt,
        buffer: &Buffer,
        indices: &[Expr],
    ) -> R<()> {
        let threshold = self
            .opts
            .stream_store_bytes
            .unwrap_or(0)
            .min(i64::MAX as u64);
        if buffer.shape.iter().all(|d| d.as_int().is_some()) {
            return self.stream_body(var, lo, end, body, buffer, indices, None);
        }
        let mut bytes = Val::new("i64", buffer.dtype.bytes().to_string());
        for d in &buffer.shape {
            let x = self.index64(d)?;
            bytes = self.assign("i64", format!("mul i64 {}, {}", bytes.v, x.v));
        }
        let big = self.assign("i1", format!("icmp sge i64 {}, {threshold}", bytes.v));
        self.stream_body(var, lo, end, body, buffer, indices, Some(big))
    }

    /// From the output's first 64-byte boundary, vector steps of 64 bytes with non-temporal
    /// aligned stores (with `big`: where it is true; ordinary stores otherwise); then the
    /// iterations before that boundary and after the last whole step in one scalar loop; then
    /// an `sfence`.
    #[allow(clippy::too_many_arguments)]
    fn stream_body(
        &mut self,
        var: &Var,
        lo: Val,
        end: Val,
        body: &Stmt,
        buffer: &Buffer,
        indices: &[Expr],
        big: Option<Val>,
    ) -> R<()> {
        let elem = buffer.dtype.bytes().max(1) as i64;
        let lanes = STREAM_ALIGN / elem;
        let lo64 = self.widen64(var.dtype, lo.clone());
        let end64 = self.widen64(var.dtype, end.clone());
        let ext0 = self.assign("i64", format!("sub i64 {}, {}", end64.v, lo64.v));
        let neg = self.assign("i1", format!("icmp slt i64 {}, 0", ext0.v));
        let ext = self.assign("i64", format!("select i1 {}, i64 0, i64 {}", neg.v, ext0.v));
        // The address of the first iteration's store.
        let old = self.vars.insert(var.id, lo.clone());
        let addr = self.address(buffer, indices);
        self.restore(var.id, old);
        let addr = addr?;
        let mt = mem_ty(buffer.dtype);
        let a = self.assign("i64", format!("ptrtoint {mt}* {addr} to i64"));
        let mis = self.assign("i64", format!("and i64 {}, {}", a.v, STREAM_ALIGN - 1));
        let to_line = self.assign("i64", format!("sub i64 {STREAM_ALIGN}, {}", mis.v));
        let to_line = self.assign(
            "i64",
            format!("and i64 {}, {}", to_line.v, STREAM_ALIGN - 1),
        );
        let head0 = self.assign("i64", format!("udiv i64 {}, {elem}", to_line.v));
        // An output not aligned to its element never reaches a 64-byte boundary: all scalar.
        let lowbits = self.assign("i64", format!("and i64 {}, {}", a.v, elem - 1));
        let aligned = self.assign("i1", format!("icmp eq i64 {}, 0", lowbits.v));
        let head1 = self.assign(
            "i64",
            format!("select i1 {}, i64 {}, i64 {}", aligned.v, head0.v, ext.v),
        );
        let short = self.assign("i1", format!("icmp ult i64 {}, {}", head1.v, ext.v));
        let head = self.assign(
            "i64",
            format!("select i1 {}, i64 {}, i64 {}", short.v, head1.v, ext.v),
        );
        let rest = self.assign("i64", format!("sub i64 {}, {}", ext.v, head.v));
        let nvec = self.assign("i64", format!("udiv i64 {}, {lanes}", rest.v));
        let vbytes = self.assign("i64", format!("mul i64 {}, {lanes}", nvec.v));
        let mstart = self.assign("i64", format!("add i64 {}, {}", lo64.v, head.v));
        let mend = self.assign("i64", format!("add i64 {}, {}", mstart.v, vbytes.v));
        // Vector part.
        match big {
            None => self.vector_steps(var, &mstart, &mend, lanes, body, Some(buffer))?,
            Some(big) => {
                let (nt, plain, join) = (
                    self.new_label("nt"),
                    self.new_label("no_nt"),
                    self.new_label("nt_join"),
                );
                self.line(format!("br i1 {}, label %{nt}, label %{plain}", big.v));
                self.start_block(&nt);
                self.vector_steps(var, &mstart, &mend, lanes, body, Some(buffer))?;
                self.line(format!("br label %{join}"));
                self.start_block(&plain);
                self.vector_steps(var, &mstart, &mend, lanes, body, None)?;
                self.line(format!("br label %{join}"));
                self.start_block(&join);
            }
        }
        // Head and tail (each fewer than 64 bytes of the output) in one scalar loop: one copy of
        // the body less to compile.
        let tail = self.assign("i64", format!("sub i64 {}, {}", end64.v, mend.v));
        let count = self.assign("i64", format!("add i64 {}, {}", head.v, tail.v));
        self.edge_steps(var, &lo64, &head, &mend, &count, body)?;
        // Non-temporal stores are weakly ordered: fence them before this thread says it is done.
        self.m
            .declares
            .insert("declare void @llvm.x86.sse.sfence()".into());
        self.line("call void @llvm.x86.sse.sfence()");
        Ok(())
    }
}

impl Emitter<'_> {
    /// `body` for `var` in `[start, end)` (i64 values, `end - start` a multiple of `lanes`),
    /// `lanes` at a time as vector code; contiguous stores to `nontemporal` are non-temporal
    /// and 64-byte aligned (the caller has aligned `start` for it).
    fn vector_steps(
        &mut self,
        var: &Var,
        start: &Val,
        end: &Val,
        lanes: i64,
        body: &Stmt,
        nontemporal: Option<&Buffer>,
    ) -> R<()> {
        let ty = reg_ty(var.dtype);
        // Vector code already; as a streaming loop bound by memory bandwidth, unrolling would
        // only cost compile time.
        self.kept_loop("vs", &start.v, &end.v, lanes, |e, j| {
            let jv = if ty == "i64" {
                Val::new("i64", j)
            } else {
                e.assign(&ty, format!("trunc i64 {j} to {ty}"))
            };
            let saved = std::mem::replace(&mut e.stream_buf, nontemporal.map(|b| b.data.id));
            let r = e.vstmt(var, &jv, lanes, body);
            e.stream_buf = saved;
            r
        })
    }

    /// `for (k = start; k < end; k += step) body(k)` over i64 values, as a loop that LLVM
    /// neither vectorizes nor unrolls (labels `<prefix>_head`, `_body`, `_latch`, `_end`).
    fn kept_loop(
        &mut self,
        prefix: &str,
        start: &str,
        end: &str,
        step: i64,
        body: impl FnOnce(&mut Self, &str) -> R<()>,
    ) -> R<()> {
        let (lh, lb, ll, lx) = (
            self.new_label(&format!("{prefix}_head")),
            self.new_label(&format!("{prefix}_body")),
            self.new_label(&format!("{prefix}_latch")),
            self.new_label(&format!("{prefix}_end")),
        );
        let pre = self.cur_block.clone();
        self.line(format!("br label %{lh}"));
        self.start_block(&lh);
        let k = self.tmp();
        let kn = self.tmp();
        self.line(format!(
            "{k} = phi i64 [ {start}, %{pre} ], [ {kn}, %{ll} ]"
        ));
        let c = self.assign("i1", format!("icmp slt i64 {k}, {end}"));
        self.line(format!("br i1 {}, label %{lb}, label %{lx}", c.v));
        self.start_block(&lb);
        body(self, &k)?;
        self.line(format!("br label %{ll}"));
        self.start_block(&ll);
        self.line(format!("{kn} = add nsw i64 {k}, {step}"));
        let md = self.no_unroll_metadata();
        self.line(format!("br label %{lh}{md}"));
        self.start_block(&lx);
        Ok(())
    }
}

impl Emitter<'_> {
    /// `body` for `var` = `lo + k` for `k < head`, then `mend + k - head`, for `k` in
    /// `[0, count)` (i64 values), one iteration at a time, as a loop LLVM keeps as it is.
    fn edge_steps(
        &mut self,
        var: &Var,
        lo: &Val,
        head: &Val,
        mend: &Val,
        count: &Val,
        body: &Stmt,
    ) -> R<()> {
        let ty = reg_ty(var.dtype);
        self.kept_loop("edge", "0", &count.v, 1, |e, k| {
            let in_head = e.assign("i1", format!("icmp slt i64 {k}, {}", head.v));
            let a = e.assign("i64", format!("add i64 {}, {k}", lo.v));
            let t0 = e.assign("i64", format!("sub i64 {k}, {}", head.v));
            let b = e.assign("i64", format!("add i64 {}, {}", mend.v, t0.v));
            let i64v = e.assign(
                "i64",
                format!("select i1 {}, i64 {}, i64 {}", in_head.v, a.v, b.v),
            );
            let iv = if ty == "i64" {
                i64v
            } else {
                e.assign(&ty, format!("trunc i64 {} to {ty}", i64v.v))
            };
            let old = e.vars.insert(var.id, iv);
            let r = e.stmt(body);
            e.restore(var.id, old);
            r
        })
    }
}
