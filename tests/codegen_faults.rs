//! The JIT's rare error paths, made to happen by `kiln::codegen::llvm::fault` (the test-only
//! `fault-injection` feature, which kiln's dev-dependency on itself turns on): the tier-up
//! worker's compilation failing or panicking, its thread not starting, a job scheduled while
//! the process exits, the argument checkers failing to compile, and the quick wrappers'
//! decoder handing every call to the checker. In every case the module
//! keeps working with its quick code, `wait_optimized` says why there is no optimized code, a
//! wrong call still raises a clear error, and nothing crashes.
//!
//! Faults are process-wide: the tests of this binary take a lock, and the ones that need a
//! fresh process (no worker thread yet, a real exit) run this binary again as a child.

mod common;

use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use common::{check_vadd, HostArray};
use kiln::codegen::llvm::fault::{self, Fault};
use kiln::codegen::llvm::{optimizing, wait_all_optimized, CodegenOptions, LlvmModule, Tiering};
use kiln::ir::{kernels, IRModule};
use kiln::packed_func::{AnyView, Module, PackedFunc};

/// Serializes the tests of this binary: an armed fault affects every JIT module.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn vadd(tiering: Tiering) -> LlvmModule {
    let m = IRModule::from_functions(vec![kernels::vadd()]);
    let o = CodegenOptions {
        opt_level: 3,
        ..CodegenOptions::host()
    };
    LlvmModule::jit_with(&m, &o, tiering).unwrap()
}

/// A call with one argument instead of three: its error message.
fn wrong_call(f: &PackedFunc) -> String {
    let mut ta = HostArray::f32(&[4], &[1.0; 4]);
    let da = ta.dl();
    f.call(&[AnyView::from(&da)]).unwrap_err().to_string()
}

/// The module runs its quick code, correctly, and raises TVM's errors for wrong calls.
fn keeps_working(m: &LlvmModule) {
    let f = m.require_function("vadd").unwrap();
    check_vadd(&f, 1003);
    check_vadd(&f, 1);
    let e = wrong_call(&f);
    assert!(e.starts_with("TypeError: Expected 3 arguments"), "{e}");
    assert!(!m.is_optimized());
}

/// After the fault is disarmed, tiering works again in this process: the optimized code
/// (its own wrapper, the quick one's checks) computes the same and raises the same errors.
fn tiering_recovers() {
    let m = vadd(Tiering::Background);
    let f = m.require_function("vadd").unwrap();
    let quick = wrong_call(&f);
    m.wait_optimized().unwrap();
    assert!(m.is_optimized());
    check_vadd(&f, 100);
    check_vadd(&f, 1);
    assert_eq!(wrong_call(&f), quick);
    assert!(
        quick.starts_with("TypeError: Expected 3 arguments"),
        "{quick}"
    );
}

#[test]
fn a_failing_background_compilation_leaves_the_quick_code_and_says_why() {
    let _serial = serial();
    let armed = fault::arm(Fault::TierUpCompile);
    let m = vadd(Tiering::Background);
    keeps_working(&m);
    let e = m.wait_optimized().unwrap_err().to_string();
    assert!(
        e.contains("optimizing the module's code failed, it keeps running its quick code")
            && e.contains("injected fault: the optimizing compilation fails"),
        "{e}"
    );
    // Asking again gives the same answer; the module still runs; nobody waits forever.
    assert_eq!(m.wait_optimized().unwrap_err().to_string(), e);
    wait_all_optimized();
    assert!(!optimizing());
    keeps_working(&m);
    drop(armed);
    tiering_recovers();
    keeps_working(&m);
}

#[test]
fn a_panicking_background_compilation_is_caught_and_the_worker_goes_on() {
    let _serial = serial();
    let armed = fault::arm(Fault::TierUpPanic);
    let m = vadd(Tiering::Background);
    keeps_working(&m);
    let e = m.wait_optimized().unwrap_err().to_string();
    assert!(
        e.contains("kiln bug: a panic while optimizing a JIT module"),
        "{e}"
    );
    keeps_working(&m);
    drop(armed);
    // The worker thread survived the panic: the next module is optimized.
    tiering_recovers();
}

#[test]
fn a_job_scheduled_while_the_process_exits_leaves_the_quick_code() {
    let _serial = serial();
    let armed = fault::arm(Fault::ProcessExiting);
    let m = vadd(Tiering::Background);
    keeps_working(&m);
    let e = m.wait_optimized().unwrap_err().to_string();
    assert!(e.contains("the process is exiting"), "{e}");
    wait_all_optimized();
    drop(armed);
    tiering_recovers();
    keeps_working(&m);
}

#[test]
fn a_wrong_call_raises_a_clear_error_when_the_checkers_do_not_compile() {
    let _serial = serial();
    for tiering in [Tiering::Background, Tiering::Off, Tiering::QuickOnly] {
        let armed = fault::arm(Fault::CheckersCompile);
        let m = vadd(tiering);
        let f = m.require_function("vadd").unwrap();
        check_vadd(&f, 17);
        for _ in 0..2 {
            // The second wrong call gets the same answer (the failure is remembered).
            let e = wrong_call(&f);
            assert!(
                e.starts_with("RuntimeError: the arguments failed a check, and kiln could not compile the code that says which: injected fault"),
                "{tiering:?}: {e}"
            );
        }
        // Right calls are not affected: the fast checks pass without the checkers.
        check_vadd(&f, 17);
        drop(armed);
        if tiering == Tiering::Background {
            m.wait_optimized().unwrap();
            check_vadd(&f, 5);
        }
        // A module whose checkers compile gives TVM's message again.
        let e = wrong_call(&vadd(tiering).require_function("vadd").unwrap());
        assert!(e.starts_with("TypeError: Expected 3 arguments"), "{e}");
    }
}

/// Runs the test `name` of this binary in a child process with `KILN_FAULT_CHILD` set; returns
/// its stdout and stderr.
fn in_child(name: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("KILN_FAULT_CHILD", name)
        .env("KILN_CACHE", "off")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {name} failed:\n{text}");
    text
}

fn is_child(name: &str) -> bool {
    std::env::var("KILN_FAULT_CHILD").as_deref() == Ok(name)
}

#[test]
fn without_a_worker_thread_modules_keep_their_quick_code() {
    const NAME: &str = "without_a_worker_thread_modules_keep_their_quick_code";
    if !is_child(NAME) {
        let out = in_child(NAME);
        assert!(out.contains("child: no worker, ok"), "{out}");
        return;
    }
    // A fresh process: the worker starts with the first tiered module, and cannot.
    let _armed = fault::arm(Fault::WorkerSpawn);
    let m = vadd(Tiering::Background);
    keeps_working(&m);
    let e = m.wait_optimized().unwrap_err().to_string();
    assert!(
        e.contains("the background compilation thread could not start"),
        "{e}"
    );
    // Nothing is queued, so nothing to wait for; later modules get the same answer.
    assert!(!optimizing());
    wait_all_optimized();
    let m2 = vadd(Tiering::Background);
    keeps_working(&m2);
    assert!(m2.wait_optimized().is_err());
    // Modules compiled at full level up front need no worker.
    let full = vadd(Tiering::Off);
    full.wait_optimized().unwrap();
    assert!(full.is_optimized());
    check_vadd(&full.require_function("vadd").unwrap(), 64);
    println!("child: no worker, ok");
}

extern "C" fn compile_and_run_during_exit() {
    // Runs after kiln's own exit handler (registered later, run earlier) has stopped the
    // worker: a module built now gets its quick code only. No panic may cross this frame.
    let r = std::panic::catch_unwind(|| {
        let m = vadd(Tiering::Background);
        let f = m.require_function("vadd").unwrap();
        check_vadd(&f, 33);
        let e = m.wait_optimized().unwrap_err().to_string();
        assert!(e.contains("the process is exiting"), "{e}");
        check_vadd(&f, 33);
    });
    match r {
        Ok(()) => eprintln!("child: built during exit, ok"),
        Err(_) => eprintln!("child: building during exit failed"),
    }
}

#[test]
fn a_module_built_while_the_process_exits_runs_its_quick_code() {
    const NAME: &str = "a_module_built_while_the_process_exits_runs_its_quick_code";
    if !is_child(NAME) {
        let out = in_child(NAME);
        assert!(out.contains("child: built during exit, ok"), "{out}");
        return;
    }
    extern "C" {
        fn atexit(f: extern "C" fn()) -> i32;
    }
    // Registered before the worker starts (and registers its own handler): runs after it.
    // SAFETY: `atexit` with a function that never unwinds.
    assert_eq!(unsafe { atexit(compile_and_run_during_exit) }, 0);
    let m = vadd(Tiering::Background);
    m.wait_optimized().unwrap();
    check_vadd(&m.require_function("vadd").unwrap(), 8);
}

/// Every call refused by the quick wrappers' decoder goes to the checker, which raises the
/// precise error or, finding none, has the arguments decoded again without checks: the same
/// results and errors as the decoder's own fast path.
#[test]
fn calls_the_quick_decoder_refuses_are_checked_and_decoded_again() {
    let _serial = serial();
    let fast = vadd(Tiering::QuickOnly);
    let f = fast.require_function("vadd").unwrap();
    let expected = wrong_call(&f);
    let armed = fault::arm(Fault::QuickDecodeRejects);
    let before = fault::hits(Fault::QuickDecodeRejects);
    for m in [fast, vadd(Tiering::QuickOnly)] {
        let f = m.require_function("vadd").unwrap();
        check_vadd(&f, 1003);
        check_vadd(&f, 1);
        check_vadd(&f, 0);
        assert_eq!(wrong_call(&f), expected);
        // A shape that disagrees: the checker's message.
        let (mut ta, mut tb, mut tc) = (
            HostArray::f32(&[4], &[1.0; 4]),
            HostArray::f32(&[5], &[1.0; 5]),
            HostArray::f32(&[4], &[0.0; 4]),
        );
        let (da, db, dc) = (ta.dl(), tb.dl(), tc.dl());
        let e = f
            .call(&[AnyView::from(&da), AnyView::from(&db), AnyView::from(&dc)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("Mismatched B.shape[0]"), "{e}");
        assert_eq!(tc.to_f32(), vec![0.0; 4], "nothing written on an error");
    }
    // Five calls on each module, each refused by the decoder.
    assert_eq!(fault::hits(Fault::QuickDecodeRejects) - before, 10);
    drop(armed);
}
