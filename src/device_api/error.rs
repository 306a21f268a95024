//! [`DeviceError`]: everything the device runtime reports, and [`DeviceResult`].
//!
//! Each variant says what was asked, what was found and on which device, and its doc says what
//! the caller can do about it (fix the input, free memory and retry, register a backend, ...).

use super::device::Device;
use super::memory::DevicePtr;

/// The result of device-runtime operations.
pub type DeviceResult<T> = Result<T, DeviceError>;

/// Errors of the device runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// A device name no backend knows (`"cdua"`). Fix the name; the message lists the known ones.
    #[error("unknown device `{name}`; known devices: {}", .known.join(", "))]
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// The names kiln knows (registered backends and DLPack's device types).
        known: Vec<String>,
    },
    /// A device type that is valid (a DLPack code or a registered name) but has no backend in
    /// this process: register one (e.g. load its plugin) or use another device.
    #[error("no backend is registered for device type `{name}` ({code}); registered: {}", .registered.join(", "))]
    NoBackend {
        /// The device type's name.
        name: String,
        /// Its code.
        code: i32,
        /// The registered backends.
        registered: Vec<String>,
    },
    /// Registering a backend under a name or code that is taken, or that is not allowed.
    #[error("cannot register device backend `{name}` with code {code}: {reason}")]
    Registration {
        /// The name.
        name: String,
        /// The code.
        code: i32,
        /// Why not.
        reason: String,
    },
    /// A device id out of range, or a device of another type than the backend's. Fix the input.
    #[error("invalid device {device}: {reason}")]
    InvalidDevice {
        /// The device asked for.
        device: Device,
        /// Why it is invalid (e.g. "the backend has 1 device(s)").
        reason: String,
    },
    /// The device could not provide the memory: free some (or trim workspace pools) and retry,
    /// or ask for less. Also returned for sizes no allocator could ever satisfy.
    #[error("allocating {nbytes} bytes (align {align}) on {device} failed{}", detail(.reason))]
    OutOfMemory {
        /// The device.
        device: Device,
        /// The size asked for.
        nbytes: u64,
        /// The alignment asked for.
        align: u64,
        /// More detail, if any (e.g. "size exceeds isize::MAX").
        reason: String,
    },
    /// A zero-byte allocation: not an allocation; skip it (a zero-element `Tensor` allocates
    /// nothing).
    #[error("allocating 0 bytes on {device}: zero-size allocations are not allowed")]
    ZeroSize {
        /// The device.
        device: Device,
    },
    /// An alignment that is not a power of two. Fix the input.
    #[error("alignment {align} on {device} is not a power of two")]
    BadAlignment {
        /// The device.
        device: Device,
        /// The alignment given.
        align: u64,
    },
    /// Freeing a pointer that is live nowhere: the backend never handed it out. A bug in the
    /// caller.
    #[error("freeing {ptr} on {device}: {what} never handed out this pointer")]
    UnknownPointer {
        /// The device.
        device: Device,
        /// The pointer.
        ptr: DevicePtr,
        /// Who was asked (the backend, or a workspace pool).
        what: String,
    },
    /// Freeing a pointer that was freed already. A bug in the caller.
    #[error("freeing {ptr} on {device}: double free (it was already freed)")]
    DoubleFree {
        /// The device.
        device: Device,
        /// The pointer.
        ptr: DevicePtr,
    },
    /// A byte range outside every live allocation of the backend (memset or copy on device
    /// memory). Fix the input.
    #[error(
        "{op} on {device}: bytes [{ptr} + {offset}, +{nbytes}) {}",
        oob_detail(*.allocation)
    )]
    OutOfBounds {
        /// The operation.
        op: &'static str,
        /// The device.
        device: Device,
        /// The base pointer.
        ptr: DevicePtr,
        /// The byte offset.
        offset: u64,
        /// The length.
        nbytes: u64,
        /// The size of the allocation `ptr` starts, when it is a live one (the range runs past
        /// its end); `None` when `ptr` is not a live allocation.
        allocation: Option<u64>,
    },
    /// Source and destination of a copy disagree (shape, dtype or byte size). Fix the input.
    #[error("copying {from} to {to}: {reason}")]
    CopyMismatch {
        /// The source, described.
        from: String,
        /// The destination, described.
        to: String,
        /// What differs: expected vs found.
        reason: String,
    },
    /// A kernel launch the runtime refused before reaching the driver (unknown kernel, wrong
    /// argument count, a buffer too small or not live, a bad work-group size). Fix the launch.
    #[error("launching kernel `{kernel}` on {device}: {reason}")]
    InvalidLaunch {
        /// The device.
        device: Device,
        /// The kernel's name.
        kernel: String,
        /// What is wrong: expected vs found.
        reason: String,
    },
    /// A malformed tensor (negative extent, NULL data with elements, bad ndim...). Fix the input.
    #[error("invalid tensor: {0}")]
    InvalidTensor(String),
    /// An element type that does not match the tensor's dtype.
    #[error("tensor has dtype {found}, but the element type is {expected}")]
    DtypeMismatch {
        /// The element type asked for.
        expected: String,
        /// The tensor's dtype.
        found: String,
    },
    /// A stream handle that is not live on this device: it was freed, or it belongs to another
    /// device or backend. A bug in the caller.
    #[error("stream {handle:#x} on {device} is not a live stream (freed, or created elsewhere)")]
    InvalidStream {
        /// The device.
        device: Device,
        /// The raw handle.
        handle: u64,
    },
    /// An event handle that is not live on this device (destroyed, or never created here).
    #[error("event {handle:#x} on {device} is not a live event (destroyed, or created elsewhere)")]
    InvalidEvent {
        /// The device.
        device: Device,
        /// The raw handle.
        handle: u64,
    },
    /// The backend does not provide this capability (a memory scope, a strided device copy...).
    /// Use another path (the message says which) or another device.
    #[error("{device} does not support {what}")]
    Unsupported {
        /// The device.
        device: Device,
        /// The capability.
        what: String,
    },
    /// A DLPack tensor that kiln cannot take (version, flags, layout).
    #[error("DLPack: {0}")]
    DlPack(String),
    /// The backend failed for its own reasons (driver error, plugin error); the message is the
    /// backend's.
    #[error("{device}: {message}")]
    Backend {
        /// The device.
        device: Device,
        /// The backend's message.
        message: String,
    },
    /// A callback or the backend panicked; the panic was caught.
    #[error("{what} panicked: {message}")]
    Panicked {
        /// What was running.
        what: String,
        /// The panic payload, if it was a string.
        message: String,
    },
}

fn oob_detail(allocation: Option<u64>) -> String {
    match allocation {
        Some(size) => format!("run past the end of its allocation of {size} bytes"),
        None => "are not inside a live allocation".to_owned(),
    }
}

fn detail(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

impl DeviceError {
    /// The tvm-ffi error kind this error is raised as across the C ABI.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::OutOfMemory { .. } => "MemoryError",
            Self::DtypeMismatch { .. } => "TypeError",
            Self::UnknownDevice { .. }
            | Self::InvalidDevice { .. }
            | Self::ZeroSize { .. }
            | Self::BadAlignment { .. }
            | Self::CopyMismatch { .. }
            | Self::InvalidTensor(_)
            | Self::OutOfBounds { .. }
            | Self::InvalidLaunch { .. }
            | Self::DlPack(_) => "ValueError",
            _ => "RuntimeError",
        }
    }
}
