//! Payloads and headers as BSON, every digit kept: a JSON number is stored as an integer when it
//! is one, as a double when the double prints back as the same text, and as a decimal128
//! otherwise (`1.50`, a 30-digit integer), so a handler gets what was published. Drivers in
//! other languages read the common cases as plain numbers.

use std::str::FromStr;

use mongodb::bson::{Bson, Decimal128, Document};
use serde_json::{Map, Number, Value};

use crate::store::RawJson;

/// The JSON value as BSON; Err names a number no BSON type holds exactly.
pub(super) fn to_bson(value: &Value) -> Result<Bson, String> {
    Ok(match value {
        Value::Null => Bson::Null,
        Value::Bool(b) => Bson::Boolean(*b),
        Value::String(s) => Bson::String(s.clone()),
        Value::Number(n) => number(n)?,
        Value::Array(items) => Bson::Array(items.iter().map(to_bson).collect::<Result<_, _>>()?),
        Value::Object(map) => Bson::Document(to_document(map)?),
    })
}

pub(super) fn to_document(map: &Map<String, Value>) -> Result<Document, String> {
    map.iter()
        .map(|(k, v)| Ok((k.clone(), to_bson(v)?)))
        .collect()
}

fn number(n: &Number) -> Result<Bson, String> {
    // With serde_json's arbitrary precision, a number is its published text.
    let text = n.to_string();
    if let Ok(i) = text.parse::<i64>() {
        if i.to_string() == text {
            return Ok(i32::try_from(i).map_or(Bson::Int64(i), Bson::Int32));
        }
    }
    if let Some(f) = text.parse::<f64>().ok().filter(|f| f.is_finite()) {
        if Number::from_f64(f).is_some_and(|back| back.to_string() == text) {
            return Ok(Bson::Double(f));
        }
    }
    match Decimal128::from_str(&text) {
        Ok(d) if same_number(&d.to_string(), &text) => Ok(Bson::Decimal128(d)),
        _ => Err(format!(
            "the number {text} has more digits than MongoDB's decimal128 holds (34)"
        )),
    }
}

/// Whether two texts of a number say the same decimal, digit for digit (`1E+2` and `1e2`, but
/// not `1.5` and `1.50`): their sign, coefficient and exponent.
fn same_number(a: &str, b: &str) -> bool {
    decimal(a).is_some() && decimal(a) == decimal(b)
}

/// A number's text as sign, digits and exponent.
fn decimal(s: &str) -> Option<(bool, String, i64)> {
    let (negative, s) = s.strip_prefix('-').map_or((false, s), |rest| (true, rest));
    let (mantissa, exponent) = match s.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i64>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    Some((negative, digits.to_owned(), exponent - frac.len() as i64))
}

/// Whether two JSON values are equal as PostgreSQL's jsonb compares them: numbers by value
/// (`1.5` and `1.50` are one number), objects whatever their keys' order.
pub(super) fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            value_of(&x.to_string()).is_some_and(|v| Some(v) == value_of(&y.to_string()))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

/// A number's value: its decimal without trailing zeros, and zero without a sign.
fn value_of(text: &str) -> Option<(bool, String, i64)> {
    let (negative, digits, exponent) = decimal(text)?;
    let trimmed = digits.trim_end_matches('0');
    if trimmed.is_empty() {
        return Some((false, "0".into(), 0));
    }
    let exponent = exponent + (digits.len() - trimmed.len()) as i64;
    Some((negative, trimmed.to_owned(), exponent))
}

/// A stored value as JSON. Types relaybus never writes (dates, ids of other writers) become
/// their extended-JSON form.
/// A document as the text a worker hands its handlers.
pub(super) fn to_raw(value: Value) -> RawJson {
    serde_json::value::to_raw_value(&value).expect("a JSON value always serializes")
}

pub(super) fn to_json(value: &Bson) -> Value {
    match value {
        Bson::Null | Bson::Undefined => Value::Null,
        Bson::Boolean(b) => Value::Bool(*b),
        Bson::String(s) => Value::String(s.clone()),
        Bson::Int32(i) => Value::from(*i),
        Bson::Int64(i) => Value::from(*i),
        Bson::Double(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        Bson::Decimal128(d) => serde_json::from_str::<Number>(&d.to_string())
            .map_or_else(|_| Value::String(d.to_string()), Value::Number),
        Bson::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Bson::Document(doc) => Value::Object(object(doc)),
        other => other.clone().into_relaxed_extjson(),
    }
}

pub(super) fn object(doc: &Document) -> Map<String, Value> {
    doc.iter().map(|(k, v)| (k.clone(), to_json(v))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_equal_as_jsonb_compares_them() {
        let same = |a: &str, b: &str| {
            let (a, b): (Value, Value) = (
                serde_json::from_str(a).unwrap(),
                serde_json::from_str(b).unwrap(),
            );
            same_value(&a, &b)
        };
        assert!(same(
            r#"{"p": 1.50, "q": [1e2, 0.0]}"#,
            r#"{"q": [100, -0], "p": 1.5}"#
        ));
        assert!(!same(r#"{"p": 1.50}"#, r#"{"p": 1.51}"#));
        assert!(!same(r#"{"p": 1.5}"#, r#"{"p": "1.5"}"#));
        assert!(!same(r#"[1, 2]"#, r#"[2, 1]"#));
        assert!(!same(r#"{"a": 1}"#, r#"{"a": 1, "b": 2}"#));
    }

    #[test]
    fn numbers_keep_their_digits_through_bson() {
        let published = r#"{"int":7,"big":123456789012345678901234567890,"price":1.50,"pi":2.75,"neg":-9007199254740993,"exp":1e2,"list":[1,2.5],"null":null}"#;
        let value: Value = serde_json::from_str(published).unwrap();
        let stored = to_bson(&value).unwrap();
        let doc = stored.as_document().unwrap();
        assert_eq!(doc.get("int"), Some(&Bson::Int32(7)));
        assert_eq!(doc.get("pi"), Some(&Bson::Double(2.75)));
        assert_eq!(doc.get("neg"), Some(&Bson::Int64(-9007199254740993)));
        assert!(matches!(doc.get("price"), Some(Bson::Decimal128(_))));
        assert_eq!(
            to_json(&stored).to_string(),
            r#"{"int":7,"big":123456789012345678901234567890,"price":1.50,"pi":2.75,"neg":-9007199254740993,"exp":1e+2,"list":[1,2.5],"null":null}"#
        );
        let too_long: Value = serde_json::from_str(&format!("1.{}", "1".repeat(40))).unwrap();
        assert!(to_bson(&too_long)
            .unwrap_err()
            .contains("more digits than MongoDB's decimal128 holds"));
    }
}
