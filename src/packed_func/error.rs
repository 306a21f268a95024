//! Errors of packed functions, and the error kinds that cross the tvm-ffi ABI.
//!
//! A packed function reports failure across C by *raising* an error (a kind such as `TypeError`
//! and a message) into a thread-local slot and returning non-zero; the caller then takes it.
//! [`PackedFuncError::Raised`] keeps the kind a foreign function raised, so a `ValueError` from
//! generated code is still a `ValueError` in Rust and in Python.

/// The result of packed-function operations.
pub type PackedFuncResult<T> = Result<T, PackedFuncError>;

/// A value had another type than the one asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected}, found {found}")]
pub struct ConversionError {
    /// The type that was asked for.
    pub expected: &'static str,
    /// The type that was found.
    pub found: String,
}

/// Errors of calling, registering and converting packed functions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PackedFuncError {
    /// The callee raised an error: its kind (`TypeError`, `ValueError`, `RuntimeError`, ...) and
    /// message, unchanged. Fix the input, or report the callee's bug.
    #[error("{kind}: {message}")]
    Raised {
        /// The tvm-ffi error kind.
        kind: String,
        /// The message.
        message: String,
    },
    /// A foreign function returned non-zero without raising an error (a bug in the callee; kiln
    /// reports it instead of crashing, which is what a tvm-ffi host would do).
    #[error("RuntimeError: packed function `{name}` returned {code} without raising an error")]
    ReturnedWithoutError {
        /// The function.
        name: String,
        /// Its return code.
        code: i32,
    },
    /// A typed call or typed function got the wrong number of arguments.
    #[error("TypeError: packed function `{name}` expects {expected} arguments, found {found}")]
    ArgCount {
        /// The function.
        name: String,
        /// How many it takes.
        expected: usize,
        /// How many it got.
        found: usize,
    },
    /// A typed call or typed function got an argument of the wrong type.
    #[error(
        "TypeError: packed function `{name}`: argument #{index} expects {expected}, found {found}"
    )]
    ArgType {
        /// The function.
        name: String,
        /// Zero-based argument index.
        index: usize,
        /// The expected type.
        expected: &'static str,
        /// The type found.
        found: String,
    },
    /// A returned value had the wrong type.
    #[error("TypeError: {0}")]
    Conversion(#[from] ConversionError),
    /// The C caller passed a NULL argument array with a non-zero count, or a negative count.
    #[error(
        "ValueError: packed function `{name}` called with args = NULL and num_args = {num_args}"
    )]
    BadArgArray {
        /// The function.
        name: String,
        /// The count it was given.
        num_args: i32,
    },
    /// A Rust function panicked behind the C ABI; the panic was caught.
    #[error("RuntimeError: packed function `{name}` panicked: {message}")]
    Panicked {
        /// The function.
        name: String,
        /// The panic payload, if it was a string.
        message: String,
    },
    /// No global function with this name.
    #[error("no global function `{name}`{}", suggest(.close))]
    NotFound {
        /// The name asked for.
        name: String,
        /// Registered names that look alike.
        close: Vec<String>,
    },
    /// A global function with this name exists and `override` was not set.
    #[error("global function `{name}` is already registered (pass override = true to replace it)")]
    AlreadyRegistered {
        /// The name.
        name: String,
    },
    /// A module has no function of this name.
    #[error("module `{module}` has no function `{name}`; it has: {}", .available.join(", "))]
    NoSuchFunction {
        /// The module's type key.
        module: String,
        /// The name asked for.
        name: String,
        /// The functions it has.
        available: Vec<String>,
    },
}

fn suggest(close: &[String]) -> String {
    if close.is_empty() {
        String::new()
    } else {
        format!(
            "; did you mean {}?",
            close
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(" or ")
        )
    }
}

impl PackedFuncError {
    /// The tvm-ffi error kind this error is raised as across the C ABI.
    pub fn kind(&self) -> &str {
        match self {
            Self::Raised { kind, .. } => kind,
            Self::ArgCount { .. } | Self::ArgType { .. } | Self::Conversion(_) => "TypeError",
            Self::BadArgArray { .. } => "ValueError",
            Self::NotFound { .. } | Self::NoSuchFunction { .. } => "AttributeError",
            _ => "RuntimeError",
        }
    }

    /// The message without the kind prefix (what `TVMFFIErrorSetRaisedFromCStr` gets).
    pub fn message(&self) -> String {
        match self {
            Self::Raised { message, .. } => message.clone(),
            other => {
                let full = other.to_string();
                let prefix = format!("{}: ", other.kind());
                full.strip_prefix(&prefix)
                    .map(str::to_owned)
                    .unwrap_or(full)
            }
        }
    }
}
