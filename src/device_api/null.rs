//! [`NullDeviceApi`]: a device without hardware, for testing generic runtime code.
//!
//! Its memory lives in host `Vec`s, but the addresses it hands out are *not* host pointers (they
//! start at [`NullDeviceApi::ADDRESS_BASE`]), so code that dereferences a device pointer instead
//! of asking the backend to copy fails loudly here. It has several devices without peer access
//! (copies between them bounce through the host), checks every range, and runs everything
//! synchronously, like the CPU.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use super::api::{AttrKind, AttrValue, DeviceApi};
use super::device::{Device, DeviceType};
use super::error::{DeviceError, DeviceResult};
use super::memory::{DeviceMemoryApi, DevicePtr, HostCallback, MemRegion, MemoryStats};
use super::stream::{DeviceStreamApi, EventHandle, HandleTable, StreamHandle};
use crate::packed_func::ffi::DLDataType;

#[derive(Default)]
struct NullState {
    /// Per device: base address -> bytes.
    memory: Vec<BTreeMap<usize, Vec<u8>>>,
    next: usize,
    freed: Vec<usize>,
    in_use: u64,
    peak: u64,
    streams: HandleTable<i32>,
    events: HandleTable<i32>,
}

/// A backend with simulated memory; see the module docs.
pub struct NullDeviceApi {
    name: String,
    device_type: DeviceType,
    devices: usize,
    capacity: u64,
    state: Mutex<NullState>,
}

impl std::fmt::Debug for NullDeviceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NullDeviceApi")
            .field("name", &self.name)
            .field("device_type", &self.device_type)
            .field("devices", &self.devices)
            .finish()
    }
}

impl NullDeviceApi {
    /// The first address handed out.
    pub const ADDRESS_BASE: usize = 0x7e57_0000_0000;

    /// A backend called `name` with code `device_type`, `devices` devices and `capacity` bytes
    /// of memory per device.
    pub fn new(name: &str, device_type: DeviceType, devices: usize, capacity: u64) -> Self {
        Self {
            name: name.to_owned(),
            device_type,
            devices,
            capacity,
            state: Mutex::new(NullState {
                memory: (0..devices).map(|_| BTreeMap::new()).collect(),
                next: Self::ADDRESS_BASE,
                ..Default::default()
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, NullState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

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

    fn check_stream(st: &NullState, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        match st.streams.get(s.to_raw()) {
            _ if s.is_default() => Ok(()),
            Some(&d) if d == dev.device_id => Ok(()),
            _ => Err(DeviceError::InvalidStream {
                device: dev,
                handle: s.to_raw(),
            }),
        }
    }

    fn check_event(st: &NullState, dev: Device, e: EventHandle) -> DeviceResult<()> {
        match st.events.get(e.to_raw()) {
            Some(&d) if d == dev.device_id => Ok(()),
            _ => Err(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            }),
        }
    }
}

impl DeviceApi for NullDeviceApi {
    fn name(&self) -> &str {
        &self.name
    }

    fn device_type(&self) -> DeviceType {
        self.device_type
    }

    fn device_count(&self) -> DeviceResult<usize> {
        Ok(self.devices)
    }

    fn raw_attr(&self, dev: Device, kind: AttrKind) -> DeviceResult<Option<AttrValue>> {
        Ok(match kind {
            AttrKind::DEVICE_NAME => Some(AttrValue::Str(format!("{} {}", self.name, dev))),
            AttrKind::TOTAL_GLOBAL_MEMORY => Some(AttrValue::Int(self.capacity as i64)),
            AttrKind::AVAILABLE_GLOBAL_MEMORY => {
                let st = self.state();
                let used: usize = st.memory[dev.device_id as usize]
                    .values()
                    .map(Vec::len)
                    .sum();
                Some(AttrValue::Int((self.capacity - used as u64) as i64))
            }
            _ => None,
        })
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

impl DeviceStreamApi for NullDeviceApi {
    fn raw_create_stream(&self, dev: Device) -> DeviceResult<StreamHandle> {
        Ok(StreamHandle::from_raw(
            self.state().streams.insert(dev.device_id),
        ))
    }

    fn raw_free_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        let mut st = self.state();
        Self::check_stream(&st, dev, s)?;
        st.streams.remove(s.to_raw());
        Ok(())
    }

    fn raw_sync_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        Self::check_stream(&self.state(), dev, s)
    }

    fn raw_query_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<bool> {
        Self::check_stream(&self.state(), dev, s).map(|()| true)
    }

    fn raw_add_callback(&self, dev: Device, s: StreamHandle, cb: HostCallback) -> DeviceResult<()> {
        Self::check_stream(&self.state(), dev, s)?;
        cb();
        Ok(())
    }

    fn raw_create_event(&self, dev: Device) -> DeviceResult<EventHandle> {
        Ok(EventHandle::from_raw(
            self.state().events.insert(dev.device_id),
        ))
    }

    fn raw_record_event(&self, dev: Device, s: StreamHandle, e: EventHandle) -> DeviceResult<()> {
        let st = self.state();
        Self::check_stream(&st, dev, s)?;
        Self::check_event(&st, dev, e)
    }

    fn raw_query_event(&self, dev: Device, e: EventHandle) -> DeviceResult<bool> {
        Self::check_event(&self.state(), dev, e).map(|()| true)
    }

    fn raw_sync_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        Self::check_event(&self.state(), dev, e)
    }

    fn raw_stream_wait_event(
        &self,
        dev: Device,
        s: StreamHandle,
        e: EventHandle,
    ) -> DeviceResult<()> {
        let st = self.state();
        Self::check_stream(&st, dev, s)?;
        Self::check_event(&st, dev, e)
    }

    fn raw_destroy_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        let mut st = self.state();
        Self::check_event(&st, dev, e)?;
        st.events.remove(e.to_raw());
        Ok(())
    }
}
