//! Builds the sample plugin (`plugins/sample/sample.c`) with the system C compiler for the
//! plugin tests. Each variant gets its own device type name, so the variants load side by side.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use kiln::device_api::plugin::{self, PluginDeviceApi};

/// The directory that holds this test process's builds.
pub fn build_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

/// Compiles `plugins/sample/sample.c` as device type `name` with extra `-D` flags into `dir`.
pub fn build_sample_in(dir: &Path, name: &str, defines: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join(format!("libkiln_{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let mut cmd = Command::new(cc);
    cmd.args(["-shared", "-fPIC", "-O1", "-g", "-o"])
        .arg(&out)
        .arg("-I")
        .arg(root.join("include"))
        .arg(format!("-DSAMPLE_DEVICE_TYPE=\"{name}\""));
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    cmd.arg(root.join("plugins/sample/sample.c"))
        .arg("-lpthread");
    let status = cmd.status().expect("running the C compiler");
    assert!(
        status.success(),
        "building the sample plugin `{name}` failed"
    );
    out
}

/// Compiles the sample plugin as device type `name` into the shared build directory, once per
/// process and name.
pub fn build_sample(name: &str, defines: &[&str]) -> PathBuf {
    // One compiler at a time: the machine's cores are shared, and a file is never loaded while
    // it is being written.
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = build_dir().join(format!("libkiln_{name}.so"));
    if path.exists() {
        return path;
    }
    build_sample_in(build_dir(), name, defines)
}

/// Builds and loads the sample plugin as device type `name` (once per process and name).
pub fn sample(name: &str, defines: &[&str]) -> Arc<PluginDeviceApi> {
    let path = build_sample(name, defines);
    plugin::load_plugin(&path).unwrap_or_else(|e| panic!("loading `{name}`: {e}"))
}

/// Compiles a C source given as text into a shared library called `lib<name>.so`.
pub fn build_c(name: &str, source: &str) -> PathBuf {
    let dir = build_dir();
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(format!("lib{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success());
    out
}
