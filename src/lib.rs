//! kiln: a TVM-style backend stack in Rust.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod packed_func;
pub mod device_api;
pub mod target;
pub mod ir;
#[cfg(feature = "llvm")]
pub mod codegen;
pub mod error;

pub use error::{Error, Result};
