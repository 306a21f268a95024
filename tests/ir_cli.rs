//! `kiln ir <module.json>`: prints verified modules, reports errors with node paths.

use std::process::Command;

fn kiln(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn example(name: &str) -> String {
    format!(
        "{}/examples/kernels/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn prints_a_verified_module_as_text() {
    let (ok, stdout, stderr) = kiln(&["ir", &example("vadd")]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout,
        "// kiln-ir/1 module, 1 function(s)\n\nfunc @vadd(A: float32[n], B: float32[n], C: float32[n]) attrs(noalias) {\n  for i: int64 in parallel(0i64, n) {\n    C[i] = A[i] + B[i]\n  }\n}\n"
    );
    assert_eq!(stderr, "");
}

#[test]
fn json_output_is_the_canonical_form() {
    let (ok, stdout, _) = kiln(&["ir", "--json", &example("softmax")]);
    assert!(ok);
    assert_eq!(stdout, std::fs::read_to_string(example("softmax")).unwrap());
}

#[test]
fn verifier_errors_go_to_stderr_with_node_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    let text = std::fs::read_to_string(example("vadd")).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let bad = value
        .to_string()
        .replace(r#""kind":"parallel""#, r#""kind":"vectorized""#)
        .replace(r#""buffer":"C""#, r#""buffer":"A""#);
    std::fs::write(&path, bad).unwrap();
    let (ok, stdout, stderr) = kiln(&["ir", path.to_str().unwrap()]);
    assert!(!ok);
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        "error: function `vadd`: $.functions[0].body.extent: vectorized loop `i` needs a constant extent, found `n`\n"
    );
}

#[test]
fn reader_errors_and_missing_files_fail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(
        &path,
        r#"{"format": "kiln-ir/1", "functions": [{"name": "f"}]}"#,
    )
    .unwrap();
    let (ok, _, stderr) = kiln(&["ir", path.to_str().unwrap()]);
    assert!(!ok);
    assert_eq!(stderr, "error: $.functions[0]: missing field `params`\n");
    let (ok, _, stderr) = kiln(&["ir", "/nonexistent/module.json"]);
    assert!(!ok);
    assert!(
        stderr.starts_with("error: cannot read /nonexistent/module.json: "),
        "{stderr}"
    );
}

#[test]
fn every_error_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.json");
    let body = r#"{"stmt": "seq", "stmts": [
        {"stmt": "evaluate", "value": {"op": "add", "args": [{"const": 1, "dtype": "int32"}, {"const": 1, "dtype": "int64"}]}},
        {"stmt": "return", "value": {"const": 1, "dtype": "int32"}}]}"#;
    std::fs::write(&path, format!(r#"{{"format": "kiln-ir/1", "functions": [{{"name": "f", "params": [], "body": {body}}}]}}"#)).unwrap();
    let (ok, _, stderr) = kiln(&["ir", path.to_str().unwrap()]);
    assert!(!ok);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0]
            .contains("$.functions[0].body.stmts[0].value: operands of `add` have different types"),
        "{stderr}"
    );
    assert!(
        lines[1]
            .contains("$.functions[0].body.stmts[1]: `return` in a function without a return type"),
        "{stderr}"
    );
}
