//! TVM 0.27's operators through kiln (`python/kiln_tvm.py`, docs/tvm.md), and TIR's scalar
//! language checked against numpy:
//!
//! - `tests/python/tvm_corpus.py`: TOPI operators converted by the bridge, built by `kiln
//!   build`, run through tvm_ffi on random inputs and compared with TVM's own build of the same
//!   PrimFunc; it prints a coverage line (converted / compiled / agreeing, build and run times)
//!   and fails unless every operator agrees.
//! - `tests/python/tvm_bridge_errors.py`: TIR the bridge does not cover is an error naming the
//!   node, where it is and its TVMScript text.
//! - `tests/python/tir_scalar_numpy.py`: the float functions, bitwise operations, shifts,
//!   clz/popcount, reinterpret, if_then_else and fast_exp of kiln's IR, exported and run
//!   through tvm_ffi, against numpy.
//!
//! The first two need `tvm` (`pip install apache-tvm==0.27.0.post1`) in `KILN_PYTHON`: without
//! it they skip with a message, except under `KILN_REQUIRE_TVM=1` (CI), where they fail. The
//! third needs `tvm_ffi` and numpy (`KILN_REQUIRE_TVM_FFI=1`).

mod common;

use std::process::Command;

fn script(name: &str) -> String {
    format!("{}/tests/python/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs a Python test script; panics with its output unless it exits 0. Returns stdout.
fn run(py: &str, args: &[&str]) -> String {
    let out = Command::new(py).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "`{py} {}` failed:\n{stdout}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs a Python test script that takes kiln's binary and a scratch directory.
fn run_with_kiln(py: &str, name: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    run(
        py,
        &[
            &script(name),
            env!("CARGO_BIN_EXE_kiln"),
            dir.path().to_str().unwrap(),
        ],
    )
}

#[test]
fn topi_operators_converted_by_the_bridge_agree_with_tvm() {
    let Some(py) = common::python_with_tvm() else {
        return;
    };
    let out = run_with_kiln(&py, "tvm_corpus.py");
    let coverage = out
        .lines()
        .find(|l| l.starts_with("coverage:"))
        .expect("a coverage line");
    // The line the issue asks for, visible with `cargo test -- --nocapture`.
    println!("{coverage}");
    let n: usize = coverage
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(n >= 40, "only {n} operators in the corpus: {coverage}");
    assert!(
        coverage.contains(&format!("{n} agree with TVM")),
        "{coverage}"
    );
}

#[test]
fn tir_the_bridge_does_not_cover_is_an_error_naming_the_node() {
    let Some(py) = common::python_with_tvm() else {
        return;
    };
    let out = run(&py, &[&script("tvm_bridge_errors.py")]);
    assert!(out.contains(" passed, 0 failed"), "{out}");
}

#[test]
fn tir_scalar_operations_agree_with_numpy_through_tvm_ffi() {
    let Some(py) = common::python_with_tvm_ffi() else {
        return;
    };
    let out = run_with_kiln(&py, "tir_scalar_numpy.py");
    assert!(out.contains(" passed, 0 failed"), "{out}");
}
