//! Expressions: typed trees of constants, variables, operators, loads and intrinsic calls.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::dtype::DataType;
use super::func::Buffer;

/// The identity of a variable. Two [`Var`]s are the same variable iff their ids are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(pub u32);

static NEXT_VAR: AtomicU32 = AtomicU32::new(1);

impl VarId {
    /// A fresh id, never returned before in this process.
    pub fn fresh() -> VarId {
        VarId(NEXT_VAR.fetch_add(1, Ordering::Relaxed))
    }
}

/// A typed variable: a loop variable, a `let` binding, a scalar parameter, a symbolic shape or
/// a buffer's data pointer. Equality and hashing use the id only; the name is for printing.
#[derive(Debug, Clone)]
pub struct Var {
    /// Identity.
    pub id: VarId,
    /// Name used in JSON and text (not necessarily unique).
    pub name: Arc<str>,
    /// Type of the values it holds.
    pub dtype: DataType,
}

impl Var {
    /// A fresh variable.
    pub fn new(name: &str, dtype: DataType) -> Var {
        Var {
            id: VarId::fresh(),
            name: name.into(),
            dtype,
        }
    }
}

impl PartialEq for Var {
    fn eq(&self, other: &Var) -> bool {
        self.id == other.id
    }
}
impl Eq for Var {}
impl Hash for Var {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state)
    }
}

/// Binary operators. Both operands have the same type (no implicit conversion).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinOp {
    /// `a + b` (integers wrap).
    Add,
    /// `a - b` (integers wrap).
    Sub,
    /// `a * b` (integers wrap).
    Mul,
    /// Division rounding toward zero for integers (C `/`); IEEE division for floats.
    Div,
    /// Remainder with the sign of `a` for integers (C `%`); `fmod` for floats.
    Mod,
    /// Division rounding toward negative infinity; `floor(a / b)` for floats.
    FloorDiv,
    /// `a - floordiv(a, b) * b` (sign of `b`).
    FloorMod,
    /// Minimum (NaN if either float operand is NaN).
    Min,
    /// Maximum (NaN if either float operand is NaN).
    Max,
    /// `==` (bool result; false if a float operand is NaN).
    Eq,
    /// `!=` (bool result; true if a float operand is NaN).
    Ne,
    /// `<` (bool result).
    Lt,
    /// `<=` (bool result).
    Le,
    /// `>` (bool result).
    Gt,
    /// `>=` (bool result).
    Ge,
    /// Logical and of two bools (both operands are evaluated).
    And,
    /// Logical or of two bools (both operands are evaluated).
    Or,
    /// Bitwise and of two integers.
    BitAnd,
    /// Bitwise or of two integers.
    BitOr,
    /// Bitwise exclusive or of two integers.
    BitXor,
    /// `a << (b mod width)`: the shift amount is taken modulo the bit width (its low
    /// `log2(width)` bits, read as unsigned), so every amount is defined.
    Shl,
    /// `a >> (b mod width)`: arithmetic (sign-filling) for signed types, logical for unsigned;
    /// the amount is taken modulo the bit width as for [`BinOp::Shl`].
    Shr,
}

impl BinOp {
    /// Every operator, in declaration order.
    pub const ALL: [BinOp; 22] = [
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::Div,
        BinOp::Mod,
        BinOp::FloorDiv,
        BinOp::FloorMod,
        BinOp::Min,
        BinOp::Max,
        BinOp::Eq,
        BinOp::Ne,
        BinOp::Lt,
        BinOp::Le,
        BinOp::Gt,
        BinOp::Ge,
        BinOp::And,
        BinOp::Or,
        BinOp::BitAnd,
        BinOp::BitOr,
        BinOp::BitXor,
        BinOp::Shl,
        BinOp::Shr,
    ];

    /// The JSON name (`add`, `floordiv`, `lt`, ...).
    pub fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::Div => "div",
            BinOp::Mod => "mod",
            BinOp::FloorDiv => "floordiv",
            BinOp::FloorMod => "floormod",
            BinOp::Min => "min",
            BinOp::Max => "max",
            BinOp::Eq => "eq",
            BinOp::Ne => "ne",
            BinOp::Lt => "lt",
            BinOp::Le => "le",
            BinOp::Gt => "gt",
            BinOp::Ge => "ge",
            BinOp::And => "and",
            BinOp::Or => "or",
            BinOp::BitAnd => "bitwise_and",
            BinOp::BitOr => "bitwise_or",
            BinOp::BitXor => "bitwise_xor",
            BinOp::Shl => "shift_left",
            BinOp::Shr => "shift_right",
        }
    }

    /// The operator with this JSON name.
    pub fn from_name(s: &str) -> Option<BinOp> {
        BinOp::ALL.into_iter().find(|op| op.name() == s)
    }

    /// Comparison operators produce `bool`.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        )
    }

    /// `and` / `or`.
    pub fn is_logical(self) -> bool {
        matches!(self, BinOp::And | BinOp::Or)
    }

    /// The bitwise operators and shifts, which take integers only.
    pub fn is_bitwise(self) -> bool {
        matches!(
            self,
            BinOp::BitAnd | BinOp::BitOr | BinOp::BitXor | BinOp::Shl | BinOp::Shr
        )
    }
}

/// Math intrinsics, called with [`Expr::Call`]. All take and return floats of one type, except
/// `abs`, which also accepts integers (wrapping: `abs(INT_MIN) == INT_MIN`), the integer
/// functions ([`Intrinsic::is_integer`]) and the float predicates ([`Intrinsic::is_predicate`],
/// `bool` result).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Intrinsic {
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `pow(x, y)` (two arguments).
    Pow,
    /// Absolute value (floats and integers).
    Abs,
    /// Round toward negative infinity.
    Floor,
    /// Round toward positive infinity.
    Ceil,
    /// Round to nearest, ties to even (LLVM `nearbyint`).
    Round,
    /// Error function.
    Erf,
    /// `x * y + z` with one rounding (three arguments).
    Fma,
    /// `~x` of an integer.
    BitwiseNot,
    /// Number of leading zero bits of an integer (`clz(0)` is the bit width); same type as `x`.
    Clz,
    /// Number of one bits of an integer; same type as `x`.
    Popcount,
    /// Whether a float is NaN (`bool` result).
    IsNan,
    /// Whether a float is +-infinity (`bool` result).
    IsInf,
    /// Whether a float is neither infinite nor NaN (`bool` result).
    IsFinite,
    /// The magnitude of `x` with the sign of `y` (two arguments).
    Copysign,
    /// Round toward zero.
    Trunc,
    /// Round to nearest, ties to even (as `round`).
    Nearbyint,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Tangent.
    Tan,
    /// Arc sine.
    Asin,
    /// Arc cosine.
    Acos,
    /// Arc tangent.
    Atan,
    /// `atan2(y, x)` (two arguments).
    Atan2,
    /// Hyperbolic sine.
    Sinh,
    /// Hyperbolic cosine.
    Cosh,
    /// Inverse hyperbolic sine.
    Asinh,
    /// Inverse hyperbolic cosine.
    Acosh,
    /// Inverse hyperbolic tangent.
    Atanh,
    /// Base-2 logarithm.
    Log2,
    /// Base-10 logarithm.
    Log10,
    /// `log(1 + x)`.
    Log1p,
    /// `2^x`.
    Exp2,
    /// `10^x`.
    Exp10,
    /// `e^x - 1`.
    Expm1,
    /// `sqrt(x^2 + y^2)` without undue overflow (two arguments).
    Hypot,
    /// `e^x` by a fixed polynomial approximation, chosen by the kernel (TVM's `fast_exp`): on
    /// float32, the input clamped to [-87, 88], a degree-6 polynomial after range reduction,
    /// evaluated with fused multiply-adds, the same bits on every backend (within 2 ulp of
    /// `exp` inside the range); on other float types, `exp`. See `docs/ir.md`.
    FastExp,
}

impl Intrinsic {
    /// Every intrinsic.
    pub const ALL: [Intrinsic; 42] = [
        Intrinsic::Exp,
        Intrinsic::Log,
        Intrinsic::Sqrt,
        Intrinsic::Rsqrt,
        Intrinsic::Tanh,
        Intrinsic::Sigmoid,
        Intrinsic::Pow,
        Intrinsic::Abs,
        Intrinsic::Floor,
        Intrinsic::Ceil,
        Intrinsic::Round,
        Intrinsic::Erf,
        Intrinsic::Fma,
        Intrinsic::BitwiseNot,
        Intrinsic::Clz,
        Intrinsic::Popcount,
        Intrinsic::IsNan,
        Intrinsic::IsInf,
        Intrinsic::IsFinite,
        Intrinsic::Copysign,
        Intrinsic::Trunc,
        Intrinsic::Nearbyint,
        Intrinsic::Sin,
        Intrinsic::Cos,
        Intrinsic::Tan,
        Intrinsic::Asin,
        Intrinsic::Acos,
        Intrinsic::Atan,
        Intrinsic::Atan2,
        Intrinsic::Sinh,
        Intrinsic::Cosh,
        Intrinsic::Asinh,
        Intrinsic::Acosh,
        Intrinsic::Atanh,
        Intrinsic::Log2,
        Intrinsic::Log10,
        Intrinsic::Log1p,
        Intrinsic::Exp2,
        Intrinsic::Exp10,
        Intrinsic::Expm1,
        Intrinsic::Hypot,
        Intrinsic::FastExp,
    ];

    /// The JSON name (`exp`, `rsqrt`, `fma`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Intrinsic::Exp => "exp",
            Intrinsic::Log => "log",
            Intrinsic::Sqrt => "sqrt",
            Intrinsic::Rsqrt => "rsqrt",
            Intrinsic::Tanh => "tanh",
            Intrinsic::Sigmoid => "sigmoid",
            Intrinsic::Pow => "pow",
            Intrinsic::Abs => "abs",
            Intrinsic::Floor => "floor",
            Intrinsic::Ceil => "ceil",
            Intrinsic::Round => "round",
            Intrinsic::Erf => "erf",
            Intrinsic::Fma => "fma",
            Intrinsic::BitwiseNot => "bitwise_not",
            Intrinsic::Clz => "clz",
            Intrinsic::Popcount => "popcount",
            Intrinsic::IsNan => "isnan",
            Intrinsic::IsInf => "isinf",
            Intrinsic::IsFinite => "isfinite",
            Intrinsic::Copysign => "copysign",
            Intrinsic::Trunc => "trunc",
            Intrinsic::Nearbyint => "nearbyint",
            Intrinsic::Sin => "sin",
            Intrinsic::Cos => "cos",
            Intrinsic::Tan => "tan",
            Intrinsic::Asin => "asin",
            Intrinsic::Acos => "acos",
            Intrinsic::Atan => "atan",
            Intrinsic::Atan2 => "atan2",
            Intrinsic::Sinh => "sinh",
            Intrinsic::Cosh => "cosh",
            Intrinsic::Asinh => "asinh",
            Intrinsic::Acosh => "acosh",
            Intrinsic::Atanh => "atanh",
            Intrinsic::Log2 => "log2",
            Intrinsic::Log10 => "log10",
            Intrinsic::Log1p => "log1p",
            Intrinsic::Exp2 => "exp2",
            Intrinsic::Exp10 => "exp10",
            Intrinsic::Expm1 => "expm1",
            Intrinsic::Hypot => "hypot",
            Intrinsic::FastExp => "fast_exp",
        }
    }

    /// The intrinsic with this JSON name.
    pub fn from_name(s: &str) -> Option<Intrinsic> {
        Intrinsic::ALL.into_iter().find(|op| op.name() == s)
    }

    /// Number of arguments.
    pub fn arity(self) -> usize {
        match self {
            Intrinsic::Pow | Intrinsic::Copysign | Intrinsic::Atan2 | Intrinsic::Hypot => 2,
            Intrinsic::Fma => 3,
            _ => 1,
        }
    }

    /// `bitwise_not`, `clz`, `popcount`: integer argument, same-type result.
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            Intrinsic::BitwiseNot | Intrinsic::Clz | Intrinsic::Popcount
        )
    }

    /// `isnan`, `isinf`, `isfinite`: float argument, `bool` result.
    pub fn is_predicate(self) -> bool {
        matches!(
            self,
            Intrinsic::IsNan | Intrinsic::IsInf | Intrinsic::IsFinite
        )
    }
}

/// An expression. Every node has a type, given by [`Expr::dtype`].
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// An integer or bool constant. The value is stored sign-extended for signed types and as the
    /// bit pattern for `uint64` (so `u64::MAX` is `-1`); bools are 0 or 1.
    IntImm {
        /// An integer type or `bool`.
        dtype: DataType,
        /// The value (see above).
        value: i64,
    },
    /// A floating-point constant (any value, including infinities and NaN). The value is rounded
    /// to `dtype` when evaluated.
    FloatImm {
        /// A float type.
        dtype: DataType,
        /// The value.
        value: f64,
    },
    /// A variable reference.
    Var(Var),
    /// A binary operation; see [`BinOp`].
    Binary {
        /// The operator.
        op: BinOp,
        /// Left operand.
        a: Box<Expr>,
        /// Right operand (same type as `a`).
        b: Box<Expr>,
    },
    /// Logical not of a bool.
    Not(Box<Expr>),
    /// `cond ? t : f`; both arms are evaluated.
    Select {
        /// A bool.
        cond: Box<Expr>,
        /// Value if true.
        t: Box<Expr>,
        /// Value if false (same type as `t`).
        f: Box<Expr>,
    },
    /// Type conversion. Float to int saturates (NaN gives 0) unless `saturate` is false; int to
    /// int wraps; to bool is `!= 0`.
    Cast {
        /// Target type.
        dtype: DataType,
        /// The value to convert.
        value: Box<Expr>,
        /// For a float → integer cast: whether a value out of the integer type's range (or NaN)
        /// saturates (`true`, the default), or gives an unspecified value of the type (`false`:
        /// TVM's and C's conversion, one instruction on x86, never undefined behaviour; the
        /// interpreter reports such a value as an error). Always `true` for other casts.
        saturate: bool,
    },
    /// An element of a buffer; one index per dimension.
    Load {
        /// The buffer (a parameter or an enclosing allocation).
        buffer: Buffer,
        /// Indices (`int32` or `int64`), as many as the buffer's rank.
        indices: Vec<Expr>,
    },
    /// `let var = value in body`.
    Let {
        /// The variable bound in `body`.
        var: Var,
        /// Its value (same type as `var`).
        value: Box<Expr>,
        /// The result.
        body: Box<Expr>,
    },
    /// A math intrinsic.
    Call {
        /// Which one.
        op: Intrinsic,
        /// Arguments ([`Intrinsic::arity`] of them, one type).
        args: Vec<Expr>,
    },
    /// `cond ? t : f` evaluating only the chosen arm (TIR's `if_then_else`), so an arm may
    /// guard an access that would be out of bounds.
    IfThenElse {
        /// A bool.
        cond: Box<Expr>,
        /// Value if true (evaluated only then).
        t: Box<Expr>,
        /// Value if false (same type as `t`; evaluated only then).
        f: Box<Expr>,
    },
    /// The bits of `value` read as `dtype`, a type of the same size (e.g. `float32` <-> `int32`).
    Reinterpret {
        /// Target type.
        dtype: DataType,
        /// The value whose bits are read.
        value: Box<Expr>,
    },
    /// A call of an external C function by symbol with scalar arguments (TIR's `call_extern`).
    CallExtern {
        /// The declared return type.
        dtype: DataType,
        /// The C symbol.
        symbol: Arc<str>,
        /// The arguments, passed as C scalars of their types.
        args: Vec<Expr>,
    },
}

impl Expr {
    /// The type of the value. Ill-typed trees (rejected by the verifier) still get a type: the
    /// type of the first operand.
    pub fn dtype(&self) -> DataType {
        match self {
            Expr::IntImm { dtype, .. }
            | Expr::FloatImm { dtype, .. }
            | Expr::Cast { dtype, .. }
            | Expr::Reinterpret { dtype, .. }
            | Expr::CallExtern { dtype, .. } => *dtype,
            Expr::Var(v) => v.dtype,
            Expr::Binary { op, a, .. } => {
                if op.is_comparison() {
                    DataType::bool()
                } else {
                    a.dtype()
                }
            }
            Expr::Not(_) => DataType::bool(),
            Expr::Select { t, .. } | Expr::IfThenElse { t, .. } => t.dtype(),
            Expr::Load { buffer, .. } => buffer.dtype,
            Expr::Let { body, .. } => body.dtype(),
            Expr::Call { op, .. } if op.is_predicate() => DataType::bool(),
            Expr::Call { args, .. } => args.first().map_or(DataType::f32(), Expr::dtype),
        }
    }

    /// The constant value if this is an integer constant.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Expr::IntImm { value, .. } => Some(*value),
            _ => None,
        }
    }

    /// The variable if this is a variable reference.
    pub fn as_var(&self) -> Option<&Var> {
        match self {
            Expr::Var(v) => Some(v),
            _ => None,
        }
    }
}

impl From<Var> for Expr {
    fn from(v: Var) -> Expr {
        Expr::Var(v)
    }
}
impl From<&Var> for Expr {
    fn from(v: &Var) -> Expr {
        Expr::Var(v.clone())
    }
}
impl From<&Expr> for Expr {
    fn from(e: &Expr) -> Expr {
        e.clone()
    }
}
/// An `int32` constant.
impl From<i32> for Expr {
    fn from(v: i32) -> Expr {
        Expr::IntImm {
            dtype: DataType::i32(),
            value: v as i64,
        }
    }
}
/// An `int64` constant.
impl From<i64> for Expr {
    fn from(v: i64) -> Expr {
        Expr::IntImm {
            dtype: DataType::i64(),
            value: v,
        }
    }
}
/// A `float32` constant.
impl From<f32> for Expr {
    fn from(v: f32) -> Expr {
        Expr::FloatImm {
            dtype: DataType::f32(),
            value: v as f64,
        }
    }
}
/// A `float64` constant.
impl From<f64> for Expr {
    fn from(v: f64) -> Expr {
        Expr::FloatImm {
            dtype: DataType::f64(),
            value: v,
        }
    }
}
/// A `bool` constant.
impl From<bool> for Expr {
    fn from(v: bool) -> Expr {
        Expr::IntImm {
            dtype: DataType::bool(),
            value: v as i64,
        }
    }
}

impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}
