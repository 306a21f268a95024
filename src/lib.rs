//! kiln: a TVM-style backend stack in Rust.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod codegen;
pub mod device_api;
pub mod error;
pub mod ir;
pub mod packed_func;
pub mod schedule;
pub mod target;

pub use error::{Error, Result};
