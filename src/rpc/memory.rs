//! The memory a session allocated for its client, and the only copies a client can ask for.
//!
//! TVM's server trusts the client with raw pointers: a `DLTensor` on the wire carries an address,
//! and `CopyToRemote` writes wherever it points. kiln's server keeps a table of every allocation
//! it made for the session ([`Allocations`]) and checks each tensor a client sends against it: the
//! data handle must lie in a live allocation of the same device, and the bytes the tensor covers
//! must end inside it. A stale, forged or overlong tensor is an error message, never a write to
//! memory the session does not own. When the session ends, everything left in the table is
//! freed, so a client that forgets its tensors (or disconnects mid-call) leaks nothing.
//!
//! This file holds the server's `unsafe` code: turning a checked region into a host slice, and
//! device copies of checked regions.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::device_api::{registry, Device, DeviceApi, DevicePtr, DeviceType};
use crate::packed_func::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLTensor};

/// One allocation of the session.
struct Alloc {
    nbytes: u64,
    api: Arc<dyn DeviceApi>,
}

/// A checked range of a session's allocation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    /// The device.
    pub device: Device,
    /// The base pointer of the allocation.
    pub base: DevicePtr,
    /// Bytes from `base` to the first byte.
    pub offset: u64,
    /// The bytes of the region.
    pub nbytes: u64,
    host: bool,
}

/// Every allocation a session made, by device and base pointer.
#[derive(Default)]
pub(crate) struct Allocations {
    map: BTreeMap<(i32, i32, usize), Alloc>,
}

fn key(dev: Device, ptr: usize) -> (i32, i32, usize) {
    (dev.device_type.0, dev.device_id, ptr)
}

impl Allocations {
    /// Allocates `nbytes` on `dev` and records it.
    pub fn alloc(
        &mut self,
        dev: Device,
        nbytes: u64,
        align: u64,
        dtype: DLDataType,
    ) -> Result<DevicePtr, String> {
        let api = registry::get_for(dev).map_err(|e| e.to_string())?;
        let n = usize::try_from(nbytes).map_err(|_| format!("{nbytes} bytes is too large"))?;
        let align = usize::try_from(align.max(1)).unwrap_or(usize::MAX);
        let ptr = api
            .alloc_data_space(dev, n.max(1), align, dtype)
            .map_err(|e| e.to_string())?;
        self.map.insert(key(dev, ptr.0), Alloc { nbytes, api });
        Ok(ptr)
    }

    /// Frees an allocation of this session.
    pub fn free(&mut self, dev: Device, ptr: u64) -> Result<(), String> {
        let k = key(dev, ptr as usize);
        match self.map.remove(&k) {
            Some(a) => a
                .api
                .free_data_space(dev, DevicePtr(ptr as usize))
                .map_err(|e| e.to_string()),
            None => Err(format!(
                "{ptr:#x} is not an allocation of this session on {dev} (already freed, or never \
                 allocated here)"
            )),
        }
    }

    /// The number of live allocations.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Frees every allocation.
    pub fn free_all(&mut self) {
        for ((t, id, ptr), a) in std::mem::take(&mut self.map) {
            let dev = Device::new(DeviceType(t), id);
            if let Err(e) = a.api.free_data_space(dev, DevicePtr(ptr)) {
                log::warn!("rpc: freeing {ptr:#x} on {dev} at the end of a session: {e}");
            }
        }
    }

    /// Checks that `nbytes` bytes at `data + byte_offset` on `dev` lie in one live allocation.
    /// On a device whose pointers are handles (not host addresses) `data` must be the handle
    /// itself; on the host it may point inside the allocation.
    pub fn check(
        &self,
        dev: DLDevice,
        data: u64,
        byte_offset: u64,
        nbytes: u64,
        what: &str,
    ) -> Result<Region, String> {
        let dev = Device::from(dev);
        let data_us = usize::try_from(data).map_err(|_| format!("{what}: bad handle {data:#x}"))?;
        let found = self
            .map
            .range(..=key(dev, data_us))
            .next_back()
            .filter(|((t, id, _), _)| *t == dev.device_type.0 && *id == dev.device_id);
        let not_ours = || {
            format!(
                "{what}: {data:#x} on {dev} is not memory this session allocated (the session has \
                 {} allocations)",
                self.map.len()
            )
        };
        let ((_, _, base), a) = found.ok_or_else(not_ours)?;
        // A pointer past the end of the nearest allocation below it is in none of them.
        if data - *base as u64 >= a.nbytes.max(1) {
            return Err(not_ours());
        }
        let host = a.api.host_accessible();
        let inner = data - *base as u64;
        if inner != 0 && !host {
            return Err(format!(
                "{what}: {data:#x} is not the handle of an allocation on {dev} (device handles \
                 take no arithmetic; use byte_offset)"
            ));
        }
        let offset = inner.checked_add(byte_offset);
        let end = offset.and_then(|o| o.checked_add(nbytes));
        match (offset, end) {
            (Some(offset), Some(end)) if end <= a.nbytes => Ok(Region {
                device: dev,
                base: DevicePtr(*base),
                offset,
                nbytes,
                host,
            }),
            _ => Err(format!(
                "{what}: {nbytes} bytes at offset {} of the allocation {base:#x} on {dev} run past \
                 its end ({} bytes)",
                inner as u128 + byte_offset as u128,
                a.nbytes
            )),
        }
    }

    /// The region as host memory to write, when its device's pointers are host addresses.
    pub fn host_slice_mut(&mut self, r: Region) -> Option<&mut [u8]> {
        if !r.host || self.map.is_empty() {
            return None;
        }
        // SAFETY: `r` came from `check`, so `base + offset .. + nbytes` lies inside an allocation
        // of this table, which the host-accessible backend handed out as host memory and which
        // stays allocated while `self` is borrowed mutably (only `free`/`free_all`, which take
        // `&mut self`, release it). The session runs one request at a time and no kernel runs
        // during a copy, so nothing else accesses the bytes for the slice's lifetime.
        Some(unsafe {
            std::slice::from_raw_parts_mut(
                (r.base.0 as *mut u8).add(r.offset as usize),
                r.nbytes as usize,
            )
        })
    }

    /// The region as host memory to read.
    pub fn host_slice(&self, r: Region) -> Option<&[u8]> {
        if !r.host || self.map.is_empty() {
            return None;
        }
        // SAFETY: as in `host_slice_mut`; the shared borrow of the table keeps the allocation
        // alive and the session does not write it while the slice exists.
        Some(unsafe {
            std::slice::from_raw_parts(
                (r.base.0 as *const u8).add(r.offset as usize),
                r.nbytes as usize,
            )
        })
    }

    /// Copies `src` into the region (any device) and waits for the copy.
    pub fn write(&mut self, r: Region, src: &[u8]) -> Result<(), String> {
        debug_assert_eq!(src.len() as u64, r.nbytes);
        if let Some(dst) = self.host_slice_mut(r) {
            dst.copy_from_slice(src);
            return Ok(());
        }
        let api = registry::get_for(r.device).map_err(|e| e.to_string())?;
        let mut shape = [r.nbytes as i64];
        let mut host_shape = [r.nbytes as i64];
        let from = flat(src.as_ptr() as *mut _, cpu(), &mut host_shape, 0);
        let to = flat(r.base.as_raw(), r.device.into(), &mut shape, r.offset);
        // SAFETY: `from` covers exactly `src`; `to` is a checked region of a live allocation of
        // this session on `r.device`; both shapes hold one entry; the stream is synchronized
        // before `src` is released.
        unsafe { api.copy_data_from_to(&from, &to, api.current_stream(r.device)) }
            .and_then(|()| api.sync_stream(r.device, api.current_stream(r.device)))
            .map_err(|e| e.to_string())
    }

    /// Copies the region (any device) into a new buffer.
    pub fn read(&self, r: Region) -> Result<Vec<u8>, String> {
        if let Some(s) = self.host_slice(r) {
            return Ok(s.to_vec());
        }
        let api = registry::get_for(r.device).map_err(|e| e.to_string())?;
        let mut out = vec![0u8; r.nbytes as usize];
        let mut shape = [r.nbytes as i64];
        let mut host_shape = [r.nbytes as i64];
        let from = flat(r.base.as_raw(), r.device.into(), &mut shape, r.offset);
        let to = flat(out.as_mut_ptr() as *mut _, cpu(), &mut host_shape, 0);
        // SAFETY: as in `write`, with the roles swapped; `out` outlives the synchronized copy.
        unsafe { api.copy_data_from_to(&from, &to, api.current_stream(r.device)) }
            .and_then(|()| api.sync_stream(r.device, api.current_stream(r.device)))
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Copies between two checked regions of equal size (`CopyAmongRemote`).
    pub fn copy(&mut self, from: Region, to: Region) -> Result<(), String> {
        let dev = if from.device.device_type == DeviceType::CPU {
            to.device
        } else {
            from.device
        };
        let api = registry::get_for(dev).map_err(|e| e.to_string())?;
        let mut s1 = [from.nbytes as i64];
        let mut s2 = [to.nbytes as i64];
        let a = flat(from.base.as_raw(), from.device.into(), &mut s1, from.offset);
        let b = flat(to.base.as_raw(), to.device.into(), &mut s2, to.offset);
        // SAFETY: both are checked regions of live allocations of this session, of equal size;
        // the copy completes before the table can be changed again.
        unsafe { api.copy_data_from_to(&a, &b, api.current_stream(dev)) }
            .and_then(|()| api.sync_stream(dev, api.current_stream(dev)))
            .map_err(|e| e.to_string())
    }
}

impl Drop for Allocations {
    fn drop(&mut self) {
        self.free_all();
    }
}

fn cpu() -> DLDevice {
    Device::new(DeviceType::CPU, 0).into()
}

fn flat(data: *mut std::ffi::c_void, device: DLDevice, shape: &mut [i64; 1], off: u64) -> DLTensor {
    DLTensor {
        data,
        device,
        ndim: 1,
        dtype: DLDataType {
            code: DLDataTypeCode::UINT,
            bits: 8,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: off,
    }
}

impl Allocations {
    /// Evicts a checked region from the CPU's caches (`cache_flush_cpu_non_first_arg`, so that a
    /// timed kernel starts cold). Other devices have nothing to flush.
    pub fn flush_from_cache(&self, r: Region) {
        let Some(bytes) = self.host_slice(r) else {
            return;
        };
        #[cfg(target_arch = "x86_64")]
        for line in bytes.chunks(64) {
            // SAFETY: `clflush` takes any address; this one is inside a live host allocation
            // of the session (`host_slice` checked it). SSE2 is part of x86-64.
            unsafe { std::arch::x86_64::_mm_clflush(line.as_ptr()) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            // No portable flush: stream through a buffer larger than any cache.
            let scratch = vec![1u8; 64 << 20];
            std::hint::black_box(scratch.iter().map(|&b| b as u64).sum::<u64>());
            let _ = bytes;
        }
    }
}
