//! DLPack's names: the one table of device codes (`cpu` <-> 1, `cuda` <-> 2, `opencl` <-> 4,
//! ...) and dtype names (`float32`, `int8x4`, `bool`) for [`DLDeviceType`] and [`DLDataType`].
//!
//! Every layer that names a device type or a dtype goes through here: the device registry
//! ([`crate::device_api::DeviceType`]), the built-in target kinds (their default device type),
//! the code generators (the device type their host code checks), `.npy` files and the command
//! line. The C structures themselves are in [`super::ffi`].

use std::fmt;

use super::ffi::{DLDataType, DLDataTypeCode, DLDeviceType};

/// DLPack's device types and their canonical names (TVM's `DLDeviceType2Str`), in code order.
const DEVICE_NAMES: &[(DLDeviceType, &str)] = &[
    (DLDeviceType::CPU, "cpu"),
    (DLDeviceType::CUDA, "cuda"),
    (DLDeviceType::CUDA_HOST, "cuda_host"),
    (DLDeviceType::OPENCL, "opencl"),
    (DLDeviceType::VULKAN, "vulkan"),
    (DLDeviceType::METAL, "metal"),
    (DLDeviceType::VPI, "vpi"),
    (DLDeviceType::ROCM, "rocm"),
    (DLDeviceType::ROCM_HOST, "rocm_host"),
    (DLDeviceType::EXT_DEV, "ext_dev"),
    (DLDeviceType::CUDA_MANAGED, "cuda_managed"),
    (DLDeviceType::ONE_API, "oneapi"),
    (DLDeviceType::WEBGPU, "webgpu"),
    (DLDeviceType::HEXAGON, "hexagon"),
    (DLDeviceType::MAIA, "maia"),
    (DLDeviceType::TRN, "trn"),
];

/// Other spellings TVM accepts for the same types (`tvm.device("llvm")`, `"gpu"`, `"cl"`).
const DEVICE_ALIASES: &[(&str, DLDeviceType)] = &[
    ("llvm", DLDeviceType::CPU),
    ("c", DLDeviceType::CPU),
    ("gpu", DLDeviceType::CUDA),
    ("nvptx", DLDeviceType::CUDA),
    ("cl", DLDeviceType::OPENCL),
    ("mtl", DLDeviceType::METAL),
];

impl DLDeviceType {
    /// DLPack's name of this code (`cpu`, `cuda`, ...), if it is one of DLPack's.
    ///
    /// ```
    /// use kiln::packed_func::DLDeviceType;
    /// assert_eq!(DLDeviceType::OPENCL.name(), Some("opencl"));
    /// assert_eq!(DLDeviceType(64).name(), None);
    /// ```
    pub fn name(self) -> Option<&'static str> {
        DEVICE_NAMES
            .iter()
            .find(|(c, _)| *c == self)
            .map(|(_, n)| *n)
    }

    /// The code of a DLPack name or one of TVM's aliases (`"cpu"`, `"llvm"`, `"cuda"`, `"cl"`).
    pub fn from_name(name: &str) -> Option<Self> {
        DEVICE_NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(c, _)| *c)
            .or_else(|| {
                DEVICE_ALIASES
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, c)| *c)
            })
    }

    /// DLPack's device type names, in code order.
    pub fn names() -> impl Iterator<Item = &'static str> {
        DEVICE_NAMES.iter().map(|(_, n)| *n)
    }
}

/// The base names of the dtype codes, as TVM and numpy spell them.
const DTYPE_BASES: &[(DLDataTypeCode, &str)] = &[
    (DLDataTypeCode::INT, "int"),
    (DLDataTypeCode::UINT, "uint"),
    (DLDataTypeCode::FLOAT, "float"),
    (DLDataTypeCode::OPAQUE_HANDLE, "handle"),
    (DLDataTypeCode::BFLOAT, "bfloat"),
    (DLDataTypeCode::COMPLEX, "complex"),
];

/// `float32`, `int8`, `uint16x4`, `bool`, `boolx4`, `handle`; a code DLPack does not define is
/// written `dtype(code=C, bits=B, lanes=L)`.
impl fmt::Display for DLDataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lanes = |f: &mut fmt::Formatter<'_>| {
            if self.lanes == 1 {
                Ok(())
            } else {
                write!(f, "x{}", self.lanes)
            }
        };
        if self.code == DLDataTypeCode::BOOL {
            f.write_str("bool")?;
            return lanes(f);
        }
        if self.code == DLDataTypeCode::OPAQUE_HANDLE && self.bits == 64 && self.lanes == 1 {
            return f.write_str("handle");
        }
        match DTYPE_BASES.iter().find(|(c, _)| *c == self.code) {
            Some((_, base)) => {
                write!(f, "{base}{}", self.bits)?;
                lanes(f)
            }
            None => write!(
                f,
                "dtype(code={}, bits={}, lanes={})",
                self.code.0, self.bits, self.lanes
            ),
        }
    }
}

impl DLDataType {
    /// A dtype from its parts.
    pub const fn new(code: DLDataTypeCode, bits: u8, lanes: u16) -> Self {
        DLDataType { code, bits, lanes }
    }

    /// Reads what [`Display`](fmt::Display) writes: `float32`, `int64`, `bool`, `handle`,
    /// `float32x4`, `boolx8`. Bits and lanes must be positive decimal numbers, bits without a
    /// leading zero; nothing else is checked (`int7` is a valid DLPack dtype; the IR's
    /// `DataType::parse` narrows this to its types).
    ///
    /// ```
    /// use kiln::packed_func::DLDataType;
    /// let t = DLDataType::parse("float32x4").unwrap();
    /// assert_eq!((t.bits, t.lanes), (32, 4));
    /// assert_eq!(t.to_string(), "float32x4");
    /// assert!(DLDataType::parse("float").is_none());
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        // `x` followed by the lanes, after the bits or `bool` (`complex64` has an `x` too).
        let (base, lanes) = match s.rsplit_once('x') {
            Some((b, l))
                if b.ends_with(|c: char| c.is_ascii_digit()) || b == "bool" || b == "handle" =>
            {
                (b, digits(l)?.parse::<u16>().ok().filter(|&l| l > 0)?)
            }
            _ => (s, 1),
        };
        if base == "bool" {
            return Some(DLDataType::new(DLDataTypeCode::BOOL, 8, lanes));
        }
        if base == "handle" {
            return (lanes == 1).then_some(DLDataType::new(DLDataTypeCode::OPAQUE_HANDLE, 64, 1));
        }
        let (code, bits) = DTYPE_BASES.iter().find_map(|(c, name)| {
            let rest = base.strip_prefix(name)?;
            Some((*c, digits(rest)?))
        })?;
        // The canonical spelling only: no leading zero (`int08`).
        let bits = bits
            .parse::<u8>()
            .ok()
            .filter(|&b| b > 0 && !bits.starts_with('0'))?;
        Some(DLDataType::new(code, bits, lanes))
    }

    /// Bytes of one element (all lanes), rounded up to whole bytes.
    pub const fn bytes(self) -> usize {
        (self.bits as usize * self.lanes as usize).div_ceil(8)
    }
}

/// `s` if it is a non-empty run of ASCII digits (no sign, which `str::parse` would accept).
fn digits(s: &str) -> Option<&str> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_read_back() {
        for s in [
            "float32",
            "float16",
            "bfloat16",
            "int8",
            "int64",
            "uint8",
            "uint32",
            "bool",
            "handle",
            "float32x4",
            "boolx8",
            "int8x16",
            "complex64",
        ] {
            let t = DLDataType::parse(s).unwrap_or_else(|| panic!("{s}"));
            assert_eq!(t.to_string(), s);
        }
        for bad in [
            "",
            "float",
            "int0",
            "floatx4",
            "float32x0",
            "handlex2",
            "f32",
            "int8x",
        ] {
            assert!(DLDataType::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn device_names_and_aliases() {
        assert_eq!(DLDeviceType::from_name("cuda"), Some(DLDeviceType::CUDA));
        assert_eq!(DLDeviceType::from_name("cl"), Some(DLDeviceType::OPENCL));
        assert_eq!(DLDeviceType::from_name("nope"), None);
        for n in DLDeviceType::names() {
            assert_eq!(DLDeviceType::from_name(n).and_then(|c| c.name()), Some(n));
        }
    }
}
