//! The verifier: the rules every module must satisfy before it is interpreted or compiled.
//!
//! Each error names its node by the path the node has in the JSON form
//! (`$.functions[0].body.stmts[1].value.args[0]`), so errors on a module read from JSON point
//! into the file. The rules (also listed in `docs/ir.md`):
//!
//! - **Types**: every type is one of the scalar types (`lanes == 1`); `handle` only for buffer
//!   data. Binary operands have the same type; arithmetic needs numbers, `and`/`or`/`not` and
//!   conditions need `bool`; `select` arms agree; intrinsic arguments are floats of one type (`abs`
//!   also integers) and come in the right number; constants fit their type; stores, `let`s, loop
//!   bounds and `return` values have the type of what they are assigned to.
//! - **Scoping**: a variable is used only inside its binding (parameter, shape of a buffer
//!   parameter, `for`, `let`); each variable is bound once; buffers are used only where declared
//!   (parameters, or inside their `allocate`) and their names are unique in a function.
//! - **Buffers**: index count equals rank; indices, shapes and strides are `int32`/`int64`; shape
//!   and stride entries are non-negative constants or variables; parameters are `global`,
//!   allocations `local` or `workspace` and compact.
//! - **Loops**: a `parallel` loop may not be nested inside another `parallel` or a `vectorized`
//!   loop; `vectorized` and `unrolled` loops need a constant extent; `return` may not appear
//!   inside a `parallel` loop.
//! - **Device code** (see [`super::device`]): `thread_binding` loops start at 0 and their extents
//!   use only variables bound outside the kernel; `threadIdx` loops are inside a `blockIdx` loop,
//!   no `blockIdx` loop is inside a `threadIdx` loop and no tag inside itself; a tag has one
//!   extent (structurally equal) per kernel; no `parallel` loop in a kernel and no kernel in a
//!   `parallel` or `vectorized` loop; `shared` allocations only in kernels, with constant shapes;
//!   no `workspace` allocation and no `return` in a kernel; `barrier` only in a kernel, inside a
//!   `threadIdx` loop, and not under an `if` or loop whose condition or bounds depend on a
//!   `threadIdx` variable (directly, through `let`s, or through loads of kernel-`local` buffers).
//! - **Functions**: parameter names are unique; `return` only with a `ret_type`; `global_symbol`
//!   is a C identifier; function names and global symbols are unique in a module; at most one
//!   function is the entry.
//! - Nesting is at most [`MAX_NESTING`] nodes deep.

use std::collections::{HashMap, HashSet};

use super::builder::wrap_int;
use super::dtype::DataType;
use super::error::{IrError, IrResult};
use super::expr::{BinOp, Expr, Intrinsic, Var, VarId};
use super::func::{Buffer, IRModule, Param, PrimFunc, StorageScope};
use super::stmt::{ForKind, Stmt, ThreadTag};

/// The deepest nesting of IR nodes the verifier (and so the interpreter) accepts.
pub const MAX_NESTING: usize = 256;

pub(crate) fn verify_module(m: &IRModule) -> Vec<IrError> {
    super::error::with_big_stack(|| verify_module_here(m))
}

fn verify_module_here(m: &IRModule) -> Vec<IrError> {
    let mut errors = Vec::new();
    let mut names = HashSet::new();
    let mut symbols = HashSet::new();
    let mut entries = 0;
    for (i, f) in m.functions.iter().enumerate() {
        let root = format!("$.functions[{i}]");
        let mut err = |path: &str, message: String| {
            errors.push(IrError::Verify {
                func: f.name.clone(),
                path: format!("{root}{path}"),
                message,
            })
        };
        if !names.insert(f.name.as_str()) {
            err(".name", format!("duplicate function name `{}`", f.name));
        }
        if let Some(s) = &f.attrs.global_symbol {
            if !symbols.insert(s.as_str()) {
                err(
                    ".attrs.global_symbol",
                    format!("duplicate global symbol `{s}`"),
                );
            }
        }
        if f.attrs.entry {
            entries += 1;
            if entries == 2 {
                err(
                    ".attrs.entry",
                    "more than one function is marked as the entry".to_string(),
                );
            }
        }
        errors.extend(check_func(f, &root));
    }
    errors
}

pub(crate) fn verify_func(f: &PrimFunc) -> IrResult<()> {
    match super::error::with_big_stack(|| check_func(f, "$"))
        .into_iter()
        .next()
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn check_func(f: &PrimFunc, root: &str) -> Vec<IrError> {
    let mut v = Verifier {
        func: &f.name,
        path: root.to_string(),
        errors: Vec::new(),
        scope: HashMap::new(),
        defined: HashSet::new(),
        buffers: HashMap::new(),
        buffer_names: HashSet::new(),
        loops: Vec::new(),
        ret_type: f.ret_type,
        depth: 0,
        kernel: None,
        thread_loops: Vec::new(),
        tainted: HashSet::new(),
        kernel_locals: HashSet::new(),
        divergent: Vec::new(),
    };
    v.func(f);
    v.errors
}

fn is_c_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

struct Verifier<'a> {
    func: &'a str,
    path: String,
    errors: Vec<IrError>,
    /// Variables in scope, with the type they were bound with.
    scope: HashMap<VarId, DataType>,
    /// Every variable bound so far (each may be bound once).
    defined: HashSet<VarId>,
    /// Buffers in scope, by data variable.
    buffers: HashMap<VarId, &'a Buffer>,
    buffer_names: HashSet<&'a str>,
    loops: Vec<ForKind>,
    ret_type: Option<DataType>,
    depth: usize,
    /// The kernel being checked, if inside one.
    kernel: Option<KernelCtx<'a>>,
    /// Enclosing thread-bound loops (tag, variable name), outermost first.
    thread_loops: Vec<(ThreadTag, &'a str)>,
    /// Variables whose value depends on a `threadIdx` variable.
    tainted: HashSet<VarId>,
    /// `local` buffers allocated in the current kernel (per thread: loads depend on the thread).
    kernel_locals: HashSet<VarId>,
    /// Enclosing thread-dependent `if`s and loops in the current kernel, described.
    divergent: Vec<String>,
}

struct KernelCtx<'a> {
    /// Node path of the kernel's outermost loop.
    path: String,
    /// The first extent seen for each tag, with its path.
    extents: HashMap<ThreadTag, (&'a Expr, String)>,
    /// Variables in scope where the kernel starts (launch extents may use these only).
    outer: HashSet<VarId>,
}

impl<'a> Verifier<'a> {
    fn err(&mut self, message: impl Into<String>) {
        self.errors.push(IrError::Verify {
            func: self.func.to_string(),
            path: self.path.clone(),
            message: message.into(),
        });
    }

    /// Runs `f` with `seg` appended to the path.
    fn at<R>(&mut self, seg: &str, f: impl FnOnce(&mut Self) -> R) -> R {
        let len = self.path.len();
        self.path.push_str(seg);
        let r = f(self);
        self.path.truncate(len);
        r
    }

    /// Checks that `t` is a scalar value type; `what` describes the node for the message.
    fn value_type(&mut self, t: DataType, what: &str) -> bool {
        if !t.is_valid() {
            self.err(format!(
                "{what} has an invalid type (code {}, {} bits)",
                t.code as u8, t.bits
            ));
            false
        } else if t.lanes != 1 {
            self.err(format!(
                "{what} has vector type {t}; kiln-ir/1 expressions are scalar"
            ));
            false
        } else if t.is_handle() {
            self.err(format!(
                "{what} has type handle; handles are only buffer data pointers"
            ));
            false
        } else {
            true
        }
    }

    fn bind(&mut self, v: &Var) {
        if !self.defined.insert(v.id) {
            self.err(format!(
                "variable `{}` (id {}) is bound more than once",
                v.name, v.id.0
            ));
        }
        self.scope.insert(v.id, v.dtype);
    }

    fn index_dims(&mut self, dims: &'a [Expr], field: &str, is_param: bool) {
        for (i, d) in dims.iter().enumerate() {
            self.at(&format!(".{field}[{i}]"), |s| match d {
                Expr::IntImm { dtype, value } => {
                    if !dtype.is_index() {
                        s.err(format!("{field} entries are int32 or int64, found {dtype}"));
                    } else if *value < 0 {
                        s.err(format!(
                            "{field} entries may not be negative, found {value}"
                        ));
                    }
                }
                Expr::Var(v) => {
                    if !v.dtype.is_index() {
                        s.err(format!(
                            "{field} variable `{}` must be int32 or int64, found {}",
                            v.name, v.dtype
                        ));
                    }
                    match s.scope.get(&v.id) {
                        Some(t) if *t != v.dtype => s.err(format!(
                            "variable `{}` was bound as {t} but used as {}",
                            v.name, v.dtype
                        )),
                        Some(_) => {}
                        None if is_param => s.bind(v),
                        None => s.err(format!("undefined variable `{}` in buffer {field}", v.name)),
                    }
                }
                other => s.err(format!(
                    "{field} entries are constants or variables, found `{other}`"
                )),
            });
        }
    }

    fn buffer_decl(&mut self, b: &'a Buffer, is_param: bool) {
        if b.name.is_empty() {
            self.err("buffer names may not be empty");
        }
        if !self.buffer_names.insert(&b.name) {
            self.err(format!(
                "buffer name `{}` is used twice in this function",
                b.name
            ));
        }
        self.value_type(b.dtype, &format!("buffer `{}`", b.name));
        if b.data.dtype != DataType::handle() {
            self.err(format!(
                "data variable of buffer `{}` has type {}, expected handle",
                b.name, b.data.dtype
            ));
        }
        if !self.defined.insert(b.data.id) {
            self.err(format!(
                "buffer `{}` is declared twice (same data variable)",
                b.name
            ));
        }
        self.index_dims(&b.shape, "shape", is_param);
        if let Some(strides) = &b.strides {
            if strides.len() != b.shape.len() {
                self.err(format!(
                    "buffer `{}` has {} strides for {} dimensions",
                    b.name,
                    strides.len(),
                    b.shape.len()
                ));
            }
            if !is_param {
                self.err(format!(
                    "allocated buffer `{}` must be compact (no strides)",
                    b.name
                ));
            }
            self.index_dims(strides, "strides", is_param);
        }
        match (is_param, b.scope) {
            (true, StorageScope::Global) => {}
            (true, s) => self.err(format!(
                "parameter buffer `{}` has scope {}, expected global",
                b.name,
                s.name()
            )),
            (false, StorageScope::Global) => self.err(format!(
                "allocated buffer `{}` has scope global, expected local, workspace or shared",
                b.name
            )),
            (false, _) => {}
        }
        self.buffers.insert(b.data.id, b);
    }

    fn func(&mut self, f: &'a PrimFunc) {
        if f.name.is_empty() {
            self.at(".name", |s| s.err("function names may not be empty"));
        }
        if let Some(sym) = &f.attrs.global_symbol {
            if !is_c_identifier(sym) {
                self.at(".attrs.global_symbol", |s| {
                    s.err(format!(
                        "global symbol `{sym}` is not a C identifier ([A-Za-z_][A-Za-z0-9_]*)"
                    ))
                });
            }
        }
        if let Some(t) = f.ret_type {
            self.at(".ret_type", |s| s.value_type(t, "the return type"));
        }
        let mut names = HashSet::new();
        for (i, p) in f.params.iter().enumerate() {
            self.at(&format!(".params[{i}]"), |s| {
                if !names.insert(p.name()) {
                    s.err(format!("duplicate parameter name `{}`", p.name()));
                }
                match p {
                    Param::Scalar(v) => {
                        s.value_type(v.dtype, &format!("scalar parameter `{}`", v.name));
                        if s.scope.contains_key(&v.id) {
                            // Already bound by an earlier buffer's shape: the caller checks equality.
                            if s.scope.get(&v.id) != Some(&v.dtype) {
                                s.err(format!("variable `{}` is bound with two types", v.name));
                            }
                        } else {
                            s.bind(v);
                        }
                    }
                    Param::Buffer(b) => s.buffer_decl(b, true),
                }
            });
        }
        self.at(".body", |s| s.stmt(&f.body));
    }

    fn enter(&mut self) -> bool {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            self.err(format!("IR nested deeper than {MAX_NESTING} nodes"));
            return false;
        }
        true
    }

    fn use_buffer(&mut self, b: &Buffer, indices: &'a [Expr]) {
        match self.buffers.get(&b.data.id) {
            None => self.err(format!("buffer `{}` is not in scope here", b.name)),
            Some(decl) if **decl != *b => self.err(format!(
                "buffer `{}` differs from its declaration (name, type, shape or scope)",
                b.name
            )),
            Some(_) => {}
        }
        if indices.len() != b.shape.len() {
            self.err(format!(
                "buffer `{}` has rank {} but is indexed with {} indices",
                b.name,
                b.shape.len(),
                indices.len()
            ));
        }
        for (i, x) in indices.iter().enumerate() {
            self.at(&format!(".indices[{i}]"), |s| {
                let t = s.expr(x);
                if !t.is_index() {
                    s.err(format!("indices are int32 or int64, found {t}"));
                }
            });
        }
    }

    fn stmt(&mut self, st: &'a Stmt) {
        if self.enter() {
            self.stmt_inner(st);
        }
        self.depth -= 1;
    }

    fn stmt_inner(&mut self, st: &'a Stmt) {
        match st {
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => {
                let tmin = self.at(".min", |s| s.expr(min));
                let text = self.at(".extent", |s| s.expr(extent));
                self.at(".var", |s| {
                    if !var.dtype.is_index() {
                        s.err(format!("loop variable `{}` must be int32 or int64, found {}", var.name, var.dtype));
                    }
                    if tmin != var.dtype || text != var.dtype {
                        s.err(format!(
                            "loop `{}`: min ({tmin}) and extent ({text}) must have the loop variable's type {}",
                            var.name, var.dtype
                        ));
                    }
                });
                match kind {
                    ForKind::Parallel => {
                        if let Some(k) = &self.kernel {
                            let kp = k.path.clone();
                            self.at(".kind", |s| {
                                s.err(format!(
                                    "parallel loop `{}` inside the device kernel at {kp}",
                                    var.name
                                ))
                            });
                        } else if let Some(outer) = self
                            .loops
                            .iter()
                            .find(|k| matches!(k, ForKind::Parallel | ForKind::Vectorized))
                        {
                            let outer = outer.name();
                            self.at(".kind", |s| {
                                s.err(format!(
                                    "parallel loop `{}` is nested inside a {outer} loop",
                                    var.name
                                ))
                            });
                        }
                    }
                    ForKind::Vectorized | ForKind::Unrolled => {
                        if extent.as_int().is_none() {
                            self.at(".extent", |s| {
                                s.err(format!(
                                    "{} loop `{}` needs a constant extent, found `{extent}`",
                                    kind.name(),
                                    var.name
                                ))
                            });
                        }
                    }
                    ForKind::Serial => {}
                    ForKind::ThreadBinding(tag) => {
                        return self.thread_loop(var, min, extent, *tag, body);
                    }
                }
                let mut diverges = false;
                if self.kernel.is_some() && (self.depends(min) || self.depends(extent)) {
                    self.tainted.insert(var.id);
                    diverges = true;
                    let d = format!(
                        "loop `{}` at {} (its bounds depend on threadIdx)",
                        var.name, self.path
                    );
                    self.divergent.push(d);
                }
                self.bind(var);
                self.loops.push(*kind);
                self.at(".body", |s| s.stmt(body));
                self.loops.pop();
                if diverges {
                    self.divergent.pop();
                }
                self.scope.remove(&var.id);
            }
            Stmt::Store {
                buffer,
                indices,
                value,
            } => {
                self.use_buffer(buffer, indices);
                let t = self.at(".value", |s| s.expr(value));
                if t != buffer.dtype {
                    self.at(".value", |s| {
                        s.err(format!(
                            "storing a {t} value into buffer `{}` of {}",
                            buffer.name, buffer.dtype
                        ))
                    });
                }
            }
            Stmt::Allocate { buffer, body } => {
                self.at(".buffer", |s| s.buffer_decl(buffer, false));
                self.at(".buffer", |s| s.device_allocation(buffer));
                self.at(".body", |s| s.stmt(body));
                self.buffers.remove(&buffer.data.id);
            }
            Stmt::Let { var, value, body } => {
                let t = self.at(".value", |s| s.expr(value));
                self.at(".var", |s| {
                    s.value_type(var.dtype, &format!("variable `{}`", var.name));
                    if t != var.dtype {
                        s.err(format!(
                            "`let {}: {}` is given a {t} value",
                            var.name, var.dtype
                        ));
                    }
                });
                if self.kernel.is_some() && self.depends(value) {
                    self.tainted.insert(var.id);
                }
                self.bind(var);
                self.at(".body", |s| s.stmt(body));
                self.scope.remove(&var.id);
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                self.cond(cond, "if");
                let diverges = self.kernel.is_some() && self.depends(cond);
                if diverges {
                    let d = format!("`if` at {} (its condition depends on threadIdx)", self.path);
                    self.divergent.push(d);
                }
                self.at(".then", |s| s.stmt(then_case));
                if let Some(e) = else_case {
                    self.at(".else", |s| s.stmt(e));
                }
                if diverges {
                    self.divergent.pop();
                }
            }
            Stmt::While { cond, body } => {
                self.cond(cond, "while");
                if self.loops.contains(&ForKind::Vectorized) {
                    self.err("a `while` loop inside a vectorized loop: only serial code can hold one (make the loop around it serial)");
                }
                // Its trip count may differ between threads when anything it reads does.
                let diverges = self.kernel.is_some();
                if diverges {
                    let d = format!(
                        "`while` at {} (its trip count may differ between threads)",
                        self.path
                    );
                    self.divergent.push(d);
                }
                self.at(".body", |s| s.stmt(body));
                if diverges {
                    self.divergent.pop();
                }
            }
            Stmt::Seq(v) => {
                for (i, s) in v.iter().enumerate() {
                    self.at(&format!(".stmts[{i}]"), |me| me.stmt(s));
                }
            }
            Stmt::Evaluate(e) => {
                self.at(".value", |s| s.expr(e));
            }
            // In scope and well typed like a load; the element need not exist.
            Stmt::Prefetch { buffer, indices } => self.use_buffer(buffer, indices),
            Stmt::Assert { cond, .. } => self.cond(cond, "assert"),
            Stmt::Barrier => {
                if self.kernel.is_none() {
                    self.err("barrier outside a device kernel");
                } else if !self.thread_loops.iter().any(|(t, _)| t.is_thread()) {
                    self.err("barrier outside every threadIdx loop; it must be inside one");
                } else if let Some(d) = self.divergent.last() {
                    let d = d.clone();
                    self.err(format!(
                        "barrier under the thread-dependent {d}: not every thread of the block may reach it"
                    ));
                }
            }
            Stmt::Return(e) => {
                let t = self.at(".value", |s| s.expr(e));
                match self.ret_type {
                    None => self.err("`return` in a function without a return type"),
                    Some(r) if r != t => self.at(".value", |s| {
                        s.err(format!("returning {t} from a function returning {r}"))
                    }),
                    Some(_) => {}
                }
                if self.loops.contains(&ForKind::Parallel) {
                    self.err("`return` inside a parallel loop");
                }
                if self.kernel.is_some() {
                    self.err("`return` inside a device kernel");
                }
            }
        }
    }

    /// Whether `e` depends on a `threadIdx` variable: it mentions one, a variable whose value
    /// does, or loads from a kernel-`local` (per-thread) buffer.
    fn depends(&self, e: &Expr) -> bool {
        let uses = e.free_uses();
        uses.vars.iter().any(|v| self.tainted.contains(&v.id))
            || uses
                .buffers
                .iter()
                .any(|b| self.kernel_locals.contains(&b.data.id))
    }

    /// The device rules for an allocation.
    fn device_allocation(&mut self, b: &'a Buffer) {
        match (b.scope, self.kernel.is_some()) {
            (StorageScope::Shared, false) => self.err(format!(
                "shared buffer `{}` is allocated outside a device kernel",
                b.name
            )),
            (StorageScope::Shared, true) if b.const_numel().is_none() => {
                let shape: Vec<String> = b.shape.iter().map(|d| d.to_string()).collect();
                self.err(format!(
                    "shared buffer `{}` needs a constant shape, found [{}]",
                    b.name,
                    shape.join(", ")
                ));
            }
            (StorageScope::Workspace, true) => self.err(format!(
                "workspace buffer `{}` is allocated inside a device kernel (use local or shared)",
                b.name
            )),
            (StorageScope::Local, true) => {
                self.kernel_locals.insert(b.data.id);
            }
            _ => {}
        }
    }

    /// A `thread_binding` loop: the device rules, then the body.
    fn thread_loop(
        &mut self,
        var: &'a Var,
        min: &'a Expr,
        extent: &'a Expr,
        tag: ThreadTag,
        body: &'a Stmt,
    ) {
        if min.as_int() != Some(0) {
            self.at(".min", |s| {
                s.err(format!(
                    "thread_binding loop `{}` ({tag}) must start at 0, found `{min}`",
                    var.name
                ))
            });
        }
        let starts_kernel = self.kernel.is_none();
        if starts_kernel {
            if let Some(outer) = self
                .loops
                .iter()
                .find(|k| matches!(k, ForKind::Parallel | ForKind::Vectorized))
            {
                let outer = outer.name();
                self.at(".kind", |s| {
                    s.err(format!(
                        "device kernel `{}` ({tag}) is nested inside a {outer} loop",
                        var.name
                    ))
                });
            }
            self.kernel = Some(KernelCtx {
                path: self.path.clone(),
                extents: HashMap::new(),
                outer: self.scope.keys().copied().collect(),
            });
        }
        // Nesting of tags.
        let same = self.thread_loops.iter().find(|(t, _)| *t == tag).copied();
        let inner_thread = self
            .thread_loops
            .iter()
            .find(|(t, _)| t.is_thread())
            .copied();
        let has_block = self.thread_loops.iter().any(|(t, _)| !t.is_thread());
        if let Some((_, outer)) = same {
            self.at(".kind", |s| {
                s.err(format!(
                    "{tag} loop `{}` is nested inside another {tag} loop `{outer}`",
                    var.name
                ))
            });
        } else if tag.is_thread() && !has_block {
            self.at(".kind", |s| {
                s.err(format!(
                    "{tag} loop `{}` is not inside a blockIdx loop",
                    var.name
                ))
            });
        } else if let (false, Some((t, outer))) = (tag.is_thread(), inner_thread) {
            self.at(".kind", |s| {
                s.err(format!(
                    "{tag} loop `{}` is nested inside the {t} loop `{outer}`",
                    var.name
                ))
            });
        }
        // Launch extents: variables from outside the kernel, one extent per tag.
        let inside: Vec<String> = {
            let k = self.kernel.as_ref().expect("set above");
            extent
                .free_uses()
                .vars
                .iter()
                .filter(|v| !k.outer.contains(&v.id))
                .map(|v| v.name.to_string())
                .collect()
        };
        if let Some(name) = inside.first() {
            self.at(".extent", |s| {
                s.err(format!(
                    "{tag} extent `{extent}` uses `{name}`, bound inside the kernel; launch extents may only use variables bound outside it"
                ))
            });
        }
        let path = format!("{}.extent", self.path);
        let k = self.kernel.as_mut().expect("set above");
        match k.extents.get(&tag) {
            Some((prev, p)) if *prev != extent => {
                let msg = format!(
                    "{tag} has extent `{extent}` here but `{prev}` at {p}; a tag has one extent in a kernel"
                );
                self.at(".extent", |s| s.err(msg));
            }
            Some(_) => {}
            None => {
                k.extents.insert(tag, (extent, path));
            }
        }
        self.bind(var);
        if tag.is_thread() {
            self.tainted.insert(var.id);
        }
        self.thread_loops.push((tag, &*var.name));
        self.loops.push(ForKind::ThreadBinding(tag));
        self.at(".body", |s| s.stmt(body));
        self.loops.pop();
        self.thread_loops.pop();
        self.scope.remove(&var.id);
        if starts_kernel {
            self.kernel = None;
            self.tainted.clear();
            self.kernel_locals.clear();
            self.divergent.clear();
        }
    }

    fn cond(&mut self, cond: &'a Expr, what: &str) {
        self.at(".cond", |s| {
            let t = s.expr(cond);
            if !t.is_bool() {
                s.err(format!("{what} condition must be bool, found {t}"));
            }
        });
    }

    /// Checks an expression and returns its type.
    fn expr(&mut self, e: &'a Expr) -> DataType {
        let t = if self.enter() {
            self.expr_inner(e)
        } else {
            e.dtype()
        };
        self.depth -= 1;
        t
    }

    fn expr_inner(&mut self, e: &'a Expr) -> DataType {
        match e {
            Expr::IntImm { dtype, value } => {
                if !dtype.is_int() && !dtype.is_bool() {
                    self.err(format!(
                        "integer constant {value} has non-integer type {dtype}"
                    ));
                } else if self.value_type(*dtype, "constant")
                    && *dtype != DataType::u64()
                    && wrap_int(*dtype, *value) != *value
                {
                    self.err(format!("constant {value} does not fit in {dtype}"));
                }
                *dtype
            }
            Expr::FloatImm { dtype, value } => {
                if !dtype.is_float() {
                    self.err(format!("float constant {value} has non-float type {dtype}"));
                } else {
                    self.value_type(*dtype, "constant");
                }
                *dtype
            }
            Expr::Var(v) => {
                match self.scope.get(&v.id) {
                    None if v.dtype.is_handle() => self.err(format!(
                        "`{}` is a buffer data pointer; read buffers with load",
                        v.name
                    )),
                    None if self.defined.contains(&v.id) => {
                        self.err(format!("variable `{}` is used outside its scope", v.name))
                    }
                    None => self.err(format!("undefined variable `{}`", v.name)),
                    Some(t) if *t != v.dtype => {
                        let t = *t;
                        self.err(format!(
                            "variable `{}` was bound as {t} but used as {}",
                            v.name, v.dtype
                        ))
                    }
                    Some(_) => {
                        self.value_type(v.dtype, &format!("variable `{}`", v.name));
                    }
                }
                v.dtype
            }
            Expr::Binary { op, a, b } => {
                let ta = self.at(".args[0]", |s| s.expr(a));
                let tb = self.at(".args[1]", |s| s.expr(b));
                if ta != tb {
                    self.err(format!(
                        "operands of `{}` have different types: {ta} and {tb}",
                        op.name()
                    ));
                } else if op.is_logical() {
                    if !ta.is_bool() {
                        self.err(format!("`{}` needs bool operands, found {ta}", op.name()));
                    }
                } else if op.is_bitwise() {
                    if !ta.is_int() {
                        self.err(format!(
                            "`{}` needs integer operands, found {ta}",
                            op.name()
                        ));
                    }
                } else if matches!(op, BinOp::Eq | BinOp::Ne) {
                    if !ta.is_numeric() && !ta.is_bool() {
                        self.err(format!(
                            "`{}` needs numbers or bools, found {ta}",
                            op.name()
                        ));
                    }
                } else if !ta.is_numeric() {
                    self.err(format!(
                        "`{}` needs numeric operands, found {ta}",
                        op.name()
                    ));
                }
                if op.is_comparison() {
                    DataType::bool()
                } else {
                    ta
                }
            }
            Expr::Not(a) => {
                let t = self.at(".args[0]", |s| s.expr(a));
                if !t.is_bool() {
                    self.err(format!("`not` needs a bool, found {t}"));
                }
                DataType::bool()
            }
            Expr::Select { cond, t, f } => {
                let tc = self.at(".args[0]", |s| s.expr(cond));
                let tt = self.at(".args[1]", |s| s.expr(t));
                let tf = self.at(".args[2]", |s| s.expr(f));
                if !tc.is_bool() {
                    self.at(".args[0]", |s| {
                        s.err(format!("select condition must be bool, found {tc}"))
                    });
                }
                if tt != tf {
                    self.err(format!("select arms have different types: {tt} and {tf}"));
                }
                tt
            }
            Expr::Cast {
                dtype,
                value,
                saturate,
            } => {
                let t = self.at(".args[0]", |s| s.expr(value));
                self.value_type(*dtype, "cast target");
                let float_to_int = t.is_float() && dtype.is_int();
                if !*saturate && !float_to_int {
                    self.at(".saturate", |s| {
                        s.err(format!(
                            "`\"saturate\": false` applies to a float → integer cast; this one \
                             converts {t} to {dtype}"
                        ))
                    });
                }
                *dtype
            }
            Expr::Load { buffer, indices } => {
                self.use_buffer(buffer, indices);
                buffer.dtype
            }
            Expr::Let { var, value, body } => {
                let t = self.at(".value", |s| s.expr(value));
                self.at(".var", |s| {
                    s.value_type(var.dtype, &format!("variable `{}`", var.name));
                    if t != var.dtype {
                        s.err(format!(
                            "`let {}: {}` is given a {t} value",
                            var.name, var.dtype
                        ));
                    }
                });
                self.bind(var);
                let tb = self.at(".body", |s| s.expr(body));
                self.scope.remove(&var.id);
                tb
            }
            Expr::Call { op, args } => {
                let types: Vec<DataType> = args
                    .iter()
                    .enumerate()
                    .map(|(i, a)| self.at(&format!(".args[{i}]"), |s| s.expr(a)))
                    .collect();
                if args.len() != op.arity() {
                    self.err(format!(
                        "`{}` takes {} argument(s), found {}",
                        op.name(),
                        op.arity(),
                        args.len()
                    ));
                }
                let t = types.first().copied().unwrap_or(DataType::f32());
                if types.iter().any(|x| *x != t) {
                    let list: Vec<String> = types.iter().map(|x| x.to_string()).collect();
                    self.err(format!(
                        "arguments of `{}` have different types: {}",
                        op.name(),
                        list.join(", ")
                    ));
                } else if op.is_integer() {
                    if !t.is_int() {
                        self.err(format!("`{}` needs an integer, found {t}", op.name()));
                    }
                } else if !(t.is_float() || (*op == Intrinsic::Abs && t.is_int())) {
                    let want = if *op == Intrinsic::Abs {
                        "a number"
                    } else {
                        "a float"
                    };
                    self.err(format!("`{}` needs {want}, found {t}", op.name()));
                }
                if op.is_predicate() {
                    DataType::bool()
                } else {
                    t
                }
            }
            Expr::IfThenElse { cond, t, f } => {
                let tc = self.at(".args[0]", |s| s.expr(cond));
                let tt = self.at(".args[1]", |s| s.expr(t));
                let tf = self.at(".args[2]", |s| s.expr(f));
                if !tc.is_bool() {
                    self.at(".args[0]", |s| {
                        s.err(format!("if_then_else condition must be bool, found {tc}"))
                    });
                }
                if tt != tf {
                    self.err(format!(
                        "if_then_else arms have different types: {tt} and {tf}"
                    ));
                }
                tt
            }
            Expr::Reinterpret { dtype, value } => {
                let t = self.at(".args[0]", |s| s.expr(value));
                if self.value_type(*dtype, "reinterpret target") {
                    if t.is_bool() || dtype.is_bool() {
                        self.err(format!(
                            "reinterpret needs numeric types, found {t} to {dtype}"
                        ));
                    } else if t.bits != dtype.bits {
                        self.err(format!(
                            "reinterpret needs types of one size, found {t} ({} bits) to {dtype} ({} bits)",
                            t.bits, dtype.bits
                        ));
                    }
                }
                *dtype
            }
            Expr::CallExtern {
                dtype,
                symbol,
                args,
            } => {
                if !is_c_identifier(symbol) {
                    self.at(".symbol", |s| {
                        s.err(format!(
                            "call_extern symbol `{symbol}` is not a C identifier ([A-Za-z_][A-Za-z0-9_]*)"
                        ))
                    });
                }
                let c_scalar = |t: DataType| {
                    t.is_bool()
                        || t.is_int()
                        || (t.is_float() && t.code == super::dtype::TypeCode::Float && t.bits >= 32)
                };
                if self.at(".dtype", |s| s.value_type(*dtype, "call_extern result"))
                    && !c_scalar(*dtype)
                {
                    self.at(".dtype", |s| {
                        s.err(format!(
                            "call_extern `{symbol}` returns {dtype}, which is not a C scalar type (bool, integers, float32, float64)"
                        ))
                    });
                }
                for (i, a) in args.iter().enumerate() {
                    self.at(&format!(".args[{i}]"), |s| {
                        let t = s.expr(a);
                        if !t.is_handle() && !c_scalar(t) {
                            s.err(format!(
                                "call_extern `{symbol}` argument has type {t}, which is not a C scalar type (bool, integers, float32, float64)"
                            ));
                        }
                    });
                }
                *dtype
            }
        }
    }
}
