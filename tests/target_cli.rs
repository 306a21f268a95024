//! The `kiln target`, `kiln kinds` and `kiln tags` commands: output, exit codes, stderr.

use std::process::{Command, Output};

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("the kiln binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn target_prints_one_line_of_canonical_json() {
    let o = kiln(&[
        "target",
        r#"{"kind":"cuda","arch":"sm_80"}"#,
        "--host",
        "llvm -mcpu=skylake",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "{\"kind\":\"cuda\",\"tag\":\"\",\"keys\":[\"cuda\",\"gpu\"],\"host\":{\"kind\":\"llvm\",\"tag\":\"\",\"keys\":[\"cpu\"],\"mcpu\":\"skylake\"},\"arch\":\"sm_80\",\"thread_warp_size\":32,\"max_num_threads\":1024}\n"
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    assert_eq!(v["host"]["mcpu"], "skylake");

    let o = kiln(&["target", "nvidia/nvidia-a100"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("\"arch\":\"sm_80\""));
}

#[test]
fn target_errors_go_to_stderr_with_nonzero_exit() {
    let o = kiln(&["target", r#"{"kind":"llvm","mcpu":1}"#]);
    assert!(!o.status.success());
    assert!(stdout(&o).is_empty());
    assert_eq!(
        stderr(&o).trim(),
        "error: target `llvm`: attribute `mcpu` expects String, found Integer"
    );
    let o = kiln(&["target", "llvm", "--host", "bogus"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--host: target kind \"bogus\" is not defined"),
        "{}",
        stderr(&o)
    );
    let o = kiln(&["target"]);
    assert!(!o.status.success());
}

#[test]
fn kinds_lists_every_kind_and_one_kind_in_detail() {
    let o = kiln(&["kinds"]);
    assert!(o.status.success());
    let out = stdout(&o);
    let header = out.lines().next().unwrap_or_default();
    assert!(header.starts_with("KIND"), "{out}");
    for kind in ["llvm", "cuda", "rocm", "webgpu", "composite", "test"] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{kind} "))),
            "{kind} missing:\n{out}"
        );
    }
    // Aligned: the DEVICE column starts at the same place on every line.
    let col = header.find("DEVICE").unwrap_or(0);
    assert!(
        out.lines().skip(1).all(|l| l[..col].ends_with("  ")),
        "{out}"
    );

    let o = kiln(&["kinds", "cuda"]);
    assert!(o.status.success());
    assert!(stdout(&o)
        .lines()
        .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["thread_warp_size", "int", "32"]));

    let o = kiln(&["kinds", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert!(v
        .as_array()
        .is_some_and(|a| a.iter().any(|k| k["name"] == "llvm")));

    let o = kiln(&["kinds", "nope"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unknown target kind `nope`; known kinds: llvm"));
}

#[test]
fn tags_lists_the_tvm_table() {
    let o = kiln(&["tags"]);
    assert!(o.status.success());
    let out = stdout(&o);
    assert!(out.lines().count() > 287);
    assert!(out
        .lines()
        .any(|l| l.starts_with("nvidia/nvidia-a100 ") && l.contains("arch=sm_80")));
    let o = kiln(&["tags", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert!(v.as_array().is_some_and(|a| a.len() >= 287));
}
