//! The plugin's [`DeviceStreamApi`]: kiln's generation-checked stream and event handles over the
//! plugin's (each device's default stream created on first use), the checks of the handles a
//! plugin returns, and the fallbacks for absent entries (query -> synchronize, callbacks ->
//! synchronize + run on the host).

use super::sys::{
    self, call_opt, call_req, KilnStatus, KILN_STATUS_NOT_READY, KILN_STATUS_SUCCESS,
};
use super::PluginDeviceApi;
use crate::device_api::api::DeviceApi;
use crate::device_api::device::Device;
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::device_api::memory::HostCallback;
use crate::device_api::stream::{DeviceStreamApi, EventHandle, HandleTable, StreamHandle};
use crate::util::lock;
use std::sync::Mutex;

impl PluginDeviceApi {
    /// A handle a plugin returned with success must be non-NULL and not one kiln holds already
    /// (the ABI: the plugin creates a new handle). A bad one is refused (and not destroyed: kiln
    /// cannot know what it refers to).
    fn check_new_handle(&self, dev: Device, entry: &str, kind: &str, h: usize) -> DeviceResult<()> {
        let d = dev.device_id;
        let live = |t: &Mutex<HandleTable<(i32, usize)>>| {
            lock(t).values_mut().any(|&mut (td, x)| td == d && x == h)
        };
        let dup = match kind {
            "stream" => {
                live(&self.streams)
                    || lock(&self.default_streams)
                        .get(d as usize)
                        .is_some_and(|s| *s == Some(h))
            }
            _ => live(&self.events),
        };
        if h == 0 || dup {
            return Err(self.bad_handle(dev, entry, kind, h));
        }
        Ok(())
    }

    pub(super) fn bad_handle(&self, dev: Device, entry: &str, kind: &str, h: usize) -> DeviceError {
        let seen = if h == 0 {
            "NULL".to_owned()
        } else {
            format!("{h:#x}, a {kind} that is still live")
        };
        DeviceError::Backend {
            device: dev,
            message: format!(
                "plugin `{}`: {entry} succeeded but returned {seen}; expected a new, non-NULL \
                 {kind} handle",
                self.info.name
            ),
        }
    }

    /// The plugin stream behind `stream` on `dev` (creating the default one on first use).
    pub(super) fn plugin_stream(
        &self,
        dev: Device,
        stream: StreamHandle,
    ) -> DeviceResult<sys::KilnStream> {
        if stream.is_default() {
            let mut d = lock(&self.default_streams);
            let slot = d
                .get_mut(dev.device_id as usize)
                .ok_or(DeviceError::InvalidStream {
                    device: dev,
                    handle: 0,
                })?;
            if let Some(s) = slot {
                return Ok(*s as sys::KilnStream);
            }
            let mut s: sys::KilnStream = std::ptr::null_mut();
            let st = call_req!(self.raw, create_stream(dev.device_id, &mut s));
            self.check(dev, "create_stream (default stream)", st)?;
            if s.is_null() {
                return Err(self.bad_handle(dev, "create_stream (default stream)", "stream", 0));
            }
            *slot = Some(s as usize);
            return Ok(s);
        }
        match lock(&self.streams).get(stream.to_raw()) {
            Some(&(d, s)) if d == dev.device_id => Ok(s as sys::KilnStream),
            _ => Err(DeviceError::InvalidStream {
                device: dev,
                handle: stream.to_raw(),
            }),
        }
    }

    fn plugin_event(&self, dev: Device, event: EventHandle) -> DeviceResult<sys::KilnEvent> {
        match lock(&self.events).get(event.to_raw()) {
            Some(&(d, e)) if d == dev.device_id => Ok(e as sys::KilnEvent),
            _ => Err(DeviceError::InvalidEvent {
                device: dev,
                handle: event.to_raw(),
            }),
        }
    }

    pub(super) fn sync_plugin_stream(&self, dev: Device, s: sys::KilnStream) -> DeviceResult<()> {
        let st = call_req!(self.raw, synchronize_stream(dev.device_id, s));
        self.check(dev, "synchronize_stream", st)
    }
}

impl DeviceStreamApi for PluginDeviceApi {
    fn raw_create_stream(&self, dev: Device) -> DeviceResult<StreamHandle> {
        let mut s: sys::KilnStream = std::ptr::null_mut();
        let st = call_req!(self.raw, create_stream(dev.device_id, &mut s));
        self.check(dev, "create_stream", st)?;
        self.check_new_handle(dev, "create_stream", "stream", s as usize)?;
        Ok(StreamHandle::from_raw(
            lock(&self.streams).insert((dev.device_id, s as usize)),
        ))
    }

    fn raw_free_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()> {
        let s = self.plugin_stream(dev, stream)?;
        lock(&self.streams).remove(stream.to_raw());
        let st = call_req!(self.raw, destroy_stream(dev.device_id, s));
        self.check(dev, "destroy_stream", st)
    }

    fn raw_sync_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()> {
        let s = self.plugin_stream(dev, stream)?;
        self.sync_plugin_stream(dev, s)
    }

    fn raw_check_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()> {
        // The handle table alone: `query_stream` (or its blocking fallback) would report, and
        // consume, a failure of queued work that belongs to the next synchronization.
        self.plugin_stream(dev, stream).map(|_| ())
    }

    fn raw_query_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<bool> {
        let s = self.plugin_stream(dev, stream)?;
        match call_opt!(self.raw, query_stream(dev.device_id, s)) {
            Some(KILN_STATUS_SUCCESS) => Ok(true),
            Some(KILN_STATUS_NOT_READY) => Ok(false),
            Some(st) => self.check(dev, "query_stream", st).map(|()| false),
            None => self.sync_plugin_stream(dev, s).map(|()| true),
        }
    }

    fn raw_add_callback(
        &self,
        dev: Device,
        stream: StreamHandle,
        callback: HostCallback,
    ) -> DeviceResult<()> {
        let s = self.plugin_stream(dev, stream)?;
        if self.raw.table().stream_add_callback.is_none() {
            self.sync_plugin_stream(dev, s)?;
            callback();
            return Ok(());
        }
        let name = self.info.name.clone();
        let boxed: sys::BoxedCallback = Box::new(move |status: KilnStatus| {
            if status != KILN_STATUS_SUCCESS {
                log::warn!(
                    "plugin `{name}`: a stream callback runs after failed work (status {status})"
                );
            }
            callback();
        });
        let st = self.raw.add_callback(dev.device_id, s, boxed);
        self.check(dev, "stream_add_callback", st)
    }

    fn raw_create_event(&self, dev: Device) -> DeviceResult<EventHandle> {
        let mut e: sys::KilnEvent = std::ptr::null_mut();
        let st = call_req!(self.raw, create_event(dev.device_id, &mut e));
        self.check(dev, "create_event", st)?;
        self.check_new_handle(dev, "create_event", "event", e as usize)?;
        Ok(EventHandle::from_raw(
            lock(&self.events).insert((dev.device_id, e as usize)),
        ))
    }

    fn raw_record_event(
        &self,
        dev: Device,
        stream: StreamHandle,
        event: EventHandle,
    ) -> DeviceResult<()> {
        let s = self.plugin_stream(dev, stream)?;
        let e = self.plugin_event(dev, event)?;
        let st = call_req!(self.raw, record_event(dev.device_id, s, e));
        self.check(dev, "record_event", st)
    }

    fn raw_query_event(&self, dev: Device, event: EventHandle) -> DeviceResult<bool> {
        let e = self.plugin_event(dev, event)?;
        match call_opt!(self.raw, query_event(dev.device_id, e)) {
            Some(KILN_STATUS_SUCCESS) => Ok(true),
            Some(KILN_STATUS_NOT_READY) => Ok(false),
            Some(st) => self.check(dev, "query_event", st).map(|()| false),
            None => {
                let st = call_req!(self.raw, synchronize_event(dev.device_id, e));
                self.check(dev, "synchronize_event (query_event fallback)", st)
                    .map(|()| true)
            }
        }
    }

    fn raw_sync_event(&self, dev: Device, event: EventHandle) -> DeviceResult<()> {
        let e = self.plugin_event(dev, event)?;
        let st = call_req!(self.raw, synchronize_event(dev.device_id, e));
        self.check(dev, "synchronize_event", st)
    }

    fn raw_stream_wait_event(
        &self,
        dev: Device,
        stream: StreamHandle,
        event: EventHandle,
    ) -> DeviceResult<()> {
        let s = self.plugin_stream(dev, stream)?;
        let e = self.plugin_event(dev, event)?;
        let st = call_req!(self.raw, stream_wait_event(dev.device_id, s, e));
        self.check(dev, "stream_wait_event", st)
    }

    fn raw_destroy_event(&self, dev: Device, event: EventHandle) -> DeviceResult<()> {
        let e = self.plugin_event(dev, event)?;
        lock(&self.events).remove(event.to_raw());
        let st = call_req!(self.raw, destroy_event(dev.device_id, e));
        self.check(dev, "destroy_event", st)
    }
}

impl PluginDeviceApi {
    /// Blocks until all work on every stream of `dev` has completed (`synchronize_device`, or
    /// every live stream of the device when the plugin lacks it).
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`]; the plugin's failures.
    pub fn synchronize_device(&self, dev: Device) -> DeviceResult<()> {
        self.check_device(dev)?;
        if let Some(st) = call_opt!(self.raw, synchronize_device(dev.device_id)) {
            return self.check(dev, "synchronize_device", st);
        }
        let mut streams: Vec<usize> = Vec::new();
        if let Some(Some(s)) = lock(&self.default_streams).get(dev.device_id as usize) {
            streams.push(*s);
        }
        {
            let mut t = lock(&self.streams);
            streams.extend(
                t.values_mut()
                    .filter(|(d, _)| *d == dev.device_id)
                    .map(|(_, s)| *s),
            );
        }
        for s in streams {
            self.sync_plugin_stream(dev, s as sys::KilnStream)?;
        }
        Ok(())
    }
}
