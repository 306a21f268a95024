//! Packed functions on the tvm-ffi C ABI.
//!
//! # Design
//!
//! Every function kiln builds, loads or registers is a [`PackedFunc`]: type-erased, called with a
//! slice of [`AnyView`] arguments, returning an owned [`Any`]. The C side is tvm-ffi 0.1's
//! *safe-call* convention (`int f(void* self, const TVMFFIAny* args, int n, TVMFFIAny* ret)`), so
//! a library kiln exports loads in `tvm_ffi.load_module`, and a function any tvm-ffi producer
//! exports can be called from Rust:
//!
//! - [`ffi`] holds the `#[repr(C)]` structures (`TVMFFIAny`, the object header, DLPack's
//!   `DLTensor` and friends), the thread-local raised error, and kiln's implementations of
//!   `TVMFFIErrorSetRaisedFromCStr(Parts)`.
//! - [`any`] holds the values; [`function`] the function type, its trampoline to C and typed
//!   calls; [`registry`] the global function table (`device_api.cpu`, `target.build.llvm`, ...);
//!   [`module`] the [`Module`] trait; [`context`] the table of context slots loaders fill;
//!   [`dlpack`] DLPack's names (the one table of device codes, dtype names). The loader of
//!   shared libraries is the runtime's ([`crate::runtime::LibraryModule`]): this module is the
//!   ABI alone, at the bottom of the layering.
//!
//! `unsafe` code lives in `ffi.rs`, `any.rs` (reading the C union) and `function.rs` (the
//! foreign call and the trampoline), each block with the invariant it relies on.
//!
//! # Example
//!
//! ```
//! use kiln::packed_func::{registry, Any, PackedFunc};
//!
//! let scale = PackedFunc::from_typed("demo.scale", |x: f64, k: i64| x * k as f64);
//! registry::register("demo.scale", scale, false)?;
//! let f = registry::require("demo.scale")?;
//! assert_eq!(f.call_typed::<_, f64>((1.5f64, 4i64))?, 6.0);
//! // Wrong types are errors that say what was expected:
//! let err = f.call_typed::<_, f64>(("x", 4i64)).unwrap_err();
//! assert!(err.to_string().contains("argument #0 expects float"));
//! # Ok::<(), kiln::Error>(())
//! ```

pub mod any;
pub mod context;
pub mod dlpack;
pub mod error;
pub mod ffi;
pub mod function;
pub mod module;
pub mod registry;

pub use any::{Any, AnyView, FromAny, Value};
pub use error::{ConversionError, PackedFuncError, PackedFuncResult};
pub use ffi::{DLDataType, DLDevice, DLDeviceType, DLTensor, TVMFFIAny, TypeIndex};
pub use function::{Arg, IntoArgs, PackedFunc, TypedFn};
pub use module::Module;
