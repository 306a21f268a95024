//! The raw C ABI of `include/kiln/device_plugin.h` (the header is the source of truth; layouts are
//! asserted below and compared with the header by `tests/plugin_abi.rs`) and the only `unsafe`
//! code of the plugin loader: opening the library, calling the entry, copying the table, and one
//! checked wrapper per table entry.
//!
//! C spellings stay in this file. Every call into the plugin goes through [`RawPlugin`], whose
//! methods take plain Rust values; the pointers they pass are either device addresses (opaque,
//! never dereferenced by kiln) or host buffers whose validity the caller guarantees.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::sync::Arc;

use super::PluginError;
use crate::packed_func::ffi::TVMFFISafeCallType;
use crate::packed_func::PackedFunc;
use crate::util::panic_message;

/// `KILN_PLUGIN_ABI_MAJOR`.
pub const KILN_PLUGIN_ABI_MAJOR: u32 = 1;
/// `KILN_PLUGIN_ABI_MINOR`.
pub const KILN_PLUGIN_ABI_MINOR: u32 = 2;
/// `KILN_PLUGIN_ENTRY_SYMBOL`.
pub const KILN_PLUGIN_ENTRY_SYMBOL: &str = "kiln_device_plugin_init";
/// `KILN_PLUGIN_MIN_ALIGNMENT`.
pub const KILN_PLUGIN_MIN_ALIGNMENT: usize = 256;
/// The most kernels kiln takes from `get_kernels`.
pub const MAX_KERNELS: usize = 1 << 16;
/// `KILN_ATTR_STRING_CAPACITY`.
pub const KILN_ATTR_STRING_CAPACITY: usize = 256;

/// `KilnStatus`: 0 is success.
pub type KilnStatus = i32;
/// `KILN_STATUS_SUCCESS`.
pub const KILN_STATUS_SUCCESS: KilnStatus = 0;
/// `KILN_STATUS_ERROR`.
pub const KILN_STATUS_ERROR: KilnStatus = 1;
/// `KILN_STATUS_OUT_OF_MEMORY`.
pub const KILN_STATUS_OUT_OF_MEMORY: KilnStatus = 2;
/// `KILN_STATUS_INVALID_ARGUMENT`.
pub const KILN_STATUS_INVALID_ARGUMENT: KilnStatus = 3;
/// `KILN_STATUS_NOT_READY`.
pub const KILN_STATUS_NOT_READY: KilnStatus = 4;
/// `KILN_STATUS_UNSUPPORTED`.
pub const KILN_STATUS_UNSUPPORTED: KilnStatus = 5;
/// `KILN_STATUS_VERSION_MISMATCH`.
pub const KILN_STATUS_VERSION_MISMATCH: KilnStatus = 6;

/// `KILN_ATTR_KIND_PINNED_STAGING`: a kiln attribute kind (outside TVM's codes). A plugin that
/// answers it with a non-zero int asks kiln to stage asynchronous copies between its devices
/// and pageable host memory through its `host_memory_allocate` buffers.
pub const KILN_ATTR_KIND_PINNED_STAGING: i32 = 1000;
/// `KILN_ATTR_NONE`.
pub const KILN_ATTR_NONE: i32 = 0;
/// `KILN_ATTR_INT`.
pub const KILN_ATTR_INT: i32 = 1;
/// `KILN_ATTR_STRING`.
pub const KILN_ATTR_STRING: i32 = 2;

/// The name of a status code (`"OUT_OF_MEMORY"`).
pub fn status_name(s: KilnStatus) -> &'static str {
    match s {
        KILN_STATUS_SUCCESS => "SUCCESS",
        KILN_STATUS_ERROR => "ERROR",
        KILN_STATUS_OUT_OF_MEMORY => "OUT_OF_MEMORY",
        KILN_STATUS_INVALID_ARGUMENT => "INVALID_ARGUMENT",
        KILN_STATUS_NOT_READY => "NOT_READY",
        KILN_STATUS_UNSUPPORTED => "UNSUPPORTED",
        KILN_STATUS_VERSION_MISMATCH => "VERSION_MISMATCH",
        _ => "unknown status",
    }
}

/// `KilnStream`: an opaque plugin stream.
pub type KilnStream = *mut c_void;
/// `KilnEvent`: an opaque plugin event.
pub type KilnEvent = *mut c_void;
/// `KilnStreamCallback`.
pub type KilnStreamCallback = unsafe extern "C" fn(user_data: *mut c_void, status: KilnStatus);
/// `KilnSafeCall` (tvm-ffi's `TVMFFISafeCallType`).
pub type KilnSafeCall = TVMFFISafeCallType;

/// `KilnAttrValue`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KilnAttrValue {
    /// `struct_size` (kiln fills).
    pub struct_size: usize,
    /// `abi_major` (kiln fills).
    pub abi_major: u32,
    /// `abi_minor` (kiln fills).
    pub abi_minor: u32,
    /// `type`: `KILN_ATTR_*`.
    pub type_: i32,
    /// `reserved`.
    pub reserved: i32,
    /// `int_value`.
    pub int_value: i64,
    /// `string_value`, NUL-terminated.
    pub string_value: [c_char; KILN_ATTR_STRING_CAPACITY],
}

/// `KilnPluginKernel`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KilnPluginKernel {
    /// `struct_size`, also the array stride.
    pub struct_size: usize,
    /// `abi_major`.
    pub abi_major: u32,
    /// `abi_minor`.
    pub abi_minor: u32,
    /// `name`.
    pub name: *const c_char,
    /// `call`.
    pub call: Option<KilnSafeCall>,
    /// `self`.
    pub self_: *mut c_void,
}

type Fv = Option<unsafe extern "C" fn() -> KilnStatus>;
type Fd = Option<unsafe extern "C" fn(i32) -> KilnStatus>;
type FdSz = Option<unsafe extern "C" fn(i32, *mut usize) -> KilnStatus>;
type FSz = Option<unsafe extern "C" fn(*mut usize) -> KilnStatus>;
type FAlloc = Option<unsafe extern "C" fn(i32, *mut *mut c_void, usize) -> KilnStatus>;
type FFree = Option<unsafe extern "C" fn(i32, *mut c_void, usize) -> KilnStatus>;
type FCopy = Option<unsafe extern "C" fn(i32, *mut c_void, *const c_void, usize) -> KilnStatus>;
type FP2p = Option<unsafe extern "C" fn(i32, i32, *mut c_void, *const c_void, usize) -> KilnStatus>;
type FACopy =
    Option<unsafe extern "C" fn(i32, KilnStream, *mut c_void, *const c_void, usize) -> KilnStatus>;
type FAP2p = Option<
    unsafe extern "C" fn(i32, i32, KilnStream, *mut c_void, *const c_void, usize) -> KilnStatus,
>;
type FStream = Option<unsafe extern "C" fn(i32, KilnStream) -> KilnStatus>;
type FEvent = Option<unsafe extern "C" fn(i32, KilnEvent) -> KilnStatus>;

/// `KilnDeviceInterface`: the function table. Field docs are in the header.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct KilnDeviceInterface {
    pub struct_size: usize,
    pub abi_major: u32,
    pub abi_minor: u32,
    // device
    pub initialize: Fv,
    pub finalize: Fv,
    pub init_device: Fd,
    pub deinit_device: Fd,
    pub set_device: Fd,
    pub get_device: Option<unsafe extern "C" fn(*mut i32) -> KilnStatus>,
    pub synchronize_device: Fd,
    pub get_device_count: FSz,
    pub get_device_list: FSz,
    pub get_compute_capability: FdSz,
    pub get_runtime_version: FSz,
    pub get_driver_version: FSz,
    // memory: allocation
    pub device_memory_allocate: FAlloc,
    pub device_memory_deallocate: FFree,
    pub host_memory_allocate: FAlloc,
    pub host_memory_deallocate: FFree,
    pub unified_memory_allocate: FAlloc,
    pub unified_memory_deallocate: FFree,
    // memory: copies
    pub memory_copy_h2d: FCopy,
    pub memory_copy_d2h: FCopy,
    pub memory_copy_d2d: FCopy,
    pub memory_copy_p2p: FP2p,
    pub async_memory_copy_h2d: FACopy,
    pub async_memory_copy_d2h: FACopy,
    pub async_memory_copy_d2d: FACopy,
    pub async_memory_copy_p2p: FAP2p,
    // memory: fill, stats, tuning
    pub device_memory_set: Option<unsafe extern "C" fn(i32, *mut c_void, u8, usize) -> KilnStatus>,
    pub device_memory_stats:
        Option<unsafe extern "C" fn(i32, *mut usize, *mut usize) -> KilnStatus>,
    pub device_min_chunk_size: FdSz,
    pub device_max_chunk_size: FdSz,
    pub device_max_alloc_size: FdSz,
    pub device_extra_padding_size: FdSz,
    pub device_init_alloc_size: FdSz,
    pub device_realloc_size: FdSz,
    // streams
    pub create_stream: Option<unsafe extern "C" fn(i32, *mut KilnStream) -> KilnStatus>,
    pub destroy_stream: FStream,
    pub query_stream: FStream,
    pub synchronize_stream: FStream,
    pub stream_add_callback: Option<
        unsafe extern "C" fn(i32, KilnStream, KilnStreamCallback, *mut c_void) -> KilnStatus,
    >,
    pub stream_wait_event: Option<unsafe extern "C" fn(i32, KilnStream, KilnEvent) -> KilnStatus>,
    // events
    pub create_event: Option<unsafe extern "C" fn(i32, *mut KilnEvent) -> KilnStatus>,
    pub destroy_event: FEvent,
    pub record_event: Option<unsafe extern "C" fn(i32, KilnStream, KilnEvent) -> KilnStatus>,
    pub query_event: FEvent,
    pub synchronize_event: FEvent,
    // errors
    pub get_last_error: Option<unsafe extern "C" fn() -> *const c_char>,
    // ABI 1.1
    pub get_attribute: Option<unsafe extern "C" fn(i32, i32, *mut KilnAttrValue) -> KilnStatus>,
    pub get_kernels:
        Option<unsafe extern "C" fn(*mut *const KilnPluginKernel, *mut usize) -> KilnStatus>,
    // ABI 1.2
    pub async_memory_set:
        Option<unsafe extern "C" fn(i32, KilnStream, *mut c_void, u8, usize) -> KilnStatus>,
}

/// `KilnPluginParams`.
#[repr(C)]
#[allow(missing_docs)]
pub struct KilnPluginParams {
    pub struct_size: usize,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub device_type: *const c_char,
    pub sub_device_type: *const c_char,
    pub plugin_version_major: u32,
    pub plugin_version_minor: u32,
    pub plugin_version_patch: u32,
    pub reserved: u32,
    pub interface: *const KilnDeviceInterface,
}

/// `KILN_DEVICE_INTERFACE_SIZE_1_0`: the table up to `get_last_error`.
pub const KILN_DEVICE_INTERFACE_SIZE_1_0: usize =
    offset_of!(KilnDeviceInterface, get_last_error) + size_of::<usize>();
/// `KILN_DEVICE_INTERFACE_SIZE_1_1`: the table up to `get_kernels`.
pub const KILN_DEVICE_INTERFACE_SIZE_1_1: usize =
    offset_of!(KilnDeviceInterface, get_kernels) + size_of::<usize>();
/// `KILN_DEVICE_INTERFACE_SIZE`: today's table.
pub const KILN_DEVICE_INTERFACE_SIZE: usize =
    offset_of!(KilnDeviceInterface, async_memory_set) + size_of::<usize>();
/// `KILN_PLUGIN_PARAMS_SIZE`.
pub const KILN_PLUGIN_PARAMS_SIZE: usize =
    offset_of!(KilnPluginParams, interface) + size_of::<usize>();

// Layout checks for LP64 (x86_64, aarch64): the header's sizes and offsets.
const _: () = {
    assert!(size_of::<KilnDeviceInterface>() == 16 + 49 * 8);
    assert!(KILN_DEVICE_INTERFACE_SIZE_1_1 == 16 + 48 * 8);
    assert!(KILN_DEVICE_INTERFACE_SIZE == size_of::<KilnDeviceInterface>());
    assert!(KILN_DEVICE_INTERFACE_SIZE_1_0 == 16 + 46 * 8);
    assert!(offset_of!(KilnDeviceInterface, initialize) == 16);
    assert!(offset_of!(KilnDeviceInterface, get_device_count) == 16 + 7 * 8);
    assert!(offset_of!(KilnDeviceInterface, device_memory_allocate) == 16 + 12 * 8);
    assert!(offset_of!(KilnDeviceInterface, memory_copy_h2d) == 16 + 18 * 8);
    assert!(offset_of!(KilnDeviceInterface, async_memory_copy_h2d) == 16 + 22 * 8);
    assert!(offset_of!(KilnDeviceInterface, device_memory_set) == 16 + 26 * 8);
    assert!(offset_of!(KilnDeviceInterface, create_stream) == 16 + 34 * 8);
    assert!(offset_of!(KilnDeviceInterface, create_event) == 16 + 40 * 8);
    assert!(offset_of!(KilnDeviceInterface, get_attribute) == 16 + 46 * 8);
    assert!(size_of::<KilnPluginParams>() == 56);
    assert!(offset_of!(KilnPluginParams, device_type) == 16);
    assert!(offset_of!(KilnPluginParams, plugin_version_major) == 32);
    assert!(offset_of!(KilnPluginParams, interface) == 48);
    assert!(KILN_PLUGIN_PARAMS_SIZE == 56);
    assert!(size_of::<KilnPluginKernel>() == 40);
    assert!(offset_of!(KilnPluginKernel, name) == 16);
    assert!(offset_of!(KilnPluginKernel, call) == 24);
    assert!(size_of::<KilnAttrValue>() == 32 + KILN_ATTR_STRING_CAPACITY);
    assert!(offset_of!(KilnAttrValue, int_value) == 24);
    assert!(offset_of!(KilnAttrValue, string_value) == 32);
};

/// The required entries, by name, with a check for each.
/// A named table entry and whether a table has it.
type EntryCheck = (&'static str, fn(&KilnDeviceInterface) -> bool);

const REQUIRED: &[EntryCheck] = &[
    ("get_device_count", |t| t.get_device_count.is_some()),
    ("device_memory_allocate", |t| {
        t.device_memory_allocate.is_some()
    }),
    ("device_memory_deallocate", |t| {
        t.device_memory_deallocate.is_some()
    }),
    ("memory_copy_h2d", |t| t.memory_copy_h2d.is_some()),
    ("memory_copy_d2h", |t| t.memory_copy_d2h.is_some()),
    ("memory_copy_d2d", |t| t.memory_copy_d2d.is_some()),
    ("create_stream", |t| t.create_stream.is_some()),
    ("destroy_stream", |t| t.destroy_stream.is_some()),
    ("synchronize_stream", |t| t.synchronize_stream.is_some()),
    ("stream_wait_event", |t| t.stream_wait_event.is_some()),
    ("create_event", |t| t.create_event.is_some()),
    ("destroy_event", |t| t.destroy_event.is_some()),
    ("record_event", |t| t.record_event.is_some()),
    ("synchronize_event", |t| t.synchronize_event.is_some()),
];

/// The optional entries, by name, with a check for each.
const OPTIONAL: &[EntryCheck] = &[
    ("initialize", |t| t.initialize.is_some()),
    ("finalize", |t| t.finalize.is_some()),
    ("init_device", |t| t.init_device.is_some()),
    ("deinit_device", |t| t.deinit_device.is_some()),
    ("set_device", |t| t.set_device.is_some()),
    ("get_device", |t| t.get_device.is_some()),
    ("synchronize_device", |t| t.synchronize_device.is_some()),
    ("get_device_list", |t| t.get_device_list.is_some()),
    ("get_compute_capability", |t| {
        t.get_compute_capability.is_some()
    }),
    ("get_runtime_version", |t| t.get_runtime_version.is_some()),
    ("get_driver_version", |t| t.get_driver_version.is_some()),
    ("host_memory_allocate", |t| t.host_memory_allocate.is_some()),
    ("unified_memory_allocate", |t| {
        t.unified_memory_allocate.is_some()
    }),
    ("memory_copy_p2p", |t| t.memory_copy_p2p.is_some()),
    ("async_memory_copy_h2d", |t| {
        t.async_memory_copy_h2d.is_some()
    }),
    ("async_memory_copy_d2h", |t| {
        t.async_memory_copy_d2h.is_some()
    }),
    ("async_memory_copy_d2d", |t| {
        t.async_memory_copy_d2d.is_some()
    }),
    ("async_memory_copy_p2p", |t| {
        t.async_memory_copy_p2p.is_some()
    }),
    ("device_memory_set", |t| t.device_memory_set.is_some()),
    ("device_memory_stats", |t| t.device_memory_stats.is_some()),
    ("device_min_chunk_size", |t| {
        t.device_min_chunk_size.is_some()
    }),
    ("device_max_chunk_size", |t| {
        t.device_max_chunk_size.is_some()
    }),
    ("device_max_alloc_size", |t| {
        t.device_max_alloc_size.is_some()
    }),
    ("device_extra_padding_size", |t| {
        t.device_extra_padding_size.is_some()
    }),
    ("device_init_alloc_size", |t| {
        t.device_init_alloc_size.is_some()
    }),
    ("device_realloc_size", |t| t.device_realloc_size.is_some()),
    ("query_stream", |t| t.query_stream.is_some()),
    ("stream_add_callback", |t| t.stream_add_callback.is_some()),
    ("query_event", |t| t.query_event.is_some()),
    ("get_last_error", |t| t.get_last_error.is_some()),
    ("get_attribute", |t| t.get_attribute.is_some()),
    ("get_kernels", |t| t.get_kernels.is_some()),
    ("async_memory_set", |t| t.async_memory_set.is_some()),
];

/// The optional entries `t` leaves out (kiln's fallbacks apply to them).
pub fn absent_optional_entries(t: &KilnDeviceInterface) -> Vec<&'static str> {
    OPTIONAL
        .iter()
        .filter(|(_, present)| !present(t))
        .map(|(n, _)| *n)
        .collect()
}

/// The names of the required entries (the loader's contract, listed in the header).
pub fn required_entries() -> impl Iterator<Item = &'static str> {
    REQUIRED.iter().map(|(n, _)| *n)
}

/// The required entries that `t` leaves NULL, plus optional pairs that are half present.
pub(crate) fn missing_entries(t: &KilnDeviceInterface) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = REQUIRED
        .iter()
        .filter(|(_, present)| !present(t))
        .map(|(n, _)| *n)
        .collect();
    if t.host_memory_allocate.is_some() && t.host_memory_deallocate.is_none() {
        v.push("host_memory_deallocate (host_memory_allocate is set)");
    }
    if t.unified_memory_allocate.is_some() && t.unified_memory_deallocate.is_none() {
        v.push("unified_memory_deallocate (unified_memory_allocate is set)");
    }
    v
}

/// A function table that passed the loader's checks ([`check_table`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCheck {
    /// The ABI version the table declares (major, minor).
    pub abi: (u32, u32),
    /// The size the table declares, in bytes.
    pub table_size: usize,
    /// The optional entries it leaves out.
    pub absent_entries: Vec<&'static str>,
}

/// Why the loader refuses a function table ([`check_table`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableProblem {
    /// Another major ABI version, or a table smaller than ABI 1.0's.
    Version {
        /// The ABI version the table declares (major, minor).
        abi: (u32, u32),
        /// What is wrong and what to do.
        reason: String,
    },
    /// Required entries are NULL (or an allocate entry lacks its deallocate).
    MissingEntries(Vec<&'static str>),
}

/// The table the loader works with, from the bytes it copied out of the plugin: the first
/// `bytes.len()` bytes (at most the size of today's table) of a zeroed [`KilnDeviceInterface`],
/// so entries past the plugin's table are `None`.
pub(crate) fn table_from_bytes(bytes: &[u8]) -> KilnDeviceInterface {
    let n = bytes.len().min(size_of::<KilnDeviceInterface>());
    let mut t = std::mem::MaybeUninit::<KilnDeviceInterface>::zeroed();
    // SAFETY: we copy at most `size_of::<KilnDeviceInterface>()` bytes into zeroed storage of
    // that size. Every bit pattern is a valid `KilnDeviceInterface`: integers, and optional
    // function pointers whose only invalid value (NULL) is `None`. Nothing here calls them.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), t.as_mut_ptr().cast::<u8>(), n);
        t.assume_init()
    }
}

/// The loader's checks of a plugin's function table, on the bytes it copied from the plugin (see
/// [`load_plugin`](super::load_plugin)): the major ABI version, the declared size against ABI
/// 1.0's, and the required entries. Pure: nothing in the table is called, so any bytes may be
/// given (the fuzz tests do).
///
/// # Errors
/// [`TableProblem`] saying what is wrong.
pub fn check_table(bytes: &[u8]) -> Result<TableCheck, TableProblem> {
    check_interface(&table_from_bytes(bytes))
}

pub(crate) fn check_interface(table: &KilnDeviceInterface) -> Result<TableCheck, TableProblem> {
    let abi = (table.abi_major, table.abi_minor);
    if abi.0 != KILN_PLUGIN_ABI_MAJOR {
        return Err(TableProblem::Version {
            abi,
            reason: if abi.0 > KILN_PLUGIN_ABI_MAJOR {
                "the plugin is newer than this kiln; upgrade kiln or use a plugin built for ABI 1"
                    .to_owned()
            } else {
                "the plugin is older than any ABI this kiln supports; rebuild it".to_owned()
            },
        });
    }
    if table.struct_size < KILN_DEVICE_INTERFACE_SIZE_1_0 {
        return Err(TableProblem::Version {
            abi,
            reason: format!(
                "its function table is {} bytes, smaller than the {} bytes of ABI 1.0",
                table.struct_size, KILN_DEVICE_INTERFACE_SIZE_1_0
            ),
        });
    }
    let missing = missing_entries(table);
    if !missing.is_empty() {
        return Err(TableProblem::MissingEntries(missing));
    }
    Ok(TableCheck {
        abi,
        table_size: table.struct_size,
        absent_entries: absent_optional_entries(table),
    })
}

/// What the entry symbol reported.
#[derive(Debug, Clone)]
pub(crate) struct EntryInfo {
    pub device_type: String,
    pub sub_device_type: Option<String>,
    pub plugin_version: (u32, u32, u32),
    pub abi: (u32, u32),
    pub table_size: usize,
}

/// A loaded plugin: the library (kept loaded for as long as anything from it may run) and a
/// copy of its table, zero-filled past the plugin's `struct_size`.
pub struct RawPlugin {
    table: KilnDeviceInterface,
    // Dropped last: the table's function pointers point into it. Never dropped in practice while
    // registered (registered backends live until the process exits).
    lib: Arc<libloading::Library>,
}

impl std::fmt::Debug for RawPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawPlugin")
            .field("table_size", &self.table.struct_size)
            .finish()
    }
}

/// The longest name kiln reads from a plugin (device type, sub-device type, kernel names).
pub const MAX_NAME_LEN: usize = 255;
/// The longest error message kiln reads from `get_last_error`; longer ones are cut.
pub const MAX_MESSAGE_LEN: usize = 4095;

/// Reads a C string of at most `max` bytes before its NUL, tolerating NULL and invalid UTF-8:
/// `Ok(None)` for NULL, `Err(prefix)` when no NUL comes within `max + 1` bytes (the bytes read
/// are returned, lossily decoded). kiln never reads further than that.
///
/// # Safety
/// - `p` is NULL or points to at least `min(strlen(p) + 1, max + 1)` readable bytes.
unsafe fn c_string_bounded(p: *const c_char, max: usize) -> Result<Option<String>, String> {
    if p.is_null() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    for i in 0..=max {
        // SAFETY: byte `i` is readable: every earlier byte was non-NUL and `i <= max` (caller).
        let b = unsafe { p.add(i).cast::<u8>().read() };
        if b == 0 {
            return Ok(Some(String::from_utf8_lossy(&bytes).into_owned()));
        }
        bytes.push(b);
    }
    bytes.truncate(max);
    Err(String::from_utf8_lossy(&bytes).into_owned())
}

/// Copies an error message, tolerating NULL and invalid UTF-8, cut at [`MAX_MESSAGE_LEN`]
/// bytes (with a note) when the plugin's string is longer or lacks its NUL.
///
/// # Safety
/// As [`c_string_bounded`].
unsafe fn c_message(p: *const c_char) -> Option<String> {
    // SAFETY: forwarded (caller).
    match unsafe { c_string_bounded(p, MAX_MESSAGE_LEN) } {
        Ok(m) => m,
        Err(prefix) => Some(format!(
            "{prefix}... (cut: no terminating NUL within {MAX_MESSAGE_LEN} bytes)"
        )),
    }
}

/// Copies a name the plugin gave (`what`, for the message), refusing one without a NUL within
/// [`MAX_NAME_LEN`] bytes.
///
/// # Safety
/// As [`c_string_bounded`].
unsafe fn c_name(p: *const c_char, what: &str) -> Result<Option<String>, String> {
    // SAFETY: forwarded (caller).
    unsafe { c_string_bounded(p, MAX_NAME_LEN) }.map_err(|prefix| {
        format!(
            "{what} has no terminating NUL within {MAX_NAME_LEN} bytes (expected a \
             NUL-terminated name of at most {MAX_NAME_LEN} bytes; it starts `{}`)",
            prefix.chars().take(32).collect::<String>()
        )
    })
}

/// An error and its sources, `: `-separated: libloading keeps the system loader's text
/// (`dlerror`) in `source()`, behind a bare "dlopen failed".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !t.is_empty() && !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}

/// The architecture this process runs on, as `object` names it.
fn host_architecture() -> object::Architecture {
    use object::Architecture as A;
    match std::env::consts::ARCH {
        "x86_64" => A::X86_64,
        "x86" => A::I386,
        "aarch64" => A::Aarch64,
        "arm" => A::Arm,
        "riscv64" => A::Riscv64,
        "powerpc64" => A::PowerPc64,
        "s390x" => A::S390x,
        "loongarch64" => A::LoongArch64,
        _ => A::Unknown,
    }
}

/// Whether the dynamic symbol table of the file at `data` defines the entry symbol. Errors when
/// the bytes are not an object file kiln can read.
pub(crate) fn defines_entry(data: &[u8]) -> Result<bool, String> {
    use object::{Object, ObjectKind, ObjectSymbol};
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    if file.kind() != ObjectKind::Dynamic {
        return Err(format!(
            "it is an object file of kind {:?}, not a shared library",
            file.kind()
        ));
    }
    let host = host_architecture();
    if host != object::Architecture::Unknown && file.architecture() != host {
        return Err(format!(
            "it is built for the {:?} architecture ({}-bit), but this process runs on {:?}",
            file.architecture(),
            if file.is_64() { 64 } else { 32 },
            host
        ));
    }
    Ok(file
        .dynamic_symbols()
        .filter(|s| s.is_definition())
        .any(|s| s.name() == Ok(KILN_PLUGIN_ENTRY_SYMBOL)))
}

impl RawPlugin {
    /// Opens `path`, fills its context slots, calls the entry symbol and copies and checks the
    /// table (size, version, required entries). Does not call `initialize`.
    ///
    /// Loading runs the library's initializers and its entry: like every plugin host, kiln
    /// trusts the file it is asked to load ([`super::load_plugin`] documents this) after checking
    /// what it can (an ELF shared object that defines the entry symbol, checked by the caller).
    ///
    /// # Errors
    /// [`PluginError`]s naming what is wrong, with the plugin's own message when it gave one.
    pub(crate) fn open(path: &Path) -> Result<(Self, EntryInfo), PluginError> {
        let p = path.to_path_buf();
        // SAFETY: the plugin is trusted by `load_plugin`'s documented contract; it was checked to
        // be a shared object exporting the entry symbol.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(path),
                libloading::os::unix::RTLD_LAZY | libloading::os::unix::RTLD_LOCAL,
            )
        }
        .map_err(|e| PluginError::Open {
            path: p.clone(),
            reason: error_chain(&e),
        })?;
        let lib: libloading::Library = lib.into();
        for (slot, addr) in crate::packed_func::context::context_symbols() {
            let name = format!("{slot}\0");
            // SAFETY: a context slot is an exported `void*` variable; we only take its address.
            if let Ok(sym) = unsafe { lib.get::<*mut *mut c_void>(name.as_bytes()) } {
                let slot_ptr: *mut *mut c_void = *sym;
                if !slot_ptr.is_null() {
                    // SAFETY: the slot is a writable, aligned `void*` in the library's data
                    // segment (the context-slot convention); no plugin code runs yet.
                    unsafe { slot_ptr.write(addr as *mut c_void) };
                }
            }
        }
        type Entry = unsafe extern "C" fn(*mut KilnPluginParams) -> KilnStatus;
        // SAFETY: the entry symbol has this signature by the plugin ABI (`device_plugin.h`).
        let entry: Entry = match unsafe { lib.get::<Entry>(b"kiln_device_plugin_init\0") } {
            Ok(s) => *s,
            Err(e) => {
                return Err(PluginError::NoEntry {
                    path: p,
                    reason: error_chain(&e),
                })
            }
        };
        let mut params = KilnPluginParams {
            struct_size: size_of::<KilnPluginParams>(),
            abi_major: KILN_PLUGIN_ABI_MAJOR,
            abi_minor: KILN_PLUGIN_ABI_MINOR,
            device_type: std::ptr::null(),
            sub_device_type: std::ptr::null(),
            plugin_version_major: 0,
            plugin_version_minor: 0,
            plugin_version_patch: 0,
            reserved: 0,
            interface: std::ptr::null(),
        };
        // SAFETY: `params` is a valid, initialized `KilnPluginParams` of the size it claims.
        let status = unsafe { entry(&mut params) };
        // Copy the table first: its get_last_error carries the entry's message.
        let table = if params.interface.is_null() {
            None
        } else {
            // SAFETY: a non-NULL interface points to a table whose first field is its size (ABI).
            let size = unsafe { params.interface.cast::<usize>().read_unaligned() };
            let mut bytes = [0u8; size_of::<KilnDeviceInterface>()];
            let n = size.min(bytes.len());
            // SAFETY: the plugin's table is `size` bytes long (ABI); we copy at most that and at
            // most our own size.
            unsafe {
                std::ptr::copy_nonoverlapping(params.interface.cast::<u8>(), bytes.as_mut_ptr(), n);
            }
            Some(table_from_bytes(&bytes[..n]))
        };
        let last_error = |t: &Option<KilnDeviceInterface>| {
            t.as_ref()
                .filter(|t| t.struct_size >= KILN_DEVICE_INTERFACE_SIZE_1_0)
                .and_then(|t| t.get_last_error)
                // SAFETY: get_last_error returns NULL or a NUL-terminated string (ABI); kiln
                // reads at most MAX_MESSAGE_LEN + 1 bytes of it.
                .and_then(|f| unsafe { c_message(f()) })
        };
        if status != KILN_STATUS_SUCCESS {
            let message = last_error(&table).unwrap_or_else(|| {
                if status == KILN_STATUS_VERSION_MISMATCH {
                    format!(
                        "the plugin refused this kiln without a message (KILN_PLUGIN_CHECK_PARAMS \
                         does so when kiln's ABI major version or params size differs from the \
                         header the plugin was built with); this kiln speaks ABI \
                         {KILN_PLUGIN_ABI_MAJOR}.{KILN_PLUGIN_ABI_MINOR} with a {}-byte \
                         KilnPluginParams: rebuild the plugin against this kiln's \
                         include/kiln/device_plugin.h",
                        size_of::<KilnPluginParams>()
                    )
                } else {
                    "the plugin gave no message (it has no get_last_error, or it returned NULL)"
                        .to_owned()
                }
            });
            return Err(PluginError::EntryFailed {
                path: p,
                status: format!("{status} ({})", status_name(status)),
                message,
            });
        }
        let invalid = |reason: String| PluginError::Invalid {
            path: p.clone(),
            reason,
        };
        // SAFETY: the plugin fills these with NULL or static NUL-terminated strings (ABI); kiln
        // reads at most MAX_NAME_LEN + 1 bytes of each.
        let device_type =
            unsafe { c_name(params.device_type, "`device_type`") }.map_err(invalid)?;
        // SAFETY: as above.
        let sub_device_type =
            unsafe { c_name(params.sub_device_type, "`sub_device_type`") }.map_err(invalid)?;
        let Some(device_type) = device_type else {
            return Err(PluginError::Invalid {
                path: p,
                reason: "the entry left `device_type` NULL".to_owned(),
            });
        };
        let Some(table) = table else {
            return Err(PluginError::Invalid {
                path: p,
                reason: "the entry left `interface` NULL".to_owned(),
            });
        };
        let checked = match check_interface(&table) {
            Ok(c) => c,
            Err(TableProblem::Version { abi, reason }) => {
                return Err(PluginError::Version {
                    path: p,
                    device_type,
                    plugin: abi,
                    reason,
                })
            }
            Err(TableProblem::MissingEntries(missing)) => {
                return Err(PluginError::MissingEntries {
                    path: p,
                    device_type,
                    missing: missing.into_iter().map(str::to_owned).collect(),
                })
            }
        };
        let info = EntryInfo {
            device_type,
            sub_device_type,
            plugin_version: (
                params.plugin_version_major,
                params.plugin_version_minor,
                params.plugin_version_patch,
            ),
            abi: checked.abi,
            table_size: checked.table_size,
        };
        Ok((
            Self {
                table,
                lib: Arc::new(lib),
            },
            info,
        ))
    }

    /// The copied table (entries past the plugin's size are `None`).
    pub(crate) fn table(&self) -> &KilnDeviceInterface {
        &self.table
    }

    /// The plugin's last error on this thread, if it has `get_last_error` and a message.
    pub(crate) fn last_error(&self) -> Option<String> {
        let f = self.table.get_last_error?;
        // SAFETY: the entry is a valid function of the loaded library (checked at load); it
        // returns NULL or a NUL-terminated string valid until the next call on this thread,
        // which we copy at once (at most MAX_MESSAGE_LEN + 1 bytes).
        unsafe { c_message(f()) }
    }

    /// The plugin's kernels as packed functions named `<prefix><name>`, each keeping the library
    /// loaded.
    ///
    /// # Errors
    /// The status of `get_kernels` and a description of a malformed entry.
    pub(crate) fn kernels(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, PackedFunc)>, (KilnStatus, String)> {
        let Some(f) = self.table.get_kernels else {
            return Ok(Vec::new());
        };
        let mut ptr: *const KilnPluginKernel = std::ptr::null();
        let mut count = 0usize;
        // SAFETY: valid entry of the loaded library; both out-pointers are valid.
        let s = unsafe { f(&mut ptr, &mut count) };
        if s != KILN_STATUS_SUCCESS {
            return Err((s, self.last_error().unwrap_or_default()));
        }
        if count == 0 {
            return Ok(Vec::new());
        }
        if count > MAX_KERNELS {
            return Err((
                KILN_STATUS_ERROR,
                format!("get_kernels reported {count} kernels; kiln accepts at most {MAX_KERNELS}"),
            ));
        }
        if ptr.is_null() {
            return Err((
                KILN_STATUS_ERROR,
                format!("get_kernels gave {count} kernels at NULL"),
            ));
        }
        // SAFETY: `ptr` points to `count` entries with the first entry's size as stride (ABI);
        // the first field of each is its size.
        let stride = unsafe { ptr.cast::<usize>().read_unaligned() };
        let min = offset_of!(KilnPluginKernel, self_) + size_of::<usize>();
        if stride < min {
            return Err((
                KILN_STATUS_ERROR,
                format!("kernel entries are {stride} bytes, smaller than the {min} of ABI 1.0"),
            ));
        }
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: entry `i` lies inside the plugin's array (stride and count from the plugin);
            // we read only the 1.0 prefix, which `stride >= min` guarantees.
            let k = unsafe {
                ptr.cast::<u8>()
                    .add(i * stride)
                    .cast::<KilnPluginKernel>()
                    .read_unaligned()
            };
            // SAFETY: `name` is NULL or a static NUL-terminated string (ABI); kiln reads at most
            // MAX_NAME_LEN + 1 bytes of it.
            let name = unsafe { c_name(k.name, &format!("the name of kernel #{i}")) }
                .map_err(|m| (KILN_STATUS_ERROR, m))?
                .unwrap_or_default();
            let Some(call) = k.call else {
                return Err((
                    KILN_STATUS_ERROR,
                    format!("kernel #{i} `{name}` has a NULL function"),
                ));
            };
            if name.is_empty() {
                return Err((KILN_STATUS_ERROR, format!("kernel #{i} has no name")));
            }
            let full = format!("{prefix}{name}");
            let keep: Arc<dyn std::any::Any + Send + Sync> = self.lib.clone();
            // SAFETY: `call` follows the safe-call contract (ABI) with `self_`, and stays valid
            // while the library is loaded, which `keep` ensures.
            let pf = unsafe { PackedFunc::from_safe_call(full.clone(), call, k.self_, Some(keep)) };
            out.push((full, pf));
        }
        Ok(out)
    }
}

/// Calls an optional entry: `None` when absent, else `Some(status)`.
macro_rules! call_opt {
    ($plugin:expr, $field:ident ( $($arg:expr),* )) => {
        match $plugin.table().$field {
            // SAFETY: the entry is a function of the loaded library (the table was checked at
            // load and the library stays loaded); the arguments follow its header contract:
            // device ids checked by kiln, handles created by the plugin and still live, device
            // pointers inside live allocations, host buffers valid for the sizes passed.
            Some(f) => Some(unsafe { f($($arg),*) }),
            None => None,
        }
    };
}

/// Calls a required entry (checked present at load).
macro_rules! call_req {
    ($plugin:expr, $field:ident ( $($arg:expr),* )) => {
        match $plugin.table().$field {
            // SAFETY: as in `call_opt!`; required entries were checked non-NULL at load.
            Some(f) => unsafe { f($($arg),*) },
            None => $crate::device_api::plugin::sys::KILN_STATUS_UNSUPPORTED,
        }
    };
}

pub(crate) use {call_opt, call_req};

/// A host callback kiln hands to the plugin; it receives the status the plugin reports.
pub(crate) type BoxedCallback = Box<dyn FnOnce(KilnStatus) + Send + 'static>;

/// The `KilnStreamCallback` kiln hands to `stream_add_callback`: runs the boxed closure once.
/// Panics are caught here, because unwinding into the plugin's C frames is undefined behaviour.
///
/// # Safety
/// - `user_data` is NULL or came from `Box::into_raw(Box<BoxedCallback>)` in
///   [`RawPlugin::add_callback`], and is passed here exactly once.
unsafe extern "C" fn stream_callback_trampoline(user_data: *mut c_void, status: KilnStatus) {
    if user_data.is_null() {
        return;
    }
    // SAFETY: `user_data` is a leaked `Box<BoxedCallback>`, reclaimed once (caller's contract).
    let cb = unsafe { Box::from_raw(user_data.cast::<BoxedCallback>()) };
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || cb(status))) {
        log::error!("a plugin stream callback panicked: {}", panic_message(&*p));
    }
}

impl RawPlugin {
    /// Queues `cb` on `stream` through `stream_add_callback` (which must be present). On success
    /// the plugin calls it exactly once; on failure it is dropped without running.
    pub(crate) fn add_callback(
        &self,
        device: i32,
        stream: KilnStream,
        cb: BoxedCallback,
    ) -> KilnStatus {
        let Some(f) = self.table.stream_add_callback else {
            return KILN_STATUS_UNSUPPORTED;
        };
        let user: *mut c_void = Box::into_raw(Box::new(cb)).cast();
        // SAFETY: valid entry of the loaded library; `stream` is a live plugin stream of `device`
        // (checked by the caller's handle table); the trampoline matches `KilnStreamCallback` and
        // `user` is the leaked box it expects.
        let s = unsafe { f(device, stream, stream_callback_trampoline, user) };
        if s != KILN_STATUS_SUCCESS {
            // SAFETY: the plugin refused the callback, so it will never call the trampoline with
            // `user`: we own the box again.
            drop(unsafe { Box::from_raw(user.cast::<BoxedCallback>()) });
        }
        s
    }
}

/// A zeroed `KilnAttrValue` with kiln's header.
pub(crate) fn attr_value() -> KilnAttrValue {
    KilnAttrValue {
        struct_size: size_of::<KilnAttrValue>(),
        abi_major: KILN_PLUGIN_ABI_MAJOR,
        abi_minor: KILN_PLUGIN_ABI_MINOR,
        type_: KILN_ATTR_NONE,
        reserved: 0,
        int_value: 0,
        string_value: [0; KILN_ATTR_STRING_CAPACITY],
    }
}

/// The string of an attribute value: an error when the plugin filled all
/// [`KILN_ATTR_STRING_CAPACITY`] bytes without a terminating NUL (kiln never reads past them).
pub(crate) fn attr_string(v: &KilnAttrValue) -> Result<String, String> {
    let Some(len) = v.string_value.iter().position(|&c| c == 0) else {
        return Err(format!(
            "get_attribute returned a string attribute without a terminating NUL in its \
             {KILN_ATTR_STRING_CAPACITY} bytes (expected at most {} bytes and a NUL)",
            KILN_ATTR_STRING_CAPACITY - 1
        ));
    };
    let bytes: Vec<u8> = v.string_value[..len].iter().map(|&c| c as u8).collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
