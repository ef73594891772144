//! One provider's table of the providers file, read for its scheme: every
//! key checked against what the scheme takes, then the table deserialized
//! into the scheme's own settings type ([`Scheme::Settings`]), whose fields
//! are the keys it takes. Which settings a scheme has, and what they mean to
//! it, is the scheme's file alone; nothing here names one.
//!
//! Every error is one line naming the provider and the field. A table's
//! unknown keys are all reported (each with the keys the scheme takes, and
//! the one it was probably meant to be); a table whose keys are all known
//! stops at its first bad value.
//!
//! Also here: the value types several schemes share ([`Secrets`],
//! [`Tolerance`]), each checked while the table is read, so that its errors
//! name the field whatever the scheme calls it.

use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::Deserialize;
use serde_path_to_error::Segment;

use super::scheme::Scheme;
use super::setup::Setup;

/// Timestamp window of the schemes that sign one (Standard Webhooks, Stripe,
/// WeChat Pay).
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// Above this, a timestamp window no longer protects against replays in any
/// useful sense. Allowed (verifying a PSP's test vectors from years ago needs
/// it), but warned about at start.
pub const TOLERANCE_WARN_SECS: u64 = 3600;

/// Largest timestamp window: past it a timestamp check is no check, and the
/// window would no longer fit the arithmetic on Unix times.
pub const MAX_TOLERANCE_SECS: u64 = 100 * 365 * 86_400;

/// Every error of a providers file (or of one provider's table), one line
/// each, naming the provider and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingErrors(Vec<String>);

impl SettingErrors {
    pub(super) fn one(line: String) -> SettingErrors {
        SettingErrors(vec![line])
    }

    /// The errors, one line each, in the file's order.
    pub fn lines(&self) -> &[String] {
        &self.0
    }

    /// The errors, one line each, in the file's order.
    pub fn into_lines(self) -> Vec<String> {
        self.0
    }

    pub(super) fn push(&mut self, line: String) {
        self.0.push(line);
    }

    pub(super) fn extend(&mut self, other: SettingErrors) {
        self.0.extend(other.0);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn new() -> SettingErrors {
        SettingErrors(Vec::new())
    }

    /// Each line prefixed (with the file's name, say).
    pub(super) fn prefixed(self, prefix: &str) -> SettingErrors {
        SettingErrors(self.0.into_iter().map(|l| format!("{prefix}{l}")).collect())
    }
}

/// One line per error.
impl fmt::Display for SettingErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("\n"))
    }
}

impl From<SettingErrors> for String {
    fn from(e: SettingErrors) -> String {
        e.to_string()
    }
}

/// A provider of scheme `S` from its table (without `scheme`): the keys
/// checked against `S::Settings`' fields, the table deserialized into it,
/// then [`Scheme::build`].
pub(super) fn build<S: Scheme>(table: toml::Table, setup: &mut Setup) -> Result<S, SettingErrors> {
    let takes = fields_of::<S::Settings>();
    let unknown: Vec<String> = table
        .keys()
        .filter(|key| !takes.contains(&key.as_str()))
        .map(|key| setup.error(key, not_taken::<S>(key, takes)))
        .collect();
    if !unknown.is_empty() {
        return Err(SettingErrors(unknown));
    }
    let settings: S::Settings = serde_path_to_error::deserialize(toml::Value::Table(table))
        .map_err(|e| SettingErrors::one(type_error(setup, &e)))?;
    S::build(settings, setup).map_err(SettingErrors::one)
}

/// Why `key` is refused by scheme `S`, which takes `takes`: the scheme's own
/// reason, or the keys it takes and the one `key` is closest to.
fn not_taken<S: Scheme>(key: &str, takes: &[&str]) -> String {
    if let Some(why) = S::not_taken(key) {
        return why.to_owned();
    }
    let near = takes
        .iter()
        .map(|t| (strsim::jaro_winkler(key, t), *t))
        .filter(|(score, _)| *score >= NEAR)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, t)| format!("; did you mean {t}?"))
        .unwrap_or_default();
    format!(
        "not a setting of scheme {}{near} (it takes {})",
        S::NAME,
        takes.join(", ")
    )
}

/// How alike (Jaro-Winkler, 0 to 1) an unknown key and a setting must be for
/// the setting to be suggested: a letter missing, swapped or doubled, or a
/// suffix left out (0.93 for a word without its `_secs`), not two unrelated
/// words.
const NEAR: f64 = 0.85;

/// `provider `s`: field: invalid type: …` from serde's error and its path.
fn type_error(setup: &Setup, e: &serde_path_to_error::Error<toml::de::Error>) -> String {
    let segments: Vec<String> = e
        .path()
        .iter()
        .filter_map(|s| match s {
            Segment::Map { key } => Some(key.clone()),
            Segment::Seq { index } => Some(format!("[{index}]")),
            _ => None,
        })
        .collect();
    let message = e.inner().message().trim().replace('\n', " ");
    match segments.split_first() {
        Some((field, [])) => setup.error(field, message),
        Some((field, rest)) => setup.error(field, format!("{}: {message}", rest.concat())),
        None => setup.line(message),
    }
}

/// The field names of a struct deriving `Deserialize`: what serde's derive
/// hands `deserialize_struct`, caught by a deserializer that reads nothing.
/// (serde-aux's `serde_introspect` does the same; it would bring serde-value
/// and ordered-float for these lines.) Empty for anything but a plain struct.
fn fields_of<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Fields<'a>(&'a mut &'static [&'static str]);

    impl<'de> Deserializer<'de> for Fields<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("only the fields are asked for"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            self.deserialize_any(visitor)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Fields(&mut fields));
    fields
}

/// A list of secrets (several: rotation, any may verify; the first is the
/// one a PSP signs new deliveries with), at least one. Never printed.
#[derive(Clone, Deserialize)]
#[serde(try_from = "Vec<String>")]
pub struct Secrets(Vec<String>);

impl Secrets {
    pub fn into_vec(self) -> Vec<String> {
        self.0
    }
}

impl TryFrom<Vec<String>> for Secrets {
    type Error = &'static str;

    fn try_from(list: Vec<String>) -> Result<Secrets, &'static str> {
        if list.is_empty() {
            return Err("at least one secret is required");
        }
        Ok(Secrets(list))
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} hidden)", self.0.len())
    }
}

/// How far a signed timestamp may be from the clock, in seconds: above 0
/// and at most [`MAX_TOLERANCE_SECS`].
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "u64")]
pub struct Tolerance(u64);

impl TryFrom<u64> for Tolerance {
    type Error = String;

    fn try_from(secs: u64) -> Result<Tolerance, String> {
        match secs {
            0 => Err("must be above 0".to_owned()),
            t if t > MAX_TOLERANCE_SECS => {
                Err(format!("{t} is above {MAX_TOLERANCE_SECS} (100 years)"))
            }
            t => Ok(Tolerance(t)),
        }
    }
}

impl Tolerance {
    /// The window of a table that gave `given` as `field`, or the default;
    /// a window that leaves deliveries replayable for long is warned about.
    pub fn secs(given: Option<Tolerance>, field: &str, setup: &mut Setup) -> u64 {
        let secs = given.map_or(DEFAULT_TOLERANCE_SECS, |t| t.0);
        if secs > TOLERANCE_WARN_SECS {
            setup.warn(format!(
                "{field} = {secs}: signed deliveries stay replayable for that long (keep it at most {TOLERANCE_WARN_SECS} in production)"
            ));
        }
        secs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Two {
        first: Option<String>,
        second_one: Option<u64>,
    }

    #[test]
    fn the_fields_of_a_settings_struct_are_its_keys() {
        assert_eq!(fields_of::<Two>(), &["first", "second_one"]);
        assert!(fields_of::<u64>().is_empty());
    }

    #[test]
    fn a_window_is_above_zero_and_below_a_century() {
        assert!(Tolerance::try_from(0).is_err());
        assert!(Tolerance::try_from(MAX_TOLERANCE_SECS + 1).is_err());
        assert!(Tolerance::try_from(MAX_TOLERANCE_SECS).is_ok());
        assert!(Secrets::try_from(Vec::new()).is_err());
        assert_eq!(
            format!("{:?}", Secrets(vec!["whsec_x".into()])),
            "Secrets(1 hidden)"
        );
    }
}
