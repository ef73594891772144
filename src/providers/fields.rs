//! Strict readers shared by the payload mappings: no coercion, no trimming, no
//! defaults. A missing or ill-typed field is a [`Reject::Invalid`] whose
//! message names the field by its path in the payload (`data.object.amount`).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::scheme::Reject;

pub(crate) type Object = Map<String, Value>;

/// A header a signature scheme needs: present, ASCII and not empty, else 401
/// naming it.
pub(crate) fn signed_header<'a>(
    headers: &'a http::HeaderMap,
    name: &str,
) -> Result<&'a str, Reject> {
    let value = headers
        .get(name)
        .ok_or_else(|| Reject::Unauthorized(format!("missing {name} header")))?
        .to_str()
        .map_err(|_| Reject::Unauthorized(format!("{name} header is not ASCII")))?;
    if value.is_empty() {
        return Err(Reject::Unauthorized(format!("{name} header is empty")));
    }
    Ok(value)
}

/// The signature in header `name` (`shown`: as the PSP spells it), hex of
/// either case around optional white space; else 401 naming the header.
pub(crate) fn hex_signature(
    headers: &http::HeaderMap,
    name: &str,
    shown: &str,
) -> Result<Vec<u8>, Reject> {
    let header = signed_header(headers, name)?;
    hex::decode(header.trim())
        .map_err(|_| Reject::Unauthorized(format!("malformed {shown}: not hex")))
}

/// A signature check as a delivery's answer: `Ok` when it `matched`, else
/// 401 that the signature does not match.
pub(crate) fn signature_matched(matched: bool) -> Result<(), Reject> {
    if matched {
        Ok(())
    } else {
        Err(Reject::Unauthorized("signature does not match".to_owned()))
    }
}

/// The `event_id` of a JSON body's envelope (the PSP's id of the event, for
/// searching), when it has one; nothing else of the body is read.
pub(crate) fn envelope_event_id(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        event_id: String,
    }
    serde_json::from_slice::<Envelope>(body)
        .ok()
        .map(|e| e.event_id)
}

pub(crate) fn invalid(msg: impl Into<String>) -> Reject {
    Reject::Invalid(msg.into())
}

/// Parses the body as JSON, refusing any object that repeats a key, at any
/// depth (also when spelled differently: `"amount"` and `"\u0061mount"`).
///
/// serde_json alone keeps the last of two values; other parsers keep the
/// first. A body whose `amount` is 1000 to the system that signed or shows
/// it could then be booked here as 9999: such a body means nothing
/// definite, so it is refused (RFC 8259 §4: names "SHOULD be unique").
///
/// Parsed through serde_json's own `Deserializer`, so its recursion limit
/// (128) still bounds nesting: a hostile body is an error here, never a stack
/// overflow.
pub(crate) fn parse_json(body: &[u8]) -> Result<Value, Reject> {
    let mut de = serde_json::Deserializer::from_slice(body);
    UniqueKeys
        .deserialize(&mut de)
        .and_then(|value| de.end().map(|()| value))
        .map_err(|e| invalid(format!("body is not valid JSON: {e}")))
}

/// Longest part of a repeated key shown in the refusal (it comes from the
/// sender, and goes back to it and into the log).
const SHOWN_KEY_CHARS: usize = 64;

/// Builds a [`Value`] exactly as serde_json's own does, but fails on the
/// first key an object repeats.
struct UniqueKeys;

impl<'de> DeserializeSeed<'de> for UniqueKeys {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(UniqueKeys)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Object::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                let shown = key
                    .char_indices()
                    .nth(SHOWN_KEY_CHARS)
                    .map_or(key.as_str(), |(end, _)| &key[..end]);
                return Err(de::Error::custom(format_args!("repeated key {shown:?}")));
            }
            let value = map.next_value_seed(UniqueKeys)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// The value at `key`, `None` when absent or `null`.
pub(crate) fn opt<'a>(obj: &'a Object, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// A string field that may be absent (or `null`).
pub(crate) fn opt_str<'a>(
    obj: &'a Object,
    key: &str,
    path: &str,
) -> Result<Option<&'a str>, Reject> {
    match opt(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(invalid(format!("{path} must be a string"))),
    }
}

/// The merchant's reference at `key` (`merchant_reference` of the
/// canonical event): a non-empty string, else `None`. Never a reason to
/// refuse a delivery — it moves no money — so another type is passed over
/// as absent. Allocates only when there is one.
pub(crate) fn merchant_reference(obj: &Object, key: &str) -> Option<String> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

pub(crate) fn req_str<'a>(obj: &'a Object, key: &str, path: &str) -> Result<&'a str, Reject> {
    opt_str(obj, key, path)?.ok_or_else(|| invalid(format!("{path} is required")))
}

pub(crate) fn req_object<'a>(obj: &'a Object, key: &str, path: &str) -> Result<&'a Object, Reject> {
    match opt(obj, key) {
        None => Err(invalid(format!("{path} is required"))),
        Some(Value::Object(o)) => Ok(o),
        Some(_) => Err(invalid(format!("{path} must be an object"))),
    }
}

/// An amount in minor units: a JSON integer above 0 that fits an i64. Floats
/// (even `10.0` or `1e3`), strings, zero and negatives are refused.
pub(crate) fn amount_minor(v: Option<&Value>, path: &str) -> Result<i64, Reject> {
    match v {
        None | Some(Value::Null) => Err(invalid(format!("{path} is required"))),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(a) if a > 0 => Ok(a),
            Some(_) => Err(invalid(format!("{path} must be greater than 0"))),
            None if n.is_u64() => Err(invalid(format!("{path} is too large"))),
            None => Err(invalid(format!(
                "{path} must be an integer in minor units, not a float"
            ))),
        },
        Some(_) => Err(invalid(format!(
            "{path} must be an integer in minor units (got a non-number)"
        ))),
    }
}

/// An amount written as a decimal string in major units (`"20.00"` yuan,
/// `"1234"` JPY) converted exactly to minor units with `exponent` fraction
/// digits: digits, optionally a point and 1 to `exponent` more digits, above
/// zero. No float is ever involved; `20.001` (for exponent 2), `1e2`, `-1`,
/// `+1`, `1,00`, `.5`, `5.`, ` 5` and values beyond an i64 are refused.
pub(crate) fn decimal_minor(text: &str, exponent: u32, path: &str) -> Result<i64, Reject> {
    let bad = |why: &str| invalid(format!("{path} must be {why} (got {:?})", shown(text)));
    let (whole, fraction) = match text.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || fraction.is_some_and(|f| !digits(f)) {
        return Err(bad("a decimal number of digits with an optional point"));
    }
    let fraction = fraction.unwrap_or("");
    if fraction.len() > exponent as usize {
        return Err(bad(&format!(
            "exact in minor units: at most {exponent} digits after the point"
        )));
    }
    let scale = 10i64.pow(exponent);
    let too_large = || bad("at most an i64 in minor units");
    let whole: i64 = whole.parse().map_err(|_| too_large())?;
    let mut minor_fraction: i64 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| too_large())?
    };
    for _ in fraction.len()..exponent as usize {
        minor_fraction *= 10;
    }
    let minor = whole
        .checked_mul(scale)
        .and_then(|m| m.checked_add(minor_fraction))
        .ok_or_else(too_large)?;
    if minor == 0 {
        return Err(invalid(format!("{path} must be greater than 0")));
    }
    Ok(minor)
}

/// At most 32 characters of a value sent back in a refusal.
fn shown(text: &str) -> &str {
    text.char_indices()
        .nth(32)
        .map_or(text, |(end, _)| &text[..end])
}

/// 1–255 printable ASCII, no leading or trailing whitespace (rejected, not trimmed).
pub fn check_transaction_id(id: &str) -> Result<(), Reject> {
    if id.is_empty() || id.len() > 255 {
        return Err(invalid("transaction_id must be 1 to 255 characters"));
    }
    if !id.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(invalid("transaction_id must be printable ASCII"));
    }
    if id.starts_with(' ') || id.ends_with(' ') {
        return Err(invalid("transaction_id has leading or trailing whitespace"));
    }
    Ok(())
}

/// ISO 4217 form: three upper-case ASCII letters.
pub fn check_currency(c: &str) -> Result<(), Reject> {
    if c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(())
    } else {
        Err(invalid(
            "currency must be an ISO 4217 code: three upper-case letters",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::amount::{major_amount, minor_unit_exponent};

    fn refusal(body: &str) -> String {
        match parse_json(body.as_bytes()) {
            Err(Reject::Invalid(why)) => why,
            other => panic!("{body}: expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_repeated_key_is_refused_and_named_whatever_its_values() {
        let why = refusal(r#"{"amount":1000,"amount":9999}"#);
        assert!(why.contains(r#"repeated key "amount""#), "{why}");
        refusal(r#"{"amount":1000,"amount":1000}"#);
        refusal(r#"{"a":null,"a":{}}"#);
    }

    #[test]
    fn a_repeated_key_is_refused_at_any_depth_and_in_any_spelling() {
        let why = refusal(r#"{"data":{"object":{"id":"pi_1","amount":5,"id":"pi_2"}}}"#);
        assert!(why.contains(r#""id""#), "{why}");
        refusal(r#"{"items":[{"a":1},{"b":2,"b":3}]}"#);
        refusal(r#"[[{"x":[{"k":1,"k":2}]}]]"#);
        let why = refusal(r#"{"amount":1,"\u0061mount":2}"#);
        assert!(
            why.contains(r#""amount""#),
            "escapes are compared decoded: {why}"
        );
    }

    #[test]
    fn the_same_key_in_different_objects_is_fine() {
        let v = parse_json(br#"{"a":{"id":1},"b":{"id":2},"c":[{"id":3},{"id":4}]}"#).unwrap();
        assert_eq!(v["c"][1]["id"], 4);
    }

    #[test]
    fn a_long_repeated_key_is_shown_cut_short() {
        let key = "k".repeat(10_000);
        let why = refusal(&format!(r#"{{"{key}":1,"{key}":2}}"#));
        assert!(why.len() < 200, "{why}");
    }

    #[test]
    fn trailing_bytes_and_bad_nesting_are_still_refused() {
        refusal(r#"{"a":1} x"#);
        refusal(r#"{"a":1}{"a":1}"#);
        refusal(&format!("{}{}", "[".repeat(200), "]".repeat(200)));
        parse_json(format!("{}{}", "[".repeat(100), "]".repeat(100)).as_bytes())
            .expect("within serde_json's nesting limit");
    }

    #[test]
    fn decimal_amounts_convert_exactly_or_are_refused() {
        for (text, exponent, minor) in [
            ("0.01", 2, 1),
            ("20.00", 2, 2000),
            ("20.5", 2, 2050),
            ("20", 2, 2000),
            ("1234", 0, 1234),
            ("1.230", 3, 1230),
            ("1.2", 3, 1200),
            ("92233720368547758.07", 2, i64::MAX),
            ("007", 0, 7),
        ] {
            assert_eq!(decimal_minor(text, exponent, "v"), Ok(minor), "{text}");
        }
        for (text, exponent) in [
            ("20.001", 2),
            ("1e2", 2),
            ("-1", 2),
            ("+1", 2),
            ("1,00", 2),
            ("1.5", 0),
            ("", 2),
            (".5", 2),
            ("5.", 2),
            (" 5", 2),
            ("5 ", 2),
            ("0", 2),
            ("0.00", 2),
            ("NaN", 2),
            ("١٢", 0),
            ("92233720368547758.08", 2),
            ("99999999999999999999999", 0),
        ] {
            assert!(
                matches!(decimal_minor(text, exponent, "v"), Err(Reject::Invalid(_))),
                "{text}"
            );
        }
    }

    #[test]
    fn what_is_written_in_major_units_converts_back_to_the_same_minor_units() {
        for (minor, currency) in [(2000, "CNY"), (1234, "JPY"), (1, "BHD")] {
            let written = major_amount(minor, currency).unwrap();
            let exponent = minor_unit_exponent(currency).unwrap();
            assert_eq!(
                decimal_minor(&written, exponent, "v"),
                Ok(minor),
                "{written}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn parse_json_never_panics_on_arbitrary_bytes(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
        ) {
            let _ = parse_json(&body);
        }

        #[test]
        fn decimal_minor_never_panics_and_agrees_with_integer_arithmetic(
            text in "[0-9.,e+-]{0,24}",
            exponent in 0u32..4,
            whole in 0i64..1_000_000_000,
            cents in 0i64..100,
        ) {
            let _ = decimal_minor(&text, exponent, "v");
            let exact = format!("{whole}.{cents:02}");
            let expected = whole * 100 + cents;
            if expected > 0 {
                proptest::prop_assert_eq!(decimal_minor(&exact, 2, "v"), Ok(expected));
            }
        }

        #[test]
        fn parse_json_never_panics_on_json_like_text(body in r#"[\[\]{}":,0-9a-c\\u. -]{0,200}"#) {
            let _ = parse_json(body.as_bytes());
        }

        #[test]
        fn without_repeated_keys_parse_json_reads_what_serde_json_reads(
            value in crate::providers::testing::arbitrary_json(&["a", "b", "amount", "id", "data"]),
        ) {
            let text = value.to_string();
            let ours = parse_json(text.as_bytes()).expect("no key repeats");
            let theirs: Value = serde_json::from_str(&text).unwrap();
            proptest::prop_assert_eq!(ours, theirs);
        }
    }
}
