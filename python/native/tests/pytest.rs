//! The Python package's test suite (`python/tests`, pytest) against this crate's library as
//! cargo just built it: `cargo test --workspace` (the README's test command) runs it.
//!
//! It needs a Python (`KILN_PYTHON`, default `python3`) with `tvm_ffi`, numpy and pytest, and
//! for the TVM half (`test_models.py`) `apache-tvm` 0.27. Without them it skips with a message,
//! except under `KILN_REQUIRE_TVM_FFI=1` / `KILN_REQUIRE_TVM=1` (CI), where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `libkiln_python.so` as cargo built it for the tests: in `target/<profile>/deps/` beside
/// this test (a test build does not copy it up to `target/<profile>/`).
fn native_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe
        .parent()
        .expect("the test binary lives in target/<profile>/deps");
    let candidates = [deps.to_path_buf(), deps.join("..")];
    candidates
        .iter()
        .map(|d| d.join("libkiln_python.so"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libkiln_python.so is in neither {} nor its parent (crate-type cdylib)",
                deps.display()
            )
        })
}

fn python_with(modules: &str, require: &str) -> Option<String> {
    let py = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    assert_ne!(
        std::env::var(require).as_deref(),
        Ok("1"),
        "{require}=1 but `{py}` cannot import {modules} (pip install apache-tvm-ffi numpy pytest)"
    );
    eprintln!("skipped: `{py}` cannot import {modules} (pip install apache-tvm-ffi numpy pytest)");
    None
}

#[test]
fn python_package_tests_pass() {
    let Some(py) = python_with("tvm_ffi, numpy, pytest", "KILN_REQUIRE_TVM_FFI") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(&py)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "python/tests",
        ])
        .current_dir(&root)
        .env("KILN_NATIVE_LIB", native_library())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("running pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "pytest failed (output above)");
    if std::env::var("KILN_REQUIRE_TVM").as_deref() == Ok("1") {
        assert!(
            !text.contains(" skipped"),
            "KILN_REQUIRE_TVM=1 but tests were skipped (is apache-tvm installed?)"
        );
    }
}
