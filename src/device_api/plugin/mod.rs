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
//! `unsafe` code lives in [`sys`] only.
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

pub mod allocator;
pub mod sys;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

pub use allocator::{ChunkAllocator, ChunkConfig, ChunkStats};

use super::api::{AttrKind, AttrValue, DeviceApi};
use super::device::{Device, DeviceType};
use super::error::{DeviceError, DeviceResult};
use super::memory::{DeviceMemoryApi, DevicePtr, HostCallback, MemRegion, MemoryStats};
use super::stream::{DeviceStreamApi, EventHandle, HandleTable, StreamHandle};
use crate::packed_func::ffi::DLDataType;
use allocator::{AllocFailure, ChunkSource, FreeFailure};
use sys::{call_opt, call_req, KilnStatus, RawPlugin, KILN_STATUS_NOT_READY, KILN_STATUS_SUCCESS};

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

/// Errors of loading a plugin. Each names the file and says what is wrong, with the plugin's
/// own message when it gave one.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The file is missing, unreadable, or not a shared library.
    #[error("`{path}` is not a device plugin: {reason}")]
    NotALibrary {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A shared library without the entry symbol `kiln_device_plugin_init`.
    #[error("`{path}` is not a device plugin: it does not export `kiln_device_plugin_init`{}", detail(.reason))]
    NoEntry {
        /// The file.
        path: PathBuf,
        /// The loader's message, if any.
        reason: String,
    },
    /// `dlopen` refused the file.
    #[error("cannot load device plugin `{path}`: {reason}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The entry symbol returned an error.
    #[error(
        "device plugin `{path}`: kiln_device_plugin_init failed with status {status}: {message}"
    )]
    EntryFailed {
        /// The file.
        path: PathBuf,
        /// The status, with its name.
        status: String,
        /// The plugin's message.
        message: String,
    },
    /// The entry filled the parameters incorrectly (no name, no table, a bad name).
    #[error("device plugin `{path}`: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An ABI version (or table size) kiln does not support.
    #[error(
        "device plugin `{device_type}` ({path}) was built for device plugin ABI {}.{}; this kiln \
         supports {}.0 to {}.{}: {reason}",
        .plugin.0, .plugin.1, sys::KILN_PLUGIN_ABI_MAJOR, sys::KILN_PLUGIN_ABI_MAJOR,
        sys::KILN_PLUGIN_ABI_MINOR
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The plugin's device type name.
        device_type: String,
        /// The plugin's ABI version (major, minor).
        plugin: (u32, u32),
        /// What is wrong and what to do.
        reason: String,
    },
    /// Required entries are NULL.
    #[error("device plugin `{device_type}` ({path}) lacks required entries: {}", .missing.join(", "))]
    MissingEntries {
        /// The file.
        path: PathBuf,
        /// The plugin's device type name.
        device_type: String,
        /// The missing entries.
        missing: Vec<String>,
    },
    /// `initialize`, `init_device` or another call made while loading failed.
    #[error("device plugin `{device_type}` ({path}): {step} failed: {message}")]
    InitFailed {
        /// The file.
        path: PathBuf,
        /// The plugin's device type name.
        device_type: String,
        /// The call that failed (`initialize`, `init_device(1)`, ...).
        step: String,
        /// The plugin's message.
        message: String,
    },
    /// The backend could not be registered (a name already taken, a bad name).
    #[error("device plugin `{path}`: {source}")]
    Registration {
        /// The file.
        path: PathBuf,
        /// The registry's error.
        source: DeviceError,
    },
}

fn detail(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(" ({reason})")
    }
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The allocator's view of the plugin for one device.
struct Source<'a> {
    api: &'a PluginDeviceApi,
    dev: i32,
}

impl ChunkSource for Source<'_> {
    fn allocate(&mut self, size: usize) -> Result<usize, String> {
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let s = call_req!(self.api.raw, device_memory_allocate(self.dev, &mut p, size));
        if s != KILN_STATUS_SUCCESS {
            return Err(self.api.status_message("device_memory_allocate", s));
        }
        let addr = p as usize;
        if addr.checked_add(size).is_none() {
            return Err(format!(
                "device_memory_allocate returned {addr:#x} for {size} bytes, a range that wraps \
                 around the address space"
            ));
        }
        if addr == 0 || addr % sys::KILN_PLUGIN_MIN_ALIGNMENT != 0 {
            let _ = call_req!(self.api.raw, device_memory_deallocate(self.dev, p, size));
            return Err(format!(
                "device_memory_allocate returned {addr:#x}, which is not aligned to {} bytes",
                sys::KILN_PLUGIN_MIN_ALIGNMENT
            ));
        }
        Ok(addr)
    }

    fn deallocate(&mut self, addr: usize, size: usize) -> Result<(), String> {
        let s = call_req!(
            self.api.raw,
            device_memory_deallocate(self.dev, addr as *mut std::ffi::c_void, size)
        );
        if s == KILN_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(self.api.status_message("device_memory_deallocate", s))
        }
    }
}

enum Side {
    Host(usize),
    Dev(i32, usize),
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

    /// Allocator statistics of device `id`.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`].
    pub fn allocator_stats(&self, id: i32) -> DeviceResult<ChunkStats> {
        Ok(lock(self.allocator(id)?).stats())
    }

    /// Returns the wholly free chunks of device `id` to the plugin; the bytes released.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`].
    pub fn trim(&self, id: i32) -> DeviceResult<u64> {
        let mut a = lock(self.allocator(id)?);
        Ok(a.trim(&mut Source { api: self, dev: id }))
    }

    fn allocator(&self, id: i32) -> DeviceResult<&Mutex<ChunkAllocator>> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.allocators.get(i))
            .ok_or_else(|| DeviceError::InvalidDevice {
                device: Device::new(self.code(), id),
                reason: format!(
                    "plugin `{}` has {} device(s)",
                    self.info.name,
                    self.allocators.len()
                ),
            })
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

    /// A handle a plugin returned with success must be non-NULL and not one kiln holds already
    /// (the ABI: the plugin creates a new handle). A bad one is refused (and not destroyed: kiln
    /// cannot know what it refers to).
    fn check_new_handle(&self, dev: Device, entry: &str, kind: &str, h: usize) -> DeviceResult<()> {
        let d = dev.device_id;
        let live = |t: &Mutex<HandleTable<(i32, usize)>>| {
            lock(t).values_mut().any(|&mut (td, x)| td == d && x == h)
        };
        let dup = match kind {
            "stream" => {
                live(&self.streams)
                    || lock(&self.default_streams)
                        .get(d as usize)
                        .is_some_and(|s| *s == Some(h))
            }
            _ => live(&self.events),
        };
        if h == 0 || dup {
            return Err(self.bad_handle(dev, entry, kind, h));
        }
        Ok(())
    }

    fn bad_handle(&self, dev: Device, entry: &str, kind: &str, h: usize) -> DeviceError {
        let seen = if h == 0 {
            "NULL".to_owned()
        } else {
            format!("{h:#x}, a {kind} that is still live")
        };
        DeviceError::Backend {
            device: dev,
            message: format!(
                "plugin `{}`: {entry} succeeded but returned {seen}; expected a new, non-NULL \
                 {kind} handle",
                self.info.name
            ),
        }
    }

    /// The plugin stream behind `stream` on `dev` (creating the default one on first use).
    fn plugin_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<sys::KilnStream> {
        if stream.is_default() {
            let mut d = lock(&self.default_streams);
            let slot = d
                .get_mut(dev.device_id as usize)
                .ok_or(DeviceError::InvalidStream {
                    device: dev,
                    handle: 0,
                })?;
            if let Some(s) = slot {
                return Ok(*s as sys::KilnStream);
            }
            let mut s: sys::KilnStream = std::ptr::null_mut();
            let st = call_req!(self.raw, create_stream(dev.device_id, &mut s));
            self.check(dev, "create_stream (default stream)", st)?;
            if s.is_null() {
                return Err(self.bad_handle(dev, "create_stream (default stream)", "stream", 0));
            }
            *slot = Some(s as usize);
            return Ok(s);
        }
        match lock(&self.streams).get(stream.to_raw()) {
            Some(&(d, s)) if d == dev.device_id => Ok(s as sys::KilnStream),
            _ => Err(DeviceError::InvalidStream {
                device: dev,
                handle: stream.to_raw(),
            }),
        }
    }

    fn plugin_event(&self, dev: Device, event: EventHandle) -> DeviceResult<sys::KilnEvent> {
        match lock(&self.events).get(event.to_raw()) {
            Some(&(d, e)) if d == dev.device_id => Ok(e as sys::KilnEvent),
            _ => Err(DeviceError::InvalidEvent {
                device: dev,
                handle: event.to_raw(),
            }),
        }
    }

    fn sync_plugin_stream(&self, dev: Device, s: sys::KilnStream) -> DeviceResult<()> {
        let st = call_req!(self.raw, synchronize_stream(dev.device_id, s));
        self.check(dev, "synchronize_stream", st)
    }

    /// Checks that `[ptr + offset, +n)` lies inside the live allocation of `dev` that the base
    /// pointer `ptr` belongs to; the device address. An offset that lands in a neighbouring
    /// allocation is out of bounds (naming the size of `ptr`'s allocation).
    fn device_range(&self, op: &'static str, r: MemRegion, n: usize) -> DeviceResult<usize> {
        let oob = |allocation: Option<usize>| DeviceError::OutOfBounds {
            op,
            device: r.device,
            ptr: r.ptr,
            offset: r.offset,
            nbytes: n as u64,
            allocation: allocation.map(|a| a as u64),
        };
        let pooled = lock(self.allocator(r.device.device_id)?).containing(r.ptr.0);
        let owner = pooled.or_else(|| {
            lock(&self.unified)
                .range(..=(r.device.device_id, r.ptr.0))
                .next_back()
                .filter(|(&(d, base), &size)| {
                    d == r.device.device_id && (r.ptr.0 == base || r.ptr.0 < base + size)
                })
                .map(|(&(_, base), &size)| (base, size))
        });
        let Some((base, size)) = owner else {
            return Err(oob(None));
        };
        // What is left of the allocation from `ptr` on.
        let room = base + size - r.ptr.0;
        let end = usize::try_from(r.offset)
            .ok()
            .and_then(|o| o.checked_add(n))
            .filter(|&e| e <= room)
            .ok_or_else(|| oob(Some(size)))?;
        Ok(r.ptr.0 + end - n)
    }

    fn side(&self, op: &'static str, r: MemRegion, n: usize) -> DeviceResult<Side> {
        if r.device.device_type == self.code() {
            Ok(Side::Dev(r.device.device_id, self.device_range(op, r, n)?))
        } else {
            let a = usize::try_from(r.offset)
                .ok()
                .and_then(|o| r.ptr.0.checked_add(o))
                .ok_or_else(|| DeviceError::InvalidTensor("host address overflows".to_owned()))?;
            Ok(Side::Host(a))
        }
    }

    /// A copy between two devices of this plugin without p2p entries: through a host buffer,
    /// the plugin's page-locked memory when it offers `host_memory_allocate` (cached per
    /// device), else ordinary host memory.
    fn bounce_p2p(
        &self,
        sdev: Device,
        src: usize,
        ddev: Device,
        dst: usize,
        n: usize,
    ) -> DeviceResult<()> {
        let pinned = self.take_staging(sdev.device_id, n);
        let mut host = Vec::new();
        let hp = match pinned {
            Some((p, _)) => p as *mut std::ffi::c_void,
            None => {
                host = vec![0u8; n];
                host.as_mut_ptr().cast::<std::ffi::c_void>()
            }
        };
        let st = call_req!(
            self.raw,
            memory_copy_d2h(sdev.device_id, hp, src as *const std::ffi::c_void, n)
        );
        let r = self
            .check(sdev, "memory_copy_d2h (p2p fallback)", st)
            .and_then(|()| {
                let st = call_req!(
                    self.raw,
                    memory_copy_h2d(ddev.device_id, dst as *mut std::ffi::c_void, hp, n)
                );
                self.check(ddev, "memory_copy_h2d (p2p fallback)", st)
            });
        drop(host);
        if let Some(b) = pinned {
            self.put_staging(sdev.device_id, b);
        }
        r
    }

    /// A new plugin event on `dev` (not in kiln's table: it lives for one staged copy).
    fn staging_event(&self, dev: Device) -> DeviceResult<sys::KilnEvent> {
        let mut e: sys::KilnEvent = std::ptr::null_mut();
        let st = call_req!(self.raw, create_event(dev.device_id, &mut e));
        self.check(dev, "create_event (staging)", st)?;
        if e.is_null() {
            return Err(self.bad_handle(dev, "create_event (staging)", "event", 0));
        }
        Ok(e)
    }

    /// An asynchronous host-to-device copy through the plugin's page-locked memory; `None` when
    /// no staging buffer is available (the caller copies directly).
    ///
    /// The caller's bytes are copied into a staging slot on this thread, then the slot is queued
    /// to the device with `async_memory_copy_h2d` and an event is recorded after it. A copy up
    /// to the staging chunk uses one slot; a larger one alternates two slots, and a slot is
    /// refilled only after `synchronize_event` on its previous event (the queued copy that reads
    /// it has completed). Before returning, kiln waits for the last events, so the buffer goes
    /// back to the cache unread by any queued copy and the caller's memory is never read after
    /// the call. A failure of a queued chunk stays with the stream's next synchronize (as for any
    /// queued copy); a failure to queue one is returned and stops the copy.
    fn staged_h2d(
        &self,
        dev: Device,
        ps: sys::KilnStream,
        dst: usize,
        src: usize,
        n: usize,
    ) -> Option<DeviceResult<()>> {
        use std::ffi::c_void;
        let id = dev.device_id;
        let chunk = self.staging_chunk().min(n);
        let slots = if n > chunk { 2 } else { 1 };
        let buf = self.take_staging(id, chunk * slots)?;
        let mut events: [Option<sys::KilnEvent>; 2] = [None, None];
        let mut pending = [false; 2];
        // A chunk queued whose event was not recorded: only a stream synchronize covers it.
        let mut unrecorded = false;
        let mut queue = || -> DeviceResult<()> {
            let mut off = 0;
            let mut k = 0;
            while off < n {
                let len = chunk.min(n - off);
                let slot = k % slots;
                if pending[slot] {
                    let e = events[slot].expect("a pending slot has an event");
                    let st = call_req!(self.raw, synchronize_event(id, e));
                    self.check(dev, "synchronize_event (staging)", st)?;
                    pending[slot] = false;
                }
                let e = match events[slot] {
                    Some(e) => e,
                    None => *events[slot].insert(self.staging_event(dev)?),
                };
                let sp = buf.0 + slot * chunk;
                // SAFETY: the caller's host region is valid for `n` bytes from `src` (raw_copy's
                // contract); the staging buffer holds `slots * chunk` bytes and this slot is not
                // read by any queued copy (its event was waited for above).
                unsafe {
                    std::ptr::copy_nonoverlapping((src + off) as *const u8, sp as *mut u8, len)
                };
                let st = call_req!(
                    self.raw,
                    async_memory_copy_h2d(
                        id,
                        ps,
                        (dst + off) as *mut c_void,
                        sp as *const c_void,
                        len
                    )
                );
                self.check(dev, "async_memory_copy_h2d (staged)", st)?;
                self.staging_counts[2].fetch_add(1, Ordering::Relaxed);
                pending[slot] = true;
                unrecorded = true;
                let st = call_req!(self.raw, record_event(id, ps, e));
                self.check(dev, "record_event (staging)", st)?;
                unrecorded = false;
                off += len;
                k += 1;
            }
            Ok(())
        };
        let mut r = queue();
        // The buffer may go back to the cache only once no queued copy reads it.
        let mut drained = !unrecorded;
        for slot in 0..slots {
            if pending[slot] {
                let st = events[slot]
                    .map(|e| call_req!(self.raw, synchronize_event(id, e)))
                    .unwrap_or(sys::KILN_STATUS_ERROR);
                if st != KILN_STATUS_SUCCESS {
                    drained = false;
                }
            }
        }
        if !drained {
            // synchronize_stream blocks until the queue has run, even when it reports a failure.
            let s = self.sync_plugin_stream(dev, ps);
            if r.is_ok() {
                r = s;
            }
        }
        for e in events.into_iter().flatten() {
            let _ = call_req!(self.raw, destroy_event(id, e));
        }
        self.put_staging(id, buf);
        if r.is_ok() {
            self.staging_counts[0].fetch_add(1, Ordering::Relaxed);
        }
        Some(r)
    }

    /// A device-to-host copy through the plugin's page-locked memory; `None` when no staging
    /// buffer is available. Each chunk is queued into the staging buffer with
    /// `async_memory_copy_d2h`, the stream is synchronized (which reports a failure of that chunk
    /// or of earlier queued work), and only then are the bytes copied out to the caller's memory:
    /// the copy is synchronous, as CUDA's device-to-pageable copies are, and a failed chunk never
    /// writes the caller's memory.
    fn staged_d2h(
        &self,
        dev: Device,
        ps: sys::KilnStream,
        dst: usize,
        src: usize,
        n: usize,
    ) -> Option<DeviceResult<()>> {
        use std::ffi::c_void;
        let id = dev.device_id;
        let chunk = self.staging_chunk().min(n);
        let buf = self.take_staging(id, chunk)?;
        let run = || -> DeviceResult<()> {
            let mut off = 0;
            while off < n {
                let len = chunk.min(n - off);
                let st = call_req!(
                    self.raw,
                    async_memory_copy_d2h(
                        id,
                        ps,
                        buf.0 as *mut c_void,
                        (src + off) as *const c_void,
                        len
                    )
                );
                if st != KILN_STATUS_SUCCESS {
                    let e = self.check(dev, "async_memory_copy_d2h (staged)", st);
                    // Nothing may still write the buffer when it goes back to the cache.
                    let _ = self.sync_plugin_stream(dev, ps);
                    return e;
                }
                self.staging_counts[2].fetch_add(1, Ordering::Relaxed);
                self.sync_plugin_stream(dev, ps)?;
                // SAFETY: the caller's host region is valid for `n` bytes from `dst` (raw_copy's
                // contract); the staging buffer holds at least `chunk` bytes, written by the
                // completed copy above.
                unsafe {
                    std::ptr::copy_nonoverlapping(buf.0 as *const u8, (dst + off) as *mut u8, len)
                };
                off += len;
            }
            Ok(())
        };
        let r = run();
        self.put_staging(id, buf);
        if r.is_ok() {
            self.staging_counts[1].fetch_add(1, Ordering::Relaxed);
        }
        Some(r)
    }

    /// Whether a host<->device copy of `n` bytes goes through staging (see
    /// [`PluginDeviceApi::pinned_staging`]).
    fn stages_host_copies(&self, n: usize) -> bool {
        n > 0 && self.pinned_staging() && self.raw.table().host_memory_allocate.is_some()
    }

    /// The largest staging buffer kiln keeps cached per device; larger ones are freed after use.
    const MAX_CACHED_STAGING: usize = 64 << 20;

    /// A page-locked host buffer of at least `n` bytes from the plugin (the cached one when it is
    /// large enough), or `None` when the plugin has no `host_memory_allocate` or it fails.
    fn take_staging(&self, dev: i32, n: usize) -> Option<(usize, usize)> {
        self.raw.table().host_memory_allocate?;
        let cached = lock(&self.staging).get_mut(dev as usize)?.take();
        match cached {
            Some(b) if b.1 >= n => return Some(b),
            Some((p, size)) => {
                let _ = call_opt!(
                    self.raw,
                    host_memory_deallocate(dev, p as *mut std::ffi::c_void, size)
                );
            }
            None => {}
        }
        let size = n.checked_next_multiple_of(1 << 20)?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        match call_opt!(self.raw, host_memory_allocate(dev, &mut p, size)) {
            Some(KILN_STATUS_SUCCESS)
                if !p.is_null() && (p as usize).checked_add(size).is_some() =>
            {
                Some((p as usize, size))
            }
            Some(KILN_STATUS_SUCCESS) => {
                log::warn!(
                    "plugin `{}`: host_memory_allocate returned {p:?} for {size} bytes; using \
                     ordinary host memory",
                    self.info.name
                );
                None
            }
            Some(s) => {
                log::debug!(
                    "{}; using ordinary host memory",
                    self.status_message("host_memory_allocate", s)
                );
                None
            }
            None => None,
        }
    }

    /// Returns a staging buffer to the cache (freeing it when it is too large to keep or the
    /// slot is taken meanwhile).
    fn put_staging(&self, dev: i32, (p, size): (usize, usize)) {
        if size <= Self::MAX_CACHED_STAGING {
            if let Some(slot) = lock(&self.staging).get_mut(dev as usize) {
                if slot.is_none() {
                    *slot = Some((p, size));
                    return;
                }
            }
        }
        let _ = call_opt!(
            self.raw,
            host_memory_deallocate(dev, p as *mut std::ffi::c_void, size)
        );
    }

    fn query_config(&self, id: i32) -> ChunkConfig {
        let mut c = ChunkConfig::defaults();
        let get = |r: Option<KilnStatus>, v: usize| {
            (r == Some(KILN_STATUS_SUCCESS) && v > 0).then_some(v)
        };
        let mut v = 0usize;
        if let Some(x) = get(call_opt!(self.raw, device_min_chunk_size(id, &mut v)), v) {
            c.min_chunk_size = x;
        }
        v = 0;
        if let Some(x) = get(call_opt!(self.raw, device_max_chunk_size(id, &mut v)), v) {
            c.max_chunk_size = x;
        }
        v = 0;
        if let Some(x) = get(call_opt!(self.raw, device_realloc_size(id, &mut v)), v) {
            c.realloc_size = x;
        }
        v = 0;
        if let Some(x) = get(call_opt!(self.raw, device_init_alloc_size(id, &mut v)), v) {
            c.init_alloc_size = x;
        }
        v = 0;
        if call_opt!(self.raw, device_extra_padding_size(id, &mut v)) == Some(KILN_STATUS_SUCCESS) {
            c.extra_padding_size = v;
        }
        v = 0;
        if let Some(x) = get(call_opt!(self.raw, device_max_alloc_size(id, &mut v)), v) {
            c.max_alloc_size = x;
        } else if let Some((Some(total), _)) = self.device_memory(id) {
            c.max_alloc_size = total as usize;
        }
        c.normalized()
    }

    /// `(total, free)` from `device_memory_stats`, when present and successful.
    fn device_memory(&self, id: i32) -> Option<(Option<u64>, Option<u64>)> {
        let (mut t, mut f) = (0usize, 0usize);
        match call_opt!(self.raw, device_memory_stats(id, &mut t, &mut f)) {
            // Sizes that do not fit an i64 attribute, or more free than total, are plugin bugs:
            // kiln reports the figure as unknown (with a warning) rather than a wrapped value.
            Some(KILN_STATUS_SUCCESS) => {
                let fits = |v: usize| i64::try_from(v).is_ok();
                if !fits(t) || !fits(f) || f > t {
                    log::warn!(
                        "plugin `{}`: device_memory_stats({id}) reported total {t} and free {f} \
                         bytes; expected free <= total <= {}; ignoring them",
                        self.info.name,
                        i64::MAX
                    );
                    return None;
                }
                Some((Some(t as u64), Some(f as u64)))
            }
            _ => None,
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

impl DeviceMemoryApi for PluginDeviceApi {
    fn raw_alloc(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        _dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr> {
        let mut a = lock(self.allocator(dev.device_id)?);
        let mut src = Source {
            api: self,
            dev: dev.device_id,
        };
        match a.allocate(&mut src, nbytes, align.max(64)) {
            Ok(p) => Ok(DevicePtr(p)),
            Err(AllocFailure::TooLarge { max }) => Err(DeviceError::OutOfMemory {
                device: dev,
                nbytes: nbytes as u64,
                align: align as u64,
                reason: format!(
                    "plugin `{}` allows at most {max} bytes in one allocation",
                    self.info.name
                ),
            }),
            Err(AllocFailure::Plugin(msg)) => Err(DeviceError::OutOfMemory {
                device: dev,
                nbytes: nbytes as u64,
                align: align as u64,
                reason: msg,
            }),
        }
    }

    fn raw_alloc_scoped(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        _dtype: DLDataType,
        scope: &str,
    ) -> DeviceResult<DevicePtr> {
        if scope != "global.unified" || self.raw.table().unified_memory_allocate.is_none() {
            let supported = if self.raw.table().unified_memory_allocate.is_some() {
                "global, global.unified"
            } else {
                "global"
            };
            return Err(DeviceError::Unsupported {
                device: dev,
                what: format!("memory scope `{scope}` (supported: {supported})"),
            });
        }
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let s = call_opt!(
            self.raw,
            unified_memory_allocate(dev.device_id, &mut p, nbytes)
        )
        .unwrap_or(sys::KILN_STATUS_UNSUPPORTED);
        if s != KILN_STATUS_SUCCESS {
            return Err(DeviceError::OutOfMemory {
                device: dev,
                nbytes: nbytes as u64,
                align: align as u64,
                reason: self.status_message("unified_memory_allocate", s),
            });
        }
        lock(&self.unified).insert((dev.device_id, p as usize), nbytes);
        Ok(DevicePtr(p as usize))
    }

    fn raw_free(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
        let failure = lock(self.allocator(dev.device_id)?).free(ptr.0);
        match failure {
            Ok(()) => Ok(()),
            Err(f) => {
                let unified = lock(&self.unified).remove(&(dev.device_id, ptr.0));
                if let Some(size) = unified {
                    let s = call_opt!(
                        self.raw,
                        unified_memory_deallocate(dev.device_id, ptr.as_raw(), size)
                    )
                    .unwrap_or(sys::KILN_STATUS_UNSUPPORTED);
                    return self.check(dev, "unified_memory_deallocate", s);
                }
                Err(match f {
                    FreeFailure::DoubleFree => DeviceError::DoubleFree { device: dev, ptr },
                    FreeFailure::Unknown => DeviceError::UnknownPointer {
                        device: dev,
                        ptr,
                        what: format!("plugin `{}`", self.info.name),
                    },
                })
            }
        }
    }

    unsafe fn raw_copy(
        &self,
        src: MemRegion,
        dst: MemRegion,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        use std::ffi::c_void;
        let (s, d) = (
            self.side("copy", src, nbytes)?,
            self.side("copy", dst, nbytes)?,
        );
        // The stream belongs to the device side (the source's for device-to-device copies).
        let sdev = match (&s, &d) {
            (Side::Dev(id, _), _) | (Side::Host(_), Side::Dev(id, _)) => {
                Device::new(self.code(), *id)
            }
            (Side::Host(_), Side::Host(_)) => {
                return Err(DeviceError::Unsupported {
                    device: src.device,
                    what: "host-to-host copies".to_owned(),
                })
            }
        };
        let ps = self.plugin_stream(sdev, stream)?;
        let t = self.raw.table();
        match (s, d) {
            (Side::Host(h), Side::Dev(id, a)) => {
                if t.async_memory_copy_h2d.is_some() && self.stages_host_copies(nbytes) {
                    if let Some(r) = self.staged_h2d(sdev, ps, a, h, nbytes) {
                        return r;
                    }
                }
                let (dp, hp) = (a as *mut c_void, h as *const c_void);
                if let Some(st) = call_opt!(self.raw, async_memory_copy_h2d(id, ps, dp, hp, nbytes))
                {
                    return self.check(sdev, "async_memory_copy_h2d", st);
                }
                self.sync_plugin_stream(sdev, ps)?;
                let st = call_req!(self.raw, memory_copy_h2d(id, dp, hp, nbytes));
                self.check(sdev, "memory_copy_h2d", st)
            }
            (Side::Dev(id, a), Side::Host(h)) => {
                if t.async_memory_copy_d2h.is_some() && self.stages_host_copies(nbytes) {
                    if let Some(r) = self.staged_d2h(sdev, ps, h, a, nbytes) {
                        return r;
                    }
                }
                let (hp, dp) = (h as *mut c_void, a as *const c_void);
                if let Some(st) = call_opt!(self.raw, async_memory_copy_d2h(id, ps, hp, dp, nbytes))
                {
                    return self.check(sdev, "async_memory_copy_d2h", st);
                }
                self.sync_plugin_stream(sdev, ps)?;
                let st = call_req!(self.raw, memory_copy_d2h(id, hp, dp, nbytes));
                self.check(sdev, "memory_copy_d2h", st)
            }
            (Side::Dev(si, sa), Side::Dev(di, da)) if si == di => {
                let (dp, sp) = (da as *mut c_void, sa as *const c_void);
                if let Some(st) = call_opt!(self.raw, async_memory_copy_d2d(si, ps, dp, sp, nbytes))
                {
                    return self.check(sdev, "async_memory_copy_d2d", st);
                }
                self.sync_plugin_stream(sdev, ps)?;
                let st = call_req!(self.raw, memory_copy_d2d(si, dp, sp, nbytes));
                self.check(sdev, "memory_copy_d2d", st)
            }
            (Side::Dev(si, sa), Side::Dev(di, da)) => {
                let ddev = Device::new(self.code(), di);
                let (dp, sp) = (da as *mut c_void, sa as *const c_void);
                if let Some(st) =
                    call_opt!(self.raw, async_memory_copy_p2p(di, si, ps, dp, sp, nbytes))
                {
                    return self.check(sdev, "async_memory_copy_p2p", st);
                }
                self.sync_plugin_stream(sdev, ps)?;
                if t.memory_copy_p2p.is_some() {
                    let st = call_req!(self.raw, memory_copy_p2p(di, si, dp, sp, nbytes));
                    return self.check(sdev, "memory_copy_p2p", st);
                }
                self.bounce_p2p(sdev, sa, ddev, da, nbytes)
            }
            (Side::Host(_), Side::Host(_)) => unreachable!("rejected above"),
        }
    }

    fn raw_memset(
        &self,
        dev: Device,
        ptr: DevicePtr,
        offset: u64,
        value: u8,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        let r = MemRegion {
            device: dev,
            ptr,
            offset,
        };
        let addr = self.device_range("memset", r, nbytes)?;
        let ps = self.plugin_stream(dev, stream)?;
        let dp = addr as *mut std::ffi::c_void;
        // ABI 1.2: queued on the stream like the async copies.
        if let Some(st) = call_opt!(
            self.raw,
            async_memory_set(dev.device_id, ps, dp, value, nbytes)
        ) {
            return self.check(dev, "async_memory_set", st);
        }
        // device_memory_set is synchronous: finish the stream's earlier work first.
        self.sync_plugin_stream(dev, ps)?;
        if let Some(st) = call_opt!(
            self.raw,
            device_memory_set(dev.device_id, dp, value, nbytes)
        ) {
            return self.check(dev, "device_memory_set", st);
        }
        let host = vec![value; nbytes];
        let hp = host.as_ptr().cast::<std::ffi::c_void>();
        let st = call_req!(self.raw, memory_copy_h2d(dev.device_id, dp, hp, nbytes));
        self.check(dev, "memory_copy_h2d (memset fallback)", st)
    }

    fn raw_memory_stats(&self, dev: Device) -> DeviceResult<MemoryStats> {
        let a = lock(self.allocator(dev.device_id)?).stats();
        let unified: u64 = lock(&self.unified)
            .iter()
            .filter(|((d, _), _)| *d == dev.device_id)
            .map(|(_, s)| *s as u64)
            .sum();
        let (total, free) = self.device_memory(dev.device_id).unwrap_or((None, None));
        Ok(MemoryStats {
            total,
            free,
            in_use: a.in_use + unified,
            peak: a.peak.max(a.in_use + unified),
            allocations: a.allocations,
        })
    }
}

impl DeviceStreamApi for PluginDeviceApi {
    fn raw_create_stream(&self, dev: Device) -> DeviceResult<StreamHandle> {
        let mut s: sys::KilnStream = std::ptr::null_mut();
        let st = call_req!(self.raw, create_stream(dev.device_id, &mut s));
        self.check(dev, "create_stream", st)?;
        self.check_new_handle(dev, "create_stream", "stream", s as usize)?;
        Ok(StreamHandle::from_raw(
            lock(&self.streams).insert((dev.device_id, s as usize)),
        ))
    }

    fn raw_free_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()> {
        let s = self.plugin_stream(dev, stream)?;
        lock(&self.streams).remove(stream.to_raw());
        let st = call_req!(self.raw, destroy_stream(dev.device_id, s));
        self.check(dev, "destroy_stream", st)
    }

    fn raw_sync_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()> {
        let s = self.plugin_stream(dev, stream)?;
        self.sync_plugin_stream(dev, s)
    }

    fn raw_check_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()> {
        // The handle table alone: `query_stream` (or its blocking fallback) would report, and
        // consume, a failure of queued work that belongs to the next synchronization.
        self.plugin_stream(dev, stream).map(|_| ())
    }

    fn raw_query_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<bool> {
        let s = self.plugin_stream(dev, stream)?;
        match call_opt!(self.raw, query_stream(dev.device_id, s)) {
            Some(KILN_STATUS_SUCCESS) => Ok(true),
            Some(KILN_STATUS_NOT_READY) => Ok(false),
            Some(st) => self.check(dev, "query_stream", st).map(|()| false),
            None => self.sync_plugin_stream(dev, s).map(|()| true),
        }
    }

    fn raw_add_callback(
        &self,
        dev: Device,
        stream: StreamHandle,
        callback: HostCallback,
    ) -> DeviceResult<()> {
        let s = self.plugin_stream(dev, stream)?;
        if self.raw.table().stream_add_callback.is_none() {
            self.sync_plugin_stream(dev, s)?;
            callback();
            return Ok(());
        }
        let name = self.info.name.clone();
        let boxed: sys::BoxedCallback = Box::new(move |status: KilnStatus| {
            if status != KILN_STATUS_SUCCESS {
                log::warn!(
                    "plugin `{name}`: a stream callback runs after failed work (status {status})"
                );
            }
            callback();
        });
        let st = self.raw.add_callback(dev.device_id, s, boxed);
        self.check(dev, "stream_add_callback", st)
    }

    fn raw_create_event(&self, dev: Device) -> DeviceResult<EventHandle> {
        let mut e: sys::KilnEvent = std::ptr::null_mut();
        let st = call_req!(self.raw, create_event(dev.device_id, &mut e));
        self.check(dev, "create_event", st)?;
        self.check_new_handle(dev, "create_event", "event", e as usize)?;
        Ok(EventHandle::from_raw(
            lock(&self.events).insert((dev.device_id, e as usize)),
        ))
    }

    fn raw_record_event(
        &self,
        dev: Device,
        stream: StreamHandle,
        event: EventHandle,
    ) -> DeviceResult<()> {
        let s = self.plugin_stream(dev, stream)?;
        let e = self.plugin_event(dev, event)?;
        let st = call_req!(self.raw, record_event(dev.device_id, s, e));
        self.check(dev, "record_event", st)
    }

    fn raw_query_event(&self, dev: Device, event: EventHandle) -> DeviceResult<bool> {
        let e = self.plugin_event(dev, event)?;
        match call_opt!(self.raw, query_event(dev.device_id, e)) {
            Some(KILN_STATUS_SUCCESS) => Ok(true),
            Some(KILN_STATUS_NOT_READY) => Ok(false),
            Some(st) => self.check(dev, "query_event", st).map(|()| false),
            None => {
                let st = call_req!(self.raw, synchronize_event(dev.device_id, e));
                self.check(dev, "synchronize_event (query_event fallback)", st)
                    .map(|()| true)
            }
        }
    }

    fn raw_sync_event(&self, dev: Device, event: EventHandle) -> DeviceResult<()> {
        let e = self.plugin_event(dev, event)?;
        let st = call_req!(self.raw, synchronize_event(dev.device_id, e));
        self.check(dev, "synchronize_event", st)
    }

    fn raw_stream_wait_event(
        &self,
        dev: Device,
        stream: StreamHandle,
        event: EventHandle,
    ) -> DeviceResult<()> {
        let s = self.plugin_stream(dev, stream)?;
        let e = self.plugin_event(dev, event)?;
        let st = call_req!(self.raw, stream_wait_event(dev.device_id, s, e));
        self.check(dev, "stream_wait_event", st)
    }

    fn raw_destroy_event(&self, dev: Device, event: EventHandle) -> DeviceResult<()> {
        let e = self.plugin_event(dev, event)?;
        lock(&self.events).remove(event.to_raw());
        let st = call_req!(self.raw, destroy_event(dev.device_id, e));
        self.check(dev, "destroy_event", st)
    }
}

impl PluginDeviceApi {
    /// Blocks until all work on every stream of `dev` has completed (`synchronize_device`, or
    /// every live stream of the device when the plugin lacks it).
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`]; the plugin's failures.
    pub fn synchronize_device(&self, dev: Device) -> DeviceResult<()> {
        self.check_device(dev)?;
        if let Some(st) = call_opt!(self.raw, synchronize_device(dev.device_id)) {
            return self.check(dev, "synchronize_device", st);
        }
        let mut streams: Vec<usize> = Vec::new();
        if let Some(Some(s)) = lock(&self.default_streams).get(dev.device_id as usize) {
            streams.push(*s);
        }
        {
            let mut t = lock(&self.streams);
            streams.extend(
                t.values_mut()
                    .filter(|(d, _)| *d == dev.device_id)
                    .map(|(_, s)| *s),
            );
        }
        for s in streams {
            self.sync_plugin_stream(dev, s as sys::KilnStream)?;
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------- loading

struct Loaded {
    path: PathBuf,
    api: Arc<PluginDeviceApi>,
}

fn loaded() -> &'static Mutex<Vec<Loaded>> {
    static LOADED: OnceLock<Mutex<Vec<Loaded>>> = OnceLock::new();
    LOADED.get_or_init(Default::default)
}

/// The plugins loaded in this process, in load order.
pub fn loaded_plugins() -> Vec<Arc<PluginDeviceApi>> {
    lock(loaded()).iter().map(|l| l.api.clone()).collect()
}

/// Loads the device plugin at `path` and registers it (see the module docs). Loading the same
/// file again returns the plugin loaded first.
///
/// Loading a plugin runs its code in this process, as any plugin host does: kiln checks what it
/// can before (that the file is a shared library defining `kiln_device_plugin_init`) and after
/// (sizes, versions, required entries), but a plugin that corrupts memory cannot be contained.
///
/// # Errors
/// [`PluginError`]: not a library, no entry, a failing entry, a version kiln does not support,
/// missing required entries, a failing `initialize`/`init_device`, a name already registered.
pub fn load_plugin(path: impl AsRef<Path>) -> Result<Arc<PluginDeviceApi>, PluginError> {
    let path = path.as_ref();
    crate::device_api::init();
    let canon = std::fs::canonicalize(path).map_err(|e| PluginError::NotALibrary {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut all = lock(loaded());
    if let Some(l) = all.iter().find(|l| l.path == canon) {
        return Ok(l.api.clone());
    }
    let api = Arc::new(open_plugin(&canon)?);
    register(&api)?;
    all.push(Loaded {
        path: canon,
        api: api.clone(),
    });
    Ok(api)
}

fn open_plugin(path: &Path) -> Result<PluginDeviceApi, PluginError> {
    let p = path.to_path_buf();
    let data = std::fs::read(path).map_err(|e| PluginError::NotALibrary {
        path: p.clone(),
        reason: e.to_string(),
    })?;
    match sys::defines_entry(&data) {
        Err(reason) => return Err(PluginError::NotALibrary { path: p, reason }),
        Ok(false) => {
            return Err(PluginError::NoEntry {
                path: p,
                reason: String::new(),
            })
        }
        Ok(true) => {}
    }
    drop(data);
    let (raw, entry) = RawPlugin::open(path)?;
    let name = entry.device_type.clone();
    let init_failed = |step: String, message: String| PluginError::InitFailed {
        path: p.clone(),
        device_type: name.clone(),
        step,
        message,
    };
    let msg = |raw: &RawPlugin| {
        raw.last_error()
            .unwrap_or_else(|| "the plugin gave no message".to_owned())
    };
    if let Some(s) = call_opt!(raw, initialize()) {
        if s != KILN_STATUS_SUCCESS {
            return Err(init_failed(format!("initialize (status {s})"), msg(&raw)));
        }
    }
    let mut count = 0usize;
    let s = call_req!(raw, get_device_count(&mut count));
    if s != KILN_STATUS_SUCCESS {
        let m = msg(&raw);
        let _ = call_opt!(raw, finalize());
        return Err(init_failed(format!("get_device_count (status {s})"), m));
    }
    if count > MAX_PLUGIN_DEVICES {
        let _ = call_opt!(raw, finalize());
        return Err(PluginError::Invalid {
            path: p.clone(),
            reason: format!(
                "get_device_count reported {count} devices; kiln accepts at most \
                 {MAX_PLUGIN_DEVICES}"
            ),
        });
    }
    for id in 0..count as i32 {
        if let Some(s) = call_opt!(raw, init_device(id)) {
            if s != KILN_STATUS_SUCCESS {
                let m = msg(&raw);
                for j in 0..id {
                    let _ = call_opt!(raw, deinit_device(j));
                }
                let _ = call_opt!(raw, finalize());
                return Err(init_failed(format!("init_device({id}) (status {s})"), m));
            }
        }
    }
    let device_list = if count > 0 && raw.table().get_device_list.is_some() {
        let mut ids = vec![0usize; count];
        match call_opt!(raw, get_device_list(ids.as_mut_ptr())) {
            Some(KILN_STATUS_SUCCESS) => {
                if let Err(reason) = check_device_list(&ids) {
                    for j in 0..count as i32 {
                        let _ = call_opt!(raw, deinit_device(j));
                    }
                    let _ = call_opt!(raw, finalize());
                    return Err(PluginError::Invalid { path: p, reason });
                }
                ids
            }
            _ => (0..count).collect(),
        }
    } else {
        (0..count).collect()
    };
    let mut api = PluginDeviceApi {
        info: PluginInfo {
            name: entry.device_type,
            sub_device_type: entry.sub_device_type,
            path: p.clone(),
            plugin_version: entry.plugin_version,
            abi: entry.abi,
            table_size: entry.table_size,
            code: DeviceType(0),
            device_count: count,
            device_list,
            absent_entries: sys::absent_optional_entries(raw.table()),
            kernels: Vec::new(),
            chunk_config: None,
        },
        raw,
        allocators: Vec::new(),
        unified: Mutex::new(BTreeMap::new()),
        streams: Mutex::new(HandleTable::new()),
        events: Mutex::new(HandleTable::new()),
        default_streams: Mutex::new(vec![None; count]),
        staging: Mutex::new(vec![None; count]),
        pinned_staging: AtomicBool::new(false),
        staging_chunk: AtomicUsize::new(DEFAULT_STAGING_CHUNK),
        staging_counts: Default::default(),
        code: AtomicI32::new(0),
        kernels: Mutex::new(Vec::new()),
    };
    let wants = count > 0 && {
        let mut v = sys::attr_value();
        call_opt!(
            api.raw,
            get_attribute(0, sys::KILN_ATTR_KIND_PINNED_STAGING, &mut v)
        ) == Some(KILN_STATUS_SUCCESS)
            && v.type_ == sys::KILN_ATTR_INT
            && v.int_value != 0
    };
    let on = match std::env::var(PINNED_STAGING_VAR).as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => wants,
    };
    api.pinned_staging.store(on, Ordering::Relaxed);
    let configs: Vec<ChunkConfig> = (0..count as i32).map(|i| api.query_config(i)).collect();
    api.info.chunk_config = configs.first().copied();
    api.allocators = configs
        .into_iter()
        .map(|c| Mutex::new(ChunkAllocator::new(c)))
        .collect();
    for id in 0..count as i32 {
        let r = lock(&api.allocators[id as usize]).preallocate(&mut Source { api: &api, dev: id });
        if let Err(m) = r {
            // `api` drops here: its Drop returns what was allocated and finalizes.
            return Err(init_failed(
                format!("the initial allocation on device {id}"),
                m,
            ));
        }
    }
    Ok(api)
}

/// The ids of `get_device_list`: distinct and usable as kiln device ids (below 2^31).
fn check_device_list(ids: &[usize]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, &id) in ids.iter().enumerate() {
        if i32::try_from(id).is_err() {
            return Err(format!(
                "get_device_list gave device id {id} at position {i}; expected ids below {}",
                i32::MAX as u64 + 1
            ));
        }
        if !seen.insert(id) {
            return Err(format!(
                "get_device_list gave device id {id} twice (again at position {i}); expected \
                 distinct ids"
            ));
        }
    }
    Ok(())
}

fn register(api: &Arc<PluginDeviceApi>) -> Result<(), PluginError> {
    let path = api.info.path.clone();
    let name = api.info.name.clone();
    let prefix = format!("{name}.");
    let kernels = api
        .raw
        .kernels(&prefix)
        .map_err(|(s, m)| PluginError::InitFailed {
            path: path.clone(),
            device_type: name.clone(),
            step: format!("get_kernels (status {s})"),
            message: m,
        })?;
    if let Some((k, _)) = kernels
        .iter()
        .find(|(k, _)| crate::packed_func::registry::get(k).is_some())
    {
        return Err(PluginError::Registration {
            path,
            source: DeviceError::Registration {
                name,
                code: 0,
                reason: format!(
                    "the global function `{k}` (a plugin kernel) is already registered"
                ),
            },
        });
    }
    // The code is chosen first and may be taken by a concurrent registration: retry then.
    let mut attempts = 0;
    loop {
        let code =
            super::registry::next_extension_code().map_err(|source| PluginError::Registration {
                path: path.clone(),
                source,
            })?;
        // `device_type()` must report the code when the registry checks it.
        api.code.store(code.0, Ordering::SeqCst);
        let dyn_api: Arc<dyn DeviceApi> = api.clone();
        match super::registry::register_device_api(&name, code, dyn_api) {
            Ok(()) => break,
            Err(source) => {
                let list = super::registry::list();
                let lost_race = list.iter().any(|(n, c)| *c == code && *n != name)
                    && !list.iter().any(|(n, _)| *n == name);
                attempts += 1;
                if !lost_race || attempts >= 8 {
                    api.code.store(0, Ordering::SeqCst);
                    return Err(PluginError::Registration { path, source });
                }
            }
        }
    }
    let mut names = Vec::new();
    for (k, f) in kernels {
        match crate::packed_func::registry::register(&k, f, false) {
            Ok(()) => names.push(k),
            Err(e) => log::warn!("plugin `{name}`: registering kernel `{k}`: {e}"),
        }
    }
    *lock(&api.kernels) = names;
    Ok(())
}

/// The outcome of loading every plugin in some directories.
#[derive(Debug, Default)]
pub struct PluginScan {
    /// The plugins loaded (or found loaded already).
    pub loaded: Vec<Arc<PluginDeviceApi>>,
    /// The files (or directories) that failed, with why. They were skipped.
    pub failed: Vec<(PathBuf, PluginError)>,
    /// Entries skipped without trying to load them (broken symbolic links), with why. Each is
    /// also logged as a warning.
    pub skipped: Vec<(PathBuf, String)>,
}

fn is_library_name(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".so") || name.contains(".so.") || name.ends_with(".dylib")
}

/// Loads every shared library (`*.so`, `*.so.*`, `*.dylib`) in each of `dirs`, in name order.
/// An entry of `dirs` that is a file (not a directory) is loaded as a plugin itself, whatever its
/// name. Bad files are reported in [`PluginScan::failed`] and skipped; broken symbolic links
/// with a library name are logged and listed in [`PluginScan::skipped`]; other files are
/// ignored.
pub fn load_plugins_from_dirs<I, P>(dirs: I) -> PluginScan
where
    I: IntoIterator<Item = P>,
    P: AsRef<Path>,
{
    let mut scan = PluginScan::default();
    for dir in dirs {
        let dir = dir.as_ref();
        let fail = |reason: String| {
            (
                dir.to_path_buf(),
                PluginError::NotALibrary {
                    path: dir.to_path_buf(),
                    reason,
                },
            )
        };
        match std::fs::metadata(dir) {
            Err(e) => {
                scan.failed.push(fail(format!(
                    "cannot read the plugin directory or file (expected a directory of plugins \
                     or a plugin file): {e}"
                )));
                continue;
            }
            Ok(m) if !m.is_dir() => {
                match load_plugin(dir) {
                    Ok(api) => scan.loaded.push(api),
                    Err(e) => scan.failed.push((dir.to_path_buf(), e)),
                }
                continue;
            }
            Ok(_) => {}
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                scan.failed
                    .push(fail(format!("cannot read the plugin directory: {e}")));
                continue;
            }
        };
        let mut files: Vec<PathBuf> = Vec::new();
        for p in entries.filter_map(Result::ok).map(|e| e.path()) {
            if !is_library_name(&p) {
                continue;
            }
            let is_link = std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink());
            match std::fs::metadata(&p) {
                Ok(m) if m.is_file() => files.push(p),
                Ok(_) => {}
                Err(e) if is_link => {
                    let target = std::fs::read_link(&p)
                        .map(|t| t.display().to_string())
                        .unwrap_or_else(|_| "?".to_owned());
                    let why = format!("a broken symbolic link to `{target}`: {e}");
                    log::warn!("skipping plugin `{}`: {why}", p.display());
                    scan.skipped.push((p, why));
                }
                Err(e) => scan.failed.push((
                    p.clone(),
                    PluginError::NotALibrary {
                        path: p,
                        reason: e.to_string(),
                    },
                )),
            }
        }
        files.sort();
        for f in files {
            match load_plugin(&f) {
                Ok(api) => scan.loaded.push(api),
                Err(e) => scan.failed.push((f, e)),
            }
        }
    }
    scan
}

/// Loads every plugin in the directories (or plugin files) of `KILN_PLUGIN_PATH`
/// (`:`-separated); nothing when it is unset or empty. See [`load_plugins_from_dirs`].
pub fn load_plugins_from_env() -> PluginScan {
    match std::env::var_os(PLUGIN_PATH_VAR) {
        Some(v) if !v.is_empty() => {
            load_plugins_from_dirs(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()))
        }
        _ => PluginScan::default(),
    }
}
