//! The C side: each function of this library as a tvm-ffi safe-call symbol
//! (`__tvm_ffi_<name>`), and the context slot through which errors reach the caller.
//!
//! A library loaded by `tvm_ffi.load_module` raises an error by calling
//! `TVMFFIErrorSetRaisedFromCStr(kind, message)` and returning -1; the loader writes that
//! function's address into the exported variable `__TVMFFIErrorSetRaisedFromCStr` (a *context
//! slot*) right after `dlopen`. kiln's own loader does the same with kiln's error slot, so the
//! library works under either host. Arguments are read with kiln's `AnyView`, results are
//! kiln-made tvm-ffi objects (strings) whose deleter travels in their header, as the ABI says.

use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use kiln::packed_func::{AnyView, TVMFFIAny};

use crate::Raised;

/// `TVMFFIErrorSetRaisedFromCStr`'s type.
type SetRaised = unsafe extern "C" fn(*const c_char, *const c_char);

/// The context slot the loader fills with its `TVMFFIErrorSetRaisedFromCStr`.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut __TVMFFIErrorSetRaisedFromCStr: Option<SetRaised> = None;

/// `TVMFFIErrorSetRaisedFromCStr` of a `libtvm_ffi` loaded into the process's global scope
/// (Python's `tvm_ffi` loads it so, and fills no context slot of the libraries it loads).
fn global_set_raised() -> Option<SetRaised> {
    static FOUND: OnceLock<Option<SetRaised>> = OnceLock::new();
    *FOUND.get_or_init(|| global_symbol::<SetRaised>(b"TVMFFIErrorSetRaisedFromCStr\0"))
}

/// `TVMFFIErrorSetRaisedFromCStrParts`'s type.
type SetRaisedParts = unsafe extern "C" fn(*const c_char, *const *const c_char, i32);
/// `TVMFFIEnvModRegisterSystemLibSymbol`'s type.
type RegisterSymbol = unsafe extern "C" fn(*const c_char, *mut c_void) -> i32;

/// A C function of the process's global scope (tvm-ffi's, loaded by Python's `tvm_ffi`).
fn global_symbol<T: Copy>(name: &[u8]) -> Option<T> {
    let this = libloading::os::unix::Library::this();
    // SAFETY: each caller names a tvm-ffi C function and asks for exactly its type.
    unsafe { this.get::<T>(name) }.ok().map(|s| *s)
}

/// The code kiln compiles in this process (the JIT) raises errors through the context slots
/// of the error functions; in this library the caller is tvm-ffi, so the slots get tvm-ffi's
/// functions instead of kiln's own thread-local error (which tvm-ffi never reads). Idempotent.
pub(crate) fn route_errors_to_tvm_ffi() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        use kiln::packed_func::context::register_context_symbol;
        if let Some(f) = global_set_raised() {
            register_context_symbol("__TVMFFIErrorSetRaisedFromCStr", f as usize);
        }
        if let Some(f) = global_symbol::<SetRaisedParts>(b"TVMFFIErrorSetRaisedFromCStrParts\0") {
            register_context_symbol("__TVMFFIErrorSetRaisedFromCStrParts", f as usize);
        }
    });
}

/// Registers a packed function compiled by kiln (a C safe-call function that takes a NULL
/// `self`) as the tvm-ffi system-library symbol `name`.
pub(crate) fn register_system_lib_symbol(
    name: &str,
    f: &kiln::packed_func::PackedFunc,
) -> crate::Result<()> {
    static REGISTER: OnceLock<Option<RegisterSymbol>> = OnceLock::new();
    let found = REGISTER
        .get_or_init(|| global_symbol::<RegisterSymbol>(b"TVMFFIEnvModRegisterSystemLibSymbol\0"));
    let Some(register) = *found else {
        return Err(Raised::new(
            "RuntimeError",
            "kiln.jit: tvm-ffi's TVMFFIEnvModRegisterSystemLibSymbol is not in this process \
             (load kiln through `tvm_ffi`)",
        ));
    };
    let (call, handle) = f.safe_call();
    if !handle.is_null() {
        return Err(Raised::new(
            "RuntimeError",
            format!("kiln.jit: `{name}` is not a plain C function (it needs a handle)"),
        ));
    }
    let cname = CString::new(name)
        .map_err(|_| Raised::new("ValueError", format!("kiln.jit: `{name}` holds a NUL")))?;
    // SAFETY: `cname` is NUL-terminated and lives across the call (tvm-ffi copies it); the
    // symbol is a safe-call function whose code is kept for the life of the process
    // (`keep_forever`).
    let rc = unsafe { register(cname.as_ptr(), call as *mut c_void) };
    if rc != 0 {
        return Err(Raised::new(
            "RuntimeError",
            format!("kiln.jit: tvm-ffi refused to register `{name}` ({rc})"),
        ));
    }
    Ok(())
}

/// Keeps compiled code alive for the rest of the process: the system-library symbols that
/// point into it cannot be unregistered.
pub(crate) fn keep_forever(m: kiln::codegen::ModuleRef) {
    static KEPT: std::sync::Mutex<Vec<kiln::codegen::ModuleRef>> =
        std::sync::Mutex::new(Vec::new());
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).push(m);
}

/// A kiln tensor as a tvm-ffi Tensor object that owns it (the allocation is freed when the
/// last reference to the object is dropped).
pub(crate) fn tensor_object(t: kiln::device_api::Tensor) -> kiln::packed_func::Any {
    let dl = *t.as_dltensor();
    // SAFETY: `dl`'s shape and strides point into `t`'s own storage, which moves with `t` into
    // the object (a heap allocation does not move) and the object copies them anyway; its data
    // is `t`'s allocation, which lives as long as the object owns `t`.
    unsafe { kiln::packed_func::Any::tensor_object(&dl, t) }
}

/// Copies `src` into `dst` (any devices, same shape and dtype: kiln's backends check) and waits
/// on both devices.
pub(crate) fn copy_tensor(
    src: &kiln::packed_func::DLTensor,
    dst: &kiln::packed_func::DLTensor,
) -> kiln::device_api::DeviceResult<()> {
    use kiln::device_api::{copy_data_from_to, get, Device, DeviceError, StreamHandle};
    if src.ndim != dst.ndim || src.dtype != dst.dtype {
        return Err(DeviceError::CopyMismatch {
            from: format!("a {}-d {} tensor", src.ndim, src.dtype),
            to: format!("a {}-d {} tensor", dst.ndim, dst.dtype),
            reason: "the rank and the dtype must be equal".into(),
        });
    }
    // SAFETY: both are tensor arguments of the current tvm-ffi call (valid for the call, their
    // shapes `ndim` long); kiln's device backends check a device tensor's memory against their
    // own allocations (a foreign handle is an error), and a host tensor is the caller's array,
    // which the call borrows.
    unsafe { copy_data_from_to(src, dst, StreamHandle::DEFAULT)? };
    for d in [Device::from(src.device), Device::from(dst.device)] {
        get(d.device_type)?.sync_stream(d, StreamHandle::DEFAULT)?;
    }
    Ok(())
}

/// Raises `e` through the host's error slot, else through a global `libtvm_ffi`, else through
/// kiln's thread-local slot (kiln's own loader fills the context slot, so that is the rare
/// case of a host that provides neither).
fn raise(e: &Raised) {
    // SAFETY: the slot is written once by the loader, right after `dlopen` and before any
    // function of this library can be called; reading a copy of it races with nothing.
    let slot = unsafe { std::ptr::addr_of!(__TVMFFIErrorSetRaisedFromCStr).read_volatile() };
    match slot.or_else(global_set_raised) {
        Some(set) => {
            let kind = CString::new(e.kind).unwrap_or_default();
            let msg = CString::new(e.message.replace('\0', "\\0")).unwrap_or_default();
            // SAFETY: both are NUL-terminated strings that live across the call, as the
            // function's contract asks.
            unsafe { set(kind.as_ptr(), msg.as_ptr()) };
        }
        None => kiln::packed_func::ffi::set_raised(e.kind, &e.message),
    }
}

/// Runs `f` on the safe-call arguments and writes its result; -1 after raising on any error,
/// including a panic and a malformed argument array.
///
/// # Safety
/// The safe-call contract: `args` points to `num_args` valid values (or is NULL with 0) that
/// outlive the call, and `ret` is NULL or writable.
unsafe fn call(
    name: &str,
    f: fn(&[AnyView<'_>]) -> crate::Result<kiln::packed_func::Any>,
    args: *const TVMFFIAny,
    num_args: i32,
    ret: *mut TVMFFIAny,
) -> i32 {
    if num_args < 0 || (args.is_null() && num_args > 0) || ret.is_null() {
        raise(&Raised::new(
            "RuntimeError",
            format!("kiln.{name}: malformed call ({num_args} arguments)"),
        ));
        return -1;
    }
    quiet_panics();
    // SAFETY: as the caller guarantees (checked for NULL and a negative count above).
    let views = unsafe { AnyView::slice_from_raw(args, num_args as usize) };
    match catch_unwind(AssertUnwindSafe(|| f(views))) {
        Ok(Ok(value)) => {
            // SAFETY: `ret` is non-NULL and writable (safe-call contract); the object in
            // `value`, if any, passes to the caller.
            unsafe { ret.write(value.into_raw()) };
            0
        }
        Ok(Err(e)) => {
            raise(&e);
            -1
        }
        Err(p) => {
            let what = panic_message(p.as_ref());
            let at = PANIC_AT.with(|l| l.borrow_mut().take()).unwrap_or_default();
            raise(&Raised::new(
                "RuntimeError",
                format!("kiln.{name} panicked at {at} (a kiln bug, please report it): {what}"),
            ));
            -1
        }
    }
}

/// The message a panic carried (`&str` or `String` payloads), else "a panic".
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_owned())
}

thread_local! {
    static PANIC_AT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// A panic inside this library becomes the caller's exception, so the panic hook (this
/// library's own: it has its own copy of std) only keeps where it happened, for the message,
/// instead of printing to the host's stderr.
fn quiet_panics() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        std::panic::set_hook(Box::new(|info| {
            let at = info.location().map(|l| l.to_string());
            PANIC_AT.with(|l| *l.borrow_mut() = at);
        }));
    });
}

macro_rules! export {
    ($($sym:ident => $f:ident),* $(,)?) => {$(
        #[doc = concat!("The safe-call entry of [`crate::", stringify!($f), "`].")]
        ///
        /// # Safety
        /// tvm-ffi's safe-call contract: `args` points to `num_args` valid values (or is NULL
        /// with 0) that outlive the call, and `ret` is NULL or writable.
        #[no_mangle]
        pub unsafe extern "C" fn $sym(
            _handle: *mut c_void,
            args: *const TVMFFIAny,
            num_args: i32,
            ret: *mut TVMFFIAny,
        ) -> i32 {
            // SAFETY: forwarded from our caller.
            unsafe { call(stringify!($f), crate::$f, args, num_args, ret) }
        }
    )*};
}

export! {
    __tvm_ffi_version => version,
    __tvm_ffi_build => build,
    __tvm_ffi_jit => jit,
    __tvm_ffi_target_canonical => target_canonical,
    __tvm_ffi_target_describe => target_describe,
    __tvm_ffi_ir_text => ir_text,
    __tvm_ffi_devices => devices,
    __tvm_ffi_cli => cli,
    __tvm_ffi_wait_optimized => wait_optimized,
    __tvm_ffi_tensor_empty => tensor_empty,
    __tvm_ffi_tensor_copy => tensor_copy,
    __tvm_ffi_tvm_device_table => tvm_device_table,
}
