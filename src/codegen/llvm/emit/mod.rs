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
//!
//! # Layout
//!
//! The emitter is one type, [`Emitter`] (a function being written). Its inherent methods are
//! spread over the files of this module by concern, each file with an `impl Emitter<'_>` block
//! and the free helpers of that concern:
//! - `mod.rs`: [`Linkage`], [`EmitOptions`], [`Val`] and the types of values ([`reg_ty`],
//!   [`mem_ty`]), [`ModuleText`], the [`Emitter`] and its state, its output primitives
//!   (temporaries, labels, lines, metadata), the error exits, and [`fn_attrs`];
//! - `expr.rs`: scalar expressions ([`Emitter::expr`]), register/memory conversions (bool, bf16),
//!   element addresses and index widening;
//! - `arith.rs`: binary operators, integer division, float `min`/`max`, and casts;
//! - `intrinsic.rs`: math intrinsics (LLVM intrinsics, libm calls, integer intrinsics, float
//!   predicates) and the float32 `fast_exp` polynomial of scalar and vector code;
//! - `stmt.rs`: statements ([`Emitter::stmt`]), `return`, serial loops and their `llvm.loop`
//!   metadata, allocations on the stack or in the workspace;
//! - `parallel.rs`: parallel loops (the lambda, its closure, the inline or pool launch), the work
//!   estimate that chooses between them, and `collect_vars`;
//! - `vector.rs`: the emitter's own unrolling and vectorization of `unrolled` and `vectorized`
//!   loops;
//! - `copy.rs`: loop nests that copy a contiguous region, as one `memcpy`;
//! - `prefetch.rs`: prefetches, one per cache line of a vector's lanes;
//! - `streaming.rs`: loops that write a streamed output, with non-temporal stores (the backend's
//!   `stream.rs` has the rule);
//! - `launch.rs`: the host code of a device target: the host-access check and the launch of a
//!   thread-bound nest as a device kernel;
//! - `kernel.rs`: the other side of a launch, a thread-bound nest as an NVPTX kernel
//!   ([`kernel_module`]): thread ids, shared memory in address space 3, barriers, libdevice math.

mod arith;
mod copy;
mod expr;
mod intrinsic;
mod kernel;
mod launch;
mod parallel;
mod prefetch;
mod stmt;
mod streaming;
mod transpose;
mod vector;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

use crate::ir::{DataType, TypeCode, VarId};

pub(crate) use kernel::kernel_module;

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
        /// The quick tier's argument decoder (`jit::kiln_jit_quick_decode`, called with the
        /// checker's context), or 0: the quick wrappers then compile their checks
        /// (`quick.rs`).
        quick: usize,
        /// The address of the module's table of compute functions: one pointer-sized slot per
        /// function with a global symbol, in module order. A quick wrapper loads its compute
        /// function from its slot on every call (`tiering.rs`).
        calls: usize,
        /// The address of the module's table of entries, laid out as `calls`: the exported
        /// `__tvm_ffi_<symbol>` is a stub that jumps through its slot to the function's
        /// implementation, the quick wrapper first and the optimized one (checks and compute in
        /// one function) once compiled, so that it can replace the quick code while the module
        /// is in use.
        entries: usize,
        /// Whether this is the optimized tier: implementations whose checks call the compute
        /// function directly (inlined), no stubs or quick wrappers, compute functions internal.
        optimized: bool,
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

    /// The same linkage for the optimized tier of a JIT module (`optimized`); other
    /// linkages unchanged.
    pub(crate) fn optimized(&self, on: bool) -> Linkage {
        let mut l = self.clone();
        if let Linkage::Jit { optimized, .. } = &mut l {
            *optimized = on;
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
    /// The code is the body of an NVPTX kernel (`kernel.rs`): thread-bound loops read the
    /// thread's ids, `shared` allocations are address space 3, math goes to libdevice, and
    /// nothing raises an error (a kernel has no error path).
    pub nvptx: bool,
    /// The widest vector register, in bits (`CodegenOptions::vector_register_bits`): the
    /// widest store of a loop whose vector width kiln picks (`short_loop_width`). LLVM 14
    /// splits a wider vector store into register-wide stores in descending address order,
    /// which made the row copy of `pad` 20 % slower on a Zen 3.
    pub vector_bits: u32,
    /// Whether functions probe their stack frames page by page (`"probe-stack"="inline-asm"`,
    /// x86 host code): a frame larger than a page (stack-resident `local` and `workspace`
    /// buffers) would otherwise be able to step over the guard page of a nearly full stack.
    pub stack_probes: bool,
}

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
    /// Appends the module's globals, declarations and functions, one per line, to `out` (the
    /// body of the module's text, between its header and its metadata).
    pub fn write_body(&self, out: &mut String) {
        self.write_body_with(out, &mut self.functions.iter());
    }

    /// As [`ModuleText::write_body`], with `functions` instead of all of them.
    pub fn write_body_with(&self, out: &mut String, functions: &mut dyn Iterator<Item = &String>) {
        for g in &self.globals {
            out.push_str(g);
            out.push('\n');
        }
        for d in &self.declares {
            out.push_str(d);
            out.push('\n');
        }
        out.push('\n');
        for f in functions {
            out.push_str(f);
            out.push('\n');
        }
    }

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
    /// The name of the kiln function this code belongs to (a parallel loop's lambda and body
    /// inherit it), for run-time error messages.
    pub kernel_name: String,
    body: String,
    entry_allocas: String,
    /// Bytes of `workspace` allocations this function keeps on its stack (`stmt.rs`).
    stack_workspace_bytes: i64,
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
    /// In a vector piece of a loop that starts at a constant (`vector.rs`): the loop variable
    /// and its value in lane 0, so that an index computed from it alone is known per lane.
    lane_base: Option<(VarId, i64)>,
    /// In an NVPTX kernel whose shared memory is dynamic: each `shared` allocation's byte
    /// offset in it (`kernel.rs`).
    dyn_shared: Option<HashMap<VarId, u64>>,
    /// The float → integer casts of the body that cannot saturate, by address
    /// (`codegen::bounds`): each is a plain conversion.
    pub in_range_casts: Arc<HashSet<usize>>,
    /// The function is `noalias`: its buffers (parameters and workspaces) never overlap, which
    /// a parallel loop's body keeps by taking them as `noalias` arguments (`parallel.rs`).
    pub noalias: bool,
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
            kernel_name: fname.to_owned(),
            body: String::new(),
            entry_allocas: String::new(),
            stack_workspace_bytes: 0,
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
            lane_base: None,
            dyn_shared: None,
            in_range_casts: Arc::default(),
            noalias: false,
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
}

/// The attribute group text of every generated function.
pub(crate) fn fn_attrs(o: &EmitOptions) -> String {
    let mut a = format!("nounwind \"target-cpu\"=\"{}\"", o.cpu);
    if o.stack_probes {
        a.push_str(" \"probe-stack\"=\"inline-asm\"");
    }
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
