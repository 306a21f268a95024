//! [`TargetKind`]: a kind's name, device type, default keys, typed option schema and
//! canonicalizer; [`TargetKindBuilder`] to declare one; [`Config`], the map a canonicalizer edits.

use std::fmt;
use std::sync::Arc;

use super::error::{TargetError, TargetResult};
use super::value::TargetValue;
use super::Target;

/// The declared type of a target option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OptionType {
    /// `int` (a JSON boolean is accepted and becomes 0/1, as in TVM).
    Int,
    /// `bool` (a JSON integer is accepted: non-zero is true, as in TVM).
    Bool,
    /// `str`.
    Str,
    /// `Array<str>`: every element must be a string.
    StrArray,
    /// `Map<str, Any>`: a JSON object with values of any type.
    Map,
    /// A target: a target, a string or an object.
    Target,
    /// `Array<Target>`: each element a target, a string or an object.
    TargetArray,
}

impl OptionType {
    /// The type's name in messages and listings.
    pub fn name(self) -> &'static str {
        match self {
            OptionType::Int => "Integer",
            OptionType::Bool => "Boolean",
            OptionType::Str => "String",
            OptionType::StrArray => "Array<String>",
            OptionType::Map => "Map",
            OptionType::Target => "Target",
            OptionType::TargetArray => "Array<Target>",
        }
    }

    /// TVM's spelling of the type (`int`, `bool`, `str`, `Array<str>`, ...).
    pub fn tvm_name(self) -> &'static str {
        match self {
            OptionType::Int => "int",
            OptionType::Bool => "bool",
            OptionType::Str => "str",
            OptionType::StrArray => "Array<str>",
            OptionType::Map => "Map<str, Any>",
            OptionType::Target => "Target",
            OptionType::TargetArray => "Array<Target>",
        }
    }
}

impl fmt::Display for OptionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Rust types that can be the type of an option: `i64`, `bool`, `String`, `Vec<String>`,
/// [`Target`], `Vec<Target>`.
pub trait OptionValueType {
    /// The option type this Rust type declares.
    const TYPE: OptionType;
    /// The default value as a [`TargetValue`].
    fn into_value(self) -> TargetValue;
}

impl OptionValueType for i64 {
    const TYPE: OptionType = OptionType::Int;
    fn into_value(self) -> TargetValue {
        TargetValue::Int(self)
    }
}
impl OptionValueType for bool {
    const TYPE: OptionType = OptionType::Bool;
    fn into_value(self) -> TargetValue {
        TargetValue::Bool(self)
    }
}
impl OptionValueType for String {
    const TYPE: OptionType = OptionType::Str;
    fn into_value(self) -> TargetValue {
        TargetValue::Str(self)
    }
}
impl OptionValueType for Vec<String> {
    const TYPE: OptionType = OptionType::StrArray;
    fn into_value(self) -> TargetValue {
        TargetValue::StrArray(self)
    }
}
impl OptionValueType for Vec<(String, TargetValue)> {
    const TYPE: OptionType = OptionType::Map;
    fn into_value(self) -> TargetValue {
        TargetValue::Map(self)
    }
}
impl OptionValueType for Target {
    const TYPE: OptionType = OptionType::Target;
    fn into_value(self) -> TargetValue {
        TargetValue::Target(Box::new(self))
    }
}
impl OptionValueType for Vec<Target> {
    const TYPE: OptionType = OptionType::TargetArray;
    fn into_value(self) -> TargetValue {
        TargetValue::TargetArray(self)
    }
}

/// One declared option of a kind.
#[derive(Debug, Clone, PartialEq)]
pub struct OptionSpec {
    /// The option's name (e.g. `mcpu`).
    pub name: String,
    /// Its type.
    pub ty: OptionType,
    /// The value used when the config does not give one.
    pub default: Option<TargetValue>,
}

/// A kind's canonicalizer (TVM's "target parser"): runs after validation and defaults, may
/// rewrite any attribute (including `keys`) and add `feature.*` attributes.
pub type Canonicalizer = Arc<dyn Fn(&mut Config) -> TargetResult<()> + Send + Sync>;

/// The options every kind declares first, in this order (as TVM's registration macro does).
pub const BASE_OPTIONS: [(&str, OptionType); 9] = [
    ("kind", OptionType::Str),
    ("keys", OptionType::StrArray),
    ("tag", OptionType::Str),
    ("device", OptionType::Str),
    ("model", OptionType::Str),
    ("libs", OptionType::StrArray),
    ("host", OptionType::Target),
    ("from_device", OptionType::Int),
    ("target_device_type", OptionType::Int),
];

/// A target kind: what a target of this kind may say and how it is canonicalized.
pub struct TargetKind {
    name: String,
    device_type: i32,
    default_keys: Vec<String>,
    options: Vec<OptionSpec>,
    canonicalizer: Option<Canonicalizer>,
}

impl fmt::Debug for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetKind")
            .field("name", &self.name)
            .field("device_type", &self.device_type)
            .field("default_keys", &self.default_keys)
            .field("options", &self.options)
            .field("canonicalizer", &self.canonicalizer.is_some())
            .finish()
    }
}

impl TargetKind {
    /// Starts declaring a kind. `device_type` is the DLPack device code (cpu 1, cuda 2, ...).
    pub fn builder(name: impl Into<String>, device_type: i32) -> TargetKindBuilder {
        TargetKindBuilder {
            name: name.into(),
            device_type,
            default_keys: Vec::new(),
            options: BASE_OPTIONS
                .iter()
                .map(|(n, ty)| OptionSpec {
                    name: (*n).to_string(),
                    ty: *ty,
                    default: None,
                })
                .collect(),
            canonicalizer: None,
        }
    }

    /// The kind's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The DLPack device type code of targets of this kind.
    pub fn device_type(&self) -> i32 {
        self.device_type
    }

    /// Keys a target gets when its config gives none.
    pub fn default_keys(&self) -> &[String] {
        &self.default_keys
    }

    /// All options, the nine common ones first, then the kind's own, in declaration order.
    pub fn options(&self) -> &[OptionSpec] {
        &self.options
    }

    /// The kind's own options (without the nine every kind has).
    pub fn own_options(&self) -> &[OptionSpec] {
        &self.options[BASE_OPTIONS.len().min(self.options.len())..]
    }

    /// The option called `name`.
    pub fn option(&self, name: &str) -> Option<&OptionSpec> {
        self.options.iter().find(|o| o.name == name)
    }

    /// Whether the kind has a canonicalizer.
    pub fn has_canonicalizer(&self) -> bool {
        self.canonicalizer.is_some()
    }

    pub(crate) fn canonicalizer(&self) -> Option<&Canonicalizer> {
        self.canonicalizer.as_ref()
    }

    /// The kind's schema as JSON (for `kiln kinds --json`).
    pub fn to_json(&self) -> serde_json::Value {
        let options: Vec<serde_json::Value> = self
            .options
            .iter()
            .map(|o| {
                let mut m = serde_json::Map::new();
                m.insert("name".into(), o.name.clone().into());
                m.insert("type".into(), o.ty.tvm_name().into());
                if let Some(d) = &o.default {
                    m.insert("default".into(), d.to_json());
                }
                serde_json::Value::Object(m)
            })
            .collect();
        serde_json::json!({
            "name": self.name,
            "device_type": self.device_type,
            "default_keys": self.default_keys,
            "canonicalizer": self.canonicalizer.is_some(),
            "options": options,
        })
    }
}

/// Declares a [`TargetKind`]; see [`TargetKind::builder`]. Errors (an option declared twice) are
/// reported by [`build`](Self::build) and [`register`](Self::register).
#[must_use = "a builder does nothing until `register()` or `build()`"]
pub struct TargetKindBuilder {
    name: String,
    device_type: i32,
    default_keys: Vec<String>,
    options: Vec<OptionSpec>,
    canonicalizer: Option<Canonicalizer>,
}

impl TargetKindBuilder {
    /// Declares an option of Rust type `T` (`i64`, `bool`, `String`, `Vec<String>`, ...)
    /// with an optional default.
    pub fn option<T: OptionValueType>(self, name: impl Into<String>, default: Option<T>) -> Self {
        self.option_typed(name, T::TYPE, default.map(T::into_value))
    }

    /// Declares an option by [`OptionType`]. The default, if any, must have that type.
    pub fn option_typed(
        mut self,
        name: impl Into<String>,
        ty: OptionType,
        default: Option<TargetValue>,
    ) -> Self {
        self.options.push(OptionSpec {
            name: name.into(),
            ty,
            default,
        });
        self
    }

    /// Sets the keys a target of this kind gets when its config gives none.
    pub fn default_keys<I, S>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.default_keys = keys.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the canonicalizer.
    pub fn canonicalizer<F>(mut self, f: F) -> Self
    where
        F: Fn(&mut Config) -> TargetResult<()> + Send + Sync + 'static,
    {
        self.canonicalizer = Some(Arc::new(f));
        self
    }

    /// Checks the declaration and returns the kind, without registering it.
    ///
    /// # Errors
    /// [`TargetError::DuplicateOption`] if an option name is used twice (the nine common
    /// options included); [`TargetError::Canonicalizer`] if a default has the wrong type.
    pub fn build(self) -> TargetResult<TargetKind> {
        for (i, o) in self.options.iter().enumerate() {
            if self.options[..i].iter().any(|p| p.name == o.name) {
                return Err(TargetError::DuplicateOption {
                    kind: self.name,
                    option: o.name.clone(),
                });
            }
            if let Some(d) = &o.default {
                if super::parse::coerce_plain(o.ty, d).is_none() {
                    return Err(TargetError::TypeMismatch {
                        kind: self.name.clone(),
                        option: o.name.clone(),
                        expected: o.ty.name().to_string(),
                        found: format!("default value of type {}", d.type_name()),
                    });
                }
            }
        }
        Ok(TargetKind {
            name: self.name,
            device_type: self.device_type,
            default_keys: self.default_keys,
            options: self.options,
            canonicalizer: self.canonicalizer,
        })
    }

    /// Builds the kind and adds it to the global registry.
    ///
    /// # Errors
    /// As [`build`](Self::build), and [`TargetError::DuplicateKind`] if the name is taken.
    pub fn register(self) -> TargetResult<Arc<TargetKind>> {
        super::registry::register_kind(self)
    }
}

/// A target config being canonicalized: attribute name to value, in insertion order.
///
/// It holds `kind`, every option given or defaulted, and `keys` only if the config gave keys.
/// Canonicalizers read and rewrite it; kiln validates what they leave behind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    entries: Vec<(String, TargetValue)>,
}

impl Config {
    pub(crate) fn from_entries(entries: Vec<(String, TargetValue)>) -> Config {
        Config { entries }
    }

    pub(crate) fn into_entries(self) -> Vec<(String, TargetValue)> {
        self.entries
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&TargetValue> {
        self.entries.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// Whether `name` is set.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The string value of `name`, if it is a string.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(TargetValue::as_str)
    }

    /// The integer value of `name`, if it is an integer (or a boolean, as 0/1).
    pub fn get_int(&self, name: &str) -> Option<i64> {
        match self.get(name)? {
            TargetValue::Int(i) => Some(*i),
            TargetValue::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    /// The boolean value of `name`, if it is a boolean (or an integer, non-zero is true).
    pub fn get_bool(&self, name: &str) -> Option<bool> {
        match self.get(name)? {
            TargetValue::Bool(b) => Some(*b),
            TargetValue::Int(i) => Some(*i != 0),
            _ => None,
        }
    }

    /// The string-array value of `name`.
    pub fn get_str_array(&self, name: &str) -> Option<&[String]> {
        match self.get(name)? {
            TargetValue::StrArray(a) => Some(a),
            _ => None,
        }
    }

    /// Sets `name` (replacing the value in place, or appending).
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<TargetValue>) {
        let name = name.into();
        let value = value.into();
        match self.entries.iter_mut().find(|(k, _)| *k == name) {
            Some((_, v)) => *v = value,
            None => self.entries.push((name, value)),
        }
    }

    /// Removes `name`, returning its value.
    pub fn remove(&mut self, name: &str) -> Option<TargetValue> {
        let i = self.entries.iter().position(|(k, _)| k == name)?;
        Some(self.entries.remove(i).1)
    }

    /// All entries, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &TargetValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }
}
