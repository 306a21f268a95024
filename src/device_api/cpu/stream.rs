//! The CPU's [`DeviceStreamApi`]: streams and events are real, generation-checked handles, and
//! every operation has completed when its call returns (see the backend's module docs).

use std::sync::MutexGuard;

use super::CpuDeviceApi;
use crate::device_api::device::Device;
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::device_api::memory::HostCallback;
use crate::device_api::stream::{DeviceStreamApi, EventHandle, HandleTable, StreamHandle};

#[derive(Default)]
pub(super) struct Queues {
    streams: HandleTable<()>,
    /// Events: whether recorded (irrelevant for completion on the CPU, kept for debugging).
    events: HandleTable<bool>,
}

impl CpuDeviceApi {
    // As for the heap: a poisoned lock is still usable (each update is one insert or remove).
    pub(super) fn queues(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn check_stream(q: &Queues, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        if s.is_default() || q.streams.get(s.to_raw()).is_some() {
            Ok(())
        } else {
            Err(DeviceError::InvalidStream {
                device: dev,
                handle: s.to_raw(),
            })
        }
    }

    fn check_event(q: &Queues, dev: Device, e: EventHandle) -> DeviceResult<()> {
        if q.events.get(e.to_raw()).is_some() {
            Ok(())
        } else {
            Err(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            })
        }
    }
}

impl DeviceStreamApi for CpuDeviceApi {
    fn raw_create_stream(&self, _dev: Device) -> DeviceResult<StreamHandle> {
        Ok(StreamHandle::from_raw(self.queues().streams.insert(())))
    }

    fn raw_free_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        self.queues()
            .streams
            .remove(s.to_raw())
            .ok_or(DeviceError::InvalidStream {
                device: dev,
                handle: s.to_raw(),
            })
    }

    fn raw_sync_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        Self::check_stream(&self.queues(), dev, s)
    }

    fn raw_query_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<bool> {
        Self::check_stream(&self.queues(), dev, s).map(|()| true)
    }

    fn raw_add_callback(&self, dev: Device, s: StreamHandle, cb: HostCallback) -> DeviceResult<()> {
        Self::check_stream(&self.queues(), dev, s)?;
        // Run outside the lock: the callback may call back into the backend.
        cb();
        Ok(())
    }

    fn raw_create_event(&self, _dev: Device) -> DeviceResult<EventHandle> {
        Ok(EventHandle::from_raw(self.queues().events.insert(false)))
    }

    fn raw_record_event(&self, dev: Device, s: StreamHandle, e: EventHandle) -> DeviceResult<()> {
        let mut q = self.queues();
        Self::check_stream(&q, dev, s)?;
        let rec = q
            .events
            .get_mut(e.to_raw())
            .ok_or(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            })?;
        *rec = true;
        Ok(())
    }

    fn raw_query_event(&self, dev: Device, e: EventHandle) -> DeviceResult<bool> {
        Self::check_event(&self.queues(), dev, e).map(|()| true)
    }

    fn raw_sync_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        Self::check_event(&self.queues(), dev, e)
    }

    fn raw_stream_wait_event(
        &self,
        dev: Device,
        s: StreamHandle,
        e: EventHandle,
    ) -> DeviceResult<()> {
        let q = self.queues();
        Self::check_stream(&q, dev, s)?;
        Self::check_event(&q, dev, e)
    }

    fn raw_destroy_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        self.queues()
            .events
            .remove(e.to_raw())
            .map(|_| ())
            .ok_or(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            })
    }
}
