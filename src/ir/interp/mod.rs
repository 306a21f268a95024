//! The reference interpreter: runs a [`PrimFunc`] on host tensors with the IR's exact semantics.
//!
//! It is slow (a tree walk) and meant as the oracle against which compiled code is tested:
//!
//! - integers wrap at their width; `div`/`mod` truncate, `floordiv`/`floormod` round toward
//!   negative infinity; integer division or modulo by zero is an error (generated code raises
//!   a `RuntimeError` instead of trapping);
//! - float ops on `float16`/`bfloat16` are computed in `float32` and rounded to nearest-even,
//!   `float32` ops in `float32`, `float64` in `float64`; `min`/`max` return NaN if either operand
//!   is NaN and order `-0.0` below `+0.0` (LLVM `minimum`/`maximum`);
//! - float-to-int casts saturate and map NaN to 0;
//! - loads and stores are bounds-checked (an error, never a wild access); `select`, `and` and
//!   `or` evaluate both operands; loops of every kind run serially in order; allocations start
//!   zero-filled;
//! - device kernels (outermost `thread_binding` loop nests, see [`super::device`]) are launched:
//!   blocks run one after the other, the threads of a block in lock-step (each statement runs for
//!   every active thread before the next; an `if` on a thread-dependent condition runs its
//!   branches for the threads that take them; a loop runs while any thread still iterates), with
//!   one environment and set of `local` buffers per thread and one copy of each `shared` buffer
//!   per block. A `barrier` must be reached by all threads of the block. Shared-memory accesses
//!   are checked for data races: an element written by one thread and read (or overwritten with
//!   another value) by another thread, or read by one and then written by another, with no
//!   barrier in between, is an error naming the buffer, the element and both threads.
//!
//! # Design
//!
//! The interpreter is a tree walk over one `Interp` state: the function, an environment from
//! variables to [`Scalar`] values, and the live buffers (shape, strides and little-endian bytes,
//! the layout of a [`HostBuffer`]). [`run`] checks and binds the arguments, executes the body
//! statement by statement (each statement ends normally or with a `return` value) and gives the
//! buffers back. A device kernel is handed to the lock-step executor, which keeps one block of
//! per-thread environments and `local` buffers, swaps a thread's state into the interpreter to
//! run an expression or a simple statement as that thread, and records shared-memory accesses
//! between barriers to find races. The scalar semantics (casts, operators, intrinsics) are free
//! functions on [`Scalar`], public so that other code and tests can apply exactly these rules.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`run`], the limits, the interpreter's state |
//! | `value.rs` | [`Scalar`], [`Element`], [`HostBuffer`], [`InterpArg`]; scalars to and from bytes |
//! | `bind.rs` | checking the arguments against the parameters and binding them (shapes, strides, sizes) |
//! | `eval.rs` | expression evaluation and bounds-checked buffer addressing |
//! | `exec.rs` | statement execution on the host; allocations |
//! | `simt.rs` | device kernels: launch, threads in lock-step, barriers, shared-memory race detection |
//! | `ops.rs` | [`cast`], [`reinterpret`], [`binary`]: the IR's arithmetic |
//! | `math.rs` | [`intrinsic`] and [`erf`]: the math functions |
//!
//! # Example
//!
//! ```
//! use kiln::ir::{interp::{run, HostBuffer, InterpArg}, kernels};
//! let f = kernels::vadd();
//! let mut args = [
//!     InterpArg::Buffer(HostBuffer::from_slice(&[3], &[1.0f32, 2.0, 3.0])),
//!     InterpArg::Buffer(HostBuffer::from_slice(&[3], &[10.0f32, 20.0, 30.0])),
//!     InterpArg::Buffer(HostBuffer::zeros(kiln::ir::DataType::f32(), &[3])),
//! ];
//! run(&f, &mut args).unwrap();
//! assert_eq!(args[2].to_vec::<f32>().unwrap(), vec![11.0, 22.0, 33.0]);
//! ```

mod bind;
mod eval;
mod exec;
mod math;
mod ops;
mod simt;
mod value;

use std::collections::HashMap;

use super::dtype::DataType;
use super::error::{IrError, IrResult};
use super::expr::VarId;
use super::func::{Param, PrimFunc};
use simt::Block;

pub use math::{erf, intrinsic};
pub use ops::{binary, cast, fits_int, reinterpret};
pub use value::{round_to, Element, HostBuffer, InterpArg, Scalar};

/// The largest allocation (in bytes) the interpreter makes for one `allocate`.
pub const MAX_ALLOCATION: i64 = 1 << 30;

/// The most threads per block the interpreter simulates.
pub const MAX_BLOCK_THREADS: i64 = 1 << 16;

/// A live buffer: its bytes and the shape and strides (in elements) they are addressed with.
struct BufState {
    name: String,
    dtype: DataType,
    shape: Vec<i64>,
    strides: Vec<i64>,
    data: Vec<u8>,
}

/// How a statement ended.
enum Flow {
    Normal,
    Return(Scalar),
}

/// The interpreter's state while it runs one function.
struct Interp<'f> {
    func: &'f PrimFunc,
    env: HashMap<VarId, Scalar>,
    bufs: HashMap<VarId, BufState>,
    /// The block being run, inside a kernel.
    simt: Option<Block>,
}

/// Runs `func` on `args` (one per parameter, in order). Buffer arguments are updated in place.
/// Returns the value of `return`, if the function has a return type.
///
/// The function is verified first. Arguments are checked like generated code checks them: count,
/// kinds, dtype, rank, constant and symbolic shapes (a shape variable is bound by its first
/// appearance and must match later ones), strides, and that each buffer holds enough bytes.
///
/// # Errors
/// [`IrError::Verify`] if the function is ill-formed; [`IrError::Interp`] for bad arguments and
/// run-time errors (out-of-bounds access, integer division by zero, failed `assert`, a function
/// with a return type that ends without `return`).
pub fn run(func: &PrimFunc, args: &mut [InterpArg]) -> IrResult<Option<Scalar>> {
    func.verify()?;
    super::error::with_big_stack(|| run_here(func, args))
}

fn run_here(func: &PrimFunc, args: &mut [InterpArg]) -> IrResult<Option<Scalar>> {
    let mut it = Interp {
        func,
        env: HashMap::new(),
        bufs: HashMap::new(),
        simt: None,
    };
    let bound = it.bind_params(args);
    let result = bound.and_then(|()| it.stmt(&func.body));
    // Give the buffers back, even after an error.
    for (p, a) in func.params.iter().zip(args.iter_mut()) {
        if let (Param::Buffer(b), InterpArg::Buffer(h)) = (p, a) {
            if let Some(state) = it.bufs.remove(&b.data.id) {
                h.data = state.data;
            }
        }
    }
    match (result?, func.ret_type) {
        (Flow::Return(v), _) => Ok(Some(v)),
        (Flow::Normal, None) => Ok(None),
        (Flow::Normal, Some(t)) => Err(it.error(format!(
            "the function returns {t} but ended without `return`"
        ))),
    }
}

impl<'f> Interp<'f> {
    fn error(&self, message: String) -> IrError {
        IrError::Interp {
            func: self.func.name.clone(),
            message,
        }
    }
}
