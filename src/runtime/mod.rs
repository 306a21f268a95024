//! The runtime: what generated code and loaded libraries call while they run.
//!
//! # Design
//!
//! kiln is two halves. The *compiler* (`target`, `ir`, `schedule`, `codegen`) turns IR into
//! code; the *runtime* (`packed_func`, `device_api` and this module) runs it, and never imports
//! the compiler: a program that only loads and calls libraries kiln exported links none of it
//! (as TVM keeps `src/runtime` free of `src/target`). This module holds the runtime's services,
//! each reached by generated code through a context slot ([`crate::packed_func::context`]):
//!
//! | file | service | slot |
//! |---|---|---|
//! | [`parallel`] | the thread pool behind parallel loops | `__TVMBackendParallelLaunch` |
//! | [`launch`] | the kernel-launch service of device code | `__KilnDeviceLaunch` |
//! | [`device_module`] | device modules (a compiled module's kernels and the backend that runs them), the table of device-code loaders per target kind | `__kiln_device_module` |
//! | [`library`] | the shared-library loader ([`LibraryModule`]): dlopen, context slots, device modules | |
//! | `export_rt.c` | the same services in C, linked into every library kiln exports, for hosts that fill no slot (a plain C host, `tvm_ffi` alone) | |
//!
//! The workspace slots (`__TVMBackendAllocWorkspace`, `__TVMBackendFreeWorkspace`) belong to the
//! device runtime ([`crate::device_api::workspace`]), which [`init`] initializes too.
//!
//! # Example
//!
//! ```no_run
//! // Load a library that `kiln build` exported, and call it.
//! use kiln::packed_func::Module;
//! // SAFETY: a library kiln exported is a well-behaved tvm-ffi module.
//! let lib = unsafe { kiln::runtime::LibraryModule::load("vadd.so") }?;
//! let vadd = lib.require_function("vadd")?;
//! # Ok::<(), kiln::Error>(())
//! ```

pub mod device_module;
pub mod launch;
pub mod library;
pub mod parallel;

pub use device_module::{load_device_module, register_kernel_loader, DeviceModule, KernelBackend};
pub use library::{LibraryError, LibraryModule};
pub use parallel::{default_num_threads, ThreadPool};

/// Registers every runtime service as a context slot and initializes the device runtime (the
/// built-in backends, the workspace slots). Idempotent and cheap after the first call; the
/// loaders and the JIT call it before filling a library's slots.
pub fn init() {
    crate::device_api::init();
    parallel::register_runtime_symbols();
    launch::register_runtime_symbols();
}
