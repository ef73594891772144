//! The providers file (`FENCEHOOK_PROVIDERS`): one `[providers.<name>]` table
//! per provider. Every error is one line that names the provider and the
//! field (`provider `shop`: secrets: …`), so an operator knows what to fix.
//!
//! Read with serde; `serde_path_to_error` supplies the field of a type error
//! (serde alone says "invalid type: integer, expected a string" and nothing
//! more). Required fields and unknown keys are checked here rather than by
//! serde, so their messages name the field too.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_path_to_error::Segment;

use super::{Provider, SchemeKind};

/// Reads a providers file. Errors name the file, the provider and the field.
pub fn load_file(path: &Path) -> Result<Vec<Provider>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[derive(Deserialize)]
struct Document {
    providers: Option<BTreeMap<String, Entry>>,
    /// Anything beside `[providers]`: refused, by name.
    #[serde(flatten)]
    unknown: BTreeMap<String, toml::Value>,
}

/// One `[providers.<name>]` table, as written.
#[derive(Deserialize)]
struct Entry {
    scheme: Option<String>,
    secrets: Option<Vec<String>>,
    tolerance_secs: Option<u64>,
    #[serde(flatten)]
    unknown: BTreeMap<String, toml::Value>,
}

const ENTRY_FIELDS: &str = "scheme, secrets, tolerance_secs";

pub(super) fn parse(text: &str) -> Result<Vec<Provider>, String> {
    let doc: Document = serde_path_to_error::deserialize(toml::Deserializer::new(text))
        .map_err(|e| type_error(&e))?;
    if let Some(key) = doc.unknown.keys().next() {
        return Err(format!(
            "`{key}`: unknown table; providers go in [providers.<name>]"
        ));
    }
    let providers = doc.providers.unwrap_or_default();
    if providers.is_empty() {
        return Err("no [providers.<name>] table".to_owned());
    }
    providers
        .into_iter()
        .map(|(name, entry)| provider(&name, entry))
        .collect()
}

fn provider(name: &str, entry: Entry) -> Result<Provider, String> {
    let field = |field: &str, e: &str| format!("provider `{name}`: {field}: {e}");
    if let Some(key) = entry.unknown.keys().next() {
        return Err(field(
            key,
            &format!("unknown setting (expected {ENTRY_FIELDS})"),
        ));
    }
    let scheme: SchemeKind = entry
        .scheme
        .ok_or_else(|| field("scheme", &format!("required ({})", SchemeKind::choices())))?
        .parse()
        .map_err(|e: String| field("scheme", &e))?;
    let secrets = entry
        .secrets
        .ok_or_else(|| field("secrets", "required (a list of strings)"))?;
    Provider::new(name, scheme, &secrets, entry.tolerance_secs)
}

/// `provider `s`: secrets: invalid type: …` from serde's error and its path.
fn type_error(e: &serde_path_to_error::Error<toml::de::Error>) -> String {
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
    match segments.as_slice() {
        [top, name, field, rest @ ..] if top == "providers" => {
            let at = if rest.is_empty() {
                String::new()
            } else {
                format!("{}: ", rest.concat())
            };
            format!("provider `{name}`: {field}: {at}{message}")
        }
        [top, name] if top == "providers" => format!("provider `{name}`: {message}"),
        [] => message,
        path => format!("{}: {message}", path.join(".")),
    }
}
