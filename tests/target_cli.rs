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
fn target_keeps_native_and_resolve_shows_the_host_cpu() {
    let native = r#"{"kind": "llvm", "mcpu": "native"}"#;
    let o = kiln(&["target", native]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "{\"kind\":\"llvm\",\"tag\":\"\",\"keys\":[\"cpu\"],\"mcpu\":\"native\"}\n"
    );

    let o = kiln(&["target", "--resolve", "llvm -mcpu=native -mattr=+user"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    let mcpu = v["mcpu"].as_str().expect("mcpu is a string");
    assert!(!mcpu.is_empty() && mcpu != "native", "{v}");
    if let Some((name, features)) = kiln::target::host_cpu() {
        assert_eq!(mcpu, name);
        let mut want: Vec<serde_json::Value> = features.iter().map(|f| f.as_str().into()).collect();
        want.push("+user".into());
        assert_eq!(v["mattr"], serde_json::Value::Array(want));
    }
    // The resolved form is itself a target, which resolves to itself.
    let o2 = kiln(&["target", "--resolve", stdout(&o).trim()]);
    assert_eq!(stdout(&o2), stdout(&o));

    // Hosts are resolved; a named CPU is left alone.
    let o = kiln(&["target", "--resolve", "cuda -arch=sm_80", "--host", native]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    assert_ne!(v["host"]["mcpu"], "native");
    let o = kiln(&["target", "--resolve", "llvm -mcpu=skylake"]);
    assert_eq!(
        stdout(&o),
        "{\"kind\":\"llvm\",\"tag\":\"\",\"keys\":[\"cpu\"],\"mcpu\":\"skylake\"}\n"
    );
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
