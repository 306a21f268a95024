//! The layering of `docs/architecture.md`, enforced: every `crate::<module>` path (and every
//! `super::` path that climbs to the crate root) in `src/<module>/` must name a module that the
//! table in the architecture guide lets it import. The table is read from the guide itself, so
//! the guide and this check cannot drift apart; and the table must have no cycle.
//!
//! Comments, doc comments and string literals are not imports and are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const GUIDE: &str = "docs/architecture.md";

/// `module -> modules it may import`, from the guide's table between `<!-- layering -->` and
/// `<!-- /layering -->` (rows `| module | may import |`, `—` for none).
fn documented_layers(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(root.join(GUIDE)).expect("reading the architecture guide");
    let start = text
        .find("<!-- layering -->")
        .expect("docs/architecture.md has no `<!-- layering -->` table");
    let end = text[start..]
        .find("<!-- /layering -->")
        .expect("the layering table is not closed with `<!-- /layering -->`")
        + start;
    let mut out = BTreeMap::new();
    for line in text[start..end].lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let names = |cell: &str| -> Vec<String> {
            cell.split(',')
                .map(|s| s.trim().trim_matches('`').to_owned())
                .filter(|s| {
                    !s.is_empty()
                        && s != "—"
                        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
                .collect()
        };
        if cells.len() < 2 || cells[0].starts_with("---") || cells[0] == "module" {
            continue;
        }
        let module = names(cells[0]);
        assert_eq!(
            module.len(),
            1,
            "layering table row `{line}`: one module expected"
        );
        out.insert(module[0].clone(), names(cells[1]).into_iter().collect());
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file: `src/codegen/llvm/emit/expr.rs` -> `[codegen, llvm, emit,
/// expr]`; `mod.rs` is its folder.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    if last != "mod.rs" {
        parts.push(last.trim_end_matches(".rs").to_owned());
    }
    parts
}

/// The code of a line without comments and string literals (good enough for `use` lines and
/// paths: a `//` inside a string is removed with the string first).
fn code_of(line: &str) -> String {
    let t = line.trim_start();
    if t.starts_with("//") {
        return String::new();
    }
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

/// The top-level modules `file` names: `crate::m`, and `super::...::m` paths that climb to the
/// crate root (counting inline `mod m { ... }` blocks, which add a level).
fn imports(src: &Path, file: &Path) -> Vec<(usize, String)> {
    let path = module_path(src, file);
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = Vec::new();
    // Brace depths at which inline modules opened: each adds one level to `path`.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    for (n, line) in text.lines().enumerate() {
        let code = code_of(line);
        let t = code.trim_start();
        let t = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        let opens_inline = t.starts_with("mod ") && t.trim_end().ends_with('{');
        let level = path.len() + inline.len();
        let bytes = code.as_bytes();
        let mut i = 0;
        while i < code.len() {
            let rest = &code[i..];
            let word_start =
                i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
            let ident = |r: &str| -> String {
                r.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect()
            };
            if word_start && rest.starts_with("crate::") {
                let r = &rest["crate::".len()..];
                if let Some(group) = r.strip_prefix('{') {
                    // `crate::{a, b::c}`: each item's first segment.
                    let group = group.split('}').next().unwrap_or("");
                    out.extend(group.split(',').map(|g| (n + 1, ident(g.trim()))));
                } else {
                    out.push((n + 1, ident(r)));
                }
                i += "crate::".len();
                continue;
            }
            if word_start && rest.starts_with("super::") {
                let mut ups = 0;
                let mut r = rest;
                while let Some(x) = r.strip_prefix("super::") {
                    ups += 1;
                    r = x;
                }
                if ups >= level {
                    let name = ident(r);
                    if !name.is_empty() {
                        out.push((n + 1, name));
                    }
                }
                i += "super::".len() * ups;
                continue;
            }
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
        for c in code.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if inline.last() == Some(&depth) {
                        inline.pop();
                    }
                }
                _ => {}
            }
        }
        if opens_inline {
            // The `{` of this line was counted: the module's body is at `depth`.
            inline.push(depth - 1);
        }
    }
    out.retain(|(_, m)| !m.is_empty() && m != "self");
    out
}

#[test]
fn no_module_imports_a_module_its_layer_may_not() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let layers = documented_layers(root);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    let mut undocumented = BTreeSet::new();
    for file in &files {
        let path = module_path(&src, file);
        let Some(top) = path.first().cloned() else {
            continue;
        }; // lib.rs: the crate root
        if top == "bin" || top == "lib" {
            continue; // the binary uses `kiln::`; lib.rs is the root facade
        }
        let Some(allowed) = layers.get(&top) else {
            undocumented.insert(top);
            continue;
        };
        for (line, name) in imports(&src, file) {
            if name == top || allowed.contains(&name) {
                continue;
            }
            violations.push(format!(
                "{}:{line}: `{top}` uses `crate::{name}`, but {GUIDE} lets `{top}` import only {}",
                file.strip_prefix(root).unwrap().display(),
                if allowed.is_empty() {
                    "nothing".to_owned()
                } else {
                    allowed
                        .iter()
                        .map(|a| format!("`{a}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
    }
    assert!(
        undocumented.is_empty(),
        "modules missing from the layering table of {GUIDE}: {undocumented:?}"
    );
    assert!(
        violations.is_empty(),
        "imports against the layering (fix the import, or change the table with a reason):\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_documented_layering_has_no_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let layers = documented_layers(root);
    // Depth-first search for a back edge.
    fn visit<'a>(
        m: &'a str,
        layers: &'a BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(i) = stack.iter().position(|s| *s == m) {
            panic!(
                "the layering of {GUIDE} has a cycle: {}",
                stack[i..].join(" -> ")
            );
        }
        stack.push(m);
        for d in layers.get(m).into_iter().flatten() {
            assert!(
                layers.contains_key(d),
                "`{m}` may import `{d}`, which the table does not list"
            );
            visit(d, layers, stack, done);
        }
        stack.pop();
        done.insert(m);
    }
    let (mut stack, mut done) = (Vec::new(), BTreeSet::new());
    for m in layers.keys() {
        visit(m, &layers, &mut stack, &mut done);
    }
    // Every module of the crate is in the table.
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    for line in lib.lines() {
        if let Some(m) = line
            .strip_prefix("pub mod ")
            .and_then(|r| r.strip_suffix(';'))
        {
            assert!(
                layers.contains_key(m),
                "`{m}` (src/lib.rs) is not in the layering table of {GUIDE}"
            );
        }
    }
}

#[test]
fn the_checker_sees_upward_imports_and_skips_comments_and_strings() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("runtime")).unwrap();
    let f = src.join("runtime/mod.rs");
    std::fs::write(
        &f,
        "use crate::codegen::x;\n// crate::ir in a comment\nlet s = \"crate::schedule\";\nuse super::ir::Y;\nlet d = crate::device_api::get; // crate::target\nmod tests {\n    use super::*;\n    use super::super::npy;\n}\nuse crate::{util, error::X};\n",
    )
    .unwrap();
    let found: Vec<String> = imports(&src, &f).into_iter().map(|(_, m)| m).collect();
    assert_eq!(
        found,
        ["codegen", "ir", "device_api", "npy", "util", "error"]
    );
}

/// The files of the guide's `<!-- unsafe -->` table (paths relative to `src/`).
fn documented_unsafe_files(root: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root.join(GUIDE)).expect("reading the architecture guide");
    let start = text
        .find("<!-- unsafe -->")
        .expect("docs/architecture.md has no `<!-- unsafe -->` table");
    let end = text[start..]
        .find("<!-- /unsafe -->")
        .expect("the unsafe table is not closed with `<!-- /unsafe -->`")
        + start;
    text[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// Whether the file has `unsafe` code (outside comments and string literals).
fn has_unsafe(file: &Path) -> bool {
    std::fs::read_to_string(file).unwrap().lines().any(|l| {
        let code = code_of(l);
        code.match_indices("unsafe").any(|(i, _)| {
            let b = code.as_bytes();
            let before = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
            let after = b
                .get(i + "unsafe".len())
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || *c == b'_'));
            before && after
        })
    })
}

#[test]
fn unsafe_code_lives_only_in_the_documented_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let documented = documented_unsafe_files(root);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let actual: BTreeSet<String> = files
        .iter()
        .filter(|f| has_unsafe(f))
        .map(|f| f.strip_prefix(&src).unwrap().to_string_lossy().into_owned())
        .collect();
    let undocumented: Vec<_> = actual.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&actual).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "the `unsafe` table of {GUIDE} is out of date:\n  files with unsafe code it does not list \
         (use a safe wrapper, or add the file with its reason): {undocumented:?}\n  files it lists \
         that have none (remove them): {stale:?}"
    );
}
