//! Tags: named target configs. TVM 0.27's table ships in `tags.json` (generated from the
//! conformance data, 287 tags); more can be registered at run time.

use std::collections::BTreeMap;
use std::sync::{OnceLock, RwLock, RwLockReadGuard};

use super::error::{TargetError, TargetResult};
use super::parse::from_config;
use super::value::TargetValue;

/// TVM 0.27's tag table: `{"tags": {name: config}}`.
const TABLE: &str = include_str!("tags.json");

/// A registered tag.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetTag {
    /// The tag's name, e.g. `nvidia/nvidia-a100`.
    pub name: String,
    /// Its raw config (what the tag stands for before validation and defaults).
    pub config: serde_json::Value,
}

type Table = BTreeMap<String, Vec<(String, TargetValue)>>;

fn table() -> &'static RwLock<Table> {
    static TAGS: OnceLock<RwLock<Table>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut t = Table::new();
        // The table is part of the crate and checked by the tests; if it were ever broken the
        // registry would simply start empty.
        if let Ok(serde_json::Value::Object(root)) = serde_json::from_str(TABLE) {
            if let Some(serde_json::Value::Object(tags)) = root.get("tags") {
                for (name, config) in tags {
                    if let TargetValue::Map(entries) = TargetValue::from_json(config) {
                        t.insert(name.clone(), entries);
                    }
                }
            }
        }
        RwLock::new(t)
    })
}

/// Poisoning cannot leave the map half-updated (one insert), so reading on is safe.
fn read() -> RwLockReadGuard<'static, Table> {
    table().read().unwrap_or_else(|e| e.into_inner())
}

/// The raw config of tag `name`.
pub(crate) fn lookup(name: &str) -> Option<Vec<(String, TargetValue)>> {
    read().get(name).cloned()
}

/// All tag names, sorted.
pub(crate) fn names() -> Vec<String> {
    read().keys().cloned().collect()
}

/// Registers tag `name` for `config` (a JSON object with a `kind`, as TVM's tag configs are).
/// The config must make a valid target.
///
/// # Errors
/// [`TargetError::DuplicateTag`] if the name is taken, [`TargetError::InvalidTag`] if the config
/// is not an object with a string `kind`, or the error building a target from it.
pub fn register_tag(name: impl Into<String>, config: &serde_json::Value) -> TargetResult<()> {
    let name = name.into();
    let TargetValue::Map(entries) = TargetValue::from_json(config) else {
        return Err(TargetError::InvalidTag {
            name,
            message: format!("config must be a JSON object, found {config}"),
        });
    };
    if !entries
        .iter()
        .any(|(k, v)| k == "kind" && v.as_str().is_some())
    {
        return Err(TargetError::InvalidTag {
            name,
            message: "config must have a string \"kind\"".to_string(),
        });
    }
    from_config(entries.clone())?;
    let mut t = table().write().unwrap_or_else(|e| e.into_inner());
    if t.contains_key(&name) {
        return Err(TargetError::DuplicateTag(name));
    }
    t.insert(name, entries);
    Ok(())
}

/// Every registered tag, sorted by name.
pub fn list_tags() -> Vec<TargetTag> {
    read()
        .iter()
        .map(|(name, entries)| TargetTag {
            name: name.clone(),
            config: TargetValue::Map(entries.clone()).to_json(),
        })
        .collect()
}
