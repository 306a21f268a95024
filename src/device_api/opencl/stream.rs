//! The OpenCL [`DeviceStreamApi`]: a stream is an in-order command queue that remembers the
//! event of its last command; events are markers; host callbacks are a marker's completion
//! callback gating a barrier (see the backend's module docs).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{driver, sys, OpenClDeviceApi};
use crate::device_api::device::Device;
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::device_api::memory::HostCallback;
use crate::device_api::stream::{DeviceStreamApi, EventHandle, StreamHandle};
use crate::util::lock;

/// A command queue and the event of the last command enqueued on it.
pub(crate) struct ClStream {
    device: i32,
    pub(super) queue: sys::Queue,
    last: Mutex<Option<sys::Event>>,
}

impl ClStream {
    pub(super) fn new(device: i32, queue: sys::Queue) -> Self {
        Self {
            device,
            queue,
            last: Mutex::new(None),
        }
    }

    /// Enqueues through `f`, which returns the command's event, and remembers it.
    pub(super) fn enqueue(
        &self,
        f: impl FnOnce(&sys::Queue) -> sys::ClResult<sys::Event>,
    ) -> sys::ClResult<()> {
        let mut last = lock(&self.last);
        let ev = f(&self.queue)?;
        *last = Some(ev);
        Ok(())
    }
}

impl OpenClDeviceApi {
    /// The stream `s` of `dev` (the device's default queue for [`StreamHandle::DEFAULT`]).
    pub(crate) fn stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<Arc<ClStream>> {
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

    fn event(&self, dev: Device, e: EventHandle) -> DeviceResult<Option<sys::Event>> {
        match lock(&self.events).get(e.to_raw()) {
            Some((d, ev)) if *d == dev.device_id => Ok(ev.clone()),
            _ => Err(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            }),
        }
    }
}

impl DeviceStreamApi for OpenClDeviceApi {
    fn raw_create_stream(&self, dev: Device) -> DeviceResult<StreamHandle> {
        let d = self.dev(dev)?;
        let q = d.context.queue(d.id).map_err(|e| driver(dev, e))?;
        let st = Arc::new(ClStream::new(dev.device_id, q));
        Ok(StreamHandle::from_raw(lock(&self.streams).insert(st)))
    }

    fn raw_free_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        if s.is_default() {
            return Err(DeviceError::InvalidStream {
                device: dev,
                handle: 0,
            });
        }
        lock(&self.streams).remove(s.to_raw());
        // Queued work completes before the queue goes (clReleaseCommandQueue would also wait
        // for it; finishing here reports a failure).
        st.queue.finish().map_err(|e| driver(dev, e))
    }

    fn raw_sync_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        st.queue.finish().map_err(|e| driver(dev, e))?;
        let last = lock(&st.last).clone();
        match last.map(|e| e.status()) {
            Some(Ok(status)) if status < 0 => Err(DeviceError::Backend {
                device: dev,
                message: format!(
                    "a command on the stream failed with {} ({status})",
                    sys::error_name(status)
                ),
            }),
            _ => Ok(()),
        }
    }

    fn raw_query_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<bool> {
        let st = self.stream(dev, s)?;
        let last = lock(&st.last).clone();
        let Some(ev) = last else { return Ok(true) };
        st.queue.flush().map_err(|e| driver(dev, e))?;
        event_done(dev, &ev)
    }

    fn raw_add_callback(&self, dev: Device, s: StreamHandle, cb: HostCallback) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        let d = self.dev(dev)?;
        let gate = d.context.user_event().map_err(|e| driver(dev, e))?;
        let mut marker = None;
        st.enqueue(|q| {
            let m = q.marker()?;
            marker = Some(m);
            // Work queued after the callback waits for it (the gate opens after it ran).
            q.barrier(&[&gate])?;
            q.marker()
        })
        .map_err(|e| {
            let _ = gate.complete_user();
            driver(dev, e)
        })?;
        let Some(marker) = marker else {
            let _ = gate.complete_user();
            return Err(DeviceError::Backend {
                device: dev,
                message: "clEnqueueMarkerWithWaitList returned no event".to_owned(),
            });
        };
        let opener = gate.clone();
        let r = marker.on_complete(Box::new(move |_status| {
            cb();
            if let Err(e) = opener.complete_user() {
                log::error!("opening the stream after a host callback: {e}");
            }
        }));
        if let Err(e) = r {
            let _ = gate.complete_user();
            return Err(driver(dev, e));
        }
        st.queue.flush().map_err(|e| driver(dev, e))
    }

    fn raw_create_event(&self, dev: Device) -> DeviceResult<EventHandle> {
        Ok(EventHandle::from_raw(
            lock(&self.events).insert((dev.device_id, None)),
        ))
    }

    fn raw_record_event(&self, dev: Device, s: StreamHandle, e: EventHandle) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        self.event(dev, e)?;
        let mut marker = None;
        st.enqueue(|q| {
            let m = q.marker()?;
            marker = Some(m.clone());
            Ok(m)
        })
        .map_err(|err| driver(dev, err))?;
        // Other queues may wait for the marker: it must reach the device.
        st.queue.flush().map_err(|err| driver(dev, err))?;
        match lock(&self.events).get_mut(e.to_raw()) {
            Some((d, slot)) if *d == dev.device_id => {
                *slot = marker;
                Ok(())
            }
            _ => Err(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            }),
        }
    }

    fn raw_query_event(&self, dev: Device, e: EventHandle) -> DeviceResult<bool> {
        match self.event(dev, e)? {
            None => Ok(true),
            Some(ev) => event_done(dev, &ev),
        }
    }

    fn raw_sync_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        match self.event(dev, e)? {
            None => Ok(()),
            Some(ev) => ev.wait().map_err(|err| driver(dev, err)),
        }
    }

    fn raw_stream_wait_event(
        &self,
        dev: Device,
        s: StreamHandle,
        e: EventHandle,
    ) -> DeviceResult<()> {
        let st = self.stream(dev, s)?;
        match self.event(dev, e)? {
            None => Ok(()),
            Some(ev) => st
                .enqueue(|q| {
                    q.barrier(&[&ev])?;
                    q.marker()
                })
                .map_err(|err| driver(dev, err)),
        }
    }

    fn raw_destroy_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        self.event(dev, e)?;
        lock(&self.events).remove(e.to_raw());
        Ok(())
    }

    fn raw_event_elapsed(
        &self,
        dev: Device,
        start: EventHandle,
        end: EventHandle,
    ) -> DeviceResult<Duration> {
        let get = |h: EventHandle, which: &str| -> DeviceResult<sys::Event> {
            self.event(dev, h)?.ok_or_else(|| DeviceError::Backend {
                device: dev,
                message: format!("the {which} event {:#x} was never recorded", h.to_raw()),
            })
        };
        let (a, b) = (get(start, "start")?, get(end, "end")?);
        a.wait().map_err(|e| driver(dev, e))?;
        b.wait().map_err(|e| driver(dev, e))?;
        let time = |ev: &sys::Event| {
            ev.end_time_ns().map_err(|e| {
                if e.code == sys::CL_PROFILING_INFO_NOT_AVAILABLE {
                    DeviceError::Unsupported {
                        device: dev,
                        what: format!(
                            "timing between events: the driver gives no profiling information \
                             for markers ({e})"
                        ),
                    }
                } else {
                    driver(dev, e)
                }
            })
        };
        let (t0, t1) = (time(&a)?, time(&b)?);
        if t1 < t0 {
            return Err(DeviceError::Backend {
                device: dev,
                message: format!(
                    "the end event completed {} ns before the start event",
                    t0 - t1
                ),
            });
        }
        Ok(Duration::from_nanos(t1 - t0))
    }
}

fn event_done(dev: Device, ev: &sys::Event) -> DeviceResult<bool> {
    match ev.status().map_err(|e| driver(dev, e))? {
        sys::CL_COMPLETE => Ok(true),
        s if s < 0 => Err(DeviceError::Backend {
            device: dev,
            message: format!(
                "a command on the stream failed with {} ({s})",
                sys::error_name(s)
            ),
        }),
        _ => Ok(false),
    }
}
