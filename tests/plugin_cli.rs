//! `kiln devices` with plugins: every library in `KILN_PLUGIN_PATH` is listed with its devices and
//! attributes; a bad file is reported on stderr and skipped.

mod plugin_util;

use std::process::Command;

#[test]
fn kiln_devices_lists_plugins_from_the_plugin_path_and_reports_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    plugin_util::build_sample_in(dir.path(), "cli_sample", &[]);
    std::fs::write(dir.path().join("libbad.so"), "not a library").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("devices")
        .env("KILN_PLUGIN_PATH", dir.path())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("warning: skipping plugin"), "{stderr}");
    assert!(stderr.contains("libbad.so"), "{stderr}");
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("cli_sample "))
        .unwrap_or_else(|| panic!("no cli_sample backend row:\n{stdout}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[2], "2", "two devices: {row}");
    assert!(stdout.contains("plugins:"), "{stdout}");
    assert!(stdout.contains("0.3.1"), "{stdout}");
    assert!(stdout.contains("cli_sample:1:"), "{stdout}");
    assert!(stdout.contains("Sample Accelerator #1"), "{stdout}");
}

#[test]
fn kiln_devices_json_includes_plugin_information() {
    let dir = tempfile::tempdir().unwrap();
    let lib = plugin_util::build_sample_in(dir.path(), "cli_json", &["SAMPLE_MINIMAL"]);
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["devices", "--json", "--plugin"])
        .arg(&lib)
        .env_remove("KILN_PLUGIN_PATH")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &doc["plugins"][0];
    assert_eq!(p["name"], "cli_json");
    assert_eq!(p["abi"], serde_json::json!([1, 2]));
    assert!(p["absent_entries"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("async_memory_copy_h2d")));
    let backend = doc["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "cli_json")
        .unwrap();
    assert_eq!(backend["device_count"], 2);
    assert_eq!(backend["code"], p["code"]);
}

#[test]
fn kiln_devices_fails_with_the_reason_when_an_explicit_plugin_is_bad() {
    let dir = tempfile::tempdir().unwrap();
    let lib = plugin_util::build_sample_in(dir.path(), "cli_bad", &["SAMPLE_DROP_REQUIRED"]);
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["devices", "--plugin"])
        .arg(&lib)
        .env_remove("KILN_PLUGIN_PATH")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("lacks required entries: memory_copy_d2h, create_event"),
        "{stderr}"
    );
}
