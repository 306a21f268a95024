//! Random scalar expressions for the differential tests (`codegen_differential.rs` on the CPU,
//! `codegen_opencl_differential.rs` on an OpenCL device): one generator, lowered over whatever
//! the program reads (two buffer elements and an index).

use kiln::ir::builder::{call, if_then_else_expr, select};
use kiln::ir::{BinOp, DataType, Expr, Intrinsic};
use proptest::prelude::*;

/// A random expression over `A`, `B` (the two inputs) and the element's index.
#[derive(Debug, Clone)]
pub enum E {
    A,
    B,
    /// The index, cast to the expression's type.
    Index,
    Const(i64),
    Bin(BinOp, Box<E>, Box<E>),
    Sel(BinOp, Box<E>, Box<E>, Box<E>, Box<E>),
    /// `if_then_else` (only the chosen arm evaluated).
    Ite(BinOp, Box<E>, Box<E>, Box<E>, Box<E>),
    /// An integer function (`bitwise_not`, `clz`, `popcount`); the operand itself on floats.
    Un(Intrinsic, Box<E>),
}

fn int_fn() -> impl Strategy<Value = Intrinsic> {
    prop_oneof![
        Just(Intrinsic::BitwiseNot),
        Just(Intrinsic::Clz),
        Just(Intrinsic::Popcount)
    ]
}

fn ops() -> impl Strategy<Value = BinOp> {
    prop_oneof![
        Just(BinOp::Add),
        Just(BinOp::Sub),
        Just(BinOp::Mul),
        Just(BinOp::Div),
        Just(BinOp::Mod),
        Just(BinOp::FloorDiv),
        Just(BinOp::FloorMod),
        Just(BinOp::Min),
        Just(BinOp::Max),
        // Integers only: `add` on floats (see `lower`).
        Just(BinOp::BitAnd),
        Just(BinOp::BitOr),
        Just(BinOp::BitXor),
        Just(BinOp::Shl),
        Just(BinOp::Shr),
    ]
}

fn cmps() -> impl Strategy<Value = BinOp> {
    prop_oneof![
        Just(BinOp::Lt),
        Just(BinOp::Le),
        Just(BinOp::Eq),
        Just(BinOp::Ne),
        Just(BinOp::Gt)
    ]
}

type Cond = (BinOp, Box<E>, Box<E>, Box<E>, Box<E>);

/// Expressions up to 4 levels deep.
pub fn expr() -> impl Strategy<Value = E> {
    let leaf = prop_oneof![
        Just(E::A),
        Just(E::B),
        Just(E::Index),
        (-9i64..9).prop_map(E::Const)
    ];
    leaf.prop_recursive(4, 24, 3, |inner| {
        let cond = || {
            (
                cmps(),
                inner.clone(),
                inner.clone(),
                inner.clone(),
                inner.clone(),
            )
                .prop_map(|(o, a, b, t, f)| -> Cond {
                    (o, Box::new(a), Box::new(b), Box::new(t), Box::new(f))
                })
        };
        prop_oneof![
            (ops(), inner.clone(), inner.clone()).prop_map(|(o, a, b)| E::Bin(
                o,
                Box::new(a),
                Box::new(b)
            )),
            cond().prop_map(|(o, a, b, t, f)| E::Sel(o, a, b, t, f)),
            cond().prop_map(|(o, a, b, t, f)| E::Ite(o, a, b, t, f)),
            (int_fn(), inner).prop_map(|(f, a)| E::Un(f, Box::new(a))),
        ]
    })
}

/// What the leaves of an expression become.
pub struct Leaves {
    /// `A`'s element.
    pub a: Expr,
    /// `B`'s element.
    pub b: Expr,
    /// The element's index (any integer type).
    pub index: Expr,
    /// Float constants are `Const(c) * float_scale`.
    pub float_scale: f64,
}

/// `e` as IR of type `t`.
pub fn lower(e: &E, t: DataType, l: &Leaves) -> Expr {
    let bin = |op, x: &E, y: &E| Expr::binary(op, lower(x, t, l), lower(y, t, l));
    match e {
        E::A => l.a.clone(),
        E::B => l.b.clone(),
        E::Index => l.index.clone().cast(t),
        E::Const(c) if t.is_float() => Expr::FloatImm {
            dtype: t,
            value: *c as f64 * l.float_scale,
        },
        E::Const(c) => Expr::IntImm {
            dtype: t,
            value: *c,
        },
        E::Bin(op, x, y) if op.is_bitwise() && t.is_float() => bin(BinOp::Add, x, y),
        E::Bin(op, x, y) => bin(*op, x, y),
        E::Sel(op, x, y, p, q) => select(bin(*op, x, y), lower(p, t, l), lower(q, t, l)),
        E::Ite(op, x, y, p, q) => if_then_else_expr(bin(*op, x, y), lower(p, t, l), lower(q, t, l)),
        E::Un(f, x) if !t.is_float() => call(*f, vec![lower(x, t, l)]),
        E::Un(_, x) => lower(x, t, l),
    }
}
