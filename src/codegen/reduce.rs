//! Lowering shared by the CPU code generators: serial float `max`/`min` reductions in a form
//! whose loop-carried work is one integer `max`/`min` and one `or`.
//!
//! kiln's float `max` and `min` propagate NaN and order −0 below +0 (`docs/ir.md`). Written as
//! selects, that is a chain of about ten dependent instructions per element, and a reduction
//! `for k { X[ix] = max(X[ix], e(k)) }` runs at that chain's latency: 7-10x the time of TVM's
//! NaN-dropping `vmaxss` on TOPI's `max` and `min`, and the row max of softmax.
//!
//! The same result comes from a total order on the bits: `key(x) = bits(x) ^ ((bits(x) >> (w -
//! 1)) & MAX)` (arithmetic shift; `MAX` all ones but the sign bit) maps the non-NaN floats,
//! −0 below +0, to integers in the same order, and is its own inverse. So the loop keeps
//! `kacc = max(kacc, key(e(k)))` (signed integers) and `nan |= isnan(e(k))`, both off the
//! critical path of `e`, and stores `nan ? NaN : from_key(kacc)` after the loop. The result is the
//! serial loop's, bit for bit, except that a NaN result is always the canonical quiet NaN
//! (the serial loop's carries the payload of the first NaN it met; IEEE 754 leaves a NaN
//! result's payload to the implementation). LLVM vectorizes both recurrences.
//!
//! The rule (all of it must hold, else the loop is left alone):
//! - a serial loop, or a perfect nest of serial loops whose bounds do not use the nest's
//!   variables (a pooling window), whose innermost body is `X[ix] = max(X[ix], e)` (or `min`,
//!   either operand order), optionally preceded by `if k1 == min1 && ... { X[ix] = init }`
//!   naming every loop of the nest (TVM's lowered reductions; an initialization naming only the
//!   inner loops resets `X` inside the nest, and only those loops are lowered);
//! - `X` is `float32` or `float64`, `ix` and `init` use none of the nest's variables, and neither
//!   `e` nor `init` reads `X`;
//! - `X` is allocated in the function, or the function is `noalias` (so that `e` reads no
//!   alias of `X`, which the serial loop would see change).

use std::collections::HashSet;

use crate::ir::builder::{int, isnan, select};
use crate::ir::{
    BinOp, Buffer, DataType, Expr, ForKind, PrimFunc, Stmt, StorageScope, TypeCode, Var, VarId,
};

/// `f`'s body with every serial float `max`/`min` reduction (loop or loop nest) that follows
/// the rule (module docs) in integer-key form.
pub fn lower_minmax_reductions(f: &PrimFunc) -> Stmt {
    let mut allocated = HashSet::new();
    collect_allocations(&f.body, &mut allocated);
    lower(&f.body, &|b: &Buffer| {
        f.attrs.noalias || allocated.contains(&b.data.id)
    })
}

fn collect_allocations(s: &Stmt, out: &mut HashSet<VarId>) {
    struct Alloc<'a>(&'a mut HashSet<VarId>);
    impl crate::ir::visit::Visitor for Alloc<'_> {
        fn allocate(&mut self, buffer: &Buffer) {
            self.0.insert(buffer.data.id);
        }
    }
    crate::ir::visit::Visitor::stmt(&mut Alloc(out), s);
}

fn lower(s: &Stmt, unaliased: &dyn Fn(&Buffer) -> bool) -> Stmt {
    if let Stmt::For {
        kind: ForKind::Serial,
        ..
    } = s
    {
        let nest = serial_nest(s);
        let loops: Vec<Loop> = nest
            .iter()
            .map(|(v, m, e, _)| ((*v).clone(), (*m).clone(), (*e).clone()))
            .collect();
        let innermost = nest.last().map(|l| l.3);
        if let Some(r) = innermost.and_then(|body| reduction(&loops, body, unaliased)) {
            return r.lowered(&loops);
        }
    }
    s.map_children(|c| lower(c, unaliased))
}

/// A loop's variable, `min` and `extent`.
type Loop = (Var, Expr, Expr);

/// The perfect nest of serial loops that starts at `s` (a serial loop), outermost first, with
/// each loop's body; it stops at a loop whose bounds use a variable of the nest (then not
/// every iteration space is a box, and the first iteration is not the mins).
fn serial_nest(s: &Stmt) -> Vec<(&Var, &Expr, &Expr, &Stmt)> {
    let mut out: Vec<(&Var, &Expr, &Expr, &Stmt)> = Vec::new();
    let mut cur = s;
    while let Stmt::For {
        var,
        min,
        extent,
        kind: ForKind::Serial,
        body,
    } = cur
    {
        let uses_nest = |e: &Expr| {
            e.free_uses()
                .vars
                .iter()
                .any(|v| out.iter().any(|l| l.0.id == v.id))
        };
        if uses_nest(min) || uses_nest(extent) {
            break;
        }
        out.push((var, min, extent, body));
        cur = body;
    }
    out
}

/// A reduction loop's parts.
struct Reduction {
    out: Buffer,
    indices: Vec<Expr>,
    is_max: bool,
    elem: Expr,
    init: Option<Expr>,
}

/// The reduction a nest of serial `loops` with the innermost `body` performs, if it follows the
/// rule.
fn reduction(
    loops: &[Loop],
    body: &Stmt,
    unaliased: &dyn Fn(&Buffer) -> bool,
) -> Option<Reduction> {
    let (init, update) = match body {
        Stmt::Seq(v) if v.len() == 2 => (Some(&v[0]), &v[1]),
        s => (None, s),
    };
    let Stmt::Store {
        buffer,
        indices,
        value: Expr::Binary { op, a, b },
    } = update
    else {
        return None;
    };
    if !matches!(op, BinOp::Max | BinOp::Min)
        || buffer.dtype.code != TypeCode::Float
        || !matches!(buffer.dtype.bits, 32 | 64)
        || buffer.dtype.lanes != 1
        || !unaliased(buffer)
    {
        return None;
    }
    let is_acc = |e: &Expr| matches!(e, Expr::Load { buffer: lb, indices: li } if lb.data.id == buffer.data.id && li == indices);
    let elem = if is_acc(a) {
        b
    } else if is_acc(b) {
        a
    } else {
        return None;
    };
    let uses_var = |e: &Expr| {
        e.free_uses()
            .vars
            .iter()
            .any(|v| loops.iter().any(|l| l.0.id == v.id))
    };
    let reads_out = |e: &Expr| {
        e.free_uses()
            .buffers
            .iter()
            .any(|b| b.data.id == buffer.data.id)
    };
    if indices.iter().any(|i| uses_var(i) || reads_out(i)) || reads_out(elem) {
        return None;
    }
    let init = match init {
        None => None,
        Some(Stmt::IfThenElse {
            cond,
            then_case,
            else_case: None,
        }) => {
            let first = is_first_iteration(cond, loops);
            let Stmt::Store {
                buffer: ib,
                indices: ii,
                value,
            } = &**then_case
            else {
                return None;
            };
            if !first
                || ib.data.id != buffer.data.id
                || ii != indices
                || uses_var(value)
                || reads_out(value)
            {
                return None;
            }
            Some(value.clone())
        }
        Some(_) => return None,
    };
    Some(Reduction {
        out: buffer.clone(),
        indices: indices.clone(),
        is_max: *op == BinOp::Max,
        elem: (**elem).clone(),
        init,
    })
}

/// Whether `cond` is `k1 == min1 && k2 == min2 && ...` over exactly the variables of `loops`
/// (in any order and grouping, either side of each `==`).
fn is_first_iteration(cond: &Expr, loops: &[Loop]) -> bool {
    let eqs: Option<Vec<(&Expr, &Expr)>> = cond
        .conjuncts()
        .into_iter()
        .map(|c| match c {
            Expr::Binary {
                op: BinOp::Eq,
                a,
                b,
            } => Some((&**a, &**b)),
            _ => None,
        })
        .collect();
    let Some(eqs) = eqs else {
        return false;
    };
    if eqs.len() != loops.len() {
        return false;
    }
    loops.iter().all(|(var, min, _)| {
        let is_var = |e: &Expr| matches!(e, Expr::Var(v) if v.id == var.id);
        eqs.iter()
            .any(|(x, y)| (is_var(x) && *y == min) || (is_var(y) && *x == min))
    })
}

impl Reduction {
    fn lowered(self, loops: &[Loop]) -> Stmt {
        let ft = self.out.dtype;
        let it = DataType::new(TypeCode::Int, ft.bits, 1);
        let i32t = DataType::new(TypeCode::Int, 32, 1);
        let sign_off = int(
            it,
            if ft.bits == 64 {
                i64::MAX
            } else {
                i64::from(i32::MAX)
            },
        );
        let shift = int(it, i64::from(ft.bits) - 1);
        // Its own inverse: the mask depends on the sign bit only, which it keeps.
        let key = |bits: Expr| {
            bits.clone().bitwise_xor(
                bits.shift_right(shift.clone())
                    .bitwise_and(sign_off.clone()),
            )
        };
        let kacc = Buffer::temp(
            "minmax_key",
            it,
            vec![Expr::from(1i64)],
            StorageScope::Local,
        );
        let nacc = Buffer::temp(
            "minmax_nan",
            i32t,
            vec![Expr::from(1i64)],
            StorageScope::Local,
        );
        let z = [Expr::from(0i64)];
        let first = Var::new("minmax_first", ft);
        let x = Var::new("minmax_x", ft);
        let combine = |acc: Expr, k: Expr| if self.is_max { acc.max(k) } else { acc.min(k) };
        let nan_of = |v: &Expr| isnan(v.clone()).cast(i32t);
        let update = Stmt::Let {
            var: x.clone(),
            value: self.elem.clone(),
            body: Box::new(Stmt::Seq(vec![
                kacc.store(
                    z.clone(),
                    combine(
                        kacc.load(z.clone()),
                        key(Expr::Var(x.clone()).reinterpret(it)),
                    ),
                ),
                nacc.store(
                    z.clone(),
                    nacc.load(z.clone())
                        .bitwise_or(nan_of(&Expr::Var(x.clone()))),
                ),
            ])),
        };
        let quiet_nan = int(
            it,
            if ft.bits == 64 {
                0x7ff8_0000_0000_0000
            } else {
                0x7fc0_0000
            },
        )
        .reinterpret(ft);
        let result = select(
            nacc.load(z.clone()).ne_(int(i32t, 0)),
            quiet_nan,
            key(kacc.load(z.clone())).reinterpret(ft),
        );
        let start = self
            .init
            .clone()
            .unwrap_or_else(|| self.out.load(self.indices.clone()));
        let body = Stmt::Let {
            var: first.clone(),
            value: start,
            body: Box::new(Stmt::Seq(vec![
                kacc.store(z.clone(), key(Expr::Var(first.clone()).reinterpret(it))),
                nacc.store(z.clone(), nan_of(&Expr::Var(first))),
                loops
                    .iter()
                    .rev()
                    .fold(update, |body, (var, min, extent)| Stmt::For {
                        var: var.clone(),
                        min: min.clone(),
                        extent: extent.clone(),
                        kind: ForKind::Serial,
                        body: Box::new(body),
                    }),
                self.out.store(self.indices.clone(), result),
            ])),
        };
        // The serial loops write nothing when one of them does not run.
        let mut runs: Option<Expr> = None;
        for (_, _, extent) in loops {
            if matches!(extent.as_int(), Some(n) if n > 0) {
                continue;
            }
            let c = extent.clone().gt(int(extent.dtype(), 0));
            runs = Some(match runs {
                None => c,
                Some(r) => r.and(c),
            });
        }
        let body = match runs {
            None => body,
            Some(cond) => Stmt::IfThenElse {
                cond,
                then_case: Box::new(body),
                else_case: None,
            },
        };
        kacc.allocate(nacc.allocate(body))
    }
}
