//! Code generation: IR to runtime modules of packed functions, and the runtime entry points the
//! generated code calls.
//!
//! The runtime half ([`parallel`]) is always built: a library kiln exported earlier still needs
//! the thread pool when loaded by a kiln built without LLVM.

pub mod parallel;
