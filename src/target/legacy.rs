//! The legacy string form (kiln extension; TVM 0.27 removed it):
//! `KIND [-option=value | -option value | -flag]...` or `TAG -option=value...`.
//!
//! The string is split at whitespace (single or double quotes group words; inside double
//! quotes `\"` and `\\` escape). The first word is a kind name, or a tag name followed by at
//! least one option. Each option is converted to the declared type of the kind's option:
//! integers in decimal, booleans as `1/0/true/false` (a bare `-flag` means true), arrays split at
//! commas, strings as written; `feature.*` values read as boolean, integer or string. The result
//! is then the JSON config `{"kind": KIND, ...}` (or `{"tag": TAG, ...}`), so a legacy string
//! means exactly the same target as its JSON form.
//!
//! Two leniencies keep old strings working: options that TVM removed from the schema long ago
//! and that have no effect on a target (`-system-lib`, `-link-params`, `-runtime`, `-executor`,
//! `-interface-api`, `-unpacked-api`) and bare words that are not options (TVM ≤ 0.6 kept such
//! words as opaque options that nothing read) are ignored with a warning.

use super::error::{TargetError, TargetResult};
use super::kind::OptionType;
use super::parse::{from_config, is_feature, unknown_kind};
use super::value::TargetValue;
use super::{registry, tags, Target};

/// Legacy options TVM dropped from target kinds; accepted and ignored.
const REMOVED: [&str; 6] = [
    "system-lib",
    "link-params",
    "runtime",
    "executor",
    "interface-api",
    "unpacked-api",
];

fn err(input: &str, reason: impl Into<String>) -> TargetError {
    TargetError::Legacy {
        input: input.to_string(),
        reason: reason.into(),
    }
}

/// Splits at whitespace, honouring quotes.
fn tokenize(input: &str) -> TargetResult<Vec<String>> {
    let mut tokens = Vec::new();
    let mut cur = String::new();
    let mut in_token = false;
    let mut chars = input.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_token {
                    tokens.push(std::mem::take(&mut cur));
                    in_token = false;
                }
            }
            '\'' => {
                in_token = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err(err(input, "unterminated single quote")),
                    }
                }
            }
            '"' => {
                in_token = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => cur.push(c),
                            Some(c) => {
                                cur.push('\\');
                                cur.push(c);
                            }
                            None => return Err(err(input, "unterminated double quote")),
                        },
                        Some(c) => cur.push(c),
                        None => return Err(err(input, "unterminated double quote")),
                    }
                }
            }
            c => {
                in_token = true;
                cur.push(c);
            }
        }
    }
    if in_token {
        tokens.push(cur);
    }
    Ok(tokens)
}

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "true" | "True" => Some(true),
        "0" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses a legacy target string.
pub(crate) fn parse(input: &str) -> TargetResult<Target> {
    let tokens = tokenize(input)?;
    let Some(first) = tokens.first() else {
        return Err(err(input, "no target kind (the string is only whitespace)"));
    };
    let mut config: Vec<(String, TargetValue)> = Vec::new();
    let kind = if let Some(kind) = registry::lookup_kind(first) {
        config.push(("kind".into(), TargetValue::Str(first.clone())));
        kind
    } else if let (Some(tag), true) = (tags::lookup(first), tokens.len() > 1) {
        let kind_name = tag
            .iter()
            .find(|(k, _)| k == "kind")
            .and_then(|(_, v)| v.as_str())
            .unwrap_or_default();
        let kind = registry::lookup_kind(kind_name).ok_or_else(|| unknown_kind(kind_name))?;
        config.push(("tag".into(), TargetValue::Str(first.clone())));
        kind
    } else if first.starts_with('{') {
        return Err(err(
            input,
            "a JSON target must start with `{` as its very first character",
        ));
    } else if tokens.len() == 1 {
        return Err(unknown_kind(input));
    } else {
        return Err(unknown_kind(first));
    };

    let mut i = 1;
    while i < tokens.len() {
        let tok = &tokens[i];
        i += 1;
        let Some(body) = tok.strip_prefix("--").or_else(|| tok.strip_prefix('-')) else {
            log::warn!("legacy target string {input:?}: ignoring `{tok}`, which is not an option");
            continue;
        };
        let (key, inline) = match body.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (body, None),
        };
        if key.is_empty() {
            return Err(err(input, format!("`{tok}` has no option name")));
        }
        if inline.as_deref() == Some("") {
            return Err(err(input, format!("`{tok}` has an empty value")));
        }
        let ty = kind.option(key).map(|o| o.ty);
        if ty.is_none() && REMOVED.contains(&key) {
            log::warn!(
                "legacy target string {input:?}: ignoring `-{key}`, which TVM removed from targets"
            );
            if inline.is_none() && tokens.get(i).is_some_and(|t| !t.starts_with('-')) {
                i += 1;
            }
            continue;
        }
        // `-key value`: take the next word unless it is an option, or unless this is a boolean
        // flag and the word is not a boolean.
        let value = match inline {
            Some(v) => Some(v),
            None => match tokens.get(i) {
                Some(next)
                    if !next.starts_with('-')
                        && (ty != Some(OptionType::Bool) || parse_bool(next).is_some()) =>
                {
                    i += 1;
                    Some(next.clone())
                }
                _ => None,
            },
        };
        let found = |v: &str| format!("{v:?}");
        let mismatch = |ty: OptionType, v: &str| TargetError::TypeMismatch {
            kind: kind.name().to_string(),
            option: key.to_string(),
            expected: ty.name().to_string(),
            found: found(v),
        };
        let tv = match (ty, value) {
            (Some(OptionType::Bool), None) => TargetValue::Bool(true),
            (Some(OptionType::Bool), Some(v)) => {
                TargetValue::Bool(parse_bool(&v).ok_or_else(|| mismatch(OptionType::Bool, &v))?)
            }
            (Some(t), None) => {
                return Err(err(
                    input,
                    format!("`-{key}` needs a value of type {t} (`-{key}=...`)"),
                ))
            }
            (Some(OptionType::Int), Some(v)) => {
                TargetValue::Int(v.parse().map_err(|_| mismatch(OptionType::Int, &v))?)
            }
            (Some(OptionType::Str | OptionType::Target), Some(v)) => TargetValue::Str(v),
            (Some(OptionType::StrArray), Some(v)) => TargetValue::Array(
                v.split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| TargetValue::Str(s.to_string()))
                    .collect(),
            ),
            (Some(t @ (OptionType::Map | OptionType::TargetArray)), Some(_)) => {
                return Err(err(
                    input,
                    format!(
                        "`-{key}` has type {t}, which the legacy form cannot express; use JSON"
                    ),
                ))
            }
            // Undeclared: features get a natural type; anything else is passed on as given so
            // that the config check reports it with the list of known options.
            (None, None) => TargetValue::Bool(true),
            (None, Some(v)) if is_feature(key) => match (parse_bool(&v), v.parse::<i64>()) {
                (_, Ok(n)) => TargetValue::Int(n),
                (Some(b), _) => TargetValue::Bool(b),
                _ => TargetValue::Str(v),
            },
            (None, Some(v)) => TargetValue::Str(v),
        };
        match config.iter_mut().find(|(k, _)| k == key) {
            Some((_, old)) => *old = tv,
            None => config.push((key.to_string(), tv)),
        }
    }
    from_config(config)
}

#[cfg(test)]
mod tests {
    use super::tokenize;

    #[test]
    fn tokenizer_honours_quotes() {
        assert_eq!(
            tokenize(r#"vulkan -device_name="GPU with \"spaces\"" -x='a b'"#).ok(),
            Some(vec![
                "vulkan".to_string(),
                "-device_name=GPU with \"spaces\"".to_string(),
                "-x=a b".to_string()
            ])
        );
        assert!(tokenize("llvm -mcpu='x").is_err());
    }
}
