//! [`TargetValue`]: the value of one target attribute, and of a raw (unvalidated) config.

use std::fmt::{self, Write as _};
use std::hash::{Hash, Hasher};

use super::Target;

/// The value of a target attribute.
///
/// Raw configs (straight from JSON) use `Null`, `Bool`, `Int`, `Float`, `Str`, `Array` and `Map`.
/// Validation against a kind's schema turns them into the declared types: an `Array<String>`
/// option becomes [`TargetValue::StrArray`], a target option [`TargetValue::Target`], an array of
/// targets [`TargetValue::TargetArray`]. Values of `feature.*` attributes stay as given.
///
/// Equality and hashing compare floats by their bits, so every value equals itself
/// (NaN included) and `Target` can be `Eq + Hash`.
#[derive(Debug, Clone)]
pub enum TargetValue {
    /// JSON `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// A 64-bit integer.
    Int(i64),
    /// A float (JSON numbers with a fraction or exponent, integers beyond `i64`, NaN, Infinity).
    Float(f64),
    /// A string.
    Str(String),
    /// An array of strings (the validated form of an `Array<String>` option).
    StrArray(Vec<String>),
    /// An untyped array.
    Array(Vec<TargetValue>),
    /// A map with string keys, in insertion order.
    Map(Vec<(String, TargetValue)>),
    /// A nested target.
    Target(Box<Target>),
    /// An array of targets (e.g. `composite`'s `devices`).
    TargetArray(Vec<Target>),
}

impl TargetValue {
    /// The name of this value's type, as used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            TargetValue::Null => "Null",
            TargetValue::Bool(_) => "Boolean",
            TargetValue::Int(_) => "Integer",
            TargetValue::Float(_) => "Float",
            TargetValue::Str(_) => "String",
            TargetValue::StrArray(_) => "Array<String>",
            TargetValue::Array(_) => "Array",
            TargetValue::Map(_) => "Map",
            TargetValue::Target(_) => "Target",
            TargetValue::TargetArray(_) => "Array<Target>",
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            TargetValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Converts a `serde_json` value (numbers beyond `i64` become floats, as in TVM's reader).
    pub fn from_json(v: &serde_json::Value) -> TargetValue {
        match v {
            serde_json::Value::Null => TargetValue::Null,
            serde_json::Value::Bool(b) => TargetValue::Bool(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => TargetValue::Int(i),
                None => TargetValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => TargetValue::Str(s.clone()),
            serde_json::Value::Array(a) => {
                TargetValue::Array(a.iter().map(TargetValue::from_json).collect())
            }
            serde_json::Value::Object(m) => TargetValue::Map(
                m.iter()
                    .map(|(k, v)| (k.clone(), TargetValue::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Converts to a `serde_json` value. Non-finite floats (which JSON cannot hold) become `null`;
    /// [`Display`](fmt::Display) writes them as `NaN`/`Infinity` instead, as TVM does.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            TargetValue::Null => J::Null,
            TargetValue::Bool(b) => J::Bool(*b),
            TargetValue::Int(i) => J::from(*i),
            TargetValue::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            TargetValue::Str(s) => J::String(s.clone()),
            TargetValue::StrArray(a) => J::Array(a.iter().map(|s| J::String(s.clone())).collect()),
            TargetValue::Array(a) => J::Array(a.iter().map(TargetValue::to_json).collect()),
            TargetValue::Map(m) => {
                J::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
            TargetValue::Target(t) => t.export(),
            TargetValue::TargetArray(ts) => J::Array(ts.iter().map(Target::export).collect()),
        }
    }

    /// Writes compact JSON (`NaN`, `Infinity`, `-Infinity` for non-finite floats).
    pub(crate) fn write_json(&self, out: &mut String) {
        match self {
            TargetValue::Null => out.push_str("null"),
            TargetValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            TargetValue::Int(i) => {
                let _ = write!(out, "{i}");
            }
            TargetValue::Float(f) => write_float(*f, out),
            TargetValue::Str(s) => write_json_str(s, out),
            TargetValue::StrArray(a) => {
                out.push('[');
                for (i, s) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_json_str(s, out);
                }
                out.push(']');
            }
            TargetValue::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write_json(out);
                }
                out.push(']');
            }
            TargetValue::Map(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_json_str(k, out);
                    out.push(':');
                    v.write_json(out);
                }
                out.push('}');
            }
            TargetValue::Target(t) => t.write_json(out),
            TargetValue::TargetArray(ts) => {
                out.push('[');
                for (i, t) in ts.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    t.write_json(out);
                }
                out.push(']');
            }
        }
    }
}

fn write_float(f: f64, out: &mut String) {
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f.fract() != 0.0 {
        let _ = write!(out, "{f}");
    } else if f.abs() < 1e16 {
        // Keep a fraction so the value reads back as a float, not an integer.
        let _ = write!(out, "{f:.1}");
    } else {
        let _ = write!(out, "{f:e}");
    }
}

/// Writes `s` as a JSON string literal.
pub(crate) fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

impl PartialEq for TargetValue {
    fn eq(&self, other: &Self) -> bool {
        use TargetValue as V;
        match (self, other) {
            (V::Null, V::Null) => true,
            (V::Bool(a), V::Bool(b)) => a == b,
            (V::Int(a), V::Int(b)) => a == b,
            (V::Float(a), V::Float(b)) => a.to_bits() == b.to_bits(),
            (V::Str(a), V::Str(b)) => a == b,
            (V::StrArray(a), V::StrArray(b)) => a == b,
            (V::Array(a), V::Array(b)) => a == b,
            (V::Map(a), V::Map(b)) => a == b,
            (V::Target(a), V::Target(b)) => a == b,
            (V::TargetArray(a), V::TargetArray(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for TargetValue {}

impl Hash for TargetValue {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            TargetValue::Null => {}
            TargetValue::Bool(b) => b.hash(state),
            TargetValue::Int(i) => i.hash(state),
            TargetValue::Float(f) => f.to_bits().hash(state),
            TargetValue::Str(s) => s.hash(state),
            TargetValue::StrArray(a) => a.hash(state),
            TargetValue::Array(a) => a.hash(state),
            TargetValue::Map(m) => m.hash(state),
            TargetValue::Target(t) => t.hash(state),
            TargetValue::TargetArray(ts) => ts.hash(state),
        }
    }
}

impl fmt::Display for TargetValue {
    /// Compact JSON.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.write_json(&mut s);
        f.write_str(&s)
    }
}

impl From<i64> for TargetValue {
    fn from(v: i64) -> Self {
        TargetValue::Int(v)
    }
}
impl From<bool> for TargetValue {
    fn from(v: bool) -> Self {
        TargetValue::Bool(v)
    }
}
impl From<&str> for TargetValue {
    fn from(v: &str) -> Self {
        TargetValue::Str(v.to_string())
    }
}
impl From<String> for TargetValue {
    fn from(v: String) -> Self {
        TargetValue::Str(v)
    }
}
impl From<Vec<String>> for TargetValue {
    fn from(v: Vec<String>) -> Self {
        TargetValue::StrArray(v)
    }
}
impl From<Target> for TargetValue {
    fn from(v: Target) -> Self {
        TargetValue::Target(Box::new(v))
    }
}
