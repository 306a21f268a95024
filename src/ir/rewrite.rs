//! The IR rewriter: post-order rewriting, substitution, affine index forms and a little
//! constant folding. The schedule primitives and the code generators' lowering passes
//! (`codegen::partition`) share it, so it lives with the IR they both transform.

use std::collections::HashMap;

use crate::ir::{BinOp, Buffer, DataType, Expr, Stmt, TypeCode, Var, VarId};

/// Post-order rewriting: children are rebuilt first, then the hooks see the new node.
pub(crate) trait Rewriter {
    /// Replaces an expression whose children are already rewritten.
    fn post_expr(&mut self, e: Expr) -> Expr {
        e
    }
    /// Replaces a store whose indices and value are already rewritten.
    fn post_store(&mut self, buffer: Buffer, indices: Vec<Expr>, value: Expr) -> Stmt {
        Stmt::Store {
            buffer,
            indices,
            value,
        }
    }
}

pub(crate) fn rw_expr(r: &mut dyn Rewriter, e: &Expr) -> Expr {
    let b = |r: &mut dyn Rewriter, x: &Expr| Box::new(rw_expr(r, x));
    let e = match e {
        Expr::IntImm { .. } | Expr::FloatImm { .. } | Expr::Var(_) => e.clone(),
        Expr::Binary { op, a, b: y } => Expr::Binary {
            op: *op,
            a: b(r, a),
            b: b(r, y),
        },
        Expr::Not(a) => Expr::Not(b(r, a)),
        Expr::Select { cond, t, f } => Expr::Select {
            cond: b(r, cond),
            t: b(r, t),
            f: b(r, f),
        },
        Expr::Cast {
            dtype,
            value,
            saturate,
        } => Expr::Cast {
            dtype: *dtype,
            value: b(r, value),
            saturate: *saturate,
        },
        Expr::Load { buffer, indices } => Expr::Load {
            buffer: buffer.clone(),
            indices: indices.iter().map(|i| rw_expr(r, i)).collect(),
        },
        Expr::Let { var, value, body } => Expr::Let {
            var: var.clone(),
            value: b(r, value),
            body: b(r, body),
        },
        Expr::Call { op, args } => Expr::Call {
            op: *op,
            args: args.iter().map(|a| rw_expr(r, a)).collect(),
        },
        Expr::IfThenElse { cond, t, f } => Expr::IfThenElse {
            cond: b(r, cond),
            t: b(r, t),
            f: b(r, f),
        },
        Expr::Reinterpret { dtype, value } => Expr::Reinterpret {
            dtype: *dtype,
            value: b(r, value),
        },
        Expr::CallExtern {
            dtype,
            symbol,
            args,
        } => Expr::CallExtern {
            dtype: *dtype,
            symbol: symbol.clone(),
            args: args.iter().map(|a| rw_expr(r, a)).collect(),
        },
    };
    r.post_expr(e)
}

pub(crate) fn rw_stmt(r: &mut dyn Rewriter, s: &Stmt) -> Stmt {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => Stmt::For {
            var: var.clone(),
            min: rw_expr(r, min),
            extent: rw_expr(r, extent),
            kind: *kind,
            body: Box::new(rw_stmt(r, body)),
        },
        Stmt::Store {
            buffer,
            indices,
            value,
        } => {
            let indices = indices.iter().map(|i| rw_expr(r, i)).collect();
            let value = rw_expr(r, value);
            r.post_store(buffer.clone(), indices, value)
        }
        Stmt::Allocate { buffer, body } => Stmt::Allocate {
            buffer: buffer.clone(),
            body: Box::new(rw_stmt(r, body)),
        },
        Stmt::Let { var, value, body } => Stmt::Let {
            var: var.clone(),
            value: rw_expr(r, value),
            body: Box::new(rw_stmt(r, body)),
        },
        Stmt::IfThenElse {
            cond,
            then_case,
            else_case,
        } => Stmt::IfThenElse {
            cond: rw_expr(r, cond),
            then_case: Box::new(rw_stmt(r, then_case)),
            else_case: else_case.as_ref().map(|e| Box::new(rw_stmt(r, e))),
        },
        Stmt::While { cond, body } => Stmt::While {
            cond: rw_expr(r, cond),
            body: Box::new(rw_stmt(r, body)),
        },
        Stmt::Seq(v) => Stmt::Seq(v.iter().map(|s| rw_stmt(r, s)).collect()),
        Stmt::Evaluate(e) => Stmt::Evaluate(rw_expr(r, e)),
        Stmt::Assert { cond, message } => Stmt::Assert {
            cond: rw_expr(r, cond),
            message: message.clone(),
        },
        Stmt::Return(e) => Stmt::Return(rw_expr(r, e)),
        Stmt::Prefetch { buffer, indices } => Stmt::Prefetch {
            buffer: buffer.clone(),
            indices: indices.iter().map(|i| rw_expr(r, i)).collect(),
        },
        Stmt::Barrier => Stmt::Barrier,
    }
}

struct Subst<'a>(&'a HashMap<VarId, Expr>);

impl Rewriter for Subst<'_> {
    fn post_expr(&mut self, e: Expr) -> Expr {
        match &e {
            Expr::Var(v) => self.0.get(&v.id).cloned().unwrap_or(e),
            _ => fold(e),
        }
    }
}

/// `e` with variables replaced (and integer arithmetic on the way folded).
pub(crate) fn subst_expr(e: &Expr, map: &HashMap<VarId, Expr>) -> Expr {
    rw_expr(&mut Subst(map), e)
}

/// `s` with variables replaced (and integer arithmetic on the way folded).
pub(crate) fn subst_stmt(s: &Stmt, map: &HashMap<VarId, Expr>) -> Stmt {
    rw_stmt(&mut Subst(map), s)
}

fn is_int(t: DataType) -> bool {
    matches!(t.code, TypeCode::Int | TypeCode::UInt) && t.bits >= 32
}

/// Folds `0 + x`, `x * 1`, `x * 0` and constant-constant integer arithmetic and `min`/`max`
/// (one level).
pub(crate) fn fold(e: Expr) -> Expr {
    let Expr::Binary { op, a, b } = &e else {
        return e;
    };
    if !is_int(a.dtype()) {
        return e;
    }
    let (ca, cb) = (a.as_int(), b.as_int());
    let t = a.dtype();
    let imm = |v: i64| Expr::IntImm { dtype: t, value: v };
    match (op, ca, cb) {
        (BinOp::Add, Some(x), Some(y)) => imm(x.wrapping_add(y)),
        (BinOp::Sub, Some(x), Some(y)) => imm(x.wrapping_sub(y)),
        (BinOp::Mul, Some(x), Some(y)) => imm(x.wrapping_mul(y)),
        (BinOp::Min, Some(x), Some(y)) => imm(x.min(y)),
        (BinOp::Max, Some(x), Some(y)) => imm(x.max(y)),
        (BinOp::Add, Some(0), _) => (**b).clone(),
        (BinOp::Add | BinOp::Sub, _, Some(0)) => (**a).clone(),
        (BinOp::Mul, Some(1), _) => (**b).clone(),
        (BinOp::Mul, _, Some(1)) => (**a).clone(),
        (BinOp::Mul, Some(0), _) | (BinOp::Mul, _, Some(0)) => imm(0),
        _ => e,
    }
}

/// `e` with [`fold`] applied at every level, innermost first (so a tree of constants becomes
/// one constant).
pub(crate) fn fold_all(e: &Expr) -> Expr {
    struct Fold;
    impl Rewriter for Fold {
        fn post_expr(&mut self, e: Expr) -> Expr {
            fold(e)
        }
    }
    rw_expr(&mut Fold, e)
}

/// An affine integer form `sum(coef * var) + c`, terms in order of first appearance.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Lin {
    pub terms: Vec<(Var, i64)>,
    pub c: i64,
}

impl Lin {
    fn add(mut self, o: Lin, sign: i64) -> Lin {
        for (v, k) in o.terms {
            match self.terms.iter_mut().find(|(w, _)| *w == v) {
                Some((_, c)) => *c += sign * k,
                None => self.terms.push((v, sign * k)),
            }
        }
        self.terms.retain(|(_, k)| *k != 0);
        self.c += sign * o.c;
        self
    }
    fn scale(mut self, k: i64) -> Lin {
        for (_, c) in &mut self.terms {
            *c *= k;
        }
        self.terms.retain(|(_, c)| *c != 0);
        self.c *= k;
        self
    }
    /// `self - b`, term by term.
    pub fn minus(&self, b: &Lin) -> Lin {
        self.clone().add(b.clone(), -1)
    }
    /// The form as `q * d + r` (`d >= 1`): `q` the terms whose coefficients are multiples of
    /// `d` (divided by it) and the constant's quotient, `r` the other terms and the constant's
    /// remainder. When `r`'s range is within `[0, d)`, `q` is `floordiv(self, d)` and `r` is
    /// `floormod(self, d)`.
    pub fn div_mod(&self, d: i64) -> (Lin, Lin) {
        let mut q = Lin {
            terms: vec![],
            c: self.c.div_euclid(d),
        };
        let mut r = Lin {
            terms: vec![],
            c: self.c.rem_euclid(d),
        };
        for (v, k) in &self.terms {
            if k % d == 0 {
                q.terms.push((v.clone(), k / d));
            } else {
                r.terms.push((v.clone(), *k));
            }
        }
        (q, r)
    }
    /// The range `[lo, hi]` of the form over variables with known `(min, extent)`. `None` if a
    /// variable's range is unknown or empty, or the arithmetic overflows.
    pub fn range(&self, ranges: &HashMap<VarId, (i64, i64)>) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (self.c, self.c);
        for (v, k) in &self.terms {
            let &(mn, ex) = ranges.get(&v.id)?;
            if ex <= 0 {
                return None;
            }
            let last = mn.checked_add(ex - 1)?;
            let (x, y) = (k.checked_mul(mn)?, k.checked_mul(last)?);
            lo = lo.checked_add(x.min(y))?;
            hi = hi.checked_add(x.max(y))?;
        }
        Some((lo, hi))
    }
    /// The form without the terms whose variables satisfy `drop`.
    pub fn without(&self, drop: impl Fn(&Var) -> bool) -> Lin {
        Lin {
            terms: self
                .terms
                .iter()
                .filter(|(v, _)| !drop(v))
                .cloned()
                .collect(),
            c: self.c,
        }
    }
    /// Back to an expression of type `t`.
    pub fn to_expr(&self, t: DataType) -> Expr {
        let imm = |v: i64| Expr::IntImm { dtype: t, value: v };
        let mut e: Option<Expr> = None;
        for (v, k) in &self.terms {
            let mut term = Expr::Var(v.clone());
            if v.dtype != t {
                term = Expr::Cast {
                    dtype: t,
                    value: Box::new(term),
                    saturate: true,
                };
            }
            if *k != 1 {
                term = Expr::binary(BinOp::Mul, term, imm(*k));
            }
            e = Some(match e {
                None => term,
                Some(x) => Expr::binary(BinOp::Add, x, term),
            });
        }
        match e {
            None => imm(self.c),
            Some(x) if self.c == 0 => x,
            Some(x) => Expr::binary(BinOp::Add, x, imm(self.c)),
        }
    }
}

/// The affine form of an integer expression, if it has one.
pub(crate) fn linear(e: &Expr) -> Option<Lin> {
    match e {
        Expr::IntImm { dtype, value } if is_int(*dtype) => Some(Lin {
            terms: vec![],
            c: *value,
        }),
        Expr::Var(v) if is_int(v.dtype) => Some(Lin {
            terms: vec![(v.clone(), 1)],
            c: 0,
        }),
        Expr::Cast { dtype, value, .. } if is_int(*dtype) && is_int(value.dtype()) => {
            if value.dtype().bits <= dtype.bits {
                linear(value)
            } else {
                None
            }
        }
        Expr::Binary { op, a, b } => {
            let (x, y) = (linear(a)?, linear(b)?);
            match op {
                BinOp::Add => Some(x.add(y, 1)),
                BinOp::Sub => Some(x.add(y, -1)),
                BinOp::Mul if x.terms.is_empty() => Some(y.scale(x.c)),
                BinOp::Mul if y.terms.is_empty() => Some(x.scale(y.c)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Every loop variable name bound in `s`.
pub(crate) fn loop_names(s: &Stmt, out: &mut Vec<String>) {
    match s {
        Stmt::For { var, body, .. } => {
            out.push(var.name.to_string());
            loop_names(body, out);
        }
        Stmt::Allocate { body, .. } | Stmt::Let { body, .. } => loop_names(body, out),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => {
            loop_names(then_case, out);
            if let Some(e) = else_case {
                loop_names(e, out);
            }
        }
        Stmt::Seq(v) => v.iter().for_each(|s| loop_names(s, out)),
        _ => {}
    }
}

/// The names of the buffers allocated in `s`.
pub(crate) fn allocated(s: &Stmt, out: &mut Vec<String>) {
    match s {
        Stmt::Allocate { buffer, body } => {
            out.push(buffer.name.clone());
            allocated(body, out);
        }
        Stmt::For { body, .. } | Stmt::Let { body, .. } => allocated(body, out),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => {
            allocated(then_case, out);
            if let Some(e) = else_case {
                allocated(e, out);
            }
        }
        Stmt::Seq(v) => v.iter().for_each(|s| allocated(s, out)),
        _ => {}
    }
}

/// Every buffer (by name) accessed in `s`, with whether it is stored to.
pub(crate) fn accesses(
    s: &Stmt,
    name: &str,
    loads: &mut Vec<Vec<Expr>>,
    stores: &mut Vec<Vec<Expr>>,
) {
    struct Acc<'a> {
        name: &'a str,
        loads: &'a mut Vec<Vec<Expr>>,
        stores: &'a mut Vec<Vec<Expr>>,
    }
    impl Rewriter for Acc<'_> {
        fn post_expr(&mut self, e: Expr) -> Expr {
            if let Expr::Load { buffer, indices } = &e {
                if buffer.name == self.name {
                    self.loads.push(indices.clone());
                }
            }
            e
        }
        fn post_store(&mut self, buffer: Buffer, indices: Vec<Expr>, value: Expr) -> Stmt {
            if buffer.name == self.name {
                self.stores.push(indices.clone());
            }
            Stmt::Store {
                buffer,
                indices,
                value,
            }
        }
    }
    rw_stmt(
        &mut Acc {
            name,
            loads,
            stores,
        },
        s,
    );
}

/// Simplifies `floordiv(L, d)` and `floormod(L, d)` for affine `L` whose terms not divisible by
/// `d` stay in `[0, d)` given the variable ranges `(min, extent)`: e.g. with `j_i` in `[0, 32)`,
/// `floordiv(j_o * 32 + j_i, 32)` is `j_o` and `floormod(j_o * 32 + j_i, 32)` is `j_i`.
pub(crate) fn simplify_divmod(s: &Stmt, ranges: &HashMap<VarId, (i64, i64)>) -> Stmt {
    struct Simp<'a>(&'a HashMap<VarId, (i64, i64)>);
    impl Rewriter for Simp<'_> {
        fn post_expr(&mut self, e: Expr) -> Expr {
            let Expr::Binary { op, a, b } = &e else {
                return e;
            };
            if !matches!(op, BinOp::FloorDiv | BinOp::FloorMod) {
                return e;
            }
            let (Some(l), Some(d)) = (linear(a), b.as_int()) else {
                return e;
            };
            if d <= 0 {
                return e;
            }
            let t = a.dtype();
            let (q, r) = l.div_mod(d);
            match r.range(self.0) {
                Some((lo, hi)) if lo >= 0 && hi < d => {}
                _ => return e,
            }
            if *op == BinOp::FloorDiv {
                q.to_expr(t)
            } else {
                r.to_expr(t)
            }
        }
    }
    rw_stmt(&mut Simp(ranges), s)
}
