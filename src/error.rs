//! The crate-level error: every module's error converts into it with `?`.

/// Any error kiln reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error with a tvm-ffi kind (e.g. `ValueError`) and a message.
    #[error("{kind}: {message}")]
    Other {
        /// The tvm-ffi error kind.
        kind: String,
        /// The message.
        message: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
