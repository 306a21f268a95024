//! The CPU's [`DeviceMemoryApi`]: host memory from the system allocator, tracked so that bad
//! frees are errors, and the host copies (flat and strided). This file holds the backend's
//! `unsafe` code.

use std::alloc::Layout;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::MutexGuard;

use super::{meminfo, CpuDeviceApi};
use crate::device_api::api::{shape_of, strides_of, ALLOC_ALIGNMENT};
use crate::device_api::device::Device;
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::device_api::memory::{DeviceMemoryApi, DevicePtr, MemRegion, MemoryStats};
use crate::device_api::stream::StreamHandle;
use crate::packed_func::ffi::{DLDataType, DLTensor};

/// How many freed addresses are remembered to tell a double free from an unknown pointer.
const FREED_MEMORY: usize = 1 << 14;

#[derive(Default)]
pub(super) struct Heap {
    /// Live allocations: address -> layout.
    live: BTreeMap<usize, Layout>,
    /// Recently freed addresses (for double-free detection), in free order.
    freed: HashSet<usize>,
    freed_order: VecDeque<usize>,
    in_use: u64,
    peak: u64,
}

impl CpuDeviceApi {
    // A panic while a lock is held leaves the maps consistent (each update is one insert or
    // remove), so a poisoned lock is still usable.
    fn heap(&self) -> MutexGuard<'_, Heap> {
        self.heap.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks that `[ptr + offset, + nbytes)` lies inside one live allocation.
    fn check_range(
        &self,
        op: &'static str,
        dev: Device,
        ptr: DevicePtr,
        offset: u64,
        nbytes: usize,
    ) -> DeviceResult<usize> {
        let oob = || DeviceError::OutOfBounds {
            op,
            device: dev,
            ptr,
            offset,
            nbytes: nbytes as u64,
            allocation: None,
        };
        let start = usize::try_from(offset)
            .ok()
            .and_then(|o| ptr.0.checked_add(o))
            .ok_or_else(oob)?;
        let end = start.checked_add(nbytes).ok_or_else(oob)?;
        let heap = self.heap();
        let (&base, layout) = heap.live.range(..=start).next_back().ok_or_else(oob)?;
        if end > base + layout.size() {
            return Err(oob());
        }
        Ok(start)
    }
}

impl DeviceMemoryApi for CpuDeviceApi {
    fn raw_alloc(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        _dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr> {
        let align = align.max(ALLOC_ALIGNMENT);
        let oom = |reason: &str| DeviceError::OutOfMemory {
            device: dev,
            nbytes: nbytes as u64,
            align: align as u64,
            reason: reason.to_owned(),
        };
        let layout = Layout::from_size_align(nbytes, align)
            .map_err(|_| oom("the size exceeds isize::MAX once aligned"))?;
        if layout.size() == 0 {
            return Err(DeviceError::ZeroSize { device: dev });
        }
        // Zeroed, so that safe code never reads uninitialised bytes (`Tensor::empty` followed by
        // `to_vec`). Large zeroed allocations come from fresh pages, so this costs little.
        // SAFETY: the layout has a non-zero size (checked above).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(oom("the system allocator returned NULL"));
        }
        let addr = p as usize;
        let mut heap = self.heap();
        heap.live.insert(addr, layout);
        heap.freed.remove(&addr);
        heap.in_use += nbytes as u64;
        heap.peak = heap.peak.max(heap.in_use);
        Ok(DevicePtr(addr))
    }

    fn raw_free(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
        let mut heap = self.heap();
        let Some(layout) = heap.live.remove(&ptr.0) else {
            return Err(if heap.freed.contains(&ptr.0) {
                DeviceError::DoubleFree { device: dev, ptr }
            } else {
                DeviceError::UnknownPointer {
                    device: dev,
                    ptr,
                    what: "the cpu backend".to_owned(),
                }
            });
        };
        heap.in_use -= layout.size() as u64;
        if heap.freed_order.len() >= FREED_MEMORY {
            if let Some(old) = heap.freed_order.pop_front() {
                heap.freed.remove(&old);
            }
        }
        heap.freed.insert(ptr.0);
        heap.freed_order.push_back(ptr.0);
        drop(heap);
        // SAFETY: `ptr` was returned by `std::alloc::alloc` with `layout` (it was in `live`,
        // which only `raw_alloc` fills) and is removed from `live`, so it is freed once.
        unsafe { std::alloc::dealloc(ptr.0 as *mut u8, layout) };
        Ok(())
    }

    unsafe fn raw_copy(
        &self,
        src: MemRegion,
        dst: MemRegion,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        // The copy runs at once, but a freed stream is still an error (as on every backend).
        Self::check_stream(&self.queues(), src.device, stream)?;
        for r in [src, dst] {
            if !r.device.is_cpu() {
                return Err(DeviceError::Unsupported {
                    device: r.device,
                    what: "copies by the cpu backend (the device's own backend copies)".to_owned(),
                });
            }
        }
        let addr = |r: MemRegion| {
            usize::try_from(r.offset)
                .ok()
                .and_then(|o| r.ptr.0.checked_add(o))
                .filter(|a| a.checked_add(nbytes).is_some())
                .ok_or_else(|| {
                    DeviceError::InvalidTensor(format!(
                        "byte offset {} from {} overflows the address space",
                        r.offset, r.ptr
                    ))
                })
        };
        let (s, d) = (addr(src)?, addr(dst)?);
        // SAFETY: both are host ranges valid for `nbytes` bytes (caller); `copy` allows overlap.
        unsafe { std::ptr::copy(s as *const u8, d as *mut u8, nbytes) };
        Ok(())
    }

    unsafe fn raw_copy_strided(
        &self,
        from: &DLTensor,
        to: &DLTensor,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        Self::check_stream(&self.queues(), Device::cpu(), stream)?;
        // SAFETY: forwarded contract (host memory on the CPU).
        unsafe { strided_copy_host(from, to) }
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
        Self::check_stream(&self.queues(), dev, stream)?;
        let start = self.check_range("memset", dev, ptr, offset, nbytes)?;
        // SAFETY: `[start, start + nbytes)` lies inside a live allocation (checked above).
        unsafe { std::ptr::write_bytes(start as *mut u8, value, nbytes) };
        Ok(())
    }

    fn raw_memory_stats(&self, _dev: Device) -> DeviceResult<MemoryStats> {
        let (total, free) = meminfo();
        let heap = self.heap();
        Ok(MemoryStats {
            total,
            free,
            in_use: heap.in_use,
            peak: heap.peak,
            allocations: heap.live.len() as u64,
        })
    }

    fn host_accessible(&self) -> bool {
        true
    }
}

/// Copies the elements of `from` into `to` on the host, walking both tensors' strides.
///
/// # Errors
/// [`DeviceError::Unsupported`] for dtypes whose elements are not whole bytes.
///
/// # Safety
/// - Both tensors have the same shape and dtype, and their `shape`/`strides` hold `ndim` entries.
/// - Every element they address (`data + byte_offset + index · strides · elem_size`) is valid host
///   memory, readable for `from` and writable for `to`.
pub(crate) unsafe fn strided_copy_host(from: &DLTensor, to: &DLTensor) -> DeviceResult<()> {
    // SAFETY: shapes and strides hold `ndim` entries (caller).
    let (shape, fs, ts) = unsafe { (shape_of(from)?, strides_of(from), strides_of(to)) };
    let bits = usize::from(from.dtype.bits) * usize::from(from.dtype.lanes);
    if bits % 8 != 0 {
        return Err(DeviceError::Unsupported {
            device: from.device.into(),
            what: format!("strided copies of {bits}-bit elements"),
        });
    }
    let elem = (bits / 8) as isize;
    if shape.contains(&0) || elem == 0 {
        return Ok(());
    }
    let fs = fs.map_or_else(|| crate::util::compact_strides(shape), <[i64]>::to_vec);
    let ts = ts.map_or_else(|| crate::util::compact_strides(shape), <[i64]>::to_vec);
    let fbase = (from.data as *const u8).wrapping_add(from.byte_offset as usize);
    let tbase = (to.data as *mut u8).wrapping_add(to.byte_offset as usize);
    let nd = shape.len();
    if nd == 0 {
        // SAFETY: one element at each base (caller).
        unsafe { std::ptr::copy(fbase, tbase, elem as usize) };
        return Ok(());
    }
    let inner = shape[nd - 1] as isize;
    let (fin, tin) = (fs[nd - 1] as isize * elem, ts[nd - 1] as isize * elem);
    let mut idx = vec![0i64; nd - 1];
    loop {
        let mut fo: isize = 0;
        let mut to_: isize = 0;
        for (d, &i) in idx.iter().enumerate() {
            fo += i as isize * fs[d] as isize * elem;
            to_ += i as isize * ts[d] as isize * elem;
        }
        let (f, t) = (fbase.wrapping_offset(fo), tbase.wrapping_offset(to_));
        if fin == elem && tin == elem {
            // SAFETY: a contiguous run of `inner` elements in both tensors (caller).
            unsafe { std::ptr::copy(f, t, (inner * elem) as usize) };
        } else {
            for j in 0..inner {
                let (src, dst) = (f.wrapping_offset(j * fin), t.wrapping_offset(j * tin));
                // SAFETY: each addresses one element of its tensor (caller); unaligned
                // accesses because strides in elements do not guarantee alignment of `data`.
                unsafe {
                    match elem {
                        1 => *dst = *src,
                        2 => dst
                            .cast::<u16>()
                            .write_unaligned(src.cast::<u16>().read_unaligned()),
                        4 => dst
                            .cast::<u32>()
                            .write_unaligned(src.cast::<u32>().read_unaligned()),
                        8 => dst
                            .cast::<u64>()
                            .write_unaligned(src.cast::<u64>().read_unaligned()),
                        n => std::ptr::copy(src, dst, n as usize),
                    }
                }
            }
        }
        // Advance the odometer over the outer dimensions.
        let mut d = nd - 1;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}
