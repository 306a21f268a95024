//! The crate-level error: every module's error converts into it with `?`.

use crate::codegen::CodegenError;
use crate::device_api::{DeviceError, PluginError};
use crate::ir::IrError;
use crate::npy::NpyError;
use crate::packed_func::PackedFuncError;
use crate::runtime::LibraryError;
use crate::schedule::ScheduleError;
use crate::target::TargetError;

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
    /// Loading a device plugin.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// Loading a library.
    #[error(transparent)]
    Library(#[from] LibraryError),
    /// Parsing or checking a target.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// Reading or verifying IR.
    #[error(transparent)]
    Ir(#[from] IrError),
    /// Applying a schedule primitive.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// Generating code (a [`CodegenError::Ir`] or [`CodegenError::Backend`] converts to
    /// [`Error::Ir`] or [`Error::PackedFunc`]).
    #[error(transparent)]
    Codegen(CodegenError),
    /// Reading or writing `.npy` data.
    #[error(transparent)]
    Npy(#[from] NpyError),
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
            Error::Target(_) | Error::Ir(_) | Error::Schedule(_) | Error::Npy(_) => "ValueError",
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

impl From<CodegenError> for Error {
    fn from(e: CodegenError) -> Self {
        match e {
            CodegenError::Ir(e) => Error::Ir(e),
            CodegenError::Backend(e) => Error::PackedFunc(e),
            other => Error::Codegen(other),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
