//! The crate-level error: every module's error converts into it with `?`.

use crate::device_api::DeviceError;
use crate::packed_func::{LibraryError, PackedFuncError};

/// Any error kiln reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Calling, converting or registering packed functions.
    #[error(transparent)]
    PackedFunc(#[from] PackedFuncError),
    /// The device runtime: devices, memory, copies, streams, tensors.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Loading a library.
    #[error(transparent)]
    Library(#[from] LibraryError),
    /// Reading or writing files.
    #[error("{context}: {source}")]
    Io {
        /// What kiln was doing.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Error {
    /// The tvm-ffi error kind this error is raised as across the C ABI.
    pub fn kind(&self) -> &str {
        match self {
            Error::PackedFunc(e) => e.kind(),
            Error::Device(e) => e.kind(),
            _ => "RuntimeError",
        }
    }
}

impl From<Error> for PackedFuncError {
    fn from(e: Error) -> Self {
        match e {
            Error::PackedFunc(p) => p,
            other => PackedFuncError::Raised {
                kind: other.kind().to_owned(),
                message: other.to_string(),
            },
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
