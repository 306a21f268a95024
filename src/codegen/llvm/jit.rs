//! In-process execution of generated code, and what makes a cold build fast.
//!
//! - **One linker per process.** An ORC LLJIT (`llvm_sys::orc2`) links the objects kiln
//!   compiles; it never compiles anything itself. Each module's object goes into the main
//!   JITDylib under its own resource tracker, its exported symbols made unique by a per-module
//!   suffix, and dropping the module removes its code. libc/libm symbols (`expf`, `memcpy`) come
//!   from the process.
//! - **Target machines are reused.** Optimizing and emitting code needs an LLVM target machine,
//!   whose subtarget tables cost a good part of a millisecond to build; a pool keyed by the
//!   codegen options lends them out, one per concurrent build.
//! - **Argument checkers are compiled on first use.** A wrapper's checks with TVM's messages
//!   are most of a one-function module's code, yet only run when a call is wrong. A JIT module
//!   carries the fast wrapper (the same checks, and-ed without messages); a failing call goes to
//!   [`kiln_jit_check_args`], which compiles the module's checkers once
//!   ([`Linkage::Checkers`]) and lets the matching one raise the error. Exported libraries carry
//!   their checkers inline.
//!
//! - **Code is compiled in two tiers** (`tiering.rs`): quick code first, optimized code
//!   swapped in by a background thread.
//!
//! Every `unsafe` of the JIT is in this file, and in `quick.rs` (the quick wrappers' argument
//! decoder, which reads the caller's tensors).

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use inkwell::context::{AsContextRef, Context};
use inkwell::llvm_sys::core::{
    LLVMContextSetDiagnosticHandler, LLVMCreateMemoryBufferWithMemoryRangeCopy, LLVMDisposeMessage,
    LLVMGetDiagInfoDescription, LLVMGetDiagInfoSeverity,
};
use inkwell::llvm_sys::error::{LLVMDisposeErrorMessage, LLVMErrorRef, LLVMGetErrorMessage};
use inkwell::llvm_sys::orc2::lljit::{
    LLVMOrcCreateLLJIT, LLVMOrcCreateLLJITBuilder, LLVMOrcLLJITAddObjectFileWithRT,
    LLVMOrcLLJITGetGlobalPrefix, LLVMOrcLLJITGetMainJITDylib, LLVMOrcLLJITLookup, LLVMOrcLLJITRef,
};
use inkwell::llvm_sys::orc2::{
    LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess, LLVMOrcJITDylibAddGenerator,
    LLVMOrcJITDylibCreateResourceTracker, LLVMOrcJITDylibRef, LLVMOrcReleaseResourceTracker,
    LLVMOrcResourceTrackerRef, LLVMOrcResourceTrackerRemove,
};
use inkwell::llvm_sys::prelude::LLVMDiagnosticInfoRef;
use inkwell::llvm_sys::LLVMDiagnosticSeverity;
use inkwell::targets::TargetMachine;

use crate::ir::IRModule;
use crate::packed_func::ffi::{set_raised, TVMFFIAny, TVMFFISafeCallType};

use super::quick::QuickSig;
use super::{CodegenError, CodegenOptions, Linkage, R};

/// The process's LLJIT and its main JITDylib.
struct Engine {
    jit: LLVMOrcLLJITRef,
    main: LLVMOrcJITDylibRef,
}

// SAFETY: ORC's LLJIT and ExecutionSession are thread-safe for adding objects, looking up
// symbols and removing resource trackers, the only operations kiln performs; the engine lives
// until the process exits.
unsafe impl Send for Engine {}
// SAFETY: as above.
unsafe impl Sync for Engine {}

/// The message of an LLVM error (consumed), or `None` for success.
fn take_error(err: LLVMErrorRef) -> Option<String> {
    if err.is_null() {
        return None;
    }
    // SAFETY: `err` is a live LLVMErrorRef; getting its message consumes it, and the message is
    // a NUL-terminated string we free once, after copying it.
    unsafe {
        let m = LLVMGetErrorMessage(err);
        let s = CStr::from_ptr(m).to_string_lossy().into_owned();
        LLVMDisposeErrorMessage(m);
        Some(s)
    }
}

fn engine() -> R<&'static Engine> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            super::init_llvm();
            let mut jit: LLVMOrcLLJITRef = std::ptr::null_mut();
            // SAFETY: the builder is consumed by LLVMOrcCreateLLJIT; on success `jit` is a live
            // LLJIT, never disposed (it serves the whole process). The process symbol
            // generator is owned by the JITDylib it is added to.
            unsafe {
                let builder = LLVMOrcCreateLLJITBuilder();
                if let Some(e) = take_error(LLVMOrcCreateLLJIT(&mut jit, builder)) {
                    return Err(e);
                }
                let main = LLVMOrcLLJITGetMainJITDylib(jit);
                let mut gen = std::ptr::null_mut();
                let prefix = LLVMOrcLLJITGetGlobalPrefix(jit);
                let err = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                    &mut gen,
                    prefix,
                    None,
                    std::ptr::null_mut(),
                );
                if let Some(e) = take_error(err) {
                    return Err(e);
                }
                LLVMOrcJITDylibAddGenerator(main, gen);
                Ok(Engine { jit, main })
            }
        })
        .as_ref()
        .map_err(|e| CodegenError::Llvm(format!("cannot create the JIT: {e}")))
}

/// The code of one module in the JIT; dropping it removes the code.
pub(crate) struct JitCode {
    rt: LLVMOrcResourceTrackerRef,
}

// SAFETY: a resource tracker may be removed from any thread; `JitCode` only does that, once,
// in `Drop`.
unsafe impl Send for JitCode {}
// SAFETY: no method reads the tracker through `&self`.
unsafe impl Sync for JitCode {}

impl Drop for JitCode {
    fn drop(&mut self) {
        // SAFETY: `rt` is a live tracker this `JitCode` owns; after removal nothing refers to
        // its code (every function handed out holds this `JitCode` alive through an Arc).
        unsafe {
            let _ = take_error(LLVMOrcResourceTrackerRemove(self.rt));
            LLVMOrcReleaseResourceTracker(self.rt);
        }
    }
}

/// A fresh symbol suffix: exported symbols of every JIT module are unique in the process.
pub(crate) fn unique_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(".k{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Links `objects` (which may refer to each other's symbols) into the JIT as one piece of code,
/// and returns it with the addresses of `symbols`.
pub(crate) fn load_objects(objects: &[Vec<u8>], symbols: &[String]) -> R<(JitCode, Vec<usize>)> {
    let eng = engine()?;
    let llvm = |what: &str, e: String| CodegenError::Llvm(format!("JIT {what}: {e}"));
    // SAFETY: `main` is the engine's live JITDylib; the new tracker is owned by `code` from
    // here on, so it is removed on every path.
    let rt = unsafe { LLVMOrcJITDylibCreateResourceTracker(eng.main) };
    let code = JitCode { rt };
    for object in objects {
        // SAFETY: the buffer copies `object`; LLVMOrcLLJITAddObjectFileWithRT takes ownership of
        // it, whether it succeeds or not.
        let err = unsafe {
            let buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(
                object.as_ptr().cast::<c_char>(),
                object.len(),
                c"kiln".as_ptr(),
            );
            LLVMOrcLLJITAddObjectFileWithRT(eng.jit, code.rt, buf)
        };
        if let Some(e) = take_error(err) {
            return Err(llvm("cannot add the object", e));
        }
    }
    let mut addrs = Vec::with_capacity(symbols.len());
    for s in symbols {
        let name = CString::new(s.as_str())
            .map_err(|_| llvm("lookup", format!("symbol `{s}` contains NUL")))?;
        let mut addr = 0u64;
        // SAFETY: a lookup in the live engine with a NUL-terminated name; it links the object
        // on first use.
        let err = unsafe { LLVMOrcLLJITLookup(eng.jit, &mut addr, name.as_ptr()) };
        if let Some(e) = take_error(err) {
            return Err(llvm(&format!("lookup of `{s}`"), e));
        }
        addrs.push(addr as usize);
    }
    Ok((code, addrs))
}

/// Routes LLVM's diagnostics about modules in `ctx` to the `log` crate instead of stderr, where
/// LLVM prints them by default: `warn` for warnings (a loop marked vectorized that LLVM could not
/// vectorize), `debug` for remarks and notes, `error` for errors (which also fail the call that
/// raised them).
pub(crate) fn route_diagnostics(ctx: &Context) {
    extern "C" fn handler(di: LLVMDiagnosticInfoRef, _: *mut c_void) {
        // SAFETY: LLVM passes a live diagnostic for the duration of the call; its description
        // is a NUL-terminated string we own and free once, after copying it.
        let (severity, message) = unsafe {
            let p = LLVMGetDiagInfoDescription(di);
            let message = CStr::from_ptr(p).to_string_lossy().into_owned();
            LLVMDisposeMessage(p);
            (LLVMGetDiagInfoSeverity(di), message)
        };
        // kiln's IR has no source locations.
        let message = message.strip_prefix("<unknown>:0:0: ").unwrap_or(&message);
        // A logger that panics must not unwind into LLVM.
        let _ = catch_unwind(|| match severity {
            LLVMDiagnosticSeverity::LLVMDSError => log::error!("LLVM: {message}"),
            LLVMDiagnosticSeverity::LLVMDSWarning => log::warn!("LLVM: {message}"),
            _ => log::debug!("LLVM: {message}"),
        });
    }
    // SAFETY: `ctx` is a live context; the handler is a plain function that keeps no state
    // (its context pointer is NULL) and outlives every context.
    unsafe {
        LLVMContextSetDiagnosticHandler(ctx.as_ctx_ref(), Some(handler), std::ptr::null_mut());
    }
}

/// Lowers the calling thread's scheduling priority (Linux: nice 10; elsewhere nothing), for
/// background compilation that must not slow the caller's threads.
pub(crate) fn lower_this_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        unsafe extern "C" {
            fn gettid() -> i32;
            fn setpriority(which: i32, who: u32, prio: i32) -> i32;
        }
        // SAFETY: glibc's `gettid` and `setpriority(PRIO_PROCESS = 0, tid, 10)`, which on Linux
        // sets the nice value of that one thread; a failure only leaves the priority as it was.
        unsafe {
            setpriority(0, gettid() as u32, 10);
        }
    }
}

/// Registers `f` to run at process exit (C `atexit`): after `main` returns or at
/// `std::process::exit`, before the static destructors of the libraries loaded before the call
/// (LLVM's), which were registered earlier.
pub(crate) fn at_exit(f: extern "C" fn()) {
    unsafe extern "C" {
        fn atexit(f: extern "C" fn()) -> i32;
    }
    // SAFETY: C's `atexit` with a function that lives as long as the process (kiln is never
    // unloaded: the JIT's code refers to it); a failure (no room) only leaves `f` unregistered.
    unsafe {
        atexit(f);
    }
}

/// An LLVM target machine that may move between threads.
struct PooledTm(TargetMachine);

// SAFETY: an LLVM TargetMachine has no thread affinity; the pool hands each one to a single
// build at a time, so it is never used concurrently.
unsafe impl Send for PooledTm {}

type TmKey = (String, String, String, u32);

/// Runs `f` with a target machine for `o` from the process's pool (created when none is free).
pub(crate) fn with_target_machine<T>(
    o: &CodegenOptions,
    f: impl FnOnce(&TargetMachine) -> T,
) -> R<T> {
    static POOL: OnceLock<Mutex<HashMap<TmKey, Vec<PooledTm>>>> = OnceLock::new();
    let pool = POOL.get_or_init(Default::default);
    let key = (
        o.triple.clone(),
        o.cpu.clone(),
        o.features.clone(),
        o.opt_level,
    );
    let taken = pool
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(&key)
        .and_then(Vec::pop);
    let tm = match taken {
        Some(tm) => tm,
        None => PooledTm(super::target_machine(o)?),
    };
    let out = f(&tm.0);
    pool.lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_default()
        .push(tm);
    Ok(out)
}

/// The argument checkers of a JIT module, compiled when a call first fails the fast checks.
pub(crate) struct LazyChecks {
    /// The module's IR, shared with its `LlvmModule`.
    module: Arc<IRModule>,
    opts: CodegenOptions,
    suffix: String,
    compiled: OnceLock<Result<(JitCode, Vec<usize>), String>>,
    /// The quick wrappers' decoders, by function index (`quick.rs`).
    quick: Vec<Option<QuickSig>>,
}

/// The decoder descriptions of `module`'s functions with a global symbol, in module order
/// (the checkers' indices), by the rule the code generator applies (`quick::describe`).
fn quick_sigs(module: &IRModule, opts: &CodegenOptions) -> Vec<Option<QuickSig>> {
    module
        .functions
        .iter()
        .filter(|f| f.attrs.global_symbol.is_some())
        .map(|f| super::quick::describe(f, opts.device_host, opts.device_type))
        .collect()
}

impl LazyChecks {
    pub(crate) fn new(module: Arc<IRModule>, opts: &CodegenOptions, suffix: &str) -> Self {
        LazyChecks {
            quick: quick_sigs(&module, opts),
            module,
            opts: opts.clone(),
            suffix: suffix.to_owned(),
            compiled: OnceLock::new(),
        }
    }

    /// The linkage of the module whose errors these checkers report, whose quick wrappers call
    /// through the table of compute functions at `calls` and whose entries jump through the
    /// table at `entries` (the quick tier's).
    pub(crate) fn linkage(&self, (calls, entries): (usize, usize)) -> Linkage {
        Linkage::Jit {
            slots: crate::packed_func::context::context_symbols(),
            check: (
                kiln_jit_check_args as *const () as usize,
                self as *const LazyChecks as usize,
            ),
            quick: kiln_jit_quick_decode as *const () as usize,
            calls,
            entries,
            optimized: false,
            suffix: self.suffix.clone(),
        }
    }

    fn compile(&self) -> Result<(JitCode, Vec<usize>), String> {
        if super::fault::hit(super::fault::Fault::CheckersCompile) {
            return Err("injected fault: compiling the checkers fails".into());
        }
        let linkage = Linkage::Checkers {
            slots: crate::packed_func::context::context_symbols(),
            suffix: self.suffix.clone(),
        };
        // The error path is cold: optimize it lightly.
        let mut o = self.opts.clone();
        o.opt_level = o.opt_level.min(1);
        let object = super::compile_object(
            &self.module,
            &o,
            &linkage,
            inkwell::targets::FileType::Object,
        )
        .map_err(|e| e.to_string())?;
        // By function index: the functions with a global symbol, in module order.
        let names: Vec<String> = self
            .module
            .functions
            .iter()
            .filter_map(|f| f.attrs.global_symbol.as_ref())
            .map(|s| format!("__kiln_check_{s}{}", self.suffix))
            .collect();
        load_objects(&[object], &names).map_err(|e| e.to_string())
    }

    fn check(&self, args: *const TVMFFIAny, num_args: i32, index: i32) -> i32 {
        match self.compiled.get_or_init(|| self.compile()) {
            Ok((_, addrs)) => match usize::try_from(index).ok().and_then(|i| addrs.get(i)) {
                Some(&addr) => {
                    // SAFETY: `addr` is a `__kiln_check_*` function of the checkers' object,
                    // which lives as long as `self`, with the safe-call signature; it reads
                    // `args` exactly as the fast wrapper that called us was given them.
                    unsafe {
                        let f = std::mem::transmute::<usize, TVMFFISafeCallType>(addr);
                        f(std::ptr::null_mut(), args, num_args, std::ptr::null_mut())
                    }
                }
                None => {
                    set_raised(
                        "InternalError",
                        &format!("kiln: no argument checker #{index} in this module"),
                    );
                    -1
                }
            },
            Err(e) => {
                set_raised(
                    "RuntimeError",
                    &format!(
                        "the arguments failed a check, and kiln could not compile the code that \
                         says which: {e}"
                    ),
                );
                -1
            }
        }
    }
}

/// The quick wrappers' argument decoder (`quick.rs`): `cx` is the module's [`LazyChecks`],
/// `index` the function, `slots` its wrapper's array of slots. Returns 1 when the arguments
/// pass (the slots written), 0 when the checker must look at them; with `trusted` non-zero
/// (the checker passed them), decodes without checks and returns 1.
extern "C" fn kiln_jit_quick_decode(
    cx: *const c_void,
    index: i32,
    args: *const TVMFFIAny,
    num_args: i32,
    slots: *mut u64,
    trusted: i32,
) -> i32 {
    // SAFETY: as in `kiln_jit_check_args`: `cx` is the calling module's own `LazyChecks`.
    let checks = unsafe { &*cx.cast::<LazyChecks>() };
    let Some(Some(sig)) = usize::try_from(index)
        .ok()
        .and_then(|i| checks.quick.get(i))
    else {
        // No description: the wrapper was not compiled to call here. Let the checker decide
        // (it raises or passes; a pass decodes nothing, so report a kiln bug then).
        return if trusted != 0 {
            set_raised(
                "InternalError",
                &format!("kiln: no quick decoder #{index} in this module"),
            );
            -1
        } else {
            0
        };
    };
    if trusted == 0 && super::fault::hit(super::fault::Fault::QuickDecodeRejects) {
        return 0;
    }
    // SAFETY: the wrapper passes its own `%args` and `%num_args` (the packed API's contract),
    // and an array of `sig.slots` slots: it was generated from the same description
    // (`packed::emit_quick`).
    let ok = catch_unwind(AssertUnwindSafe(|| unsafe {
        super::quick::decode(sig, args, num_args, slots, trusted != 0)
    }));
    match ok {
        Ok(true) => 1,
        Ok(false) => 0,
        Err(_) => {
            set_raised(
                "InternalError",
                "kiln: panic while decoding the arguments of a JIT function",
            );
            -1
        }
    }
}

/// The error path of JIT wrappers: `cx` is the module's [`LazyChecks`], `index` the function.
/// Returns 0 when the arguments pass every check after all, else raises and returns -1.
extern "C" fn kiln_jit_check_args(
    cx: *const c_void,
    args: *const TVMFFIAny,
    num_args: i32,
    index: i32,
) -> i32 {
    // SAFETY: the JIT module's code holds the address of its own `LazyChecks`, which its
    // `LlvmModule` owns (boxed, so it does not move) for as long as that code exists.
    let checks = unsafe { &*cx.cast::<LazyChecks>() };
    catch_unwind(AssertUnwindSafe(|| checks.check(args, num_args, index))).unwrap_or_else(|_| {
        set_raised(
            "InternalError",
            "kiln: panic while checking the arguments of a JIT function",
        );
        -1
    })
}
