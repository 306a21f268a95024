//! The CUDA [`DeviceStreamApi`]: non-blocking streams (the default stream is each device's legacy
//! `NULL` stream), events with timing, host callbacks through `cuLaunchHostFunc` (see the
//! backend's module docs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{sys, CudaDeviceApi};
use crate::device_api::device::Device;
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::device_api::memory::HostCallback;
use crate::device_api::stream::{DeviceStreamApi, EventHandle, StreamHandle};
use crate::util::lock;

/// A stream of one device.
pub(crate) struct CuStream {
    device: i32,
    pub(super) stream: sys::Stream,
}

impl CuStream {
    pub(super) fn new(device: i32, stream: sys::Stream) -> Self {
        Self { device, stream }
    }
}

/// An event of one device, and whether it was ever recorded (a never-recorded event counts as
/// complete and has no time).
pub(crate) struct CuEvent {
    device: i32,
    event: sys::Event,
    recorded: AtomicBool,
}

impl CudaDeviceApi {
    /// The stream `s` of `dev` (the device's legacy default stream for
    /// [`StreamHandle::DEFAULT`]).
    pub(crate) fn stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<Arc<CuStream>> {
        if s.is_default() {
            return Ok(self.dev(dev)?.default_stream.clone());
        }
        match lock(&self.streams).get(s.to_raw()) {
            Some(st) if st.device == dev.device_id => Ok(st.clone()),
            _ => Err(DeviceError::InvalidStream {
                device: dev,
                handle: s.to_raw(),
            }),
        }
    }

    fn event(&self, dev: Device, e: EventHandle) -> DeviceResult<Arc<CuEvent>> {
        match lock(&self.events).get(e.to_raw()) {
            Some(ev) if ev.device == dev.device_id => Ok(ev.clone()),
            _ => Err(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            }),
        }
    }
}

impl DeviceStreamApi for CudaDeviceApi {
    fn raw_create_stream(&self, dev: Device) -> DeviceResult<StreamHandle> {
        let d = self.dev(dev)?;
        let drv = self.drv(dev)?;
        let s = d.call(dev, || drv.stream_create())?;
        let st = Arc::new(CuStream::new(dev.device_id, s));
        Ok(StreamHandle::from_raw(lock(&self.streams).insert(st)))
    }

    fn raw_free_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        if s.is_default() {
            return Err(DeviceError::InvalidStream {
                device: dev,
                handle: 0,
            });
        }
        // Looked up and removed under one lock: of two threads freeing it, one gets it.
        let st = {
            let mut streams = lock(&self.streams);
            match streams.get(s.to_raw()) {
                Some(st) if st.device == dev.device_id => streams.remove(s.to_raw()),
                _ => None,
            }
        }
        .ok_or(DeviceError::InvalidStream {
            device: dev,
            handle: s.to_raw(),
        })?;
        let d = self.dev(dev)?;
        let drv = self.drv(dev)?;
        // Queued work completes before the stream goes (`cuStreamDestroy` would not wait, but
        // waiting here reports a failure); the stream is destroyed when its last user drops it.
        d.call(dev, || {
            let r = drv.stream_synchronize(&st.stream);
            drop(st);
            r
        })
    }

    fn raw_sync_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        let drv = self.drv(dev)?;
        self.dev(dev)?
            .call(dev, || drv.stream_synchronize(&st.stream))
    }

    fn raw_query_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<bool> {
        let st = self.stream(dev, s)?;
        let drv = self.drv(dev)?;
        self.dev(dev)?.call(dev, || drv.stream_query(&st.stream))
    }

    /// Only the handle: `cuStreamQuery` would report failures of queued work.
    fn raw_check_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        self.stream(dev, s).map(|_| ())
    }

    fn raw_add_callback(&self, dev: Device, s: StreamHandle, cb: HostCallback) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        let drv = self.drv(dev)?;
        self.dev(dev)?
            .call(dev, || drv.launch_host_func(&st.stream, cb))
    }

    fn raw_create_event(&self, dev: Device) -> DeviceResult<EventHandle> {
        let d = self.dev(dev)?;
        let drv = self.drv(dev)?;
        let event = d.call(dev, || drv.event_create(true))?;
        let ev = Arc::new(CuEvent {
            device: dev.device_id,
            event,
            recorded: AtomicBool::new(false),
        });
        Ok(EventHandle::from_raw(lock(&self.events).insert(ev)))
    }

    fn raw_record_event(&self, dev: Device, s: StreamHandle, e: EventHandle) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        let ev = self.event(dev, e)?;
        let drv = self.drv(dev)?;
        self.dev(dev)?
            .call(dev, || drv.event_record(&ev.event, &st.stream))?;
        ev.recorded.store(true, Ordering::Release);
        Ok(())
    }

    fn raw_query_event(&self, dev: Device, e: EventHandle) -> DeviceResult<bool> {
        let ev = self.event(dev, e)?;
        if !ev.recorded.load(Ordering::Acquire) {
            return Ok(true);
        }
        let drv = self.drv(dev)?;
        self.dev(dev)?.call(dev, || drv.event_query(&ev.event))
    }

    fn raw_sync_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        let ev = self.event(dev, e)?;
        if !ev.recorded.load(Ordering::Acquire) {
            return Ok(());
        }
        let drv = self.drv(dev)?;
        self.dev(dev)?
            .call(dev, || drv.event_synchronize(&ev.event))
    }

    fn raw_stream_wait_event(
        &self,
        dev: Device,
        s: StreamHandle,
        e: EventHandle,
    ) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        let ev = self.event(dev, e)?;
        if !ev.recorded.load(Ordering::Acquire) {
            return Ok(());
        }
        let drv = self.drv(dev)?;
        self.dev(dev)?
            .call(dev, || drv.stream_wait_event(&st.stream, &ev.event))
    }

    fn raw_destroy_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        let ev = {
            let mut events = lock(&self.events);
            match events.get(e.to_raw()) {
                Some(ev) if ev.device == dev.device_id => events.remove(e.to_raw()),
                _ => None,
            }
        }
        .ok_or(DeviceError::InvalidEvent {
            device: dev,
            handle: e.to_raw(),
        })?;
        // The event is destroyed (`cuEventDestroy`) with its device's context current, unless
        // another thread still uses it: then when that thread is done.
        self.dev(dev)?.call(dev, || {
            drop(ev);
            Ok(())
        })
    }

    fn raw_event_elapsed(
        &self,
        dev: Device,
        start: EventHandle,
        end: EventHandle,
    ) -> DeviceResult<Duration> {
        let get = |h: EventHandle, which: &str| -> DeviceResult<Arc<CuEvent>> {
            let ev = self.event(dev, h)?;
            if ev.recorded.load(Ordering::Acquire) {
                Ok(ev)
            } else {
                Err(DeviceError::Backend {
                    device: dev,
                    message: format!("the {which} event {:#x} was never recorded", h.to_raw()),
                })
            }
        };
        let (a, b) = (get(start, "start")?, get(end, "end")?);
        let drv = self.drv(dev)?;
        let ms = self.dev(dev)?.call(dev, || {
            drv.event_synchronize(&a.event)?;
            drv.event_synchronize(&b.event)?;
            drv.event_elapsed_ms(&a.event, &b.event)
        })?;
        if ms < 0.0 {
            return Err(DeviceError::Backend {
                device: dev,
                message: format!(
                    "the end event completed {:.3} ms before the start event",
                    -ms
                ),
            });
        }
        Ok(Duration::from_secs_f64(f64::from(ms) / 1000.0))
    }
}
