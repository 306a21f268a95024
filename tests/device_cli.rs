//! `kiln devices`: the table and the JSON output.

use std::process::Command;

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("running kiln")
}

#[test]
fn devices_prints_the_cpu_backend_and_its_attributes_as_an_aligned_table() {
    let out = kiln(&["devices"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("backends:"), "{text}");
    let cpu_row = text
        .lines()
        .find(|l| l.trim_start().starts_with("cpu "))
        .unwrap_or_else(|| panic!("no cpu row in:\n{text}"));
    assert_eq!(
        cpu_row.split_whitespace().collect::<Vec<_>>(),
        ["cpu", "1", "1"]
    );
    assert!(text.contains("cpu:0:"), "{text}");
    // Every attribute row has its value in the same column.
    let attr_lines: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("cpu:0:"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(attr_lines.len() >= 18, "{text}");
    let col = |l: &str| {
        l.find("  ")
            .map(|i| i + l[i..].find(|c: char| c != ' ').unwrap())
    };
    let first = col(attr_lines[0]);
    for l in &attr_lines {
        assert_eq!(col(l), first, "misaligned row {l:?} in:\n{text}");
    }
    let warp = attr_lines.iter().find(|l| l.contains("warp_size")).unwrap();
    assert_eq!(warp.split_whitespace().last(), Some("1"));
    let gcn = attr_lines.iter().find(|l| l.contains("gcn_arch")).unwrap();
    assert_eq!(gcn.split_whitespace().last(), Some("-"));
}

#[test]
fn devices_json_lists_every_attribute_with_null_for_unsupported_ones() {
    let out = kiln(&["devices", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cpu = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "cpu")
        .expect("cpu backend");
    assert_eq!(cpu["code"], 1);
    assert_eq!(cpu["device_count"], 1);
    let attrs = cpu["devices"][0]["attributes"].as_object().unwrap();
    assert_eq!(attrs.len(), 17);
    assert_eq!(attrs["exist"], 1);
    assert_eq!(attrs["warp_size"], 1);
    assert!(attrs["max_threads_per_block"].is_null());
    assert!(attrs["total_global_memory"].as_i64().unwrap() > 0);
    assert!(cpu["devices"][0]["memory"]["in_use"].is_u64());
}

#[test]
fn devices_with_an_unknown_backend_fails_and_lists_the_known_ones() {
    let out = kiln(&["devices", "cdua"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown device `cdua`"), "{err}");
    assert!(err.contains("cpu"), "{err}");
    let out = kiln(&["devices", "rocm"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no backend is registered for device type `rocm`"),
        "{err}"
    );
}

#[test]
fn output_to_a_closed_pipe_ends_quietly_without_a_panic() {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("devices")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the reading end before kiln writes, as `kiln devices | true` does.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
}
