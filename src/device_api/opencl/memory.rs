//! The OpenCL [`DeviceMemoryApi`]: buffers (`cl_mem` handles, checked against each device's table
//! of live buffers), copies with `clEnqueue{Read,Write,Copy}Buffer` and, for strided layouts that
//! are one rectangle, `clEnqueue*BufferRect`; memset with `clEnqueueFillBuffer`.
//!
//! The only `unsafe` code here forwards the host-pointer contract of `raw_copy` /
//! `raw_copy_strided` to the enqueue calls of `sys.rs`, and reads a tensor's shape and strides.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{driver, sys, OpenClDeviceApi};
use crate::device_api::api::{shape_of, strides_of};
use crate::device_api::device::{Device, DeviceType};
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::device_api::memory::{DeviceMemoryApi, DevicePtr, MemRegion, MemoryStats};
use crate::device_api::stream::StreamHandle;
use crate::packed_func::ffi::{DLDataType, DLTensor};
use crate::util::lock;

use sys::device_info as info;

/// The live buffers of one device.
#[derive(Default)]
pub(super) struct MemTable {
    /// `cl_mem` value -> (buffer, size in bytes). A user of a buffer (a copy, a launch until
    /// its command is enqueued) holds a clone of the `Arc`, so a free by another thread
    /// meanwhile cannot release the `cl_mem` under it; cloning is an atomic increment, not a
    /// `clRetainMemObject` (a driver call that takes the buffer's lock, which the driver's
    /// worker threads contend for).
    live: HashMap<usize, (Arc<sys::Mem>, u64), foldhash::fast::RandomState>,
    /// Handles freed and not handed out again since.
    freed: HashSet<usize, foldhash::fast::RandomState>,
    in_use: u64,
    peak: u64,
}

fn to_usize(v: u64) -> Option<usize> {
    usize::try_from(v).ok()
}

impl OpenClDeviceApi {
    /// The live buffer `ptr` of `dev`, checked to hold `offset + nbytes` bytes.
    fn buffer(
        &self,
        op: &'static str,
        dev: Device,
        ptr: DevicePtr,
        offset: u64,
        nbytes: u64,
    ) -> DeviceResult<Arc<sys::Mem>> {
        let d = self.dev(dev)?;
        let mem = lock(&d.mem);
        let oob = |allocation| DeviceError::OutOfBounds {
            op,
            device: dev,
            ptr,
            offset,
            nbytes,
            allocation,
        };
        let (buf, size) = mem.live.get(&ptr.0).ok_or_else(|| oob(None))?;
        if offset.checked_add(nbytes).is_none_or(|end| end > *size) {
            return Err(oob(Some(*size)));
        }
        Ok(buf.clone())
    }

    /// The live buffer `ptr` of `dev` for a kernel argument, with its size.
    pub(crate) fn kernel_buffer(
        &self,
        dev: Device,
        ptr: DevicePtr,
    ) -> Option<(Arc<sys::Mem>, u64)> {
        let d = self.dev(dev).ok()?;
        let mem = lock(&d.mem);
        mem.live.get(&ptr.0).map(|(b, s)| (b.clone(), *s))
    }
}

/// A strided copy as one rectangle of up to 3 dimensions (`clEnqueue*BufferRect`).
#[derive(Debug, PartialEq, Eq)]
struct RectPlan {
    /// Bytes per row, rows, slices.
    region: [usize; 3],
    from: sys::Rect,
    to: sys::Rect,
    /// Bytes from each side's base + byte offset to one past its last byte.
    from_span: u64,
    to_span: u64,
}

/// Plans a copy of `shape` between two layouts (strides in elements, `None` = compact), or `None`
/// when no rectangle describes it: negative strides, a non-contiguous inner run, more than three
/// dimensions after merging, or pitches OpenCL refuses.
fn plan_rect(
    shape: &[i64],
    fs: Option<&[i64]>,
    ts: Option<&[i64]>,
    elem: usize,
    foff: u64,
    toff: u64,
) -> Option<RectPlan> {
    let compact = |shape: &[i64]| -> Vec<i64> {
        let mut st = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            st[i] = st[i + 1].saturating_mul(shape[i + 1]);
        }
        st
    };
    let fs = fs.map_or_else(|| compact(shape), <[i64]>::to_vec);
    let ts = ts.map_or_else(|| compact(shape), <[i64]>::to_vec);
    // (extent, from stride, to stride), innermost first, extents of 1 dropped, mergeable
    // neighbours merged.
    let mut dims: Vec<(usize, usize, usize)> = Vec::new();
    for i in (0..shape.len()).rev() {
        let n = usize::try_from(shape[i]).ok()?;
        if n == 1 {
            continue;
        }
        let (f, t) = (usize::try_from(fs[i]).ok()?, usize::try_from(ts[i]).ok()?);
        match dims.last_mut() {
            Some(top) if top.1.checked_mul(top.0)? == f && top.2.checked_mul(top.0)? == t => {
                top.0 = top.0.checked_mul(n)?;
            }
            _ => dims.push((n, f, t)),
        }
    }
    if dims.is_empty() {
        dims.push((1, 1, 1));
    }
    if dims.len() > 3 || dims[0].1 != 1 || dims[0].2 != 1 {
        return None;
    }
    let get = |k: usize| dims.get(k).copied();
    let region = [
        dims[0].0.checked_mul(elem)?,
        get(1).map_or(1, |d| d.0),
        get(2).map_or(1, |d| d.0),
    ];
    let side = |pick: fn(&(usize, usize, usize)) -> usize, off: u64| -> Option<(sys::Rect, u64)> {
        let row = match get(1) {
            Some(d) => pick(&d).checked_mul(elem)?,
            None => region[0],
        };
        let slice = match get(2) {
            Some(d) => pick(&d).checked_mul(elem)?,
            None => row.checked_mul(region[1])?,
        };
        if row < region[0] || slice < row.checked_mul(region[1])? || slice % row != 0 {
            return None;
        }
        let span = (region[2] - 1)
            .checked_mul(slice)?
            .checked_add((region[1] - 1).checked_mul(row)?)?
            .checked_add(region[0])?;
        let rect = sys::Rect {
            origin: [usize::try_from(off).ok()?, 0, 0],
            row_pitch: row,
            slice_pitch: slice,
        };
        Some((rect, span as u64))
    };
    let (from, from_span) = side(|d| d.1, foff)?;
    let (to, to_span) = side(|d| d.2, toff)?;
    Some(RectPlan {
        region,
        from,
        to,
        from_span,
        to_span,
    })
}

impl DeviceMemoryApi for OpenClDeviceApi {
    fn raw_alloc(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        _dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr> {
        let d = self.dev(dev)?;
        let oom = |reason: String| DeviceError::OutOfMemory {
            device: dev,
            nbytes: nbytes as u64,
            align: align as u64,
            reason,
        };
        if nbytes as u64 > d.max_alloc {
            return Err(oom(format!(
                "the device's largest buffer (CL_DEVICE_MAX_MEM_ALLOC_SIZE) is {} bytes",
                d.max_alloc
            )));
        }
        let buf = d.context.buffer(nbytes).map_err(|e| match e.code {
            sys::CL_MEM_OBJECT_ALLOCATION_FAILURE
            | sys::CL_OUT_OF_RESOURCES
            | sys::CL_OUT_OF_HOST_MEMORY
            | sys::CL_INVALID_BUFFER_SIZE => oom(e.to_string()),
            _ => driver(dev, e),
        })?;
        let handle = buf.raw();
        let mut mem = lock(&d.mem);
        mem.freed.remove(&handle);
        mem.live.insert(handle, (Arc::new(buf), nbytes as u64));
        mem.in_use += nbytes as u64;
        mem.peak = mem.peak.max(mem.in_use);
        Ok(DevicePtr(handle))
    }

    fn raw_free(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
        let d = self.dev(dev)?;
        let mut mem = lock(&d.mem);
        match mem.live.remove(&ptr.0) {
            Some((buf, size)) => {
                mem.in_use -= size;
                mem.freed.insert(ptr.0);
                drop(mem);
                // The driver keeps the buffer until commands queued on it have completed.
                drop(buf);
                Ok(())
            }
            None if mem.freed.contains(&ptr.0) => Err(DeviceError::DoubleFree { device: dev, ptr }),
            None => Err(DeviceError::UnknownPointer {
                device: dev,
                ptr,
                what: "the opencl backend".to_owned(),
            }),
        }
    }

    unsafe fn raw_copy(
        &self,
        src: MemRegion,
        dst: MemRegion,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        let mine = |r: MemRegion| r.device.device_type == DeviceType::OPENCL;
        let n = nbytes as u64;
        let off = |r: MemRegion| {
            to_usize(r.offset).ok_or(DeviceError::OutOfBounds {
                op: "copy",
                device: r.device,
                ptr: r.ptr,
                offset: r.offset,
                nbytes: n,
                allocation: None,
            })
        };
        match (mine(src), mine(dst)) {
            (true, true) if src.device != dst.device => Err(DeviceError::Unsupported {
                device: src.device,
                what: format!(
                    "direct copies to {} (the copy goes through the host)",
                    dst.device
                ),
            }),
            (true, true) => {
                let dev = src.device;
                let (s, dbuf) = (
                    self.buffer("copy", dev, src.ptr, src.offset, n)?,
                    self.buffer("copy", dev, dst.ptr, dst.offset, n)?,
                );
                let (so, doff) = (off(src)?, off(dst)?);
                self.stream(dev, stream)?
                    .enqueue(|q| q.copy(&s, &dbuf, so, doff, nbytes))
                    .map_err(|e| driver(dev, e))
            }
            (false, true) => {
                let dev = dst.device;
                let buf = self.buffer("copy", dev, dst.ptr, dst.offset, n)?;
                let o = off(dst)?;
                let host = (src.ptr.0 as *const u8).wrapping_add(src.offset as usize);
                self.stream(dev, stream)?
                    .enqueue(|q| {
                        // SAFETY: the host source is readable for `nbytes` bytes until the copy
                        // completes (this function's contract).
                        unsafe { q.write(&buf, o, nbytes, host) }
                    })
                    .map_err(|e| driver(dev, e))
            }
            (true, false) => {
                let dev = src.device;
                let buf = self.buffer("copy", dev, src.ptr, src.offset, n)?;
                let o = off(src)?;
                let host = (dst.ptr.0 as *mut u8).wrapping_add(dst.offset as usize);
                self.stream(dev, stream)?
                    .enqueue(|q| {
                        // SAFETY: the host destination is writable for `nbytes` bytes until
                        // the copy completes (this function's contract).
                        unsafe { q.read(&buf, o, nbytes, host) }
                    })
                    .map_err(|e| driver(dev, e))
            }
            (false, false) => Err(DeviceError::Unsupported {
                device: src.device,
                what: "copies between two non-OpenCL devices".to_owned(),
            }),
        }
    }

    unsafe fn raw_copy_strided(
        &self,
        from: &DLTensor,
        to: &DLTensor,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        let (fdev, tdev) = (Device::from(from.device), Device::from(to.device));
        let unsupported = |what: &str| DeviceError::Unsupported {
            device: if fdev.device_type == DeviceType::OPENCL {
                fdev
            } else {
                tdev
            },
            what: what.to_owned(),
        };
        let bits = usize::from(from.dtype.bits) * usize::from(from.dtype.lanes);
        if bits % 8 != 0 {
            return Err(unsupported("strided copies of sub-byte elements"));
        }
        // SAFETY: shape and strides hold `ndim` entries (this function's contract).
        let (shape, fs, ts) = unsafe { (shape_of(from)?, strides_of(from), strides_of(to)) };
        let plan = plan_rect(shape, fs, ts, bits / 8, from.byte_offset, to.byte_offset)
            .ok_or_else(|| {
                unsupported(
                    "this strided copy (OpenCL copies rectangles of up to 3 dimensions with a                      contiguous inner run and growing pitches)",
                )
            })?;
        let cl = |d: Device| d.device_type == DeviceType::OPENCL;
        let (fptr, tptr) = (DevicePtr::from_raw(from.data), DevicePtr::from_raw(to.data));
        match (cl(fdev), cl(tdev)) {
            (true, true) if fdev == tdev => {
                let a = self.buffer("copy", fdev, fptr, from.byte_offset, plan.from_span)?;
                let b = self.buffer("copy", tdev, tptr, to.byte_offset, plan.to_span)?;
                self.stream(fdev, stream)?
                    .enqueue(|q| q.copy_rect(&a, &b, plan.from, plan.to, plan.region))
                    .map_err(|e| driver(fdev, e))
            }
            (false, true) if fdev.is_cpu() => {
                let b = self.buffer("copy", tdev, tptr, to.byte_offset, plan.to_span)?;
                self.stream(tdev, stream)?
                    .enqueue(|q| {
                        // SAFETY: the host tensor's elements are readable until the copy
                        // completes (this function's contract); the rectangle covers exactly
                        // them.
                        unsafe {
                            q.write_rect(&b, plan.to, fptr.0 as *const u8, plan.from, plan.region)
                        }
                    })
                    .map_err(|e| driver(tdev, e))
            }
            (true, false) if tdev.is_cpu() => {
                let a = self.buffer("copy", fdev, fptr, from.byte_offset, plan.from_span)?;
                self.stream(fdev, stream)?
                    .enqueue(|q| {
                        // SAFETY: the host tensor's elements are writable until the copy
                        // completes (this function's contract); the rectangle covers exactly
                        // them.
                        unsafe {
                            q.read_rect(&a, plan.from, tptr.0 as *mut u8, plan.to, plan.region)
                        }
                    })
                    .map_err(|e| driver(fdev, e))
            }
            _ => Err(unsupported(&format!(
                "direct strided copies between {fdev} and {tdev}"
            ))),
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
        let buf = self.buffer("memset", dev, ptr, offset, nbytes as u64)?;
        let st = self.stream(dev, stream)?;
        let o = to_usize(offset).unwrap_or(usize::MAX);
        st.enqueue(|q| q.fill(&buf, value, o, nbytes))
            .map_err(|e| driver(dev, e))
    }

    fn raw_memory_stats(&self, dev: Device) -> DeviceResult<MemoryStats> {
        let d = self.dev(dev)?;
        let total = d.id.ulong(info::GLOBAL_MEM_SIZE).ok();
        let mem = lock(&d.mem);
        Ok(MemoryStats {
            total,
            free: None,
            in_use: mem.in_use,
            peak: mem.peak,
            allocations: mem.live.len() as u64,
        })
    }

    fn pointers_are_handles(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::plan_rect;

    #[test]
    fn a_sub_block_of_a_matrix_is_one_rectangle() {
        // Rows 1..3, columns 2..5 of a 4x8 f32 matrix, to a compact 2x3.
        let p = plan_rect(&[2, 3], Some(&[8, 1]), None, 4, 40, 0).unwrap();
        assert_eq!(p.region, [12, 2, 1]);
        assert_eq!((p.from.origin, p.from.row_pitch), ([40, 0, 0], 32));
        assert_eq!((p.to.row_pitch, p.to.slice_pitch), (12, 24));
        assert_eq!((p.from_span, p.to_span), (44, 24));
    }

    #[test]
    fn compact_layouts_merge_and_transposes_are_refused() {
        let p = plan_rect(&[2, 3, 4], None, Some(&[12, 4, 1]), 1, 0, 0).unwrap();
        assert_eq!(p.region, [24, 1, 1]);
        assert!(plan_rect(&[4, 3], Some(&[1, 4]), None, 4, 0, 0).is_none());
        // Four dimensions that do not merge.
        assert!(plan_rect(&[2, 2, 2, 2], Some(&[64, 16, 4, 1]), None, 4, 0, 0).is_none());
        assert!(plan_rect(&[3], Some(&[-1]), None, 4, 0, 0).is_none());
    }
}
