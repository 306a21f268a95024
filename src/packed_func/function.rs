//! [`PackedFunc`]: a type-erased function callable from Rust and from C.
//!
//! A `PackedFunc` is either a Rust closure over [`AnyView`] arguments or a foreign function of the
//! tvm-ffi safe-call ABI (`int f(void* self, const TVMFFIAny* args, int n, TVMFFIAny* ret)`) with
//! its `self` handle. Both are called the same way; both can be handed to C as a safe-call pair
//! ([`PackedFunc::safe_call`]): a Rust closure goes through a trampoline that catches panics and
//! turns them, like any error, into a raised `RuntimeError` and a return code of -1 — nothing ever
//! unwinds into C.
//!
//! Calling a foreign function costs one indirect call plus a check of the return code: the
//! argument slice is passed to C as is, because [`AnyView`] is laid out as `TVMFFIAny`.

use std::any::Any as StdAny;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::any::{Any, AnyView, FromAny};
use super::error::{PackedFuncError, PackedFuncResult};
use super::ffi::{self, DLDataType, DLDevice, TVMFFIAny, TVMFFISafeCallType};

type RustFn = dyn Fn(&[AnyView<'_>]) -> PackedFuncResult<Any> + Send + Sync;

enum Imp {
    Rust(Box<RustFn>),
    Foreign {
        call: TVMFFISafeCallType,
        /// The `self` handle passed back to `call`; kiln never dereferences it.
        handle: *mut c_void,
        /// Whatever keeps `call` and `handle` valid (e.g. the loaded library).
        _keep_alive: Option<Arc<dyn StdAny + Send + Sync>>,
    },
}

struct Inner {
    name: String,
    imp: Imp,
}

// SAFETY: the only non-Send/Sync field is the foreign `handle`, an opaque value that the foreign
// function's contract (`from_safe_call`) declares callable from any thread.
unsafe impl Send for Inner {}
// SAFETY: as above; `Inner` is immutable after construction.
unsafe impl Sync for Inner {}

/// A type-erased, reference-counted function on the tvm-ffi calling convention.
#[derive(Clone)]
pub struct PackedFunc(Arc<Inner>);

impl std::fmt::Debug for PackedFunc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.0.imp {
            Imp::Rust(_) => "rust",
            Imp::Foreign { .. } => "foreign",
        };
        write!(f, "PackedFunc({:?}, {kind})", self.0.name)
    }
}

impl PackedFunc {
    /// Wraps a Rust closure that takes untyped arguments. `name` appears in error messages.
    ///
    /// ```
    /// use kiln::packed_func::{Any, PackedFunc};
    /// let sum = PackedFunc::new("sum", |args| {
    ///     let mut total = 0i64;
    ///     for a in args {
    ///         total += a.get::<i64>()?;
    ///     }
    ///     Ok(Any::from(total))
    /// });
    /// let r: i64 = sum.call_typed((1i64, 2i64, 3i64)).unwrap();
    /// assert_eq!(r, 6);
    /// ```
    pub fn new<F>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&[AnyView<'_>]) -> PackedFuncResult<Any> + Send + Sync + 'static,
    {
        Self(Arc::new(Inner {
            name: name.into(),
            imp: Imp::Rust(Box::new(f)),
        }))
    }

    /// Wraps a Rust closure with typed arguments; calls with the wrong count or types fail with
    /// [`PackedFuncError::ArgCount`] / [`PackedFuncError::ArgType`].
    ///
    /// ```
    /// use kiln::packed_func::PackedFunc;
    /// let add = PackedFunc::from_typed("add", |a: i64, b: f64| a as f64 + b);
    /// assert_eq!(add.call_typed::<_, f64>((1i64, 0.5f64)).unwrap(), 1.5);
    /// assert!(add.call_typed::<_, f64>((1i64,)).is_err());
    /// ```
    pub fn from_typed<Args, F: TypedFn<Args>>(name: impl Into<String>, f: F) -> Self {
        let name = name.into();
        let n2 = name.clone();
        Self::new(name, move |args| f.invoke(&n2, args))
    }

    /// Wraps a foreign safe-call function and its `self` handle.
    ///
    /// # Safety
    /// - `call` follows the tvm-ffi safe-call contract: it reads `num_args` valid arguments, writes
    ///   a valid owned value into `*ret` when it returns 0, and may be called from any thread with
    ///   `handle`.
    /// - `call` and `handle` stay valid while `keep_alive` (or, without it, the program) lives.
    pub unsafe fn from_safe_call(
        name: impl Into<String>,
        call: TVMFFISafeCallType,
        handle: *mut c_void,
        keep_alive: Option<Arc<dyn StdAny + Send + Sync>>,
    ) -> Self {
        Self(Arc::new(Inner {
            name: name.into(),
            imp: Imp::Foreign {
                call,
                handle,
                _keep_alive: keep_alive,
            },
        }))
    }

    /// The name given at construction.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Whether two handles are the same function.
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Calls with borrowed arguments.
    ///
    /// # Errors
    /// Whatever the function raises ([`PackedFuncError::Raised`] keeps a foreign error's kind); a
    /// panic of a Rust closure ([`PackedFuncError::Panicked`]); a foreign function that fails
    /// without raising ([`PackedFuncError::ReturnedWithoutError`]).
    #[inline]
    pub fn call(&self, args: &[AnyView<'_>]) -> PackedFuncResult<Any> {
        match &self.0.imp {
            Imp::Rust(f) => match catch_unwind(AssertUnwindSafe(|| f(args))) {
                Ok(r) => r,
                Err(p) => Err(PackedFuncError::Panicked {
                    name: self.0.name.clone(),
                    message: crate::util::panic_message(&*p),
                }),
            },
            Imp::Foreign { call, handle, .. } => {
                let n = i32::try_from(args.len()).map_err(|_| PackedFuncError::BadArgArray {
                    name: self.0.name.clone(),
                    num_args: i32::MAX,
                })?;
                let mut ret = TVMFFIAny::NONE;
                // SAFETY: `AnyView` is `repr(transparent)` over `TVMFFIAny`, so the slice is a valid
                // argument array of `n` values for the duration of the call; `from_safe_call`'s
                // contract covers the function and its handle.
                let code = unsafe { call(*handle, args.as_ptr().cast(), n, &mut ret) };
                if code == 0 {
                    // SAFETY: on success the callee wrote an owned, valid value.
                    Ok(unsafe { Any::from_raw(ret) })
                } else {
                    Err(self.take_error(code))
                }
            }
        }
    }

    #[cold]
    fn take_error(&self, code: i32) -> PackedFuncError {
        match ffi::take_raised() {
            Some((kind, message)) => PackedFuncError::Raised { kind, message },
            None => PackedFuncError::ReturnedWithoutError {
                name: self.0.name.clone(),
                code,
            },
        }
    }

    /// Calls with owned arguments.
    pub fn call_any(&self, args: &[Any]) -> PackedFuncResult<Any> {
        self.call(Any::as_views(args))
    }

    /// Calls with a tuple of arguments and converts the result.
    ///
    /// # Errors
    /// As [`PackedFunc::call`], plus [`PackedFuncError::Conversion`] when the result is not an `R`.
    pub fn call_typed<A: IntoArgs, R: for<'r> FromAny<'r>>(&self, args: A) -> PackedFuncResult<R> {
        let ret = args.with_views(|views| self.call(views))?;
        Ok(R::from_any(ret.view())?)
    }

    /// The function as a C safe-call pair, valid while `self` (or a clone) lives.
    ///
    /// For a Rust closure this is kiln's trampoline, which catches panics and raises errors
    /// through kiln's thread-local error slot (read it back with `ffi::take_raised`, or let
    /// kiln's own caller do so).
    pub fn safe_call(&self) -> (TVMFFISafeCallType, *mut c_void) {
        match &self.0.imp {
            Imp::Rust(_) => (rust_trampoline, Arc::as_ptr(&self.0).cast_mut().cast()),
            Imp::Foreign { call, handle, .. } => (*call, *handle),
        }
    }
}

/// The C entry of every Rust closure: `handle` is the closure's `Inner`.
unsafe extern "C" fn rust_trampoline(
    handle: *mut c_void,
    args: *const TVMFFIAny,
    num_args: i32,
    ret: *mut TVMFFIAny,
) -> i32 {
    // SAFETY: `handle` came from `PackedFunc::safe_call` on a Rust closure, whose contract keeps
    // the `Inner` alive for as long as C may call it.
    let inner = unsafe { &*handle.cast::<Inner>() };
    let fail = |e: PackedFuncError| {
        ffi::set_raised(e.kind(), &e.message());
        -1
    };
    if num_args < 0 || (args.is_null() && num_args > 0) || ret.is_null() {
        return fail(PackedFuncError::BadArgArray {
            name: inner.name.clone(),
            num_args,
        });
    }
    // SAFETY: the C caller passes `num_args` valid values (safe-call contract); NULL with 0 is
    // handled by `slice_from_raw`.
    let views = unsafe { AnyView::slice_from_raw(args, num_args as usize) };
    let f = match &inner.imp {
        Imp::Rust(f) => f,
        // `safe_call` only hands out the trampoline for Rust closures.
        Imp::Foreign { .. } => unreachable!("trampoline called on a foreign function"),
    };
    match catch_unwind(AssertUnwindSafe(|| f(views))) {
        Ok(Ok(value)) => {
            // SAFETY: `ret` is non-NULL (checked) and writable (safe-call contract); ownership
            // of any object in `value` passes to the caller.
            unsafe { ret.write(value.into_raw()) };
            0
        }
        Ok(Err(e)) => fail(e),
        Err(p) => fail(PackedFuncError::Panicked {
            name: inner.name.clone(),
            message: crate::util::panic_message(&*p),
        }),
    }
}

/// One argument of [`PackedFunc::call_typed`]: a value that is viewed (scalars, tensors, `&Any`)
/// or converted into an owned [`Any`] for the duration of the call (strings).
pub enum Arg<'a> {
    /// Passed as is.
    View(AnyView<'a>),
    /// Owned by the call.
    Owned(Any),
}

impl Arg<'_> {
    fn view(&self) -> AnyView<'_> {
        match self {
            Arg::View(v) => *v,
            Arg::Owned(a) => a.view(),
        }
    }
}

macro_rules! arg_view {
    ($($t:ty),*) => {$(
        impl<'a> From<$t> for Arg<'a> {
            fn from(v: $t) -> Self { Arg::View(AnyView::from(v)) }
        }
    )*};
}
arg_view!(
    i64,
    i32,
    u32,
    bool,
    f64,
    f32,
    DLDataType,
    DLDevice,
    &'a Any,
    &'a ffi::DLTensor
);

impl<'a> From<AnyView<'a>> for Arg<'a> {
    fn from(v: AnyView<'a>) -> Self {
        Arg::View(v)
    }
}

impl From<&str> for Arg<'_> {
    fn from(v: &str) -> Self {
        Arg::Owned(Any::from(v))
    }
}

impl From<String> for Arg<'_> {
    fn from(v: String) -> Self {
        Arg::Owned(Any::from(v))
    }
}

impl From<Any> for Arg<'_> {
    fn from(v: Any) -> Self {
        Arg::Owned(v)
    }
}

/// A tuple of arguments for [`PackedFunc::call_typed`] (up to 6 elements, each `Into<Arg>`).
pub trait IntoArgs {
    /// Converts the tuple and runs `f` on the argument views.
    fn with_views<R>(self, f: impl FnOnce(&[AnyView<'_>]) -> R) -> R;
}

/// A closure usable with [`PackedFunc::from_typed`]: `Fn(A, B, ...) -> R` for up to 6 arguments
/// of owned types (`i64`, `f64`, `bool`, `String`, [`Any`], devices, data types, `Option`s).
pub trait TypedFn<Args>: Send + Sync + 'static {
    /// Checks and converts the arguments, calls, and converts the result.
    fn invoke(&self, name: &str, args: &[AnyView<'_>]) -> PackedFuncResult<Any>;
}

/// A return value of a typed closure: a value convertible into [`Any`], or a `Result` of one.
pub trait IntoReturn {
    /// Converts.
    fn into_return(self) -> PackedFuncResult<Any>;
}

macro_rules! into_return {
    ($($t:ty),*) => {$(
        impl IntoReturn for $t {
            fn into_return(self) -> PackedFuncResult<Any> { Ok(Any::from(self)) }
        }
    )*};
}
into_return!(
    i64,
    i32,
    u32,
    bool,
    f64,
    f32,
    String,
    &str,
    (),
    DLDataType,
    DLDevice
);

impl IntoReturn for Any {
    fn into_return(self) -> PackedFuncResult<Any> {
        Ok(self)
    }
}

impl<T: IntoReturn, E: Into<PackedFuncError>> IntoReturn for Result<T, E> {
    fn into_return(self) -> PackedFuncResult<Any> {
        self.map_err(Into::into)?.into_return()
    }
}

macro_rules! arity {
    ($($A:ident $i:tt),*) => {
        impl<'a, $($A: Into<Arg<'a>>,)*> IntoArgs for ($($A,)*) {
            #[allow(non_snake_case, clippy::unused_unit, unused_variables)]
            fn with_views<R>(self, f: impl FnOnce(&[AnyView<'_>]) -> R) -> R {
                let args: [Arg<'a>; arity!(@count $($A)*)] = [$(self.$i.into(),)*];
                let views: [AnyView<'_>; arity!(@count $($A)*)] = [$(args[$i].view(),)*];
                f(&views)
            }
        }

        impl<Func, R, $($A,)*> TypedFn<($($A,)*)> for Func
        where
            Func: Fn($($A),*) -> R + Send + Sync + 'static,
            R: IntoReturn,
            $($A: for<'a> FromAny<'a>,)*
        {
            #[allow(non_snake_case, unused_variables)]
            fn invoke(&self, name: &str, args: &[AnyView<'_>]) -> PackedFuncResult<Any> {
                let expected = arity!(@count $($A)*);
                if args.len() != expected {
                    return Err(PackedFuncError::ArgCount { name: name.to_owned(), expected, found: args.len() });
                }
                $(
                    let $A = $A::from_any(args[$i]).map_err(|e| PackedFuncError::ArgType {
                        name: name.to_owned(),
                        index: $i,
                        expected: e.expected,
                        found: e.found,
                    })?;
                )*
                self($($A),*).into_return()
            }
        }
    };
    (@count) => { 0 };
    (@count $h:ident $($t:ident)*) => { 1 + arity!(@count $($t)*) };
}

arity!();
arity!(A0 0);
arity!(A0 0, A1 1);
arity!(A0 0, A1 1, A2 2);
arity!(A0 0, A1 1, A2 2, A3 3);
arity!(A0 0, A1 1, A2 2, A3 3, A4 4);
arity!(A0 0, A1 1, A2 2, A3 3, A4 4, A5 5);
