//! The tuning database is a file format users pass around and merge by hand: reading it and
//! applying its records never panics, whatever the file holds. Arbitrary bytes, and mutations
//! of real records (bytes flipped, lines cut short, steps dropped, swapped, renamed or given
//! other numbers), give records, warnings naming the lines skipped, or notes naming the stale
//! records skipped; a record that applies gives a function the verifier accepts and the
//! interpreter runs to the same results as the function as written. Each call runs under
//! `catch_unwind`, so a panic fails the case with its input.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use kiln::ir::{kernels, IRModule, PrimFunc};
use kiln::schedule::kernels::{matmul_tiled_schedule, MatmulTiles};
use kiln::schedule::Step;
use kiln::target::Target;
use kiln::tune::{self, Database, Record};
use proptest::prelude::*;

const M: i64 = 24;
const N: i64 = 16;
const K: i64 = 8;

fn func() -> PrimFunc {
    kernels::matmul_sized(M, N, K)
}

fn target() -> Target {
    Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap()
}

/// A real record for [`func`]: the AVX2 hand schedule's trace.
fn valid_steps() -> Vec<Step> {
    matmul_tiled_schedule(M, N, K, MatmulTiles::AVX2)
        .unwrap()
        .trace()
        .to_vec()
}

fn record(steps: Vec<Step>) -> Record {
    common::tune_record(&func(), &target(), &tune::db::host_cpu(), "cpu", steps, 1.0)
}

/// Writes `text` as a database, reads it and applies it to [`func`], failing the case on a
/// panic; a function a record changed must still compute the matmul. Says how many records
/// were read.
fn open_and_apply(text: &[u8]) -> Result<usize, TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.jsonl");
    std::fs::write(&path, text).unwrap();
    let f = func();
    let m = IRModule::from_functions(vec![f.clone()]);
    let target = target();
    let out = catch_unwind(AssertUnwindSafe(|| {
        Database::open(&path).map(|db| {
            let (g, notes) = db.apply(&m, &target, true);
            (db.records.len(), db.warnings.len(), g, notes)
        })
    }))
    .map_err(|_| {
        TestCaseError::fail(format!(
            "reading or applying panicked on {:?}",
            String::from_utf8_lossy(&text[..text.len().min(300)])
        ))
    })?;
    // A file that exists is never refused whole: each line is a record or a warning.
    let (records, warnings, g, notes) = out.map_err(TestCaseError::fail)?;
    let lines = text
        .split(|&b| b == b'\n')
        .filter(|l| std::str::from_utf8(l).map_or(true, |s| !s.trim().is_empty()))
        .count();
    prop_assert_eq!(records + warnings, lines);
    prop_assert_eq!(g.functions.len(), 1);
    let h = &g.functions[0];
    if h.to_string() != f.to_string() {
        prop_assert!(
            notes.iter().any(|n| n.contains("tuning record applied")),
            "{notes:?}"
        );
        h.verify()
            .map_err(|e| TestCaseError::fail(format!("applied record fails the verifier: {e}")))?;
        let shapes = [vec![M, K], vec![K, N], vec![M, N]];
        let want = common::interp_last(&f, &shapes);
        let got = common::interp_last(h, &shapes);
        for (x, y) in got.iter().zip(&want) {
            prop_assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "{x} vs {y}");
        }
    }
    Ok(records)
}

/// One structural change to a list of steps, chosen by `op` and `at`.
fn mutate_steps(steps: &mut Vec<serde_json::Value>, op: u8, at: usize, n: i64, name: &str) {
    if steps.is_empty() {
        return;
    }
    let i = at % steps.len();
    match op % 5 {
        0 => {
            steps.remove(i);
        }
        1 => {
            let j = (at / 7) % steps.len();
            steps.swap(i, j);
        }
        2 => {
            let s = steps[i].clone();
            steps.insert(i, s);
        }
        // Every number, or every string, inside one step replaced.
        3 => replace_leaves(&mut steps[i], &|v| {
            if v.is_number() {
                Some(n.into())
            } else {
                None
            }
        }),
        _ => replace_leaves(&mut steps[i], &|v| {
            if v.is_string() {
                Some(name.into())
            } else {
                None
            }
        }),
    }
}

fn replace_leaves(
    v: &mut serde_json::Value,
    with: &dyn Fn(&serde_json::Value) -> Option<serde_json::Value>,
) {
    if let Some(x) = with(v) {
        *v = x;
        return;
    }
    match v {
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| replace_leaves(x, with)),
        serde_json::Value::Object(o) => o.values_mut().for_each(|x| replace_leaves(x, with)),
        _ => {}
    }
}

#[test]
fn the_valid_record_applies() {
    let line = serde_json::to_string(&record(valid_steps())).unwrap();
    let records = open_and_apply(format!("{line}\n").as_bytes()).unwrap();
    assert_eq!(records, 1);
}

/// A record appended after a line cut short (a search killed mid-write) starts a line of its
/// own; a line of bytes that are not UTF-8 costs that line only.
#[test]
fn appending_after_a_cut_line_keeps_the_new_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.jsonl");
    let line = serde_json::to_string(&record(valid_steps())).unwrap();
    let mut text = format!("{line}\n").into_bytes();
    text.extend_from_slice(&[0xff, 0xfe, b'x', b'\n']);
    text.extend_from_slice(&line.as_bytes()[..line.len() / 2]);
    std::fs::write(&path, &text).unwrap();
    let mut db = Database::open(&path).unwrap();
    assert_eq!(
        (db.records.len(), db.warnings.len()),
        (1, 2),
        "{:?}",
        db.warnings
    );
    assert!(
        db.warnings[0].contains(":2: not UTF-8 text"),
        "{:?}",
        db.warnings
    );
    assert!(
        db.warnings[1].contains(":3: not a tuning record"),
        "{:?}",
        db.warnings
    );
    db.append(record(Vec::new())).unwrap();
    let db = Database::open(&path).unwrap();
    assert_eq!(
        (db.records.len(), db.warnings.len()),
        (2, 2),
        "{:?}",
        db.warnings
    );
    assert!(db.records[1].steps.is_empty());
    // An empty file takes no newline before its first record.
    let fresh = dir.path().join("fresh.jsonl");
    std::fs::write(&fresh, "").unwrap();
    Database::open(&fresh)
        .unwrap()
        .append(record(Vec::new()))
        .unwrap();
    assert!(!std::fs::read_to_string(&fresh).unwrap().starts_with('\n'));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..400)) {
        open_and_apply(&b)?;
        let mut lines = b"{\"format\":\"kiln-tune/1\",".to_vec();
        lines.extend_from_slice(&b);
        open_and_apply(&lines)?;
    }

    #[test]
    fn flipped_and_cut_records_never_panic(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in any::<usize>(),
    ) {
        let line = serde_json::to_string(&record(valid_steps())).unwrap();
        let mut b = line.clone().into_bytes();
        for (at, x) in flips {
            let i = at % b.len();
            b[i] ^= x;
        }
        b.truncate(b.len() - cut % (b.len() / 4));
        let mut text = line.into_bytes();
        text.push(b'\n');
        text.extend_from_slice(&b);
        text.push(b'\n');
        // The intact record still reads, whatever the line after it holds.
        prop_assert!(open_and_apply(&text)? >= 1);
    }

    #[test]
    fn mutated_steps_are_applied_or_skipped_never_a_panic(
        ops in proptest::collection::vec((any::<u8>(), any::<usize>()), 1..5),
        n in prop_oneof![Just(0i64), Just(1), Just(-1), Just(3), Just(8), Just(1 << 40), any::<i64>()],
        name in prop_oneof![Just("i"), Just("j"), Just("k"), Just(""), Just("C"), Just("k.outer"), Just("A")],
    ) {
        let mut v = serde_json::to_value(record(valid_steps())).unwrap();
        let steps = v["steps"].as_array_mut().unwrap();
        for (op, at) in ops {
            mutate_steps(steps, op, at, n, name);
        }
        let line = serde_json::to_string(&v).unwrap();
        open_and_apply(format!("{line}\n").as_bytes())?;
    }
}
