//! The `kiln-ir/1` JSON format: reader and writer. `docs/ir.md` is the specification.
//!
//! The reader walks a `serde_json::Value` by hand so that every error names its JSON path
//! (`$.functions[0].body.stmts[2].value.args[1]`), unknown fields are rejected, and nesting is
//! bounded ([`MAX_DEPTH`] IR nodes; serde_json itself stops at 128 JSON levels), so no input can
//! overflow the stack. Variables and buffers are referred to by name and resolved lexically;
//! a binding may not reuse a name that is still in scope. The writer renames variables to
//! keep that rule (a shadowing `i` becomes `i_1`).

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::dtype::{DataType, TYPE_NAMES};
use super::error::{IrError, IrResult};
use super::expr::{BinOp, Expr, Intrinsic, Var};
use super::func::{Buffer, FuncAttrs, IRModule, Param, PrimFunc, StorageScope};
use super::printer::Namer;
use super::stmt::{ForKind, Stmt, ThreadTag};

/// The value of the `"format"` field.
pub const FORMAT: &str = "kiln-ir/1";

/// The deepest nesting of IR nodes (expressions inside statements inside ...) the reader accepts.
pub const MAX_DEPTH: usize = 128;

pub(crate) fn module_from_str(text: &str) -> IrResult<IRModule> {
    let value: Value = serde_json::from_str(text).map_err(|e| IrError::Syntax {
        message: if e.to_string().contains("recursion limit") {
            format!("{e} (JSON nesting is limited to 128 levels)")
        } else {
            e.to_string()
        },
    })?;
    module_from_value(&value)
}

pub(crate) fn module_from_value(value: &Value) -> IrResult<IRModule> {
    super::error::with_big_stack(|| read_module(value))
}

fn read_module(value: &Value) -> IrResult<IRModule> {
    let mut r = Reader::default();
    let m = r.object(value, "$", &["format", "functions"])?;
    let format = r.string(r.field(m, "format", "$")?, "$.format")?;
    if format != FORMAT {
        return Err(jerr(
            "$.format",
            format!("unsupported format `{format}`, expected `{FORMAT}`"),
        ));
    }
    let funcs = r.array(r.field(m, "functions", "$")?, "$.functions")?;
    let mut functions = Vec::with_capacity(funcs.len());
    for (i, f) in funcs.iter().enumerate() {
        r.vars.clear();
        r.buffers.clear();
        r.params_shape_vars.clear();
        functions.push(r.func(f, &format!("$.functions[{i}]"))?);
    }
    Ok(IRModule { functions })
}

fn jerr(path: &str, message: impl Into<String>) -> IrError {
    IrError::Json {
        path: path.to_string(),
        message: message.into(),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[derive(Default)]
struct Reader {
    vars: HashMap<String, Var>,
    /// Names of the variables defined by buffer parameter shapes/strides of this function.
    params_shape_vars: std::collections::HashSet<String>,
    buffers: HashMap<String, Buffer>,
    depth: usize,
}

impl Reader {
    fn object<'v>(
        &self,
        v: &'v Value,
        path: &str,
        allowed: &[&str],
    ) -> IrResult<&'v Map<String, Value>> {
        let m = v
            .as_object()
            .ok_or_else(|| jerr(path, format!("expected an object, found {}", kind_of(v))))?;
        for k in m.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(jerr(
                    &format!("{path}.{k}"),
                    format!(
                        "unknown field `{k}`, expected one of: {}",
                        allowed.join(", ")
                    ),
                ));
            }
        }
        Ok(m)
    }

    fn field<'v>(&self, m: &'v Map<String, Value>, key: &str, path: &str) -> IrResult<&'v Value> {
        m.get(key)
            .ok_or_else(|| jerr(path, format!("missing field `{key}`")))
    }

    fn string<'v>(&self, v: &'v Value, path: &str) -> IrResult<&'v str> {
        v.as_str()
            .ok_or_else(|| jerr(path, format!("expected a string, found {}", kind_of(v))))
    }

    fn array<'v>(&self, v: &'v Value, path: &str) -> IrResult<&'v Vec<Value>> {
        v.as_array()
            .ok_or_else(|| jerr(path, format!("expected an array, found {}", kind_of(v))))
    }

    fn dtype(&self, v: &Value, path: &str) -> IrResult<DataType> {
        let s = self.string(v, path)?;
        DataType::parse(s).ok_or_else(|| {
            jerr(
                path,
                format!("unknown data type `{s}`, expected one of: {TYPE_NAMES}"),
            )
        })
    }

    fn name(&self, v: &Value, path: &str) -> IrResult<String> {
        let s = self.string(v, path)?;
        if s.is_empty() {
            return Err(jerr(path, "names may not be empty"));
        }
        Ok(s.to_string())
    }

    /// Binds a new variable; its name may not be in scope already.
    fn bind_var(&mut self, name: String, dtype: DataType, path: &str) -> IrResult<Var> {
        if self.vars.contains_key(&name) {
            return Err(jerr(
                path,
                format!("variable `{name}` is already defined in this scope"),
            ));
        }
        let v = Var::new(&name, dtype);
        self.vars.insert(name, v.clone());
        Ok(v)
    }

    fn unbind_var(&mut self, v: &Var) {
        self.vars.remove(&*v.name);
    }

    fn var_decl(&mut self, v: &Value, path: &str) -> IrResult<Var> {
        let m = self.object(v, path, &["name", "dtype"])?;
        let name = self.name(self.field(m, "name", path)?, &format!("{path}.name"))?;
        let dtype = self.dtype(self.field(m, "dtype", path)?, &format!("{path}.dtype"))?;
        self.bind_var(name, dtype, path)
    }

    fn var_ref(&self, name: &str, path: &str) -> IrResult<Var> {
        self.vars.get(name).cloned().ok_or_else(|| {
            let mut known: Vec<&str> = self.vars.keys().map(String::as_str).collect();
            known.sort_unstable();
            jerr(
                path,
                format!(
                    "undefined variable `{name}` (in scope: {})",
                    known.join(", ")
                ),
            )
        })
    }

    fn func(&mut self, v: &Value, path: &str) -> IrResult<PrimFunc> {
        let m = self.object(v, path, &["name", "params", "ret_type", "attrs", "body"])?;
        let name = self.name(self.field(m, "name", path)?, &format!("{path}.name"))?;
        let mut params = Vec::new();
        let pp = format!("{path}.params");
        for (i, p) in self
            .array(self.field(m, "params", path)?, &pp)?
            .iter()
            .enumerate()
        {
            params.push(self.param(p, &format!("{pp}[{i}]"))?);
        }
        let ret_type = match m.get("ret_type") {
            None | Some(Value::Null) => None,
            Some(t) => Some(self.dtype(t, &format!("{path}.ret_type"))?),
        };
        let attrs = match m.get("attrs") {
            None => FuncAttrs {
                global_symbol: Some(name.clone()),
                noalias: false,
                entry: false,
                host: false,
            },
            Some(a) => self.attrs(a, &format!("{path}.attrs"))?,
        };
        let body = self.stmt(self.field(m, "body", path)?, &format!("{path}.body"))?;
        Ok(PrimFunc {
            name,
            params,
            body,
            ret_type,
            attrs,
        })
    }

    fn attrs(&self, v: &Value, path: &str) -> IrResult<FuncAttrs> {
        let m = self.object(v, path, &["global_symbol", "noalias", "entry", "host"])?;
        let global_symbol = match m.get("global_symbol") {
            None | Some(Value::Null) => None,
            Some(s) => Some(self.name(s, &format!("{path}.global_symbol"))?),
        };
        let flag = |key: &str| -> IrResult<bool> {
            match m.get(key) {
                None => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(other) => Err(jerr(
                    &format!("{path}.{key}"),
                    format!("expected a boolean, found {}", kind_of(other)),
                )),
            }
        };
        Ok(FuncAttrs {
            global_symbol,
            noalias: flag("noalias")?,
            entry: flag("entry")?,
            host: flag("host")?,
        })
    }

    fn param(&mut self, v: &Value, path: &str) -> IrResult<Param> {
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
        match kind {
            "scalar" => {
                let m = self.object(v, path, &["kind", "name", "dtype"])?;
                let name = self.name(self.field(m, "name", path)?, &format!("{path}.name"))?;
                let dtype = self.dtype(self.field(m, "dtype", path)?, &format!("{path}.dtype"))?;
                // A shape variable of an earlier buffer parameter may also be passed as a
                // scalar (the caller checks that the values agree).
                if let Some(v) = self.vars.get(&name) {
                    if self.params_shape_vars.contains(&name) && v.dtype == dtype {
                        return Ok(Param::Scalar(v.clone()));
                    }
                }
                Ok(Param::Scalar(self.bind_var(name, dtype, path)?))
            }
            "buffer" => Ok(Param::Buffer(self.buffer_decl(v, path, true)?)),
            _ => Err(jerr(
                &format!("{path}.kind"),
                format!(
                    "expected `\"kind\": \"buffer\"` or `\"kind\": \"scalar\"`, found {}",
                    match v.get("kind") {
                        Some(k) => k.to_string(),
                        None => "nothing".into(),
                    }
                ),
            )),
        }
    }

    fn buffer_decl(&mut self, v: &Value, path: &str, is_param: bool) -> IrResult<Buffer> {
        let allowed: &[&str] = if is_param {
            &["kind", "name", "dtype", "shape", "strides", "scope"]
        } else {
            &["name", "dtype", "shape", "strides", "scope"]
        };
        let m = self.object(v, path, allowed)?;
        let name = self.name(self.field(m, "name", path)?, &format!("{path}.name"))?;
        if self.buffers.contains_key(&name) {
            return Err(jerr(
                &format!("{path}.name"),
                format!("buffer `{name}` is already defined in this scope"),
            ));
        }
        let dtype = self.dtype(self.field(m, "dtype", path)?, &format!("{path}.dtype"))?;
        let sp = format!("{path}.shape");
        let mut shape = Vec::new();
        for (i, d) in self
            .array(self.field(m, "shape", path)?, &sp)?
            .iter()
            .enumerate()
        {
            shape.push(self.dim(d, &format!("{sp}[{i}]"), is_param)?);
        }
        let strides = match m.get("strides") {
            None | Some(Value::Null) => None,
            Some(s) => {
                let sp = format!("{path}.strides");
                let mut out = Vec::new();
                for (i, d) in self.array(s, &sp)?.iter().enumerate() {
                    out.push(self.dim(d, &format!("{sp}[{i}]"), is_param)?);
                }
                Some(out)
            }
        };
        let scope = match m.get("scope") {
            None => StorageScope::Global,
            Some(s) => {
                let sp = format!("{path}.scope");
                let s = self.string(s, &sp)?;
                StorageScope::from_name(s).ok_or_else(|| {
                    jerr(
                        &sp,
                        format!("unknown scope `{s}`, expected one of: global, local, workspace"),
                    )
                })?
            }
        };
        let b = Buffer {
            name: name.clone(),
            dtype,
            shape,
            strides,
            data: Var::new(&name, DataType::handle()),
            scope,
        };
        self.buffers.insert(name, b.clone());
        Ok(b)
    }

    /// A shape or stride entry. In parameters, an unknown variable name defines the variable.
    fn dim(&mut self, v: &Value, path: &str, is_param: bool) -> IrResult<Expr> {
        match v {
            Value::Number(n) => match n.as_i64() {
                Some(k) => Ok(Expr::IntImm {
                    dtype: DataType::i64(),
                    value: k,
                }),
                None => Err(jerr(path, format!("expected an integer, found {n}"))),
            },
            Value::String(s) => self.dim_var(s, None, path, is_param),
            Value::Object(m) if m.contains_key("var") => {
                let m = self.object(v, path, &["var", "dtype"])?;
                let name = self.name(self.field(m, "var", path)?, &format!("{path}.var"))?;
                let dtype = match m.get("dtype") {
                    Some(t) => Some(self.dtype(t, &format!("{path}.dtype"))?),
                    None => None,
                };
                self.dim_var(&name, dtype, path, is_param)
            }
            _ => self.expr(v, path),
        }
    }

    fn dim_var(
        &mut self,
        name: &str,
        dtype: Option<DataType>,
        path: &str,
        is_param: bool,
    ) -> IrResult<Expr> {
        if let Some(v) = self.vars.get(name) {
            if let Some(t) = dtype {
                if t != v.dtype {
                    return Err(jerr(
                        path,
                        format!("variable `{name}` has type {}, not {t}", v.dtype),
                    ));
                }
            }
            return Ok(Expr::Var(v.clone()));
        }
        if !is_param {
            return self.var_ref(name, path).map(Expr::Var);
        }
        let v = self.bind_var(name.to_string(), dtype.unwrap_or(DataType::i64()), path)?;
        self.params_shape_vars.insert(name.to_string());
        Ok(Expr::Var(v))
    }

    fn enter(&mut self, path: &str) -> IrResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(jerr(
                path,
                format!("IR nested deeper than {MAX_DEPTH} nodes"),
            ));
        }
        Ok(())
    }

    fn stmt(&mut self, v: &Value, path: &str) -> IrResult<Stmt> {
        self.enter(path)?;
        let r = self.stmt_inner(v, path);
        self.depth -= 1;
        r
    }

    fn stmt_inner(&mut self, v: &Value, path: &str) -> IrResult<Stmt> {
        let kind = match v.get("stmt") {
            Some(Value::String(s)) => s.as_str(),
            _ if !v.is_object() => {
                return Err(jerr(
                    path,
                    format!("expected a statement object, found {}", kind_of(v)),
                ))
            }
            _ => {
                return Err(jerr(
                    path,
                    "expected a `stmt` field naming the statement kind",
                ))
            }
        };
        let p = |k: &str| format!("{path}.{k}");
        match kind {
            "for" => {
                let m = self.object(v, path, &["stmt", "var", "min", "extent", "kind", "thread", "body"])?;
                let min = self.expr(self.field(m, "min", path)?, &p("min"))?;
                let extent = self.expr(self.field(m, "extent", path)?, &p("extent"))?;
                let ks = self.string(self.field(m, "kind", path)?, &p("kind"))?;
                let kind = if ks == "thread_binding" {
                    let ts = self.string(self.field(m, "thread", path)?, &p("thread"))?;
                    let tag = ThreadTag::from_name(ts).ok_or_else(|| {
                        jerr(&p("thread"), format!("unknown thread `{ts}`, expected one of: blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z"))
                    })?;
                    ForKind::ThreadBinding(tag)
                } else {
                    if m.contains_key("thread") {
                        return Err(jerr(&p("thread"), format!("`thread` is only allowed on a `thread_binding` loop, this one is `{ks}`")));
                    }
                    ForKind::from_name(ks).ok_or_else(|| {
                        jerr(&p("kind"), format!("unknown loop kind `{ks}`, expected one of: serial, parallel, vectorized, unrolled, thread_binding"))
                    })?
                };
                let var = self.var_decl(self.field(m, "var", path)?, &p("var"))?;
                let body = self.stmt(self.field(m, "body", path)?, &p("body"));
                self.unbind_var(&var);
                Ok(Stmt::For { var, min, extent, kind, body: Box::new(body?) })
            }
            "store" => {
                let m = self.object(v, path, &["stmt", "buffer", "indices", "value"])?;
                let buffer = self.buffer_ref(self.field(m, "buffer", path)?, &p("buffer"))?;
                let indices = self.exprs(self.field(m, "indices", path)?, &p("indices"))?;
                let value = self.expr(self.field(m, "value", path)?, &p("value"))?;
                Ok(Stmt::Store { buffer, indices, value })
            }
            "allocate" => {
                let m = self.object(v, path, &["stmt", "buffer", "body"])?;
                let buffer = self.buffer_decl(self.field(m, "buffer", path)?, &p("buffer"), false)?;
                let body = self.stmt(self.field(m, "body", path)?, &p("body"));
                self.buffers.remove(&buffer.name);
                Ok(Stmt::Allocate { buffer, body: Box::new(body?) })
            }
            "let" => {
                let m = self.object(v, path, &["stmt", "var", "value", "body"])?;
                let value = self.expr(self.field(m, "value", path)?, &p("value"))?;
                let var = self.var_decl(self.field(m, "var", path)?, &p("var"))?;
                let body = self.stmt(self.field(m, "body", path)?, &p("body"));
                self.unbind_var(&var);
                Ok(Stmt::Let { var, value, body: Box::new(body?) })
            }
            "if" => {
                let m = self.object(v, path, &["stmt", "cond", "then", "else"])?;
                let cond = self.expr(self.field(m, "cond", path)?, &p("cond"))?;
                let then_case = Box::new(self.stmt(self.field(m, "then", path)?, &p("then"))?);
                let else_case = match m.get("else") {
                    None | Some(Value::Null) => None,
                    Some(e) => Some(Box::new(self.stmt(e, &p("else"))?)),
                };
                Ok(Stmt::IfThenElse { cond, then_case, else_case })
            }
            "while" => {
                let m = self.object(v, path, &["stmt", "cond", "body"])?;
                let cond = self.expr(self.field(m, "cond", path)?, &p("cond"))?;
                let body = Box::new(self.stmt(self.field(m, "body", path)?, &p("body"))?);
                Ok(Stmt::While { cond, body })
            }
            "seq" => {
                let m = self.object(v, path, &["stmt", "stmts"])?;
                let sp = p("stmts");
                let items = self.array(self.field(m, "stmts", path)?, &sp)?;
                let mut out = Vec::with_capacity(items.len());
                for (i, s) in items.iter().enumerate() {
                    out.push(self.stmt(s, &format!("{sp}[{i}]"))?);
                }
                Ok(Stmt::Seq(out))
            }
            "evaluate" => {
                let m = self.object(v, path, &["stmt", "value"])?;
                Ok(Stmt::Evaluate(self.expr(self.field(m, "value", path)?, &p("value"))?))
            }
            "assert" => {
                let m = self.object(v, path, &["stmt", "cond", "message"])?;
                let cond = self.expr(self.field(m, "cond", path)?, &p("cond"))?;
                let message = self.string(self.field(m, "message", path)?, &p("message"))?.to_string();
                Ok(Stmt::Assert { cond, message })
            }
            "barrier" => {
                self.object(v, path, &["stmt"])?;
                Ok(Stmt::Barrier)
            }
            "prefetch" => {
                let m = self.object(v, path, &["stmt", "buffer", "indices"])?;
                let buffer = self.buffer_ref(self.field(m, "buffer", path)?, &p("buffer"))?;
                let indices = self.exprs(self.field(m, "indices", path)?, &p("indices"))?;
                Ok(Stmt::Prefetch { buffer, indices })
            }
            "return" => {
                let m = self.object(v, path, &["stmt", "value"])?;
                Ok(Stmt::Return(self.expr(self.field(m, "value", path)?, &p("value"))?))
            }
            other => Err(jerr(
                &p("stmt"),
                format!("unknown statement `{other}`, expected one of: for, while, store, allocate, let, if, seq, evaluate, assert, return, barrier, prefetch"),
            )),
        }
    }

    fn buffer_ref(&self, v: &Value, path: &str) -> IrResult<Buffer> {
        let name = self.string(v, path)?;
        self.buffers.get(name).cloned().ok_or_else(|| {
            let mut known: Vec<&str> = self.buffers.keys().map(String::as_str).collect();
            known.sort_unstable();
            jerr(
                path,
                format!("undefined buffer `{name}` (in scope: {})", known.join(", ")),
            )
        })
    }

    fn exprs(&mut self, v: &Value, path: &str) -> IrResult<Vec<Expr>> {
        let items = self.array(v, path)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, e) in items.iter().enumerate() {
            out.push(self.expr(e, &format!("{path}[{i}]"))?);
        }
        Ok(out)
    }

    fn expr(&mut self, v: &Value, path: &str) -> IrResult<Expr> {
        self.enter(path)?;
        let r = self.expr_inner(v, path);
        self.depth -= 1;
        r
    }

    fn expr_inner(&mut self, v: &Value, path: &str) -> IrResult<Expr> {
        let Some(obj) = v.as_object() else {
            return Err(jerr(
                path,
                format!("expected an expression object, found {}", kind_of(v)),
            ));
        };
        let p = |k: &str| format!("{path}.{k}");
        let op = match obj.get("op") {
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                let found = kind_of(other);
                return Err(jerr(
                    &p("op"),
                    format!("expected an operator name, found {found}"),
                ));
            }
            None if obj.contains_key("const") => {
                let m = self.object(v, path, &["const", "dtype"])?;
                let dtype = self.dtype(self.field(m, "dtype", path)?, &p("dtype"))?;
                return constant(m.get("const").unwrap_or(&Value::Null), dtype, &p("const"));
            }
            None if obj.contains_key("var") => {
                let m = self.object(v, path, &["var"])?;
                let name = self.string(self.field(m, "var", path)?, &p("var"))?;
                return self.var_ref(name, &p("var")).map(Expr::Var);
            }
            None => {
                let msg = "expected an expression: an object with `op`, `const` or `var`";
                return Err(jerr(path, msg));
            }
        };
        match op {
            "load" => {
                let m = self.object(v, path, &["op", "buffer", "indices"])?;
                let buffer = self.buffer_ref(self.field(m, "buffer", path)?, &p("buffer"))?;
                let indices = self.exprs(self.field(m, "indices", path)?, &p("indices"))?;
                Ok(Expr::Load { buffer, indices })
            }
            "let" => {
                let m = self.object(v, path, &["op", "var", "value", "body"])?;
                let value = self.expr(self.field(m, "value", path)?, &p("value"))?;
                let var = self.var_decl(self.field(m, "var", path)?, &p("var"))?;
                let body = self.expr(self.field(m, "body", path)?, &p("body"));
                self.unbind_var(&var);
                Ok(Expr::Let {
                    var,
                    value: Box::new(value),
                    body: Box::new(body?),
                })
            }
            "cast" => {
                let m = self.object(v, path, &["op", "dtype", "args", "saturate"])?;
                let dtype = self.dtype(self.field(m, "dtype", path)?, &p("dtype"))?;
                let saturate = match m.get("saturate") {
                    None => true,
                    Some(Value::Bool(b)) => *b,
                    Some(other) => {
                        return Err(jerr(
                            &p("saturate"),
                            format!("expected a boolean, found {}", kind_of(other)),
                        ))
                    }
                };
                let [value] = self.args::<1>(m, op, path)?;
                Ok(Expr::Cast {
                    dtype,
                    value: Box::new(value),
                    saturate,
                })
            }
            "not" => {
                let m = self.object(v, path, &["op", "args"])?;
                let [a] = self.args::<1>(m, op, path)?;
                Ok(Expr::Not(Box::new(a)))
            }
            "select" => {
                let m = self.object(v, path, &["op", "args"])?;
                let [c, t, f] = self.args::<3>(m, op, path)?;
                Ok(Expr::Select {
                    cond: Box::new(c),
                    t: Box::new(t),
                    f: Box::new(f),
                })
            }
            "if_then_else" => {
                let m = self.object(v, path, &["op", "args"])?;
                let [c, t, f] = self.args::<3>(m, op, path)?;
                Ok(Expr::IfThenElse {
                    cond: Box::new(c),
                    t: Box::new(t),
                    f: Box::new(f),
                })
            }
            "reinterpret" => {
                let m = self.object(v, path, &["op", "dtype", "args"])?;
                let dtype = self.dtype(self.field(m, "dtype", path)?, &p("dtype"))?;
                let [value] = self.args::<1>(m, op, path)?;
                Ok(Expr::Reinterpret {
                    dtype,
                    value: Box::new(value),
                })
            }
            "call_extern" => {
                let m = self.object(v, path, &["op", "symbol", "dtype", "args"])?;
                let symbol = self.string(self.field(m, "symbol", path)?, &p("symbol"))?;
                let dtype = self.dtype(self.field(m, "dtype", path)?, &p("dtype"))?;
                let args = self.exprs(self.field(m, "args", path)?, &p("args"))?;
                Ok(Expr::CallExtern {
                    dtype,
                    symbol: symbol.into(),
                    args,
                })
            }
            _ => {
                let m = self.object(v, path, &["op", "args"])?;
                if let Some(bop) = BinOp::from_name(op) {
                    let [a, b] = self.args::<2>(m, op, path)?;
                    return Ok(Expr::Binary {
                        op: bop,
                        a: Box::new(a),
                        b: Box::new(b),
                    });
                }
                if let Some(iop) = Intrinsic::from_name(op) {
                    let ap = p("args");
                    let args = self.exprs(self.field(m, "args", path)?, &ap)?;
                    if args.len() != iop.arity() {
                        return Err(jerr(
                            &ap,
                            format!(
                                "`{op}` takes {} argument(s), found {}",
                                iop.arity(),
                                args.len()
                            ),
                        ));
                    }
                    return Ok(Expr::Call { op: iop, args });
                }
                let mut names: Vec<&str> = vec![
                    "load",
                    "let",
                    "cast",
                    "not",
                    "select",
                    "if_then_else",
                    "reinterpret",
                    "call_extern",
                ];
                names.extend(BinOp::ALL.iter().map(|o| o.name()));
                names.extend(Intrinsic::ALL.iter().map(|o| o.name()));
                Err(jerr(
                    &p("op"),
                    format!(
                        "unknown operator `{op}`, expected one of: {}",
                        names.join(", ")
                    ),
                ))
            }
        }
    }

    fn args<const N: usize>(
        &mut self,
        m: &Map<String, Value>,
        op: &str,
        path: &str,
    ) -> IrResult<[Expr; N]> {
        let ap = format!("{path}.args");
        let args = self.exprs(self.field(m, "args", path)?, &ap)?;
        let n = args.len();
        args.try_into()
            .map_err(|_| jerr(&ap, format!("`{op}` takes {N} argument(s), found {n}")))
    }
}

fn constant(v: &Value, dtype: DataType, path: &str) -> IrResult<Expr> {
    if dtype.is_bool() {
        return match v {
            Value::Bool(b) => Ok(Expr::IntImm {
                dtype,
                value: *b as i64,
            }),
            other => Err(jerr(
                path,
                format!("a bool constant is `true` or `false`, found {other}"),
            )),
        };
    }
    if dtype.is_int() {
        if let Some(k) = v.as_i64() {
            return Ok(Expr::IntImm { dtype, value: k });
        }
        if let (Some(k), true) = (v.as_u64(), dtype == DataType::u64()) {
            return Ok(Expr::IntImm {
                dtype,
                value: k as i64,
            });
        }
        return Err(jerr(
            path,
            format!("expected an integer for a {dtype} constant, found {v}"),
        ));
    }
    if dtype.is_float() {
        let value = match v {
            Value::Number(n) => n.as_f64().ok_or_else(|| jerr(path, format!("bad number {n}")))?,
            Value::String(s) if s == "inf" => f64::INFINITY,
            Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
            Value::String(s) if s == "nan" => f64::NAN,
            other => {
                return Err(jerr(path, format!("expected a number, \"inf\", \"-inf\" or \"nan\" for a {dtype} constant, found {other}")))
            }
        };
        return Ok(Expr::FloatImm { dtype, value });
    }
    Err(jerr(
        path,
        format!("constants of type {dtype} do not exist"),
    ))
}

// ---------------------------------------------------------------- writer

pub(crate) fn module_to_value(m: &IRModule) -> Value {
    let funcs: Vec<Value> = m.functions.iter().map(func_to_value).collect();
    json!({ "format": FORMAT, "functions": funcs })
}

struct Writer {
    namer: Namer,
}

fn func_to_value(f: &PrimFunc) -> Value {
    let mut w = Writer {
        namer: Namer::default(),
    };
    let params: Vec<Value> = f
        .params
        .iter()
        .map(|p| match p {
            Param::Scalar(v) => {
                let n = w.namer.bind(v);
                json!({"kind": "scalar", "name": n, "dtype": v.dtype.to_string()})
            }
            Param::Buffer(b) => {
                let mut o = w.buffer(b, true);
                let mut out = Map::new();
                out.insert("kind".into(), json!("buffer"));
                out.append(&mut o);
                Value::Object(out)
            }
        })
        .collect();
    let mut o = Map::new();
    o.insert("name".into(), json!(f.name));
    o.insert("params".into(), Value::Array(params));
    if let Some(t) = f.ret_type {
        o.insert("ret_type".into(), json!(t.to_string()));
    }
    let a = &f.attrs;
    let mut attrs = Map::new();
    attrs.insert(
        "global_symbol".into(),
        a.global_symbol.as_ref().map_or(Value::Null, |s| json!(s)),
    );
    if a.noalias {
        attrs.insert("noalias".into(), json!(true));
    }
    if a.entry {
        attrs.insert("entry".into(), json!(true));
    }
    if a.host {
        attrs.insert("host".into(), json!(true));
    }
    o.insert("attrs".into(), Value::Object(attrs));
    o.insert("body".into(), w.stmt(&f.body));
    Value::Object(o)
}

impl Writer {
    fn buffer(&mut self, b: &Buffer, is_param: bool) -> Map<String, Value> {
        let mut o = Map::new();
        o.insert("name".into(), json!(b.name));
        o.insert("dtype".into(), json!(b.dtype.to_string()));
        let shape: Vec<Value> = b.shape.iter().map(|d| self.dim(d, is_param)).collect();
        o.insert("shape".into(), Value::Array(shape));
        if let Some(s) = &b.strides {
            let strides: Vec<Value> = s.iter().map(|d| self.dim(d, is_param)).collect();
            o.insert("strides".into(), Value::Array(strides));
        }
        if b.scope != StorageScope::Global || !is_param {
            o.insert("scope".into(), json!(b.scope.name()));
        }
        o
    }

    fn dim(&mut self, d: &Expr, is_param: bool) -> Value {
        match d {
            Expr::IntImm { dtype, value } if *dtype == DataType::i64() => json!(value),
            Expr::Var(v) => {
                if is_param && !self.namer.is_bound(v) {
                    let n = self.namer.bind(v);
                    if v.dtype == DataType::i64() {
                        json!(n)
                    } else {
                        json!({"var": n, "dtype": v.dtype.to_string()})
                    }
                } else {
                    json!(self.namer.name(v))
                }
            }
            other => self.expr(other),
        }
    }

    fn var_decl(&mut self, v: &Var) -> Value {
        let n = self.namer.bind(v);
        json!({"name": n, "dtype": v.dtype.to_string()})
    }

    fn stmt(&mut self, s: &Stmt) -> Value {
        match s {
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => {
                let min = self.expr(min);
                let extent = self.expr(extent);
                let mark = self.namer.mark();
                let var = self.var_decl(var);
                let body = self.stmt(body);
                self.namer.restore(mark);
                match kind {
                    ForKind::ThreadBinding(tag) => {
                        json!({"stmt": "for", "var": var, "min": min, "extent": extent, "kind": kind.name(), "thread": tag.name(), "body": body})
                    }
                    _ => {
                        json!({"stmt": "for", "var": var, "min": min, "extent": extent, "kind": kind.name(), "body": body})
                    }
                }
            }
            Stmt::Store {
                buffer,
                indices,
                value,
            } => {
                let indices: Vec<Value> = indices.iter().map(|e| self.expr(e)).collect();
                json!({"stmt": "store", "buffer": buffer.name, "indices": indices, "value": self.expr(value)})
            }
            Stmt::Allocate { buffer, body } => {
                let b = Value::Object(self.buffer(buffer, false));
                json!({"stmt": "allocate", "buffer": b, "body": self.stmt(body)})
            }
            Stmt::Let { var, value, body } => {
                let value = self.expr(value);
                let mark = self.namer.mark();
                let var = self.var_decl(var);
                let body = self.stmt(body);
                self.namer.restore(mark);
                json!({"stmt": "let", "var": var, "value": value, "body": body})
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                let mut o = Map::new();
                o.insert("stmt".into(), json!("if"));
                o.insert("cond".into(), self.expr(cond));
                o.insert("then".into(), self.stmt(then_case));
                if let Some(e) = else_case {
                    o.insert("else".into(), self.stmt(e));
                }
                Value::Object(o)
            }
            Stmt::While { cond, body } => {
                json!({"stmt": "while", "cond": self.expr(cond), "body": self.stmt(body)})
            }
            Stmt::Seq(v) => {
                let stmts: Vec<Value> = v.iter().map(|s| self.stmt(s)).collect();
                json!({"stmt": "seq", "stmts": stmts})
            }
            Stmt::Evaluate(e) => json!({"stmt": "evaluate", "value": self.expr(e)}),
            Stmt::Assert { cond, message } => {
                json!({"stmt": "assert", "cond": self.expr(cond), "message": message})
            }
            Stmt::Return(e) => json!({"stmt": "return", "value": self.expr(e)}),
            Stmt::Barrier => json!({"stmt": "barrier"}),
            Stmt::Prefetch { buffer, indices } => {
                let indices: Vec<Value> = indices.iter().map(|e| self.expr(e)).collect();
                json!({"stmt": "prefetch", "buffer": buffer.name, "indices": indices})
            }
        }
    }

    // The recursion keeps a small frame (children first, then one out-of-line call that builds
    // the node), so that the deepest module the reader accepts ([`MAX_DEPTH`]) is written on a
    // thread's default 2 MiB stack even in a debug build; building each node's JSON inline made
    // a frame of ~17 KiB.
    fn expr(&mut self, e: &Expr) -> Value {
        let args: Vec<Value> = match e {
            Expr::IntImm { .. } | Expr::FloatImm { .. } | Expr::Var(_) => return self.leaf(e),
            Expr::Let { var, value, body } => {
                let value = self.expr(value);
                let mark = self.namer.mark();
                let var = self.var_decl(var);
                let body = self.expr(body);
                self.namer.restore(mark);
                return Self::let_node(var, value, body);
            }
            Expr::Binary { a, b, .. } => vec![self.expr(a), self.expr(b)],
            Expr::Not(a) => vec![self.expr(a)],
            Expr::Select { cond, t, f } | Expr::IfThenElse { cond, t, f } => {
                vec![self.expr(cond), self.expr(t), self.expr(f)]
            }
            Expr::Cast { value, .. } | Expr::Reinterpret { value, .. } => vec![self.expr(value)],
            Expr::Load { indices: v, .. }
            | Expr::Call { args: v, .. }
            | Expr::CallExtern { args: v, .. } => v.iter().map(|e| self.expr(e)).collect(),
        };
        Self::node(e, args)
    }

    #[inline(never)]
    fn leaf(&mut self, e: &Expr) -> Value {
        match e {
            Expr::IntImm { dtype, value } => {
                if dtype.is_bool() {
                    json!({"const": *value != 0, "dtype": "bool"})
                } else if *dtype == DataType::u64() {
                    json!({"const": *value as u64, "dtype": "uint64"})
                } else {
                    json!({"const": value, "dtype": dtype.to_string()})
                }
            }
            Expr::FloatImm { dtype, value } => {
                let c = if value.is_nan() {
                    json!("nan")
                } else if value.is_infinite() {
                    json!(if *value > 0.0 { "inf" } else { "-inf" })
                } else {
                    json!(value)
                };
                json!({"const": c, "dtype": dtype.to_string()})
            }
            Expr::Var(v) => json!({"var": self.namer.name(v)}),
            _ => unreachable!("only leaves reach `leaf`"),
        }
    }

    #[inline(never)]
    fn let_node(var: Value, value: Value, body: Value) -> Value {
        json!({"op": "let", "var": var, "value": value, "body": body})
    }

    /// An interior node, its operands already written (`args`).
    #[inline(never)]
    fn node(e: &Expr, args: Vec<Value>) -> Value {
        match e {
            Expr::Binary { op, .. } => json!({"op": op.name(), "args": args}),
            Expr::Not(_) => json!({"op": "not", "args": args}),
            Expr::Select { .. } => json!({"op": "select", "args": args}),
            Expr::IfThenElse { .. } => json!({"op": "if_then_else", "args": args}),
            Expr::Cast {
                dtype,
                saturate: true,
                ..
            } => json!({"op": "cast", "dtype": dtype.to_string(), "args": args}),
            Expr::Cast { dtype, .. } => {
                json!({"op": "cast", "dtype": dtype.to_string(), "saturate": false, "args": args})
            }
            Expr::Reinterpret { dtype, .. } => {
                json!({"op": "reinterpret", "dtype": dtype.to_string(), "args": args})
            }
            Expr::Load { buffer, .. } => {
                json!({"op": "load", "buffer": buffer.name, "indices": args})
            }
            Expr::Call { op, .. } => json!({"op": op.name(), "args": args}),
            Expr::CallExtern { dtype, symbol, .. } => {
                json!({"op": "call_extern", "symbol": &**symbol, "dtype": dtype.to_string(), "args": args})
            }
            Expr::IntImm { .. } | Expr::FloatImm { .. } | Expr::Var(_) | Expr::Let { .. } => {
                unreachable!("leaves and `let` are written by `expr`")
            }
        }
    }
}
