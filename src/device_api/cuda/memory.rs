//! The CUDA [`DeviceMemoryApi`]: allocations (device addresses, checked against each device's
//! table of live allocations), copies with `cuMemcpy*Async` (peer copies between devices),
//! memset with `cuMemsetD8Async`, statistics from `cuMemGetInfo`.
//!
//! The `unsafe` code here hands device ranges (after the table check) and the caller's host
//! ranges (the contract of `raw_copy`) to the driver's copy, memset and free calls.

use std::collections::{BTreeMap, HashSet};

use super::{sys, CudaDeviceApi};
use crate::device_api::device::{Device, DeviceType};
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::device_api::memory::{DeviceMemoryApi, DevicePtr, MemRegion, MemoryStats};
use crate::device_api::stream::StreamHandle;
use crate::packed_func::ffi::DLDataType;
use crate::util::lock;

/// `cuMemAlloc`'s alignment: larger alignments over-allocate.
const DRIVER_ALIGNMENT: usize = 256;

/// One live allocation.
#[derive(Clone, Copy, Debug)]
pub(super) struct Alloc {
    /// What `cuMemAlloc` returned (differs from the handed-out address when over-aligned).
    base: sys::CUdeviceptr,
    /// The bytes asked for, from the handed-out address.
    size: u64,
}

/// The live allocations of one device.
#[derive(Default)]
pub(super) struct MemTable {
    /// Handed-out address -> allocation; ordered, so an address inside an allocation is found.
    live: BTreeMap<u64, Alloc>,
    /// Addresses freed and not handed out again since.
    freed: HashSet<u64, foldhash::fast::RandomState>,
    in_use: u64,
    peak: u64,
}

impl MemTable {
    /// The allocation `ptr` lies in: `(its address, its size)`.
    pub(super) fn containing(&self, ptr: u64) -> Option<(u64, u64)> {
        let (&start, a) = self.live.range(..=ptr).next_back()?;
        (ptr - start < a.size).then_some((start, a.size))
    }
}

fn oob(
    op: &'static str,
    dev: Device,
    ptr: DevicePtr,
    offset: u64,
    nbytes: u64,
    allocation: Option<u64>,
) -> DeviceError {
    DeviceError::OutOfBounds {
        op,
        device: dev,
        ptr,
        offset,
        nbytes,
        allocation,
    }
}

impl CudaDeviceApi {
    /// The device address of `ptr + offset` on `dev`, after checking that `ptr` is a live
    /// allocation holding `offset + nbytes` bytes.
    fn region_addr(
        &self,
        op: &'static str,
        dev: Device,
        ptr: DevicePtr,
        offset: u64,
        nbytes: u64,
    ) -> DeviceResult<sys::CUdeviceptr> {
        let d = self.dev(dev)?;
        let mem = lock(&d.mem);
        let a = mem
            .live
            .get(&(ptr.0 as u64))
            .ok_or_else(|| oob(op, dev, ptr, offset, nbytes, None))?;
        if offset.checked_add(nbytes).is_none_or(|end| end > a.size) {
            return Err(oob(op, dev, ptr, offset, nbytes, Some(a.size)));
        }
        Ok(ptr.0 as u64 + offset)
    }
}

impl DeviceMemoryApi for CudaDeviceApi {
    fn raw_alloc(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        _dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr> {
        let d = self.dev(dev)?;
        let drv = self.drv(dev)?;
        let oom = |reason: String| DeviceError::OutOfMemory {
            device: dev,
            nbytes: nbytes as u64,
            align: align as u64,
            reason,
        };
        let extra = align.saturating_sub(DRIVER_ALIGNMENT);
        let total = nbytes
            .checked_add(extra)
            .ok_or_else(|| oom("the size overflows".to_owned()))?;
        // Out of memory is the caller's to handle (free and retry), not a failure of the device.
        let base = d
            .call(dev, || match drv.mem_alloc(total) {
                Err(e) if e.code == sys::CUDA_ERROR_OUT_OF_MEMORY => Ok(Err(e)),
                r => r.map(Ok),
            })?
            .map_err(|e| oom(e.to_string()))?;
        let addr = if extra == 0 {
            base
        } else {
            base.next_multiple_of(align as u64)
        };
        let mut mem = lock(&d.mem);
        mem.freed.remove(&addr);
        mem.live.insert(
            addr,
            Alloc {
                base,
                size: nbytes as u64,
            },
        );
        mem.in_use += nbytes as u64;
        mem.peak = mem.peak.max(mem.in_use);
        Ok(DevicePtr(addr as usize))
    }

    fn raw_free(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
        let d = self.dev(dev)?;
        let drv = self.drv(dev)?;
        let key = ptr.0 as u64;
        let (a, freed_here) = {
            let mut mem = lock(&d.mem);
            match mem.live.remove(&key) {
                Some(a) => {
                    mem.in_use -= a.size;
                    mem.freed.insert(key);
                    (Some(a), false)
                }
                None => (None, mem.freed.contains(&key)),
            }
        };
        let Some(a) = a else {
            // An address this device freed may be live on another device since (the driver
            // reuses virtual addresses across devices): then it is a foreign pointer here, not
            // a double free. Checked after this device's table is unlocked, one table at a time.
            let live_elsewhere = freed_here
                && self.runtime().is_ok_and(|r| {
                    r.devices
                        .iter()
                        .any(|o| !std::ptr::eq(o, d) && lock(&o.mem).live.contains_key(&key))
                });
            return Err(if freed_here && !live_elsewhere {
                DeviceError::DoubleFree { device: dev, ptr }
            } else {
                DeviceError::UnknownPointer {
                    device: dev,
                    ptr,
                    what: "the cuda backend".to_owned(),
                }
            });
        };
        d.call(dev, || {
            // SAFETY: `a.base` came from `cuMemAlloc` in this device's context (the table holds
            // only those) and was live until removed from the table just above, once.
            unsafe { drv.mem_free(a.base) }
        })
    }

    unsafe fn raw_copy(
        &self,
        src: MemRegion,
        dst: MemRegion,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        let mine = |r: MemRegion| r.device.device_type == DeviceType::CUDA;
        let n = nbytes as u64;
        let host = |r: MemRegion| (r.ptr.0 as *mut u8).wrapping_add(r.offset as usize);
        match (mine(src), mine(dst)) {
            (true, true) if src.device != dst.device => {
                // A peer copy, ordered on `stream` of the source device.
                let (sd, dd) = (self.dev(src.device)?, self.dev(dst.device)?);
                let drv = self.drv(src.device)?;
                let s = self.region_addr("copy", src.device, src.ptr, src.offset, n)?;
                let t = self.region_addr("copy", dst.device, dst.ptr, dst.offset, n)?;
                dd.check_fault(dst.device)?;
                let (sctx, dctx) = (sd.context(src.device)?, dd.context(dst.device)?);
                let st = self.stream(src.device, stream)?;
                sd.call(src.device, || {
                    // SAFETY: both ranges were checked against the live allocations of their
                    // devices; neither is freed before the copy completes (this function's
                    // contract).
                    unsafe { drv.memcpy_peer(t, dctx, s, sctx, nbytes, &st.stream) }
                })
            }
            (true, true) => {
                let dev = src.device;
                let d = self.dev(dev)?;
                let drv = self.drv(dev)?;
                let s = self.region_addr("copy", dev, src.ptr, src.offset, n)?;
                let t = self.region_addr("copy", dev, dst.ptr, dst.offset, n)?;
                let st = self.stream(dev, stream)?;
                d.call(dev, || {
                    // SAFETY: both ranges were checked against the device's live allocations.
                    unsafe { drv.memcpy_dtod(t, s, nbytes, &st.stream) }
                })
            }
            (false, true) => {
                let dev = dst.device;
                let d = self.dev(dev)?;
                let drv = self.drv(dev)?;
                let t = self.region_addr("copy", dev, dst.ptr, dst.offset, n)?;
                let st = self.stream(dev, stream)?;
                let from = host(src);
                d.call(dev, || {
                    // SAFETY: the device range was checked against the live allocations; the
                    // host source is readable for `nbytes` bytes until the copy completes (this
                    // function's contract).
                    unsafe { drv.memcpy_htod(t, from, nbytes, &st.stream) }
                })
            }
            (true, false) => {
                let dev = src.device;
                let d = self.dev(dev)?;
                let drv = self.drv(dev)?;
                let s = self.region_addr("copy", dev, src.ptr, src.offset, n)?;
                let st = self.stream(dev, stream)?;
                let to = host(dst);
                d.call(dev, || {
                    // SAFETY: the device range was checked; the host destination is writable for
                    // `nbytes` bytes until the copy completes (this function's contract).
                    unsafe { drv.memcpy_dtoh(to, s, nbytes, &st.stream) }
                })
            }
            (false, false) => Err(DeviceError::Unsupported {
                device: src.device,
                what: "copies between two non-CUDA devices".to_owned(),
            }),
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
        let d = self.dev(dev)?;
        let drv = self.drv(dev)?;
        let t = self.region_addr("memset", dev, ptr, offset, nbytes as u64)?;
        let st = self.stream(dev, stream)?;
        d.call(dev, || {
            // SAFETY: the range was checked against the device's live allocations.
            unsafe { drv.memset_d8(t, value, nbytes, &st.stream) }
        })
    }

    fn raw_memory_stats(&self, dev: Device) -> DeviceResult<MemoryStats> {
        let d = self.dev(dev)?;
        let drv = self.drv(dev)?;
        let (free, total) = d.call(dev, || drv.mem_get_info())?;
        let mem = lock(&d.mem);
        Ok(MemoryStats {
            total: Some(total),
            free: Some(free),
            in_use: mem.in_use,
            peak: mem.peak,
            allocations: mem.live.len() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Alloc, MemTable};

    #[test]
    fn an_address_inside_an_allocation_finds_it_and_one_past_the_end_does_not() {
        let mut t = MemTable::default();
        t.live.insert(
            0x1000,
            Alloc {
                base: 0x1000,
                size: 0x100,
            },
        );
        t.live.insert(
            0x2000,
            Alloc {
                base: 0x1f00,
                size: 8,
            },
        );
        assert_eq!(t.containing(0x1000), Some((0x1000, 0x100)));
        assert_eq!(t.containing(0x10ff), Some((0x1000, 0x100)));
        assert_eq!(t.containing(0x1100), None);
        assert_eq!(t.containing(0x0fff), None);
        assert_eq!(t.containing(0x2007), Some((0x2000, 8)));
        assert_eq!(t.containing(0x2008), None);
    }
}
