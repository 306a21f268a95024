//! The text form: what `Display` prints for modules, functions, statements and expressions.
//!
//! It reads like a small imperative language (`for i: int64 in serial(0i64, n) { C[i] = A[i] + B[i] }`).
//! Integer constants are bare for `int32` and carry a suffix otherwise (`5i64`, `3u8`); floats
//! always carry one (`1.5f32`, `float32(inf)`). `/` and `%` are the truncating forms.
//! Variables that would be ambiguous (a binding shadowing another variable of the same name)
//! are printed with a `_1`, `_2`, ... suffix, the same renaming the JSON writer applies.

use std::collections::HashMap;
use std::fmt::{self, Write};

use super::dtype::DataType;
use super::expr::{BinOp, Expr, Var, VarId};
use super::func::{Buffer, IRModule, Param, PrimFunc, StorageScope};
use super::stmt::{ForKind, Stmt};

/// Gives each variable a name that is unambiguous in its scope.
#[derive(Default)]
pub(crate) struct Namer {
    names: HashMap<VarId, String>,
    in_scope: HashMap<String, VarId>,
    undo: Vec<(String, Option<VarId>)>,
}

impl Namer {
    /// Binds `v`, returning the name to use for it in its scope.
    pub(crate) fn bind(&mut self, v: &Var) -> String {
        let base: &str = &v.name;
        let mut name = base.to_string();
        let mut n = 0;
        while matches!(self.in_scope.get(&name), Some(id) if *id != v.id) {
            n += 1;
            name = format!("{base}_{n}");
        }
        let prev = self.in_scope.insert(name.clone(), v.id);
        self.undo.push((name.clone(), prev));
        self.names.insert(v.id, name.clone());
        name
    }

    /// A mark to [`Namer::restore`] to at the end of a scope.
    pub(crate) fn mark(&self) -> usize {
        self.undo.len()
    }

    /// Ends the scopes opened since `mark`.
    pub(crate) fn restore(&mut self, mark: usize) {
        while self.undo.len() > mark {
            if let Some((name, prev)) = self.undo.pop() {
                match prev {
                    Some(id) => self.in_scope.insert(name, id),
                    None => self.in_scope.remove(&name),
                };
            }
        }
    }

    /// The name of a variable (its own name if it was never bound).
    pub(crate) fn name(&self, v: &Var) -> String {
        self.names
            .get(&v.id)
            .cloned()
            .unwrap_or_else(|| v.name.to_string())
    }

    /// Whether `v` is bound in the current scope.
    pub(crate) fn is_bound(&self, v: &Var) -> bool {
        self.names
            .get(&v.id)
            .is_some_and(|n| self.in_scope.get(n) == Some(&v.id))
    }
}

fn type_suffix(t: DataType) -> String {
    match t.to_string().as_str() {
        "float16" => "f16".into(),
        "bfloat16" => "bf16".into(),
        "float32" => "f32".into(),
        "float64" => "f64".into(),
        s => s.replace("uint", "u").replace("int", "i"),
    }
}

fn prec(e: &Expr) -> u8 {
    match e {
        Expr::Binary { op, .. } => match op {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 3,
            BinOp::Add | BinOp::Sub => 4,
            BinOp::Mul | BinOp::Div | BinOp::Mod => 5,
            _ => 7,
        },
        Expr::Not(_) => 6,
        Expr::IntImm { value, .. } if *value < 0 => 6,
        Expr::FloatImm { value, .. } if *value < 0.0 => 6,
        _ => 7,
    }
}

fn infix(op: BinOp) -> Option<&'static str> {
    Some(match op {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::Mod => "%",
        BinOp::Eq => "==",
        BinOp::Ne => "!=",
        BinOp::Lt => "<",
        BinOp::Le => "<=",
        BinOp::Gt => ">",
        BinOp::Ge => ">=",
        BinOp::And => "&&",
        BinOp::Or => "||",
        _ => return None,
    })
}

/// Writes IR as text.
pub(crate) struct Printer<'a> {
    out: &'a mut dyn Write,
    namer: Namer,
    indent: usize,
}

impl<'a> Printer<'a> {
    pub(crate) fn new(out: &'a mut dyn Write) -> Printer<'a> {
        Printer {
            out,
            namer: Namer::default(),
            indent: 0,
        }
    }

    pub(crate) fn int(&mut self, dtype: DataType, value: i64) -> fmt::Result {
        if dtype.is_bool() {
            return write!(self.out, "{}", value != 0);
        }
        if dtype == DataType::u64() {
            write!(self.out, "{}", value as u64)?;
        } else {
            write!(self.out, "{value}")?;
        }
        if dtype != DataType::i32() {
            write!(self.out, "{}", type_suffix(dtype))?;
        }
        Ok(())
    }

    /// `e` printed on its own (the value of a `let`, printed before its name is bound).
    fn render(&mut self, e: &Expr) -> Result<String, fmt::Error> {
        let mut text = String::new();
        let mut p = Printer {
            out: &mut text,
            namer: std::mem::take(&mut self.namer),
            indent: 0,
        };
        let r = p.expr(e);
        self.namer = p.namer;
        r.map(|()| text)
    }

    pub(crate) fn expr(&mut self, e: &Expr) -> fmt::Result {
        match e {
            Expr::IntImm { dtype, value } => self.int(*dtype, *value),
            Expr::FloatImm { dtype, value } => {
                if !value.is_finite() {
                    let v = if value.is_nan() {
                        "nan"
                    } else if *value > 0.0 {
                        "inf"
                    } else {
                        "-inf"
                    };
                    write!(self.out, "{dtype}({v})")
                } else if *dtype == DataType::f32() && (*value as f32) as f64 == *value {
                    write!(self.out, "{:?}f32", *value as f32)
                } else {
                    write!(self.out, "{value:?}{}", type_suffix(*dtype))
                }
            }
            Expr::Var(v) => {
                let n = self.namer.name(v);
                self.out.write_str(&n)
            }
            Expr::Binary { op, a, b } => match infix(*op) {
                Some(sym) => {
                    let p = prec(e);
                    self.operand(a, prec(a) < p || (p == 3 && prec(a) == 3))?;
                    write!(self.out, " {sym} ")?;
                    self.operand(b, prec(b) <= p)
                }
                None => {
                    write!(self.out, "{}(", op.name())?;
                    self.expr(a)?;
                    self.out.write_str(", ")?;
                    self.expr(b)?;
                    self.out.write_str(")")
                }
            },
            Expr::Not(a) => {
                self.out.write_str("!")?;
                self.operand(a, prec(a) < 6)
            }
            Expr::Select { cond, t, f } => {
                self.out.write_str("select(")?;
                self.expr(cond)?;
                self.out.write_str(", ")?;
                self.expr(t)?;
                self.out.write_str(", ")?;
                self.expr(f)?;
                self.out.write_str(")")
            }
            Expr::Cast {
                dtype,
                value,
                saturate,
            } => {
                // An unsaturated float → integer conversion prints as `int32_unsaturated(x)`,
                // so the two kinds never print alike.
                if *saturate {
                    write!(self.out, "{dtype}(")?;
                } else {
                    write!(self.out, "{dtype}_unsaturated(")?;
                }
                self.expr(value)?;
                self.out.write_str(")")
            }
            Expr::Load { buffer, indices } => {
                self.out.write_str(&buffer.name)?;
                self.indices(indices)
            }
            Expr::Let { var, value, body } => {
                let mark = self.namer.mark();
                let rhs = self.render(value)?;
                let n = self.namer.bind(var);
                write!(self.out, "(let {n}: {} = {rhs} in ", var.dtype)?;
                self.expr(body)?;
                self.namer.restore(mark);
                self.out.write_str(")")
            }
            Expr::Call { op, args } => {
                write!(self.out, "{}", op.name())?;
                self.call_args(args)
            }
            Expr::IfThenElse { cond, t, f } => {
                self.out.write_str("if_then_else(")?;
                self.expr(cond)?;
                self.out.write_str(", ")?;
                self.expr(t)?;
                self.out.write_str(", ")?;
                self.expr(f)?;
                self.out.write_str(")")
            }
            Expr::Reinterpret { dtype, value } => {
                write!(self.out, "reinterpret<{dtype}>(")?;
                self.expr(value)?;
                self.out.write_str(")")
            }
            Expr::CallExtern {
                dtype,
                symbol,
                args,
            } => {
                write!(self.out, "call_extern<{dtype}>(\"{symbol}\"")?;
                for a in args {
                    self.out.write_str(", ")?;
                    self.expr(a)?;
                }
                self.out.write_str(")")
            }
        }
    }

    fn call_args(&mut self, args: &[Expr]) -> fmt::Result {
        self.out.write_str("(")?;
        for (i, a) in args.iter().enumerate() {
            if i > 0 {
                self.out.write_str(", ")?;
            }
            self.expr(a)?;
        }
        self.out.write_str(")")
    }

    fn operand(&mut self, e: &Expr, parens: bool) -> fmt::Result {
        if parens {
            self.out.write_str("(")?;
            self.expr(e)?;
            self.out.write_str(")")
        } else {
            self.expr(e)
        }
    }

    fn indices(&mut self, indices: &[Expr]) -> fmt::Result {
        self.out.write_str("[")?;
        for (i, x) in indices.iter().enumerate() {
            if i > 0 {
                self.out.write_str(", ")?;
            }
            self.expr(x)?;
        }
        self.out.write_str("]")
    }

    fn line_start(&mut self) -> fmt::Result {
        for _ in 0..self.indent {
            self.out.write_str("  ")?;
        }
        Ok(())
    }

    fn param_dim(&mut self, e: &Expr, is_param: bool) -> fmt::Result {
        match e {
            Expr::Var(v) if is_param && !self.namer.is_bound(v) => {
                let n = self.namer.bind(v);
                if v.dtype == DataType::i64() {
                    self.out.write_str(&n)
                } else {
                    write!(self.out, "{n}: {}", v.dtype)
                }
            }
            other => self.dim(other),
        }
    }

    fn dim(&mut self, e: &Expr) -> fmt::Result {
        match e {
            Expr::IntImm { value, .. } => write!(self.out, "{value}"),
            other => self.expr(other),
        }
    }

    /// `float32[n, 4] strides [4, 1] local`. In parameters, shape variables are defined by their
    /// first appearance, printed with their type unless it is `int64` (`k: int32`).
    fn buffer_type(&mut self, b: &Buffer, is_param: bool) -> fmt::Result {
        write!(self.out, "{}[", b.dtype)?;
        for (i, d) in b.shape.iter().enumerate() {
            if i > 0 {
                self.out.write_str(", ")?;
            }
            self.param_dim(d, is_param)?;
        }
        self.out.write_str("]")?;
        if let Some(strides) = &b.strides {
            self.out.write_str(" strides [")?;
            for (i, d) in strides.iter().enumerate() {
                if i > 0 {
                    self.out.write_str(", ")?;
                }
                self.param_dim(d, is_param)?;
            }
            self.out.write_str("]")?;
        }
        if b.scope != StorageScope::Global {
            write!(self.out, " {}", b.scope.name())?;
        }
        Ok(())
    }

    pub(crate) fn stmt(&mut self, s: &Stmt) -> fmt::Result {
        match s {
            Stmt::Seq(v) => {
                for s in v {
                    self.stmt(s)?;
                }
                Ok(())
            }
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => {
                self.line_start()?;
                // min and extent are evaluated outside the loop's scope.
                let mark = self.namer.mark();
                let mut header = String::new();
                {
                    let mut p = Printer {
                        out: &mut header,
                        namer: std::mem::take(&mut self.namer),
                        indent: 0,
                    };
                    p.expr(min)?;
                    p.out.write_str(", ")?;
                    p.expr(extent)?;
                    self.namer = p.namer;
                }
                let n = self.namer.bind(var);
                let kind_text = match kind {
                    ForKind::ThreadBinding(tag) => format!("thread_binding[{tag}]"),
                    k => k.name().to_owned(),
                };
                writeln!(
                    self.out,
                    "for {n}: {} in {kind_text}({header}) {{",
                    var.dtype
                )?;
                self.block(body)?;
                self.namer.restore(mark);
                self.line_start()?;
                writeln!(self.out, "}}")
            }
            Stmt::Store {
                buffer,
                indices,
                value,
            } => {
                self.line_start()?;
                self.out.write_str(&buffer.name)?;
                self.indices(indices)?;
                self.out.write_str(" = ")?;
                self.expr(value)?;
                writeln!(self.out)
            }
            Stmt::Allocate { buffer, body } => {
                self.line_start()?;
                write!(self.out, "allocate {}: ", buffer.name)?;
                self.buffer_type(buffer, false)?;
                writeln!(self.out, " {{")?;
                self.block(body)?;
                self.line_start()?;
                writeln!(self.out, "}}")
            }
            Stmt::Let { var, value, body } => {
                self.line_start()?;
                let mark = self.namer.mark();
                let rhs = self.render(value)?;
                let n = self.namer.bind(var);
                writeln!(self.out, "let {n}: {} = {rhs}", var.dtype)?;
                self.stmt(body)?;
                self.namer.restore(mark);
                Ok(())
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                self.line_start()?;
                self.out.write_str("if ")?;
                self.expr(cond)?;
                writeln!(self.out, " {{")?;
                self.block(then_case)?;
                if let Some(e) = else_case {
                    self.line_start()?;
                    writeln!(self.out, "}} else {{")?;
                    self.block(e)?;
                }
                self.line_start()?;
                writeln!(self.out, "}}")
            }
            Stmt::While { cond, body } => {
                self.line_start()?;
                self.out.write_str("while ")?;
                self.expr(cond)?;
                writeln!(self.out, " {{")?;
                self.block(body)?;
                self.line_start()?;
                writeln!(self.out, "}}")
            }
            Stmt::Evaluate(e) => {
                self.line_start()?;
                self.out.write_str("evaluate ")?;
                self.expr(e)?;
                writeln!(self.out)
            }
            Stmt::Assert { cond, message } => {
                self.line_start()?;
                self.out.write_str("assert ")?;
                self.expr(cond)?;
                writeln!(self.out, ", {message:?}")
            }
            Stmt::Return(e) => {
                self.line_start()?;
                self.out.write_str("return ")?;
                self.expr(e)?;
                writeln!(self.out)
            }
            Stmt::Prefetch { buffer, indices } => {
                self.line_start()?;
                write!(self.out, "prefetch {}", buffer.name)?;
                self.indices(indices)?;
                writeln!(self.out)
            }
            Stmt::Barrier => {
                self.line_start()?;
                writeln!(self.out, "barrier")
            }
        }
    }

    fn block(&mut self, s: &Stmt) -> fmt::Result {
        self.indent += 1;
        let mark = self.namer.mark();
        self.stmt(s)?;
        self.namer.restore(mark);
        self.indent -= 1;
        Ok(())
    }

    pub(crate) fn func(&mut self, f: &PrimFunc) -> fmt::Result {
        self.namer = Namer::default();
        write!(self.out, "func @{}(", f.name)?;
        for (i, p) in f.params.iter().enumerate() {
            if i > 0 {
                self.out.write_str(", ")?;
            }
            match p {
                Param::Scalar(v) => {
                    let n = self.namer.bind(v);
                    write!(self.out, "{n}: {}", v.dtype)?;
                }
                Param::Buffer(b) => {
                    write!(self.out, "{}: ", b.name)?;
                    self.buffer_type(b, true)?;
                }
            }
        }
        self.out.write_str(")")?;
        if let Some(t) = f.ret_type {
            write!(self.out, " -> {t}")?;
        }
        let a = &f.attrs;
        let mut attrs = Vec::new();
        if a.global_symbol.as_deref() != Some(f.name.as_str()) {
            attrs.push(match &a.global_symbol {
                Some(s) => format!("global_symbol = {s:?}"),
                None => "internal".to_string(),
            });
        }
        if a.noalias {
            attrs.push("noalias".into());
        }
        if a.entry {
            attrs.push("entry".into());
        }
        if a.host {
            attrs.push("host".into());
        }
        if !attrs.is_empty() {
            write!(self.out, " attrs({})", attrs.join(", "))?;
        }
        writeln!(self.out, " {{")?;
        self.block(&f.body)?;
        writeln!(self.out, "}}")
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Printer::new(f).expr(self)
    }
}

impl fmt::Display for Stmt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Printer::new(f).stmt(self)
    }
}

impl fmt::Display for PrimFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Printer::new(f).func(self)
    }
}

impl fmt::Display for IRModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "// kiln-ir/1 module, {} function(s)",
            self.functions.len()
        )?;
        for func in &self.functions {
            writeln!(f)?;
            Printer::new(f).func(func)?;
        }
        Ok(())
    }
}
