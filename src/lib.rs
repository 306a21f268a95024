//! kiln: a TVM-style backend stack in Rust — a device runtime, a registry of target kinds that
//! reads TVM's JSON targets, a small tensor IR, an LLVM code generator, and packed functions on
//! tvm-ffi's C ABI, so what kiln builds loads in Python's `tvm_ffi.load_module` and in any C host.
//!
//! # Architecture on one page
//!
//! ```text
//! target JSON ──► target::Target ──────────────┐
//! IR JSON / Rust builder ──► ir::IRModule ─────┼─► codegen::build(&module, &target)
//!                                              │     calls the global "target.build.<kind>"
//!                                              ▼
//!                  LLVM (codegen::llvm) ──► runtime Module: JIT in-process, or exported .so
//!                                              │
//!                  module.get_function("f") ──► PackedFunc (tvm-ffi safe-call ABI)
//!                                              │
//!   device_api::Tensor on a Device ────────────┴─► call ──► runs; errors raise, never crash
//! ```
//!
//! | module | holds |
//! |---|---|
//! | [`packed_func`] | the tvm-ffi ABI (`TVMFFIAny`, DLPack), [`packed_func::PackedFunc`], the global function registry, the [`packed_func::Module`] trait, the shared-library loader |
//! | [`device_api`] | [`device_api::DeviceApi`] (+ memory and stream facets), the backend registry, CPU and null backends, workspaces, streams, events, [`device_api::Tensor`] |
//! | [`target`] | [`target::Target`] (TVM 0.27 JSON, legacy strings, tags) and [`target::TargetKind`] (typed options, canonicalizers) |
//! | [`ir`] | the tensor IR: JSON format, builder, printer, verifier, reference interpreter |
//! | [`codegen`] | [`codegen::build`], the LLVM backend (feature `llvm`, on by default), the runtime services generated code calls |
//! | [`npy`], [`error`] | `.npy` files for `kiln run`; the crate [`Error`] over each module's error |
//!
//! Everything is looked up by name in registries any crate can extend, so a new backend `foo` is
//! three registrations: a device ([`device_api::register_device_api`]), a target kind
//! ([`target::TargetKind::builder`]) and a code generator (`target.build.foo`, made with
//! [`codegen::codegen_func`]). `examples/custom_backend.rs` does all three; the guides in
//! `docs/` (start at `docs/README.md`, or `docs/architecture.md` before changing kiln) explain
//! each part.
//!
//! # Example
//!
//! Build `C = A + B` for this CPU, run it on tensors, check the result:
//!
//! ```
//! # #[cfg(feature = "llvm")] {
//! use kiln::device_api::{Device, Tensor};
//! use kiln::ir::{kernels, IRModule};
//! use kiln::packed_func::AnyView;
//! use kiln::target::Target;
//!
//! let module = IRModule::from_functions(vec![kernels::vadd()]); // or IRModule::from_json_str
//! let target = Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#)?;
//! let rt = kiln::codegen::build(&module, &target)?;
//!
//! let cpu = Device::cpu();
//! let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], cpu)?;
//! let b = Tensor::from_slice(&[10.0f32, 20.0, 30.0], &[3], cpu)?;
//! let c = Tensor::zeros(&[3], a.dtype(), cpu)?;
//! let vadd = rt.require_function("vadd")?;
//! vadd.call(&[a.as_dltensor(), b.as_dltensor(), c.as_dltensor()].map(AnyView::from))?;
//! assert_eq!(c.to_vec::<f32>()?, [11.0, 22.0, 33.0]);
//!
//! // Bad calls are errors with TVM's messages, never crashes.
//! let err = vadd.call(&[AnyView::from(a.as_dltensor())]).unwrap_err();
//! assert!(err.to_string().contains("vadd"), "{err}");
//! # }
//! # Ok::<(), kiln::Error>(())
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "llvm")]
pub mod cli;
pub mod codegen;
pub mod device_api;
pub mod error;
pub mod ir;
pub mod npy;
pub mod packed_func;
pub mod rpc;
pub mod runtime;
pub mod schedule;
pub mod target;
#[cfg(feature = "llvm")]
pub mod tune;
pub mod util;

pub use error::{Error, Result};

/// The Rust blocks of the guides in `docs/`, compiled and run as doctests.
#[cfg(doctest)]
pub mod guides {
    #[doc = include_str!("../docs/devices.md")]
    pub struct Devices;
    #[doc = include_str!("../docs/architecture.md")]
    pub struct Architecture;
    #[doc = include_str!("../docs/python.md")]
    pub struct Python;
}
