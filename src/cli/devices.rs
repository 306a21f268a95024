//! `kiln devices`: every registered device backend and each device's attributes. Device plugins
//! in the directories of `KILN_PLUGIN_PATH` (and those given with `--plugin`) are loaded first;
//! a bad file is reported on stderr and skipped.

use crate::device_api::{self, plugin, AttrKind, AttrValue, Device, DeviceApi};
use clap::Args;

/// Arguments of `kiln devices`.
#[derive(Args)]
pub struct DevicesArgs {
    /// Print one JSON document instead of tables (for scripts).
    #[arg(long)]
    json: bool,
    /// Only this backend (a name such as `cpu`).
    backend: Option<String>,
    /// Also load this device plugin (a shared library); may be repeated.
    #[arg(long = "plugin", value_name = "PATH")]
    plugins: Vec<std::path::PathBuf>,
}

struct DeviceReport {
    device: Device,
    attrs: Vec<(AttrKind, Option<AttrValue>)>,
    memory: Option<device_api::MemoryStats>,
}

struct BackendReport {
    name: String,
    code: i32,
    devices: Vec<DeviceReport>,
    /// Why a backend has no device (no driver, no platform), as its device 0 says.
    absent: Option<String>,
}

fn report(name: &str, api: &dyn DeviceApi) -> Result<BackendReport, Box<dyn std::error::Error>> {
    let count = api.device_count()?;
    let mut devices = Vec::new();
    for id in 0..count {
        let device = Device::new(api.device_type(), id as i32);
        let attrs = AttrKind::all()
            .map(|k| (k, api.attr(device, k).ok().flatten()))
            .collect();
        devices.push(DeviceReport {
            device,
            attrs,
            memory: api.memory_stats(device).ok(),
        });
    }
    let absent = if count == 0 {
        api.check_device(Device::new(api.device_type(), 0))
            .err()
            .map(|e| {
                // The reason, without "invalid device cuda:0: ".
                let text = e.to_string();
                match text.strip_prefix("invalid device ") {
                    Some(rest) => rest
                        .split_once(": ")
                        .map_or(text.clone(), |(_, r)| r.to_owned()),
                    None => text,
                }
            })
    } else {
        None
    };
    Ok(BackendReport {
        name: name.to_owned(),
        code: api.device_type().0,
        devices,
        absent,
    })
}

fn to_json(reports: &[BackendReport]) -> serde_json::Value {
    let backends: Vec<serde_json::Value> = reports
        .iter()
        .map(|b| {
            let devices: Vec<serde_json::Value> = b
                .devices
                .iter()
                .map(|d| {
                    let mut attrs = serde_json::Map::new();
                    for (k, v) in &d.attrs {
                        let v = match v {
                            Some(AttrValue::Int(i)) => serde_json::Value::from(*i),
                            Some(AttrValue::Str(s)) => serde_json::Value::from(s.clone()),
                            None => serde_json::Value::Null,
                        };
                        attrs.insert(k.to_string(), v);
                    }
                    serde_json::json!({
                        "device": d.device.to_string(),
                        "device_id": d.device.device_id,
                        "attributes": attrs,
                        "memory": d.memory,
                    })
                })
                .collect();
            serde_json::json!({
                "name": b.name,
                "code": b.code,
                "device_count": b.devices.len(),
                "devices": devices,
                "absent": b.absent,
            })
        })
        .collect();
    serde_json::json!({ "backends": backends })
}

fn print_table(rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("  {}", line.join("  ").trim_end());
    }
}

/// Every registered device backend (after loading the plugins of `KILN_PLUGIN_PATH`), or only
/// `backend`, with each device's attributes, as `kiln devices --json` prints it: `{"backends":
/// [...], "plugins": [...]}`. Python's `kiln.devices()` returns this document.
///
/// # Errors
/// An unknown backend name, or a backend that fails to count its devices.
pub fn json(backend: Option<&str>) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let (reports, plugins) = collect(backend, &[])?;
    let mut doc = to_json(&reports);
    doc["plugins"] = serde_json::to_value(&plugins)?;
    Ok(doc)
}

type Collected = (Vec<BackendReport>, Vec<plugin::PluginInfo>);

fn collect(
    backend: Option<&str>,
    extra: &[std::path::PathBuf],
) -> Result<Collected, Box<dyn std::error::Error>> {
    let scan = plugin::load_plugins_from_env();
    for (path, e) in &scan.failed {
        eprintln!("warning: skipping plugin `{}`: {e}", path.display());
    }
    for (path, why) in &scan.skipped {
        eprintln!("warning: skipping plugin `{}`: {why}", path.display());
    }
    for path in extra {
        plugin::load_plugin(path)?;
    }
    let plugins: Vec<plugin::PluginInfo> =
        plugin::loaded_plugins().iter().map(|p| p.info()).collect();
    let mut reports = Vec::new();
    match backend {
        Some(name) => {
            let api = device_api::get_by_name(name)?;
            reports.push(report(api.name(), &*api)?);
        }
        None => {
            for (name, code) in device_api::list() {
                let api = device_api::get(code)?;
                reports.push(report(&name, &*api)?);
            }
        }
    }
    Ok((reports, plugins))
}

/// Runs `kiln devices`.
pub fn run(args: DevicesArgs) -> Result<(), Box<dyn std::error::Error>> {
    let (reports, plugins) = collect(args.backend.as_deref(), &args.plugins)?;
    if args.json {
        let mut doc = to_json(&reports);
        doc["plugins"] = serde_json::to_value(&plugins)?;
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("backends:");
    let mut rows = vec![vec![
        "name".to_owned(),
        "code".to_owned(),
        "devices".to_owned(),
        "note".to_owned(),
    ]];
    for b in &reports {
        rows.push(vec![
            b.name.clone(),
            b.code.to_string(),
            b.devices.len().to_string(),
            b.absent.clone().unwrap_or_default(),
        ]);
    }
    print_table(&rows);
    if !plugins.is_empty() {
        println!();
        println!("plugins:");
        let mut rows = vec![vec![
            "name".to_owned(),
            "version".to_owned(),
            "abi".to_owned(),
            "kind".to_owned(),
            "fallbacks".to_owned(),
            "path".to_owned(),
        ]];
        for p in &plugins {
            let (a, b, c) = p.plugin_version;
            rows.push(vec![
                p.name.clone(),
                format!("{a}.{b}.{c}"),
                format!("{}.{}", p.abi.0, p.abi.1),
                p.sub_device_type.clone().unwrap_or_else(|| "-".to_owned()),
                p.absent_entries.len().to_string(),
                p.path.display().to_string(),
            ]);
        }
        print_table(&rows);
    }
    for b in &reports {
        for d in &b.devices {
            println!();
            println!("{}:", d.device);
            let mut rows = vec![vec!["attribute".to_owned(), "value".to_owned()]];
            for (k, v) in &d.attrs {
                rows.push(vec![
                    k.to_string(),
                    v.as_ref()
                        .map_or_else(|| "-".to_owned(), ToString::to_string),
                ]);
            }
            if let Some(m) = &d.memory {
                rows.push(vec!["memory_in_use_bytes".to_owned(), m.in_use.to_string()]);
                rows.push(vec!["memory_peak_bytes".to_owned(), m.peak.to_string()]);
            }
            print_table(&rows);
        }
    }
    Ok(())
}
