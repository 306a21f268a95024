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

use std::collections::HashMap;

use half::{bf16, f16};

use super::builder::wrap_int;
use super::dtype::{DataType, TypeCode};
use super::error::{IrError, IrResult};
use super::expr::{BinOp, Expr, Intrinsic, VarId};
use super::func::{Buffer, Param, PrimFunc, StorageScope};
use super::stmt::{ForKind, Stmt, ThreadTag};

/// The largest allocation (in bytes) the interpreter makes for one `allocate`.
pub const MAX_ALLOCATION: i64 = 1 << 30;

/// The most threads per block the interpreter simulates.
pub const MAX_BLOCK_THREADS: i64 = 1 << 16;

/// A typed scalar value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A `bool`.
    Bool(bool),
    /// A signed integer of the given type (value sign-extended).
    Int(DataType, i64),
    /// An unsigned integer of the given type.
    UInt(DataType, u64),
    /// A float of the given type (the value is exactly representable in it).
    Float(DataType, f64),
}

impl Scalar {
    /// An `int32`.
    pub fn i32(v: i32) -> Scalar {
        Scalar::Int(DataType::i32(), v as i64)
    }
    /// An `int64`.
    pub fn i64(v: i64) -> Scalar {
        Scalar::Int(DataType::i64(), v)
    }
    /// A `float32`.
    pub fn f32(v: f32) -> Scalar {
        Scalar::Float(DataType::f32(), v as f64)
    }
    /// A `float64`.
    pub fn f64(v: f64) -> Scalar {
        Scalar::Float(DataType::f64(), v)
    }

    /// The value's type.
    pub fn dtype(&self) -> DataType {
        match self {
            Scalar::Bool(_) => DataType::bool(),
            Scalar::Int(t, _) | Scalar::UInt(t, _) | Scalar::Float(t, _) => *t,
        }
    }

    /// The value as `f64` (bools are 0 or 1; large integers round).
    pub fn as_f64(&self) -> f64 {
        match *self {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(_, v) => v as f64,
            Scalar::UInt(_, v) => v as f64,
            Scalar::Float(_, v) => v,
        }
    }

    /// The value as `i128` for integers and bools; floats truncate (saturating, NaN is 0).
    pub fn as_i128(&self) -> i128 {
        match *self {
            Scalar::Bool(b) => b as i128,
            Scalar::Int(_, v) => v as i128,
            Scalar::UInt(_, v) => v as i128,
            Scalar::Float(_, v) => v as i128,
        }
    }

    /// The value as `i64` (wrapping for `uint64`).
    pub fn as_i64(&self) -> i64 {
        self.as_i128() as i64
    }

    /// Truth value: non-zero.
    pub fn as_bool(&self) -> bool {
        match *self {
            Scalar::Bool(b) => b,
            Scalar::Float(_, v) => v != 0.0,
            _ => self.as_i128() != 0,
        }
    }

    /// An integer (or bool) of type `dtype` from an unbounded value, wrapping.
    pub fn from_int(dtype: DataType, v: i128) -> Scalar {
        match dtype.code {
            TypeCode::Bool => Scalar::Bool(v != 0),
            TypeCode::UInt => Scalar::UInt(dtype, wrap_int(dtype, v as i64) as u64),
            TypeCode::Float | TypeCode::BFloat => Scalar::Float(dtype, round_to(dtype, v as f64)),
            _ => Scalar::Int(dtype, wrap_int(dtype, v as i64)),
        }
    }

    /// A float of type `dtype`, rounded to it.
    pub fn from_float(dtype: DataType, v: f64) -> Scalar {
        Scalar::Float(dtype, round_to(dtype, v))
    }
}

/// Rounds `v` to the float type `dtype` (nearest, ties to even).
pub fn round_to(dtype: DataType, v: f64) -> f64 {
    match (dtype.code, dtype.bits) {
        (TypeCode::Float, 16) => f16::from_f64(v).to_f64(),
        (TypeCode::BFloat, _) => bf16::from_f64(v).to_f64(),
        (TypeCode::Float, 32) => v as f32 as f64,
        _ => v,
    }
}

/// Types that can be stored in a [`HostBuffer`].
pub trait Element: Copy {
    /// The IR type of the element.
    const DTYPE: DataType;
    /// Little-endian bytes.
    fn write(self, out: &mut Vec<u8>);
    /// Reads from little-endian bytes (`bytes.len()` is the element size).
    fn read(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DataType = DataType::$d();
            fn write(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
        }
    )*};
}
element!(i8 => i8, i16 => i16, i32 => i32, i64 => i64, u8 => u8, u16 => u16, u32 => u32, u64 => u64,
    f32 => f32, f64 => f64, f16 => f16, bf16 => bf16);

impl Element for bool {
    const DTYPE: DataType = DataType::bool();
    fn write(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn read(bytes: &[u8]) -> Self {
        bytes.first().is_some_and(|b| *b != 0)
    }
}

/// A tensor in host memory: the interpreter's buffer argument.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBuffer {
    /// Element type.
    pub dtype: DataType,
    /// Extents.
    pub shape: Vec<i64>,
    /// Element strides; `None` means compact row-major.
    pub strides: Option<Vec<i64>>,
    /// Little-endian element bytes.
    pub data: Vec<u8>,
}

impl HostBuffer {
    /// A zero-filled compact buffer (negative extents count as 0).
    ///
    /// # Panics
    /// Like `vec!`, if the byte size does not fit in memory.
    pub fn zeros(dtype: DataType, shape: &[i64]) -> HostBuffer {
        let n = shape
            .iter()
            .fold(1i64, |acc, d| acc.saturating_mul((*d).max(0)));
        HostBuffer {
            dtype,
            shape: shape.to_vec(),
            strides: None,
            data: vec![0; (n as usize).saturating_mul(dtype.bytes())],
        }
    }

    /// A compact buffer holding `values` (row-major). The element count is not checked here: the
    /// interpreter reports a buffer too small for its shape when it is passed.
    pub fn from_slice<T: Element>(shape: &[i64], values: &[T]) -> HostBuffer {
        let mut data = Vec::with_capacity(values.len() * T::DTYPE.bytes());
        for v in values {
            v.write(&mut data);
        }
        HostBuffer {
            dtype: T::DTYPE,
            shape: shape.to_vec(),
            strides: None,
            data,
        }
    }

    /// The elements in storage order, or `None` if `T` is not the buffer's type.
    pub fn to_vec<T: Element>(&self) -> Option<Vec<T>> {
        if T::DTYPE != self.dtype {
            return None;
        }
        Some(
            self.data
                .chunks_exact(self.dtype.bytes())
                .map(T::read)
                .collect(),
        )
    }

    /// The element at storage position `i`.
    pub fn get(&self, i: usize) -> Option<Scalar> {
        let n = self.dtype.bytes();
        let bytes = self
            .data
            .get(i.checked_mul(n)?..i.checked_mul(n)?.checked_add(n)?)?;
        Some(read_scalar(self.dtype, bytes))
    }
}

/// An argument of [`run`].
#[derive(Debug, Clone, PartialEq)]
pub enum InterpArg {
    /// For a buffer parameter; holds the result after the run.
    Buffer(HostBuffer),
    /// For a scalar parameter.
    Scalar(Scalar),
}

impl InterpArg {
    /// The buffer, if this is one.
    pub fn buffer(&self) -> Option<&HostBuffer> {
        match self {
            InterpArg::Buffer(b) => Some(b),
            InterpArg::Scalar(_) => None,
        }
    }

    /// The buffer's elements, if this is a buffer of `T`.
    pub fn to_vec<T: Element>(&self) -> Option<Vec<T>> {
        self.buffer()?.to_vec()
    }
}

fn read_scalar(dtype: DataType, b: &[u8]) -> Scalar {
    match (dtype.code, dtype.bits) {
        (TypeCode::Bool, _) => Scalar::Bool(bool::read(b)),
        (TypeCode::Int, 8) => Scalar::Int(dtype, i8::read(b) as i64),
        (TypeCode::Int, 16) => Scalar::Int(dtype, i16::read(b) as i64),
        (TypeCode::Int, 32) => Scalar::Int(dtype, i32::read(b) as i64),
        (TypeCode::Int, _) => Scalar::Int(dtype, i64::read(b)),
        (TypeCode::UInt, 8) => Scalar::UInt(dtype, u8::read(b) as u64),
        (TypeCode::UInt, 16) => Scalar::UInt(dtype, u16::read(b) as u64),
        (TypeCode::UInt, 32) => Scalar::UInt(dtype, u32::read(b) as u64),
        (TypeCode::UInt, _) => Scalar::UInt(dtype, u64::read(b)),
        (TypeCode::Float, 16) => Scalar::Float(dtype, f16::read(b).to_f64()),
        (TypeCode::BFloat, _) => Scalar::Float(dtype, bf16::read(b).to_f64()),
        (TypeCode::Float, 32) => Scalar::Float(dtype, f32::read(b) as f64),
        (TypeCode::Float, _) => Scalar::Float(dtype, f64::read(b)),
        (TypeCode::Handle, _) => Scalar::UInt(dtype, u64::read(b)),
    }
}

fn write_scalar(v: Scalar, out: &mut [u8]) {
    let mut bytes = Vec::with_capacity(8);
    let t = v.dtype();
    match (t.code, t.bits) {
        (TypeCode::Float, 16) => f16::from_f64(v.as_f64()).write(&mut bytes),
        (TypeCode::BFloat, _) => bf16::from_f64(v.as_f64()).write(&mut bytes),
        (TypeCode::Float, 32) => (v.as_f64() as f32).write(&mut bytes),
        (TypeCode::Float, _) => v.as_f64().write(&mut bytes),
        _ => {
            let i = v.as_i128() as u64;
            bytes.extend_from_slice(&i.to_le_bytes()[..t.bytes().min(8)]);
        }
    }
    out.copy_from_slice(&bytes[..out.len()]);
}

struct BufState {
    name: String,
    dtype: DataType,
    shape: Vec<i64>,
    strides: Vec<i64>,
    data: Vec<u8>,
}

fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1].saturating_mul(shape[d + 1]);
    }
    strides
}

enum Flow {
    Normal,
    Return(Scalar),
}

struct Interp<'f> {
    func: &'f PrimFunc,
    env: HashMap<VarId, Scalar>,
    bufs: HashMap<VarId, BufState>,
    /// The block being run, inside a kernel.
    simt: Option<Block>,
}

/// One block of a kernel launch, its threads run in lock-step.
struct Block {
    /// `blockIdx` (x, y, z).
    coord: [i64; 3],
    /// Block size (x, y, z).
    dims: [i64; 3],
    threads: Vec<ThreadState>,
    /// The thread running the current statement.
    current: Option<usize>,
    /// Shared-memory accesses since the last barrier, by (buffer, byte offset).
    accesses: HashMap<(VarId, usize), Access>,
}

/// The per-thread state.
struct ThreadState {
    env: HashMap<VarId, Scalar>,
    locals: HashMap<VarId, BufState>,
}

/// The accesses to one shared element since the last barrier.
struct Access {
    writers: BitSet,
    readers: BitSet,
    /// The bytes written last.
    value: Vec<u8>,
}

struct BitSet(Vec<u64>);

impl BitSet {
    fn new(n: usize) -> BitSet {
        BitSet(vec![0; n.div_ceil(64)])
    }
    fn insert(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn contains(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }
    /// Some member other than `i`.
    fn other_than(&self, i: usize) -> Option<usize> {
        self.0.iter().enumerate().find_map(|(w, bits)| {
            let mut b = *bits;
            if w == i / 64 {
                b &= !(1 << (i % 64));
            }
            (b != 0).then(|| w * 64 + b.trailing_zeros() as usize)
        })
    }
}

impl Block {
    fn thread_coord(&self, t: usize) -> [i64; 3] {
        let t = t as i64;
        let [dx, dy, _] = self.dims;
        [t % dx, (t / dx) % dy, t / (dx * dy)]
    }

    fn thread_name(&self, t: usize) -> String {
        let [x, y, z] = self.thread_coord(t);
        format!("thread ({x}, {y}, {z})")
    }
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

    fn bind_params(&mut self, args: &mut [InterpArg]) -> IrResult<()> {
        let params = &self.func.params;
        if args.len() != params.len() {
            return Err(self.error(format!(
                "expected {} arguments, got {}",
                params.len(),
                args.len()
            )));
        }
        for (i, (p, a)) in params.iter().zip(args.iter_mut()).enumerate() {
            match (p, a) {
                (Param::Scalar(v), InterpArg::Scalar(s)) => {
                    let value = self.convert_arg(i, &v.name, v.dtype, *s)?;
                    self.bind_dim(
                        &Expr::Var(v.clone()),
                        value.as_i128(),
                        Some(value),
                        &format!("argument #{i} `{}`", v.name),
                    )?;
                }
                (Param::Buffer(b), InterpArg::Buffer(h)) => {
                    let data = std::mem::take(&mut h.data);
                    let r = self.bind_buffer(i, b, h, data);
                    if let Err((e, data)) = r {
                        h.data = data;
                        return Err(e);
                    }
                }
                (Param::Buffer(b), InterpArg::Scalar(_)) => {
                    return Err(self.error(format!(
                        "argument #{i} `{}`: expected a buffer, got a scalar",
                        b.name
                    )))
                }
                (Param::Scalar(v), InterpArg::Buffer(_)) => {
                    return Err(self.error(format!(
                        "argument #{i} `{}`: expected a {} scalar, got a buffer",
                        v.name, v.dtype
                    )))
                }
            }
        }
        Ok(())
    }

    fn convert_arg(&self, i: usize, name: &str, t: DataType, s: Scalar) -> IrResult<Scalar> {
        let from = s.dtype();
        let ok = if t.is_float() {
            !from.is_handle()
        } else {
            from.is_int() || from.is_bool()
        };
        if !ok {
            return Err(self.error(format!(
                "argument #{i} `{name}`: expected {t}, got a {from} scalar"
            )));
        }
        Ok(cast(t, s))
    }

    /// Binds or checks one shape/stride entry (or a scalar parameter) against a value.
    fn bind_dim(
        &mut self,
        dim: &Expr,
        value: i128,
        scalar: Option<Scalar>,
        what: &str,
    ) -> IrResult<()> {
        match dim {
            Expr::IntImm { value: k, .. } => {
                if *k as i128 != value {
                    return Err(self.error(format!("{what}: expected {k}, got {value}")));
                }
            }
            Expr::Var(v) => {
                let s = scalar.unwrap_or_else(|| Scalar::from_int(v.dtype, value));
                match self.env.get(&v.id) {
                    Some(prev) if *prev != s => {
                        return Err(self.error(format!(
                            "{what}: `{}` is {} from an earlier argument, got {}",
                            v.name,
                            prev.as_i128(),
                            s.as_i128()
                        )))
                    }
                    Some(_) => {}
                    None => {
                        self.env.insert(v.id, s);
                    }
                }
            }
            _ => return Err(self.error(format!("{what}: unsupported shape expression"))),
        }
        Ok(())
    }

    #[allow(clippy::result_large_err)]
    fn bind_buffer(
        &mut self,
        i: usize,
        b: &Buffer,
        h: &HostBuffer,
        data: Vec<u8>,
    ) -> Result<(), (IrError, Vec<u8>)> {
        macro_rules! fail {
            ($($t:tt)*) => { return Err((self.error(format!("argument #{i} `{}`: {}", b.name, format!($($t)*))), data)) };
        }
        if h.dtype != b.dtype {
            fail!("expected dtype {}, got {}", b.dtype, h.dtype);
        }
        if h.shape.len() != b.shape.len() {
            fail!(
                "expected {} dimensions, got {}",
                b.shape.len(),
                h.shape.len()
            );
        }
        if h.shape.iter().any(|d| *d < 0) {
            fail!("negative extent in shape {:?}", h.shape);
        }
        let strides = match &h.strides {
            Some(s) if s.len() != h.shape.len() => {
                fail!("{} strides for {} dimensions", s.len(), h.shape.len())
            }
            Some(s) if s.iter().any(|x| *x < 0) => fail!("negative strides {s:?}"),
            Some(s) => s.clone(),
            None => compact_strides(&h.shape),
        };
        for (d, (dim, v)) in b.shape.iter().zip(&h.shape).enumerate() {
            if let Err(e) = self.bind_dim(
                dim,
                *v as i128,
                None,
                &format!("argument #{i} `{}` shape[{d}]", b.name),
            ) {
                return Err((e, data));
            }
        }
        match &b.strides {
            Some(decl) => {
                for (d, (dim, v)) in decl.iter().zip(&strides).enumerate() {
                    if let Err(e) = self.bind_dim(
                        dim,
                        *v as i128,
                        None,
                        &format!("argument #{i} `{}` strides[{d}]", b.name),
                    ) {
                        return Err((e, data));
                    }
                }
            }
            None => {
                let compact = compact_strides(&h.shape);
                if strides
                    .iter()
                    .zip(&compact)
                    .zip(&h.shape)
                    .any(|((s, c), n)| *n != 1 && s != c)
                {
                    fail!(
                        "expected a compact array, got strides {strides:?} for shape {:?}",
                        h.shape
                    );
                }
            }
        }
        // Saturating: absurd shapes or strides must give an error, not an overflow.
        let needed: i128 = if h.shape.contains(&0) {
            0
        } else {
            h.shape
                .iter()
                .zip(&strides)
                .fold(1i128, |acc, (n, s)| {
                    acc.saturating_add((*n as i128 - 1) * *s as i128)
                })
                .saturating_mul(b.dtype.bytes() as i128)
        };
        if needed > data.len() as i128 {
            fail!(
                "needs {needed} bytes for shape {:?}, holds {}",
                h.shape,
                data.len()
            );
        }
        self.bufs.insert(
            b.data.id,
            BufState {
                name: b.name.clone(),
                dtype: b.dtype,
                shape: h.shape.clone(),
                strides,
                data,
            },
        );
        Ok(())
    }

    fn offset(&mut self, b: &Buffer, indices: &[Expr]) -> IrResult<usize> {
        let mut idx = Vec::with_capacity(indices.len());
        for x in indices {
            idx.push(self.expr(x)?.as_i128());
        }
        let st = self
            .bufs
            .get(&b.data.id)
            .ok_or_else(|| self.error(format!("buffer `{}` is not live", b.name)))?;
        let mut off: i128 = 0;
        for (d, ((i, n), s)) in idx.iter().zip(&st.shape).zip(&st.strides).enumerate() {
            if *i < 0 || *i >= *n as i128 {
                let shown: Vec<String> = idx.iter().map(|v| v.to_string()).collect();
                return Err(self.error(format!(
                    "index {i} out of bounds for dimension {d} of `{}` (extent {n}) in {}[{}]",
                    st.name,
                    st.name,
                    shown.join(", ")
                )));
            }
            off = off.saturating_add(i * *s as i128);
        }
        let n = st.dtype.bytes() as i128;
        if off.saturating_add(1).saturating_mul(n) > st.data.len() as i128 {
            return Err(self.error(format!(
                "access at element {off} is beyond the storage of `{}`",
                st.name
            )));
        }
        Ok((off * n) as usize)
    }

    /// A zero-filled allocation of `buffer`, its shape evaluated here.
    fn new_buffer(&mut self, buffer: &Buffer) -> IrResult<BufState> {
        let mut shape = Vec::with_capacity(buffer.shape.len());
        for d in &buffer.shape {
            shape.push(self.expr(d)?.as_i64());
        }
        let numel = shape
            .iter()
            .try_fold(1i64, |acc, d| acc.checked_mul((*d).max(0)));
        let bytes = numel.and_then(|n| n.checked_mul(buffer.dtype.bytes() as i64));
        let bytes = match bytes {
            Some(b) if b <= MAX_ALLOCATION => b,
            _ => {
                return Err(self.error(format!(
                    "allocation of `{}` with shape {shape:?} exceeds the interpreter's limit of {MAX_ALLOCATION} bytes",
                    buffer.name
                )))
            }
        };
        let strides = compact_strides(&shape);
        Ok(BufState {
            name: buffer.name.clone(),
            dtype: buffer.dtype,
            shape,
            strides,
            data: vec![0; bytes as usize],
        })
    }

    fn stmt(&mut self, s: &Stmt) -> IrResult<Flow> {
        if let Stmt::For {
            kind: ForKind::ThreadBinding(_),
            ..
        } = s
        {
            self.launch(s)?;
            return Ok(Flow::Normal);
        }
        match s {
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                let lo = self.expr(min)?.as_i128();
                let n = self.expr(extent)?.as_i128();
                let mut k = 0i128;
                while k < n {
                    self.env.insert(var.id, Scalar::from_int(var.dtype, lo + k));
                    let flow = self.stmt(body);
                    if !matches!(flow, Ok(Flow::Normal)) {
                        self.env.remove(&var.id);
                        return flow;
                    }
                    k += 1;
                }
                self.env.remove(&var.id);
                Ok(Flow::Normal)
            }
            Stmt::Store {
                buffer,
                indices,
                value,
            } => {
                let off = self.offset(buffer, indices)?;
                let v = self.expr(value)?;
                if buffer.scope == StorageScope::Shared {
                    self.shared_access(buffer, off, Some(v))?;
                }
                let st = self
                    .bufs
                    .get_mut(&buffer.data.id)
                    .ok_or_else(|| IrError::Interp {
                        func: self.func.name.clone(),
                        message: format!("buffer `{}` is not live", buffer.name),
                    })?;
                let n = st.dtype.bytes();
                write_scalar(v, &mut st.data[off..off + n]);
                Ok(Flow::Normal)
            }
            Stmt::Allocate { buffer, body } => {
                let state = self.new_buffer(buffer)?;
                self.bufs.insert(buffer.data.id, state);
                let flow = self.stmt(body);
                self.bufs.remove(&buffer.data.id);
                flow
            }
            Stmt::Let { var, value, body } => {
                let v = self.expr(value)?;
                self.env.insert(var.id, v);
                let flow = self.stmt(body);
                self.env.remove(&var.id);
                flow
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                if self.expr(cond)?.as_bool() {
                    self.stmt(then_case)
                } else if let Some(e) = else_case {
                    self.stmt(e)
                } else {
                    Ok(Flow::Normal)
                }
            }
            Stmt::Seq(v) => {
                for s in v {
                    if let Flow::Return(r) = self.stmt(s)? {
                        return Ok(Flow::Return(r));
                    }
                }
                Ok(Flow::Normal)
            }
            Stmt::Evaluate(e) => {
                self.expr(e)?;
                Ok(Flow::Normal)
            }
            Stmt::Assert { cond, message } => {
                if self.expr(cond)?.as_bool() {
                    Ok(Flow::Normal)
                } else {
                    Err(self.error(format!("assertion failed: {message}")))
                }
            }
            Stmt::Return(e) => Ok(Flow::Return(self.expr(e)?)),
            Stmt::Barrier => Ok(Flow::Normal),
        }
    }

    fn expr(&mut self, e: &Expr) -> IrResult<Scalar> {
        Ok(match e {
            Expr::IntImm { dtype, value } => Scalar::from_int(*dtype, *value as i128),
            Expr::FloatImm { dtype, value } => Scalar::from_float(*dtype, *value),
            Expr::Var(v) => *self
                .env
                .get(&v.id)
                .ok_or_else(|| self.error(format!("variable `{}` has no value", v.name)))?,
            Expr::Binary { op, a, b } => {
                let x = self.expr(a)?;
                let y = self.expr(b)?;
                binary(*op, x, y).map_err(|m| self.error(m))?
            }
            Expr::Not(a) => Scalar::Bool(!self.expr(a)?.as_bool()),
            Expr::Select { cond, t, f } => {
                let c = self.expr(cond)?.as_bool();
                let x = self.expr(t)?;
                let y = self.expr(f)?;
                if c {
                    x
                } else {
                    y
                }
            }
            Expr::Cast { dtype, value } => cast(*dtype, self.expr(value)?),
            Expr::Load { buffer, indices } => {
                let off = self.offset(buffer, indices)?;
                if buffer.scope == StorageScope::Shared {
                    self.shared_access(buffer, off, None)?;
                }
                let st = self
                    .bufs
                    .get(&buffer.data.id)
                    .ok_or_else(|| self.error(format!("buffer `{}` is not live", buffer.name)))?;
                let n = st.dtype.bytes();
                read_scalar(st.dtype, &st.data[off..off + n])
            }
            Expr::Let { var, value, body } => {
                let v = self.expr(value)?;
                self.env.insert(var.id, v);
                let r = self.expr(body);
                self.env.remove(&var.id);
                r?
            }
            Expr::Call { op, args } => {
                let mut vals = Vec::with_capacity(args.len());
                for a in args {
                    vals.push(self.expr(a)?);
                }
                intrinsic(*op, &vals)
            }
            Expr::IfThenElse { cond, t, f } => {
                // Only the chosen arm is evaluated.
                if self.expr(cond)?.as_bool() {
                    self.expr(t)?
                } else {
                    self.expr(f)?
                }
            }
            Expr::Reinterpret { dtype, value } => reinterpret(*dtype, self.expr(value)?),
            Expr::CallExtern { symbol, .. } => {
                return Err(self.error(format!(
                    "call_extern `{symbol}` calls external code, which the interpreter cannot run"
                )))
            }
        })
    }
}

/// Device kernels: launch, lock-step execution of a block, race detection.
impl Interp<'_> {
    /// Runs the kernel whose outermost loop is `kernel`: every block, one after the other.
    fn launch(&mut self, kernel: &Stmt) -> IrResult<()> {
        let mut grid = [1i64; 3];
        let mut dims = [1i64; 3];
        for (tag, extent) in super::device::launch_extents(kernel) {
            let n = self.expr(extent)?.as_i64();
            match tag {
                ThreadTag::Block(_) => grid[tag.axis()] = n,
                ThreadTag::Thread(_) => dims[tag.axis()] = n,
            }
        }
        if grid.iter().chain(&dims).any(|n| *n <= 0) {
            return Ok(());
        }
        let threads = dims
            .iter()
            .try_fold(1i64, |acc, d| acc.checked_mul(*d))
            .filter(|n| *n <= MAX_BLOCK_THREADS)
            .ok_or_else(|| {
                self.error(format!(
                    "a block of {dims:?} threads exceeds the interpreter's limit of {MAX_BLOCK_THREADS}"
                ))
            })? as usize;
        let all: Vec<usize> = (0..threads).collect();
        for bz in 0..grid[2] {
            for by in 0..grid[1] {
                for bx in 0..grid[0] {
                    let block = Block {
                        coord: [bx, by, bz],
                        dims,
                        threads: (0..threads)
                            .map(|_| ThreadState {
                                env: self.env.clone(),
                                locals: HashMap::new(),
                            })
                            .collect(),
                        current: None,
                        accesses: HashMap::new(),
                    };
                    self.simt = Some(block);
                    let r = self.simt_stmt(kernel, &all);
                    self.simt = None;
                    r?;
                }
            }
        }
        Ok(())
    }

    fn block(&mut self) -> &mut Block {
        self.simt
            .as_mut()
            .expect("device statements run inside a block")
    }

    /// Runs `f` as thread `t` of the current block: its variables and `local` buffers in scope.
    fn on_thread<R>(&mut self, t: usize, f: impl FnOnce(&mut Self) -> IrResult<R>) -> IrResult<R> {
        let block = self
            .simt
            .as_mut()
            .expect("device statements run inside a block");
        std::mem::swap(&mut self.env, &mut block.threads[t].env);
        let locals = std::mem::take(&mut block.threads[t].locals);
        let keys: Vec<VarId> = locals.keys().copied().collect();
        self.bufs.extend(locals);
        block.current = Some(t);
        let r = f(self);
        let block = self
            .simt
            .as_mut()
            .expect("device statements run inside a block");
        block.current = None;
        std::mem::swap(&mut self.env, &mut block.threads[t].env);
        for k in keys {
            if let Some(b) = self.bufs.remove(&k) {
                block.threads[t].locals.insert(k, b);
            }
        }
        r
    }

    /// Sets (or with `None` removes) a variable in each of the `active` threads.
    fn set_var(&mut self, active: &[usize], var: VarId, values: Option<&[Scalar]>) {
        let block = self.block();
        for (i, t) in active.iter().enumerate() {
            let env = &mut block.threads[*t].env;
            match values {
                Some(v) => {
                    env.insert(var, v[i]);
                }
                None => {
                    env.remove(&var);
                }
            }
        }
    }

    /// Runs `s` in lock-step for the `active` threads of the current block.
    fn simt_stmt(&mut self, s: &Stmt, active: &[usize]) -> IrResult<()> {
        if active.is_empty() {
            return Ok(());
        }
        match s {
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => {
                if let ForKind::ThreadBinding(tag) = kind {
                    let block = self.block();
                    let values: Vec<Scalar> = active
                        .iter()
                        .map(|t| {
                            let c = match tag {
                                ThreadTag::Block(_) => block.coord[tag.axis()],
                                ThreadTag::Thread(_) => block.thread_coord(*t)[tag.axis()],
                            };
                            Scalar::from_int(var.dtype, c as i128)
                        })
                        .collect();
                    self.set_var(active, var.id, Some(&values));
                    let r = self.simt_stmt(body, active);
                    self.set_var(active, var.id, None);
                    return r;
                }
                let mut bounds = Vec::with_capacity(active.len());
                for &t in active {
                    let (lo, n) = self.on_thread(t, |me| {
                        Ok((me.expr(min)?.as_i128(), me.expr(extent)?.as_i128()))
                    })?;
                    bounds.push((t, lo, n));
                }
                let mut k = 0i128;
                let r = loop {
                    let now: Vec<usize> = bounds.iter().filter(|b| k < b.2).map(|b| b.0).collect();
                    if now.is_empty() {
                        break Ok(());
                    }
                    let values: Vec<Scalar> = bounds
                        .iter()
                        .filter(|b| k < b.2)
                        .map(|b| Scalar::from_int(var.dtype, b.1 + k))
                        .collect();
                    self.set_var(&now, var.id, Some(&values));
                    if let Err(e) = self.simt_stmt(body, &now) {
                        break Err(e);
                    }
                    k += 1;
                };
                self.set_var(active, var.id, None);
                r
            }
            Stmt::Store { .. } | Stmt::Evaluate(_) | Stmt::Assert { .. } => {
                for &t in active {
                    self.on_thread(t, |me| me.stmt(s).map(|_| ()))?;
                }
                Ok(())
            }
            Stmt::Allocate { buffer, body } => {
                if buffer.scope == StorageScope::Shared {
                    let state = self.on_thread(active[0], |me| me.new_buffer(buffer))?;
                    self.bufs.insert(buffer.data.id, state);
                    let r = self.simt_stmt(body, active);
                    self.bufs.remove(&buffer.data.id);
                    self.block()
                        .accesses
                        .retain(|(b, _), _| *b != buffer.data.id);
                    return r;
                }
                for &t in active {
                    let state = self.on_thread(t, |me| me.new_buffer(buffer))?;
                    self.block().threads[t].locals.insert(buffer.data.id, state);
                }
                let r = self.simt_stmt(body, active);
                for &t in active {
                    self.block().threads[t].locals.remove(&buffer.data.id);
                }
                r
            }
            Stmt::Let { var, value, body } => {
                let mut values = Vec::with_capacity(active.len());
                for &t in active {
                    values.push(self.on_thread(t, |me| me.expr(value))?);
                }
                self.set_var(active, var.id, Some(&values));
                let r = self.simt_stmt(body, active);
                self.set_var(active, var.id, None);
                r
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                let (mut yes, mut no) = (Vec::new(), Vec::new());
                for &t in active {
                    if self.on_thread(t, |me| Ok(me.expr(cond)?.as_bool()))? {
                        yes.push(t);
                    } else {
                        no.push(t);
                    }
                }
                self.simt_stmt(then_case, &yes)?;
                match else_case {
                    Some(e) => self.simt_stmt(e, &no),
                    None => Ok(()),
                }
            }
            Stmt::Seq(v) => {
                for st in v {
                    self.simt_stmt(st, active)?;
                }
                Ok(())
            }
            Stmt::Return(_) => Err(self.error("`return` inside a device kernel".into())),
            Stmt::Barrier => {
                let block = self.block();
                let n = block.threads.len();
                if active.len() != n {
                    let [x, y, z] = block.coord;
                    return Err(self.error(format!(
                        "barrier reached by {} of the {n} threads of block ({x}, {y}, {z}): the others would wait forever",
                        active.len()
                    )));
                }
                block.accesses.clear();
                Ok(())
            }
        }
    }

    /// Records an access to a shared buffer element at byte offset `off` by the current thread
    /// (a store of `value`, or a load) and reports a data race with another thread's access
    /// since the last barrier.
    fn shared_access(&mut self, b: &Buffer, off: usize, value: Option<Scalar>) -> IrResult<()> {
        let Some(block) = self.simt.as_mut() else {
            return Ok(());
        };
        let Some(t) = block.current else {
            return Ok(());
        };
        let n = block.threads.len();
        let bytes = value.map(|v| {
            let mut out = vec![0u8; b.dtype.bytes()];
            write_scalar(v, &mut out);
            out
        });
        let a = block
            .accesses
            .entry((b.data.id, off))
            .or_insert_with(|| Access {
                writers: BitSet::new(n),
                readers: BitSet::new(n),
                value: Vec::new(),
            });
        let conflict = match &bytes {
            None => {
                let other = if a.writers.is_empty() || a.writers.contains(t) {
                    None
                } else {
                    a.writers.other_than(t)
                };
                a.readers.insert(t);
                other.map(|u| (u, "reads", "wrote"))
            }
            Some(v) => {
                let c = if let Some(u) = a.readers.other_than(t) {
                    Some((u, "writes", "read"))
                } else if a.value != *v {
                    a.writers.other_than(t).map(|u| (u, "writes", "wrote"))
                } else {
                    None
                };
                a.writers.insert(t);
                a.value.clone_from(v);
                c
            }
        };
        let Some((u, does, did)) = conflict else {
            return Ok(());
        };
        let (me, other) = (block.thread_name(t), block.thread_name(u));
        let [x, y, z] = block.coord;
        let element = match self.bufs.get(&b.data.id) {
            Some(st) => {
                let e = (off / st.dtype.bytes().max(1)) as i64;
                let idx: Vec<String> = st
                    .shape
                    .iter()
                    .zip(&st.strides)
                    .map(|(n, s)| ((e / (*s).max(1)) % (*n).max(1)).to_string())
                    .collect();
                format!("{}[{}]", b.name, idx.join(", "))
            }
            None => b.name.clone(),
        };
        Err(self.error(format!(
            "data race on shared buffer `{}` at {element} in block ({x}, {y}, {z}): {me} {does} it after {other} {did} it, with no barrier in between",
            b.name
        )))
    }
}

/// Converts a value to `t` with the IR's cast rules.
pub fn cast(t: DataType, v: Scalar) -> Scalar {
    match (t.code, v) {
        (TypeCode::Bool, v) => Scalar::Bool(v.as_bool()),
        (TypeCode::Int | TypeCode::UInt, Scalar::Float(_, f)) => {
            let (lo, hi): (i128, i128) = if t.is_uint() {
                (0, (1i128 << t.bits) - 1)
            } else {
                (-(1i128 << (t.bits - 1)), (1i128 << (t.bits - 1)) - 1)
            };
            Scalar::from_int(t, (f as i128).clamp(lo, hi))
        }
        (TypeCode::Int | TypeCode::UInt, v) => Scalar::from_int(t, v.as_i128()),
        (TypeCode::Float | TypeCode::BFloat, Scalar::Float(_, f)) => Scalar::from_float(t, f),
        (TypeCode::Float | TypeCode::BFloat, v) => {
            let i = v.as_i128();
            let f = if t == DataType::f32() {
                i as f32 as f64
            } else {
                i as f64
            };
            Scalar::from_float(t, f)
        }
        (TypeCode::Handle, v) => v,
    }
}

/// The bits of `v` read as `t`, a type of the same size (NaN payloads may be quieted: the
/// interpreter holds floats as `f64`).
pub fn reinterpret(t: DataType, v: Scalar) -> Scalar {
    let mut bytes = vec![0u8; v.dtype().bytes()];
    write_scalar(v, &mut bytes);
    read_scalar(t, &bytes[..t.bytes().min(bytes.len())])
}

/// Applies `op` in float arithmetic of type `t`: `f32` for types of at most 32 bits, then rounds.
fn float_op(
    t: DataType,
    a: f64,
    b: f64,
    f32op: impl Fn(f32, f32) -> f32,
    f64op: impl Fn(f64, f64) -> f64,
) -> Scalar {
    if t.bits == 64 {
        Scalar::Float(t, f64op(a, b))
    } else {
        Scalar::from_float(t, f32op(a as f32, b as f32) as f64)
    }
}

fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b || (a == b && a.is_sign_positive()) {
        a
    } else {
        b
    }
}

/// Evaluates a binary operator on two values of one type.
///
/// # Errors
/// A message for integer division or modulo by zero.
pub fn binary(op: BinOp, x: Scalar, y: Scalar) -> Result<Scalar, String> {
    let t = x.dtype();
    if op.is_comparison() {
        let r = if t.is_float() {
            let (a, b) = (x.as_f64(), y.as_f64());
            match op {
                BinOp::Eq => a == b,
                BinOp::Ne => a != b,
                BinOp::Lt => a < b,
                BinOp::Le => a <= b,
                BinOp::Gt => a > b,
                _ => a >= b,
            }
        } else {
            let (a, b) = (x.as_i128(), y.as_i128());
            match op {
                BinOp::Eq => a == b,
                BinOp::Ne => a != b,
                BinOp::Lt => a < b,
                BinOp::Le => a <= b,
                BinOp::Gt => a > b,
                _ => a >= b,
            }
        };
        return Ok(Scalar::Bool(r));
    }
    if t.is_bool() {
        let (a, b) = (x.as_bool(), y.as_bool());
        return Ok(Scalar::Bool(match op {
            BinOp::And | BinOp::Mul | BinOp::Min => a && b,
            BinOp::Or | BinOp::Max => a || b,
            _ => a ^ b,
        }));
    }
    if t.is_float() {
        let (a, b) = (x.as_f64(), y.as_f64());
        return Ok(match op {
            BinOp::Add => float_op(t, a, b, |a, b| a + b, |a, b| a + b),
            BinOp::Sub => float_op(t, a, b, |a, b| a - b, |a, b| a - b),
            BinOp::Mul => float_op(t, a, b, |a, b| a * b, |a, b| a * b),
            BinOp::Div => float_op(t, a, b, |a, b| a / b, |a, b| a / b),
            BinOp::Mod => float_op(t, a, b, |a, b| a % b, |a, b| a % b),
            BinOp::FloorDiv => float_op(t, a, b, |a, b| (a / b).floor(), |a, b| (a / b).floor()),
            BinOp::FloorMod => float_op(
                t,
                a,
                b,
                |a, b| a - (a / b).floor() * b,
                |a, b| a - (a / b).floor() * b,
            ),
            BinOp::Min => Scalar::Float(t, fmin(a, b)),
            BinOp::Max => Scalar::Float(t, fmax(a, b)),
            _ => Scalar::Bool(false),
        });
    }
    let (a, b) = (x.as_i128(), y.as_i128());
    let divisor = |b: i128| {
        if b == 0 {
            Err(format!("integer division by zero ({t} `{}`)", op.name()))
        } else {
            Ok(b)
        }
    };
    let r = match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a.wrapping_mul(b),
        BinOp::Div => a / divisor(b)?,
        BinOp::Mod => a % divisor(b)?,
        BinOp::FloorDiv => floor_div(a, divisor(b)?),
        BinOp::FloorMod => {
            let b = divisor(b)?;
            a - floor_div(a, b) * b
        }
        BinOp::Min => a.min(b),
        BinOp::Max => a.max(b),
        BinOp::BitAnd => a & b,
        BinOp::BitOr => a | b,
        BinOp::BitXor => a ^ b,
        BinOp::Shl | BinOp::Shr => {
            let bits = u32::from(t.bits);
            let k = (b as u64 & u64::from(bits - 1)) as u32;
            // `a` is the sign-extended (signed) or zero-extended (unsigned) value.
            if op == BinOp::Shl {
                a << k
            } else {
                a >> k
            }
        }
        _ => 0,
    };
    Ok(Scalar::from_int(t, r))
}

fn floor_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

/// Evaluates a math intrinsic.
pub fn intrinsic(op: Intrinsic, args: &[Scalar]) -> Scalar {
    let Some(first) = args.first() else {
        return Scalar::f32(f32::NAN);
    };
    let t = first.dtype();
    if op == Intrinsic::Abs && !t.is_float() {
        return Scalar::from_int(t, first.as_i128().abs());
    }
    if op.is_integer() {
        let bits = u32::from(t.bits);
        let mask = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let x = first.as_i128() as u64 & mask;
        return match op {
            Intrinsic::BitwiseNot => Scalar::from_int(t, (!x & mask) as i128),
            Intrinsic::Clz => Scalar::from_int(t, (x.leading_zeros() - (64 - bits)) as i128),
            _ => Scalar::from_int(t, x.count_ones() as i128),
        };
    }
    if op.is_predicate() {
        let x = first.as_f64();
        return Scalar::Bool(match op {
            Intrinsic::IsNan => x.is_nan(),
            Intrinsic::IsInf => x.is_infinite(),
            _ => x.is_finite(),
        });
    }
    if let Some(r) = extra_float(op, args) {
        return r;
    }
    if op == Intrinsic::FastExp && t == DataType::f32() {
        let x = first.as_f64() as f32;
        return Scalar::from_float(t, f64::from(crate::ir::approx::fast_exp_f32(x)));
    }
    let a = first.as_f64();
    let b = args.get(1).map_or(0.0, Scalar::as_f64);
    let c = args.get(2).map_or(0.0, Scalar::as_f64);
    // One table for both widths: f64 for float64, f32 (then rounded to the type) otherwise.
    macro_rules! apply {
        ($a:expr, $b:expr, $c:expr, $erf:expr) => {{
            let (a, b, c) = ($a, $b, $c);
            match op {
                // `fast_exp` of float32 is handled above; of other types it is `exp`.
                Intrinsic::Exp | Intrinsic::FastExp => a.exp(),
                Intrinsic::Log => a.ln(),
                Intrinsic::Sqrt => a.sqrt(),
                Intrinsic::Rsqrt => 1.0 / a.sqrt(),
                Intrinsic::Tanh => a.tanh(),
                Intrinsic::Sigmoid => 1.0 / (1.0 + (-a).exp()),
                Intrinsic::Pow => a.powf(b),
                Intrinsic::Abs => a.abs(),
                Intrinsic::Floor => a.floor(),
                Intrinsic::Ceil => a.ceil(),
                Intrinsic::Round => a.round_ties_even(),
                Intrinsic::Erf => $erf(a),
                Intrinsic::Fma => a.mul_add(b, c),
                _ => unreachable!("handled above"),
            }
        }};
    }
    if t.bits == 64 {
        return Scalar::Float(t, apply!(a, b, c, erf));
    }
    let r: f32 = apply!(a as f32, b as f32, c as f32, |x: f32| erf(x as f64) as f32);
    Scalar::from_float(t, r as f64)
}

/// The float functions added with TIR's scalar language, computed in `f64` and rounded to the
/// type (for `float32` and the 16-bit types that is within an ulp of libm's `float` result).
fn extra_float(op: Intrinsic, args: &[Scalar]) -> Option<Scalar> {
    let t = args[0].dtype();
    let a = args[0].as_f64();
    let b = args.get(1).map_or(0.0, Scalar::as_f64);
    let r = match op {
        Intrinsic::Copysign => a.copysign(b),
        Intrinsic::Trunc => a.trunc(),
        Intrinsic::Nearbyint => a.round_ties_even(),
        Intrinsic::Sin => a.sin(),
        Intrinsic::Cos => a.cos(),
        Intrinsic::Tan => a.tan(),
        Intrinsic::Asin => a.asin(),
        Intrinsic::Acos => a.acos(),
        Intrinsic::Atan => a.atan(),
        Intrinsic::Atan2 => a.atan2(b),
        Intrinsic::Sinh => a.sinh(),
        Intrinsic::Cosh => a.cosh(),
        Intrinsic::Asinh => a.asinh(),
        Intrinsic::Acosh => a.acosh(),
        Intrinsic::Atanh => a.atanh(),
        Intrinsic::Log2 => a.log2(),
        Intrinsic::Log10 => a.log10(),
        Intrinsic::Log1p => a.ln_1p(),
        Intrinsic::Exp2 => a.exp2(),
        Intrinsic::Exp10 => 10f64.powf(a),
        Intrinsic::Expm1 => a.exp_m1(),
        Intrinsic::Hypot => a.hypot(b),
        _ => return None,
    };
    Some(Scalar::from_float(t, r))
}

/// The error function in `f64` (absolute error below 1e-13): the Maclaurin series for
/// `|x| < 2.5`, a continued fraction for `erfc` above.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    let r = if ax < 2.5 {
        // erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
        let x2 = ax * ax;
        let mut term = ax;
        let mut sum = ax;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if ax > 6.0 {
        1.0
    } else {
        // erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + ...)))))
        let mut f = ax;
        for k in (1..60).rev() {
            f = ax + (k as f64 / 2.0) / f;
        }
        1.0 - (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * f)
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Values from Abramowitz & Stegun table 7.1 / high-precision references.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (-1.5, -0.9661051464753108),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-13,
                "erf({x}) = {} want {want}",
                erf(x)
            );
        }
    }

    #[test]
    fn floor_division_rounds_down() {
        let i = |v| Scalar::i32(v);
        assert_eq!(binary(BinOp::FloorDiv, i(-7), i(2)).unwrap(), i(-4));
        assert_eq!(binary(BinOp::FloorMod, i(-7), i(2)).unwrap(), i(1));
        assert_eq!(binary(BinOp::FloorDiv, i(7), i(-2)).unwrap(), i(-4));
        assert_eq!(binary(BinOp::FloorMod, i(7), i(-2)).unwrap(), i(-1));
        assert_eq!(binary(BinOp::FloorDiv, i(-8), i(-2)).unwrap(), i(4));
        assert_eq!(binary(BinOp::Div, i(-7), i(2)).unwrap(), i(-3));
        assert_eq!(binary(BinOp::Mod, i(-7), i(2)).unwrap(), i(-1));
        assert_eq!(binary(BinOp::Div, i(i32::MIN), i(-1)).unwrap(), i(i32::MIN));
        assert!(binary(BinOp::FloorMod, i(1), i(0)).is_err());
    }
}
