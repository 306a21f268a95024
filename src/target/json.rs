//! A JSON reader with the behaviour of the reader TVM 0.27 uses for target strings (tvm-ffi's,
//! itself modelled on Python's `json`): the same error messages and positions (`line`, `column`,
//! `char`), `NaN`/`Infinity`/`-Infinity` accepted, integers beyond `i64` read as floats,
//! duplicate keys resolved by the last one, no trailing commas.
//!
//! serde_json is not used here because it rejects `NaN`, which TVM accepts (a `feature.*`
//! attribute may hold it), and its messages differ from the ones TVM users see.

use super::error::{TargetError, TargetResult};
use super::value::TargetValue;

/// How deep arrays and objects may nest before the reader gives up (protects the stack).
const MAX_DEPTH: usize = 256;

/// Parses `text` as one JSON value followed by optional whitespace.
pub(crate) fn parse(text: &str) -> TargetResult<TargetValue> {
    let mut r = Reader {
        chars: text.char_indices().collect(),
        text,
        pos: 0,
    };
    r.skip_ws();
    let v = r.value(0)?;
    r.skip_ws();
    if r.pos < r.chars.len() {
        return Err(r.error("Extra data", r.pos));
    }
    Ok(v)
}

struct Reader<'a> {
    /// (byte offset, char) of every char: positions in errors count chars, as Python does.
    chars: Vec<(usize, char)>,
    text: &'a str,
    pos: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).map(|&(_, c)| c)
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\n' | '\r')) {
            self.pos += 1;
        }
    }

    fn error(&self, message: &str, at: usize) -> TargetError {
        let before = &self.chars[..at.min(self.chars.len())];
        let line = 1 + before.iter().filter(|&&(_, c)| c == '\n').count();
        let column = match before.iter().rposition(|&(_, c)| c == '\n') {
            Some(nl) => at - nl,
            None => at + 1,
        };
        TargetError::Json {
            message: message.to_string(),
            line,
            column,
            offset: at,
        }
    }

    fn starts_with(&self, lit: &str) -> bool {
        let Some(&(b, _)) = self.chars.get(self.pos) else {
            return false;
        };
        self.text[b..].starts_with(lit)
    }

    fn value(&mut self, depth: usize) -> TargetResult<TargetValue> {
        if depth > MAX_DEPTH {
            return Err(self.error("Nesting too deep", self.pos));
        }
        match self.peek() {
            Some('{') => self.object(depth),
            Some('[') => self.array(depth),
            Some('"') => Ok(TargetValue::Str(self.string()?)),
            Some('n') if self.starts_with("null") => {
                self.pos += 4;
                Ok(TargetValue::Null)
            }
            Some('t') if self.starts_with("true") => {
                self.pos += 4;
                Ok(TargetValue::Bool(true))
            }
            Some('f') if self.starts_with("false") => {
                self.pos += 5;
                Ok(TargetValue::Bool(false))
            }
            Some('N') if self.starts_with("NaN") => {
                self.pos += 3;
                Ok(TargetValue::Float(f64::NAN))
            }
            Some('I') if self.starts_with("Infinity") => {
                self.pos += 8;
                Ok(TargetValue::Float(f64::INFINITY))
            }
            Some('-') if self.starts_with("-Infinity") => {
                self.pos += 9;
                Ok(TargetValue::Float(f64::NEG_INFINITY))
            }
            Some('-' | '0'..='9') => self.number(),
            _ => Err(self.error("Expecting value", self.pos)),
        }
    }

    fn number(&mut self) -> TargetResult<TargetValue> {
        let start = self.pos;
        if self.peek() == Some('-') {
            self.pos += 1;
        }
        match self.peek() {
            Some('0') => self.pos += 1,
            Some('1'..='9') => {
                while matches!(self.peek(), Some('0'..='9')) {
                    self.pos += 1;
                }
            }
            _ => return Err(self.error("Expecting value", start)),
        }
        let mut is_float = false;
        // A fraction or exponent counts only if digits follow (Python's number regex).
        if self.peek() == Some('.') && matches!(self.chars.get(self.pos + 1), Some((_, '0'..='9')))
        {
            is_float = true;
            self.pos += 1;
            while matches!(self.peek(), Some('0'..='9')) {
                self.pos += 1;
            }
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            let mut p = self.pos + 1;
            if matches!(self.chars.get(p), Some((_, '+' | '-'))) {
                p += 1;
            }
            if matches!(self.chars.get(p), Some((_, '0'..='9'))) {
                is_float = true;
                self.pos = p;
                while matches!(self.peek(), Some('0'..='9')) {
                    self.pos += 1;
                }
            }
        }
        let b0 = self.chars[start].0;
        let b1 = self
            .chars
            .get(self.pos)
            .map_or(self.text.len(), |&(b, _)| b);
        let lit = &self.text[b0..b1];
        if !is_float {
            if let Ok(i) = lit.parse::<i64>() {
                return Ok(TargetValue::Int(i));
            }
        }
        // Digits only, so this parse cannot fail; NaN would be a bug, not an input error.
        Ok(TargetValue::Float(lit.parse::<f64>().unwrap_or(f64::NAN)))
    }

    fn string(&mut self) -> TargetResult<String> {
        let begin = self.pos;
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(self.error("Unterminated string starting at", begin));
            };
            match c {
                '"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                '\\' => {
                    let esc_at = self.pos;
                    self.pos += 1;
                    let Some(e) = self.peek() else {
                        return Err(self.error("Unterminated string starting at", begin));
                    };
                    self.pos += 1;
                    match e {
                        '"' => out.push('"'),
                        '\\' => out.push('\\'),
                        '/' => out.push('/'),
                        'b' => out.push('\u{8}'),
                        'f' => out.push('\u{c}'),
                        'n' => out.push('\n'),
                        'r' => out.push('\r'),
                        't' => out.push('\t'),
                        'u' => {
                            let hi = self.hex4(esc_at)?;
                            let code = if (0xD800..0xDC00).contains(&hi) && self.starts_with("\\u")
                            {
                                let save = self.pos;
                                self.pos += 2;
                                let lo = self.hex4(save)?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                                } else {
                                    self.pos = save;
                                    hi
                                }
                            } else {
                                hi
                            };
                            // Lone surrogates cannot live in a Rust string.
                            out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
                        }
                        _ => return Err(self.error(&format!("Invalid \\escape: {e:?}"), esc_at)),
                    }
                }
                c if (c as u32) < 0x20 => {
                    return Err(self.error("Invalid control character at", self.pos));
                }
                c => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn hex4(&mut self, esc_at: usize) -> TargetResult<u32> {
        let mut v = 0u32;
        for i in 0..4 {
            match self
                .chars
                .get(self.pos + i)
                .and_then(|&(_, c)| c.to_digit(16))
            {
                Some(d) => v = v * 16 + d,
                None => return Err(self.error("Invalid \\uXXXX escape", esc_at + 1)),
            }
        }
        self.pos += 4;
        Ok(v)
    }

    fn object(&mut self, depth: usize) -> TargetResult<TargetValue> {
        self.pos += 1;
        let mut entries: Vec<(String, TargetValue)> = Vec::new();
        self.skip_ws();
        if self.peek() == Some('}') {
            self.pos += 1;
            return Ok(TargetValue::Map(entries));
        }
        loop {
            if self.peek() != Some('"') {
                return Err(self.error(
                    "Expecting property name enclosed in double quotes",
                    self.pos,
                ));
            }
            let key = self.string()?;
            self.skip_ws();
            if self.peek() != Some(':') {
                return Err(self.error("Expecting ':' delimiter", self.pos));
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value(depth + 1)?;
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => *v = value,
                None => entries.push((key, value)),
            }
            self.skip_ws();
            match self.peek() {
                Some('}') => {
                    self.pos += 1;
                    return Ok(TargetValue::Map(entries));
                }
                Some(',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                _ => return Err(self.error("Expecting ',' delimiter", self.pos)),
            }
        }
    }

    fn array(&mut self, depth: usize) -> TargetResult<TargetValue> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(']') {
            self.pos += 1;
            return Ok(TargetValue::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.peek() {
                Some(']') => {
                    self.pos += 1;
                    return Ok(TargetValue::Array(items));
                }
                Some(',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                _ => return Err(self.error("Expecting ',' delimiter", self.pos)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        match parse(s) {
            Err(TargetError::Json {
                message,
                line,
                column,
                offset,
            }) => format!("{message}: line {line} column {column} (char {offset})"),
            other => panic!("expected a JSON error for {s:?}, got {other:?}"),
        }
    }

    #[test]
    fn errors_match_tvm_positions() {
        assert_eq!(
            err("{\"kind\":\"llvm\""),
            "Expecting ',' delimiter: line 1 column 15 (char 14)"
        );
        assert_eq!(
            err("{'kind':'llvm'}"),
            "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
        );
        assert_eq!(
            err("{\"kind\":\"llvm\",}"),
            "Expecting property name enclosed in double quotes: line 1 column 16 (char 15)"
        );
        assert_eq!(
            err("{\"kind\":\"llvm\"} x"),
            "Extra data: line 1 column 17 (char 16)"
        );
        assert_eq!(
            err("{\n\"a\" 1}"),
            "Expecting ':' delimiter: line 2 column 5 (char 6)"
        );
    }

    #[test]
    fn values() {
        assert_eq!(parse("NaN").ok().map(|v| v.type_name()), Some("Float"));
        assert_eq!(
            parse("9223372036854775808").ok(),
            Some(TargetValue::Float(9223372036854775808.0))
        );
        assert_eq!(
            parse("-9223372036854775808").ok(),
            Some(TargetValue::Int(i64::MIN))
        );
        assert_eq!(
            parse("{\"a\":1,\"a\":2}").ok(),
            Some(TargetValue::Map(vec![("a".into(), TargetValue::Int(2))]))
        );
        assert_eq!(
            parse("\"\\u006b\\ud83d\\ude00\"").ok(),
            Some(TargetValue::Str("k\u{1F600}".into()))
        );
        assert!(parse(&"[".repeat(100_000)).is_err());
    }
}
