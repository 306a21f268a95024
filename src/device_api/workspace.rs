//! [`WorkspacePool`]: temporary buffers with reuse, layered over any [`DeviceApi`]; the per-thread
//! pools behind [`DeviceApi::alloc_workspace`] and the runtime entry points
//! `TVMBackendAllocWorkspace` / `TVMBackendFreeWorkspace` that generated code calls.
//!
//! # Design
//! TVM's pool keeps one sorted free list and assumes LIFO frees (any other order is a linear
//! search) and never gives memory back before thread exit. Here:
//! - sizes round up to *size classes* (4 KiB, then four classes per power of two, so at most 25%
//!   waste); each class has its own free list, so alloc and free are O(1) in any order;
//! - live blocks sit in a hash map, so freeing a pointer the pool never gave out (or one given
//!   out on another thread) is a clear error;
//! - [`WorkspacePool::trim`] returns cached blocks to the device on demand, an optional cap
//!   bounds the cache, and an allocation that fails trims the cache and retries once;
//! - [`WorkspaceStats`] counts hits, misses, bytes in use, cached and the peak.
//!
//! The per-thread pools are freed when their thread exits (cached blocks go back to the device;
//! blocks still in use are leaked with a warning, since someone may still use them).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::api::{DeviceApi, ALLOC_ALIGNMENT};
use super::device::{Device, DeviceType};
use super::error::{DeviceError, DeviceResult};
use super::memory::DevicePtr;
use crate::packed_func::ffi::{DLDataType, DLDataTypeCode};
use crate::util::panic_message;

/// The smallest size class (TVM's `kWorkspacePageSize`).
pub const WORKSPACE_PAGE: usize = 4 << 10;

/// A hasher for addresses: one multiply, then the high bits folded down (pointers are aligned,
/// so their low bits carry nothing).
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_usize(&mut self, i: usize) {
        self.0 = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type AddrMap<V> = HashMap<usize, V, BuildHasherDefault<AddrHasher>>;

/// How many live blocks are tracked in the small vector before the hash map takes over.
const SMALL_LIVE: usize = 16;

/// The size class of `nbytes` (> 0) and its size in bytes.
pub fn size_class(nbytes: usize) -> (usize, usize) {
    if nbytes <= WORKSPACE_PAGE {
        return (0, WORKSPACE_PAGE);
    }
    let p = (usize::BITS - 1 - (nbytes - 1).leading_zeros()) as usize; // floor(log2(n - 1)) >= 12
    let shift = p - 2;
    let k = ((nbytes - 1) >> shift) + 1; // 5..=8
    (1 + (p - 12) * 4 + (k - 5), k << shift)
}

/// Counters of a [`WorkspacePool`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize)]
pub struct WorkspaceStats {
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that went to the device.
    pub misses: u64,
    /// Bytes (rounded to size classes) held by callers.
    pub in_use: u64,
    /// Bytes cached for reuse.
    pub cached: u64,
    /// The largest `in_use + cached` seen: what the pool took from the device at most.
    pub peak: u64,
    /// Blocks held by callers.
    pub live_blocks: u64,
}

/// A pool of temporary buffers of one device, over any backend. Not shared between threads (the
/// runtime keeps one per thread and device).
pub struct WorkspacePool {
    api: Arc<dyn DeviceApi>,
    device: Device,
    free: Vec<Vec<DevicePtr>>,
    /// Live blocks: the most recent few in a small vector (scanned from the end, so LIFO frees
    /// cost one compare and any order at most [`SMALL_LIVE`]), the rest in a hash map.
    live_small: Vec<(usize, u32)>,
    live: AddrMap<u32>,
    stats: WorkspaceStats,
    max_cached: Option<u64>,
}

impl std::fmt::Debug for WorkspacePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkspacePool")
            .field("device", &self.device)
            .field("stats", &self.stats)
            .finish()
    }
}

fn class_bytes(class: usize) -> usize {
    if class == 0 {
        WORKSPACE_PAGE
    } else {
        let p = 12 + (class - 1) / 4;
        let k = 5 + (class - 1) % 4;
        k << (p - 2)
    }
}

impl WorkspacePool {
    /// A pool for `device`, allocating through `api`.
    pub fn new(api: Arc<dyn DeviceApi>, device: Device) -> Self {
        Self {
            api,
            device,
            free: Vec::new(),
            live_small: Vec::with_capacity(SMALL_LIVE),
            live: AddrMap::default(),
            stats: WorkspaceStats::default(),
            max_cached: None,
        }
    }

    /// Caps the bytes kept for reuse (`None`: no cap, TVM's behaviour). Blocks freed beyond the
    /// cap go back to the device at once.
    pub fn set_max_cached(&mut self, max: Option<u64>) {
        self.max_cached = max;
        if let Some(m) = max {
            self.release_to(m);
        }
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The counters.
    pub fn stats(&self) -> WorkspaceStats {
        self.stats
    }

    /// A buffer of at least `nbytes` bytes, 64-byte aligned.
    ///
    /// # Errors
    /// [`DeviceError::ZeroSize`]; [`DeviceError::OutOfMemory`] after trimming the cache and
    /// retrying once.
    #[inline]
    pub fn alloc(&mut self, nbytes: usize) -> DeviceResult<DevicePtr> {
        if nbytes == 0 {
            return Err(DeviceError::ZeroSize {
                device: self.device,
            });
        }
        if nbytes > isize::MAX as usize / 2 {
            return Err(DeviceError::OutOfMemory {
                device: self.device,
                nbytes: nbytes as u64,
                align: ALLOC_ALIGNMENT as u64,
                reason: "the size exceeds the largest workspace size class".to_owned(),
            });
        }
        let (class, bytes) = size_class(nbytes);
        let ptr = match self.free.get_mut(class).and_then(Vec::pop) {
            Some(p) => {
                self.stats.hits += 1;
                self.stats.cached -= bytes as u64;
                p
            }
            None => self.alloc_miss(nbytes, bytes)?,
        };
        if self.live_small.len() < SMALL_LIVE {
            self.live_small.push((ptr.0, class as u32));
        } else {
            self.live.insert(ptr.0, class as u32);
        }
        self.stats.in_use += bytes as u64;
        self.stats.live_blocks += 1;
        self.stats.peak = self.stats.peak.max(self.stats.in_use + self.stats.cached);
        Ok(ptr)
    }

    /// A block from the device (cache miss); trims and retries once when the device is full.
    #[cold]
    fn alloc_miss(&mut self, nbytes: usize, bytes: usize) -> DeviceResult<DevicePtr> {
        let hint = DLDataType {
            code: DLDataTypeCode::UINT,
            bits: 8,
            lanes: 1,
        };
        let p = match self
            .api
            .alloc_data_space(self.device, bytes, ALLOC_ALIGNMENT, hint)
        {
            Err(DeviceError::OutOfMemory { .. }) if self.stats.cached > 0 => {
                self.trim();
                self.api
                    .alloc_data_space(self.device, bytes, ALLOC_ALIGNMENT, hint)
            }
            r => r,
        }
        .map_err(|e| match e {
            DeviceError::OutOfMemory {
                device,
                align,
                reason,
                ..
            } => DeviceError::OutOfMemory {
                device,
                nbytes: nbytes as u64,
                align,
                reason: format!("workspace of size class {bytes}: {reason}"),
            },
            e => e,
        })?;
        self.stats.misses += 1;
        Ok(p)
    }

    /// Gives a buffer back to the pool (any order).
    ///
    /// # Errors
    /// [`DeviceError::UnknownPointer`] for a pointer this pool does not hold (never allocated
    /// here, allocated on another thread, or freed already).
    #[inline]
    pub fn free(&mut self, ptr: DevicePtr) -> DeviceResult<()> {
        let found = match self.live_small.iter().rposition(|(p, _)| *p == ptr.0) {
            Some(i) => Some(self.live_small.swap_remove(i).1),
            None => self.live.remove(&ptr.0),
        };
        let Some(class) = found else {
            return Err(DeviceError::UnknownPointer {
                device: self.device,
                ptr,
                what: "this thread's workspace pool (freed twice, allocated on another thread, \
                       or never a workspace)"
                    .to_owned(),
            });
        };
        let class = class as usize;
        let bytes = class_bytes(class) as u64;
        self.stats.in_use -= bytes;
        self.stats.live_blocks -= 1;
        if self
            .max_cached
            .is_some_and(|m| self.stats.cached + bytes > m)
        {
            return self.api.free_data_space(self.device, ptr);
        }
        if self.free.len() <= class {
            self.free.resize_with(class + 1, Vec::new);
        }
        self.free[class].push(ptr);
        self.stats.cached += bytes;
        Ok(())
    }

    /// Returns every cached block to the device; returns the bytes released.
    pub fn trim(&mut self) -> u64 {
        self.release_to(0)
    }

    /// Returns cached blocks to the device, largest first, until at most `keep` bytes stay
    /// cached; returns the bytes released.
    pub fn release_to(&mut self, keep: u64) -> u64 {
        let mut released = 0;
        for class in (0..self.free.len()).rev() {
            let bytes = class_bytes(class) as u64;
            while self.stats.cached > keep {
                let Some(p) = self.free[class].pop() else {
                    break;
                };
                if let Err(e) = self.api.free_data_space(self.device, p) {
                    log::warn!("workspace pool on {}: {e}", self.device);
                }
                self.stats.cached -= bytes;
                released += bytes;
            }
        }
        released
    }
}

impl Drop for WorkspacePool {
    fn drop(&mut self) {
        self.trim();
        let live = self.live.len() + self.live_small.len();
        if live > 0 {
            log::warn!(
                "workspace pool on {}: {live} block(s) still in use when the pool was dropped; leaked",
                self.device,
            );
        }
    }
}

struct ThreadPool {
    /// The backend's data address, to tell whether a caller is the registered backend.
    api_addr: *const (),
    pool: WorkspacePool,
}

thread_local! {
    static POOLS: RefCell<Vec<ThreadPool>> = const { RefCell::new(Vec::new()) };
}

fn with_pool<R>(
    dev: Device,
    want: Option<*const ()>,
    f: impl FnOnce(&mut WorkspacePool) -> R,
) -> Option<DeviceResult<R>> {
    POOLS
        .try_with(|pools| {
            let mut pools = pools.try_borrow_mut().ok()?;
            let i = match pools.iter().position(|p| p.pool.device == dev) {
                Some(i) => i,
                None => {
                    let api = match super::registry::get(dev.device_type) {
                        Ok(a) => a,
                        Err(e) => return if want.is_some() { None } else { Some(Err(e)) },
                    };
                    if let Err(e) = api.check_device(dev) {
                        return Some(Err(e));
                    }
                    let api_addr = Arc::as_ptr(&api) as *const ();
                    pools.push(ThreadPool {
                        api_addr,
                        pool: WorkspacePool::new(api, dev),
                    });
                    pools.len() - 1
                }
            };
            let tp = &mut pools[i];
            if want.is_some_and(|w| w != tp.api_addr) {
                return None;
            }
            Some(Ok(f(&mut tp.pool)))
        })
        .ok()
        .flatten()
}

/// For [`DeviceApi::alloc_workspace`]: `None` when the caller (`api_addr`) is not the registered
/// backend of `dev`'s type (it then allocates directly).
pub(crate) fn thread_alloc_for(
    api_addr: *const (),
    dev: Device,
    nbytes: usize,
) -> Option<DeviceResult<DevicePtr>> {
    with_pool(dev, Some(api_addr), |p| p.alloc(nbytes)).map(|r| r.and_then(|x| x))
}

/// For [`DeviceApi::free_workspace`]; see [`thread_alloc_for`].
pub(crate) fn thread_free_for(
    api_addr: *const (),
    dev: Device,
    ptr: DevicePtr,
) -> Option<DeviceResult<()>> {
    with_pool(dev, Some(api_addr), |p| p.free(ptr)).map(|r| r.and_then(|x| x))
}

/// Allocates a workspace of `nbytes` bytes from this thread's pool for `dev` (the registered
/// backend's).
///
/// # Errors
/// [`DeviceError::NoBackend`]/[`DeviceError::InvalidDevice`]; the pool's errors.
pub fn alloc(dev: Device, nbytes: usize) -> DeviceResult<DevicePtr> {
    // Fast path: this thread already has a pool for `dev`.
    let fast = POOLS.try_with(|pools| {
        let mut pools = pools.try_borrow_mut().ok()?;
        let tp = pools.iter_mut().find(|p| p.pool.device == dev)?;
        Some(tp.pool.alloc(nbytes))
    });
    match fast {
        Ok(Some(r)) => r,
        _ => with_pool(dev, None, |p| p.alloc(nbytes))
            .unwrap_or_else(|| Err(thread_exiting(dev)))
            .and_then(|x| x),
    }
}

/// Frees a workspace from [`alloc`] on the same thread.
///
/// # Errors
/// [`DeviceError::UnknownPointer`] for a pointer this thread's pool does not hold.
pub fn free(dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
    let fast = POOLS.try_with(|pools| {
        let mut pools = pools.try_borrow_mut().ok()?;
        let tp = pools.iter_mut().find(|p| p.pool.device == dev)?;
        Some(tp.pool.free(ptr))
    });
    match fast {
        Ok(Some(r)) => r,
        _ => with_pool(dev, None, |p| p.free(ptr))
            .unwrap_or_else(|| Err(thread_exiting(dev)))
            .and_then(|x| x),
    }
}

fn thread_exiting(dev: Device) -> DeviceError {
    DeviceError::Backend {
        device: dev,
        message: "the thread's workspace pools are unavailable (thread exiting, or re-entered)"
            .to_owned(),
    }
}

/// Returns every cached block of this thread's pools to the devices; returns the bytes released.
pub fn trim_thread_pools() -> u64 {
    POOLS
        .try_with(|p| {
            p.try_borrow_mut()
                .map(|mut v| v.iter_mut().map(|t| t.pool.trim()).sum())
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// The counters of this thread's pool for `dev`, if it has one.
pub fn thread_stats(dev: Device) -> Option<WorkspaceStats> {
    POOLS
        .try_with(|p| {
            p.try_borrow()
                .ok()?
                .iter()
                .find(|t| t.pool.device == dev)
                .map(|t| t.pool.stats())
        })
        .ok()
        .flatten()
}

/// Caps the cached bytes of this thread's pool for `dev` (creating it if needed).
///
/// # Errors
/// As [`alloc`].
pub fn set_thread_max_cached(dev: Device, max: Option<u64>) -> DeviceResult<()> {
    with_pool(dev, None, |p| p.set_max_cached(max)).unwrap_or_else(|| Err(thread_exiting(dev)))
}

fn raise(e: &DeviceError) {
    crate::packed_func::ffi::set_raised(e.kind(), &e.to_string());
}

/// kiln's `TVMBackendAllocWorkspace`: a temporary buffer from this thread's pool for
/// `(device_type, device_id)`, 64-byte aligned; NULL after raising an error. A request for 0
/// bytes gets one page, as in TVM (generated code may compute a zero size). Never unwinds.
pub extern "C" fn backend_alloc_workspace(
    device_type: i32,
    device_id: i32,
    nbytes: u64,
    dtype_code_hint: i32,
    dtype_bits_hint: i32,
) -> *mut c_void {
    let _ = (dtype_code_hint, dtype_bits_hint);
    let r = std::panic::catch_unwind(|| {
        let dev = Device::new(DeviceType(device_type), device_id);
        let n = usize::try_from(nbytes).unwrap_or(usize::MAX).max(1);
        match alloc(dev, n) {
            Ok(p) => p.as_raw(),
            Err(e) => {
                raise(&e);
                std::ptr::null_mut()
            }
        }
    });
    r.unwrap_or_else(|p| {
        crate::packed_func::ffi::set_raised(
            "RuntimeError",
            &format!("TVMBackendAllocWorkspace panicked: {}", panic_message(&*p)),
        );
        std::ptr::null_mut()
    })
}

/// kiln's `TVMBackendFreeWorkspace`: 0 on success, -1 after raising an error (unknown pointer,
/// double free, wrong thread). Never unwinds.
pub extern "C" fn backend_free_workspace(
    device_type: i32,
    device_id: i32,
    ptr: *mut c_void,
) -> i32 {
    let r = std::panic::catch_unwind(|| {
        let dev = Device::new(DeviceType(device_type), device_id);
        match free(dev, DevicePtr::from_raw(ptr)) {
            Ok(()) => 0,
            Err(e) => {
                raise(&e);
                -1
            }
        }
    });
    r.unwrap_or_else(|p| {
        crate::packed_func::ffi::set_raised(
            "RuntimeError",
            &format!("TVMBackendFreeWorkspace panicked: {}", panic_message(&*p)),
        );
        -1
    })
}

/// The signature of `TVMBackendAllocWorkspace`.
pub type BackendAllocWorkspaceFn = extern "C" fn(i32, i32, u64, i32, i32) -> *mut c_void;
/// The signature of `TVMBackendFreeWorkspace`.
pub type BackendFreeWorkspaceFn = extern "C" fn(i32, i32, *mut c_void) -> i32;

/// The address of [`backend_alloc_workspace`], for a JIT to bind `TVMBackendAllocWorkspace`.
pub fn backend_alloc_workspace_ptr() -> usize {
    let f: BackendAllocWorkspaceFn = backend_alloc_workspace;
    f as usize
}

/// The address of [`backend_free_workspace`], for a JIT to bind `TVMBackendFreeWorkspace`.
pub fn backend_free_workspace_ptr() -> usize {
    let f: BackendFreeWorkspaceFn = backend_free_workspace;
    f as usize
}
