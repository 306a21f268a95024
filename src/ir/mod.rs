//! The tensor IR that kiln compiles: loops over buffers, like TVM's TIR, small enough to learn
//! in an afternoon and exact enough to be the oracle of every codegen test.
//!
//! # Design
//!
//! - [`DataType`] is a DLPack `(code, bits, lanes)` triple (`float32`, `int64`, `bool`, ...).
//! - [`Expr`] is an enum tree (boxed children); [`Expr::dtype`] gives every node's type. Binary
//!   operators share one variant with a [`BinOp`] code; math functions are [`Expr::Call`] with an
//!   [`Intrinsic`]. There is no implicit conversion: operands of a binary op have one type.
//! - [`Var`]s are identified by their [`VarId`]; names are only for printing and JSON.
//! - [`Stmt`] covers loops ([`ForKind`]), `while` loops, stores, allocations, `let`, `if`,
//!   sequences, `evaluate`, `assert`, `return`, prefetches and barriers.
//! - A [`Buffer`] is a typed, shaped view of a data pointer; its shape holds constants or
//!   symbolic variables, bound by the first buffer parameter they appear in. A [`PrimFunc`] has
//!   buffer and scalar [`Param`]s, a body, an optional return type and [`FuncAttrs`]; an
//!   [`IRModule`] is a list of named functions.
//!
//! Around the data structures: [`json`] (the versioned `kiln-ir/1` format of `docs/ir.md`),
//! [`builder`] (operators, loop helpers, `compute` and reductions), the printer (`Display`),
//! [`verify`] (the well-formedness rules; nothing ill-formed reaches LLVM), [`interp`] (the
//! reference interpreter with exact semantics), [`visit`] (queries such as the free variables a
//! parallel loop body captures) and [`kernels`] (the benchmark kernels).
//!
//! # Example
//!
//! ```
//! use kiln::ir::{builder::{compute, size_var}, interp, Buffer, DataType, Expr, IRModule, Param, PrimFunc};
//!
//! let n = size_var("n");
//! let buf = |name| Buffer::new(name, DataType::f32(), vec![Expr::from(&n)]);
//! let (a, b, c) = (buf("A"), buf("B"), buf("C"));
//! let body = compute(&c, |i| a.load(i) * 2.0f32 + b.load(i));
//! let f = PrimFunc::new("axpy", vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)], body);
//! let module = IRModule::from_functions(vec![f]);
//! module.verify()?;
//! let text = module.to_json().to_string();
//! assert_eq!(IRModule::from_json_str(&text)?.to_json().to_string(), text);
//! println!("{module}"); // for i: int64 in serial(0i64, n) { C[i] = A[i] * 2.0f32 + B[i] }
//! # Ok::<(), kiln::ir::IrError>(())
//! ```

pub mod approx;
pub mod builder;
pub mod device;
pub mod dtype;
pub mod error;
pub mod expr;
pub mod func;
pub mod interp;
pub mod json;
pub mod kernels;
mod printer;
pub(crate) mod rewrite;
pub mod stmt;
pub mod verify;
pub mod visit;

pub use dtype::{DataType, TypeCode};
pub use error::{IrError, IrResult};
pub use expr::{BinOp, Expr, Intrinsic, Var, VarId};
pub use func::{Buffer, FuncAttrs, IRModule, Param, PrimFunc, StorageScope};
pub use stmt::{ForKind, Stmt, ThreadTag};
pub use visit::FreeUses;
