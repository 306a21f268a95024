//! The OpenCL C API, loaded at run time, and the only `unsafe` code of the OpenCL backend.
//!
//! The library (`libOpenCL.so.1`, then `libOpenCL.so`: the Khronos ICD loader, which dispatches
//! to the installed drivers such as PoCL) is opened once with `libloading`; the entry points kiln
//! uses are resolved into one typed table ([`Fns`]). Types and constants are written by hand from
//! the OpenCL 1.2 headers (`CL/cl.h`); no bindgen, no link-time dependency: without the library
//! kiln builds and runs, and the backend has no devices.
//!
//! Above the table sit owned handle types ([`Context`], [`Queue`], [`Mem`], [`Event`],
//! [`Program`], [`Kernel`]) that release their object on drop and retain it on clone, and safe
//! methods taking Rust values. The only methods left `unsafe` take host pointers that an
//! asynchronous command reads or writes after the call returns. Each entry point is declared
//! once (`entry_points!`: the table's field, C name and type), and the methods that make one call
//! and check its status are generated from their signature and that call (`cl_wrappers!`, whose
//! one `unsafe` block states the invariant they rely on).
//!
//! Thread safety: OpenCL 1.2 (appendix A.2) makes every API call thread-safe except
//! `clSetKernelArg` (and the deprecated `clSetCommandQueueProperty`), so handles are `Send` and
//! `Sync`, except [`Kernel`], whose argument setters take `&mut self`.
//!
//! Size: this file is over 1,000 lines on purpose. It is one concern, the C API and its owned
//! handles, and about half of it is the documentation of what each entry point guarantees, the
//! `error_name` table of OpenCL's status codes and the `// SAFETY:` reasoning; splitting it
//! would spread the FFI (and its `unsafe`) over more files.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void, CString};
use std::fmt;
use std::sync::OnceLock;

/// `cl_int`.
pub type cl_int = i32;
/// `cl_uint`.
pub type cl_uint = u32;
/// `cl_bitfield`.
pub type cl_bitfield = u64;
/// `cl_bool`.
pub type cl_bool = u32;
type Handle = *mut c_void;
type cl_platform_id = Handle;
type cl_device_id = Handle;
type cl_context = Handle;
type cl_command_queue = Handle;
type cl_mem = Handle;
type cl_program = Handle;
type cl_kernel = Handle;
type cl_event = Handle;

/// `CL_SUCCESS`.
pub const CL_SUCCESS: cl_int = 0;
/// `CL_COMPLETE` (an event's execution status).
pub const CL_COMPLETE: cl_int = 0;
/// `CL_DEVICE_NOT_FOUND`.
pub const CL_DEVICE_NOT_FOUND: cl_int = -1;
/// `CL_MEM_OBJECT_ALLOCATION_FAILURE`.
pub const CL_MEM_OBJECT_ALLOCATION_FAILURE: cl_int = -4;
/// `CL_OUT_OF_RESOURCES`.
pub const CL_OUT_OF_RESOURCES: cl_int = -5;
/// `CL_OUT_OF_HOST_MEMORY`.
pub const CL_OUT_OF_HOST_MEMORY: cl_int = -6;
/// `CL_PROFILING_INFO_NOT_AVAILABLE`.
pub const CL_PROFILING_INFO_NOT_AVAILABLE: cl_int = -7;
/// `CL_INVALID_BUFFER_SIZE`.
pub const CL_INVALID_BUFFER_SIZE: cl_int = -61;
/// `CL_PLATFORM_NOT_FOUND_KHR` (the ICD loader with no driver installed).
pub const CL_PLATFORM_NOT_FOUND_KHR: cl_int = -1001;

const CL_FALSE: cl_bool = 0;
const CL_DEVICE_TYPE_ALL: cl_bitfield = 0xFFFF_FFFF;
const CL_MEM_READ_WRITE: cl_bitfield = 1;
const CL_QUEUE_PROFILING_ENABLE: cl_bitfield = 1 << 1;
const CL_EVENT_COMMAND_EXECUTION_STATUS: cl_uint = 0x11D3;
const CL_PROFILING_COMMAND_END: cl_uint = 0x1283;
const CL_PROGRAM_BUILD_LOG: cl_uint = 0x1183;
const CL_PROGRAM_KERNEL_NAMES: cl_uint = 0x1168;
const CL_KERNEL_NUM_ARGS: cl_uint = 0x1191;
const CL_KERNEL_WORK_GROUP_SIZE: cl_uint = 0x11B0;
const CL_PLATFORM_NAME: cl_uint = 0x0902;
const CL_KERNEL_ARG_ADDRESS_QUALIFIER: cl_uint = 0x1196;
const CL_KERNEL_ARG_TYPE_NAME: cl_uint = 0x1198;
/// `CL_KERNEL_ARG_ADDRESS_GLOBAL`.
pub const CL_KERNEL_ARG_ADDRESS_GLOBAL: cl_uint = 0x119B;
/// `CL_KERNEL_ARG_ADDRESS_LOCAL`.
pub const CL_KERNEL_ARG_ADDRESS_LOCAL: cl_uint = 0x119C;
/// `CL_KERNEL_ARG_ADDRESS_CONSTANT`.
pub const CL_KERNEL_ARG_ADDRESS_CONSTANT: cl_uint = 0x119D;

/// `clGetDeviceInfo` parameter names kiln asks for.
pub mod device_info {
    /// `CL_DEVICE_MAX_COMPUTE_UNITS`.
    pub const MAX_COMPUTE_UNITS: u32 = 0x1002;
    /// `CL_DEVICE_MAX_WORK_GROUP_SIZE`.
    pub const MAX_WORK_GROUP_SIZE: u32 = 0x1004;
    /// `CL_DEVICE_MAX_WORK_ITEM_SIZES`.
    pub const MAX_WORK_ITEM_SIZES: u32 = 0x1005;
    /// `CL_DEVICE_MAX_CLOCK_FREQUENCY` (MHz).
    pub const MAX_CLOCK_FREQUENCY: u32 = 0x100C;
    /// `CL_DEVICE_MAX_MEM_ALLOC_SIZE`.
    pub const MAX_MEM_ALLOC_SIZE: u32 = 0x1010;
    /// `CL_DEVICE_GLOBAL_MEM_CACHE_SIZE`.
    pub const GLOBAL_MEM_CACHE_SIZE: u32 = 0x101E;
    /// `CL_DEVICE_GLOBAL_MEM_SIZE`.
    pub const GLOBAL_MEM_SIZE: u32 = 0x101F;
    /// `CL_DEVICE_LOCAL_MEM_SIZE`.
    pub const LOCAL_MEM_SIZE: u32 = 0x1023;
    /// `CL_DEVICE_NAME`.
    pub const NAME: u32 = 0x102B;
    /// `CL_DRIVER_VERSION`.
    pub const DRIVER_VERSION: u32 = 0x102D;
    /// `CL_DEVICE_VERSION`.
    pub const VERSION: u32 = 0x102F;
    /// `CL_DEVICE_EXTENSIONS`.
    pub const EXTENSIONS: u32 = 0x1030;
    /// `CL_DEVICE_OPENCL_C_VERSION`.
    pub const OPENCL_C_VERSION: u32 = 0x103D;
    /// `CL_DEVICE_IMAGE_PITCH_ALIGNMENT` (OpenCL 2.0).
    pub const IMAGE_PITCH_ALIGNMENT: u32 = 0x104A;
    /// `CL_DEVICE_REGISTERS_PER_BLOCK_NV` (`cl_nv_device_attribute_query`).
    pub const REGISTERS_PER_BLOCK_NV: u32 = 0x4002;
    /// `CL_DEVICE_WARP_SIZE_NV` (`cl_nv_device_attribute_query`).
    pub const WARP_SIZE_NV: u32 = 0x4003;
    /// `CL_DEVICE_WAVEFRONT_WIDTH_AMD` (`cl_amd_device_attribute_query`).
    pub const WAVEFRONT_WIDTH_AMD: u32 = 0x4043;
}

/// The name of an OpenCL error code (`"CL_OUT_OF_RESOURCES"`).
pub fn error_name(code: cl_int) -> &'static str {
    match code {
        0 => "CL_SUCCESS",
        -1 => "CL_DEVICE_NOT_FOUND",
        -2 => "CL_DEVICE_NOT_AVAILABLE",
        -3 => "CL_COMPILER_NOT_AVAILABLE",
        -4 => "CL_MEM_OBJECT_ALLOCATION_FAILURE",
        -5 => "CL_OUT_OF_RESOURCES",
        -6 => "CL_OUT_OF_HOST_MEMORY",
        -7 => "CL_PROFILING_INFO_NOT_AVAILABLE",
        -8 => "CL_MEM_COPY_OVERLAP",
        -9 => "CL_IMAGE_FORMAT_MISMATCH",
        -10 => "CL_IMAGE_FORMAT_NOT_SUPPORTED",
        -11 => "CL_BUILD_PROGRAM_FAILURE",
        -12 => "CL_MAP_FAILURE",
        -13 => "CL_MISALIGNED_SUB_BUFFER_OFFSET",
        -14 => "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
        -15 => "CL_COMPILE_PROGRAM_FAILURE",
        -16 => "CL_LINKER_NOT_AVAILABLE",
        -17 => "CL_LINK_PROGRAM_FAILURE",
        -18 => "CL_DEVICE_PARTITION_FAILED",
        -19 => "CL_KERNEL_ARG_INFO_NOT_AVAILABLE",
        -30 => "CL_INVALID_VALUE",
        -31 => "CL_INVALID_DEVICE_TYPE",
        -32 => "CL_INVALID_PLATFORM",
        -33 => "CL_INVALID_DEVICE",
        -34 => "CL_INVALID_CONTEXT",
        -35 => "CL_INVALID_QUEUE_PROPERTIES",
        -36 => "CL_INVALID_COMMAND_QUEUE",
        -37 => "CL_INVALID_HOST_PTR",
        -38 => "CL_INVALID_MEM_OBJECT",
        -39 => "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR",
        -40 => "CL_INVALID_IMAGE_SIZE",
        -41 => "CL_INVALID_SAMPLER",
        -42 => "CL_INVALID_BINARY",
        -43 => "CL_INVALID_BUILD_OPTIONS",
        -44 => "CL_INVALID_PROGRAM",
        -45 => "CL_INVALID_PROGRAM_EXECUTABLE",
        -46 => "CL_INVALID_KERNEL_NAME",
        -47 => "CL_INVALID_KERNEL_DEFINITION",
        -48 => "CL_INVALID_KERNEL",
        -49 => "CL_INVALID_ARG_INDEX",
        -50 => "CL_INVALID_ARG_VALUE",
        -51 => "CL_INVALID_ARG_SIZE",
        -52 => "CL_INVALID_KERNEL_ARGS",
        -53 => "CL_INVALID_WORK_DIMENSION",
        -54 => "CL_INVALID_WORK_GROUP_SIZE",
        -55 => "CL_INVALID_WORK_ITEM_SIZE",
        -56 => "CL_INVALID_GLOBAL_OFFSET",
        -57 => "CL_INVALID_EVENT_WAIT_LIST",
        -58 => "CL_INVALID_EVENT",
        -59 => "CL_INVALID_OPERATION",
        -60 => "CL_INVALID_GL_OBJECT",
        -61 => "CL_INVALID_BUFFER_SIZE",
        -62 => "CL_INVALID_MIP_LEVEL",
        -63 => "CL_INVALID_GLOBAL_WORK_SIZE",
        -64 => "CL_INVALID_PROPERTY",
        -65 => "CL_INVALID_IMAGE_DESCRIPTOR",
        -66 => "CL_INVALID_COMPILER_OPTIONS",
        -67 => "CL_INVALID_LINKER_OPTIONS",
        -68 => "CL_INVALID_DEVICE_PARTITION_COUNT",
        -69 => "CL_INVALID_PIPE_SIZE",
        -70 => "CL_INVALID_DEVICE_QUEUE",
        -71 => "CL_INVALID_SPEC_ID",
        -72 => "CL_MAX_SIZE_RESTRICTION_EXCEEDED",
        -1000 => "CL_INVALID_GL_SHAREGROUP_REFERENCE_KHR",
        -1001 => "CL_PLATFORM_NOT_FOUND_KHR",
        -1002 => "CL_INVALID_D3D10_DEVICE_KHR",
        -1003 => "CL_INVALID_D3D10_RESOURCE_KHR",
        -1004 => "CL_D3D10_RESOURCE_ALREADY_ACQUIRED_KHR",
        -1005 => "CL_D3D10_RESOURCE_NOT_ACQUIRED_KHR",
        -1057 => "CL_DEVICE_PARTITION_FAILED_EXT",
        -1058 => "CL_INVALID_PARTITION_COUNT_EXT",
        -1059 => "CL_INVALID_PARTITION_NAME_EXT",
        -1093 => "CL_INVALID_EGL_OBJECT_KHR",
        -1092 => "CL_EGL_RESOURCE_NOT_ACQUIRED_KHR",
        -1094 => "CL_INVALID_ACCELERATOR_INTEL",
        -1095 => "CL_INVALID_ACCELERATOR_TYPE_INTEL",
        -1096 => "CL_INVALID_ACCELERATOR_DESCRIPTOR_INTEL",
        -1097 => "CL_ACCELERATOR_TYPE_NOT_SUPPORTED_INTEL",
        -1098 => "CL_INVALID_VA_API_MEDIA_ADAPTER_INTEL",
        -1099 => "CL_INVALID_VA_API_MEDIA_SURFACE_INTEL",
        -1100 => "CL_VA_API_MEDIA_SURFACE_ALREADY_ACQUIRED_INTEL",
        -1101 => "CL_VA_API_MEDIA_SURFACE_NOT_ACQUIRED_INTEL",
        -1143 => "CL_COMMAND_TERMINATED_ITSELF_WITH_FAILURE_ARM",
        _ => "an unknown OpenCL error code",
    }
}

/// A failed OpenCL call: which one, and its error code.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ClError {
    /// The entry point (`"clCreateBuffer"`).
    pub call: &'static str,
    /// The error code it returned.
    pub code: cl_int,
}

impl fmt::Display for ClError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed with {} ({})",
            self.call,
            error_name(self.code),
            self.code
        )
    }
}

/// The result of an OpenCL call.
pub type ClResult<T> = Result<T, ClError>;

fn check(call: &'static str, code: cl_int) -> ClResult<()> {
    if code == CL_SUCCESS {
        Ok(())
    } else {
        Err(ClError { call, code })
    }
}

type InfoFn = unsafe extern "C" fn(Handle, cl_uint, usize, *mut c_void, *mut usize) -> cl_int;
type Info2Fn =
    unsafe extern "C" fn(Handle, Handle, cl_uint, usize, *mut c_void, *mut usize) -> cl_int;
type RefFn = unsafe extern "C" fn(Handle) -> cl_int;
type EventCallback = unsafe extern "C" fn(cl_event, cl_int, *mut c_void);

/// Declares each entry point kiln uses once, with its field name, C name and C type: the typed
/// table [`Fns`] and its loader [`Fns::load`], which resolves every field by its C name.
macro_rules! entry_points {
    ($($field:ident = $name:literal: $ty:ty;)*) => {
        /// The entry points kiln uses, resolved from the library.
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
                    $($field: {
                        // SAFETY: the symbol is the OpenCL entry point of that name, whose C
                        // signature (CL/cl.h, OpenCL 1.2) is the type of the field it is stored
                        // in; the library outlives the table (caller).
                        match unsafe { lib.get::<$ty>(concat!($name, "\0").as_bytes()) } {
                            Ok(s) => *s,
                            Err(e) => {
                                return Err(format!(
                                    "{path} has no `{}` (an OpenCL 1.2 loader is needed): {e}",
                                    $name
                                ))
                            }
                        }
                    },)*
                })
            }
        }
    };
}

entry_points! {
    get_platform_ids = "clGetPlatformIDs":
        unsafe extern "C" fn(cl_uint, *mut cl_platform_id, *mut cl_uint) -> cl_int;
    get_platform_info = "clGetPlatformInfo": InfoFn;
    get_device_ids = "clGetDeviceIDs":
        unsafe extern "C" fn(
            cl_platform_id, cl_bitfield, cl_uint, *mut cl_device_id, *mut cl_uint,
        ) -> cl_int;
    get_device_info = "clGetDeviceInfo": InfoFn;
    create_context = "clCreateContext":
        unsafe extern "C" fn(
            *const isize, cl_uint, *const cl_device_id,
            Option<unsafe extern "C" fn(*const c_char, *const c_void, usize, *mut c_void)>,
            *mut c_void, *mut cl_int,
        ) -> cl_context;
    retain_context = "clRetainContext": RefFn;
    release_context = "clReleaseContext": RefFn;
    create_command_queue = "clCreateCommandQueue":
        unsafe extern "C" fn(
            cl_context, cl_device_id, cl_bitfield, *mut cl_int,
        ) -> cl_command_queue;
    retain_command_queue = "clRetainCommandQueue": RefFn;
    release_command_queue = "clReleaseCommandQueue": RefFn;
    create_buffer = "clCreateBuffer":
        unsafe extern "C" fn(cl_context, cl_bitfield, usize, *mut c_void, *mut cl_int) -> cl_mem;
    retain_mem_object = "clRetainMemObject": RefFn;
    release_mem_object = "clReleaseMemObject": RefFn;
    enqueue_read_buffer = "clEnqueueReadBuffer":
        unsafe extern "C" fn(
            cl_command_queue, cl_mem, cl_bool, usize, usize, *mut c_void, cl_uint, *const cl_event,
            *mut cl_event,
        ) -> cl_int;
    enqueue_write_buffer = "clEnqueueWriteBuffer":
        unsafe extern "C" fn(
            cl_command_queue, cl_mem, cl_bool, usize, usize, *const c_void, cl_uint,
            *const cl_event, *mut cl_event,
        ) -> cl_int;
    enqueue_read_buffer_rect = "clEnqueueReadBufferRect":
        unsafe extern "C" fn(
            cl_command_queue, cl_mem, cl_bool, *const usize, *const usize, *const usize, usize,
            usize, usize, usize, *mut c_void, cl_uint, *const cl_event, *mut cl_event,
        ) -> cl_int;
    enqueue_write_buffer_rect = "clEnqueueWriteBufferRect":
        unsafe extern "C" fn(
            cl_command_queue, cl_mem, cl_bool, *const usize, *const usize, *const usize, usize,
            usize, usize, usize, *const c_void, cl_uint, *const cl_event, *mut cl_event,
        ) -> cl_int;
    enqueue_copy_buffer_rect = "clEnqueueCopyBufferRect":
        unsafe extern "C" fn(
            cl_command_queue, cl_mem, cl_mem, *const usize, *const usize, *const usize, usize,
            usize, usize, usize, cl_uint, *const cl_event, *mut cl_event,
        ) -> cl_int;
    enqueue_copy_buffer = "clEnqueueCopyBuffer":
        unsafe extern "C" fn(
            cl_command_queue, cl_mem, cl_mem, usize, usize, usize, cl_uint, *const cl_event,
            *mut cl_event,
        ) -> cl_int;
    enqueue_fill_buffer = "clEnqueueFillBuffer":
        unsafe extern "C" fn(
            cl_command_queue, cl_mem, *const c_void, usize, usize, usize, cl_uint, *const cl_event,
            *mut cl_event,
        ) -> cl_int;
    finish = "clFinish": RefFn;
    flush = "clFlush": RefFn;
    enqueue_marker_with_wait_list = "clEnqueueMarkerWithWaitList":
        unsafe extern "C" fn(cl_command_queue, cl_uint, *const cl_event, *mut cl_event) -> cl_int;
    enqueue_barrier_with_wait_list = "clEnqueueBarrierWithWaitList":
        unsafe extern "C" fn(cl_command_queue, cl_uint, *const cl_event, *mut cl_event) -> cl_int;
    wait_for_events = "clWaitForEvents": unsafe extern "C" fn(cl_uint, *const cl_event) -> cl_int;
    get_event_info = "clGetEventInfo": InfoFn;
    get_event_profiling_info = "clGetEventProfilingInfo": InfoFn;
    retain_event = "clRetainEvent": RefFn;
    release_event = "clReleaseEvent": RefFn;
    set_event_callback = "clSetEventCallback":
        unsafe extern "C" fn(cl_event, cl_int, EventCallback, *mut c_void) -> cl_int;
    create_user_event = "clCreateUserEvent":
        unsafe extern "C" fn(cl_context, *mut cl_int) -> cl_event;
    set_user_event_status = "clSetUserEventStatus":
        unsafe extern "C" fn(cl_event, cl_int) -> cl_int;
    create_program_with_source = "clCreateProgramWithSource":
        unsafe extern "C" fn(
            cl_context, cl_uint, *const *const c_char, *const usize, *mut cl_int,
        ) -> cl_program;
    build_program = "clBuildProgram":
        unsafe extern "C" fn(
            cl_program, cl_uint, *const cl_device_id, *const c_char,
            Option<unsafe extern "C" fn(cl_program, *mut c_void)>, *mut c_void,
        ) -> cl_int;
    get_program_info = "clGetProgramInfo": InfoFn;
    get_program_build_info = "clGetProgramBuildInfo": Info2Fn;
    release_program = "clReleaseProgram": RefFn;
    retain_program = "clRetainProgram": RefFn;
    create_kernel = "clCreateKernel":
        unsafe extern "C" fn(cl_program, *const c_char, *mut cl_int) -> cl_kernel;
    get_kernel_info = "clGetKernelInfo": InfoFn;
    get_kernel_work_group_info = "clGetKernelWorkGroupInfo": Info2Fn;
    get_kernel_arg_info = "clGetKernelArgInfo":
        unsafe extern "C" fn(cl_kernel, cl_uint, cl_uint, usize, *mut c_void, *mut usize) -> cl_int;
    set_kernel_arg = "clSetKernelArg":
        unsafe extern "C" fn(cl_kernel, cl_uint, usize, *const c_void) -> cl_int;
    release_kernel = "clReleaseKernel": RefFn;
    enqueue_nd_range_kernel = "clEnqueueNDRangeKernel":
        unsafe extern "C" fn(
            cl_command_queue, cl_kernel, cl_uint, *const usize, *const usize, *const usize, cl_uint,
            *const cl_event, *mut cl_event,
        ) -> cl_int;
}

/// The loaded OpenCL library and its entry points.
pub struct Cl {
    fns: Fns,
    /// Which file was opened.
    pub path: &'static str,
    // Kept loaded for the life of the process (the table points into it).
    _lib: libloading::Library,
}

impl fmt::Debug for Cl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cl").field("path", &self.path).finish()
    }
}

const LIBRARY_NAMES: [&str; 2] = ["libOpenCL.so.1", "libOpenCL.so"];

fn open() -> Result<Cl, String> {
    let mut tried = Vec::new();
    for &path in &LIBRARY_NAMES {
        // SAFETY: loading the Khronos ICD loader runs its initializers, which only set up its
        // own state; it is a C library without Rust-visible invariants.
        let lib = match unsafe { libloading::Library::new(path) } {
            Ok(l) => l,
            Err(e) => {
                tried.push(format!("{path}: {e}"));
                continue;
            }
        };
        // SAFETY: the table and the library are kept together in `Cl`, which is never dropped
        // (it lives in a process-wide `OnceLock`).
        let fns = unsafe { Fns::load(&lib, path) }?;
        return Ok(Cl {
            fns,
            path,
            _lib: lib,
        });
    }
    Err(format!(
        "cannot load the OpenCL library ({})",
        tried.join("; ")
    ))
}

/// The OpenCL library, loaded on first use (once per process; a failure is remembered).
///
/// # Errors
/// Why the library or one of its entry points could not be loaded.
pub fn cl() -> Result<&'static Cl, String> {
    static CL: OnceLock<Result<Cl, String>> = OnceLock::new();
    CL.get_or_init(open).as_ref().map_err(Clone::clone)
}

/// Reads a variable-size info value: one call for the size, one for the bytes.
fn info_bytes(
    call: &'static str,
    mut get: impl FnMut(usize, *mut c_void, *mut usize) -> cl_int,
) -> ClResult<Vec<u8>> {
    let mut size = 0usize;
    check(call, get(0, std::ptr::null_mut(), &mut size))?;
    let mut buf = vec![0u8; size];
    if size > 0 {
        check(
            call,
            get(size, buf.as_mut_ptr().cast(), std::ptr::null_mut()),
        )?;
    }
    Ok(buf)
}

fn c_string(mut bytes: Vec<u8>) -> String {
    if let Some(n) = bytes.iter().position(|&b| b == 0) {
        bytes.truncate(n);
    }
    String::from_utf8_lossy(&bytes).trim().to_owned()
}

/// Reads a fixed-size plain value (`T` is an integer type or an array of them).
fn info_value<T: Copy + Default>(
    call: &'static str,
    mut get: impl FnMut(usize, *mut c_void, *mut usize) -> cl_int,
) -> ClResult<T> {
    let mut v = T::default();
    let p: *mut T = &mut v;
    check(
        call,
        get(std::mem::size_of::<T>(), p.cast(), std::ptr::null_mut()),
    )?;
    Ok(v)
}

/// Generates the safe wrappers whose body is one call of a loaded entry point and the check of
/// its status. Each is written as its signature, `=>`, a kind, the entry point's name (for the
/// error), optional `let` statements, and the call `(self.cl.fns.<entry>)(<arguments>)` without
/// the trailing out parameters that the kind supplies:
///
/// - `status`: the entry returns a status, which the wrapper checks ([`check`]).
/// - `enqueue`: a command enqueued without a wait list; the kind appends the empty wait list and
///   the out pointer of the command's event, and the wrapper returns the [`Event`] ([`ret`]).
/// - `enqueue_waiting`: the same, with the wait list among the arguments.
/// - `create`: the entry returns a new object and writes its status to the out pointer the kind
///   appends; the wrapper returns the owned handle of its return type ([`ret`]).
/// - `info` / `info_string`: a `clGet*Info` query, with the `(size, value, size returned)`
///   triple appended, read as a fixed-size value ([`info_value`]) or as a string
///   ([`info_bytes`], [`c_string`]).
///
/// The `// SAFETY:` comment over each invocation's call says what its arguments add to the
/// invariant stated at the one `unsafe` block below.
macro_rules! cl_wrappers {
    () => {};
    (@call $s:ident, $f:ident, ($($a:expr),*)) => {
        // SAFETY: the invariant every wrapper relies on. The entry point's type is its C signature
        // (checked by hand against CL/cl.h, OpenCL 1.2, in `entry_points!`), and `Cl`, which holds
        // the table and keeps the library loaded, is never dropped. `$s` names a live OpenCL
        // object: the handle types own a reference, released only on drop, and platform and root
        // device ids live as long as the process; so does every handle passed as an argument, by
        // reference to its owner. Pointer arguments are locals or borrowed values, slices and
        // arrays valid for the duration of the call, with their lengths passed beside them; out
        // pointers are the wrapper's own locals, and info queries pass NULL with a size of 0 or a
        // buffer of the size given. Host memory that an enqueued command reads or writes after the
        // call returns is the caller's contract of the `unsafe fn` wrappers. The comment over each
        // invocation adds what its arguments need.
        unsafe { ($s.cl.fns.$f)($($a),*) }
    };
    (@status $call:literal, $t:tt, $s:ident, $f:ident, ($($a:expr),*)) => {
        check($call, cl_wrappers!(@call $s, $f, ($($a),*)))
    };
    (@enqueue $call:literal, $t:tt, $s:ident, $f:ident, ($($a:expr),*)) => {
        cl_wrappers!(@enqueue_waiting $call, $t, $s, $f, ($($a,)* 0, std::ptr::null()))
    };
    (@enqueue_waiting $call:literal, $t:tt, $s:ident, $f:ident, ($($a:expr),*)) => {{
        let mut ev: cl_event = std::ptr::null_mut();
        let r = cl_wrappers!(@call $s, $f, ($($a,)* &mut ev));
        ret($call, r, ev, |raw| Event { raw, cl: $s.cl })
    }};
    (@create $call:literal, $t:tt, $s:ident, $f:ident, ($($a:expr),*)) => {{
        let mut err = CL_SUCCESS;
        let raw = cl_wrappers!(@call $s, $f, ($($a,)* &mut err));
        ret($call, err, raw, |raw| $t { raw, cl: $s.cl })
    }};
    (@info $call:literal, $t:tt, $s:ident, $f:ident, ($($a:expr),*)) => {
        info_value($call, |n, v, r| cl_wrappers!(@call $s, $f, ($($a,)* n, v, r)))
    };
    (@info_string $call:literal, $t:tt, $s:ident, $f:ident, ($($a:expr),*)) => {
        info_bytes($call, |n, v, r| cl_wrappers!(@call $s, $f, ($($a,)* n, v, r))).map(c_string)
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident($($params:tt)*) -> ClResult<$t:tt>
        => $kind:ident $call:literal $(let $p:pat = $e:expr;)*
        ($s:ident.cl.fns.$f:ident)($($a:expr),* $(,)?); $($rest:tt)*) => {
        $(#[$m])*
        $vis fn $name($($params)*) -> ClResult<$t> {
            $(let $p = $e;)*
            cl_wrappers!(@$kind $call, $t, $s, $f, ($($a),*))
        }
        cl_wrappers!($($rest)*);
    };
    ($(#[$m:meta])* $vis:vis unsafe fn $name:ident($($params:tt)*) -> ClResult<$t:tt>
        => $kind:ident $call:literal $(let $p:pat = $e:expr;)*
        ($s:ident.cl.fns.$f:ident)($($a:expr),* $(,)?); $($rest:tt)*) => {
        $(#[$m])*
        $vis unsafe fn $name($($params)*) -> ClResult<$t> {
            $(let $p = $e;)*
            cl_wrappers!(@$kind $call, $t, $s, $f, ($($a),*))
        }
        cl_wrappers!($($rest)*);
    };
}

impl Cl {
    /// Every platform.
    ///
    /// # Errors
    /// `clGetPlatformIDs` failures (`CL_PLATFORM_NOT_FOUND_KHR` when no driver is installed).
    pub fn platforms(&'static self) -> ClResult<Vec<Platform>> {
        let mut n: cl_uint = 0;
        // SAFETY: counting call: NULL list, `n` is a valid out pointer.
        let r = unsafe { (self.fns.get_platform_ids)(0, std::ptr::null_mut(), &mut n) };
        check("clGetPlatformIDs", r)?;
        let mut ids = vec![std::ptr::null_mut(); n as usize];
        if n > 0 {
            // SAFETY: `ids` holds `n` entries.
            let r =
                unsafe { (self.fns.get_platform_ids)(n, ids.as_mut_ptr(), std::ptr::null_mut()) };
            check("clGetPlatformIDs", r)?;
        }
        Ok(ids
            .into_iter()
            .map(|id| Platform { id, cl: self })
            .collect())
    }
}

/// An OpenCL platform (not reference counted).
#[derive(Clone, Copy)]
pub struct Platform {
    id: cl_platform_id,
    cl: &'static Cl,
}

// SAFETY: a platform id is an immutable, process-wide identifier; OpenCL calls on it are
// thread-safe (OpenCL 1.2 appendix A.2).
unsafe impl Send for Platform {}
// SAFETY: as above.
unsafe impl Sync for Platform {}

impl Platform {
    cl_wrappers! {
        fn info(&self, param: cl_uint) -> ClResult<String>
            // SAFETY: `v` is NULL (with n = 0) or a buffer of `n` bytes; `r` NULL or valid.
            => info_string "clGetPlatformInfo" (self.cl.fns.get_platform_info)(self.id, param);
    }

    /// `CL_PLATFORM_NAME`.
    ///
    /// # Errors
    /// Driver failures.
    pub fn name(&self) -> ClResult<String> {
        self.info(CL_PLATFORM_NAME)
    }

    /// Every device of the platform (any type). No device is an empty list, not an error.
    ///
    /// # Errors
    /// Driver failures.
    pub fn devices(&self) -> ClResult<Vec<DeviceId>> {
        let f = self.cl.fns.get_device_ids;
        let mut n: cl_uint = 0;
        // SAFETY: counting call: NULL list, `n` valid.
        let r = unsafe { f(self.id, CL_DEVICE_TYPE_ALL, 0, std::ptr::null_mut(), &mut n) };
        if r == CL_DEVICE_NOT_FOUND {
            return Ok(Vec::new());
        }
        check("clGetDeviceIDs", r)?;
        let mut ids = vec![std::ptr::null_mut(); n as usize];
        if n > 0 {
            // SAFETY: `ids` holds `n` entries.
            let r = unsafe {
                f(
                    self.id,
                    CL_DEVICE_TYPE_ALL,
                    n,
                    ids.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            check("clGetDeviceIDs", r)?;
        }
        Ok(ids
            .into_iter()
            .map(|id| DeviceId { id, cl: self.cl })
            .collect())
    }
}

/// An OpenCL device of a platform (root devices are not reference counted).
#[derive(Clone, Copy)]
pub struct DeviceId {
    id: cl_device_id,
    cl: &'static Cl,
}

// SAFETY: a root device id is an immutable process-wide identifier; calls are thread-safe.
unsafe impl Send for DeviceId {}
// SAFETY: as above.
unsafe impl Sync for DeviceId {}

impl DeviceId {
    fn get(&self, param: cl_uint, n: usize, v: *mut c_void, r: *mut usize) -> cl_int {
        // SAFETY: `v` is NULL (n = 0) or a writable buffer of `n` bytes; `r` NULL or valid
        // (callers in this file).
        unsafe { (self.cl.fns.get_device_info)(self.id, param, n, v, r) }
    }

    /// A string parameter.
    ///
    /// # Errors
    /// Driver failures (`CL_INVALID_VALUE` for a parameter the device does not know).
    pub fn string(&self, param: u32) -> ClResult<String> {
        info_bytes("clGetDeviceInfo", |n, v, r| self.get(param, n, v, r)).map(c_string)
    }

    /// A `cl_uint` parameter.
    ///
    /// # Errors
    /// Driver failures.
    pub fn uint(&self, param: u32) -> ClResult<u32> {
        info_value("clGetDeviceInfo", |n, v, r| self.get(param, n, v, r))
    }

    /// A `cl_ulong` (or `cl_bitfield`) parameter.
    ///
    /// # Errors
    /// Driver failures.
    pub fn ulong(&self, param: u32) -> ClResult<u64> {
        info_value("clGetDeviceInfo", |n, v, r| self.get(param, n, v, r))
    }

    /// A `size_t` parameter.
    ///
    /// # Errors
    /// Driver failures.
    pub fn size(&self, param: u32) -> ClResult<usize> {
        info_value("clGetDeviceInfo", |n, v, r| self.get(param, n, v, r))
    }

    /// A `size_t[]` parameter.
    ///
    /// # Errors
    /// Driver failures.
    pub fn sizes(&self, param: u32) -> ClResult<Vec<usize>> {
        let bytes = info_bytes("clGetDeviceInfo", |n, v, r| self.get(param, n, v, r))?;
        Ok(bytes
            .chunks_exact(std::mem::size_of::<usize>())
            .map(|c| {
                let mut a = [0u8; std::mem::size_of::<usize>()];
                a.copy_from_slice(c);
                usize::from_ne_bytes(a)
            })
            .collect())
    }
}

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $retain:ident, $release:ident) => {
        $(#[$doc])*
        pub struct $name {
            raw: Handle,
            cl: &'static Cl,
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: `raw` is a live object of which this value owns one reference.
                let _ = unsafe { (self.cl.fns.$release)(self.raw) };
            }
        }

        impl Clone for $name {
            fn clone(&self) -> Self {
                // SAFETY: `raw` is live (we own a reference); the clone owns the new one.
                let _ = unsafe { (self.cl.fns.$retain)(self.raw) };
                Self { raw: self.raw, cl: self.cl }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.raw as usize)
            }
        }
    };
}

macro_rules! thread_safe {
    ($($name:ident),*) => {
        $(
            // SAFETY: OpenCL objects are reference counted and every call on them is
            // thread-safe (OpenCL 1.2 appendix A.2); `Kernel`, whose argument setters are not,
            // is left out.
            unsafe impl Send for $name {}
            // SAFETY: as above.
            unsafe impl Sync for $name {}
        )*
    };
}

handle!(
    /// A `cl_context`.
    Context,
    retain_context,
    release_context
);
handle!(
    /// A `cl_command_queue` (in order, with profiling).
    Queue,
    retain_command_queue,
    release_command_queue
);
handle!(
    /// A `cl_mem` buffer.
    Mem,
    retain_mem_object,
    release_mem_object
);
handle!(
    /// A `cl_event`.
    Event,
    retain_event,
    release_event
);
handle!(
    /// A `cl_program`.
    Program,
    retain_program,
    release_program
);
thread_safe!(Context, Queue, Mem, Event, Program);

/// A `cl_kernel`. `Send` but not `Sync`: `clSetKernelArg` is not thread-safe on one kernel.
pub struct Kernel {
    raw: Handle,
    cl: &'static Cl,
}

// SAFETY: a kernel may be used from any thread, one at a time (`&mut self` setters, no `Sync`).
unsafe impl Send for Kernel {}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: `raw` is a live kernel of which this value owns one reference; queued launches
        // hold their own.
        let _ = unsafe { (self.cl.fns.release_kernel)(self.raw) };
    }
}

fn ret<T>(
    call: &'static str,
    err: cl_int,
    raw: Handle,
    make: impl FnOnce(Handle) -> T,
) -> ClResult<T> {
    check(call, err)?;
    if raw.is_null() {
        return Err(ClError {
            call,
            code: CL_OUT_OF_HOST_MEMORY,
        });
    }
    Ok(make(raw))
}

impl Context {
    /// A context over `devices` (all of one platform).
    ///
    /// # Errors
    /// Driver failures.
    pub fn new(devices: &[DeviceId]) -> ClResult<Self> {
        let cl = devices.first().map(|d| d.cl).ok_or(ClError {
            call: "clCreateContext",
            code: -30,
        })?;
        let ids: Vec<cl_device_id> = devices.iter().map(|d| d.id).collect();
        let mut err = CL_SUCCESS;
        // SAFETY: `ids` holds `len` device ids of one platform; no properties, no callback.
        let raw = unsafe {
            (cl.fns.create_context)(
                std::ptr::null(),
                ids.len() as cl_uint,
                ids.as_ptr(),
                None,
                std::ptr::null_mut(),
                &mut err,
            )
        };
        ret("clCreateContext", err, raw, |raw| Self { raw, cl })
    }

    cl_wrappers! {
        /// An in-order command queue on `dev` with profiling enabled (`clCreateCommandQueue`).
        ///
        /// # Errors
        /// Driver failures.
        pub fn queue(&self, dev: DeviceId) -> ClResult<Queue>
            // SAFETY: live context and one of its devices.
            => create "clCreateCommandQueue"
            (self.cl.fns.create_command_queue)(self.raw, dev.id, CL_QUEUE_PROFILING_ENABLE);

        /// A read-write buffer of `size` bytes.
        ///
        /// # Errors
        /// Driver failures (`CL_INVALID_BUFFER_SIZE`, `CL_MEM_OBJECT_ALLOCATION_FAILURE`,
        /// `CL_OUT_OF_RESOURCES`, `CL_OUT_OF_HOST_MEMORY`).
        pub fn buffer(&self, size: usize) -> ClResult<Mem>
            // SAFETY: live context; no host pointer.
            => create "clCreateBuffer"
            (self.cl.fns.create_buffer)(self.raw, CL_MEM_READ_WRITE, size, std::ptr::null_mut());

        /// A user event (`clCreateUserEvent`), complete once [`Event::complete_user`] is called.
        ///
        /// # Errors
        /// Driver failures.
        pub fn user_event(&self) -> ClResult<Event>
            // SAFETY: live context.
            => create "clCreateUserEvent" (self.cl.fns.create_user_event)(self.raw);

        /// A program from OpenCL C source (not built yet).
        ///
        /// # Errors
        /// Driver failures.
        pub fn program(&self, source: &str) -> ClResult<Program>
            => create "clCreateProgramWithSource"
            let ptr = source.as_ptr().cast::<c_char>();
            let len = source.len();
            // SAFETY: one string of `len` bytes (lengths given, so no NUL is needed); the driver
            // copies it.
            (self.cl.fns.create_program_with_source)(self.raw, 1, &ptr, &len);
    }
}

fn wait_list(events: &[&Event]) -> (cl_uint, Vec<cl_event>) {
    let v: Vec<cl_event> = events.iter().map(|e| e.raw).collect();
    (v.len() as cl_uint, v)
}

fn list_ptr(v: &[cl_event]) -> *const cl_event {
    if v.is_empty() {
        std::ptr::null()
    } else {
        v.as_ptr()
    }
}

/// One side of a rectangular copy: where the rectangle starts (`origin[0]` in bytes, then rows
/// and slices) and the bytes between rows and between slices.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Rect {
    /// Bytes, rows, slices.
    pub origin: [usize; 3],
    /// Bytes from one row to the next.
    pub row_pitch: usize,
    /// Bytes from one slice to the next.
    pub slice_pitch: usize,
}

impl Mem {
    /// The `cl_mem` value (kiln's `DevicePtr` for the buffer).
    pub fn raw(&self) -> usize {
        self.raw as usize
    }
}

impl Queue {
    cl_wrappers! {
        /// `clEnqueueWriteBuffer`, non-blocking: `n` bytes from `host` to `mem + offset`.
        ///
        /// # Errors
        /// Driver failures.
        ///
        /// # Safety
        /// - `host` is readable for `n` bytes until the command completes (the queue is finished
        ///   or an event after it has completed).
        pub unsafe fn write(&self, mem: &Mem, offset: usize, n: usize, host: *const u8)
            -> ClResult<Event>
            // SAFETY: live queue and buffer of one context; `host` valid for `n` bytes until the
            // command completes (caller).
            => enqueue "clEnqueueWriteBuffer"
            (self.cl.fns.enqueue_write_buffer)(self.raw, mem.raw, CL_FALSE, offset, n, host.cast());

        /// `clEnqueueReadBuffer`, non-blocking: `n` bytes from `mem + offset` to `host`.
        ///
        /// # Errors
        /// Driver failures.
        ///
        /// # Safety
        /// - `host` is writable for `n` bytes until the command completes, and nothing else reads
        ///   or writes it meanwhile.
        pub unsafe fn read(&self, mem: &Mem, offset: usize, n: usize, host: *mut u8)
            -> ClResult<Event>
            // SAFETY: as the caller's contract.
            => enqueue "clEnqueueReadBuffer"
            (self.cl.fns.enqueue_read_buffer)(self.raw, mem.raw, CL_FALSE, offset, n, host.cast());

        /// `clEnqueueCopyBuffer`: `n` bytes from `src + src_off` to `dst + dst_off`.
        ///
        /// # Errors
        /// Driver failures (`CL_MEM_COPY_OVERLAP` for overlapping ranges of one buffer).
        pub fn copy(&self, src: &Mem, dst: &Mem, src_off: usize, dst_off: usize, n: usize)
            -> ClResult<Event>
            // SAFETY: live queue and buffers; the driver checks the ranges.
            => enqueue "clEnqueueCopyBuffer"
            (self.cl.fns.enqueue_copy_buffer)(self.raw, src.raw, dst.raw, src_off, dst_off, n);

        /// `clEnqueueWriteBufferRect`, non-blocking: `region` (bytes, rows, slices) from the host
        /// rectangle at `host` to the buffer rectangle.
        ///
        /// # Errors
        /// Driver failures.
        ///
        /// # Safety
        /// - Every byte of the host rectangle (`host_rect` over `region` from `host`) is readable
        ///   until the command completes.
        pub unsafe fn write_rect(
            &self, mem: &Mem, buf: Rect, host: *const u8, host_rect: Rect, region: [usize; 3],
        ) -> ClResult<Event>
            // SAFETY: live queue and buffer; the three arrays hold 3 entries; the host rectangle
            // is readable until completion (caller); the driver checks the buffer rectangle.
            => enqueue "clEnqueueWriteBufferRect"
            (self.cl.fns.enqueue_write_buffer_rect)(
                self.raw, mem.raw, CL_FALSE,
                buf.origin.as_ptr(), host_rect.origin.as_ptr(), region.as_ptr(),
                buf.row_pitch, buf.slice_pitch, host_rect.row_pitch, host_rect.slice_pitch,
                host.cast(),
            );

        /// `clEnqueueReadBufferRect`, non-blocking: `region` from the buffer rectangle to the
        /// host rectangle at `host`.
        ///
        /// # Errors
        /// Driver failures.
        ///
        /// # Safety
        /// - Every byte of the host rectangle is writable until the command completes, and
        ///   nothing else accesses it meanwhile.
        pub unsafe fn read_rect(
            &self, mem: &Mem, buf: Rect, host: *mut u8, host_rect: Rect, region: [usize; 3],
        ) -> ClResult<Event>
            // SAFETY: as `write_rect`, with the host rectangle writable (caller).
            => enqueue "clEnqueueReadBufferRect"
            (self.cl.fns.enqueue_read_buffer_rect)(
                self.raw, mem.raw, CL_FALSE,
                buf.origin.as_ptr(), host_rect.origin.as_ptr(), region.as_ptr(),
                buf.row_pitch, buf.slice_pitch, host_rect.row_pitch, host_rect.slice_pitch,
                host.cast(),
            );

        /// `clEnqueueCopyBufferRect`: `region` from the `src` rectangle to the `dst` rectangle.
        ///
        /// # Errors
        /// Driver failures (`CL_MEM_COPY_OVERLAP` for overlapping rectangles of one buffer).
        pub fn copy_rect(&self, src: &Mem, dst: &Mem, s: Rect, d: Rect, region: [usize; 3])
            -> ClResult<Event>
            // SAFETY: live queue and buffers; 3-entry arrays; the driver checks both rectangles.
            => enqueue "clEnqueueCopyBufferRect"
            (self.cl.fns.enqueue_copy_buffer_rect)(
                self.raw, src.raw, dst.raw,
                s.origin.as_ptr(), d.origin.as_ptr(), region.as_ptr(),
                s.row_pitch, s.slice_pitch, d.row_pitch, d.slice_pitch,
            );

        /// `clEnqueueFillBuffer` with a one-byte pattern.
        ///
        /// # Errors
        /// Driver failures.
        pub fn fill(&self, mem: &Mem, value: u8, offset: usize, n: usize) -> ClResult<Event>
            => enqueue "clEnqueueFillBuffer"
            let pattern = value;
            // SAFETY: live queue and buffer; the pattern is copied by the call (OpenCL 1.2
            // §5.2.2: "the memory associated with pattern can be reused or freed after the
            // function returns").
            (self.cl.fns.enqueue_fill_buffer)(
                self.raw, mem.raw, (&pattern as *const u8).cast(), 1, offset, n,
            );

        /// `clFinish`: blocks until every queued command has completed.
        ///
        /// # Errors
        /// Driver failures.
        pub fn finish(&self) -> ClResult<()>
            // SAFETY: live queue.
            => status "clFinish" (self.cl.fns.finish)(self.raw);

        /// `clFlush`: submits the queued commands to the device.
        ///
        /// # Errors
        /// Driver failures.
        pub fn flush(&self) -> ClResult<()>
            // SAFETY: live queue.
            => status "clFlush" (self.cl.fns.flush)(self.raw);

        /// `clEnqueueMarkerWithWaitList` with no wait list: an event complete when everything
        /// queued before it is.
        ///
        /// # Errors
        /// Driver failures.
        pub fn marker(&self) -> ClResult<Event>
            // SAFETY: live queue; `ev` a valid out pointer.
            => enqueue "clEnqueueMarkerWithWaitList"
            (self.cl.fns.enqueue_marker_with_wait_list)(self.raw);

        /// `clEnqueueBarrierWithWaitList`: commands queued after it wait for `events`.
        ///
        /// # Errors
        /// Driver failures.
        pub fn barrier(&self, events: &[&Event]) -> ClResult<Event>
            => enqueue_waiting "clEnqueueBarrierWithWaitList"
            let (n, v) = wait_list(events);
            // SAFETY: live queue; `v` holds `n` live events of the same context (callers keep
            // events per device, and devices of one platform share a context).
            (self.cl.fns.enqueue_barrier_with_wait_list)(self.raw, n, list_ptr(&v));

        /// `clEnqueueNDRangeKernel` over `dims` axes (1..=3) with the kernel's arguments as set.
        ///
        /// # Errors
        /// Driver failures.
        pub fn launch(&self, kernel: &Kernel, dims: usize, global: &[usize; 3], local: &[usize; 3])
            -> ClResult<Event>
            // SAFETY: live queue and kernel of one context; `global`/`local` hold 3 >= dims
            // entries; the driver retains the kernel and its arguments for the queued command.
            => enqueue "clEnqueueNDRangeKernel"
            (self.cl.fns.enqueue_nd_range_kernel)(
                self.raw, kernel.raw, dims.clamp(1, 3) as cl_uint,
                std::ptr::null(), global.as_ptr(), local.as_ptr(),
            );
    }
}

/// A host callback run by [`Event::on_complete`]; receives the event's final status.
pub type EventClosure = Box<dyn FnOnce(cl_int) + Send + 'static>;

/// The `pfn_notify` of `clSetEventCallback`: runs the boxed closure once. Panics are caught here,
/// because unwinding into the driver's C frames is undefined behaviour.
///
/// # Safety
/// - `user_data` came from `Box::into_raw(Box<EventClosure>)` in [`Event::on_complete`], and the
///   driver calls this once per registration.
unsafe extern "C" fn event_trampoline(_ev: cl_event, status: cl_int, user_data: *mut c_void) {
    if user_data.is_null() {
        return;
    }
    // SAFETY: a leaked `Box<EventClosure>`, reclaimed once (caller's contract).
    let cb = unsafe { Box::from_raw(user_data.cast::<EventClosure>()) };
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || cb(status))) {
        log::error!(
            "an OpenCL event callback panicked: {}",
            crate::util::panic_message(&*p)
        );
    }
}

impl Event {
    cl_wrappers! {
        /// `CL_EVENT_COMMAND_EXECUTION_STATUS`: `CL_COMPLETE` (0), a positive state, or a
        /// negative error code of the failed command.
        ///
        /// # Errors
        /// Driver failures.
        pub fn status(&self) -> ClResult<cl_int>
            // SAFETY: live event; `v` holds `n` bytes.
            => info "clGetEventInfo"
            (self.cl.fns.get_event_info)(self.raw, CL_EVENT_COMMAND_EXECUTION_STATUS);

        /// `clWaitForEvents` on this event.
        ///
        /// # Errors
        /// Driver failures (`CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST` when the command
        /// failed).
        pub fn wait(&self) -> ClResult<()>
            // SAFETY: one live event.
            => status "clWaitForEvents" (self.cl.fns.wait_for_events)(1, &self.raw);

        /// `CL_PROFILING_COMMAND_END`, in nanoseconds of the device clock.
        ///
        /// # Errors
        /// `CL_PROFILING_INFO_NOT_AVAILABLE` when the driver keeps no timestamps for the command.
        pub fn end_time_ns(&self) -> ClResult<u64>
            // SAFETY: live event; `v` holds `n` bytes.
            => info "clGetEventProfilingInfo"
            (self.cl.fns.get_event_profiling_info)(self.raw, CL_PROFILING_COMMAND_END);
    }

    /// Runs `cb` on a driver thread when the event completes (or fails: the status says which),
    /// through `clSetEventCallback`. On error `cb` is dropped without running.
    ///
    /// # Errors
    /// Driver failures.
    pub fn on_complete(&self, cb: EventClosure) -> ClResult<()> {
        let user: *mut c_void = Box::into_raw(Box::new(cb)).cast();
        // SAFETY: live event; the trampoline matches `pfn_event_notify` and `user` is the leaked
        // box it expects, called once for `CL_COMPLETE`.
        let r = unsafe {
            (self.cl.fns.set_event_callback)(self.raw, CL_COMPLETE, event_trampoline, user)
        };
        if r != CL_SUCCESS {
            // SAFETY: the driver refused the callback and will never call the trampoline with
            // `user`: we own the box again.
            drop(unsafe { Box::from_raw(user.cast::<EventClosure>()) });
        }
        check("clSetEventCallback", r)
    }

    cl_wrappers! {
        /// Completes a user event (`clSetUserEventStatus(CL_COMPLETE)`).
        ///
        /// # Errors
        /// Driver failures (`CL_INVALID_EVENT` for an event that is not a user event).
        pub fn complete_user(&self) -> ClResult<()>
            // SAFETY: live event.
            => status "clSetUserEventStatus"
            (self.cl.fns.set_user_event_status)(self.raw, CL_COMPLETE);
    }
}

impl Program {
    /// `clBuildProgram` for one device. On failure the error comes with the build log.
    ///
    /// # Errors
    /// The failed call and the driver's build log for `dev`.
    pub fn build(&self, dev: DeviceId, options: &str) -> Result<(), (ClError, String)> {
        let opts = CString::new(options.replace('\0', " ")).unwrap_or_default();
        // SAFETY: live program; one device of its context; NUL-terminated options; synchronous
        // (no callback).
        let r = unsafe {
            (self.cl.fns.build_program)(
                self.raw,
                1,
                &dev.id,
                opts.as_ptr(),
                None,
                std::ptr::null_mut(),
            )
        };
        match check("clBuildProgram", r) {
            Ok(()) => Ok(()),
            Err(e) => Err((e, self.build_log(dev).unwrap_or_default())),
        }
    }

    cl_wrappers! {
        /// `CL_PROGRAM_BUILD_LOG` for `dev`.
        ///
        /// # Errors
        /// Driver failures.
        pub fn build_log(&self, dev: DeviceId) -> ClResult<String>
            // SAFETY: live program, one of its devices; `v` holds `n` bytes.
            => info_string "clGetProgramBuildInfo"
            (self.cl.fns.get_program_build_info)(self.raw, dev.id, CL_PROGRAM_BUILD_LOG);

        /// `CL_PROGRAM_KERNEL_NAMES`: the kernels of the built program, `;`-separated.
        fn kernel_name_list(&self) -> ClResult<String>
            // SAFETY: live, built program; `v` holds `n` bytes.
            => info_string "clGetProgramInfo"
            (self.cl.fns.get_program_info)(self.raw, CL_PROGRAM_KERNEL_NAMES);
    }

    /// The kernels of the built program (`CL_PROGRAM_KERNEL_NAMES`).
    ///
    /// # Errors
    /// Driver failures.
    pub fn kernel_names(&self) -> ClResult<Vec<String>> {
        let s = self.kernel_name_list()?;
        Ok(s.split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect())
    }

    cl_wrappers! {
        /// `clCreateKernel`.
        ///
        /// # Errors
        /// Driver failures (`CL_INVALID_KERNEL_NAME`).
        pub fn kernel(&self, name: &str) -> ClResult<Kernel>
            => create "clCreateKernel"
            let cname = CString::new(name).map_err(|_| ClError {
                call: "clCreateKernel",
                code: -46,
            })?;
            // SAFETY: live, built program; NUL-terminated name.
            (self.cl.fns.create_kernel)(self.raw, cname.as_ptr());
    }
}

impl Kernel {
    cl_wrappers! {
        /// `CL_KERNEL_NUM_ARGS`.
        ///
        /// # Errors
        /// Driver failures.
        pub fn num_args(&self) -> ClResult<u32>
            // SAFETY: live kernel; `v` holds `n` bytes.
            => info "clGetKernelInfo" (self.cl.fns.get_kernel_info)(self.raw, CL_KERNEL_NUM_ARGS);

        /// `CL_KERNEL_WORK_GROUP_SIZE` on `dev`: the largest work-group this kernel can run with.
        ///
        /// # Errors
        /// Driver failures.
        pub fn work_group_size(&self, dev: DeviceId) -> ClResult<usize>
            // SAFETY: live kernel, a device of its program; `v` holds `n` bytes.
            => info "clGetKernelWorkGroupInfo"
            (self.cl.fns.get_kernel_work_group_info)(self.raw, dev.id, CL_KERNEL_WORK_GROUP_SIZE);

        /// `CL_KERNEL_ARG_ADDRESS_QUALIFIER` of parameter `index` (`CL_KERNEL_ARG_ADDRESS_*`);
        /// needs a program built with `-cl-kernel-arg-info`.
        ///
        /// # Errors
        /// Driver failures (`CL_KERNEL_ARG_INFO_NOT_AVAILABLE`).
        pub fn arg_address_qualifier(&self, index: u32) -> ClResult<u32>
            // SAFETY: live kernel; `v` holds `n` bytes.
            => info "clGetKernelArgInfo"
            (self.cl.fns.get_kernel_arg_info)(self.raw, index, CL_KERNEL_ARG_ADDRESS_QUALIFIER);

        /// `CL_KERNEL_ARG_TYPE_NAME` of parameter `index` (`"float*"`).
        ///
        /// # Errors
        /// Driver failures (`CL_KERNEL_ARG_INFO_NOT_AVAILABLE`).
        pub fn arg_type_name(&self, index: u32) -> ClResult<String>
            // SAFETY: live kernel; `v` is NULL (n = 0) or holds `n` bytes.
            => info_string "clGetKernelArgInfo"
            (self.cl.fns.get_kernel_arg_info)(self.raw, index, CL_KERNEL_ARG_TYPE_NAME);

        /// Sets argument `index` to a buffer.
        ///
        /// # Errors
        /// Driver failures.
        pub fn set_arg_mem(&mut self, index: u32, mem: &Mem) -> ClResult<()>
            => status "clSetKernelArg"
            let raw = mem.raw;
            // SAFETY: live kernel (exclusive: `&mut self`); the value is a `cl_mem` of the same
            // context, read during the call.
            (self.cl.fns.set_kernel_arg)(
                self.raw, index, std::mem::size_of::<cl_mem>(), (&raw as *const cl_mem).cast(),
            );

        /// Sets argument `index` to the bytes of a scalar.
        ///
        /// # Errors
        /// Driver failures (`CL_INVALID_ARG_SIZE` when the size does not match the parameter).
        pub fn set_arg_bytes(&mut self, index: u32, bytes: &[u8]) -> ClResult<()>
            // SAFETY: live kernel (exclusive); `bytes` valid for its length, read during the
            // call.
            => status "clSetKernelArg"
            (self.cl.fns.set_kernel_arg)(self.raw, index, bytes.len(), bytes.as_ptr().cast());
    }
}
