//! The global kind registry: the built-in kinds, plus kinds registered at run time.

use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard};

use super::builtin;
use super::error::{TargetError, TargetResult};
use super::kind::{TargetKind, TargetKindBuilder};

fn registry() -> &'static RwLock<Vec<Arc<TargetKind>>> {
    static KINDS: OnceLock<RwLock<Vec<Arc<TargetKind>>>> = OnceLock::new();
    KINDS.get_or_init(|| RwLock::new(builtin::kinds().into_iter().map(Arc::new).collect()))
}

/// A poisoned lock only means another thread panicked while registering; the list itself is
/// always consistent (one push), so reading on is safe.
fn read() -> RwLockReadGuard<'static, Vec<Arc<TargetKind>>> {
    registry().read().unwrap_or_else(|e| e.into_inner())
}

/// Builds `builder` and adds the kind to the registry.
///
/// # Errors
/// [`TargetError::DuplicateKind`] if a kind of that name exists, or the builder's own errors
/// ([`TargetError::DuplicateOption`], ...).
pub fn register_kind(builder: TargetKindBuilder) -> TargetResult<Arc<TargetKind>> {
    let kind = Arc::new(builder.build()?);
    let mut kinds = registry().write().unwrap_or_else(|e| e.into_inner());
    if kinds.iter().any(|k| k.name() == kind.name()) {
        return Err(TargetError::DuplicateKind(kind.name().to_string()));
    }
    kinds.push(Arc::clone(&kind));
    Ok(kind)
}

/// The kind called `name`.
pub fn lookup_kind(name: &str) -> Option<Arc<TargetKind>> {
    read().iter().find(|k| k.name() == name).cloned()
}

/// Every registered kind, built-ins first, in registration order.
pub fn list_kinds() -> Vec<Arc<TargetKind>> {
    read().clone()
}

/// The names of every registered kind.
pub(crate) fn kind_names() -> Vec<String> {
    read().iter().map(|k| k.name().to_string()).collect()
}
