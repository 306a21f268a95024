//! The null backend's [`DeviceMemoryApi`]: memory in host `Vec`s behind addresses that are not
//! host pointers, every range checked, copies to and from the host done at once. This file holds
//! the backend's `unsafe` code (the host side of those copies).

use super::{NullDeviceApi, NullState};
use crate::device_api::device::Device;
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::device_api::memory::{DeviceMemoryApi, DevicePtr, MemRegion, MemoryStats};
use crate::device_api::stream::StreamHandle;
use crate::packed_func::ffi::DLDataType;

impl NullDeviceApi {
    /// `(device index, base, start offset within the allocation)` of a checked range.
    fn locate(
        st: &NullState,
        op: &'static str,
        r: MemRegion,
        nbytes: usize,
    ) -> DeviceResult<(usize, usize, usize)> {
        let oob = || DeviceError::OutOfBounds {
            op,
            device: r.device,
            ptr: r.ptr,
            offset: r.offset,
            nbytes: nbytes as u64,
            allocation: None,
        };
        let dev = usize::try_from(r.device.device_id).map_err(|_| oob())?;
        let mem = st.memory.get(dev).ok_or_else(oob)?;
        let start = usize::try_from(r.offset)
            .ok()
            .and_then(|o| r.ptr.0.checked_add(o))
            .ok_or_else(oob)?;
        let (&base, bytes) = mem.range(..=start).next_back().ok_or_else(oob)?;
        let off = start - base;
        if off.checked_add(nbytes).is_none_or(|e| e > bytes.len()) {
            return Err(oob());
        }
        Ok((dev, base, off))
    }
}

impl DeviceMemoryApi for NullDeviceApi {
    fn raw_alloc(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        _dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr> {
        let mut st = self.state();
        let d = dev.device_id as usize;
        let used: u64 = st.memory[d].values().map(|v| v.len() as u64).sum();
        if (nbytes as u64).saturating_add(used) > self.capacity {
            return Err(DeviceError::OutOfMemory {
                device: dev,
                nbytes: nbytes as u64,
                align: align as u64,
                reason: format!("{} of {} bytes in use", used, self.capacity),
            });
        }
        let base = st.next.next_multiple_of(align.max(64));
        // Leave a gap so that one-past-the-end of one block is not inside the next.
        st.next = base + nbytes + 64;
        st.memory[d].insert(base, vec![0xa5; nbytes]);
        st.in_use += nbytes as u64;
        st.peak = st.peak.max(st.in_use);
        Ok(DevicePtr(base))
    }

    fn raw_free(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
        let mut st = self.state();
        let d = dev.device_id as usize;
        match st.memory[d].remove(&ptr.0) {
            Some(v) => {
                st.in_use -= v.len() as u64;
                st.freed.push(ptr.0);
                Ok(())
            }
            None if st.freed.contains(&ptr.0) => Err(DeviceError::DoubleFree { device: dev, ptr }),
            None => Err(DeviceError::UnknownPointer {
                device: dev,
                ptr,
                what: format!("the {} backend", self.name),
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
        let mut st = self.state();
        let mine = |r: MemRegion| r.device.device_type == self.device_type;
        if mine(src) && mine(dst) && src.device != dst.device {
            return Err(DeviceError::Unsupported {
                device: src.device,
                what: format!("peer copies to {}", dst.device),
            });
        }
        let dev = if mine(src) { src.device } else { dst.device };
        Self::check_stream(&st, dev, stream)?;
        // Read the source.
        let bytes: Vec<u8> = if mine(src) {
            let (d, base, off) = Self::locate(&st, "copy", src, nbytes)?;
            st.memory[d][&base][off..off + nbytes].to_vec()
        } else {
            let p = (src.ptr.0 as *const u8).wrapping_add(src.offset as usize);
            // SAFETY: a host source is valid for `nbytes` bytes (caller).
            unsafe { std::slice::from_raw_parts(p, nbytes) }.to_vec()
        };
        if mine(dst) {
            let (d, base, off) = Self::locate(&st, "copy", dst, nbytes)?;
            if let Some(v) = st.memory[d].get_mut(&base) {
                v[off..off + nbytes].copy_from_slice(&bytes);
            }
        } else {
            let p = (dst.ptr.0 as *mut u8).wrapping_add(dst.offset as usize);
            // SAFETY: a host destination is valid for `nbytes` bytes (caller).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, nbytes) };
        }
        Ok(())
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
        let mut st = self.state();
        Self::check_stream(&st, dev, stream)?;
        let r = MemRegion {
            device: dev,
            ptr,
            offset,
        };
        let (d, base, off) = Self::locate(&st, "memset", r, nbytes)?;
        if let Some(v) = st.memory[d].get_mut(&base) {
            v[off..off + nbytes].fill(value);
        }
        Ok(())
    }

    fn raw_memory_stats(&self, dev: Device) -> DeviceResult<MemoryStats> {
        let st = self.state();
        let mem = &st.memory[dev.device_id as usize];
        let used: u64 = mem.values().map(|v| v.len() as u64).sum();
        Ok(MemoryStats {
            total: Some(self.capacity),
            free: Some(self.capacity - used),
            in_use: st.in_use,
            peak: st.peak,
            allocations: st.memory.iter().map(|m| m.len() as u64).sum(),
        })
    }
}
