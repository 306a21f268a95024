//! Context slots: how a loaded library reaches the runtime services of its host.
//!
//! A library that follows tvm-ffi's module ABI needs no `libtvm_ffi`: each service it calls
//! (raising an error, the parallel launcher, workspaces, kiln's kernel launch) is an exported,
//! zero-initialized `void*` variable named `__<CFunctionName>` (a *context slot*) that the
//! loader fills right after `dlopen`, and that the library's code calls through when it is
//! non-NULL (each has a weak fallback otherwise). This table says what kiln writes into each
//! slot: every loader of kiln's (the library loader in [`crate::runtime`], the JIT, the plugin
//! loader) fills every slot registered here. The error slots are filled from the start; the
//! runtime ([`crate::runtime::init`]) and the device runtime ([`crate::device_api::init`])
//! register the others.

use std::collections::BTreeMap;
use std::sync::{OnceLock, RwLock};

use super::ffi;

fn slots() -> &'static RwLock<BTreeMap<String, usize>> {
    static SLOTS: OnceLock<RwLock<BTreeMap<String, usize>>> = OnceLock::new();
    SLOTS.get_or_init(|| {
        let mut m = BTreeMap::new();
        let set: ffi::SetRaisedFromCStrFn = ffi::kiln_error_set_raised_from_cstr;
        let parts: ffi::SetRaisedFromCStrPartsFn = ffi::kiln_error_set_raised_from_cstr_parts;
        m.insert("__TVMFFIErrorSetRaisedFromCStr".to_owned(), set as usize);
        m.insert(
            "__TVMFFIErrorSetRaisedFromCStrParts".to_owned(),
            parts as usize,
        );
        RwLock::new(m)
    })
}

/// Registers a runtime service for the context slot `slot` (e.g. `__TVMBackendParallelLaunch`):
/// every library loaded afterwards that exports the slot gets `addr` written into it.
pub fn register_context_symbol(slot: &str, addr: usize) {
    slots()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(slot.to_owned(), addr);
}

/// The registered context slots and their values.
pub fn context_symbols() -> Vec<(String, usize)> {
    slots()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}
