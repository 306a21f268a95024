//! `kiln target`, `kiln kinds`, `kiln tags`: parse and export targets, list kinds and tags.

use std::fmt::Write as _;

use crate::target::{list_kinds, list_tags, lookup_kind, Target, TargetKind};
use clap::Args;

/// `kiln target <TARGET> [--host <TARGET>]`
#[derive(Args)]
pub struct TargetArgs {
    /// A target: JSON object, kind name, tag name, or legacy `kind -option=value` string.
    pub target: String,
    /// A host target (replaces any host the target has).
    #[arg(long)]
    pub host: Option<String>,
    /// Print the target as code generation sees it on this machine: `"mcpu": "native"`
    /// replaced by the host CPU and `mattr` by its features (then the `mattr` given); for
    /// `cuda`, a note on stderr says which PTX architecture and ISA the kernels get.
    #[arg(long)]
    pub resolve: bool,
}

/// `kiln kinds [KIND] [--json]`
#[derive(Args)]
pub struct KindsArgs {
    /// Show this kind's options in detail.
    pub kind: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `kiln tags [--json]`
#[derive(Args)]
pub struct TagsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

use super::emit;

/// Prints the canonical export of the target as one line of JSON (`--resolve`: with `native`
/// resolved to the host CPU).
pub fn run_target(args: &TargetArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut t = Target::parse(&args.target)?;
    if let Some(h) = &args.host {
        let host = Target::parse(h).map_err(|e| format!("--host: {e}"))?;
        t = t.with_host(host);
    }
    if args.resolve {
        t = t.resolve_native()?;
    }
    emit(&format!("{t}\n"))?;
    // What the CUDA code generator makes of the target's arch (LLVM 14 writes PTX up to sm_86).
    #[cfg(feature = "llvm")]
    if args.resolve && matches!(t.kind_name(), "cuda" | "nvptx") {
        let arch = crate::codegen::cuda::PtxArch::of(&t)?;
        eprintln!("note: {}", arch.describe());
    }
    Ok(())
}

fn device_name(code: i32) -> String {
    crate::packed_func::DLDeviceType(code)
        .name()
        .map_or_else(|| code.to_string(), str::to_owned)
}

/// Formats rows as a table whose columns are padded to their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        text.push_str(s.trim_end());
        text.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    text
}

fn kind_or_err(name: &str) -> Result<std::sync::Arc<TargetKind>, String> {
    lookup_kind(name).ok_or_else(|| {
        let known: Vec<String> = list_kinds().iter().map(|k| k.name().to_string()).collect();
        format!(
            "unknown target kind `{name}`; known kinds: {}",
            known.join(", ")
        )
    })
}

/// Lists kinds (or one kind's options).
pub fn run_kinds(args: &KindsArgs) -> Result<(), Box<dyn std::error::Error>> {
    match &args.kind {
        Some(name) => {
            let kind = kind_or_err(name)?;
            if args.json {
                return emit(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&kind.to_json())?
                ));
            }
            let mut text = String::new();
            writeln!(
                text,
                "kind {}: device {} ({}), default keys [{}], canonicalizer: {}",
                kind.name(),
                device_name(kind.device_type()),
                kind.device_type(),
                kind.default_keys().join(", "),
                if kind.has_canonicalizer() {
                    "yes"
                } else {
                    "no"
                }
            )?;
            let rows: Vec<Vec<String>> = kind
                .options()
                .iter()
                .map(|o| {
                    vec![
                        o.name.clone(),
                        o.ty.tvm_name().to_string(),
                        o.default
                            .as_ref()
                            .map_or_else(String::new, ToString::to_string),
                    ]
                })
                .collect();
            text.push_str(&table(&["OPTION", "TYPE", "DEFAULT"], &rows));
            emit(&text)
        }
        None => {
            let kinds = list_kinds();
            if args.json {
                let all: Vec<serde_json::Value> = kinds.iter().map(|k| k.to_json()).collect();
                return emit(&format!("{}\n", serde_json::to_string_pretty(&all)?));
            }
            let rows: Vec<Vec<String>> = kinds
                .iter()
                .map(|k| {
                    vec![
                        k.name().to_string(),
                        device_name(k.device_type()),
                        k.default_keys().join(","),
                        k.own_options()
                            .iter()
                            .map(|o| match &o.default {
                                Some(d) => format!("{}={d}", o.name),
                                None => o.name.clone(),
                            })
                            .collect::<Vec<_>>()
                            .join(" "),
                    ]
                })
                .collect();
            emit(&table(
                &[
                    "KIND",
                    "DEVICE",
                    "DEFAULT KEYS",
                    "OPTIONS (besides the common ones)",
                ],
                &rows,
            ))
        }
    }
}

/// Lists tags.
pub fn run_tags(args: &TagsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let tags = list_tags();
    if args.json {
        let all: Vec<serde_json::Value> = tags
            .iter()
            .map(|t| serde_json::json!({ "name": t.name, "config": t.config }))
            .collect();
        return emit(&format!("{}\n", serde_json::to_string_pretty(&all)?));
    }
    let rows: Vec<Vec<String>> = tags
        .iter()
        .map(|t| {
            let get = |k: &str| t.config.get(k).and_then(|v| v.as_str()).unwrap_or("");
            let detail: Vec<String> = ["arch", "mcpu", "mtriple", "device"]
                .iter()
                .filter(|k| !get(k).is_empty())
                .map(|k| format!("{k}={}", get(k)))
                .collect();
            vec![t.name.clone(), get("kind").to_string(), detail.join(" ")]
        })
        .collect();
    emit(&table(&["TAG", "KIND", "DETAILS"], &rows))
}
