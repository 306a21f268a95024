//! Building a [`Target`] from a string or a config, following TVM 0.27's algorithm step by step.
//!
//! String: an exact tag name, else JSON if it starts with `{`, else (kiln extension, top level
//! only) the legacy form if it contains a space, else a bare kind name.
//!
//! Config: (0) `tag` without `kind` merges the tag's config under the given keys; (1) `kind`;
//! (2) `host`, parsed recursively; (3) `feature.*` set aside; (4) every declared option in
//! declaration order is validated or defaulted, then any other key is an error; (5) the
//! canonicalizer; (6) set-aside features come back unless the canonicalizer set them; (7) `tag`,
//! `keys` (given keys + device, or device + default keys, deduplicated), attributes.

use std::sync::Arc;

use super::error::{suggest, TargetError, TargetResult};
use super::kind::{Config, OptionSpec, OptionType, TargetKind};
use super::value::TargetValue;
use super::{json, legacy, registry, tags, Target};

/// Whether a string may use the legacy form (top-level strings only).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// A string the user gave directly (`Target::parse`, the CLI).
    Top,
    /// A string inside a JSON config (`host`, `devices`): TVM 0.27's rules, strictly.
    Nested,
}

/// Parses a target string.
pub(crate) fn parse_str(s: &str, level: Level) -> TargetResult<Target> {
    if let Some(config) = tags::lookup(s) {
        return from_config(config);
    }
    if s.starts_with('{') {
        return match json::parse(s)? {
            TargetValue::Map(entries) => from_config(entries),
            other => Err(TargetError::NotATarget {
                found: other.type_name().to_string(),
            }),
        };
    }
    if s.contains(' ') {
        return match level {
            Level::Top => legacy::parse(s),
            Level::Nested => Err(TargetError::LegacyNotAllowed {
                input: s.to_string(),
            }),
        };
    }
    from_config(vec![("kind".to_string(), TargetValue::Str(s.to_string()))])
}

/// Parses a target given as a value: a string (top level), an object, or a target.
pub(crate) fn from_value(v: TargetValue, level: Level) -> TargetResult<Target> {
    match v {
        TargetValue::Str(s) => parse_str(&s, level),
        TargetValue::Map(entries) => from_config(entries),
        TargetValue::Target(t) => Ok(*t),
        other => Err(TargetError::NotATarget {
            found: other.type_name().to_string(),
        }),
    }
}

fn get<'a>(entries: &'a [(String, TargetValue)], key: &str) -> Option<&'a TargetValue> {
    entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn take(entries: &mut Vec<(String, TargetValue)>, key: &str) -> Option<TargetValue> {
    let i = entries.iter().position(|(k, _)| k == key)?;
    Some(entries.remove(i).1)
}

fn set(entries: &mut Vec<(String, TargetValue)>, key: String, value: TargetValue) {
    match entries.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => *v = value,
        None => entries.push((key, value)),
    }
}

/// Whether `key` is a `feature.*` attribute (TVM: prefix `feature.` and something after it).
pub(crate) fn is_feature(key: &str) -> bool {
    key.len() > 8 && key.starts_with("feature.")
}

/// The error for an unknown kind name, with a hint when the name is close to a kind or tag.
pub(crate) fn unknown_kind(name: &str) -> TargetError {
    let known = registry::kind_names();
    let trimmed = name.trim();
    let hint = if trimmed != name
        && (known.iter().any(|k| k == trimmed) || tags::lookup(trimmed).is_some())
    {
        format!(" (remove the whitespace around `{trimmed}`)")
    } else if name.contains('/') {
        let tag_names = tags::names();
        let s = suggest(name, tag_names.iter().map(String::as_str));
        if s.is_empty() {
            " (not a tag either: `kiln tags` lists them)".to_string()
        } else {
            s.replace("did you mean", "did you mean the tag")
        }
    } else {
        suggest(name, known.iter().map(String::as_str))
    };
    TargetError::UnknownKind {
        name: name.to_string(),
        known,
        hint,
    }
}

/// Builds a target from a config (TVM's `FromConfig`).
pub(crate) fn from_config(mut cfg: Vec<(String, TargetValue)>) -> TargetResult<Target> {
    // (0) A tag without a kind: the tag's config, overridden by everything else given.
    if get(&cfg, "kind").is_none() {
        if let Some(tag) = get(&cfg, "tag") {
            let name = tag.as_str().ok_or_else(|| TargetError::TagNotString {
                found: tag.type_name().to_string(),
            })?;
            let Some(mut merged) = tags::lookup(name) else {
                let names = tags::names();
                return Err(TargetError::UnknownTag {
                    name: name.to_string(),
                    hint: suggest(name, names.iter().map(String::as_str)),
                    count: names.len(),
                });
            };
            let name = name.to_string();
            for (k, v) in cfg {
                if k != "tag" {
                    set(&mut merged, k, v);
                }
            }
            set(&mut merged, "tag".to_string(), TargetValue::Str(name));
            cfg = merged;
        }
    }

    // (1) The kind.
    let kind_name = match get(&cfg, "kind") {
        None => return Err(TargetError::MissingKind),
        Some(TargetValue::Str(s)) => s,
        Some(other) => {
            return Err(TargetError::KindNotString {
                found: other.type_name().to_string(),
            })
        }
    };
    let kind = registry::lookup_kind(kind_name).ok_or_else(|| unknown_kind(kind_name))?;

    // (2) The host, to any depth.
    let host = match take(&mut cfg, "host") {
        None | Some(TargetValue::Null) => None,
        Some(v) => Some(Box::new(parse_host(v).map_err(|e| e.nested("host"))?)),
    };

    // (3) Features are not part of the schema.
    let mut features = Vec::new();
    cfg.retain_mut(|(k, v)| {
        if is_feature(k) {
            features.push((std::mem::take(k), std::mem::replace(v, TargetValue::Null)));
            false
        } else {
            true
        }
    });

    // (4) Validate and default, in declaration order; then reject what is left.
    let mut resolved: Vec<(String, TargetValue)> = Vec::with_capacity(kind.options().len());
    for opt in kind.options() {
        if opt.name == "host" {
            continue;
        }
        if let Some(i) = cfg.iter().position(|(k, _)| *k == opt.name) {
            let v = std::mem::replace(&mut cfg[i].1, TargetValue::Null);
            cfg[i].0.clear();
            resolved.push((opt.name.clone(), coerce(&kind, opt, v)?));
        } else if let Some(d) = &opt.default {
            resolved.push((opt.name.clone(), d.clone()));
        }
    }
    if let Some((k, _)) = cfg.iter().find(|(k, _)| !k.is_empty()) {
        return Err(unknown_option(&kind, k));
    }

    // (5) Canonicalize, then check what the canonicalizer left.
    if let Some(canon) = kind.canonicalizer() {
        let mut conf = Config::from_entries(resolved);
        canon(&mut conf)?;
        resolved = conf.into_entries();
        recheck(&kind, &mut resolved)?;
    }

    // (6) Features come back unless the canonicalizer set them.
    for (k, v) in features {
        if get(&resolved, &k).is_none() {
            resolved.push((k, v));
        }
    }

    // (7) Tag, keys, attributes.
    let tag = match take(&mut resolved, "tag") {
        Some(TargetValue::Str(s)) => s,
        _ => String::new(),
    };
    let device = match get(&resolved, "device") {
        Some(TargetValue::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let mut keys = match take(&mut resolved, "keys") {
        Some(TargetValue::StrArray(mut k)) => {
            k.extend(device);
            k
        }
        _ => device
            .into_iter()
            .chain(kind.default_keys().iter().cloned())
            .collect(),
    };
    let mut i = 0;
    while i < keys.len() {
        if keys[..i].contains(&keys[i]) {
            keys.remove(i);
        } else {
            i += 1;
        }
    }
    let attrs = order_attrs_for(&kind, resolved);
    Ok(Target::from_parts(kind, tag, keys, host, attrs))
}

/// Canonical attribute order: declared options in declaration order, then `feature.*` sorted.
/// Drops `kind` and `from_device` (never exported).
pub(crate) fn order_attrs_for(
    kind: &TargetKind,
    mut attrs: Vec<(String, TargetValue)>,
) -> Vec<(String, TargetValue)> {
    let mut out = Vec::with_capacity(attrs.len());
    for opt in kind.options() {
        if matches!(
            opt.name.as_str(),
            "kind" | "keys" | "tag" | "host" | "from_device"
        ) {
            continue;
        }
        if let Some(v) = take(&mut attrs, &opt.name) {
            out.push((opt.name.clone(), v));
        }
    }
    attrs.retain(|(k, _)| is_feature(k));
    attrs.sort_by(|a, b| a.0.cmp(&b.0));
    out.extend(attrs);
    out
}

fn parse_host(v: TargetValue) -> TargetResult<Target> {
    match v {
        TargetValue::Str(s) => parse_str(&s, Level::Nested),
        TargetValue::Map(entries) => from_config(entries),
        TargetValue::Target(t) => Ok(*t),
        other => Err(TargetError::HostType {
            found: other.type_name().to_string(),
        }),
    }
}

fn unknown_option(kind: &TargetKind, key: &str) -> TargetError {
    let known: Vec<String> = kind.options().iter().map(|o| o.name.clone()).collect();
    let mut hint = suggest(key, known.iter().map(String::as_str));
    if hint.is_empty() && key.starts_with("feature") && !is_feature(key) {
        hint = " (feature attributes are named `feature.<name>`)".to_string();
    }
    TargetError::UnknownOption {
        kind: kind.name().to_string(),
        option: key.to_string(),
        known,
        hint,
    }
}

/// Converts a value of a plain (non-target) type, applying TVM's int/bool interchange.
pub(crate) fn coerce_plain(ty: OptionType, v: &TargetValue) -> Option<TargetValue> {
    use TargetValue as V;
    match (ty, v) {
        (OptionType::Int, V::Int(i)) => Some(V::Int(*i)),
        (OptionType::Int, V::Bool(b)) => Some(V::Int(i64::from(*b))),
        (OptionType::Bool, V::Bool(b)) => Some(V::Bool(*b)),
        (OptionType::Bool, V::Int(i)) => Some(V::Bool(*i != 0)),
        (OptionType::Str, V::Str(s)) => Some(V::Str(s.clone())),
        (OptionType::StrArray, V::StrArray(a)) => Some(V::StrArray(a.clone())),
        (OptionType::StrArray, V::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .map(V::StrArray),
        (OptionType::Map, V::Map(m)) => Some(V::Map(m.clone())),
        (OptionType::Target, V::Target(t)) => Some(V::Target(t.clone())),
        (OptionType::TargetArray, V::TargetArray(t)) => Some(V::TargetArray(t.clone())),
        _ => None,
    }
}

/// What was found, for a type-mismatch message: the type, and for arrays the first bad element.
fn describe_found(ty: OptionType, v: &TargetValue) -> String {
    if let (OptionType::StrArray, TargetValue::Array(a)) = (ty, v) {
        if let Some((i, bad)) = a.iter().enumerate().find(|(_, x)| x.as_str().is_none()) {
            return format!("Array with {} at index {i}", bad.type_name());
        }
    }
    v.type_name().to_string()
}

fn mismatch(kind: &TargetKind, opt: &OptionSpec, v: &TargetValue) -> TargetError {
    TargetError::TypeMismatch {
        kind: kind.name().to_string(),
        option: opt.name.clone(),
        expected: opt.ty.name().to_string(),
        found: describe_found(opt.ty, v),
    }
}

/// Validates one option value (TVM's `try_cast`), parsing nested targets.
fn coerce(kind: &TargetKind, opt: &OptionSpec, v: TargetValue) -> TargetResult<TargetValue> {
    match (opt.ty, v) {
        (OptionType::Str, TargetValue::Str(s)) => Ok(TargetValue::Str(s)),
        (OptionType::StrArray, TargetValue::Array(a)) => {
            if a.iter().all(|x| matches!(x, TargetValue::Str(_))) {
                Ok(TargetValue::StrArray(
                    a.into_iter()
                        .filter_map(|x| match x {
                            TargetValue::Str(s) => Some(s),
                            _ => None,
                        })
                        .collect(),
                ))
            } else {
                Err(mismatch(kind, opt, &TargetValue::Array(a)))
            }
        }
        (OptionType::Target, v @ (TargetValue::Str(_) | TargetValue::Map(_))) => {
            let t = parse_host(v).map_err(|e| e.nested(&opt.name))?;
            Ok(TargetValue::Target(Box::new(t)))
        }
        (OptionType::TargetArray, TargetValue::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                let t = match item {
                    TargetValue::Str(s) => parse_str(&s, Level::Nested),
                    TargetValue::Map(m) => from_config(m),
                    TargetValue::Target(t) => Ok(*t),
                    other => {
                        return Err(TargetError::TargetArrayElement {
                            kind: kind.name().to_string(),
                            option: opt.name.clone(),
                            index: i,
                            found: other.type_name().to_string(),
                        })
                    }
                };
                out.push(t.map_err(|e| e.nested(&format!("{}[{i}]", opt.name)))?);
            }
            Ok(TargetValue::TargetArray(out))
        }
        (ty, v) => coerce_plain(ty, &v).ok_or_else(|| mismatch(kind, opt, &v)),
    }
}

/// Checks the config a canonicalizer returned: declared options must have their types
/// (int/bool interchange applied), other keys must be `feature.*`.
fn recheck(kind: &Arc<TargetKind>, resolved: &mut [(String, TargetValue)]) -> TargetResult<()> {
    for (k, v) in resolved.iter_mut() {
        if is_feature(k) {
            continue;
        }
        let Some(opt) = kind.option(k) else {
            return Err(TargetError::Canonicalizer {
                kind: kind.name().to_string(),
                message: format!("set `{k}`, which is neither a declared option nor `feature.*`"),
            });
        };
        if k == "kind" {
            if v.as_str() != Some(kind.name()) {
                return Err(TargetError::Canonicalizer {
                    kind: kind.name().to_string(),
                    message: format!("changed `kind` to {v}"),
                });
            }
            continue;
        }
        let ok = matches!(
            (opt.ty, &*v),
            (OptionType::Int, TargetValue::Int(_))
                | (OptionType::Bool, TargetValue::Bool(_))
                | (OptionType::Str, TargetValue::Str(_))
                | (OptionType::StrArray, TargetValue::StrArray(_))
                | (OptionType::Map, TargetValue::Map(_))
                | (OptionType::Target, TargetValue::Target(_))
                | (OptionType::TargetArray, TargetValue::TargetArray(_))
        );
        if !ok {
            match coerce_plain(opt.ty, v) {
                Some(c) => *v = c,
                None => {
                    return Err(TargetError::Canonicalizer {
                        kind: kind.name().to_string(),
                        message: format!(
                            "set `{k}` to {}, but the option expects {}",
                            describe_found(opt.ty, v),
                            opt.ty.name()
                        ),
                    })
                }
            }
        }
    }
    Ok(())
}
