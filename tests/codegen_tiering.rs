//! The tiered JIT: quick code first, optimized code swapped in by a background thread. Results
//! are the same in both tiers, calls racing the swap stay correct, argument errors are raised
//! in both tiers, and modules dropped before their optimized code arrives are harmless.

mod common;

use common::{check_vadd, HostArray};
use kiln::codegen::llvm::{optimizing, wait_all_optimized, CodegenOptions, LlvmModule, Tiering};
use kiln::ir::{kernels, IRModule, PrimFunc};
use kiln::packed_func::{AnyView, Module, PackedFunc};

/// The background tier is one queue per process, and `optimizing()` / `wait_all_optimized()`
/// speak of all of it: the tests of this file run one at a time, so that one test's jobs are
/// never still queued while another asserts that nothing is (a race seen on a loaded machine).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn jit(f: PrimFunc, tiering: Tiering, opt_level: u32) -> LlvmModule {
    let m = IRModule::from_functions(vec![f]);
    m.verify().unwrap();
    let o = CodegenOptions {
        opt_level,
        ..CodegenOptions::host()
    };
    LlvmModule::jit_with(&m, &o, tiering).unwrap()
}

/// Runs matmul 19x23x11 and returns the output.
fn run_matmul(f: &PackedFunc) -> Vec<f32> {
    let (m, n, k) = (19i64, 23i64, 11i64);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
    let (mut ta, mut tb, mut tc) = (
        HostArray::f32(&[m, k], &a),
        HostArray::f32(&[k, n], &b),
        HostArray::f32(&[m, n], &vec![0.0; (m * n) as usize]),
    );
    let (da, db, dc) = (ta.dl(), tb.dl(), tc.dl());
    f.call(&[AnyView::from(&da), AnyView::from(&db), AnyView::from(&dc)])
        .unwrap();
    tc.to_f32()
}

#[test]
fn optimized_code_replaces_quick_code_and_results_do_not_change() {
    let _serial = serial();
    let m = jit(kernels::vadd(), Tiering::Background, 3);
    let f = m.require_function("vadd").unwrap();
    check_vadd(&f, 1003);
    m.wait_optimized().unwrap();
    assert!(m.is_optimized());
    check_vadd(&f, 1003);
    check_vadd(&f, 1);

    let mm = kernels::matmul_sized(19, 23, 11);
    let m = jit(mm.clone(), Tiering::Background, 3);
    let f = m.require_function(&mm.name).unwrap();
    let quick = run_matmul(&f);
    m.wait_optimized().unwrap();
    assert_eq!(run_matmul(&f), quick);
    let reference = jit(mm.clone(), Tiering::Off, 0);
    assert_eq!(
        run_matmul(&reference.require_function(&mm.name).unwrap()),
        quick
    );
}

#[test]
fn only_high_opt_levels_start_with_quick_code() {
    let _serial = serial();
    // Compiled once, optimized before `jit` returns.
    for (tiering, level) in [
        (Tiering::Off, 3),
        (Tiering::Background, 1),
        (Tiering::Background, 0),
    ] {
        let m = jit(kernels::vadd(), tiering, level);
        assert!(m.is_optimized(), "{tiering:?} at O{level}");
        m.wait_optimized().unwrap();
        check_vadd(&m.require_function("vadd").unwrap(), 77);
    }
    // Quick code for good: waiting for optimized code says there is none.
    let m = jit(kernels::vadd(), Tiering::QuickOnly, 3);
    check_vadd(&m.require_function("vadd").unwrap(), 77);
    assert!(!m.is_optimized());
    let e = m.wait_optimized().unwrap_err().to_string();
    assert!(e.contains("QuickOnly"), "{e}");
    // At O1, QuickOnly has nothing quicker to offer: the module is compiled at O1.
    assert!(jit(kernels::vadd(), Tiering::QuickOnly, 1).is_optimized());
}

#[test]
fn calls_racing_the_swap_stay_correct() {
    let _serial = serial();
    for _ in 0..3 {
        let m = jit(kernels::vadd(), Tiering::Background, 3);
        let f = m.require_function("vadd").unwrap();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let start = std::time::Instant::now();
                    let mut after = 0;
                    // Until some calls have run the optimized code.
                    while after < 20 {
                        if m.is_optimized() {
                            after += 1;
                        }
                        check_vadd(&f, 515);
                        assert!(
                            start.elapsed().as_secs() < 120,
                            "no optimized code after 2 minutes"
                        );
                    }
                });
            }
        });
    }
}

#[test]
fn argument_errors_are_raised_in_both_tiers() {
    let _serial = serial();
    let m = jit(kernels::vadd(), Tiering::Background, 3);
    let f = m.require_function("vadd").unwrap();
    let wrong = |f: &PackedFunc| {
        let mut ta = HostArray::f32(&[4], &[1.0; 4]);
        let da = ta.dl();
        let e = f.call(&[AnyView::from(&da)]).unwrap_err().to_string();
        assert!(e.starts_with("TypeError: Expected 3 arguments"), "{e}");
    };
    wrong(&f);
    m.wait_optimized().unwrap();
    wrong(&f);
    check_vadd(&f, 4);
}

#[test]
fn modules_dropped_before_their_optimized_code_are_harmless() {
    let _serial = serial();
    // Dropped at once: the job is skipped, or its code discarded.
    for _ in 0..10 {
        drop(jit(kernels::vadd(), Tiering::Background, 3));
    }
    // A function outlives its module, and still gets the optimized code.
    let f = {
        let m = jit(kernels::vadd(), Tiering::Background, 3);
        m.require_function("vadd").unwrap()
    };
    check_vadd(&f, 100);
    wait_all_optimized();
    assert!(!optimizing());
    check_vadd(&f, 100);
    // Later modules are unaffected.
    let m = jit(kernels::vadd(), Tiering::Background, 3);
    m.wait_optimized().unwrap();
    check_vadd(&m.require_function("vadd").unwrap(), 100);
}
