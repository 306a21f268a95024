//! `kiln build` and `kiln run` from the command line, alone and with Python's tvm_ffi.

mod common;

use std::process::Command;

fn kiln() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.env("KILN_CACHE", "off");
    c
}

const VADD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/kernels/vadd.json");

#[test]
fn build_writes_every_output_kind_and_rejects_unknown_extensions() {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["so", "o", "ll", "s"] {
        let out = dir.path().join(format!("vadd.{ext}"));
        let st = kiln()
            .args(["build", VADD, "-o"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            st.status.success(),
            "{ext}: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        assert!(std::fs::metadata(&out).unwrap().len() > 0);
    }
    let ll = std::fs::read_to_string(dir.path().join("vadd.ll")).unwrap();
    assert!(
        ll.contains("define i32 @__tvm_ffi_vadd("),
        "{}",
        &ll[..ll.len().min(500)]
    );
    let st = kiln()
        .args(["build", VADD, "-o"])
        .arg(dir.path().join("vadd.exe"))
        .output()
        .unwrap();
    assert!(!st.status.success());
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(
        err.contains("expected a path ending in .so, .o, .ll or .s"),
        "{err}"
    );
}

#[test]
fn build_reports_bad_targets_and_bad_modules() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.so");
    let st = kiln()
        .args([
            "build",
            VADD,
            "--target",
            r#"{"kind": "llvm", "mcpu": 3}"#,
            "-o",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!st.status.success());
    assert!(
        String::from_utf8_lossy(&st.stderr).contains("mcpu"),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"format": "kiln-ir/1", "functions": [{"name": "f"}]}"#,
    )
    .unwrap();
    let st = kiln()
        .args(["build"])
        .arg(&bad)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!st.status.success());
    assert!(String::from_utf8_lossy(&st.stderr).contains("bad.json"));
}

#[test]
fn run_finds_a_library_named_without_a_directory_in_the_current_directory() {
    let dir = tempfile::tempdir().unwrap();
    let st = kiln()
        .args(["build", VADD, "-o", "vadd.so"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    // dlopen("vadd.so") alone would search the system library path, not the current directory.
    let st = kiln()
        .args(["run", "vadd.so", "vadd", "rand:4", "rand:4", "zeros:4"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
}

#[test]
fn run_generates_inputs_times_and_checks_against_the_interpreter() {
    let dir = tempfile::tempdir().unwrap();
    let st = kiln()
        .args([
            "run",
            VADD,
            "vadd",
            "rand:100",
            "rand:100",
            "zeros:100",
            "--repeat",
            "3",
            "--check",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&st.stdout);
    assert!(
        st.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert!(out.contains("vadd: 3 runs, median"), "{out}");
    assert!(out.contains("max abs difference 0e0"), "{out}");
    let c = kiln::npy::NpyArray::read(&dir.path().join("C.npy")).unwrap();
    assert_eq!(c.shape, [100]);
    // Mismatched shapes: the generated code's ValueError, on stderr, non-zero exit.
    let st = kiln()
        .args([
            "run", VADD, "vadd", "rand:10", "rand:11", "zeros:10", "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!st.status.success());
    assert!(String::from_utf8_lossy(&st.stderr).contains("ValueError: Mismatched B.shape[0]"));
    let st = kiln()
        .args(["run", VADD, "vadd", "nonsense"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&st.stderr).contains("expected a .npy file"));
}

#[test]
fn built_libraries_run_in_python_tvm_ffi_on_numpy_arrays() {
    let Some(py) = common::python_with_tvm_ffi() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/cli_roundtrip.py");
    let out = Command::new(&py)
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_kiln"))
        .arg(VADD)
        .arg(dir.path())
        .env("KILN_CACHE", "off")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("4 passed, 0 failed"), "{text}");
}
