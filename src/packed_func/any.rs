//! Values that cross the packed-function ABI: the owned [`Any`] and the borrowed [`AnyView`].
//!
//! Both are `#[repr(transparent)]` over [`TVMFFIAny`], so a `&[AnyView]` *is* the C argument
//! array (no copy on the way in or out), and an [`Any`] returned by a foreign function is taken
//! over as is. An `Any` owns one strong reference when it holds an object (strings, bytes,
//! tensors and any foreign object): `Clone` adds one, `Drop` gives it back, as tvm-ffi's C++
//! `Any` does.
//!
//! The invariant of both types: the wrapped `TVMFFIAny` is valid for its type index (an object
//! pointer points to a live object, a `DLTensor*` to a live tensor, a C string is NUL-terminated)
//! for the lifetime of the value. Safe constructors only build valid values; the `unsafe`
//! constructors state what the caller must guarantee.

use std::ffi::{c_void, CStr};
use std::fmt;
use std::marker::PhantomData;

use super::error::{ConversionError, PackedFuncError};
use super::ffi::{
    self, DLDataType, DLDevice, DLTensor, TVMFFIAny, TVMFFIAnyValue, TVMFFIObject, TypeIndex,
};

/// An owned packed-function value.
#[repr(transparent)]
pub struct Any {
    raw: TVMFFIAny,
}

// SAFETY: the payload is a plain value, a pointer kiln never dereferences without an `unsafe`
// contract, or an atomically reference-counted tvm-ffi object; moving or sharing the handle
// between threads is what tvm-ffi's own `Any` allows.
unsafe impl Send for Any {}
// SAFETY: as above; `&Any` only reads.
unsafe impl Sync for Any {}

/// A borrowed packed-function value, valid for `'a`: what a packed function receives.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct AnyView<'a> {
    raw: TVMFFIAny,
    _borrow: PhantomData<&'a ()>,
}

/// What an [`Any`] or [`AnyView`] holds, for `match`.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// `None`.
    None,
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A float.
    Float(f64),
    /// An opaque pointer (never dereferenced by kiln).
    OpaquePtr(*mut c_void),
    /// A data type.
    DataType(DLDataType),
    /// A device.
    Device(DLDevice),
    /// A `DLTensor*` argument (type index 7).
    DLTensorPtr(&'a DLTensor),
    /// A tensor object (type index 70).
    Tensor(&'a DLTensor),
    /// A string (small, object or raw C string). Not UTF-8 strings appear as [`Value::Bytes`].
    Str(&'a str),
    /// Bytes (small or object).
    Bytes(&'a [u8]),
    /// Any other object, by type index.
    Object(TypeIndex),
    /// A type index kiln does not know.
    Unknown(TypeIndex),
}

fn small(type_index: TypeIndex, bytes: &[u8]) -> TVMFFIAny {
    debug_assert!(bytes.len() <= 7);
    let mut v = [0u8; 8];
    v[..bytes.len()].copy_from_slice(bytes);
    TVMFFIAny {
        type_index,
        small_len: bytes.len() as u32,
        value: TVMFFIAnyValue { v_bytes: v },
    }
}

fn scalar(type_index: TypeIndex, value: TVMFFIAnyValue) -> TVMFFIAny {
    TVMFFIAny {
        type_index,
        small_len: 0,
        value,
    }
}

/// Reads a value. `raw` must satisfy the module invariant while it is borrowed.
fn value_of(raw: &TVMFFIAny) -> Value<'_> {
    let ti = raw.type_index;
    let v = raw.value;
    // SAFETY: each union field is read only under the type index that says it is the active
    // one, and all of them are plain old data. Pointer dereferences rely on the module
    // invariant: pointers of these type indices are live while `raw` is borrowed.
    unsafe {
        if ti.is_object() && v.v_obj.is_null() {
            return Value::None;
        }
        match ti {
            TypeIndex::NONE => Value::None,
            TypeIndex::INT => Value::Int(v.v_int64),
            TypeIndex::BOOL => Value::Bool(v.v_int64 != 0),
            TypeIndex::FLOAT => Value::Float(v.v_float64),
            TypeIndex::OPAQUE_PTR => Value::OpaquePtr(v.v_ptr),
            TypeIndex::DATA_TYPE => Value::DataType(v.v_dtype),
            TypeIndex::DEVICE => Value::Device(v.v_device),
            TypeIndex::DL_TENSOR_PTR if v.v_ptr.is_null() => Value::None,
            TypeIndex::DL_TENSOR_PTR => Value::DLTensorPtr(&*v.v_ptr.cast::<DLTensor>()),
            TypeIndex::TENSOR => Value::Tensor(&*ffi::tensor_object_dltensor(v.v_obj)),
            TypeIndex::RAW_STR if v.v_c_str.is_null() => Value::None,
            TypeIndex::RAW_STR => str_or_bytes(CStr::from_ptr(v.v_c_str).to_bytes()),
            TypeIndex::SMALL_STR | TypeIndex::SMALL_BYTES => {
                let len = (raw.small_len as usize).min(7);
                // The bytes live inside `raw`, which the caller keeps for `'a`.
                let bytes = std::slice::from_raw_parts(
                    std::ptr::addr_of!(raw.value.v_bytes).cast::<u8>(),
                    len,
                );
                if ti == TypeIndex::SMALL_STR {
                    str_or_bytes(bytes)
                } else {
                    Value::Bytes(bytes)
                }
            }
            TypeIndex::BYTE_ARRAY_PTR if v.v_ptr.is_null() => Value::None,
            TypeIndex::BYTE_ARRAY_PTR => {
                let a = &*v.v_ptr.cast::<ffi::TVMFFIByteArray>();
                if a.size == 0 || a.data.is_null() {
                    Value::Bytes(&[])
                } else {
                    Value::Bytes(std::slice::from_raw_parts(a.data, a.size))
                }
            }
            TypeIndex::STR => str_or_bytes(ffi::bytes_object_slice(v.v_obj)),
            TypeIndex::BYTES => Value::Bytes(ffi::bytes_object_slice(v.v_obj)),
            t if t.is_object() => Value::Object(t),
            t => Value::Unknown(t),
        }
    }
}

impl PartialEq for Value<'_> {
    /// Tensors compare by address; everything else by value.
    fn eq(&self, other: &Self) -> bool {
        use Value::*;
        match (self, other) {
            (None, None) => true,
            (Int(a), Int(b)) => a == b,
            (Bool(a), Bool(b)) => a == b,
            (Float(a), Float(b)) => a == b,
            (OpaquePtr(a), OpaquePtr(b)) => a == b,
            (DataType(a), DataType(b)) => a == b,
            (Device(a), Device(b)) => a == b,
            (DLTensorPtr(a), DLTensorPtr(b)) | (Tensor(a), Tensor(b)) => std::ptr::eq(*a, *b),
            (Str(a), Str(b)) => a == b,
            (Bytes(a), Bytes(b)) => a == b,
            (Object(a), Object(b)) | (Unknown(a), Unknown(b)) => a == b,
            _ => false,
        }
    }
}

fn str_or_bytes(b: &[u8]) -> Value<'_> {
    match std::str::from_utf8(b) {
        Ok(s) => Value::Str(s),
        Err(_) => Value::Bytes(b),
    }
}

impl<'a> AnyView<'a> {
    /// Wraps a raw C value without taking ownership.
    ///
    /// # Safety
    /// - `raw` is valid for its type index (objects, tensors and strings it points to are live)
    ///   for the whole lifetime `'a`.
    pub unsafe fn from_raw(raw: TVMFFIAny) -> Self {
        Self {
            raw,
            _borrow: PhantomData,
        }
    }

    /// Views a C argument array.
    ///
    /// # Safety
    /// - `args` points to `num_args` values that are valid (as in [`AnyView::from_raw`]) for `'a`,
    ///   or `num_args` is 0 (then `args` may be NULL).
    pub unsafe fn slice_from_raw(args: *const TVMFFIAny, num_args: usize) -> &'a [AnyView<'a>] {
        if num_args == 0 {
            return &[];
        }
        // SAFETY: `AnyView` is `repr(transparent)` over `TVMFFIAny`; the caller vouches for the
        // pointer and the count.
        unsafe { std::slice::from_raw_parts(args.cast(), num_args) }
    }

    /// The raw C value (still borrowed).
    pub fn as_raw(&self) -> &TVMFFIAny {
        &self.raw
    }

    /// Views a `DLTensor` as a type-index-7 argument.
    pub fn dltensor(t: &'a DLTensor) -> Self {
        let raw = scalar(
            TypeIndex::DL_TENSOR_PTR,
            TVMFFIAnyValue {
                v_ptr: (t as *const DLTensor).cast_mut().cast(),
            },
        );
        Self {
            raw,
            _borrow: PhantomData,
        }
    }

    /// Views a NUL-terminated string as a raw C string argument (type index 8).
    pub fn c_str(s: &'a CStr) -> Self {
        let raw = scalar(
            TypeIndex::RAW_STR,
            TVMFFIAnyValue {
                v_c_str: s.as_ptr(),
            },
        );
        Self {
            raw,
            _borrow: PhantomData,
        }
    }

    /// The type index.
    pub fn type_index(&self) -> TypeIndex {
        self.raw.type_index
    }

    /// What the value holds. (Small strings live inside the view itself, hence the borrow.)
    pub fn value(&self) -> Value<'_> {
        value_of(&self.raw)
    }

    /// The tensor behind a `DLTensor*` (7) or tensor object (70) argument, for `'a`.
    pub fn as_dltensor(&self) -> Option<&'a DLTensor> {
        let v = self.raw.value;
        // SAFETY: the union field read is the active one for these type indices, and the view's
        // invariant keeps the pointee live for `'a`.
        unsafe {
            match self.raw.type_index {
                TypeIndex::DL_TENSOR_PTR if !v.v_ptr.is_null() => {
                    Some(&*v.v_ptr.cast::<DLTensor>())
                }
                TypeIndex::TENSOR if !v.v_obj.is_null() => {
                    Some(&*ffi::tensor_object_dltensor(v.v_obj))
                }
                _ => None,
            }
        }
    }

    /// A short description of the held type for error messages, e.g. `float` or `ffi.Tensor`.
    pub fn type_name(&self) -> String {
        self.raw.type_index.to_string()
    }

    /// Converts to an owned value (adds a reference to objects, copies raw C strings).
    pub fn to_owned(&self) -> Any {
        let raw = self.raw;
        match raw.type_index {
            TypeIndex::RAW_STR | TypeIndex::BYTE_ARRAY_PTR => match self.value() {
                Value::Str(s) => Any::from(s),
                Value::Bytes(b) => Any::bytes(b),
                _ => Any::none(),
            },
            // SAFETY: the active field of an object value is its pointer.
            t if t.is_object() && !unsafe { raw.value.v_obj }.is_null() => {
                // SAFETY: the view's invariant keeps the object live; we add the reference the
                // new owner will give back.
                unsafe { ffi::object_inc_ref(raw.value.v_obj) };
                Any { raw }
            }
            _ => Any { raw },
        }
    }

    /// The Rust value of a [`Any::rust_object`] of type `T`, borrowed for `'a`.
    pub fn downcast_ref<T: 'static>(&self) -> Option<&'a T> {
        if self.raw.type_index != TypeIndex::KILN_RUST_OBJECT {
            return None;
        }
        // SAFETY: the active field of an object value is its pointer.
        let obj = unsafe { self.raw.value.v_obj };
        if obj.is_null() {
            return None;
        }
        // SAFETY: objects of this index are created only by `Any::rust_object`, whose layout is
        // `KilnObject<(), Box<dyn Any + Send + Sync>>`; the view keeps the object live for `'a`.
        let boxed = unsafe { ffi::rust_object_payload(obj) };
        boxed.downcast_ref::<T>()
    }

    /// Converts to `T`, with an error naming the expected and the found type.
    pub fn get<T: FromAny<'a>>(self) -> Result<T, ConversionError> {
        T::from_any(self)
    }
}

impl fmt::Debug for AnyView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.value())
    }
}

impl Any {
    /// `None`.
    pub fn none() -> Self {
        Self {
            raw: TVMFFIAny::NONE,
        }
    }

    /// Takes ownership of a raw C value (e.g. a foreign function's result).
    ///
    /// # Safety
    /// - `raw` is valid for its type index, and if it holds an object the caller gives up one
    ///   strong reference to it.
    /// - Raw C strings and byte-array pointers must stay valid until this call returns (they are
    ///   copied into owned objects).
    pub unsafe fn from_raw(raw: TVMFFIAny) -> Self {
        match raw.type_index {
            // Never keep a borrowed string inside an owned value: copy it.
            TypeIndex::RAW_STR | TypeIndex::BYTE_ARRAY_PTR => {
                // SAFETY: the caller guarantees validity for the duration of this call.
                unsafe { AnyView::from_raw(raw) }.to_owned()
            }
            _ => Self { raw },
        }
    }

    /// Gives up ownership, returning the raw C value (the caller now owns any object reference).
    pub fn into_raw(self) -> TVMFFIAny {
        let raw = self.raw;
        std::mem::forget(self);
        raw
    }

    /// Borrows as a view.
    pub fn view(&self) -> AnyView<'_> {
        AnyView {
            raw: self.raw,
            _borrow: PhantomData,
        }
    }

    /// Views a slice of owned values as a slice of views, without copying.
    pub fn as_views(values: &[Any]) -> &[AnyView<'_>] {
        // SAFETY: both types are `repr(transparent)` over `TVMFFIAny`; the views borrow `values`.
        unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), values.len()) }
    }

    /// The raw C value (still owned by `self`).
    pub fn as_raw(&self) -> &TVMFFIAny {
        &self.raw
    }

    /// The type index.
    pub fn type_index(&self) -> TypeIndex {
        self.raw.type_index
    }

    /// What the value holds.
    pub fn value(&self) -> Value<'_> {
        value_of(&self.raw)
    }

    /// Whether this is `None`.
    pub fn is_none(&self) -> bool {
        self.raw.type_index == TypeIndex::NONE
    }

    /// A bytes value.
    pub fn bytes(b: &[u8]) -> Self {
        if b.len() <= 7 {
            Self {
                raw: small(TypeIndex::SMALL_BYTES, b),
            }
        } else {
            let obj = ffi::new_bytes_object(TypeIndex::BYTES, b.into());
            Self::object(TypeIndex::BYTES, obj)
        }
    }

    /// An opaque pointer value (kiln never dereferences it).
    pub fn opaque_ptr(p: *mut c_void) -> Self {
        Self {
            raw: scalar(TypeIndex::OPAQUE_PTR, TVMFFIAnyValue { v_ptr: p }),
        }
    }

    /// A tensor object (type index 70) that owns a copy of `tensor`'s shape and strides and keeps
    /// `owner` (whatever keeps the data alive) until the last reference is dropped.
    ///
    /// # Safety
    /// - `tensor.shape` (and `tensor.strides` unless NULL) point to `tensor.ndim` values.
    /// - `tensor.data` stays valid while `owner` lives.
    pub unsafe fn tensor_object<O: Send + Sync + 'static>(tensor: &DLTensor, owner: O) -> Self {
        let ndim = tensor.ndim.max(0) as usize;
        // SAFETY: the caller guarantees `ndim` readable extents and strides.
        let mut shape: Box<[i64]> = unsafe { copy_dims(tensor.shape, ndim) };
        // SAFETY: as above.
        let mut strides: Option<Box<[i64]>> =
            (!tensor.strides.is_null()).then(|| unsafe { copy_dims(tensor.strides, ndim) });
        let mut t = *tensor;
        t.shape = shape.as_mut_ptr();
        t.strides = strides
            .as_mut()
            .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
        let obj = ffi::new_kiln_object(TypeIndex::TENSOR, t, (shape, strides, owner));
        Self::object(TypeIndex::TENSOR, obj)
    }

    /// A kiln object holding a Rust value, for passing Rust data through packed functions
    /// (read it back with [`AnyView::downcast_ref`]).
    pub fn rust_object<T: Send + Sync + 'static>(value: T) -> Self {
        let boxed: Box<dyn std::any::Any + Send + Sync> = Box::new(value);
        let obj = ffi::new_kiln_object(TypeIndex::KILN_RUST_OBJECT, (), boxed);
        Self::object(TypeIndex::KILN_RUST_OBJECT, obj)
    }

    /// The Rust value of a [`Any::rust_object`] of type `T`.
    pub fn downcast_ref<T: 'static>(&self) -> Option<&T> {
        self.view().downcast_ref::<T>()
    }

    fn object(type_index: TypeIndex, obj: *mut TVMFFIObject) -> Self {
        Self {
            raw: scalar(type_index, TVMFFIAnyValue { v_obj: obj }),
        }
    }

    /// Converts to `T`, with an error naming the expected and the found type.
    pub fn get<'a, T: FromAny<'a>>(&'a self) -> Result<T, ConversionError> {
        T::from_any(self.view())
    }
}

/// # Safety
/// - `p` points to `n` readable `i64`s (or `n` is 0).
unsafe fn copy_dims(p: *const i64, n: usize) -> Box<[i64]> {
    if n == 0 || p.is_null() {
        return Box::new([]);
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(p, n) }.into()
}

impl Drop for Any {
    fn drop(&mut self) {
        // SAFETY: reading the pointer field of an object value is reading the active field.
        if self.raw.type_index.is_object() && !unsafe { self.raw.value.v_obj }.is_null() {
            // SAFETY: an owned `Any` holding an object owns one strong reference (invariant).
            unsafe { ffi::object_dec_ref(self.raw.value.v_obj) };
        }
    }
}

impl Clone for Any {
    fn clone(&self) -> Self {
        self.view().to_owned()
    }
}

impl Default for Any {
    fn default() -> Self {
        Self::none()
    }
}

impl fmt::Debug for Any {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.value())
    }
}

impl PartialEq for Any {
    /// Values are equal when they hold the same value; objects other than strings and bytes
    /// compare by identity.
    fn eq(&self, other: &Self) -> bool {
        match (self.value(), other.value()) {
            (Value::Object(_), Value::Object(_)) | (Value::Tensor(_), Value::Tensor(_)) => {
                // SAFETY: both are objects (checked by the match); comparing pointers reads the
                // active union field.
                unsafe { self.raw.value.v_obj == other.raw.value.v_obj }
            }
            (a, b) => a == b,
        }
    }
}

macro_rules! any_from_scalar {
    ($($t:ty => $ti:ident, $field:ident, $conv:expr;)*) => {$(
        impl From<$t> for Any {
            fn from(v: $t) -> Self {
                #[allow(clippy::redundant_closure_call)]
                let payload = ($conv)(v);
                Self { raw: scalar(TypeIndex::$ti, TVMFFIAnyValue { $field: payload }) }
            }
        }
        impl From<$t> for AnyView<'_> {
            fn from(v: $t) -> Self {
                Any::from(v).view_static()
            }
        }
    )*};
}

impl Any {
    /// A view of a value that holds no reference (scalars), which may outlive `self`.
    fn view_static<'b>(self) -> AnyView<'b> {
        debug_assert!(!self.raw.type_index.is_object());
        AnyView {
            raw: self.into_raw(),
            _borrow: PhantomData,
        }
    }
}

any_from_scalar! {
    i64 => INT, v_int64, |v| v;
    i32 => INT, v_int64, i64::from;
    u32 => INT, v_int64, i64::from;
    bool => BOOL, v_int64, i64::from;
    f64 => FLOAT, v_float64, |v| v;
    f32 => FLOAT, v_float64, f64::from;
    DLDataType => DATA_TYPE, v_dtype, |v| v;
    DLDevice => DEVICE, v_device, |v| v;
}

impl From<()> for Any {
    fn from(_: ()) -> Self {
        Self::none()
    }
}

impl From<&str> for Any {
    fn from(s: &str) -> Self {
        if s.len() <= 7 {
            Self {
                raw: small(TypeIndex::SMALL_STR, s.as_bytes()),
            }
        } else {
            let obj = ffi::new_bytes_object(TypeIndex::STR, s.as_bytes().into());
            Self::object(TypeIndex::STR, obj)
        }
    }
}

impl From<String> for Any {
    fn from(s: String) -> Self {
        Self::from(s.as_str())
    }
}

impl<'a> From<&'a Any> for AnyView<'a> {
    fn from(a: &'a Any) -> Self {
        a.view()
    }
}

impl<'a> From<&'a DLTensor> for AnyView<'a> {
    fn from(t: &'a DLTensor) -> Self {
        AnyView::dltensor(t)
    }
}

/// Conversion from a packed-function value, used by typed calls and typed closures.
pub trait FromAny<'a>: Sized {
    /// The type's name in error messages.
    const TYPE_NAME: &'static str;
    /// Converts, or says what was expected and what was found.
    fn from_any(v: AnyView<'a>) -> Result<Self, ConversionError>;
}

fn mismatch(expected: &'static str, v: &AnyView<'_>) -> ConversionError {
    ConversionError {
        expected,
        found: v.type_name(),
    }
}

macro_rules! from_any {
    ($t:ty, $name:expr, |$v:ident| $body:expr) => {
        impl<'a> FromAny<'a> for $t {
            const TYPE_NAME: &'static str = $name;
            fn from_any($v: AnyView<'a>) -> Result<Self, ConversionError> {
                #[allow(clippy::redundant_closure_call)]
                let r: Option<Self> = $body;
                r.ok_or_else(|| mismatch($name, &$v))
            }
        }
    };
}

// tvm-ffi's coercions: int accepts bool, bool accepts int, float accepts int.
from_any!(i64, "int", |v| match v.value() {
    Value::Int(i) => Some(i),
    Value::Bool(b) => Some(i64::from(b)),
    _ => None,
});
from_any!(i32, "int", |v| match v.value() {
    Value::Int(i) => i32::try_from(i).ok(),
    Value::Bool(b) => Some(i32::from(b)),
    _ => None,
});
from_any!(bool, "bool", |v| match v.value() {
    Value::Bool(b) => Some(b),
    Value::Int(i) => Some(i != 0),
    _ => None,
});
from_any!(f64, "float", |v| match v.value() {
    Value::Float(f) => Some(f),
    Value::Int(i) => Some(i as f64),
    _ => None,
});
from_any!(f32, "float", |v| match v.value() {
    Value::Float(f) => Some(f as f32),
    Value::Int(i) => Some(i as f32),
    _ => None,
});
from_any!(String, "str", |v| match v.value() {
    Value::Str(s) => Some(s.to_owned()),
    _ => None,
});
from_any!(DLDevice, "Device", |v| match v.value() {
    Value::Device(d) => Some(d),
    _ => None,
});
from_any!(DLDataType, "DataType", |v| match v.value() {
    Value::DataType(d) => Some(d),
    _ => None,
});
from_any!(&'a DLTensor, "Tensor", |v| v.as_dltensor());
from_any!((), "None", |v| match v.value() {
    Value::None => Some(()),
    _ => None,
});

impl<'a> FromAny<'a> for Any {
    const TYPE_NAME: &'static str = "Any";
    fn from_any(v: AnyView<'a>) -> Result<Self, ConversionError> {
        Ok(v.to_owned())
    }
}

impl<'a> FromAny<'a> for AnyView<'a> {
    const TYPE_NAME: &'static str = "Any";
    fn from_any(v: AnyView<'a>) -> Result<Self, ConversionError> {
        Ok(v)
    }
}

impl<'a, T: FromAny<'a>> FromAny<'a> for Option<T> {
    const TYPE_NAME: &'static str = T::TYPE_NAME;
    fn from_any(v: AnyView<'a>) -> Result<Self, ConversionError> {
        match v.value() {
            Value::None => Ok(None),
            _ => T::from_any(v).map(Some),
        }
    }
}

impl TryFrom<Any> for i64 {
    type Error = PackedFuncError;
    fn try_from(v: Any) -> Result<Self, Self::Error> {
        Ok(v.get::<i64>()?)
    }
}

impl TryFrom<Any> for f64 {
    type Error = PackedFuncError;
    fn try_from(v: Any) -> Result<Self, Self::Error> {
        Ok(v.get::<f64>()?)
    }
}

impl TryFrom<Any> for bool {
    type Error = PackedFuncError;
    fn try_from(v: Any) -> Result<Self, Self::Error> {
        Ok(v.get::<bool>()?)
    }
}

impl TryFrom<Any> for String {
    type Error = PackedFuncError;
    fn try_from(v: Any) -> Result<Self, Self::Error> {
        Ok(v.get::<String>()?)
    }
}
