//! Strict readers shared by the payload mappings: no coercion, no trimming, no
//! defaults. A missing or ill-typed field is a [`Reject::Invalid`] whose
//! message names the field by its path in the payload (`data.object.amount`).

use serde_json::{Map, Value};

use super::Reject;

pub(crate) type Object = Map<String, Value>;

pub(crate) fn invalid(msg: impl Into<String>) -> Reject {
    Reject::Invalid(msg.into())
}

/// Parses the body as JSON. serde_json's recursion limit (128) bounds nesting,
/// so a hostile body is an error here, never a stack overflow.
pub(crate) fn parse_json(body: &[u8]) -> Result<Value, Reject> {
    serde_json::from_slice(body).map_err(|e| invalid(format!("body is not valid JSON: {e}")))
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
