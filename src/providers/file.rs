//! The providers file (`FENCEHOOK_PROVIDERS`): one `[providers.<name>]` table
//! per provider. Every error is one line that names the provider and the
//! field (`provider `shop`: secrets: …`), so an operator knows what to fix.
//!
//! Read with serde; `serde_path_to_error` supplies the field of a type error
//! (serde alone says "invalid type: integer, expected a string" and nothing
//! more). Required fields and unknown keys are checked here rather than by
//! serde, so their messages name the field too.
//!
//! Key and certificate files (`platform_keys`, `public_keys`) are read here,
//! at start; a relative path is relative to the providers file's directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_path_to_error::Segment;

use super::{Provider, SchemeKind, Settings};

/// Reads a providers file. Errors name the file, the provider and the field.
pub fn load_file(path: &Path) -> Result<Vec<Provider>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    parse_in(&text, dir).map_err(|e| format!("{}: {e}", path.display()))
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
    platform_keys: Option<BTreeMap<String, String>>,
    app_id: Option<String>,
    public_keys: Option<Vec<String>>,
    webhook_id: Option<String>,
    cert_url_prefixes: Option<Vec<String>>,
    max_age_secs: Option<u64>,
    future_skew_secs: Option<u64>,
    confirm: Option<String>,
    api_url: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
    #[serde(flatten)]
    unknown: BTreeMap<String, toml::Value>,
}

/// Providers of a file's text; key files relative to the working directory.
pub(super) fn parse(text: &str) -> Result<Vec<Provider>, String> {
    parse_in(text, Path::new("."))
}

/// Providers of a file's text; relative key files are looked for in `dir`.
pub(super) fn parse_in(text: &str, dir: &Path) -> Result<Vec<Provider>, String> {
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
        .map(|(name, entry)| provider(&name, entry, dir))
        .collect()
}

fn provider(name: &str, entry: Entry, dir: &Path) -> Result<Provider, String> {
    let field = |field: &str, e: &str| format!("provider `{name}`: {field}: {e}");
    if let Some(key) = entry.unknown.keys().next() {
        // Every setting of some scheme, as the registry lists them.
        let expected = SchemeKind::every_setting().join(", ");
        return Err(field(
            key,
            &format!("unknown setting (expected scheme, {expected})"),
        ));
    }
    let scheme: SchemeKind = entry
        .scheme
        .ok_or_else(|| field("scheme", &format!("required ({})", SchemeKind::choices())))?
        .parse()
        .map_err(|e: String| field("scheme", &e))?;
    if scheme.is_hmac() && entry.secrets.is_none() {
        return Err(field("secrets", "required (a list of strings)"));
    }
    let read = |setting: &str, label: &str, path: &str| -> Result<Vec<u8>, String> {
        let full: PathBuf = dir.join(path);
        std::fs::read(&full).map_err(|e| {
            let what = if label.is_empty() {
                String::new()
            } else {
                format!("{label}: ")
            };
            field(
                setting,
                &format!("{what}cannot read {}: {e}", full.display()),
            )
        })
    };
    let platform_keys = entry
        .platform_keys
        .map(|keys| {
            keys.into_iter()
                .map(|(serial, path)| Ok((serial.clone(), read("platform_keys", &serial, &path)?)))
                .collect::<Result<BTreeMap<_, _>, String>>()
        })
        .transpose()?;
    let public_keys = entry
        .public_keys
        .map(|paths| {
            paths
                .into_iter()
                .map(|path| Ok((path.clone(), read("public_keys", "", &path)?)))
                .collect::<Result<Vec<_>, String>>()
        })
        .transpose()?;
    Provider::with_settings(
        name,
        scheme,
        Settings {
            secrets: entry.secrets,
            tolerance_secs: entry.tolerance_secs,
            platform_keys,
            app_id: entry.app_id,
            public_keys,
            webhook_id: entry.webhook_id,
            cert_url_prefixes: entry.cert_url_prefixes,
            max_age_secs: entry.max_age_secs,
            future_skew_secs: entry.future_skew_secs,
            confirm: entry.confirm,
            api_url: entry.api_url,
            client_id: entry.client_id,
            client_secret: entry.client_secret,
        },
    )
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
