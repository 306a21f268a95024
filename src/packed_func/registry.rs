//! The global function registry: names such as `device_api.cpu` or `target.build.llvm` mapped to
//! [`PackedFunc`]s, shared by the whole process and safe to use from any thread.

use std::collections::BTreeMap;
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::error::{PackedFuncError, PackedFuncResult};
use super::function::PackedFunc;

fn table() -> &'static RwLock<BTreeMap<String, PackedFunc>> {
    static TABLE: OnceLock<RwLock<BTreeMap<String, PackedFunc>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

// A panic while the lock is held cannot leave the map half-updated (every write is one insert or
// remove), so a poisoned lock is still consistent.
fn read() -> RwLockReadGuard<'static, BTreeMap<String, PackedFunc>> {
    table().read().unwrap_or_else(|e| e.into_inner())
}

fn write() -> RwLockWriteGuard<'static, BTreeMap<String, PackedFunc>> {
    table().write().unwrap_or_else(|e| e.into_inner())
}

/// Registers `f` as the global function `name`.
///
/// # Errors
/// [`PackedFuncError::AlreadyRegistered`] when `name` exists and `allow_override` is false.
///
/// ```
/// use kiln::packed_func::{registry, PackedFunc};
/// let f = PackedFunc::from_typed("demo.twice", |x: i64| 2 * x);
/// registry::register("demo.twice", f.clone(), false).unwrap();
/// assert!(registry::register("demo.twice", f, false).is_err());
/// let g = registry::get("demo.twice").unwrap();
/// assert_eq!(g.call_typed::<_, i64>((21i64,)).unwrap(), 42);
/// ```
pub fn register(name: &str, f: PackedFunc, allow_override: bool) -> PackedFuncResult<()> {
    let mut t = write();
    if !allow_override && t.contains_key(name) {
        return Err(PackedFuncError::AlreadyRegistered {
            name: name.to_owned(),
        });
    }
    t.insert(name.to_owned(), f);
    Ok(())
}

/// The global function `name`, if registered.
pub fn get(name: &str) -> Option<PackedFunc> {
    read().get(name).cloned()
}

/// The global function `name`.
///
/// # Errors
/// [`PackedFuncError::NotFound`], with registered names that look alike.
pub fn require(name: &str) -> PackedFuncResult<PackedFunc> {
    let t = read();
    if let Some(f) = t.get(name) {
        return Ok(f.clone());
    }
    let close = closest_names(name, t.keys().map(String::as_str));
    Err(PackedFuncError::NotFound {
        name: name.to_owned(),
        close,
    })
}

/// Removes the global function `name`, returning it.
pub fn remove(name: &str) -> Option<PackedFunc> {
    write().remove(name)
}

/// Every registered name, sorted.
pub fn list() -> Vec<String> {
    read().keys().cloned().collect()
}

/// Every registered name that starts with `prefix`, sorted.
pub fn list_prefix(prefix: &str) -> Vec<String> {
    read()
        .keys()
        .filter(|k| k.starts_with(prefix))
        .cloned()
        .collect()
}

/// Up to three of `candidates` within a small edit distance of `name`, closest first.
pub fn closest_names<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let limit = (name.chars().count() / 3).max(2);
    let mut scored: Vec<(usize, &str)> = candidates
        .into_iter()
        .map(|c| (crate::util::edit_distance(name, c), c))
        .filter(|(d, _)| *d <= limit)
        .collect();
    scored.sort();
    scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_owned())
        .collect()
}
