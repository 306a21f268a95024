//! Fault injection for the JIT's error paths that a healthy machine never takes (cargo feature
//! `fault-injection`, off by default; kiln's own tests turn it on through a dev-dependency on
//! the crate itself). Without the feature this module is private, and `hit` is a constant
//! `false` that the compiler removes with the branches it guards.
//!
//! A fault is armed for the whole process until disarmed: tests that arm one must not run
//! concurrently with other JIT work of the same process ([`arm`] returns a guard that disarms
//! on drop).

#[cfg(feature = "fault-injection")]
use std::sync::atomic::{AtomicU32, Ordering};

/// A failure kiln can be told to have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The tier-up worker's compilation of optimized code returns an error.
    TierUpCompile,
    /// The tier-up worker's compilation of optimized code panics.
    TierUpPanic,
    /// The tier-up worker thread cannot be started. Only the first JIT module of a process
    /// starts it: arm this before any tiered JIT compilation in the process.
    WorkerSpawn,
    /// A job is scheduled as if the process were exiting (the worker takes no more jobs).
    ProcessExiting,
    /// Compiling a JIT module's argument checkers (on its first wrong call) fails.
    CheckersCompile,
    /// The quick wrappers' argument decoder (`quick.rs`) rejects every call, so that each goes
    /// through the checker and is decoded again in trusted mode.
    QuickDecodeRejects,
}

impl Fault {
    #[cfg(feature = "fault-injection")]
    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

#[cfg(feature = "fault-injection")]
static ARMED: AtomicU32 = AtomicU32::new(0);

/// Disarms its fault when dropped.
#[cfg(feature = "fault-injection")]
#[must_use = "the fault is disarmed when the guard is dropped"]
#[derive(Debug)]
pub struct Armed(Fault);

#[cfg(feature = "fault-injection")]
impl Drop for Armed {
    fn drop(&mut self) {
        disarm(self.0);
    }
}

/// Arms `fault` until the returned guard is dropped.
#[cfg(feature = "fault-injection")]
pub fn arm(fault: Fault) -> Armed {
    ARMED.fetch_or(fault.bit(), Ordering::SeqCst);
    Armed(fault)
}

/// Disarms `fault`.
#[cfg(feature = "fault-injection")]
pub fn disarm(fault: Fault) {
    ARMED.fetch_and(!fault.bit(), Ordering::SeqCst);
}

/// How many times each fault was hit.
#[cfg(feature = "fault-injection")]
static HITS: [AtomicU32; 32] = [const { AtomicU32::new(0) }; 32];

/// Whether `fault` is armed: where kiln asks, it then fails as it would for real.
#[cfg(feature = "fault-injection")]
pub fn hit(fault: Fault) -> bool {
    let armed = ARMED.load(Ordering::SeqCst) & fault.bit() != 0;
    if armed {
        HITS[fault as usize].fetch_add(1, Ordering::SeqCst);
    }
    armed
}

/// How many times `fault` has been hit in this process (a test's proof that the path it
/// means to cover was taken).
#[cfg(feature = "fault-injection")]
pub fn hits(fault: Fault) -> u32 {
    HITS[fault as usize].load(Ordering::SeqCst)
}

/// Whether `fault` is armed: never, without the `fault-injection` feature.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn hit(_fault: Fault) -> bool {
    false
}
