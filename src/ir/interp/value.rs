//! Values: [`Scalar`], host tensors ([`HostBuffer`], [`Element`]) and the arguments of
//! [`run`](super::run), and the little-endian encoding of scalars shared with the buffers.

use half::{bf16, f16};

use crate::ir::builder::wrap_int;
use crate::ir::dtype::{DataType, TypeCode};

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

/// An argument of [`run`](super::run).
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

/// Decodes a value of type `dtype` from its little-endian bytes.
pub(super) fn read_scalar(dtype: DataType, b: &[u8]) -> Scalar {
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

/// Encodes `v` little-endian into `out` (its type's size).
pub(super) fn write_scalar(v: Scalar, out: &mut [u8]) {
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
