//! The guides in `docs/` are checked: every fenced block marked by a `<!-- ci -->` line just
//! before it runs, and must succeed.
//!
//! - ```` ```sh ```` blocks run with `bash -e -o pipefail`, with the `kiln` binary under test first
//!   on `PATH`, in a scratch directory where `examples/` links to the repository's.
//! - ```` ```python ```` blocks run with `$KILN_PYTHON` (default `python3`) in the same directory,
//!   after the guide's earlier blocks; they are skipped when that Python lacks `tvm_ffi` or
//!   `numpy`, unless `KILN_REQUIRE_TVM_FFI=1` (as in CI), which makes them mandatory.
//!
//! Blocks of one guide run in order and share the directory, so a guide can build a library in a
//! shell block and load it in a Python block. Relative links between guides must resolve.

use std::path::{Path, PathBuf};
use std::process::Command;

const MARK: &str = "<!-- ci -->";

/// Guides another branch is writing; links to them are allowed before they land.
const PENDING: &[&str] = &["plugins.md", "performance.md"];

#[derive(Debug)]
struct Block {
    lang: String,
    line: usize,
    code: String,
}

fn docs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")
}

fn read_guide(name: &str) -> String {
    let path = docs_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The blocks marked `<!-- ci -->`, in order. A mark not followed by a fenced block is an error.
fn ci_blocks(name: &str, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != MARK {
            i += 1;
            continue;
        }
        let fence = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
        let lang = fence.strip_prefix("```").unwrap_or_else(|| {
            panic!(
                "{name}:{}: `{MARK}` must be followed by a fenced block",
                i + 1
            )
        });
        assert!(
            lang == "sh" || lang == "python",
            "{name}:{}: a ci block is ```sh or ```python, found ```{lang}",
            i + 2
        );
        let start = i + 2;
        let end = (start..lines.len())
            .find(|&j| lines[j].trim() == "```")
            .unwrap_or_else(|| panic!("{name}:{}: unterminated block", i + 2));
        out.push(Block {
            lang: lang.to_owned(),
            line: start,
            code: lines[start..end].join("\n") + "\n",
        });
        i = end + 1;
    }
    out
}

fn guides() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(docs_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    v.sort();
    v
}

fn python() -> Option<String> {
    let py = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import tvm_ffi, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    assert_ne!(
        std::env::var("KILN_REQUIRE_TVM_FFI").as_deref(),
        Ok("1"),
        "KILN_REQUIRE_TVM_FFI=1 but {py} cannot import tvm_ffi and numpy"
    );
    None
}

/// Runs the ci blocks of one guide; returns how many ran.
fn run_guide(name: &str) -> usize {
    let blocks = ci_blocks(name, &read_guide(name));
    assert!(!blocks.is_empty(), "{name} has no `{MARK}` blocks");
    let work = tempfile::tempdir().unwrap();
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kiln"), bin.join("kiln")).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::os::unix::fs::symlink(root.join("examples"), work.path().join("examples")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let py = if blocks.iter().any(|b| b.lang == "python") {
        python()
    } else {
        None
    };
    let mut ran = 0;
    for b in &blocks {
        let mut cmd = match b.lang.as_str() {
            "sh" => {
                let mut c = Command::new("bash");
                c.args(["-e", "-o", "pipefail", "-c", &b.code]);
                c
            }
            _ => match &py {
                Some(py) => {
                    let mut c = Command::new(py);
                    c.args(["-c", &b.code]);
                    c
                }
                None => {
                    eprintln!("{name}:{}: skipped (no tvm_ffi/numpy)", b.line);
                    continue;
                }
            },
        };
        let out = cmd
            .current_dir(work.path())
            .env("PATH", &path)
            .env("KILN_CACHE", "off")
            // Kernels on one thread: the guides' tuning runs compare candidates, and on a
            // loaded machine (the other tests) a parallel candidate can be many times slower
            // than the serial default (a CI run: no winner at all, so no record).
            .env("KILN_NUM_THREADS", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}:{}: {} block failed ({}):\n{}\n--- stdout\n{}\n--- stderr\n{}",
            b.line,
            b.lang,
            out.status,
            b.code,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ran += 1;
    }
    ran
}

#[test]
fn guide_targets_commands_run() {
    run_guide("targets.md");
}

#[test]
fn guide_devices_commands_run() {
    run_guide("devices.md");
}

#[test]
fn guide_ir_commands_run() {
    run_guide("ir.md");
}

#[test]
fn guide_codegen_commands_run() {
    run_guide("codegen.md");
}

#[test]
fn guide_tune_commands_run() {
    run_guide("tune.md");
}

#[test]
fn guide_rpc_commands_run() {
    run_guide("rpc.md");
}

#[test]
fn guide_python_commands_and_snippets_run() {
    run_guide("python.md");
}

/// A guide with ci blocks but no test above would be skipped silently.
#[test]
fn every_guide_with_ci_blocks_has_a_test() {
    let tested = [
        "targets.md",
        "devices.md",
        "ir.md",
        "codegen.md",
        "python.md",
        "rpc.md",
        "tune.md",
    ];
    for g in guides() {
        let n = ci_blocks(&g, &read_guide(&g)).len();
        assert!(
            n == 0 || tested.contains(&g.as_str()),
            "docs/{g} has {n} ci blocks but no test in tests/docs.rs"
        );
    }
}

#[test]
fn the_block_parser_finds_marked_blocks_only() {
    let text = "x\n```sh\nnot me\n```\n<!-- ci -->\n```sh\nkiln tags\nkiln kinds\n```\n\
                <!-- ci -->\n```python\nprint(1)\n```\n";
    let b = ci_blocks("t.md", text);
    assert_eq!(b.len(), 2, "{b:?}");
    assert_eq!(
        (b[0].lang.as_str(), b[0].code.as_str()),
        ("sh", "kiln tags\nkiln kinds\n")
    );
    assert_eq!((b[1].lang.as_str(), b[1].line), ("python", 11));
}

/// Every relative link `](x.md)`, `](../path)` in a guide points at a file that exists, and the
/// index `docs/README.md` links every guide.
#[test]
fn links_between_guides_resolve_and_the_index_lists_every_guide() {
    let dir = docs_dir();
    for g in guides() {
        let text = read_guide(&g);
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let target = &rest[..rest.find(')').unwrap_or(rest.len())];
            let file = target.split('#').next().unwrap_or("");
            if file.is_empty() || file.contains("://") || PENDING.contains(&file) {
                continue;
            }
            assert!(
                dir.join(file).exists(),
                "docs/{g}: link to `{target}`, but docs/{file} does not exist"
            );
        }
    }
    let index = read_guide("README.md");
    for g in guides().iter().filter(|g| *g != "README.md") {
        assert!(
            index.contains(&format!("]({g})")),
            "docs/README.md does not link {g}"
        );
    }
    for p in PENDING {
        assert!(
            index.contains(&format!("]({p})")),
            "docs/README.md does not link {p}"
        );
    }
}
