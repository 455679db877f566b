//! A payload's size as PostgreSQL holds it: the length of jsonb's text form
//! (`biz_data::text`), which the schema bounds (migration 000005) and the API measures, so that
//! both refuse the same payloads.
//!
//! jsonb writes `{"a": 1, "b": [1, 2]}`: a space after each `:` and `,`, no other whitespace,
//! strings re-escaped (`"`, `\`, `\b\f\n\r\t` as two bytes, other control characters as
//! `\u00XX`, everything else as UTF-8), duplicate keys once, and numbers as `numeric` writes
//! them: in full, never with an exponent, keeping the literal's fractional digits.
//!
//! Where this count can differ from the database's: numbers. `serde_json` reads a number with
//! a fraction or an exponent as an `f64` and writes it back in its shortest form (`1e2` as
//! `100.0`, `2.50` as `2.5`, `1e-400` as `0.0`), which is what is counted here (through
//! `numeric`'s rules: `1e-7` is `0.0000001`), while the database keeps the literal's digits.
//! Near the limit either side may then refuse first; the database refuses with its own
//! message, and nothing is written.

use serde_json::Value;

/// The length in bytes of `value` in jsonb's text form.
pub(super) fn jsonb_text_len(value: &Value) -> usize {
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(number) => numeric_text_len(&number.to_string()),
        Value::String(text) => string_len(text),
        Value::Array(items) => {
            2 + items.iter().map(jsonb_text_len).sum::<usize>() + separators(items.len())
        }
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(key, item)| string_len(key) + 2 + jsonb_text_len(item))
                .sum::<usize>()
                + separators(map.len())
        }
    }
}

/// `", "` between `n` items.
fn separators(n: usize) -> usize {
    2 * n.saturating_sub(1)
}

/// A string as jsonb escapes it, quotes included.
fn string_len(text: &str) -> usize {
    2 + text
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// The length of `numeric`'s text for a JSON number literal: the digits written out in full
/// (`1e3` is `1000`, `1.5e-3` is `0.0015`), as many fractional digits as the literal's
/// mantissa has beyond its exponent, no sign on zero.
fn numeric_text_len(literal: &str) -> usize {
    let (negative, unsigned) = match literal.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, literal),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (
            &unsigned[..at],
            unsigned[at + 1..].parse::<i64>().unwrap_or(0),
        ),
        None => (unsigned, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: Vec<u8> = int_part.bytes().chain(frac_part.bytes()).collect();
    // Digits before the decimal point, once the exponent has moved it.
    let point = int_part.len() as i64 + exponent;
    let scale = (frac_part.len() as i64 - exponent).max(0) as usize;
    let int_len = if point <= 0 {
        1
    } else {
        let point = point as usize;
        let first_nonzero = digits
            .iter()
            .position(|&d| d != b'0')
            .unwrap_or(digits.len());
        if first_nonzero >= point {
            1 // "0"
        } else {
            point - first_nonzero
        }
    };
    let zero = digits.iter().all(|&d| d == b'0');
    usize::from(negative && !zero) + int_len + if scale > 0 { 1 + scale } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_as_numeric_writes_them() {
        for (literal, text) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.0", "0.0"),
            ("12", "12"),
            ("-12", "-12"),
            ("1.5", "1.5"),
            ("1.50", "1.50"),
            ("1e3", "1000"),
            ("1E+3", "1000"),
            ("1.5e-3", "0.0015"),
            ("1e-7", "0.0000001"),
            ("-2.5e1", "-25"),
            ("1.500e1", "15.00"),
            ("0.00e0", "0.00"),
            ("123.456e1", "1234.56"),
        ] {
            assert_eq!(numeric_text_len(literal), text.len(), "{literal} -> {text}");
        }
    }

    #[test]
    fn structure_and_strings_as_jsonb_writes_them() {
        for (json, text) in [
            (r#"{}"#, r#"{}"#),
            (r#"[]"#, r#"[]"#),
            (
                r#"{"a":1,"b":[1,2,null,true,false]}"#,
                r#"{"a": 1, "b": [1, 2, null, true, false]}"#,
            ),
            (r#""tab\tquote\"é\u0001""#, r#""tab\tquote\"é\u0001""#),
            (r#"{"a":1,"a":22}"#, r#"{"a": 22}"#),
            (r#""\u00e9\/""#, r#""é/""#),
        ] {
            let value: Value = serde_json::from_str(json).unwrap();
            assert_eq!(jsonb_text_len(&value), text.len(), "{json} -> {text}");
        }
    }
}
