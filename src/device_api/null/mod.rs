//! [`NullDeviceApi`]: a device without hardware, for testing generic runtime code.
//!
//! Its memory lives in host `Vec`s, but the addresses it hands out are *not* host pointers (they
//! start at [`NullDeviceApi::ADDRESS_BASE`]), so code that dereferences a device pointer instead
//! of asking the backend to copy fails loudly here. It has several devices without peer access
//! (copies between them bounce through the host), checks every range, and runs everything
//! synchronously, like the CPU.
//!
//! # Files
//! - `mod.rs`: the backend type, its shared state and its [`DeviceApi`] impl.
//! - `memory.rs`: the [`DeviceMemoryApi`] impl (simulated memory, checked ranges). It holds the
//!   backend's `unsafe` code: the host side of copies to and from the host.
//! - `stream.rs`: the [`DeviceStreamApi`] impl (per-device stream and event tables).
//!
//! [`DeviceMemoryApi`]: super::DeviceMemoryApi
//! [`DeviceStreamApi`]: super::DeviceStreamApi

mod memory;
mod stream;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use super::api::{AttrKind, AttrValue, DeviceApi};
use super::device::{Device, DeviceType};
use super::error::DeviceResult;
use super::stream::HandleTable;

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
