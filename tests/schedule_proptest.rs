//! Random schedules: sequences of primitives with random loops and factors (splits that do or
//! do not divide, range partitions, reorders, fissions, fuses, loop kinds, `cache_write`)
//! applied to small matmuls and a row sum. Each step either applies or fails with a
//! `ScheduleError` (never a panic), and a failed step leaves the schedule as it was: whatever
//! applied, the finished function verifies and computes what the plain function computes, in
//! the interpreter, and in the JIT when no step asked for `parallel` or `vectorized` (which
//! are the caller's promise of independent iterations, and a random loop may be a reduction).

mod common;

use common::{interp_last, jit_last};
use kiln::codegen::llvm::CodegenOptions;
use kiln::ir::{kernels, PrimFunc};
use kiln::schedule::{Schedule, Step};
use proptest::prelude::*;

/// The loops of `f`, outermost first, by name (from the printed form `for <name>: ...`).
fn loop_names(f: &PrimFunc) -> Vec<String> {
    f.to_string()
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix("for ")?;
            Some(rest.split(':').next()?.to_owned())
        })
        .collect()
}

/// One random step, its loops picked by index among the current loops.
#[derive(Clone, Debug)]
enum Pick {
    Split(usize, i64),
    Partition(usize, i64),
    Reorder(usize, usize),
    Fission(usize),
    Fuse(usize, usize),
    Kind(usize, u8),
    CacheWrite(usize),
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        (0..16usize, 1..9i64).prop_map(|(l, f)| Pick::Split(l, f)),
        (0..16usize, -1..12i64).prop_map(|(l, a)| Pick::Partition(l, a)),
        (0..16usize, 0..16usize).prop_map(|(a, b)| Pick::Reorder(a, b)),
        (0..16usize).prop_map(Pick::Fission),
        (0..16usize, 0..16usize).prop_map(|(a, b)| Pick::Fuse(a, b)),
        (0..16usize, 0..4u8).prop_map(|(l, k)| Pick::Kind(l, k)),
        (0..16usize).prop_map(Pick::CacheWrite),
    ]
}

fn step(p: &Pick, loops: &[String], output: &str) -> Option<Step> {
    let at = |i: usize| loops.get(i % loops.len().max(1)).cloned();
    Some(match *p {
        Pick::Split(l, factor) => Step::Split {
            loop_: at(l)?,
            factor,
        },
        Pick::Partition(l, a) => Step::Partition {
            loop_: at(l)?,
            at: a,
        },
        Pick::Reorder(a, b) => Step::Reorder {
            loops: vec![at(a)?, at(b)?],
        },
        Pick::Fission(l) => Step::Fission { loop_: at(l)? },
        Pick::Fuse(a, b) => Step::Fuse {
            outer: at(a)?,
            inner: at(b)?,
        },
        Pick::Kind(l, k) => Step::Kind {
            loop_: at(l)?,
            kind: ["serial", "unrolled", "parallel", "vectorized"][k as usize % 4].to_owned(),
        },
        Pick::CacheWrite(l) => Step::CacheWrite {
            buffer: output.to_owned(),
            at: at(l)?,
        },
    })
}

fn close(what: &str, got: &[f32], want: &[f32]) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        // Splits and reorders may change the order of a sum: a relative tolerance.
        prop_assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "{}: element {} is {} where {} was expected",
            what,
            i,
            g,
            w
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_schedules_keep_the_results_or_fail_cleanly(
        which in 0..2u8,
        m in 1..14i64,
        n in 1..10i64,
        k in 1..7i64,
        picks in prop::collection::vec(pick(), 1..8),
    ) {
        let (plain, shapes, output) = if which == 0 {
            (kernels::matmul_sized(m, n, k), vec![vec![m, k], vec![k, n], vec![m, n]], "C")
        } else {
            (kernels::rowsum_sized(m, n), vec![vec![m, n], vec![m]], "B")
        };
        let mut s = Schedule::new(plain.clone());
        let mut independent_only = true;
        let mut applied = Vec::new();
        for p in &picks {
            let Some(st) = step(p, &loop_names(s.func()), output) else { continue };
            let before = s.func().clone();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                s.apply(std::slice::from_ref(&st))
            }));
            let Ok(r) = r else {
                return Err(TestCaseError::fail(format!("{st:?} panicked after {applied:?}")));
            };
            match r {
                Ok(()) => {
                    if let Step::Kind { kind, .. } = &st {
                        independent_only &= kind != "parallel" && kind != "vectorized";
                    }
                    applied.push(st);
                }
                Err(e) => {
                    // A clear error, and nothing changed.
                    prop_assert!(!e.to_string().is_empty());
                    prop_assert_eq!(s.func().to_string(), before.to_string(), "{:?} failed ({}) but changed the function", st, e);
                }
            }
        }
        let f = match s.finish() {
            Ok(f) => f,
            Err(e) => return Err(TestCaseError::fail(format!("{applied:?} gave a function that does not verify: {e}"))),
        };
        let want = interp_last(&plain, &shapes);
        close(&format!("interpreter after {applied:?}"), &interp_last(&f, &shapes), &want)?;
        if independent_only {
            close(&format!("JIT after {applied:?}"), &jit_last(&f, &shapes, &CodegenOptions::host()), &want)?;
        }
    }
}
