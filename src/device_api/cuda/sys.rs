//! The CUDA driver API, loaded at run time: the typed table of entry points and the safe (and
//! the few `unsafe`) wrappers the rest of the backend calls.
//!
//! # Loading
//!
//! The library is the file named by the environment variable `KILN_CUDA_DRIVER` when it is set
//! and not empty (kiln's tests point it at a mock driver, `tests/c/mock_cuda.c`), else
//! `libcuda.so.1` (what the NVIDIA driver installs), then `libcuda.so` (the development link).
//! It is opened once per process with `libloading`; a failure is remembered and reported by
//! every later use. Types and constants are written by hand from `cuda.h`: no bindgen, no
//! link-time dependency, no CUDA toolkit. Only the driver API is used, never the runtime
//! (`libcudart`), so no "driver version is insufficient for CUDA runtime version" mismatch can
//! happen.
//!
//! # Versioned symbols
//!
//! `cuda.h` renames many entry points with `#define`s to versioned symbols (the `_v2` forms took
//! 64-bit sizes and pointers); a library opened by name must ask for the versioned symbol
//! itself. The ones kiln resolves: `cuDeviceTotalMem_v2`, `cuDevicePrimaryCtxRelease_v2`,
//! `cuMemAlloc_v2`, `cuMemFree_v2`, `cuMemGetInfo_v2`, `cuMemcpyHtoDAsync_v2`,
//! `cuMemcpyDtoHAsync_v2`, `cuMemcpyDtoDAsync_v2`, `cuStreamDestroy_v2`, `cuEventDestroy_v2`, and
//! `cuEventElapsedTime_v2` when the driver has it (CUDA 12.8 added it and CUDA 13's header
//! renames `cuEventElapsedTime` to it; older drivers only have the unversioned symbol, which
//! takes the same arguments). Unversioned: `cuInit`, `cuDriverGetVersion`,
//! `cuDeviceGet{,Count,Name,Attribute}`, `cuDevicePrimaryCtxRetain`, `cuCtxSetCurrent`,
//! `cuCtxSynchronize`, `cuMemcpyPeerAsync`, `cuMemsetD8Async`, `cuStreamCreate`,
//! `cuStreamSynchronize`, `cuStreamQuery`, `cuStreamWaitEvent`, `cuLaunchHostFunc`,
//! `cuEventCreate`, `cuEventRecord`, `cuEventQuery`, `cuEventSynchronize`, `cuModuleLoadDataEx`,
//! `cuModuleGetFunction`, `cuModuleUnload`, `cuFuncGetAttribute`, `cuFuncSetAttribute`,
//! `cuLaunchKernel`, `cuGetErrorName`, `cuGetErrorString`. Errors name the call as a programmer
//! writes it (`cuMemAlloc`, not `cuMemAlloc_v2`). Every entry point exists in drivers for CUDA
//! 11.0 and newer.
//!
//! # Safety model
//!
//! Handles ([`Context`], [`Stream`], [`Event`], [`Module`], [`Function`]) own or borrow driver
//! objects and are `Send` and `Sync`: the driver API is thread-safe. A [`Function`] keeps its
//! module loaded, so a launch can never use an unloaded function. Calls that only take handles
//! and values are safe. Calls that take device pointers (copies, memset, free) or kernel
//! parameters are `unsafe fn`s: the driver cannot check that a device range belongs to a live
//! allocation, and with unified addressing a wrong "device" address may be host memory. Their
//! callers check every range against the backend's table of live allocations first.
//!
//! Most calls act on the calling thread's *current context*; the caller (`mod.rs`) makes the
//! device's primary context current before each of them.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// `CUresult`: 0 for success, else an error code (`CUDA_ERROR_*`).
pub type CUresult = c_int;
/// `CUdeviceptr`: a device address.
pub type CUdeviceptr = u64;
type CUdevice = c_int;
type Handle = *mut c_void;
type CUcontext = Handle;
type CUstream = Handle;
type CUevent = Handle;
type CUmodule = Handle;
type CUfunction = Handle;
type CUhostFn = unsafe extern "C" fn(*mut c_void);

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CUresult = 0;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_READY` (`cuStreamQuery` / `cuEventQuery`: work still pending).
pub const CUDA_ERROR_NOT_READY: CUresult = 600;

const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
const CU_STREAM_NON_BLOCKING: c_uint = 1;
const CU_EVENT_DEFAULT: c_uint = 0;
const CU_EVENT_DISABLE_TIMING: c_uint = 2;
const CU_JIT_INFO_LOG_BUFFER: c_int = 3;
const CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: c_int = 4;
const CU_JIT_ERROR_LOG_BUFFER: c_int = 5;
const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_int = 6;
/// Bytes of each JIT log buffer.
const JIT_LOG_BYTES: usize = 16 << 10;

/// `CUdevice_attribute` ids kiln asks for (`cuDeviceGetAttribute`).
pub mod device_attr {
    /// `CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    /// `CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X` (Y = 3, Z = 4).
    pub const MAX_BLOCK_DIM_X: i32 = 2;
    /// `CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y`.
    pub const MAX_BLOCK_DIM_Y: i32 = 3;
    /// `CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z`.
    pub const MAX_BLOCK_DIM_Z: i32 = 4;
    /// `CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X` (Y = 6, Z = 7).
    pub const MAX_GRID_DIM_X: i32 = 5;
    /// `CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y`.
    pub const MAX_GRID_DIM_Y: i32 = 6;
    /// `CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z`.
    pub const MAX_GRID_DIM_Z: i32 = 7;
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK` (48 KiB: what a block gets without
    /// opting in).
    pub const MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
    /// `CU_DEVICE_ATTRIBUTE_WARP_SIZE`.
    pub const WARP_SIZE: i32 = 10;
    /// `CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK`.
    pub const MAX_REGISTERS_PER_BLOCK: i32 = 12;
    /// `CU_DEVICE_ATTRIBUTE_CLOCK_RATE` (kHz).
    pub const CLOCK_RATE: i32 = 13;
    /// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    /// `CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE` (bytes).
    pub const L2_CACHE_SIZE: i32 = 38;
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN` (the most a block may opt in to).
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
}

/// `CUfunction_attribute` ids kiln uses (`cuFuncGetAttribute` / `cuFuncSetAttribute`).
pub mod func_attr {
    /// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`: the largest block this function can run with.
    pub const MAX_THREADS_PER_BLOCK: i32 = 0;
    /// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`: its static shared memory.
    pub const SHARED_SIZE_BYTES: i32 = 1;
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`: the dynamic shared memory it may be
    /// launched with (settable; above 48 KiB it must be set before the launch).
    pub const MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
}

/// The name of a `CUresult` (`"CUDA_ERROR_OUT_OF_MEMORY"`), from `cuda.h`; used when the driver
/// cannot name it itself.
pub fn error_name(code: CUresult) -> &'static str {
    match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        5 => "CUDA_ERROR_PROFILER_DISABLED",
        6 => "CUDA_ERROR_PROFILER_NOT_INITIALIZED",
        7 => "CUDA_ERROR_PROFILER_ALREADY_STARTED",
        8 => "CUDA_ERROR_PROFILER_ALREADY_STOPPED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        102 => "CUDA_ERROR_DEVICE_NOT_LICENSED",
        200 => "CUDA_ERROR_INVALID_IMAGE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        202 => "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
        205 => "CUDA_ERROR_MAP_FAILED",
        206 => "CUDA_ERROR_UNMAP_FAILED",
        207 => "CUDA_ERROR_ARRAY_IS_MAPPED",
        208 => "CUDA_ERROR_ALREADY_MAPPED",
        209 => "CUDA_ERROR_NO_BINARY_FOR_GPU",
        210 => "CUDA_ERROR_ALREADY_ACQUIRED",
        211 => "CUDA_ERROR_NOT_MAPPED",
        212 => "CUDA_ERROR_NOT_MAPPED_AS_ARRAY",
        213 => "CUDA_ERROR_NOT_MAPPED_AS_POINTER",
        214 => "CUDA_ERROR_ECC_UNCORRECTABLE",
        215 => "CUDA_ERROR_UNSUPPORTED_LIMIT",
        216 => "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
        217 => "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        218 => "CUDA_ERROR_INVALID_PTX",
        219 => "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
        220 => "CUDA_ERROR_NVLINK_UNCORRECTABLE",
        221 => "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
        222 => "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        223 => "CUDA_ERROR_JIT_COMPILATION_DISABLED",
        224 => "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
        225 => "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
        300 => "CUDA_ERROR_INVALID_SOURCE",
        301 => "CUDA_ERROR_FILE_NOT_FOUND",
        302 => "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
        303 => "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
        304 => "CUDA_ERROR_OPERATING_SYSTEM",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        401 => "CUDA_ERROR_ILLEGAL_STATE",
        402 => "CUDA_ERROR_LOSSY_QUERY",
        500 => "CUDA_ERROR_NOT_FOUND",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        701 => "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        702 => "CUDA_ERROR_LAUNCH_TIMEOUT",
        703 => "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
        704 => "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        705 => "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        708 => "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
        709 => "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        710 => "CUDA_ERROR_ASSERT",
        711 => "CUDA_ERROR_TOO_MANY_PEERS",
        712 => "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        713 => "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        714 => "CUDA_ERROR_HARDWARE_STACK_ERROR",
        715 => "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        716 => "CUDA_ERROR_MISALIGNED_ADDRESS",
        717 => "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        718 => "CUDA_ERROR_INVALID_PC",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        720 => "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
        800 => "CUDA_ERROR_NOT_PERMITTED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        802 => "CUDA_ERROR_SYSTEM_NOT_READY",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        805 => "CUDA_ERROR_MPS_CONNECTION_FAILED",
        806 => "CUDA_ERROR_MPS_RPC_FAILURE",
        807 => "CUDA_ERROR_MPS_SERVER_NOT_READY",
        808 => "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
        809 => "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
        810 => "CUDA_ERROR_MPS_CLIENT_TERMINATED",
        811 => "CUDA_ERROR_CDP_NOT_SUPPORTED",
        812 => "CUDA_ERROR_CDP_VERSION_MISMATCH",
        900 => "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        901 => "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        902 => "CUDA_ERROR_STREAM_CAPTURE_MERGE",
        903 => "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
        904 => "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
        905 => "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
        906 => "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        907 => "CUDA_ERROR_CAPTURED_EVENT",
        908 => "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        909 => "CUDA_ERROR_TIMEOUT",
        910 => "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
        911 => "CUDA_ERROR_EXTERNAL_DEVICE",
        912 => "CUDA_ERROR_INVALID_CLUSTER_SIZE",
        913 => "CUDA_ERROR_FUNCTION_NOT_LOADED",
        914 => "CUDA_ERROR_INVALID_RESOURCE_TYPE",
        915 => "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "an unknown CUDA error code",
    }
}

/// Whether `code` is a *sticky* error: the context is corrupted (a kernel faulted or timed out)
/// and every later call in it fails; only a new process recovers (cuda.h: "the context cannot
/// be used, so it must be destroyed").
pub fn is_sticky(code: CUresult) -> bool {
    matches!(code, 700 | 702 | 710 | 714..=719)
}

/// A failed driver call: which one, its error code, the code's name and the driver's text.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CuError {
    /// The entry point as a programmer writes it (`"cuMemAlloc"`).
    pub call: &'static str,
    /// The `CUresult` it returned.
    pub code: CUresult,
    name: String,
    detail: String,
}

impl CuError {
    /// Whether the error is sticky ([`is_sticky`]).
    pub fn is_sticky(&self) -> bool {
        is_sticky(self.code)
    }
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed with {} ({})", self.call, self.name, self.code)?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// The result of a driver call.
pub type CuResult<T> = Result<T, CuError>;

type ErrorTextFn = unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult;
type HandleFn = unsafe extern "C" fn(Handle) -> CUresult;
type CopyFn = unsafe extern "C" fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> CUresult;

/// Declares each entry point kiln uses once: its field, the symbol names to try in order (the
/// versioned one first where there are two), and its C type; generates the table [`Fns`] and
/// its loader.
macro_rules! entry_points {
    ($($field:ident = $($name:literal)|+ : $ty:ty;)*) => {
        /// The entry points kiln uses, resolved from the driver library.
        struct Fns {
            $($field: $ty,)*
        }

        impl Fns {
            /// Resolves every entry point from `lib`, opened from `path`.
            ///
            /// # Errors
            /// The first entry point the library lacks.
            ///
            /// # Safety
            /// - `lib` outlives the table (the function pointers point into it).
            unsafe fn load(lib: &libloading::Library, path: &str) -> Result<Self, String> {
                Ok(Self {
                    $($field: 'found: {
                        for name in [$($name),+] {
                            let symbol = format!("{name}\0");
                            // SAFETY: the symbol is the CUDA driver entry point of that name,
                            // whose C signature (cuda.h) is the type of the field it is stored
                            // in; the library outlives the table (caller).
                            if let Ok(s) = unsafe { lib.get::<$ty>(symbol.as_bytes()) } {
                                break 'found *s;
                            }
                        }
                        return Err(format!(
                            "{path} has no `{}` (kiln needs a driver for CUDA 11.0 or newer)",
                            [$($name),+].join("` or `")
                        ));
                    },)*
                })
            }
        }
    };
}

entry_points! {
    init = "cuInit": unsafe extern "C" fn(c_uint) -> CUresult;
    driver_get_version = "cuDriverGetVersion": unsafe extern "C" fn(*mut c_int) -> CUresult;
    device_get_count = "cuDeviceGetCount": unsafe extern "C" fn(*mut c_int) -> CUresult;
    device_get = "cuDeviceGet": unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult;
    device_get_name = "cuDeviceGetName":
        unsafe extern "C" fn(*mut c_char, c_int, CUdevice) -> CUresult;
    device_get_attribute = "cuDeviceGetAttribute":
        unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult;
    device_total_mem = "cuDeviceTotalMem_v2": unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult;
    primary_ctx_retain = "cuDevicePrimaryCtxRetain":
        unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult;
    primary_ctx_release = "cuDevicePrimaryCtxRelease_v2": unsafe extern "C" fn(CUdevice) -> CUresult;
    ctx_set_current = "cuCtxSetCurrent": HandleFn;
    ctx_synchronize = "cuCtxSynchronize": unsafe extern "C" fn() -> CUresult;
    mem_alloc = "cuMemAlloc_v2": unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
    mem_free = "cuMemFree_v2": unsafe extern "C" fn(CUdeviceptr) -> CUresult;
    mem_get_info = "cuMemGetInfo_v2": unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
    memcpy_htod = "cuMemcpyHtoDAsync_v2":
        unsafe extern "C" fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult;
    memcpy_dtoh = "cuMemcpyDtoHAsync_v2":
        unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult;
    memcpy_dtod = "cuMemcpyDtoDAsync_v2": CopyFn;
    memcpy_peer = "cuMemcpyPeerAsync":
        unsafe extern "C" fn(
            CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize, CUstream,
        ) -> CUresult;
    memset_d8 = "cuMemsetD8Async":
        unsafe extern "C" fn(CUdeviceptr, u8, usize, CUstream) -> CUresult;
    stream_create = "cuStreamCreate": unsafe extern "C" fn(*mut CUstream, c_uint) -> CUresult;
    stream_destroy = "cuStreamDestroy_v2": HandleFn;
    stream_synchronize = "cuStreamSynchronize": HandleFn;
    stream_query = "cuStreamQuery": HandleFn;
    stream_wait_event = "cuStreamWaitEvent":
        unsafe extern "C" fn(CUstream, CUevent, c_uint) -> CUresult;
    launch_host_func = "cuLaunchHostFunc":
        unsafe extern "C" fn(CUstream, CUhostFn, *mut c_void) -> CUresult;
    event_create = "cuEventCreate": unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult;
    event_record = "cuEventRecord": unsafe extern "C" fn(CUevent, CUstream) -> CUresult;
    event_query = "cuEventQuery": HandleFn;
    event_synchronize = "cuEventSynchronize": HandleFn;
    event_destroy = "cuEventDestroy_v2": HandleFn;
    event_elapsed_time = "cuEventElapsedTime_v2" | "cuEventElapsedTime":
        unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
    module_load_data_ex = "cuModuleLoadDataEx":
        unsafe extern "C" fn(
            *mut CUmodule, *const c_void, c_uint, *mut c_int, *mut *mut c_void,
        ) -> CUresult;
    module_get_function = "cuModuleGetFunction":
        unsafe extern "C" fn(*mut CUfunction, CUmodule, *const c_char) -> CUresult;
    module_unload = "cuModuleUnload": HandleFn;
    func_get_attribute = "cuFuncGetAttribute":
        unsafe extern "C" fn(*mut c_int, c_int, CUfunction) -> CUresult;
    func_set_attribute = "cuFuncSetAttribute":
        unsafe extern "C" fn(CUfunction, c_int, c_int) -> CUresult;
    launch_kernel = "cuLaunchKernel":
        unsafe extern "C" fn(
            CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream,
            *mut *mut c_void, *mut *mut c_void,
        ) -> CUresult;
    get_error_name = "cuGetErrorName": ErrorTextFn;
    get_error_string = "cuGetErrorString": ErrorTextFn;
}

/// The loaded driver library and its entry points.
pub struct Driver {
    fns: Fns,
    /// Which file was opened (`libcuda.so.1`, or `KILN_CUDA_DRIVER`).
    pub path: String,
    // Kept loaded for the life of the process (the table points into it).
    _lib: libloading::Library,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver").field("path", &self.path).finish()
    }
}

/// The libraries tried, in order, when `KILN_CUDA_DRIVER` is not set.
pub const LIBRARY_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// The environment variable naming the driver library to load instead.
pub const DRIVER_ENV: &str = "KILN_CUDA_DRIVER";

fn open() -> Result<Driver, String> {
    let names: Vec<String> = match std::env::var(DRIVER_ENV) {
        Ok(p) if !p.is_empty() => vec![p],
        _ => LIBRARY_NAMES.iter().map(|s| (*s).to_owned()).collect(),
    };
    let mut tried = Vec::new();
    for path in &names {
        // SAFETY: loading the CUDA driver runs its initializers, which only set up its own state;
        // it is a C library without Rust-visible invariants.
        let lib = match unsafe { libloading::Library::new(path) } {
            Ok(l) => l,
            Err(e) => {
                // libloading says "dlopen failed"; dlerror's text (which names the file) is the
                // error's source.
                let mut text = e.to_string();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    text = c.to_string();
                    cause = c.source();
                }
                tried.push(text);
                continue;
            }
        };
        // SAFETY: the table and the library are kept together in `Driver`, which is never
        // dropped (it lives in a process-wide `OnceLock`).
        let fns = unsafe { Fns::load(&lib, path) }?;
        return Ok(Driver {
            fns,
            path: path.clone(),
            _lib: lib,
        });
    }
    Err(format!(
        "{} could not be loaded ({})",
        names[0],
        tried.join("; ")
    ))
}

/// The driver library, loaded on first use (once per process; a failure is remembered).
///
/// # Errors
/// Why the library or one of its entry points could not be loaded
/// (`libcuda.so.1 could not be loaded (...)`).
pub fn driver() -> Result<&'static Driver, String> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER.get_or_init(open).as_ref().map_err(Clone::clone)
}

/// Calls entry point `$f` of `$s` (a `&Driver`). The one `unsafe` block every call goes through;
/// the `// SAFETY:` comment at each use adds what its arguments need.
macro_rules! call {
    ($s:expr, $f:ident($($a:expr),* $(,)?)) => {
        // SAFETY: the invariant every call relies on. The entry point's type is its C signature
        // (checked by hand against cuda.h in `entry_points!`), and the `Driver` holding the table
        // keeps the library loaded for the life of the process. Handles passed are live: the
        // handle types own their object (released only on drop) or borrow it from an owner that
        // outlives the call. Pointer arguments are locals, or borrowed buffers valid for the
        // duration of the call with their lengths passed beside them; out pointers are the
        // wrapper's own locals. Device ranges and host memory that an asynchronous command reads
        // or writes after the call returns are the contract of the `unsafe fn` wrappers.
        unsafe { ($s.fns.$f)($($a),*) }
    };
}

/// A driver-owned C string (`cuGetErrorName` / `cuGetErrorString`), if the call succeeded.
fn error_text(f: ErrorTextFn, code: CUresult) -> Option<String> {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: `p` is a valid out pointer; the driver stores a pointer to a static string.
    let r = unsafe { f(code, &mut p) };
    if r != CUDA_SUCCESS || p.is_null() {
        return None;
    }
    // SAFETY: the driver returned a NUL-terminated static string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Text up to the first NUL of a log buffer.
fn log_text(buf: &[u8]) -> String {
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).trim().to_owned()
}

/// A CUDA device ordinal's handle (`CUdevice`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DeviceId(CUdevice);

impl Driver {
    /// The error of `call` returning `code`, with the driver's name and text for it.
    pub fn error(&self, call: &'static str, code: CUresult) -> CuError {
        let name = error_text(self.fns.get_error_name, code)
            .unwrap_or_else(|| error_name(code).to_owned());
        let detail = error_text(self.fns.get_error_string, code).unwrap_or_default();
        CuError {
            call,
            code,
            name,
            detail,
        }
    }

    fn check(&self, call: &'static str, code: CUresult) -> CuResult<()> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self.error(call, code))
        }
    }

    /// `cuInit(0)`.
    ///
    /// # Errors
    /// `CUDA_ERROR_NO_DEVICE` on a machine without a device, and other driver failures.
    pub fn init(&self) -> CuResult<()> {
        // SAFETY: no pointer.
        let r = call!(self, init(0));
        self.check("cuInit", r)
    }

    /// `cuDriverGetVersion`: `1000 * major + 10 * minor` (12040 for CUDA 12.4).
    ///
    /// # Errors
    /// Driver failures.
    pub fn version(&self) -> CuResult<i32> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out pointer.
        let r = call!(self, driver_get_version(&mut v));
        self.check("cuDriverGetVersion", r).map(|()| v)
    }

    /// `cuDeviceGetCount`.
    ///
    /// # Errors
    /// Driver failures.
    pub fn device_count(&self) -> CuResult<i32> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out pointer.
        let r = call!(self, device_get_count(&mut n));
        self.check("cuDeviceGetCount", r).map(|()| n)
    }

    /// `cuDeviceGet`: the device of an ordinal.
    ///
    /// # Errors
    /// Driver failures (`CUDA_ERROR_INVALID_DEVICE`).
    pub fn device(&self, ordinal: i32) -> CuResult<DeviceId> {
        let mut d: CUdevice = 0;
        // SAFETY: `d` is a valid out pointer.
        let r = call!(self, device_get(&mut d, ordinal));
        self.check("cuDeviceGet", r).map(|()| DeviceId(d))
    }

    /// `cuDeviceGetName`.
    ///
    /// # Errors
    /// Driver failures.
    pub fn device_name(&self, d: DeviceId) -> CuResult<String> {
        let mut buf = [0u8; 256];
        // SAFETY: `buf` holds 256 bytes, the length passed.
        let r = call!(
            self,
            device_get_name(buf.as_mut_ptr().cast(), buf.len() as c_int, d.0)
        );
        self.check("cuDeviceGetName", r).map(|()| log_text(&buf))
    }

    /// `cuDeviceGetAttribute` ([`device_attr`]).
    ///
    /// # Errors
    /// Driver failures (`CUDA_ERROR_INVALID_VALUE` for an attribute the driver does not know).
    pub fn device_attribute(&self, d: DeviceId, attr: i32) -> CuResult<i32> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out pointer.
        let r = call!(self, device_get_attribute(&mut v, attr, d.0));
        self.check("cuDeviceGetAttribute", r).map(|()| v)
    }

    /// `cuDeviceTotalMem`: the device's memory in bytes.
    ///
    /// # Errors
    /// Driver failures.
    pub fn device_total_mem(&self, d: DeviceId) -> CuResult<u64> {
        let mut v: usize = 0;
        // SAFETY: `v` is a valid out pointer.
        let r = call!(self, device_total_mem(&mut v, d.0));
        self.check("cuDeviceTotalMem", r).map(|()| v as u64)
    }

    /// `cuDevicePrimaryCtxRetain`: the device's primary context (the one the CUDA runtime and
    /// other libraries such as PyTorch use), retained until the [`Context`] drops.
    ///
    /// # Errors
    /// Driver failures.
    pub fn retain_primary_context(&'static self, d: DeviceId) -> CuResult<Context> {
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer.
        let r = call!(self, primary_ctx_retain(&mut raw, d.0));
        self.check("cuDevicePrimaryCtxRetain", r)?;
        Ok(Context {
            raw,
            device: d,
            drv: self,
        })
    }

    /// `cuCtxSynchronize`: waits for all work of the current context.
    ///
    /// # Errors
    /// Driver failures, including those of earlier asynchronous work.
    pub fn ctx_synchronize(&self) -> CuResult<()> {
        // SAFETY: no pointer.
        let r = call!(self, ctx_synchronize());
        self.check("cuCtxSynchronize", r)
    }

    /// `cuMemGetInfo` in the current context: `(free, total)` bytes.
    ///
    /// # Errors
    /// Driver failures.
    pub fn mem_get_info(&self) -> CuResult<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: two valid out pointers.
        let r = call!(self, mem_get_info(&mut free, &mut total));
        self.check("cuMemGetInfo", r)
            .map(|()| (free as u64, total as u64))
    }

    /// `cuMemAlloc` in the current context (256-byte aligned).
    ///
    /// # Errors
    /// `CUDA_ERROR_OUT_OF_MEMORY` and other driver failures.
    pub fn mem_alloc(&self, nbytes: usize) -> CuResult<CUdeviceptr> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: `p` is a valid out pointer.
        let r = call!(self, mem_alloc(&mut p, nbytes));
        self.check("cuMemAlloc", r).map(|()| p)
    }

    /// `cuMemFree`.
    ///
    /// # Errors
    /// Driver failures.
    ///
    /// # Safety
    /// - `ptr` came from [`Driver::mem_alloc`] in the current context and is not freed yet.
    pub unsafe fn mem_free(&self, ptr: CUdeviceptr) -> CuResult<()> {
        // SAFETY: a live allocation (caller).
        let r = call!(self, mem_free(ptr));
        self.check("cuMemFree", r)
    }

    /// `cuMemcpyHtoDAsync`: `n` bytes from host memory at `src` to device address `dst`,
    /// ordered on `stream`.
    ///
    /// # Errors
    /// Driver failures.
    ///
    /// # Safety
    /// - `src` is readable for `n` bytes until the copy completes.
    /// - `[dst, dst + n)` lies inside a live allocation of the current context.
    pub unsafe fn memcpy_htod(
        &self,
        dst: CUdeviceptr,
        src: *const u8,
        n: usize,
        stream: &Stream,
    ) -> CuResult<()> {
        // SAFETY: both ranges are valid (caller); the stream is live.
        let r = call!(self, memcpy_htod(dst, src.cast(), n, stream.raw));
        self.check("cuMemcpyHtoDAsync", r)
    }

    /// `cuMemcpyDtoHAsync`: `n` bytes from device address `src` to host memory at `dst`.
    ///
    /// # Errors
    /// Driver failures.
    ///
    /// # Safety
    /// - `dst` is writable for `n` bytes until the copy completes, and nothing else accesses it
    ///   meanwhile.
    /// - `[src, src + n)` lies inside a live allocation of the current context.
    pub unsafe fn memcpy_dtoh(
        &self,
        dst: *mut u8,
        src: CUdeviceptr,
        n: usize,
        stream: &Stream,
    ) -> CuResult<()> {
        // SAFETY: both ranges are valid (caller); the stream is live.
        let r = call!(self, memcpy_dtoh(dst.cast(), src, n, stream.raw));
        self.check("cuMemcpyDtoHAsync", r)
    }

    /// `cuMemcpyDtoDAsync` within one context.
    ///
    /// # Errors
    /// Driver failures.
    ///
    /// # Safety
    /// - Both ranges lie inside live allocations of the current context.
    pub unsafe fn memcpy_dtod(
        &self,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: usize,
        stream: &Stream,
    ) -> CuResult<()> {
        // SAFETY: both ranges are valid (caller); the stream is live.
        let r = call!(self, memcpy_dtod(dst, src, n, stream.raw));
        self.check("cuMemcpyDtoDAsync", r)
    }

    /// `cuMemcpyPeerAsync`: between two contexts (devices); the driver stages through the host
    /// when the devices have no peer access.
    ///
    /// # Errors
    /// Driver failures.
    ///
    /// # Safety
    /// - `[dst, dst + n)` lies inside a live allocation of `dst_ctx`, `[src, src + n)` inside
    ///   one of `src_ctx`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn memcpy_peer(
        &self,
        dst: CUdeviceptr,
        dst_ctx: &Context,
        src: CUdeviceptr,
        src_ctx: &Context,
        n: usize,
        stream: &Stream,
    ) -> CuResult<()> {
        // SAFETY: both ranges are valid (caller); contexts and stream are live.
        let r = call!(
            self,
            memcpy_peer(dst, dst_ctx.raw, src, src_ctx.raw, n, stream.raw)
        );
        self.check("cuMemcpyPeerAsync", r)
    }

    /// `cuMemsetD8Async`: sets `n` bytes at `dst` to `value`.
    ///
    /// # Errors
    /// Driver failures.
    ///
    /// # Safety
    /// - `[dst, dst + n)` lies inside a live allocation of the current context.
    pub unsafe fn memset_d8(
        &self,
        dst: CUdeviceptr,
        value: u8,
        n: usize,
        stream: &Stream,
    ) -> CuResult<()> {
        // SAFETY: the range is valid (caller); the stream is live.
        let r = call!(self, memset_d8(dst, value, n, stream.raw));
        self.check("cuMemsetD8Async", r)
    }

    /// `cuStreamCreate(CU_STREAM_NON_BLOCKING)` in the current context: a stream that does not
    /// synchronize with the legacy default stream (as TVM's `CreateStream`).
    ///
    /// # Errors
    /// Driver failures.
    pub fn stream_create(&'static self) -> CuResult<Stream> {
        let mut raw: CUstream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer.
        let r = call!(self, stream_create(&mut raw, CU_STREAM_NON_BLOCKING));
        self.check("cuStreamCreate", r)?;
        Ok(Stream {
            raw,
            owner: Some(self),
        })
    }

    /// `cuStreamSynchronize`.
    ///
    /// # Errors
    /// Driver failures, including those of the work queued on the stream.
    pub fn stream_synchronize(&self, s: &Stream) -> CuResult<()> {
        // SAFETY: a live stream (or the legacy NULL stream).
        let r = call!(self, stream_synchronize(s.raw));
        self.check("cuStreamSynchronize", r)
    }

    /// `cuStreamQuery`: whether the work queued on `s` has completed
    /// (`CUDA_ERROR_NOT_READY` is `false`, not an error).
    ///
    /// # Errors
    /// Driver failures, including those of the work queued on the stream.
    pub fn stream_query(&self, s: &Stream) -> CuResult<bool> {
        // SAFETY: a live stream.
        let r = call!(self, stream_query(s.raw));
        match r {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            _ => Err(self.error("cuStreamQuery", r)),
        }
    }

    /// `cuStreamWaitEvent`: work queued on `s` afterwards waits for `e`.
    ///
    /// # Errors
    /// Driver failures.
    pub fn stream_wait_event(&self, s: &Stream, e: &Event) -> CuResult<()> {
        // SAFETY: a live stream and event.
        let r = call!(self, stream_wait_event(s.raw, e.raw, 0));
        self.check("cuStreamWaitEvent", r)
    }

    /// `cuLaunchHostFunc`: runs `cb` on a driver thread after the work queued on `s` before it;
    /// work queued after it waits for it. A panic in `cb` is caught and logged. If the call
    /// fails, `cb` is dropped without running; if the context faults before the callback's turn,
    /// the driver never runs it and it is leaked.
    ///
    /// # Errors
    /// Driver failures.
    pub fn launch_host_func(&self, s: &Stream, cb: HostClosure) -> CuResult<()> {
        let user: *mut c_void = Box::into_raw(Box::new(cb)).cast();
        // SAFETY: a live stream; the trampoline matches `CUhostFn` and `user` is the leaked box it
        // reclaims, once.
        let r = call!(self, launch_host_func(s.raw, host_trampoline, user));
        if r != CUDA_SUCCESS {
            // SAFETY: the driver refused the callback and will never call the trampoline with
            // `user`: we own the box again.
            drop(unsafe { Box::from_raw(user.cast::<HostClosure>()) });
        }
        self.check("cuLaunchHostFunc", r)
    }

    /// `cuEventCreate` in the current context, with timing (`CU_EVENT_DEFAULT`) or without
    /// (`CU_EVENT_DISABLE_TIMING`, cheaper: for ordering only).
    ///
    /// # Errors
    /// Driver failures.
    pub fn event_create(&'static self, timing: bool) -> CuResult<Event> {
        let flags = if timing {
            CU_EVENT_DEFAULT
        } else {
            CU_EVENT_DISABLE_TIMING
        };
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer.
        let r = call!(self, event_create(&mut raw, flags));
        self.check("cuEventCreate", r)?;
        Ok(Event { raw, drv: self })
    }

    /// `cuEventRecord`: records `e` at the current end of `s`.
    ///
    /// # Errors
    /// Driver failures.
    pub fn event_record(&self, e: &Event, s: &Stream) -> CuResult<()> {
        // SAFETY: a live event and stream of one context.
        let r = call!(self, event_record(e.raw, s.raw));
        self.check("cuEventRecord", r)
    }

    /// `cuEventQuery`: whether the work before the recorded point has completed.
    ///
    /// # Errors
    /// Driver failures.
    pub fn event_query(&self, e: &Event) -> CuResult<bool> {
        // SAFETY: a live event.
        let r = call!(self, event_query(e.raw));
        match r {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            _ => Err(self.error("cuEventQuery", r)),
        }
    }

    /// `cuEventSynchronize`.
    ///
    /// # Errors
    /// Driver failures.
    pub fn event_synchronize(&self, e: &Event) -> CuResult<()> {
        // SAFETY: a live event.
        let r = call!(self, event_synchronize(e.raw));
        self.check("cuEventSynchronize", r)
    }

    /// `cuEventElapsedTime`: milliseconds between two completed, recorded events with timing.
    ///
    /// # Errors
    /// Driver failures (`CUDA_ERROR_INVALID_HANDLE` for an event without timing or never
    /// recorded, `CUDA_ERROR_NOT_READY` before completion).
    pub fn event_elapsed_ms(&self, start: &Event, end: &Event) -> CuResult<f32> {
        let mut ms: f32 = 0.0;
        // SAFETY: `ms` is a valid out pointer; two live events.
        let r = call!(self, event_elapsed_time(&mut ms, start.raw, end.raw));
        self.check("cuEventElapsedTime", r).map(|()| ms)
    }

    /// `cuModuleLoadDataEx` of NUL-terminated PTX text in `ctx`, which is current.
    fn module_load_ptx(
        &'static self,
        ptx: &CStr,
        ctx: CUcontext,
    ) -> Result<Module, (CuError, String)> {
        let mut error_log = vec![0u8; JIT_LOG_BYTES];
        let mut info_log = vec![0u8; JIT_LOG_BYTES];
        let mut options = [
            CU_JIT_ERROR_LOG_BUFFER,
            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            CU_JIT_INFO_LOG_BUFFER,
            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        ];
        // The sizes travel as integers in pointer slots (cuda.h: option type `unsigned int`).
        let mut values: [*mut c_void; 4] = [
            error_log.as_mut_ptr().cast(),
            JIT_LOG_BYTES as *mut c_void,
            info_log.as_mut_ptr().cast(),
            JIT_LOG_BYTES as *mut c_void,
        ];
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; `ptx` is NUL-terminated and outlives the
        // (synchronous) call; the 4 options and values arrays match, and each log buffer holds
        // the size given beside it (the driver writes at most that many bytes into it, and its
        // fill level into the size slot).
        let r = call!(
            self,
            module_load_data_ex(
                &mut raw,
                ptx.as_ptr().cast(),
                options.len() as c_uint,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        );
        let (errors, info) = (log_text(&error_log), log_text(&info_log));
        if r != CUDA_SUCCESS {
            let log = match (errors.is_empty(), info.is_empty()) {
                (true, true) => "(the driver wrote no log)".to_owned(),
                (false, true) => errors,
                (true, false) => info,
                (false, false) => format!("{errors}\n{info}"),
            };
            return Err((self.error("cuModuleLoadDataEx", r), log));
        }
        if !info.is_empty() {
            log::debug!("CUDA JIT: {info}");
        }
        Ok(Module(Arc::new(ModuleInner {
            raw,
            ctx,
            drv: self,
        })))
    }

    /// `cuModuleGetFunction`.
    ///
    /// # Errors
    /// Driver failures (`CUDA_ERROR_NOT_FOUND` for a name the module lacks).
    pub fn module_function(&self, m: &Module, name: &str) -> CuResult<Function> {
        let cname = CString::new(name)
            .map_err(|_| self.error("cuModuleGetFunction", CUDA_ERROR_INVALID_VALUE))?;
        let mut raw: CUfunction = std::ptr::null_mut();
        // SAFETY: a live module; NUL-terminated name; `raw` is a valid out pointer.
        let r = call!(self, module_get_function(&mut raw, m.0.raw, cname.as_ptr()));
        self.check("cuModuleGetFunction", r)?;
        Ok(Function {
            raw,
            _module: m.0.clone(),
        })
    }

    /// `cuFuncGetAttribute` ([`func_attr`]).
    ///
    /// # Errors
    /// Driver failures.
    pub fn func_attribute(&self, f: &Function, attr: i32) -> CuResult<i32> {
        let mut v: c_int = 0;
        // SAFETY: a live function (its module is kept loaded); `v` is a valid out pointer.
        let r = call!(self, func_get_attribute(&mut v, attr, f.raw));
        self.check("cuFuncGetAttribute", r).map(|()| v)
    }

    /// `cuFuncSetAttribute` ([`func_attr`]).
    ///
    /// # Errors
    /// Driver failures (`CUDA_ERROR_INVALID_VALUE` for a value over the device's limit).
    pub fn func_set_attribute(&self, f: &Function, attr: i32, value: i32) -> CuResult<()> {
        // SAFETY: a live function; values only.
        let r = call!(self, func_set_attribute(f.raw, attr, value));
        self.check("cuFuncSetAttribute", r)
    }

    /// `cuLaunchKernel` of `f` on `stream` with `grid` blocks of `block` threads and `shared`
    /// bytes of dynamic shared memory. The driver copies the parameter values before returning.
    ///
    /// # Errors
    /// Driver failures (launch-configuration errors; errors of earlier asynchronous work).
    ///
    /// # Safety
    /// - `params` holds exactly one pointer per parameter of the kernel, each pointing to at
    ///   least as many readable bytes as that parameter's size.
    /// - Every device address passed as a parameter is valid for every access the kernel makes
    ///   through it (the caller checks buffers against its table of live allocations).
    pub unsafe fn launch(
        &self,
        f: &Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> CuResult<()> {
        let p = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: a live function and stream; `params` as the caller promises; no `extra`.
        let r = call!(
            self,
            launch_kernel(
                f.raw,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared,
                stream.raw,
                p,
                std::ptr::null_mut(),
            )
        );
        self.check("cuLaunchKernel", r)
    }
}

/// A device's primary context, retained (`cuDevicePrimaryCtxRetain`) and released on drop.
pub struct Context {
    raw: CUcontext,
    device: DeviceId,
    drv: &'static Driver,
}

// SAFETY: a context may be made current on any thread; driver calls are thread-safe.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Context({:#x})", self.raw as usize)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the primary context of `device`, of which this value holds one retain.
        let _ = call!(self.drv, primary_ctx_release(self.device.0));
    }
}

impl Context {
    /// `cuCtxSetCurrent`: makes this context the calling thread's current one.
    ///
    /// # Errors
    /// Driver failures.
    pub fn make_current(&self) -> CuResult<()> {
        // SAFETY: a live (retained) context.
        let r = call!(self.drv, ctx_set_current(self.raw));
        self.drv.check("cuCtxSetCurrent", r)
    }

    /// `cuModuleLoadDataEx` of NUL-terminated PTX text into this context, which must be
    /// current (the driver JIT-compiles it for the device). On failure the error comes with the
    /// JIT's error and info logs; on success the info log is logged at debug level.
    ///
    /// # Errors
    /// The failed call and the JIT log.
    pub fn load_ptx(&self, ptx: &CStr) -> Result<Module, (CuError, String)> {
        self.drv.module_load_ptx(ptx, self.raw)
    }
}

/// A stream: one created by [`Driver::stream_create`] (destroyed on drop), or the legacy
/// default stream (`NULL`, never destroyed).
pub struct Stream {
    raw: CUstream,
    owner: Option<&'static Driver>,
}

// SAFETY: streams may be used from any thread; driver calls are thread-safe.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// The legacy default stream of the current context (`NULL`; TVM's default stream).
    pub const fn legacy() -> Self {
        Self {
            raw: std::ptr::null_mut(),
            owner: None,
        }
    }

    /// The `CUstream` value (0 for the legacy default stream), for interoperation with other
    /// CUDA libraries.
    pub fn raw(&self) -> usize {
        self.raw as usize
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(drv) = self.owner {
            // SAFETY: a stream this value created and owns; the driver releases it once its
            // queued work completes.
            let _ = call!(drv, stream_destroy(self.raw));
        }
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({:#x})", self.raw as usize)
    }
}

/// An event (`cuEventCreate`), destroyed on drop.
pub struct Event {
    raw: CUevent,
    drv: &'static Driver,
}

// SAFETY: events may be used from any thread; driver calls are thread-safe.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: an event this value created and owns.
        let _ = call!(self.drv, event_destroy(self.raw));
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event({:#x})", self.raw as usize)
    }
}

struct ModuleInner {
    raw: CUmodule,
    ctx: CUcontext,
    drv: &'static Driver,
}

// SAFETY: a loaded module may be used from any thread; driver calls are thread-safe.
unsafe impl Send for ModuleInner {}
// SAFETY: as above.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // `cuModuleUnload` acts on the current context: make the module's current first. The
        // last `Function` of the module is gone, so no launch can use it any more.
        // SAFETY: the retained primary context the module was loaded in (the backend keeps its
        // contexts for the life of the process).
        let _ = call!(self.drv, ctx_set_current(self.ctx));
        // SAFETY: a module this value loaded and owns; no function of it remains.
        let _ = call!(self.drv, module_unload(self.raw));
    }
}

/// A loaded module (`CUmodule`), unloaded when it and every [`Function`] of it are dropped.
#[derive(Clone)]
pub struct Module(Arc<ModuleInner>);

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Module({:#x})", self.0.raw as usize)
    }
}

/// A kernel of a loaded module (`CUfunction`); keeps the module loaded.
#[derive(Clone)]
pub struct Function {
    raw: CUfunction,
    _module: Arc<ModuleInner>,
}

// SAFETY: functions may be used from any thread; driver calls are thread-safe.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Function({:#x})", self.raw as usize)
    }
}

/// A host callback run by [`Driver::launch_host_func`].
pub type HostClosure = Box<dyn FnOnce() + Send + 'static>;

/// The `CUhostFn` of `cuLaunchHostFunc`: runs the boxed closure once. Panics are caught here,
/// because unwinding into the driver's C frames is undefined behaviour.
///
/// # Safety
/// - `user` came from `Box::into_raw(Box<HostClosure>)` in [`Driver::launch_host_func`], and the
///   driver calls this once per registration.
unsafe extern "C" fn host_trampoline(user: *mut c_void) {
    if user.is_null() {
        return;
    }
    // SAFETY: a leaked `Box<HostClosure>`, reclaimed once (caller's contract).
    let cb = unsafe { Box::from_raw(user.cast::<HostClosure>()) };
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(cb)) {
        log::error!(
            "a CUDA host callback panicked: {}",
            crate::util::panic_message(&*p)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_errors_are_the_ones_that_corrupt_the_context() {
        for code in [700, 702, 710, 714, 715, 716, 717, 718, 719] {
            assert!(is_sticky(code), "{code}");
        }
        for code in [0, 1, 2, 218, 600, 701, 999] {
            assert!(!is_sticky(code), "{code}");
        }
    }

    #[test]
    fn errors_name_the_call_the_code_and_the_text() {
        let e = CuError {
            call: "cuMemAlloc",
            code: 2,
            name: error_name(2).to_owned(),
            detail: "out of memory".to_owned(),
        };
        assert_eq!(
            e.to_string(),
            "cuMemAlloc failed with CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"
        );
        assert_eq!(error_name(218), "CUDA_ERROR_INVALID_PTX");
        assert_eq!(error_name(123_456), "an unknown CUDA error code");
    }
}
