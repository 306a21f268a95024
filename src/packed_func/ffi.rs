//! The C ABI: tvm-ffi 0.1 and DLPack 1.3 structures, spelled as in C, checked at compile time.
//!
//! Every struct here is `#[repr(C)]` and hand-written (no bindgen, no link to `libtvm_ffi`).
//! Codes that arrive from C (type indices, device types, dtype codes) are integer newtypes with
//! named constants, never Rust enums: a code kiln does not know is a value to report, not
//! undefined behaviour. Sizes and field offsets are asserted below at compile time, and the test
//! `tests/abi_layout.rs` checks them against the real headers when the `apache-tvm-ffi` wheel is
//! installed.
//!
//! This file is one of the few places that hold `unsafe` code: the object reference counting
//! that mirrors tvm-ffi's `Object::IncRef`/`DecRef`, and the objects kiln itself creates
//! (strings, bytes, tensors).

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// A tvm-ffi type index (`TVMFFITypeIndex` / `int32_t type_index`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TypeIndex(pub i32);

impl TypeIndex {
    /// `kTVMFFIAny`: any type (only in signatures).
    pub const ANY: Self = Self(-1);
    /// `kTVMFFINone`.
    pub const NONE: Self = Self(0);
    /// `kTVMFFIInt`: `v_int64`.
    pub const INT: Self = Self(1);
    /// `kTVMFFIBool`: `v_int64` 0 or 1.
    pub const BOOL: Self = Self(2);
    /// `kTVMFFIFloat`: `v_float64`.
    pub const FLOAT: Self = Self(3);
    /// `kTVMFFIOpaquePtr`: `v_ptr`.
    pub const OPAQUE_PTR: Self = Self(4);
    /// `kTVMFFIDataType`: `v_dtype`.
    pub const DATA_TYPE: Self = Self(5);
    /// `kTVMFFIDevice`: `v_device`.
    pub const DEVICE: Self = Self(6);
    /// `kTVMFFIDLTensorPtr`: `v_ptr` is a `DLTensor*`.
    pub const DL_TENSOR_PTR: Self = Self(7);
    /// `kTVMFFIRawStr`: `v_c_str`, NUL-terminated, not owned.
    pub const RAW_STR: Self = Self(8);
    /// `kTVMFFIByteArrayPtr`: `v_ptr` is a `TVMFFIByteArray*`.
    pub const BYTE_ARRAY_PTR: Self = Self(9);
    /// `kTVMFFIObjectRValueRef`.
    pub const OBJECT_RVALUE_REF: Self = Self(10);
    /// `kTVMFFISmallStr`: up to 7 bytes in `v_bytes`, length in `small_str_len`.
    pub const SMALL_STR: Self = Self(11);
    /// `kTVMFFISmallBytes`: like [`Self::SMALL_STR`] for bytes.
    pub const SMALL_BYTES: Self = Self(12);
    /// `kTVMFFIStaticObjectBegin`: indices from here on are reference-counted objects.
    pub const STATIC_OBJECT_BEGIN: Self = Self(64);
    /// `kTVMFFIObject`.
    pub const OBJECT: Self = Self(64);
    /// `kTVMFFIStr`: object followed by a `TVMFFIByteArray`.
    pub const STR: Self = Self(65);
    /// `kTVMFFIBytes`: object followed by a `TVMFFIByteArray`.
    pub const BYTES: Self = Self(66);
    /// `kTVMFFIError`.
    pub const ERROR: Self = Self(67);
    /// `kTVMFFIFunction`.
    pub const FUNCTION: Self = Self(68);
    /// `kTVMFFIShape`.
    pub const SHAPE: Self = Self(69);
    /// `kTVMFFITensor`: object followed by a `DLTensor` (at byte 24).
    pub const TENSOR: Self = Self(70);
    /// `kTVMFFIArray`.
    pub const ARRAY: Self = Self(71);
    /// `kTVMFFIMap`.
    pub const MAP: Self = Self(72);
    /// `kTVMFFIModule`.
    pub const MODULE: Self = Self(73);
    /// `kTVMFFIBigInt`.
    pub const BIG_INT: Self = Self(78);
    /// kiln's own objects holding a Rust value (an `IRModule`, a `Target`, a runtime module...),
    /// passed between kiln's packed functions such as `target.build.<kind>`. Foreign code sees an
    /// opaque object of an index no other runtime uses.
    pub const KILN_RUST_OBJECT: Self = Self(0x4B49_4C4E);

    /// Whether values of this index are reference-counted objects.
    pub fn is_object(self) -> bool {
        self.0 >= Self::STATIC_OBJECT_BEGIN.0
    }

    /// The name tvm-ffi uses for this index (`"int"`, `"ffi.Tensor"`, ...), or `None` if unknown.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            -1 => "Any",
            0 => "None",
            1 => "int",
            2 => "bool",
            3 => "float",
            4 => "void*",
            5 => "DataType",
            6 => "Device",
            7 => "DLTensor*",
            8 => "str",
            9 => "TVMFFIByteArray*",
            10 => "ObjectRValueRef",
            11 => "str",
            12 => "bytes",
            64 => "ffi.Object",
            65 => "str",
            66 => "bytes",
            67 => "ffi.Error",
            68 => "ffi.Function",
            69 => "ffi.Shape",
            70 => "ffi.Tensor",
            71 => "ffi.Array",
            72 => "ffi.Map",
            73 => "ffi.Module",
            78 => "ffi.BigInt",
            0x4B49_4C4E => "kiln.RustObject",
            _ => return None,
        })
    }
}

impl std::fmt::Debug for TypeIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for TypeIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "type index {}", self.0),
        }
    }
}

/// A DLPack device type code (`DLDeviceType`, 4 bytes in C).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct DLDeviceType(pub i32);

impl DLDeviceType {
    /// `kDLCPU`.
    pub const CPU: Self = Self(1);
    /// `kDLCUDA`.
    pub const CUDA: Self = Self(2);
    /// `kDLCUDAHost`.
    pub const CUDA_HOST: Self = Self(3);
    /// `kDLOpenCL`.
    pub const OPENCL: Self = Self(4);
    /// `kDLVulkan`.
    pub const VULKAN: Self = Self(7);
    /// `kDLMetal`.
    pub const METAL: Self = Self(8);
    /// `kDLVPI`.
    pub const VPI: Self = Self(9);
    /// `kDLROCM`.
    pub const ROCM: Self = Self(10);
    /// `kDLROCMHost`.
    pub const ROCM_HOST: Self = Self(11);
    /// `kDLExtDev`.
    pub const EXT_DEV: Self = Self(12);
    /// `kDLCUDAManaged`.
    pub const CUDA_MANAGED: Self = Self(13);
    /// `kDLOneAPI`.
    pub const ONE_API: Self = Self(14);
    /// `kDLWebGPU`.
    pub const WEBGPU: Self = Self(15);
    /// `kDLHexagon`.
    pub const HEXAGON: Self = Self(16);
    /// `kDLMAIA`.
    pub const MAIA: Self = Self(17);
    /// `kDLTrn`.
    pub const TRN: Self = Self(18);
}

/// A DLPack dtype code (`DLDataTypeCode`, one byte in `DLDataType`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct DLDataTypeCode(pub u8);

impl DLDataTypeCode {
    /// `kDLInt`.
    pub const INT: Self = Self(0);
    /// `kDLUInt`.
    pub const UINT: Self = Self(1);
    /// `kDLFloat`.
    pub const FLOAT: Self = Self(2);
    /// `kDLOpaqueHandle`.
    pub const OPAQUE_HANDLE: Self = Self(3);
    /// `kDLBfloat`.
    pub const BFLOAT: Self = Self(4);
    /// `kDLComplex`.
    pub const COMPLEX: Self = Self(5);
    /// `kDLBool`.
    pub const BOOL: Self = Self(6);
}

/// `DLDevice`: 8 bytes.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DLDevice {
    /// The device type code.
    pub device_type: DLDeviceType,
    /// The device ordinal.
    pub device_id: i32,
}

/// `DLDataType`: 4 bytes (`code`, `bits`, `lanes`).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DLDataType {
    /// The type code.
    pub code: DLDataTypeCode,
    /// Bits per lane.
    pub bits: u8,
    /// Number of lanes (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`: 48 bytes. `strides` is in elements and may be NULL (compact row-major).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    /// Base pointer of the data (for non-CPU devices, an opaque device handle).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or NULL for compact row-major.
    pub strides: *mut i64,
    /// Offset in bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DLPackVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version (3).
    pub minor: u32,
}

/// The DLPack version kiln writes.
pub const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 3 };

/// `DLManagedTensorVersioned`: 80 bytes.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version of the producer.
    pub version: DLPackVersion,
    /// The producer's context for the deleter.
    pub manager_ctx: *mut c_void,
    /// Called exactly once by the consumer when it is done; may be NULL.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*`.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub const DLPACK_FLAG_READ_ONLY: u64 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
pub const DLPACK_FLAG_IS_COPIED: u64 = 2;

/// The object deleter: `void (*)(void* self, int flags)`.
pub type TVMFFIObjectDeleter = unsafe extern "C" fn(*mut c_void, i32);

/// Deleter flag: run the destructor (strong count reached zero).
pub const DELETER_FLAG_STRONG: i32 = 1;
/// Deleter flag: free the memory block (weak count reached zero).
pub const DELETER_FLAG_WEAK: i32 = 2;
/// Deleter flag: both at once (the common case).
pub const DELETER_FLAG_BOTH: i32 = 3;

/// `TVMFFIObject`: the 24-byte header of every reference-counted object.
#[repr(C)]
#[derive(Debug)]
pub struct TVMFFIObject {
    /// Strong count in the low 32 bits, weak count in the high 32 bits.
    pub combined_ref_count: u64,
    /// The object's type index.
    pub type_index: TypeIndex,
    /// Padding.
    pub padding: u32,
    /// Called when a count reaches zero; may be NULL.
    pub deleter: Option<TVMFFIObjectDeleter>,
}

/// The 8-byte payload union of `TVMFFIAny`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union TVMFFIAnyValue {
    /// Integers and bools.
    pub v_int64: i64,
    /// Floats.
    pub v_float64: f64,
    /// Pointers.
    pub v_ptr: *mut c_void,
    /// Raw C strings.
    pub v_c_str: *const std::ffi::c_char,
    /// Objects.
    pub v_obj: *mut TVMFFIObject,
    /// Data types.
    pub v_dtype: DLDataType,
    /// Devices.
    pub v_device: DLDevice,
    /// Small strings and bytes.
    pub v_bytes: [u8; 8],
    /// The raw bits.
    pub v_uint64: u64,
}

/// `TVMFFIAny`: 16 bytes, the value every packed-function argument and result is passed as.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TVMFFIAny {
    /// What the payload holds.
    pub type_index: TypeIndex,
    /// Zero, except the length of a small string or small bytes.
    pub small_len: u32,
    /// The payload.
    pub value: TVMFFIAnyValue,
}

impl TVMFFIAny {
    /// The `None` value.
    pub const NONE: Self = Self {
        type_index: TypeIndex::NONE,
        small_len: 0,
        value: TVMFFIAnyValue { v_int64: 0 },
    };
}

impl std::fmt::Debug for TVMFFIAny {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: every bit pattern of the 8-byte union is a valid u64.
        let bits = unsafe { self.value.v_uint64 };
        write!(f, "TVMFFIAny({}, {bits:#x})", self.type_index)
    }
}

/// `TVMFFIByteArray`: the payload of string and bytes objects.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TVMFFIByteArray {
    /// The bytes (not necessarily NUL-terminated).
    pub data: *const u8,
    /// Their number.
    pub size: usize,
}

/// `TVMFFISafeCallType`: the calling convention of every packed function.
///
/// Returns 0 on success; -1 after raising an error through `TVMFFIErrorSetRaised*`; -2 is reserved
/// for frontend errors.
pub type TVMFFISafeCallType =
    unsafe extern "C" fn(*mut c_void, *const TVMFFIAny, i32, *mut TVMFFIAny) -> i32;

// Layout checks (x86_64 / aarch64 LP64): these are the sizes and offsets of the C headers.
const _: () = {
    assert!(size_of::<DLDevice>() == 8);
    assert!(size_of::<DLDataType>() == 4);
    assert!(size_of::<DLTensor>() == 48);
    assert!(offset_of!(DLTensor, device) == 8);
    assert!(offset_of!(DLTensor, ndim) == 16);
    assert!(offset_of!(DLTensor, dtype) == 20);
    assert!(offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32);
    assert!(offset_of!(DLTensor, byte_offset) == 40);
    assert!(size_of::<DLPackVersion>() == 8);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
    assert!(size_of::<TVMFFIObject>() == 24);
    assert!(offset_of!(TVMFFIObject, type_index) == 8);
    assert!(offset_of!(TVMFFIObject, deleter) == 16);
    assert!(size_of::<TVMFFIAny>() == 16);
    assert!(offset_of!(TVMFFIAny, small_len) == 4);
    assert!(offset_of!(TVMFFIAny, value) == 8);
    assert!(size_of::<TVMFFIByteArray>() == 16);
};

/// Byte offset of the `DLTensor` inside a tensor object (after the object header).
pub const TENSOR_OBJECT_DLTENSOR_OFFSET: usize = size_of::<TVMFFIObject>();
/// Byte offset of the `TVMFFIByteArray` inside a string or bytes object.
pub const BYTES_OBJECT_ARRAY_OFFSET: usize = size_of::<TVMFFIObject>();

const STRONG_ONE: u64 = 1;
const WEAK_ONE: u64 = 1 << 32;
const BOTH_ONE: u64 = STRONG_ONE | WEAK_ONE;
const COUNT_MASK: u64 = (1 << 32) - 1;

/// Adds a strong reference to an object, like tvm-ffi's `TVMFFIObjectIncRef`.
///
/// # Safety
/// - `obj` points to a live object with a tvm-ffi header whose strong count is at least one.
pub(crate) unsafe fn object_inc_ref(obj: *mut TVMFFIObject) {
    // SAFETY: the caller guarantees `obj` is live; the count is only touched atomically, as the
    // C++ side does with `__atomic_fetch_add` on the same 8 bytes.
    let count = unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*obj).combined_ref_count)) };
    count.fetch_add(STRONG_ONE, Ordering::Relaxed);
}

/// Drops a strong reference, running the deleter as tvm-ffi's `Object::DecRef` does.
///
/// # Safety
/// - `obj` points to a live object and the caller owns one strong reference, which it gives up.
pub(crate) unsafe fn object_dec_ref(obj: *mut TVMFFIObject) {
    // SAFETY: as in `object_inc_ref`; the caller owns a strong reference, so the object is live
    // until the count falls to zero below.
    let count = unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*obj).combined_ref_count)) };
    // SAFETY: `obj` is live (see above); reading the deleter does not race with anything.
    let deleter = unsafe { (*obj).deleter };
    let before = count.fetch_sub(STRONG_ONE, Ordering::Release);
    if before == BOTH_ONE {
        fence(Ordering::Acquire);
        if let Some(d) = deleter {
            // SAFETY: both counts reached zero: the deleter frees the object exactly once.
            unsafe { d(obj.cast(), DELETER_FLAG_BOTH) };
        }
    } else if before & COUNT_MASK == STRONG_ONE {
        fence(Ordering::Acquire);
        if let Some(d) = deleter {
            // SAFETY: the strong count reached zero: destroy the payload, keep the block.
            unsafe { d(obj.cast(), DELETER_FLAG_STRONG) };
        }
        if count.fetch_sub(WEAK_ONE, Ordering::Release) == WEAK_ONE {
            fence(Ordering::Acquire);
            if let Some(d) = deleter {
                // SAFETY: the weak count reached zero too: free the block, once.
                unsafe { d(obj.cast(), DELETER_FLAG_WEAK) };
            }
        }
    }
}

/// Heap layout of the objects kiln creates: the header, then the C-visible payload, then Rust-only
/// data the deleter drops.
#[repr(C)]
struct KilnObject<P, R> {
    header: TVMFFIObject,
    payload: P,
    rust: R,
}

unsafe extern "C" fn kiln_object_deleter<P, R>(obj: *mut c_void, flags: i32) {
    // Our objects do no work on STRONG alone, and free everything when WEAK is set: kiln never
    // hands out weak references, so BOTH always arrives together.
    if flags & DELETER_FLAG_WEAK != 0 {
        let res = std::panic::catch_unwind(|| {
            // SAFETY: `obj` was created by `new_kiln_object::<P, R>` from a `Box`, and the
            // weak count just reached zero, so nobody else can reach it.
            drop(unsafe { Box::from_raw(obj.cast::<KilnObject<P, R>>()) });
        });
        if res.is_err() {
            log::error!(
                "a destructor panicked while freeing a kiln object; the panic was contained"
            );
        }
    }
}

/// Creates a reference-counted object holding `payload` (visible to C at byte 24) and `rust`
/// (dropped with the object). Returns the owned strong reference.
pub(crate) fn new_kiln_object<P: 'static, R: 'static>(
    type_index: TypeIndex,
    payload: P,
    rust: R,
) -> *mut TVMFFIObject {
    let obj = Box::new(KilnObject {
        header: TVMFFIObject {
            combined_ref_count: BOTH_ONE,
            type_index,
            padding: 0,
            deleter: Some(kiln_object_deleter::<P, R>),
        },
        payload,
        rust,
    });
    Box::into_raw(obj).cast()
}

/// The Rust value inside a `KILN_RUST_OBJECT`.
///
/// # Safety
/// - `obj` was created by `Any::rust_object` and outlives `'a`.
pub(crate) unsafe fn rust_object_payload<'a>(
    obj: *mut TVMFFIObject,
) -> &'a (dyn std::any::Any + Send + Sync) {
    // SAFETY: guaranteed by the caller: the object is a `KilnObject<(), Box<dyn Any + Send + Sync>>`.
    let o = unsafe { &*obj.cast::<KilnObject<(), Box<dyn std::any::Any + Send + Sync>>>() };
    &*o.rust
}

/// A string or bytes object: the `TVMFFIByteArray` points into the boxed bytes that follow it.
pub(crate) fn new_bytes_object(type_index: TypeIndex, bytes: Box<[u8]>) -> *mut TVMFFIObject {
    // The box's heap pointer does not move when the box itself is moved into the object.
    let array = TVMFFIByteArray {
        data: bytes.as_ptr(),
        size: bytes.len(),
    };
    new_kiln_object(type_index, array, bytes)
}

/// Reads the byte array of a string or bytes object.
///
/// # Safety
/// - `obj` is a live object of type [`TypeIndex::STR`] or [`TypeIndex::BYTES`] and outlives `'a`.
pub(crate) unsafe fn bytes_object_slice<'a>(obj: *const TVMFFIObject) -> &'a [u8] {
    // SAFETY: string and bytes objects are `{ TVMFFIObject, TVMFFIByteArray }` (c_api.h).
    let array = unsafe {
        &*obj
            .cast::<u8>()
            .add(BYTES_OBJECT_ARRAY_OFFSET)
            .cast::<TVMFFIByteArray>()
    };
    if array.size == 0 || array.data.is_null() {
        return &[];
    }
    // SAFETY: the object owns `size` bytes at `data` for as long as it lives.
    unsafe { std::slice::from_raw_parts(array.data, array.size) }
}

/// The `DLTensor` of a tensor object.
///
/// # Safety
/// - `obj` is a live object of type [`TypeIndex::TENSOR`].
pub(crate) unsafe fn tensor_object_dltensor(obj: *mut TVMFFIObject) -> *mut DLTensor {
    // SAFETY: tensor objects are `{ TVMFFIObject, DLTensor, ... }` (tvm-ffi's TensorObj).
    unsafe { obj.cast::<u8>().add(TENSOR_OBJECT_DLTENSOR_OFFSET).cast() }
}

// ---------------------------------------------------------------------------------------------
// Raised errors: the thread-local slot behind `TVMFFIErrorSetRaisedFromCStr`.

thread_local! {
    static RAISED: std::cell::RefCell<Option<(String, String)>> = const { std::cell::RefCell::new(None) };
}

/// Raises an error on this thread (what a packed function does before returning -1).
pub fn set_raised(kind: &str, message: &str) {
    RAISED.with(|r| *r.borrow_mut() = Some((kind.to_owned(), message.to_owned())));
}

/// Takes the error raised on this thread, if any.
pub fn take_raised() -> Option<(String, String)> {
    RAISED.with(|r| r.borrow_mut().take())
}

/// Copies a C string, tolerating NULL and invalid UTF-8.
///
/// # Safety
/// - `p` is NULL or points to a NUL-terminated string.
unsafe fn lossy(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// kiln's `TVMFFIErrorSetRaisedFromCStr(kind, message)`: written into the context slot
/// `__TVMFFIErrorSetRaisedFromCStr` of every library kiln loads.
///
/// # Safety
/// - `kind` and `message` are NULL or NUL-terminated strings.
pub unsafe extern "C" fn kiln_error_set_raised_from_cstr(
    kind: *const std::ffi::c_char,
    message: *const std::ffi::c_char,
) {
    // A panic must not unwind into C; there is nothing in here that panics on valid input, but
    // allocation failure or a poisoned thread-local would.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: guaranteed by the caller.
        let (k, m) = unsafe { (lossy(kind), lossy(message)) };
        set_raised(if k.is_empty() { "RuntimeError" } else { &k }, &m);
    });
}

/// kiln's `TVMFFIErrorSetRaisedFromCStrParts(kind, parts, n)`: the message is the parts joined.
///
/// # Safety
/// - `kind` is NULL or NUL-terminated; `parts` is NULL or points to `n` pointers, each NULL or
///   NUL-terminated.
pub unsafe extern "C" fn kiln_error_set_raised_from_cstr_parts(
    kind: *const std::ffi::c_char,
    parts: *const *const std::ffi::c_char,
    n: i32,
) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: guaranteed by the caller.
        let k = unsafe { lossy(kind) };
        let mut msg = String::new();
        if !parts.is_null() {
            for i in 0..n.max(0) as usize {
                // SAFETY: `parts` has `n` entries (caller).
                msg.push_str(&unsafe { lossy(*parts.add(i)) });
            }
        }
        set_raised(if k.is_empty() { "RuntimeError" } else { &k }, &msg);
    });
}

/// The signature of `TVMFFIErrorSetRaisedFromCStr`.
pub type SetRaisedFromCStrFn =
    unsafe extern "C" fn(*const std::ffi::c_char, *const std::ffi::c_char);
/// The signature of `TVMFFIErrorSetRaisedFromCStrParts`.
pub type SetRaisedFromCStrPartsFn =
    unsafe extern "C" fn(*const std::ffi::c_char, *const *const std::ffi::c_char, i32);
