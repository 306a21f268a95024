//! The plugin's [`DeviceMemoryApi`]: device memory carved from the plugin's chunks by a
//! [`ChunkAllocator`] per device, every copy and memset checked against the live allocations,
//! the documented fallbacks for absent entries (async -> synchronize + sync copy, memset -> host
//! fill + h2d, p2p -> bounce through the host), and the pinned staging of host<->device copies
//! through the plugin's page-locked memory.
//!
//! The `unsafe` code here is the host side of staged copies: bytes copied between the caller's
//! host memory (`raw_copy`'s contract) and a staging buffer.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::allocator::{
    AllocFailure, ChunkAllocator, ChunkConfig, ChunkSource, ChunkStats, FreeFailure,
};
use super::sys::{self, call_opt, call_req, KilnStatus, KILN_STATUS_SUCCESS};
use super::PluginDeviceApi;
use crate::device_api::device::Device;
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::device_api::memory::{DeviceMemoryApi, DevicePtr, MemRegion, MemoryStats};
use crate::device_api::stream::StreamHandle;
use crate::packed_func::ffi::DLDataType;
use crate::util::lock;

/// The allocator's view of the plugin for one device.
pub(super) struct Source<'a> {
    pub(super) api: &'a PluginDeviceApi,
    pub(super) dev: i32,
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

    pub(super) fn query_config(&self, id: i32) -> ChunkConfig {
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
    pub(super) fn device_memory(&self, id: i32) -> Option<(Option<u64>, Option<u64>)> {
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
