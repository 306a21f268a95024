//! Vendor device backends as plugins: shared libraries implementing
//! `include/kiln/device_plugin.h`, loaded at run time and registered as ordinary backends.
//!
//! # Design
//!
//! - The ABI is a versioned table of C functions (PaddlePaddle CustomDevice's
//!   `C_DeviceInterface`, with the versioning discipline of OpenXLA's PJRT C API): one entry
//!   symbol, `kiln_device_plugin_init`, fills a [`sys::KilnPluginParams`] with the device type
//!   name, the plugin's version and a [`sys::KilnDeviceInterface`]. Every struct starts with its
//!   size and ABI version; fields are only appended. kiln accepts older (smaller) tables, treating
//!   the entries past their end as absent, and refuses another major version.
//! - [`load_plugin`] checks the file (an ELF shared object that defines the entry), opens it,
//!   checks sizes, versions and the required entries (naming every missing one), calls
//!   `initialize` and `init_device`, and registers a [`PluginDeviceApi`] as `device_api.<name>`
//!   with an extension device code, plus the plugin's kernels as global packed functions
//!   `<name>.<kernel>`. [`load_plugins_from_env`] loads every library in the directories of
//!   `KILN_PLUGIN_PATH`, reporting and skipping bad files.
//! - [`PluginDeviceApi`] implements [`DeviceApi`] over the table and applies the documented
//!   fallbacks for absent optional entries: async copy -> synchronize + sync copy, memset -> host
//!   fill + h2d, query -> synchronize, p2p -> bounce through the host, callbacks -> synchronize +
//!   run on the host, chunk sizes -> defaults.
//! - Device memory comes from a [`ChunkAllocator`] per device that carves the plugin's chunks
//!   (its chunk sizes, padding and realloc size), so steady allocation does not call the plugin.
//!   It also knows every live range, so kiln checks copies and memsets before the plugin sees them.
//! - A failing plugin never takes the process down: every status becomes a [`DeviceError`] or a
//!   [`PluginError`] carrying the plugin's own message (its per-thread `get_last_error`), and no
//!   panic crosses into C (the stream-callback trampoline catches them).
//!
//! # Files
//!
//! - `mod.rs`: the backend type, what kiln knows about a plugin ([`PluginInfo`]), the
//!   [`DeviceApi`] impl (attributes with fallbacks), status messages, teardown.
//! - `memory.rs`: the [`DeviceMemoryApi`] impl: the per-device [`ChunkAllocator`]s over the
//!   plugin's allocation entries, range checks, copies with their fallbacks, and the pinned
//!   staging of host<->device copies.
//! - `stream.rs`: the [`DeviceStreamApi`] impl: kiln's stream and event handles over the
//!   plugin's, and their checks.
//! - `sys.rs`: the plugin ABI (the C table, its size and version checks, the calls into it).
//! - `allocator.rs`: the [`ChunkAllocator`] (plugin-independent, tested without one).
//! - `load.rs`, a concern of plugins only: loading a file ([`load_plugin`]), its checks before
//!   and after opening it, registration, directory scans, and [`PluginError`].
//!
//! `unsafe` code lives in [`sys`], and in `memory.rs` for the host side of staged copies (bytes
//! copied between the caller's host memory and the plugin's page-locked buffers).
//!
//! # Example
//!
//! ```no_run
//! use kiln::device_api::{plugin, Device, Tensor};
//!
//! let api = plugin::load_plugin("target/plugins/libkiln_sample.so")?;
//! let dev = Device::new(api.code(), 0);
//! let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], dev)?;
//! assert_eq!(t.to_vec::<f32>()?, vec![1.0, 2.0, 3.0]);
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! [`DeviceMemoryApi`]: super::DeviceMemoryApi
//! [`DeviceStreamApi`]: super::DeviceStreamApi

pub mod allocator;
mod load;
mod memory;
mod stream;
pub mod sys;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

pub use allocator::{ChunkAllocator, ChunkConfig, ChunkStats};
pub use load::{
    load_plugin, load_plugins_from_dirs, load_plugins_from_env, loaded_plugins, PluginError,
    PluginScan,
};

use super::api::{AttrKind, AttrValue, DeviceApi};
use super::device::{Device, DeviceType};
use super::error::{DeviceError, DeviceResult};
use super::stream::HandleTable;
use crate::util::lock;
use std::collections::BTreeMap;
use sys::{call_opt, call_req, KilnStatus, RawPlugin, KILN_STATUS_SUCCESS};

/// The most devices kiln accepts from one plugin's `get_device_count`: kiln keeps per-device state,
/// and a larger count is a plugin bug, refused rather than allocated.
pub const MAX_PLUGIN_DEVICES: usize = 1024;

/// The environment variable listing plugin directories (`:`-separated, like `PATH`).
pub const PLUGIN_PATH_VAR: &str = "KILN_PLUGIN_PATH";

/// The environment variable that turns pinned staging of host<->device copies on (`1`) or off
/// (`0`) for every plugin loaded afterwards, overriding what each plugin asks for
/// (`KILN_ATTR_KIND_PINNED_STAGING`). See [`PluginDeviceApi::set_pinned_staging`].
pub const PINNED_STAGING_VAR: &str = "KILN_PLUGIN_PINNED_STAGING";

/// The default staging chunk of host<->device copies (see [`PluginDeviceApi::set_staging_chunk`]).
pub const DEFAULT_STAGING_CHUNK: usize = 4 << 20;

/// Counters of the pinned staging of host<->device copies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StagingStats {
    /// Host-to-device copies that went through a staging buffer.
    pub h2d_copies: u64,
    /// Device-to-host copies that went through a staging buffer.
    pub d2h_copies: u64,
    /// Chunks queued (both directions).
    pub chunks: u64,
}

/// What kiln knows about a loaded plugin.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PluginInfo {
    /// The device type name (the backend's name).
    pub name: String,
    /// The finer device name the plugin gave, if any.
    pub sub_device_type: Option<String>,
    /// The file it was loaded from.
    pub path: PathBuf,
    /// The plugin's own version.
    pub plugin_version: (u32, u32, u32),
    /// The ABI version its table declares.
    pub abi: (u32, u32),
    /// The size of its table in bytes.
    pub table_size: usize,
    /// The extension device code kiln gave it.
    #[serde(serialize_with = "ser_code")]
    pub code: DeviceType,
    /// The number of devices.
    pub device_count: usize,
    /// The device ids the plugin lists (`get_device_list`).
    pub device_list: Vec<usize>,
    /// Optional entries it leaves out (kiln's fallbacks apply).
    pub absent_entries: Vec<&'static str>,
    /// The global packed functions it registered.
    pub kernels: Vec<String>,
    /// The allocator configuration (device 0's, with kiln's defaults filled in).
    pub chunk_config: Option<ChunkConfig>,
}

fn ser_code<S: serde::Serializer>(c: &DeviceType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_i32(c.0)
}

/// A plugin's devices as a [`DeviceApi`]; see the module docs.
pub struct PluginDeviceApi {
    raw: RawPlugin,
    info: PluginInfo,
    allocators: Vec<Mutex<ChunkAllocator>>,
    /// Unified allocations: (device, address) -> size.
    unified: Mutex<BTreeMap<(i32, usize), usize>>,
    /// Live streams: device and the plugin's handle.
    streams: Mutex<HandleTable<(i32, usize)>>,
    /// Live events: device and the plugin's handle.
    events: Mutex<HandleTable<(i32, usize)>>,
    /// The plugin stream behind each device's default stream, created on first use.
    default_streams: Mutex<Vec<Option<usize>>>,
    /// One cached page-locked staging buffer per device (address, size), from the plugin's
    /// `host_memory_allocate`, for copies that go through the host.
    staging: Mutex<Vec<Option<(usize, usize)>>>,
    /// Whether asynchronous copies between a device and host memory stage through pinned memory.
    pinned_staging: AtomicBool,
    /// The staging chunk of those copies, in bytes.
    staging_chunk: AtomicUsize,
    /// [`StagingStats`]: h2d copies, d2h copies, chunks.
    staging_counts: [AtomicU64; 3],
    /// The extension code, set once when the backend is registered.
    code: AtomicI32,
    /// The kernels registered, set once after registration.
    kernels: Mutex<Vec<String>>,
}

impl std::fmt::Debug for PluginDeviceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginDeviceApi")
            .field("info", &self.info)
            .finish()
    }
}

impl PluginDeviceApi {
    /// What kiln knows about the plugin.
    pub fn info(&self) -> PluginInfo {
        let mut i = self.info.clone();
        i.code = self.code();
        i.kernels = lock(&self.kernels).clone();
        i
    }

    /// The device type code kiln gave the plugin (0 until it is registered).
    pub fn code(&self) -> DeviceType {
        DeviceType(self.code.load(Ordering::SeqCst))
    }

    /// Whether asynchronous copies between a device of this plugin and ordinary host memory are
    /// staged through the plugin's page-locked memory (`host_memory_allocate`): on when the
    /// plugin asks for it (`KILN_ATTR_KIND_PINNED_STAGING`) or `KILN_PLUGIN_PINNED_STAGING=1`.
    /// It only takes effect when the plugin has `host_memory_allocate` and the async copy entry.
    pub fn pinned_staging(&self) -> bool {
        self.pinned_staging.load(Ordering::Relaxed)
    }

    /// Turns the pinned staging of host<->device copies on or off (see
    /// [`PluginDeviceApi::pinned_staging`] and `docs/plugins.md`).
    pub fn set_pinned_staging(&self, on: bool) {
        self.pinned_staging.store(on, Ordering::Relaxed);
    }

    /// The staging chunk of host<->device copies: a copy up to this size uses one staging slot;
    /// a larger one is split into chunks of this size that alternate between two slots.
    pub fn staging_chunk(&self) -> usize {
        self.staging_chunk.load(Ordering::Relaxed)
    }

    /// Sets the staging chunk (at least 64 bytes; [`DEFAULT_STAGING_CHUNK`] by default).
    pub fn set_staging_chunk(&self, bytes: usize) {
        self.staging_chunk.store(bytes.max(64), Ordering::Relaxed);
    }

    /// How many host<->device copies and chunks went through staging buffers.
    pub fn staging_stats(&self) -> StagingStats {
        let c = |i: usize| self.staging_counts[i].load(Ordering::Relaxed);
        StagingStats {
            h2d_copies: c(0),
            d2h_copies: c(1),
            chunks: c(2),
        }
    }

    /// "<entry> failed with status N (NAME): <plugin message>".
    fn status_message(&self, entry: &str, s: KilnStatus) -> String {
        let msg = self
            .raw
            .last_error()
            .unwrap_or_else(|| "the plugin gave no message".to_owned());
        format!(
            "plugin `{}`: {entry} failed with status {s} ({}): {msg}",
            self.info.name,
            sys::status_name(s)
        )
    }

    fn check(&self, dev: Device, entry: &str, s: KilnStatus) -> DeviceResult<()> {
        if s == KILN_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(DeviceError::Backend {
                device: dev,
                message: self.status_message(entry, s),
            })
        }
    }
}

impl Drop for PluginDeviceApi {
    fn drop(&mut self) {
        // Registered backends live until the process exits; this tears down one that never was
        // (registration failed), so its streams and memory go back to the plugin.
        for (i, s) in lock(&self.default_streams).iter().enumerate() {
            if let Some(s) = s {
                let _ = call_req!(self.raw, destroy_stream(i as i32, *s as sys::KilnStream));
            }
        }
        for (i, b) in lock(&self.staging).iter_mut().enumerate() {
            if let Some((p, n)) = b.take() {
                let _ = call_opt!(
                    self.raw,
                    host_memory_deallocate(i as i32, p as *mut std::ffi::c_void, n)
                );
            }
        }
        for i in 0..self.allocators.len() {
            let _ = self.trim(i as i32);
            let _ = call_opt!(self.raw, deinit_device(i as i32));
        }
        let _ = call_opt!(self.raw, finalize());
    }
}

impl DeviceApi for PluginDeviceApi {
    fn name(&self) -> &str {
        &self.info.name
    }

    fn device_type(&self) -> DeviceType {
        self.code()
    }

    fn device_count(&self) -> DeviceResult<usize> {
        Ok(self.info.device_count)
    }

    fn raw_attr(&self, dev: Device, kind: AttrKind) -> DeviceResult<Option<AttrValue>> {
        let id = dev.device_id;
        let mut v = sys::attr_value();
        match call_opt!(self.raw, get_attribute(id, kind.0, &mut v)) {
            Some(KILN_STATUS_SUCCESS) => {
                return Ok(match v.type_ {
                    sys::KILN_ATTR_INT => Some(AttrValue::Int(v.int_value)),
                    sys::KILN_ATTR_STRING => match sys::attr_string(&v) {
                        Ok(s) => Some(AttrValue::Str(s)),
                        Err(m) => {
                            return Err(DeviceError::Backend {
                                device: dev,
                                message: format!("plugin `{}`: {m}", self.info.name),
                            })
                        }
                    },
                    _ => None,
                })
            }
            Some(sys::KILN_STATUS_UNSUPPORTED) | None => {}
            Some(s) => self.check(dev, "get_attribute", s)?,
        }
        // Fallbacks from the other entries.
        let mut n = 0usize;
        Ok(match kind {
            AttrKind::DEVICE_NAME => Some(AttrValue::Str(match &self.info.sub_device_type {
                Some(sub) => format!("{} {sub} #{id}", self.info.name),
                None => format!("{} #{id}", self.info.name),
            })),
            AttrKind::COMPUTE_VERSION => (call_opt!(self.raw, get_compute_capability(id, &mut n))
                == Some(KILN_STATUS_SUCCESS))
            .then(|| AttrValue::Str(format!("{}.{}", n / 10, n % 10))),
            AttrKind::API_VERSION => {
                let ok =
                    call_opt!(self.raw, get_runtime_version(&mut n)) == Some(KILN_STATUS_SUCCESS);
                ok.then_some(AttrValue::Int(n as i64))
            }
            AttrKind::DRIVER_VERSION => {
                let ok =
                    call_opt!(self.raw, get_driver_version(&mut n)) == Some(KILN_STATUS_SUCCESS);
                ok.then_some(AttrValue::Int(n as i64))
            }
            AttrKind::TOTAL_GLOBAL_MEMORY => self
                .device_memory(id)
                .and_then(|(t, _)| t)
                .map(|t| AttrValue::Int(t as i64)),
            AttrKind::AVAILABLE_GLOBAL_MEMORY => self
                .device_memory(id)
                .and_then(|(_, f)| f)
                .map(|f| AttrValue::Int(f as i64)),
            _ => None,
        })
    }

    fn raw_set_device(&self, dev: Device) -> DeviceResult<()> {
        match call_opt!(self.raw, set_device(dev.device_id)) {
            Some(s) => self.check(dev, "set_device", s),
            None => Ok(()),
        }
    }
}
