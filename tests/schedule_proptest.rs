//! Random schedules: sequences of primitives with random loops and factors (splits that do or
//! do not divide, range partitions, reorders, fissions, fuses, loop kinds, `cache_write`,
//! `cache_read`, its panels along either dimension, transposed)
//! applied to small matmuls, a row sum and a softmax. Each step either applies or fails with a
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
    CacheRead(usize, i64),
    /// A transposed `cache_read`: the dimension made innermost (3: none of the buffer's two).
    CacheReadTransposed(usize, usize),
    /// `cache_read_panels_of`: panels of a width (0 or less: refused) along a dimension (2:
    /// none of the buffer's two).
    CacheReadPanelsOf(usize, i64, usize),
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
        (0..16usize, -1..5i64).prop_map(|(l, w)| Pick::CacheRead(l, w)),
        (0..16usize, 0..3usize).prop_map(|(l, d)| Pick::CacheReadTransposed(l, d)),
        (0..16usize, -1..5i64, 0..3usize).prop_map(|(l, w, d)| Pick::CacheReadPanelsOf(l, w, d)),
    ]
}

fn step(p: &Pick, loops: &[String], (input, output): (&str, &str)) -> Option<Step> {
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
        Pick::CacheRead(l, w) => Step::CacheRead {
            buffer: input.to_owned(),
            at: at(l)?,
            panel: (w > 0).then_some(w),
            innermost: None,
        },
        Pick::CacheReadTransposed(l, d) => Step::CacheRead {
            buffer: input.to_owned(),
            at: at(l)?,
            panel: None,
            innermost: Some(d),
        },
        Pick::CacheReadPanelsOf(l, w, d) => Step::CacheRead {
            buffer: input.to_owned(),
            at: at(l)?,
            panel: Some(w),
            innermost: Some(d),
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
        which in 0..3u8,
        m in 1..14i64,
        n in 1..10i64,
        k in 1..7i64,
        picks in prop::collection::vec(pick(), 1..8),
    ) {
        let (plain, shapes, buffers) = match which {
            0 => (kernels::matmul_sized(m, n, k), vec![vec![m, k], vec![k, n], vec![m, n]], ("B", "C")),
            1 => (kernels::rowsum_sized(m, n), vec![vec![m, n], vec![m]], ("A", "B")),
            // A row's max before its output is written: a `cache_write` of `B` drops its read-in.
            _ => (kernels::softmax_sized(m, n), vec![vec![m, n], vec![m, n]], ("A", "B")),
        };
        let mut s = Schedule::new(plain.clone());
        let mut independent_only = true;
        let mut applied = Vec::new();
        for p in &picks {
            let Some(st) = step(p, &loop_names(s.func()), buffers) else { continue };
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

/// An integer a schedule written by hand or by a tool may hold: small, zero, negative, or at
/// the ends of `i64`.
fn any_int() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => 1..6i64,
        2 => -3..20i64,
        1 => Just(0i64),
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => Just(i64::from(i32::MAX) + 1),
        1 => any::<i64>(),
    ]
}

/// A name: mostly `@<k>`, the `k`-th loop of the function when the step is applied (loops
/// change with every step); else one of its buffers, a name a primitive makes, or junk.
fn any_name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0..12usize).prop_map(|k| format!("@{k}")),
        2 => prop::sample::select(vec!["A", "B", "C", "C_local", "Bp", "rf"]).prop_map(str::to_owned),
        1 => prop::sample::select(vec!["", "i_p", "nosuch", "i", "k0"]).prop_map(str::to_owned),
        1 => "[a-z_]{1,6}",
    ]
}

/// `v` with every `@<k>` string replaced by the `k`-th of `loops` (modulo their number).
fn resolve(v: &serde_json::Value, loops: &[String]) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => match s.strip_prefix('@').and_then(|k| k.parse::<usize>().ok()) {
            Some(k) if !loops.is_empty() => Value::String(loops[k % loops.len()].clone()),
            _ => v.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(|x| resolve(x, loops)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), resolve(x, loops)))
                .collect(),
        ),
        _ => v.clone(),
    }
}

/// One step as JSON, with any values in its fields (Step's JSON schema, values unchecked).
fn any_step_json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::json;
    let axis = (0u64..4, any_int(), prop::option::of(any_int())).prop_map(|(axis, div, modulo)| {
        match modulo {
            Some(m) => json!({"axis": axis, "div": div, "modulo": m}),
            None => json!({"axis": axis, "div": div}),
        }
    });
    prop_oneof![
        (any_name(), any_int()).prop_map(|(l, f)| json!({"split": {"loop": l, "factor": f}})),
        (any_name(), any_int()).prop_map(|(l, a)| json!({"partition": {"loop": l, "at": a}})),
        prop::collection::vec(any_name(), 0..4).prop_map(|v| json!({"reorder": {"loops": v}})),
        (any_name(), any_name()).prop_map(|(o, i)| json!({"fuse": {"outer": o, "inner": i}})),
        any_name().prop_map(|l| json!({"decompose_reduction": {"loop": l}})),
        any_name().prop_map(|l| json!({"fission": {"loop": l}})),
        (
            any_name(),
            prop::sample::select(vec![
                "serial",
                "parallel",
                "vectorized",
                "unrolled",
                "thread_binding",
                "junk"
            ])
        )
            .prop_map(|(l, k)| json!({"kind": {"loop": l, "kind": k}})),
        (
            prop::sample::select(vec!["A", "B", "C", "nosuch"]),
            prop::sample::select(vec!["P", "Q", "A", "@0"]),
            prop::collection::vec(axis, 0..4),
        )
            .prop_map(|(b, into, dims)| {
                json!({"transform_layout": {"buffer": b, "into": into, "dims": dims}})
            }),
        // The usual packing of a matrix into column panels, with any panel width.
        (prop::sample::select(vec!["A", "B"]), any_int()).prop_map(|(b, d)| {
            json!({"transform_layout": {"buffer": b, "into": "P", "dims": [
                {"axis": 1, "div": d}, {"axis": 0}, {"axis": 1, "modulo": d}]}})
        }),
        (any_name(), any_name())
            .prop_map(|(b, at)| json!({"cache_write": {"buffer": b, "at": at}})),
        (any_name(), any_name()).prop_map(|(b, at)| json!({"cache_read": {"buffer": b, "at": at}})),
        (any_name(), any_name(), any_int(), any_int()).prop_map(|(b, at, w, d)| {
            json!({"cache_read": {"buffer": b, "at": at, "panel": w, "innermost": d}})
        }),
        (any_name(), any_name()).prop_map(|(o, i)| json!({"rfactor": {"outer": o, "inner": i}})),
        any_name().prop_map(|b| json!({"compute_inline": {"buffer": b}})),
        (
            any_name(),
            prop::sample::select(vec!["blockIdx.x", "threadIdx.x", "threadIdx.z", "warp"])
        )
            .prop_map(|(l, t)| json!({"bind": {"loop": l, "thread": t}})),
        (any_name(), any_name())
            .prop_map(|(b, at)| json!({"cache_read_shared": {"buffer": b, "at": at}})),
        (any_name(), any_name())
            .prop_map(|(o, i)| json!({"block_reduce": {"outer": o, "inner": i}})),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Schedules read from JSON with any values: each step parses or is refused by serde,
    /// applies or fails with an error that leaves the function as it was, and never panics;
    /// `finish` verifies the result or says why not; what finishes runs in the interpreter.
    #[test]
    fn json_schedules_with_any_values_never_panic(
        which in 0..3u8,
        m in 0..6i64,
        n in 0..6i64,
        k in 0..4i64,
        steps in prop::collection::vec(any_step_json(), 1..6),
    ) {
        let (plain, shapes) = match which {
            0 => (kernels::matmul_sized(m, n, k), vec![vec![m, k], vec![k, n], vec![m, n]]),
            1 => (kernels::rowsum_sized(m, n), vec![vec![m, n], vec![m]]),
            // TVM's form: int32 loops, the init guarded in the reduction loop.
            _ => (kernels::matmul_tvm_form(m, n, k), vec![vec![m, k], vec![k, n], vec![m, n]]),
        };
        let mut s = Schedule::new(plain);
        for v in &steps {
            let v = resolve(v, &loop_names(s.func()));
            let Ok(st) = serde_json::from_value::<Step>(v.clone()) else { continue };
            let before = s.func().to_string();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                s.apply(std::slice::from_ref(&st))
            }));
            let Ok(r) = r else {
                return Err(TestCaseError::fail(format!("{v} panicked")));
            };
            if let Err(e) = r {
                prop_assert!(!e.to_string().is_empty());
                prop_assert_eq!(s.func().to_string(), before, "{} failed ({}) but changed the function", v, e);
            }
        }
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.finish()));
        let Ok(done) = done else {
            return Err(TestCaseError::fail(format!("finish panicked after {steps:?}")));
        };
        if let Ok(f) = done {
            // Device forms (bind, shared memory) run in the interpreter too; only a panic fails.
            let mut args = common::interp_args(&shapes);
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                kiln::ir::interp::run(&f, &mut args)
            }));
            prop_assert!(ran.is_ok(), "the interpreter panicked on {}", f);
        }
    }
}
