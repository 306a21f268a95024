//! Data types: a DLPack-style `(code, bits, lanes)` triple.

use std::fmt;

use crate::packed_func::ffi::DLDataTypeCode;
use crate::packed_func::DLDataType;

/// The type code of a [`DataType`], numbered as DLPack's `DLDataTypeCode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TypeCode {
    /// Signed two's complement integer (`kDLInt`).
    Int = 0,
    /// Unsigned integer (`kDLUInt`).
    UInt = 1,
    /// IEEE binary floating point (`kDLFloat`).
    Float = 2,
    /// Opaque pointer (`kDLOpaqueHandle`); only buffer data pointers have this type.
    Handle = 3,
    /// bfloat16 (`kDLBfloat`).
    BFloat = 4,
    /// Boolean (`kDLBool`), stored in one byte (0 or 1).
    Bool = 6,
}

/// A scalar or vector element type: code, bits per lane and number of lanes.
///
/// `Display` gives the canonical name (`float32`, `int8`, `bool`, `handle`, `float32x4`), which is
/// also the spelling used in IR JSON; [`DataType::parse`] reads it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataType {
    /// The type code.
    pub code: TypeCode,
    /// Bits per lane (8 for `bool`, 64 for `handle`).
    pub bits: u8,
    /// Number of vector lanes; 1 for scalars. Version 1 of the IR only uses scalars: the
    /// verifier rejects `lanes != 1` (vectorisation is expressed with `vectorized` loops).
    pub lanes: u16,
}

macro_rules! ctor {
    ($($name:ident => $code:ident, $bits:expr;)*) => {$(
        #[doc = concat!("The `", stringify!($name), "` scalar type.")]
        pub const fn $name() -> DataType {
            DataType { code: TypeCode::$code, bits: $bits, lanes: 1 }
        }
    )*};
}

impl DataType {
    ctor! {
        bool => Bool, 8;
        i8 => Int, 8; i16 => Int, 16; i32 => Int, 32; i64 => Int, 64;
        u8 => UInt, 8; u16 => UInt, 16; u32 => UInt, 32; u64 => UInt, 64;
        f16 => Float, 16; bf16 => BFloat, 16; f32 => Float, 32; f64 => Float, 64;
        handle => Handle, 64;
    }

    /// A type from its parts (not checked: use [`DataType::is_valid`]).
    pub const fn new(code: TypeCode, bits: u8, lanes: u16) -> DataType {
        DataType { code, bits, lanes }
    }

    /// The same type with `lanes` lanes.
    pub const fn with_lanes(self, lanes: u16) -> DataType {
        DataType { lanes, ..self }
    }

    /// The element type (one lane).
    pub const fn element(self) -> DataType {
        self.with_lanes(1)
    }

    /// Whether this is one of the types the IR defines (see the module docs for the list).
    pub fn is_valid(self) -> bool {
        let bits_ok = match self.code {
            TypeCode::Int | TypeCode::UInt => matches!(self.bits, 8 | 16 | 32 | 64),
            TypeCode::Float => matches!(self.bits, 16 | 32 | 64),
            TypeCode::BFloat => self.bits == 16,
            TypeCode::Bool => self.bits == 8,
            TypeCode::Handle => self.bits == 64,
        };
        bits_ok && self.lanes >= 1 && (self.code != TypeCode::Handle || self.lanes == 1)
    }

    /// Signed or unsigned integer.
    pub fn is_int(self) -> bool {
        matches!(self.code, TypeCode::Int | TypeCode::UInt)
    }
    /// Signed integer.
    pub fn is_signed_int(self) -> bool {
        self.code == TypeCode::Int
    }
    /// Unsigned integer.
    pub fn is_uint(self) -> bool {
        self.code == TypeCode::UInt
    }
    /// float16/32/64 or bfloat16.
    pub fn is_float(self) -> bool {
        matches!(self.code, TypeCode::Float | TypeCode::BFloat)
    }
    /// `bool`.
    pub fn is_bool(self) -> bool {
        self.code == TypeCode::Bool
    }
    /// `handle`.
    pub fn is_handle(self) -> bool {
        self.code == TypeCode::Handle
    }
    /// Integer or floating point (arithmetic is defined on it).
    pub fn is_numeric(self) -> bool {
        self.is_int() || self.is_float()
    }
    /// Index types: `int32` and `int64` (loop variables, buffer indices, shapes).
    pub fn is_index(self) -> bool {
        self == DataType::i32() || self == DataType::i64()
    }
    /// Bytes of one element of all lanes, as stored in a buffer.
    pub fn bytes(self) -> usize {
        (self.bits as usize).div_ceil(8) * self.lanes as usize
    }

    /// Parses the canonical name (`float32`, `int64`, `uint8`, `bool`, `handle`, `bfloat16`,
    /// `float32x4`). Returns `None` for anything else.
    pub fn parse(s: &str) -> Option<DataType> {
        DLDataType::parse(s).and_then(|t| DataType::try_from(t).ok())
    }
}

/// DLPack's spelling ([`DLDataType`]'s `Display`): one table of names for both.
impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&DLDataType::from(*self), f)
    }
}

/// The DLPack dtype of an IR type (the same code, bits and lanes): what kernel tables, tensors
/// and argument checks speak.
impl From<DataType> for DLDataType {
    fn from(t: DataType) -> Self {
        DLDataType::new(DLDataTypeCode(t.code as u8), t.bits, t.lanes)
    }
}

/// The IR type of a DLPack dtype, where the IR has it (see [`DataType::is_valid`]).
impl TryFrom<DLDataType> for DataType {
    type Error = String;

    fn try_from(t: DLDataType) -> Result<Self, String> {
        let code = match t.code {
            DLDataTypeCode::INT => TypeCode::Int,
            DLDataTypeCode::UINT => TypeCode::UInt,
            DLDataTypeCode::FLOAT => TypeCode::Float,
            DLDataTypeCode::OPAQUE_HANDLE => TypeCode::Handle,
            DLDataTypeCode::BFLOAT => TypeCode::BFloat,
            DLDataTypeCode::BOOL => TypeCode::Bool,
            _ => return Err(format!("the IR has no type {t}")),
        };
        let d = DataType::new(code, t.bits, t.lanes);
        if d.is_valid() {
            Ok(d)
        } else {
            Err(format!(
                "the IR has no type {t} (expected one of {TYPE_NAMES})"
            ))
        }
    }
}

/// The names of every scalar type, for error messages.
pub const TYPE_NAMES: &str =
    "bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16, float32, float64, handle";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in TYPE_NAMES.split(", ") {
            let t = DataType::parse(name).unwrap();
            assert_eq!(t.to_string(), name);
        }
        assert_eq!(
            DataType::parse("float32x4"),
            Some(DataType::f32().with_lanes(4))
        );
        for bad in [
            "float8", "int", "int07", "x4", "float32x", "handlex2", "bool16", "uint1",
        ] {
            assert_eq!(DataType::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn dlpack_dtypes_convert_both_ways_with_the_same_names() {
        for name in TYPE_NAMES.split(", ").chain(["float32x4", "int8x16"]) {
            let t = DataType::parse(name).unwrap();
            let dl = DLDataType::from(t);
            assert_eq!(dl.to_string(), name);
            assert_eq!(DataType::try_from(dl), Ok(t));
        }
        let complex = DLDataType::parse("complex64").unwrap();
        assert!(DataType::try_from(complex)
            .unwrap_err()
            .contains("complex64"));
    }
}
