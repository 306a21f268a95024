//! TVM's RPC wire format: packet codes, the packed argument sequence and its values.
//!
//! Everything here is pure: bytes in, values out, and back. Nothing reads a socket or touches
//! memory a value points to, so a fuzzer can drive the decoder with any bytes
//! (`tests/rpc_wire.rs`).
//!
//! # The format (TVM ≥ 0.21, protocol string `"0.8.0"`)
//!
//! All integers are little-endian. A packet is `u64 nbytes` (not counting itself), an `i32`
//! [`RpcCode`], then a body. Most bodies hold a *packed sequence*: `i32 num_args`, then per
//! argument an `i32` tvm-ffi type index and its payload:
//!
//! | type index | payload |
//! |---|---|
//! | 0 None | nothing |
//! | 1 int, 2 bool, 3 float | 8 bytes |
//! | 4 opaque pointer | `u64` |
//! | 5 data type | `DLDataType` (4 bytes) and 4 bytes of padding |
//! | 6 device | `DLDevice` (8 bytes) |
//! | 7 `DLTensor*` | `u64` data, device, `i32` ndim, dtype, `i64` shape\[ndim\], `u64` byte_offset |
//! | 8 raw string, 9 byte array | `u64` length and the bytes |
//! | 68 function, 73 module | `u64` handle (client to server only) |
//! | objects (11, 12, ≥ 64) | a second `u32` type index (65 str, 66 bytes, 115 RPC object reference), then `u64` length and bytes, or an `i64` handle |
//!
//! TVM ≤ 0.20 wrote `TVMArgTypeCode`s in place of type indices with the same protocol string,
//! so the two meet, shake hands and then misread each other. The decoder recognises the usual
//! first casualty (a string sent as the old code 11) and says so.

use std::fmt;

use crate::packed_func::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType};

/// The magic number of the RPC handshake (`kRPCMagic`).
pub const RPC_MAGIC: i32 = 0xff271;
/// The handshake answer to a client whose key the server does not serve.
pub const RPC_CODE_MISMATCH: i32 = RPC_MAGIC + 2;
/// The magic number of the tracker's protocol.
pub const TRACKER_MAGIC: i32 = 0x2f271;
/// The protocol version string both ends exchange in [`RpcCode::InitServer`].
pub const PROTOCOL_VERSION: &str = "0.8.0";
/// The type index of an RPC object reference (`kTVMFFIDynObjectBegin - 13`).
pub const RPC_OBJECT_REF: i32 = 115;
/// The most dimensions a tensor on the wire may have.
pub const MAX_NDIM: i32 = 64;
/// The most arguments one packed sequence may have.
pub const MAX_ARGS: i32 = 4096;

/// The packet codes (`RPCCode` in TVM's `rpc_reference.h`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(i32)]
#[allow(missing_docs)]
pub enum RpcCode {
    None = 0,
    Shutdown = 1,
    InitServer = 2,
    CallFunc = 3,
    Return = 4,
    Exception = 5,
    CopyFromRemote = 6,
    CopyToRemote = 7,
    CopyAck = 8,
    GetGlobalFunc = 9,
    FreeHandle = 10,
    DevSetDevice = 11,
    DevGetAttr = 12,
    DevAllocData = 13,
    DevFreeData = 14,
    DevStreamSync = 15,
    CopyAmongRemote = 16,
    DevAllocDataWithScope = 17,
    DevCreateStream = 18,
    DevFreeStream = 19,
    DevSetStream = 20,
    DevGetCurrentStream = 21,
}

impl RpcCode {
    /// The code of a packet's `i32`, or `None` for a code TVM does not define.
    pub fn from_i32(v: i32) -> Option<Self> {
        use RpcCode::*;
        Some(match v {
            0 => None,
            1 => Shutdown,
            2 => InitServer,
            3 => CallFunc,
            4 => Return,
            5 => Exception,
            6 => CopyFromRemote,
            7 => CopyToRemote,
            8 => CopyAck,
            9 => GetGlobalFunc,
            10 => FreeHandle,
            11 => DevSetDevice,
            12 => DevGetAttr,
            13 => DevAllocData,
            14 => DevFreeData,
            15 => DevStreamSync,
            16 => CopyAmongRemote,
            17 => DevAllocDataWithScope,
            18 => DevCreateStream,
            19 => DevFreeStream,
            20 => DevSetStream,
            21 => DevGetCurrentStream,
            _ => return Option::None,
        })
    }
}

/// A malformed packet: what was expected, what was seen, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The packet ended before a field.
    #[error("truncated packet: {what} needs {need} bytes at offset {at}, {have} left")]
    Truncated {
        /// The field.
        what: String,
        /// Bytes it needs.
        need: u64,
        /// Bytes left.
        have: u64,
        /// Its offset in the body.
        at: usize,
    },
    /// A count or length beyond what the protocol allows.
    #[error("{what} is {value}, expected at most {max}")]
    TooLarge {
        /// The field.
        what: String,
        /// Its value.
        value: i64,
        /// The limit.
        max: i64,
    },
    /// A value the protocol does not allow there.
    #[error("{what}: expected {expected}, got {got}")]
    Invalid {
        /// The field.
        what: String,
        /// What the protocol allows.
        expected: String,
        /// What came.
        got: String,
    },
    /// Bytes after the last field of a packet.
    #[error("{extra} unexpected bytes after the {what}")]
    Trailing {
        /// The packet.
        what: String,
        /// How many.
        extra: usize,
    },
}

/// A tensor's header on the wire: the peer's handle to its memory and the layout (always
/// compact; the wire has no strides).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireTensor {
    /// The data handle, as the server handed it out.
    pub data: u64,
    /// The device.
    pub device: DLDevice,
    /// The element type.
    pub dtype: DLDataType,
    /// The extents.
    pub shape: Vec<i64>,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

impl WireTensor {
    /// The bytes of its elements, or `None` for a negative extent or an overflow.
    pub fn nbytes(&self) -> Option<u64> {
        crate::device_api::data_size(&self.shape, self.dtype)
    }
}

/// One value of a packed sequence.
#[derive(Clone, Debug, PartialEq)]
pub enum WireValue {
    /// `None`.
    None,
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A float.
    Float(f64),
    /// An opaque pointer: a handle of the peer (an allocation, a stream, an object).
    Handle(u64),
    /// A data type.
    DataType(DLDataType),
    /// A device.
    Device(DLDevice),
    /// A tensor header.
    Tensor(WireTensor),
    /// A string (raw or object).
    Str(String),
    /// Bytes (byte array or object).
    Bytes(Vec<u8>),
    /// A function handle of the server.
    Function(u64),
    /// A module handle of the server.
    Module(u64),
    /// A reference to any other object of the server.
    ObjectRef(u64),
}

impl WireValue {
    /// The tvm-ffi type name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            WireValue::None => "None",
            WireValue::Int(_) => "int",
            WireValue::Bool(_) => "bool",
            WireValue::Float(_) => "float",
            WireValue::Handle(_) => "void*",
            WireValue::DataType(_) => "DataType",
            WireValue::Device(_) => "Device",
            WireValue::Tensor(_) => "DLTensor*",
            WireValue::Str(_) => "str",
            WireValue::Bytes(_) => "bytes",
            WireValue::Function(_) => "ffi.Function",
            WireValue::Module(_) => "ffi.Module",
            WireValue::ObjectRef(_) => "rpc.ObjectRef",
        }
    }

    /// The tvm-ffi type index this value is sent with.
    pub fn type_index(&self) -> i32 {
        match self {
            WireValue::None => 0,
            WireValue::Int(_) => 1,
            WireValue::Bool(_) => 2,
            WireValue::Float(_) => 3,
            WireValue::Handle(_) => 4,
            WireValue::DataType(_) => 5,
            WireValue::Device(_) => 6,
            WireValue::Tensor(_) => 7,
            WireValue::Str(_) => 8,
            WireValue::Bytes(_) => 9,
            WireValue::Function(_) => 68,
            WireValue::Module(_) => 73,
            WireValue::ObjectRef(_) => RPC_OBJECT_REF,
        }
    }
}

impl fmt::Display for WireValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireValue::Str(s) if s.len() <= 64 => write!(f, "str {s:?}"),
            WireValue::Int(v) => write!(f, "int {v}"),
            other => f.write_str(other.type_name()),
        }
    }
}

// ------------------------------------------------------------------------------------ reading

/// A cursor over a packet body that never reads past its end.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// The bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The offset of the next byte.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Fails unless every byte was read.
    pub fn finish(&self, what: &str) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(WireError::Trailing {
                what: what.to_owned(),
                extra,
            }),
        }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: u64, what: &str) -> Result<&'a [u8], WireError> {
        let have = self.remaining() as u64;
        if n > have {
            return Err(WireError::Truncated {
                what: what.to_owned(),
                need: n,
                have,
                at: self.pos,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N as u64, what)?);
        Ok(a)
    }

    /// An `i32`.
    pub fn i32(&mut self, what: &str) -> Result<i32, WireError> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }

    /// A `u32`.
    pub fn u32(&mut self, what: &str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// An `i64`.
    pub fn i64(&mut self, what: &str) -> Result<i64, WireError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    /// A `u64`.
    pub fn u64(&mut self, what: &str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A `DLDevice`.
    pub fn device(&mut self, what: &str) -> Result<DLDevice, WireError> {
        let device_type = self.i32(what)?;
        let device_id = self.i32(what)?;
        Ok(DLDevice {
            device_type: DLDeviceType(device_type),
            device_id,
        })
    }

    /// A `DLDataType`.
    pub fn dtype(&mut self, what: &str) -> Result<DLDataType, WireError> {
        let [code, bits, l0, l1] = self.array::<4>(what)?;
        Ok(DLDataType {
            code: DLDataTypeCode(code),
            bits,
            lanes: u16::from_le_bytes([l0, l1]),
        })
    }

    /// A `u64` length and that many bytes.
    pub fn blob(&mut self, what: &str) -> Result<&'a [u8], WireError> {
        let len = self.u64(what)?;
        self.bytes(len, what)
    }

    /// A `u64` length and that many bytes of UTF-8.
    pub fn string(&mut self, what: &str) -> Result<String, WireError> {
        let b = self.blob(what)?;
        String::from_utf8(b.to_vec()).map_err(|e| WireError::Invalid {
            what: what.to_owned(),
            expected: "UTF-8 text".to_owned(),
            got: format!("invalid UTF-8 at byte {}", e.utf8_error().valid_up_to()),
        })
    }

    /// A tensor header.
    pub fn tensor(&mut self, what: &str) -> Result<WireTensor, WireError> {
        let data = self.u64(what)?;
        let device = self.device(what)?;
        let ndim = self.i32(what)?;
        if !(0..=MAX_NDIM).contains(&ndim) {
            return Err(WireError::Invalid {
                what: format!("{what}: ndim"),
                expected: format!("0..={MAX_NDIM}"),
                got: ndim.to_string(),
            });
        }
        let dtype = self.dtype(what)?;
        let mut shape = Vec::with_capacity(ndim as usize);
        for _ in 0..ndim {
            shape.push(self.i64(what)?);
        }
        let byte_offset = self.u64(what)?;
        Ok(WireTensor {
            data,
            device,
            dtype,
            shape,
            byte_offset,
        })
    }

    /// A packed sequence.
    pub fn seq(&mut self) -> Result<Vec<WireValue>, WireError> {
        let n = self.i32("the argument count")?;
        if !(0..=MAX_ARGS).contains(&n) {
            return Err(WireError::TooLarge {
                what: "the argument count".to_owned(),
                value: n.into(),
                max: MAX_ARGS.into(),
            });
        }
        // Every argument takes at least its 4-byte type index: a count the body cannot hold is
        // refused before anything is allocated for it.
        if (n as usize) * 4 > self.remaining() {
            return Err(WireError::Truncated {
                what: format!("{n} arguments"),
                need: n as u64 * 4,
                have: self.remaining() as u64,
                at: self.pos,
            });
        }
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            out.push(self.value(i)?);
        }
        Ok(out)
    }

    fn value(&mut self, i: i32) -> Result<WireValue, WireError> {
        let what = format!("argument #{i}");
        let at = self.pos;
        let tindex = self.i32(&what)?;
        Ok(match tindex {
            0 => WireValue::None,
            1 => WireValue::Int(self.i64(&what)?),
            2 => WireValue::Bool(self.i64(&what)? != 0),
            3 => WireValue::Float(f64::from_bits(self.u64(&what)?)),
            4 => WireValue::Handle(self.u64(&what)?),
            5 => {
                let d = self.dtype(&what)?;
                self.i32(&what)?;
                WireValue::DataType(d)
            }
            6 => WireValue::Device(self.device(&what)?),
            7 => WireValue::Tensor(self.tensor(&what)?),
            8 => WireValue::Str(self.string(&what)?),
            9 => WireValue::Bytes(self.blob(&what)?.to_vec()),
            68 => WireValue::Function(self.u64(&what)?),
            73 => WireValue::Module(self.u64(&what)?),
            11 | 12 | 64.. => {
                let inner = self.u32(&what)?;
                match inner {
                    65 => WireValue::Str(self.string(&what)?),
                    66 => WireValue::Bytes(self.blob(&what)?.to_vec()),
                    115 => WireValue::ObjectRef(self.u64(&what)?),
                    other => {
                        let old = if tindex == 11 || tindex == 12 {
                            format!(
                                " (the type code {tindex} followed by a length is how TVM 0.20 \
                                 and older sent a string: this peer speaks the pre-0.21 argument \
                                 encoding, which kiln, like TVM 0.21 and later, does not read \
                                 although the protocol string is the same \"0.8.0\")"
                            )
                        } else {
                            String::new()
                        };
                        return Err(WireError::Invalid {
                            what: format!("{what} (type index {tindex}, at offset {at})"),
                            expected: "an object of type index 65 (str), 66 (bytes) or 115 (RPC \
                                       object reference)"
                                .to_owned(),
                            got: format!("type index {other}{old}"),
                        });
                    }
                }
            }
            other => {
                return Err(WireError::Invalid {
                    what: format!("{what} (at offset {at})"),
                    expected: "a tvm-ffi type index the RPC protocol carries (0-9, 11, 12, 68, \
                               73 or an object)"
                        .to_owned(),
                    got: format!("type index {other}"),
                })
            }
        })
    }
}

// ------------------------------------------------------------------------------------ writing

/// Appends little-endian fields to a packet under construction.
#[derive(Default, Debug)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// A packet of `code`: its length is filled in by [`Writer::finish`].
    pub fn packet(code: RpcCode) -> Self {
        let mut w = Self {
            buf: Vec::with_capacity(64),
        };
        w.u64(0);
        w.i32(code as i32);
        w
    }

    /// The finished packet, its length prefix set.
    pub fn finish(mut self) -> Vec<u8> {
        let n = (self.buf.len() - 8) as u64;
        self.buf[..8].copy_from_slice(&n.to_le_bytes());
        self.buf
    }

    /// Sets the length prefix to `len` (for a packet whose payload follows separately).
    pub fn finish_with_len(mut self, len: u64) -> Vec<u8> {
        self.buf[..8].copy_from_slice(&len.to_le_bytes());
        self.buf
    }

    /// The bytes written so far, less the 8-byte length prefix.
    pub fn body_len(&self) -> usize {
        self.buf.len() - 8
    }

    /// Appends an `i32`.
    pub fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends an `i64`.
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends raw bytes.
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// Appends a `u64` length and the bytes.
    pub fn blob(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.raw(b);
    }

    /// Appends a device.
    pub fn device(&mut self, d: DLDevice) {
        self.i32(d.device_type.0);
        self.i32(d.device_id);
    }

    /// Appends a data type.
    pub fn dtype(&mut self, d: DLDataType) {
        self.buf.push(d.code.0);
        self.buf.push(d.bits);
        self.buf.extend_from_slice(&d.lanes.to_le_bytes());
    }

    /// Appends a tensor header.
    pub fn tensor(&mut self, t: &WireTensor) {
        self.u64(t.data);
        self.device(t.device);
        self.i32(t.shape.len() as i32);
        self.dtype(t.dtype);
        for &s in &t.shape {
            self.i64(s);
        }
        self.u64(t.byte_offset);
    }

    /// Appends a packed sequence.
    pub fn seq(&mut self, values: &[WireValue]) {
        self.i32(values.len() as i32);
        for v in values {
            self.value(v);
        }
    }

    /// Appends one value with its type index.
    pub fn value(&mut self, v: &WireValue) {
        self.i32(v.type_index());
        match v {
            WireValue::None => {}
            WireValue::Int(x) => self.i64(*x),
            WireValue::Bool(b) => self.i64(i64::from(*b)),
            WireValue::Float(x) => self.u64(x.to_bits()),
            WireValue::Handle(h) | WireValue::Function(h) | WireValue::Module(h) => self.u64(*h),
            WireValue::DataType(d) => {
                self.dtype(*d);
                self.i32(0);
            }
            WireValue::Device(d) => self.device(*d),
            WireValue::Tensor(t) => self.tensor(t),
            WireValue::Str(s) => self.blob(s.as_bytes()),
            WireValue::Bytes(b) => self.blob(b),
            WireValue::ObjectRef(h) => {
                self.u32(RPC_OBJECT_REF as u32);
                self.u64(*h);
            }
        }
    }
}

/// A `Return` packet holding `values`.
pub fn return_packet(values: &[WireValue]) -> Vec<u8> {
    let mut w = Writer::packet(RpcCode::Return);
    w.seq(values);
    w.finish()
}

/// An `Exception` packet with `message`.
pub fn exception_packet(message: &str) -> Vec<u8> {
    let mut w = Writer::packet(RpcCode::Exception);
    w.seq(&[WireValue::Str(message.to_owned())]);
    w.finish()
}

/// Parses a whole packed sequence body (nothing may follow it).
pub fn decode_seq(body: &[u8]) -> Result<Vec<WireValue>, WireError> {
    let mut r = Reader::new(body);
    let v = r.seq()?;
    r.finish("argument sequence")?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(values: Vec<WireValue>) {
        let mut w = Writer::default();
        w.seq(&values);
        assert_eq!(decode_seq(&w.buf).unwrap(), values);
    }

    #[test]
    fn values_roundtrip() {
        roundtrip(vec![
            WireValue::None,
            WireValue::Int(-5),
            WireValue::Bool(true),
            WireValue::Float(1.5),
            WireValue::Handle(0xdead_beef),
            WireValue::DataType(DLDataType {
                code: DLDataTypeCode::FLOAT,
                bits: 32,
                lanes: 4,
            }),
            WireValue::Device(DLDevice {
                device_type: DLDeviceType::OPENCL,
                device_id: 1,
            }),
            WireValue::Tensor(WireTensor {
                data: 64,
                device: DLDevice {
                    device_type: DLDeviceType::CPU,
                    device_id: 0,
                },
                dtype: DLDataType {
                    code: DLDataTypeCode::FLOAT,
                    bits: 32,
                    lanes: 1,
                },
                shape: vec![2, 3],
                byte_offset: 8,
            }),
            WireValue::Str("tvm.rpc.server.upload".into()),
            WireValue::Bytes(vec![0, 1, 2]),
            WireValue::Function(7),
            WireValue::Module(8),
            WireValue::ObjectRef(9),
        ]);
    }

    #[test]
    fn object_strings_are_read() {
        // A string sent as a `SmallStr` object: type index 11, then 65 and the bytes.
        let mut w = Writer::default();
        w.i32(1);
        w.i32(11);
        w.u32(65);
        w.blob(b"abc");
        assert_eq!(
            decode_seq(&w.buf).unwrap(),
            vec![WireValue::Str("abc".into())]
        );
    }

    #[test]
    fn old_encoding_is_named() {
        // TVM 0.20: `kTVMStr` (11) followed by a u64 length.
        let mut w = Writer::default();
        w.i32(1);
        w.i32(11);
        w.blob(b"tvm.rpc.server.upload");
        let e = decode_seq(&w.buf).unwrap_err().to_string();
        assert!(e.contains("pre-0.21"), "{e}");
    }

    #[test]
    fn truncation_and_limits() {
        let mut w = Writer::default();
        w.i32(1);
        w.i32(8);
        w.u64(u64::MAX);
        let e = decode_seq(&w.buf).unwrap_err();
        assert!(matches!(e, WireError::Truncated { .. }), "{e}");
        let mut w = Writer::default();
        w.i32(1_000_000);
        assert!(matches!(
            decode_seq(&w.buf).unwrap_err(),
            WireError::TooLarge { .. }
        ));
        let mut w = Writer::default();
        w.i32(1);
        w.i32(7);
        w.u64(0);
        w.device(DLDevice {
            device_type: DLDeviceType::CPU,
            device_id: 0,
        });
        w.i32(1 << 20);
        let e = decode_seq(&w.buf).unwrap_err().to_string();
        assert!(e.contains("ndim"), "{e}");
        let mut w = Writer::default();
        w.i32(1);
        w.i32(42);
        let e = decode_seq(&w.buf).unwrap_err().to_string();
        assert!(e.contains("type index 42"), "{e}");
    }
}
