//! Helpers shared by integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles C sources into a shared library in `dir` with the system C compiler (`$CC` or `cc`).
pub fn build_c_shared(dir: &Path, name: &str, sources: &[&str], extra: &[&str]) -> PathBuf {
    let out = dir.join(format!("lib{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(cc);
    cmd.args(["-shared", "-fPIC", "-O2", "-o"]).arg(&out);
    for s in sources {
        cmd.arg(root.join(s));
    }
    cmd.args(extra);
    let status = cmd.status().expect("running the C compiler");
    assert!(status.success(), "C compiler failed for {sources:?}");
    out
}
