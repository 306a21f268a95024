//! Streams and events: typed handles that detect use after free ([`StreamHandle`],
//! [`EventHandle`], [`HandleTable`]) and the stream facet of a backend ([`DeviceStreamApi`]).
//!
//! A handle is a 64-bit value: slot index + 1 in the low 32 bits, the slot's generation in the
//! high 32 bits. Freeing a handle bumps its slot's generation, so the old value no longer
//! resolves: a freed stream or event is a clear error, never a dangling pointer. The value fits
//! in a C `void*`, so generated code can carry it as TVM carries `TVMStreamHandle`.

use std::fmt;

use super::device::Device;
use super::error::DeviceResult;
use super::memory::HostCallback;

/// A stream on a device. [`StreamHandle::DEFAULT`] (0, TVM's NULL stream) is every device's
/// default stream, always valid and never freed.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StreamHandle(u64);

impl StreamHandle {
    /// The default stream (TVM's NULL stream).
    pub const DEFAULT: Self = Self(0);

    /// Whether this is the default stream.
    pub fn is_default(self) -> bool {
        self.0 == 0
    }

    /// The raw value (for C, or a [`HandleTable`] lookup).
    pub fn to_raw(self) -> u64 {
        self.0
    }

    /// A handle from its raw value (which the backend will check).
    pub fn from_raw(raw: u64) -> Self {
        Self(raw)
    }
}

impl fmt::Debug for StreamHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_default() {
            f.write_str("StreamHandle(default)")
        } else {
            write!(f, "StreamHandle({:#x})", self.0)
        }
    }
}

/// An event on a device: a point in a stream that other streams and the host can wait for.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHandle(u64);

impl EventHandle {
    /// The raw value.
    pub fn to_raw(self) -> u64 {
        self.0
    }

    /// A handle from its raw value (which the backend will check).
    pub fn from_raw(raw: u64) -> Self {
        Self(raw)
    }
}

impl fmt::Debug for EventHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventHandle({:#x})", self.0)
    }
}

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// A table of values addressed by generation-checked 64-bit handles (never 0). Backends keep
/// their streams and events in one, so a stale handle is detected instead of dereferenced.
pub struct HandleTable<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> fmt::Debug for HandleTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandleTable")
            .field("live", &self.live)
            .finish()
    }
}

impl<T> HandleTable<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn split(raw: u64) -> Option<(usize, u32)> {
        let index = (raw & 0xffff_ffff) as u32;
        let generation = (raw >> 32) as u32;
        (index != 0).then(|| ((index - 1) as usize, generation))
    }

    /// Stores `value` and returns its handle (never 0).
    pub fn insert(&mut self, value: T) -> u64 {
        self.live += 1;
        if let Some(i) = self.free.pop() {
            let slot = &mut self.slots[i as usize];
            slot.value = Some(value);
            return (u64::from(slot.generation) << 32) | u64::from(i + 1);
        }
        self.slots.push(Slot {
            generation: 1,
            value: Some(value),
        });
        let i = (self.slots.len() - 1) as u64;
        (1u64 << 32) | (i + 1)
    }

    /// The value of a live handle.
    pub fn get(&self, raw: u64) -> Option<&T> {
        let (i, g) = Self::split(raw)?;
        let slot = self.slots.get(i)?;
        if slot.generation == g {
            slot.value.as_ref()
        } else {
            None
        }
    }

    /// The value of a live handle, mutably.
    pub fn get_mut(&mut self, raw: u64) -> Option<&mut T> {
        let (i, g) = Self::split(raw)?;
        let slot = self.slots.get_mut(i)?;
        if slot.generation == g {
            slot.value.as_mut()
        } else {
            None
        }
    }

    /// Removes a live handle's value; the handle (and every copy of it) is dead afterwards.
    pub fn remove(&mut self, raw: u64) -> Option<T> {
        let (i, g) = Self::split(raw)?;
        let slot = self.slots.get_mut(i)?;
        if slot.generation != g {
            return None;
        }
        let v = slot.value.take()?;
        // Generation 0 is never handed out, so wrapping skips it.
        slot.generation = slot.generation.wrapping_add(1).max(1);
        self.free.push(i as u32);
        self.live -= 1;
        Some(v)
    }

    /// The number of live handles.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no handle is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The live values.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().filter_map(|s| s.value.as_mut())
    }
}

/// The stream and event operations a backend implements. Callers use the checked methods of
/// [`DeviceApi`](super::DeviceApi). Every method that takes a handle must reject a handle that is
/// not live on `dev` with [`DeviceError::InvalidStream`](super::DeviceError::InvalidStream) /
/// [`DeviceError::InvalidEvent`](super::DeviceError::InvalidEvent) (a [`HandleTable`] does the
/// bookkeeping). [`StreamHandle::DEFAULT`] is valid everywhere a stream is taken.
pub trait DeviceStreamApi {
    /// Creates a stream on `dev`.
    ///
    /// # Errors
    /// Backend failures.
    fn raw_create_stream(&self, dev: Device) -> DeviceResult<StreamHandle>;

    /// Frees a stream after the work queued on it completes. Freeing the default stream is an
    /// error.
    ///
    /// # Errors
    /// [`DeviceError::InvalidStream`](super::DeviceError::InvalidStream) for a dead handle.
    fn raw_free_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()>;

    /// Blocks until everything queued on `stream` has completed.
    ///
    /// # Errors
    /// A dead handle; the first failure of the queued work.
    fn raw_sync_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()>;

    /// Whether everything queued on `stream` has completed, without blocking.
    ///
    /// # Errors
    /// A dead handle.
    fn raw_query_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<bool>;

    /// Checks that `stream` is a live handle of `dev`, without waiting for or consuming anything
    /// queued on it (a failure of queued work belongs to the next synchronization). The default
    /// asks [`raw_query_stream`](Self::raw_query_stream); backends whose query may block or
    /// report queued work override it.
    ///
    /// # Errors
    /// A dead handle.
    fn raw_check_stream(&self, dev: Device, stream: StreamHandle) -> DeviceResult<()> {
        self.raw_query_stream(dev, stream).map(|_| ())
    }

    /// Queues `callback` on `stream`: it runs on the host, once, after everything queued before it
    /// and before anything queued after it completes.
    ///
    /// # Errors
    /// A dead handle (the callback is then dropped without running).
    fn raw_add_callback(
        &self,
        dev: Device,
        stream: StreamHandle,
        callback: HostCallback,
    ) -> DeviceResult<()>;

    /// Creates an event on `dev`. An event never recorded counts as complete.
    ///
    /// # Errors
    /// Backend failures.
    fn raw_create_event(&self, dev: Device) -> DeviceResult<EventHandle>;

    /// Records `event` at the current end of `stream` (re-recording replaces the earlier point).
    ///
    /// # Errors
    /// A dead stream or event handle.
    fn raw_record_event(
        &self,
        dev: Device,
        stream: StreamHandle,
        event: EventHandle,
    ) -> DeviceResult<()>;

    /// Whether the work before `event`'s recorded point has completed, without blocking.
    ///
    /// # Errors
    /// A dead handle.
    fn raw_query_event(&self, dev: Device, event: EventHandle) -> DeviceResult<bool>;

    /// Blocks until the work before `event`'s recorded point has completed.
    ///
    /// # Errors
    /// A dead handle.
    fn raw_sync_event(&self, dev: Device, event: EventHandle) -> DeviceResult<()>;

    /// Makes work queued on `stream` after this call wait for `event`'s recorded point.
    ///
    /// # Errors
    /// A dead stream or event handle.
    fn raw_stream_wait_event(
        &self,
        dev: Device,
        stream: StreamHandle,
        event: EventHandle,
    ) -> DeviceResult<()>;

    /// Destroys an event; its handle is dead afterwards.
    ///
    /// # Errors
    /// A dead handle.
    fn raw_destroy_event(&self, dev: Device, event: EventHandle) -> DeviceResult<()>;

    /// The device time between the recorded points of `start` and `end`, blocking until both
    /// have completed (CUDA's `cudaEventElapsedTime`). The default has no timer.
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`](super::DeviceError::Unsupported) by default; a dead handle; an
    /// event never recorded; no timing information from the driver.
    fn raw_event_elapsed(
        &self,
        dev: Device,
        start: EventHandle,
        end: EventHandle,
    ) -> DeviceResult<std::time::Duration> {
        let _ = (start, end);
        Err(super::DeviceError::Unsupported {
            device: dev,
            what: "timing between events".to_owned(),
        })
    }
}
