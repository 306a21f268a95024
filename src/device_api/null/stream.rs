//! The null backend's [`DeviceStreamApi`]: streams and events belong to one device, and everything
//! runs synchronously, as on the CPU.

use super::{NullDeviceApi, NullState};
use crate::device_api::device::Device;
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::device_api::memory::HostCallback;
use crate::device_api::stream::{DeviceStreamApi, EventHandle, StreamHandle};

impl NullDeviceApi {
    pub(super) fn check_stream(st: &NullState, dev: Device, s: StreamHandle) -> DeviceResult<()> {
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
