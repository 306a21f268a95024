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
    // A target kind TVM defines but kiln writes no files for: the kinds it does, and the one
    // seen.
    let st = kiln()
        .args(["build", VADD, "--target", "vulkan", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!st.status.success());
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(
        err.contains("writes files for target kinds `llvm`, `opencl`, `cuda`, found `vulkan`"),
        "{err}"
    );
    assert!(!out.exists());
}

/// A CPU LLVM 14 does not know (newer than it, or misspelt) or a 32-bit one for the x86-64
/// triple made LLVM abort the process; each is a clear error, for every output and for `run`.
#[test]
fn cpus_llvm_14_cannot_compile_for_are_errors_not_aborts() {
    let dir = tempfile::tempdir().unwrap();
    for (cpu, needle) in [
        (
            "emeraldrapids",
            "not an x86-64 CPU that kiln's LLVM (14) knows",
        ),
        ("haswel", "did you mean `haswell`?"),
        ("i686", "32-bit x86 CPU"),
    ] {
        let target = format!(r#"{{"kind": "llvm", "mcpu": "{cpu}"}}"#);
        for ext in ["so", "o", "ll", "s"] {
            let out = dir.path().join(format!("x.{ext}"));
            let st = kiln()
                .args(["build", VADD, "--target", &target, "-o"])
                .arg(&out)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&st.stderr);
            assert_eq!(st.status.code(), Some(1), "{cpu} .{ext}: {err}");
            assert!(err.contains(needle), "{cpu} .{ext}: {err}");
            assert!(!out.exists(), "{cpu} .{ext}: an output was written");
        }
        let st = kiln()
            .args(["run", VADD, "vadd", "--target", &target])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&st.stderr);
        assert_eq!(st.status.code(), Some(1), "run {cpu}: {err}");
        assert!(err.contains(needle), "run {cpu}: {err}");
    }
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
fn build_and_run_say_which_target_and_what_it_gives() {
    let dir = tempfile::tempdir().unwrap();
    let st = kiln()
        .args(["run", VADD, "vadd", "rand:8", "rand:8", "zeros:8", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(st.status.success(), "{err}");
    assert!(
        err.contains(r#"for {"kind":"llvm","tag":"","keys":["cpu"],"mcpu":"native"} (the default target): cpu "#),
        "{err}"
    );
    assert!(err.contains("(native)"), "{err}");
    assert!(err.contains("a*b+c fused to FMA (contraction on)"), "{err}");
    #[cfg(target_arch = "x86_64")]
    assert!(err.contains("streaming stores for outputs of"), "{err}");
    let ll = dir.path().join("v.ll");
    let st = kiln()
        .args(["build", VADD, "-o"])
        .arg(&ll)
        .args([
            "--target",
            r#"{"kind": "llvm", "mcpu": "haswell", "fast-math-contract": false}"#,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(st.status.success(), "{err}");
    assert!(!err.contains("default target"), "{err}");
    assert!(
        err.contains(": cpu haswell, AVX2; float: IEEE, no contraction;"),
        "{err}"
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

/// Writes a `.npy` (version 1.0) file of 16-bit elements with the given descr.
fn write_npy16(path: &std::path::Path, descr: &str, bits: &[u16]) {
    let mut h = format!(
        "{{'descr': '{descr}', 'fortran_order': False, 'shape': ({},), }}",
        bits.len()
    );
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    b.extend_from_slice(h.as_bytes());
    for x in bits {
        b.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, b).unwrap();
}

fn read16(path: &std::path::Path, bf16: bool) -> Vec<f32> {
    let a = kiln::npy::NpyArray::read(path).unwrap();
    a.data
        .as_slice()
        .chunks_exact(2)
        .map(|c| {
            if bf16 {
                half::bf16::from_le_bytes([c[0], c[1]]).to_f32()
            } else {
                half::f16::from_le_bytes([c[0], c[1]]).to_f32()
            }
        })
        .collect()
}

#[test]
fn run_reads_writes_and_checks_float16_and_bfloat16() {
    let dir = tempfile::tempdir().unwrap();
    let vadd = std::fs::read_to_string(VADD).unwrap();
    for (dtype, descr, bf16) in [("float16", "<f2", false), ("bfloat16", "<V2", true)] {
        let module = dir.path().join(format!("vadd_{dtype}.json"));
        std::fs::write(&module, vadd.replace("float32", dtype)).unwrap();
        let out = dir.path().join(dtype);
        // Generated inputs, `--check` against the interpreter (which computes in f32).
        let st = kiln()
            .arg("run")
            .arg(&module)
            .args(["vadd"])
            .arg(format!("rand:64:{dtype}"))
            .arg(format!("rand:64:{dtype}"))
            .arg(format!("zeros:64:{dtype}"))
            .args(["--check", "--out"])
            .arg(&out)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&st.stdout);
        assert!(
            st.status.success(),
            "{dtype}: {stdout}{}",
            String::from_utf8_lossy(&st.stderr)
        );
        assert!(stdout.contains(&format!("({dtype} [64])")), "{stdout}");
        assert!(stdout.contains("max abs difference 0e0"), "{stdout}");
        let header = std::fs::read(out.join("C.npy")).unwrap();
        let header = String::from_utf8_lossy(&header[..64]);
        assert!(header.contains(&format!("'descr': '{descr}'")), "{header}");
        let (a, b, c) = (
            read16(&out.join("A.npy"), bf16),
            read16(&out.join("B.npy"), bf16),
            read16(&out.join("C.npy"), bf16),
        );
        assert!(a.iter().any(|&x| x != 0.0), "rand: fills the inputs");
        for i in 0..64 {
            let want = if bf16 {
                half::bf16::from_f32(a[i] + b[i]).to_f32()
            } else {
                half::f16::from_f32(a[i] + b[i]).to_f32()
            };
            assert_eq!(c[i], want, "{dtype} C[{i}]");
        }

        // `.npy` inputs: numpy's `<f2`; for bfloat16 what `np.save` writes for an
        // `ml_dtypes.bfloat16` array (`<V2`) and for the bits viewed as `V2` (`|V2`).
        let bits: [u16; 3] = if bf16 {
            [0x3fc0, 0xc000, 0x4050] // 1.5, -2, 3.25
        } else {
            [0x3e00, 0xc000, 0x4280]
        };
        let descrs: &[&str] = if bf16 { &["<V2", "|V2"] } else { &["<f2"] };
        for d in descrs {
            let x = dir.path().join(format!("x_{dtype}.npy"));
            write_npy16(&x, d, &bits);
            let out = dir.path().join(format!("{dtype}_npy"));
            let st = kiln()
                .arg("run")
                .arg(&module)
                .arg("vadd")
                .arg(&x)
                .arg(&x)
                .arg(format!("zeros:3:{dtype}"))
                .args(["--check", "--out"])
                .arg(&out)
                .output()
                .unwrap();
            assert!(
                st.status.success(),
                "{dtype} {d}: {}",
                String::from_utf8_lossy(&st.stderr)
            );
            assert_eq!(read16(&out.join("C.npy"), bf16), [3.0, -4.0, 6.5], "{d}");
        }
    }
    // A float32 file for a bfloat16 parameter: the generated code's dtype check.
    let st = kiln()
        .arg("run")
        .arg(dir.path().join("vadd_bfloat16.json"))
        .args(["vadd", "rand:4", "rand:4:bfloat16", "zeros:4:bfloat16"])
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!st.status.success());
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(err.contains("bfloat16"), "{err}");
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

#[test]
fn run_bounds_the_count_of_timed_calls() {
    // Each timed call's time is kept for the median: a count of 10^12 was an allocation of
    // 8 TB that aborted the process. Now it is refused before anything is compiled.
    let dir = tempfile::tempdir().unwrap();
    for n in ["1000000000000", "10000001"] {
        let out = kiln()
            .args(["run", VADD, "vadd", "--repeat", n])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains(&format!("invalid value '{n}' for '--repeat <REPEAT>'"))
                && err.contains("at most 10000000 calls are timed"),
            "{err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("memory allocation"),
            "{err}"
        );
    }
}
