//! Ergonomic construction of IR in Rust: constants, operators, loops, `compute` and reductions.
//!
//! Operators (`+ - * / %`, unary `-`) work on [`Expr`] and mix with Rust numbers, which become
//! constants of the other operand's type (`x + 1` with `x: float32` adds `1.0f32`). `/` and `%`
//! are the truncating forms; use [`Expr::floordiv`] / [`Expr::floormod`] for the floor forms.

use std::ops;

use super::dtype::DataType;
use super::expr::{BinOp, Expr, Intrinsic, Var};
use super::func::{Buffer, StorageScope};
use super::stmt::{ForKind, Stmt, ThreadTag};

/// A constant of any numeric or bool type (floats for float types, otherwise rounded toward zero).
pub fn constant(dtype: DataType, value: f64) -> Expr {
    if dtype.is_float() {
        Expr::FloatImm { dtype, value }
    } else if dtype.is_bool() {
        Expr::IntImm {
            dtype,
            value: (value != 0.0) as i64,
        }
    } else {
        Expr::IntImm {
            dtype,
            value: value as i64,
        }
    }
}

/// An integer constant of type `dtype` (wrapped to its width).
pub fn int(dtype: DataType, value: i64) -> Expr {
    Expr::IntImm {
        dtype,
        value: wrap_int(dtype, value),
    }
}

/// Wraps `value` to the integer type `dtype` (sign-extended for signed types).
pub fn wrap_int(dtype: DataType, value: i64) -> i64 {
    let bits = dtype.bits as u32;
    if dtype.is_bool() {
        return (value != 0) as i64;
    }
    if bits >= 64 {
        return value;
    }
    let shift = 64 - bits;
    if dtype.is_signed_int() {
        (value << shift) >> shift
    } else {
        ((value as u64) << shift >> shift) as i64
    }
}

/// The smallest value of a numeric type (`-inf` for floats).
pub fn min_value(dtype: DataType) -> Expr {
    if dtype.is_float() {
        Expr::FloatImm {
            dtype,
            value: f64::NEG_INFINITY,
        }
    } else if dtype.is_uint() {
        int(dtype, 0)
    } else {
        int(dtype, i64::MIN >> (64 - dtype.bits as u32))
    }
}

/// The largest value of a numeric type (`+inf` for floats).
pub fn max_value(dtype: DataType) -> Expr {
    if dtype.is_float() {
        Expr::FloatImm {
            dtype,
            value: f64::INFINITY,
        }
    } else if dtype.is_uint() {
        int(dtype, -1)
    } else {
        int(dtype, i64::MAX >> (64 - dtype.bits as u32))
    }
}

fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::Binary {
        op,
        a: Box::new(a),
        b: Box::new(b),
    }
}

impl Expr {
    /// A binary operation.
    pub fn binary(op: BinOp, a: impl Into<Expr>, b: impl Into<Expr>) -> Expr {
        bin(op, a.into(), b.into())
    }
    /// `floordiv(self, b)`.
    pub fn floordiv(self, b: impl IntoOperand) -> Expr {
        let b = b.into_operand(self.dtype());
        bin(BinOp::FloorDiv, self, b)
    }
    /// `floormod(self, b)`.
    pub fn floormod(self, b: impl IntoOperand) -> Expr {
        let b = b.into_operand(self.dtype());
        bin(BinOp::FloorMod, self, b)
    }
    /// `min(self, b)`.
    pub fn min(self, b: impl IntoOperand) -> Expr {
        let b = b.into_operand(self.dtype());
        bin(BinOp::Min, self, b)
    }
    /// `max(self, b)`.
    pub fn max(self, b: impl IntoOperand) -> Expr {
        let b = b.into_operand(self.dtype());
        bin(BinOp::Max, self, b)
    }
    /// `self == b`.
    pub fn eq_(self, b: impl IntoOperand) -> Expr {
        let b = b.into_operand(self.dtype());
        bin(BinOp::Eq, self, b)
    }
    /// `self != b`.
    pub fn ne_(self, b: impl IntoOperand) -> Expr {
        let b = b.into_operand(self.dtype());
        bin(BinOp::Ne, self, b)
    }
    /// `self < b`.
    pub fn lt(self, b: impl IntoOperand) -> Expr {
        let b = b.into_operand(self.dtype());
        bin(BinOp::Lt, self, b)
    }
    /// `self <= b`.
    pub fn le(self, b: impl IntoOperand) -> Expr {
        let b = b.into_operand(self.dtype());
        bin(BinOp::Le, self, b)
    }
    /// `self > b`.
    pub fn gt(self, b: impl IntoOperand) -> Expr {
        let b = b.into_operand(self.dtype());
        bin(BinOp::Gt, self, b)
    }
    /// `self >= b`.
    pub fn ge(self, b: impl IntoOperand) -> Expr {
        let b = b.into_operand(self.dtype());
        bin(BinOp::Ge, self, b)
    }
    /// `self && b` (bools).
    pub fn and(self, b: impl Into<Expr>) -> Expr {
        bin(BinOp::And, self, b.into())
    }
    /// `self || b` (bools).
    pub fn or(self, b: impl Into<Expr>) -> Expr {
        bin(BinOp::Or, self, b.into())
    }

    /// Bitwise and of integers.
    pub fn bitwise_and(self, b: impl Into<Expr>) -> Expr {
        bin(BinOp::BitAnd, self, b.into())
    }

    /// Bitwise or of integers.
    pub fn bitwise_or(self, b: impl Into<Expr>) -> Expr {
        bin(BinOp::BitOr, self, b.into())
    }

    /// Bitwise exclusive or of integers.
    pub fn bitwise_xor(self, b: impl Into<Expr>) -> Expr {
        bin(BinOp::BitXor, self, b.into())
    }

    /// `self << (b mod width)`.
    pub fn shift_left(self, b: impl Into<Expr>) -> Expr {
        bin(BinOp::Shl, self, b.into())
    }

    /// `self >> (b mod width)`: arithmetic for signed, logical for unsigned types.
    pub fn shift_right(self, b: impl Into<Expr>) -> Expr {
        bin(BinOp::Shr, self, b.into())
    }

    /// The bits of `self` read as `dtype` (same size).
    pub fn reinterpret(self, dtype: DataType) -> Expr {
        reinterpret(dtype, self)
    }
    /// Converts to `dtype` (a float → integer conversion saturates: [`Expr::Cast`]).
    pub fn cast(self, dtype: DataType) -> Expr {
        Expr::Cast {
            dtype,
            value: Box::new(self),
            saturate: true,
        }
    }
    /// Converts a float to the integer type `dtype`, truncating toward zero, where a value
    /// out of the type's range or NaN gives an unspecified value of the type instead of
    /// saturating (TVM's and C's conversion; see [`Expr::Cast`]). Other casts are as
    /// [`Expr::cast`]'s.
    pub fn cast_unsaturated(self, dtype: DataType) -> Expr {
        let saturate = !(dtype.is_int() && self.dtype().is_float());
        Expr::Cast {
            dtype,
            value: Box::new(self),
            saturate,
        }
    }
}

/// Something usable as the second operand of an operator whose first operand has type `dtype`:
/// an [`Expr`], a [`Var`], or a Rust number (made a constant of type `dtype`).
pub trait IntoOperand {
    /// The operand as an expression.
    fn into_operand(self, dtype: DataType) -> Expr;
}
impl IntoOperand for Expr {
    fn into_operand(self, _: DataType) -> Expr {
        self
    }
}
impl IntoOperand for &Expr {
    fn into_operand(self, _: DataType) -> Expr {
        self.clone()
    }
}
impl IntoOperand for &Var {
    fn into_operand(self, _: DataType) -> Expr {
        Expr::Var(self.clone())
    }
}
macro_rules! num_operand {
    ($($t:ty),*) => {$(
        impl IntoOperand for $t {
            fn into_operand(self, dtype: DataType) -> Expr {
                constant(dtype, self as f64)
            }
        }
    )*};
}
num_operand!(i32, i64, f32, f64);

macro_rules! arith {
    ($tr:ident, $m:ident, $op:expr) => {
        impl<R: IntoOperand> ops::$tr<R> for Expr {
            type Output = Expr;
            fn $m(self, rhs: R) -> Expr {
                let b = rhs.into_operand(self.dtype());
                bin($op, self, b)
            }
        }
        impl<R: IntoOperand> ops::$tr<R> for &Expr {
            type Output = Expr;
            fn $m(self, rhs: R) -> Expr {
                let b = rhs.into_operand(self.dtype());
                bin($op, self.clone(), b)
            }
        }
        impl<R: IntoOperand> ops::$tr<R> for &Var {
            type Output = Expr;
            fn $m(self, rhs: R) -> Expr {
                let b = rhs.into_operand(self.dtype);
                bin($op, Expr::Var(self.clone()), b)
            }
        }
    };
}
arith!(Add, add, BinOp::Add);
arith!(Sub, sub, BinOp::Sub);
arith!(Mul, mul, BinOp::Mul);
arith!(Div, div, BinOp::Div);
arith!(Rem, rem, BinOp::Mod);

/// `!e`: logical not of a bool.
impl ops::Not for Expr {
    type Output = Expr;
    fn not(self) -> Expr {
        Expr::Not(Box::new(self))
    }
}

impl ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        let zero = constant(self.dtype(), 0.0);
        bin(BinOp::Sub, zero, self)
    }
}

/// `cond ? t : f`.
pub fn select(cond: impl Into<Expr>, t: impl Into<Expr>, f: impl Into<Expr>) -> Expr {
    Expr::Select {
        cond: Box::new(cond.into()),
        t: Box::new(t.into()),
        f: Box::new(f.into()),
    }
}

/// `let var = value in body(var)` with a fresh variable.
pub fn let_expr(name: &str, value: impl Into<Expr>, body: impl FnOnce(Expr) -> Expr) -> Expr {
    let value = value.into();
    let var = Var::new(name, value.dtype());
    let body = body(Expr::Var(var.clone()));
    Expr::Let {
        var,
        value: Box::new(value),
        body: Box::new(body),
    }
}

/// A call of a math intrinsic.
pub fn call(op: Intrinsic, args: Vec<Expr>) -> Expr {
    Expr::Call { op, args }
}

macro_rules! unary_intrinsics {
    ($($f:ident => $op:ident),*) => {$(
        #[doc = concat!("`", stringify!($f), "(x)`.")]
        pub fn $f(x: impl Into<Expr>) -> Expr {
            call(Intrinsic::$op, vec![x.into()])
        }
    )*};
}
unary_intrinsics!(exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt, tanh => Tanh,
    sigmoid => Sigmoid, abs => Abs, floor => Floor, ceil => Ceil, round => Round, erf => Erf,
    bitwise_not => BitwiseNot, clz => Clz, popcount => Popcount, isnan => IsNan,
    isinf => IsInf, isfinite => IsFinite, trunc => Trunc, nearbyint => Nearbyint, sin => Sin,
    cos => Cos, tan => Tan, asin => Asin, acos => Acos, atan => Atan, sinh => Sinh,
    cosh => Cosh, asinh => Asinh, acosh => Acosh, atanh => Atanh, log2 => Log2,
    log10 => Log10, log1p => Log1p, exp2 => Exp2, exp10 => Exp10, expm1 => Expm1,
    fast_exp => FastExp);

macro_rules! binary_intrinsics {
    ($($f:ident => $op:ident),*) => {$(
        #[doc = concat!("`", stringify!($f), "(x, y)`.")]
        pub fn $f(x: impl Into<Expr>, y: impl Into<Expr>) -> Expr {
            call(Intrinsic::$op, vec![x.into(), y.into()])
        }
    )*};
}
binary_intrinsics!(copysign => Copysign, atan2 => Atan2, hypot => Hypot);

/// The expression `cond ? t : f` evaluating only the chosen arm (TIR's `if_then_else`;
/// compare [`select`]; the statement form is [`if_then_else`]).
pub fn if_then_else_expr(cond: impl Into<Expr>, t: impl Into<Expr>, f: impl Into<Expr>) -> Expr {
    Expr::IfThenElse {
        cond: Box::new(cond.into()),
        t: Box::new(t.into()),
        f: Box::new(f.into()),
    }
}

/// The bits of `x` read as `dtype` (same size).
pub fn reinterpret(dtype: DataType, x: impl Into<Expr>) -> Expr {
    Expr::Reinterpret {
        dtype,
        value: Box::new(x.into()),
    }
}

/// A call of the external C function `symbol` returning `dtype` (TIR's `call_extern`).
pub fn call_extern(dtype: DataType, symbol: &str, args: Vec<Expr>) -> Expr {
    Expr::CallExtern {
        dtype,
        symbol: symbol.into(),
        args,
    }
}

/// `pow(x, y)`.
pub fn pow(x: impl Into<Expr>, y: impl Into<Expr>) -> Expr {
    call(Intrinsic::Pow, vec![x.into(), y.into()])
}

/// `fma(x, y, z) = x * y + z`, rounded once.
pub fn fma(x: impl Into<Expr>, y: impl Into<Expr>, z: impl Into<Expr>) -> Expr {
    call(Intrinsic::Fma, vec![x.into(), y.into(), z.into()])
}

impl Buffer {
    /// `self[indices]`; the indices may be a slice, an array or a `Vec` of [`Expr`].
    pub fn load(&self, indices: impl Into<Vec<Expr>>) -> Expr {
        Expr::Load {
            buffer: self.clone(),
            indices: indices.into(),
        }
    }

    /// `self[indices] = value`.
    pub fn store(&self, indices: impl Into<Vec<Expr>>, value: impl Into<Expr>) -> Stmt {
        Stmt::Store {
            buffer: self.clone(),
            indices: indices.into(),
            value: value.into(),
        }
    }

    /// A temporary buffer (`local` or `workspace`), compact.
    pub fn temp(name: &str, dtype: DataType, shape: Vec<Expr>, scope: StorageScope) -> Buffer {
        Buffer::new(name, dtype, shape).with_scope(scope)
    }

    /// `allocate self { body }`.
    pub fn allocate(&self, body: Stmt) -> Stmt {
        Stmt::Allocate {
            buffer: self.clone(),
            body: Box::new(body),
        }
    }
}

/// A symbolic shape variable (`int64`).
pub fn size_var(name: &str) -> Var {
    Var::new(name, DataType::i64())
}

/// `for name in [0, extent) { body(i) }` with a loop variable of the extent's type.
pub fn for_range(
    name: &str,
    extent: impl Into<Expr>,
    kind: ForKind,
    body: impl FnOnce(Expr) -> Stmt,
) -> Stmt {
    let extent = extent.into();
    let dtype = extent.dtype();
    let var = Var::new(name, dtype);
    let body = body(Expr::Var(var.clone()));
    Stmt::For {
        var,
        min: int(dtype, 0),
        extent,
        kind,
        body: Box::new(body),
    }
}

/// A loop bound to a GPU-style thread index: `for name in thread_binding[tag](0, extent)`, the
/// loop variable having the extent's type (see [`super::device`] for the execution model).
///
/// ```
/// use kiln::ir::{builder::*, Buffer, DataType, Expr, ThreadTag};
/// let a = Buffer::new("A", DataType::f32(), vec![Expr::from(256i64)]);
/// let k = thread_for("bx", Expr::from(4i64), ThreadTag::Block(0), |bx| {
///     thread_for("tx", Expr::from(64i64), ThreadTag::Thread(0), |tx| {
///         a.store([bx * 64i64 + tx], Expr::from(0.0f32))
///     })
/// });
/// assert!(k.to_string().contains("thread_binding[threadIdx.x]"));
/// ```
pub fn thread_for(
    name: &str,
    extent: impl Into<Expr>,
    tag: ThreadTag,
    body: impl FnOnce(Expr) -> Stmt,
) -> Stmt {
    for_range(name, extent, ForKind::ThreadBinding(tag), body)
}

/// A work-group barrier (`Stmt::Barrier`): in a kernel, inside a `threadIdx` loop.
pub fn barrier() -> Stmt {
    Stmt::Barrier
}

impl Buffer {
    /// A `shared` (per block) buffer for a device kernel, compact, with a constant shape.
    pub fn shared(name: &str, dtype: DataType, shape: &[i64]) -> Buffer {
        let dims = shape.iter().map(|d| Expr::from(*d)).collect();
        Buffer::new(name, dtype, dims).with_scope(StorageScope::Shared)
    }
}

/// `let name = value` in `body(var)` (statement form).
pub fn let_stmt(name: &str, value: impl Into<Expr>, body: impl FnOnce(Expr) -> Stmt) -> Stmt {
    let value = value.into();
    let var = Var::new(name, value.dtype());
    let body = body(Expr::Var(var.clone()));
    Stmt::Let {
        var,
        value,
        body: Box::new(body),
    }
}

/// `if cond { then } else { otherwise }`.
pub fn if_then_else(cond: impl Into<Expr>, then: Stmt, otherwise: Option<Stmt>) -> Stmt {
    Stmt::IfThenElse {
        cond: cond.into(),
        then_case: Box::new(then),
        else_case: otherwise.map(Box::new),
    }
}

const AXIS_NAMES: [&str; 6] = ["i", "j", "k", "l", "m", "n"];

fn axis_name(prefix: &str, d: usize) -> String {
    match AXIS_NAMES.get(d) {
        Some(n) if prefix.is_empty() => n.to_string(),
        _ => format!("{prefix}{d}"),
    }
}

/// Loop nest over `extents` (serial, outermost first) with `body(indices)` innermost.
pub fn loop_nest(prefix: &str, extents: &[Expr], body: impl FnOnce(&[Expr]) -> Stmt) -> Stmt {
    let vars: Vec<Var> = extents
        .iter()
        .enumerate()
        .map(|(d, e)| Var::new(&axis_name(prefix, d), e.dtype()))
        .collect();
    let idx: Vec<Expr> = vars.iter().map(Expr::from).collect();
    let mut stmt = body(&idx);
    for (var, extent) in vars.into_iter().zip(extents).rev() {
        let dtype = var.dtype;
        stmt = Stmt::For {
            var,
            min: int(dtype, 0),
            extent: extent.clone(),
            kind: ForKind::Serial,
            body: Box::new(stmt),
        };
    }
    stmt
}

/// `out[i, j, ...] = f([i, j, ...])` for every element of `out`: a loop nest over its shape.
///
/// ```
/// use kiln::ir::{builder::compute, Buffer, DataType, Expr};
/// let a = Buffer::new("A", DataType::f32(), vec![Expr::from(4i64), Expr::from(8i64)]);
/// let b = Buffer::new("B", DataType::f32(), vec![Expr::from(8i64), Expr::from(4i64)]);
/// let transpose = compute(&b, |ix| a.load(&[ix[1].clone(), ix[0].clone()]));
/// assert!(transpose.to_string().contains("B[i, j] = A[j, i]"));
/// ```
pub fn compute(out: &Buffer, f: impl FnOnce(&[Expr]) -> Expr) -> Stmt {
    loop_nest("", &out.shape, |ix| out.store(ix, f(ix)))
}

/// A reduction operator with its identity element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reducer {
    /// `+`, initial value 0.
    Sum,
    /// `max`, initial value the type's minimum (`-inf` for floats).
    Max,
    /// `min`, initial value the type's maximum (`+inf` for floats).
    Min,
}

impl Reducer {
    /// The identity element for `dtype`.
    pub fn init(self, dtype: DataType) -> Expr {
        match self {
            Reducer::Sum => constant(dtype, 0.0),
            Reducer::Max => min_value(dtype),
            Reducer::Min => max_value(dtype),
        }
    }

    /// Combines an accumulator with a value.
    pub fn combine(self, acc: Expr, value: Expr) -> Expr {
        match self {
            Reducer::Sum => acc + value,
            Reducer::Max => acc.max(value),
            Reducer::Min => acc.min(value),
        }
    }
}

/// `out[ix] = reduce(r over reduce_extents) f(ix, r)`, lowered to
/// `for ix { out[ix] = init; for r { out[ix] = combine(out[ix], f(ix, r)) } }`.
///
/// ```
/// use kiln::ir::{builder::{reduce, Reducer}, Buffer, DataType, Expr};
/// let a = Buffer::new("A", DataType::f32(), vec![Expr::from(4i64), Expr::from(8i64)]);
/// let b = Buffer::new("B", DataType::f32(), vec![Expr::from(4i64)]);
/// let rowsum = reduce(&b, Reducer::Sum, &[Expr::from(8i64)], |i, r| a.load(&[i[0].clone(), r[0].clone()]));
/// assert!(rowsum.to_string().contains("B[i] = B[i] + A[i, k0]"));
/// ```
pub fn reduce(
    out: &Buffer,
    reducer: Reducer,
    reduce_extents: &[Expr],
    f: impl FnOnce(&[Expr], &[Expr]) -> Expr,
) -> Stmt {
    loop_nest("", &out.shape, |ix| {
        let init = out.store(ix, reducer.init(out.dtype));
        let update = loop_nest("k", reduce_extents, |r| {
            let value = f(ix, r);
            out.store(ix, reducer.combine(out.load(ix), value))
        });
        Stmt::Seq(vec![init, update])
    })
}
