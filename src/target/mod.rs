//! Targets: what to compile for, read exactly as TVM 0.27 reads them.
//!
//! # Design
//!
//! A [`Target`] is a validated, canonical description of a device to compile for: a
//! [`TargetKind`] (`llvm`, `cuda`, ...), a `tag` annotation, `keys` (generic names used to pick
//! schedules, e.g. `["cuda", "gpu"]`), an optional `host` target, and typed attributes.
//!
//! A kind is a schema: a name, a DLPack device type, default keys, typed options with optional
//! defaults kept in declaration order ([`OptionSpec`]), and a canonicalizer (TVM's "target
//! parser") that may rewrite the config after validation — e.g. `llvm` fills in the default
//! triple and Arm feature flags, `cuda` checks the arch. Kinds live in a global registry
//! ([`list_kinds`], [`register_kind`]); the built-ins carry TVM 0.27's schemas. Tags are named
//! configs ([`list_tags`], [`register_tag`]); TVM 0.27's 287 tags ship with the crate.
//!
//! Parsing ([`Target::parse`], [`Target::from_json`]) follows TVM 0.27's algorithm step by step
//! (see `parse.rs`): tag names, JSON objects (with TVM's JSON reader quirks), bare kind names,
//! `tag` + overrides, `host` nested to any depth, `keys`/`device` merging, `feature.*`
//! attributes, and TVM's only type coercion (integers and booleans interchange). kiln adds the
//! legacy string form (`llvm -mcpu=znver3 -mattr=+avx2,+fma`) at the top level. `"mcpu":
//! "native"` is kept as written, as TVM keeps it (a target string means the same on every
//! machine); code generation resolves it to the host CPU, and [`Target::resolve_native`] shows
//! what it resolves to. Errors ([`TargetError`]) say what was expected, what was
//! found and where, and list the known names when a name is unknown.
//!
//! Export ([`Target::export`]) gives canonical JSON in a stable order — kind, tag, keys, host,
//! then options in declaration order, then `feature.*` sorted — and `Display` is the same as
//! compact JSON. `Target::parse(&t.to_string()) == t` for every target.
//!
//! # Example: a kind of your own
//!
//! ```
//! use kiln::target::{Target, TargetKind, TargetResult};
//!
//! # fn main() -> TargetResult<()> {
//! TargetKind::builder("my_accel", 12)
//!     .option::<i64>("num-cores", Some(4))
//!     .option::<String>("version", None)
//!     .default_keys(["my_accel", "npu"])
//!     .canonicalizer(|cfg| {
//!         if cfg.get_str("version").is_none() {
//!             cfg.set("version", "v2");
//!         }
//!         Ok(())
//!     })
//!     .register()?;
//!
//! let t = Target::parse(r#"{"kind": "my_accel", "num-cores": 8}"#)?;
//! assert_eq!(t.get_int("num-cores"), Some(8));
//! assert_eq!(t.get_str("version"), Some("v2"));
//! assert_eq!(t.keys(), ["my_accel", "npu"]);
//! assert_eq!(
//!     t.to_string(),
//!     r#"{"kind":"my_accel","tag":"","keys":["my_accel","npu"],"num-cores":8,"version":"v2"}"#
//! );
//! // The legacy form means the same target.
//! assert_eq!(Target::parse("my_accel -num-cores=8")?, t);
//! # Ok(())
//! # }
//! ```

mod builtin;
mod error;
mod json;
mod kind;
mod legacy;
mod parse;
mod registry;
mod tags;
mod value;

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::Arc;

pub use builtin::{
    arm_features, cpu_has_avx512, cpu_l2_bytes, cpu_vector_bits, default_triple, feature_flag,
    has_avx512, host_caches, host_cpu, l2_bytes, ArmFeatures, CacheSizes,
};
pub use error::{TargetError, TargetResult};
pub use kind::{
    Canonicalizer, Config, OptionSpec, OptionType, OptionValueType, TargetKind, TargetKindBuilder,
    BASE_OPTIONS,
};
pub use registry::{list_kinds, lookup_kind, register_kind};
pub use tags::{list_tags, register_tag, TargetTag};
pub use value::TargetValue;

/// A validated, canonical target.
#[derive(Clone)]
pub struct Target {
    kind: Arc<TargetKind>,
    tag: String,
    keys: Vec<String>,
    host: Option<Box<Target>>,
    /// Declared options in declaration order, then `feature.*` sorted by name.
    attrs: Vec<(String, TargetValue)>,
}

impl Target {
    pub(crate) fn from_parts(
        kind: Arc<TargetKind>,
        tag: String,
        keys: Vec<String>,
        host: Option<Box<Target>>,
        attrs: Vec<(String, TargetValue)>,
    ) -> Target {
        Target {
            kind,
            tag,
            keys,
            host,
            attrs,
        }
    }

    /// Parses a target string: a tag name, a JSON object, a kind name, or (kiln extension) the
    /// legacy `kind -option=value ...` form.
    ///
    /// # Errors
    /// Any [`TargetError`] about the input: malformed JSON, unknown kind/tag/option, type
    /// mismatch, a value the kind's canonicalizer rejects.
    pub fn parse(s: &str) -> TargetResult<Target> {
        parse::parse_str(s, parse::Level::Top)
    }

    /// Builds a target from a JSON value: an object (a target config) or a string (as
    /// [`Target::parse`]).
    ///
    /// # Errors
    /// As [`Target::parse`]; [`TargetError::NotATarget`] for other JSON values.
    pub fn from_json(v: &serde_json::Value) -> TargetResult<Target> {
        parse::from_value(TargetValue::from_json(v), parse::Level::Top)
    }

    /// Builds a target from a config given as a [`TargetValue`] (a map, a string or a target).
    ///
    /// # Errors
    /// As [`Target::from_json`].
    pub fn from_value(v: TargetValue) -> TargetResult<Target> {
        parse::from_value(v, parse::Level::Top)
    }

    /// This target with `host` as its host (replacing any host it had, as TVM does).
    #[must_use]
    pub fn with_host(mut self, host: Target) -> Target {
        self.host = Some(Box::new(host));
        self
    }

    /// This target without a host.
    #[must_use]
    pub fn without_host(mut self) -> Target {
        self.host = None;
        self
    }

    /// The kind.
    pub fn kind(&self) -> &Arc<TargetKind> {
        &self.kind
    }

    /// The kind's name.
    pub fn kind_name(&self) -> &str {
        self.kind.name()
    }

    /// The DLPack device type: `target_device_type` if set, else the kind's.
    pub fn device_type(&self) -> i32 {
        match self.get_int("target_device_type") {
            Some(d) => i32::try_from(d).unwrap_or(self.kind.device_type()),
            None => self.kind.device_type(),
        }
    }

    /// The tag annotation (`""` if none).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The keys.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The host target.
    pub fn host(&self) -> Option<&Target> {
        self.host.as_deref()
    }

    /// All attributes (options and `feature.*`), in canonical order.
    pub fn attrs(&self) -> impl Iterator<Item = (&str, &TargetValue)> {
        self.attrs.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The attribute `name` (an option or a `feature.*`).
    pub fn attr(&self, name: &str) -> Option<&TargetValue> {
        self.attrs.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// The string attribute `name`.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.attr(name).and_then(TargetValue::as_str)
    }

    /// The integer attribute `name`.
    pub fn get_int(&self, name: &str) -> Option<i64> {
        match self.attr(name)? {
            TargetValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The boolean attribute `name`.
    pub fn get_bool(&self, name: &str) -> Option<bool> {
        match self.attr(name)? {
            TargetValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The string-array attribute `name`.
    pub fn get_str_array(&self, name: &str) -> Option<&[String]> {
        match self.attr(name)? {
            TargetValue::StrArray(a) => Some(a),
            _ => None,
        }
    }

    /// The feature `feature.<name>` (e.g. `feature("has_asimd")`).
    pub fn feature(&self, name: &str) -> Option<&TargetValue> {
        self.attrs
            .iter()
            .find(|(k, _)| k.strip_prefix("feature.") == Some(name))
            .map(|(_, v)| v)
    }

    /// This target with every `"mcpu": "native"` of an `llvm` target (itself, its host, and its
    /// host's host) replaced by the host CPU's name, and `mattr` by the host's LLVM features
    /// (sorted by name) followed by the `mattr` given: the CPU and features code generation
    /// uses on this machine. Other targets are returned unchanged, as is `native` when kiln is
    /// built without the `llvm` feature (nothing can resolve it).
    ///
    /// The result is a plain target naming this machine's CPU: parsed anywhere, it compiles
    /// the code `native` compiles here.
    ///
    /// # Errors
    /// None in practice: the resolved config is parsed again, which the canonicalizer could in
    /// principle reject.
    pub fn resolve_native(&self) -> TargetResult<Target> {
        let host = match &self.host {
            Some(h) => Some(h.resolve_native()?),
            None => None,
        };
        let native = self.kind.name() == "llvm" && self.get_str("mcpu") == Some("native");
        let resolved = match (native, host_cpu()) {
            (true, Some((name, features))) => {
                let mut config = match self.clone().without_host().export() {
                    serde_json::Value::Object(m) => m,
                    _ => unreachable!("an export is an object"),
                };
                let mut mattr = features.clone();
                mattr.extend(
                    self.get_str_array("mattr")
                        .unwrap_or_default()
                        .iter()
                        .cloned(),
                );
                config.insert("mcpu".into(), name.clone().into());
                config.insert("mattr".into(), mattr.into());
                Target::from_json(&serde_json::Value::Object(config))?
            }
            _ => self.clone().without_host(),
        };
        Ok(match host {
            Some(h) => resolved.with_host(h),
            None => resolved,
        })
    }

    /// The canonical export: `{kind, tag, keys, [host], options in declaration order,
    /// feature.* sorted}`. Non-finite floats (only possible in `feature.*`) become `null`.
    pub fn export(&self) -> serde_json::Value {
        let mut m = serde_json::Map::with_capacity(self.attrs.len() + 4);
        m.insert("kind".into(), self.kind.name().into());
        m.insert("tag".into(), self.tag.clone().into());
        m.insert(
            "keys".into(),
            serde_json::Value::Array(self.keys.iter().map(|k| k.clone().into()).collect()),
        );
        if let Some(h) = &self.host {
            m.insert("host".into(), h.export());
        }
        for (k, v) in &self.attrs {
            m.insert(k.clone(), v.to_json());
        }
        serde_json::Value::Object(m)
    }

    /// Writes the compact JSON of the export.
    pub(crate) fn write_json(&self, out: &mut String) {
        out.push_str("{\"kind\":");
        value::write_json_str(self.kind.name(), out);
        out.push_str(",\"tag\":");
        value::write_json_str(&self.tag, out);
        out.push_str(",\"keys\":[");
        for (i, k) in self.keys.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            value::write_json_str(k, out);
        }
        out.push(']');
        if let Some(h) = &self.host {
            out.push_str(",\"host\":");
            h.write_json(out);
        }
        for (k, v) in &self.attrs {
            out.push(',');
            value::write_json_str(k, out);
            out.push(':');
            v.write_json(out);
        }
        out.push('}');
    }
}

impl fmt::Display for Target {
    /// Compact canonical JSON (parses back to an equal target).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::with_capacity(128);
        self.write_json(&mut s);
        f.write_str(&s)
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Target({self})")
    }
}

impl PartialEq for Target {
    fn eq(&self, other: &Self) -> bool {
        self.kind.name() == other.kind.name()
            && self.tag == other.tag
            && self.keys == other.keys
            && self.host == other.host
            && self.attrs == other.attrs
    }
}

impl Eq for Target {}

impl Hash for Target {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.kind.name().hash(state);
        self.tag.hash(state);
        self.keys.hash(state);
        self.host.hash(state);
        self.attrs.hash(state);
    }
}

impl FromStr for Target {
    type Err = TargetError;
    fn from_str(s: &str) -> TargetResult<Target> {
        Target::parse(s)
    }
}
