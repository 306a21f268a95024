//! Tiered JIT compilation: a JIT module is callable after a quick compilation, and code
//! optimized at the options' level replaces the quick code moments later, compiled on a
//! background thread.
//!
//! Why: for a one-function module, LLVM's O3 pipeline and its O3 code generator are most of a
//! cold build (about 4 ms of 4.3 for a vector add; 15-20 ms for a parallel matmul), while a
//! short function pipeline that still hoists invariants and vectorizes ([`Passes::Quick`]) and
//! the code generator at its lowest level (FastISel, with the optimized register allocator:
//! `init_llvm`) take about 1.5 ms. The quick code runs the benchmark kernels at 0.93-1.15x the
//! O3 code's time (`cargo bench --bench codegen`); it runs for the few milliseconds the
//! background compilation takes.
//!
//! How:
//! - Every exported JIT function is a stub that jumps (a tail call) through a slot of its
//!   module's table of entries ([`Tiers`]) to the function's implementation: an acquire load
//!   and an indirect jump, about a nanosecond.
//! - [`super::LlvmModule::jit`] compiles the stubs and the quick wrappers (no passes, lowest
//!   code generation level; a quick wrapper calls its compute function through a slot of a
//!   second table) and the compute functions (quick), fills both tables and queues a [`Job`].
//! - One process-wide worker thread (`kiln-tier-up`, at a lower scheduling priority) takes the
//!   jobs in order. It generates the module again under a new symbol suffix as optimized
//!   implementations (each one function: the checks, as an exported library's wrapper makes
//!   them, with the compute function inlined), compiles it at the options' level, links it
//!   into the JIT and, if the module is still alive, stores the new addresses into the table of
//!   entries (release) and keeps the new code with the module. A call then costs what an
//!   exported library's call costs: the quick wrapper (unoptimized, its compute function
//!   called through a table) took 10-20 ns more per call on a Zen 3. The quick code stays
//!   until the module is dropped: a call that loaded its address may still be running it.
//! - A job whose module was dropped is skipped before compiling, or its code discarded after.
//! - Results are the same in both tiers: the same IR, and LLVM reassociates floating-point
//!   arithmetic only under the fast-math flags a target opts into.
//! - At process exit, a handler stops the worker from starting another job and waits (at most
//!   two seconds) for the job in flight, so that LLVM's static destructors never run under it.
//!
//! Control: tiering applies when the options' `opt_level` is 2 or more; `KILN_JIT_TIERS=1`
//! (or [`Tiering::Off`]) compiles the stubs and the optimized implementations once, before
//! `jit` returns.
//! [`super::LlvmModule::wait_optimized`] and [`wait_all_optimized`] wait for the optimized code,
//! e.g. before timing a kernel.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use inkwell::targets::FileType;

use super::fault::{self, Fault};
use super::jit::{self, JitCode};
use super::{CodegenError, CodegenOptions, Linkage, Passes, R};
use crate::ir::IRModule;

/// Whether a JIT module's code is compiled in two tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tiering {
    /// Quick code first; code optimized at the options' level replaces it once a background
    /// thread has compiled it (when `opt_level` is 2 or more).
    Background,
    /// Code optimized at the options' level, compiled before `jit` returns.
    Off,
    /// The quick code only, never replaced (when `opt_level` is 2 or more): for kernels that
    /// run once, and for testing the quick tier.
    QuickOnly,
}

impl Tiering {
    /// [`Tiering::Off`] when the environment variable `KILN_JIT_TIERS` is `1` (or `off`),
    /// else [`Tiering::Background`].
    pub fn from_env() -> Self {
        match std::env::var("KILN_JIT_TIERS").as_deref() {
            Ok("1") | Ok("off") => Tiering::Off,
            _ => Tiering::Background,
        }
    }

    /// Whether a module compiled with `o` starts with quick code.
    pub(crate) fn quick_first(self, o: &CodegenOptions) -> bool {
        self != Tiering::Off && o.opt_level >= 2
    }
}

/// Where a module's optimized code stands.
enum State {
    /// Compiled once, at full level: nothing to wait for.
    Final,
    /// Quick code for good ([`Tiering::QuickOnly`]).
    QuickOnly,
    /// Queued or compiling.
    Pending,
    /// Installed; the code lives as long as the module.
    Optimized { _code: JitCode },
    /// The optimized compilation failed; the module keeps its quick code.
    Failed(String),
}

/// A JIT module's tables of code addresses and its optimized code.
pub(crate) struct Tiers {
    /// The compute function each quick wrapper calls, by function index (functions with a
    /// global symbol, in module order). Its heap address is compiled into the quick wrappers.
    calls: Box<[AtomicUsize]>,
    /// The implementation each exported entry stub jumps to, by function index: the quick
    /// wrapper, then the optimized one. Its heap address is compiled into the stubs.
    entries: Box<[AtomicUsize]>,
    state: Mutex<State>,
    changed: Condvar,
}

impl Tiers {
    /// A table of `n` empty slots for a module compiled with `o` and `tiering`.
    pub(crate) fn new(n: usize, tiering: Tiering, o: &CodegenOptions) -> Self {
        let state = match tiering {
            _ if !tiering.quick_first(o) => State::Final,
            Tiering::QuickOnly => State::QuickOnly,
            _ => State::Pending,
        };
        Tiers {
            calls: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            entries: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            state: Mutex::new(state),
            changed: Condvar::new(),
        }
    }

    /// Whether optimized code is to be compiled in the background.
    pub(crate) fn pending(&self) -> bool {
        matches!(*self.lock(), State::Pending)
    }

    /// The addresses of the tables of compute functions and of entries, for the code that
    /// jumps through them.
    pub(crate) fn tables(&self) -> (usize, usize) {
        (self.calls.as_ptr() as usize, self.entries.as_ptr() as usize)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::util::lock(&self.state)
    }

    /// The implementation the entry of function `i` jumps to.
    #[cfg(test)]
    pub(crate) fn entry(&self, i: usize) -> usize {
        self.entries[i].load(Ordering::Acquire)
    }

    /// Points the quick wrappers at the compute functions `addrs` (one per slot).
    pub(crate) fn point_calls(&self, addrs: &[usize]) {
        for (slot, &a) in self.calls.iter().zip(addrs) {
            slot.store(a, Ordering::Release);
        }
    }

    /// Points the entries at the implementations `addrs` (one per slot).
    pub(crate) fn point_entries(&self, addrs: &[usize]) {
        for (slot, &a) in self.entries.iter().zip(addrs) {
            slot.store(a, Ordering::Release);
        }
    }

    /// Installs the optimized code (or records why there is none) and wakes the waiters.
    fn install(&self, result: R<(JitCode, Vec<usize>)>) {
        let mut state = self.lock();
        *state = match result {
            Ok((code, addrs)) if addrs.len() == self.entries.len() => {
                self.point_entries(&addrs);
                State::Optimized { _code: code }
            }
            Ok((_, addrs)) => State::Failed(format!(
                "kiln bug: {} optimized implementations for {} slots",
                addrs.len(),
                self.entries.len()
            )),
            Err(e) => State::Failed(e.to_string()),
        };
        self.changed.notify_all();
    }

    /// Blocks until the optimized code is installed (at once when there is none to wait for).
    pub(crate) fn wait(&self) -> R<()> {
        let mut state = self.lock();
        while matches!(*state, State::Pending) {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        match &*state {
            State::Failed(e) => Err(CodegenError::Llvm(format!(
                "optimizing the module's code failed, it keeps running its quick code: {e}"
            ))),
            State::QuickOnly => Err(CodegenError::Unsupported(
                "the module was compiled with Tiering::QuickOnly: no optimized code follows".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Whether the module runs code optimized at its options' level.
    pub(crate) fn is_optimized(&self) -> bool {
        matches!(*self.lock(), State::Final | State::Optimized { .. })
    }
}

/// A module to compile again at full level.
pub(crate) struct Job {
    /// The module's tiers; gone when the module was dropped.
    pub(crate) tiers: Weak<Tiers>,
    pub(crate) ir: Arc<IRModule>,
    pub(crate) opts: CodegenOptions,
    /// The module's linkage for the optimized tier, with a suffix of its own.
    pub(crate) linkage: Linkage,
}

impl Job {
    fn compile(&self) -> R<(JitCode, Vec<usize>)> {
        if fault::hit(Fault::TierUpPanic) {
            panic!("injected fault: the optimizing compilation panics");
        }
        if fault::hit(Fault::TierUpCompile) {
            return Err(CodegenError::Llvm(
                "injected fault: the optimizing compilation fails".into(),
            ));
        }
        // The second module holds the implementations; the first, the entry stubs, is the
        // quick tier's.
        let [_, code] = super::generate::<2>(&self.ir, &self.opts, &self.linkage)?;
        let object = super::compile_text(&code, &self.opts, Passes::Default, FileType::Object)?;
        let symbols = super::impl_symbols(&self.ir, self.linkage.suffix());
        jit::load_objects(&[object], &symbols)
    }

    fn run(self) {
        if self.tiers.strong_count() == 0 {
            return;
        }
        let result = catch_unwind(AssertUnwindSafe(|| self.compile())).unwrap_or_else(|_| {
            Err(CodegenError::Llvm(
                "kiln bug: a panic while optimizing a JIT module".into(),
            ))
        });
        // When the module is gone, its optimized code goes with `result`.
        if let Some(tiers) = self.tiers.upgrade() {
            tiers.install(result);
        }
    }
}

/// The worker's queue.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// A job is compiling.
    busy: bool,
    /// The process is exiting: start nothing more.
    exiting: bool,
}

struct Worker {
    queue: Mutex<Queue>,
    /// Signals a new job, a finished job, or exit.
    changed: Condvar,
    /// Whether the worker thread started.
    started: bool,
}

impl Worker {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        crate::util::lock(&self.queue)
    }

    fn serve(&self) {
        loop {
            let job = {
                let mut q = self.lock();
                loop {
                    if q.exiting {
                        return;
                    }
                    if let Some(job) = q.jobs.pop_front() {
                        q.busy = true;
                        break job;
                    }
                    q = self.changed.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            job.run();
            self.lock().busy = false;
            self.changed.notify_all();
        }
    }
}

static WORKER: OnceLock<Worker> = OnceLock::new();

/// The worker, started on first use.
fn worker() -> &'static Worker {
    WORKER.get_or_init(|| {
        let started = !fault::hit(Fault::WorkerSpawn)
            && std::thread::Builder::new()
                .name("kiln-tier-up".into())
                .spawn(|| {
                    // Best effort: the caller's threads come first.
                    jit::lower_this_thread_priority();
                    worker().serve()
                })
                .is_ok();
        if started {
            jit::at_exit(stop_at_exit);
        }
        Worker {
            queue: Mutex::default(),
            changed: Condvar::new(),
            started,
        }
    })
}

/// Runs at process exit, before LLVM's static destructors (registered earlier, run later).
extern "C" fn stop_at_exit() {
    let _ = catch_unwind(|| {
        let w = worker();
        let mut q = w.lock();
        q.exiting = true;
        w.changed.notify_all();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while q.busy {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            q = w
                .changed
                .wait_timeout(q, left)
                .map_or_else(|e| e.into_inner().0, |r| r.0);
        }
    });
}

/// Queues `job` for the worker. When no worker thread could start, the module keeps its quick
/// code and [`Tiers::wait`] says why.
pub(crate) fn schedule(job: Job) {
    let w = worker();
    if !w.started {
        if let Some(tiers) = job.tiers.upgrade() {
            tiers.install(Err(CodegenError::Llvm(
                "the background compilation thread could not start".into(),
            )));
        }
        return;
    }
    let mut q = w.lock();
    if q.exiting || fault::hit(Fault::ProcessExiting) {
        drop(q);
        if let Some(tiers) = job.tiers.upgrade() {
            tiers.install(Err(CodegenError::Llvm("the process is exiting".into())));
        }
        return;
    }
    q.jobs.push_back(job);
    drop(q);
    w.changed.notify_all();
}

/// Whether JIT modules are queued for optimization or being optimized (a non-blocking
/// [`wait_all_optimized`]).
pub fn optimizing() -> bool {
    WORKER.get().is_some_and(|w| {
        let q = w.lock();
        (!q.jobs.is_empty() || q.busy) && !q.exiting
    })
}

/// Blocks until every JIT module queued for optimization so far runs its optimized code (or
/// was dropped, or failed to optimize). Useful before timing kernels.
pub fn wait_all_optimized() {
    let Some(w) = WORKER.get() else {
        return;
    };
    let mut q = w.lock();
    while (!q.jobs.is_empty() || q.busy) && !q.exiting {
        q = w.changed.wait(q).unwrap_or_else(|e| e.into_inner());
    }
}
