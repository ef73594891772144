//! The providers file (`FENCEHOOK_PROVIDERS`): one `[providers.<name>]` table
//! per provider, each read by the scheme its `scheme` names
//! ([`Provider::from_table`]). Every error is one line that names the
//! provider and the field (`provider `shop`: <field>: …`), so an operator
//! knows what to fix, and every provider's errors are reported at once, not
//! only the first one's.
//!
//! Key and certificate files named in a table are read at start; a relative
//! path is relative to the providers file's directory.

use std::path::Path;

use super::{Provider, SettingErrors};

/// Reads a providers file. Each error names the file, the provider and the field.
pub fn load_file(path: &Path) -> Result<Vec<Provider>, SettingErrors> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| SettingErrors::one(format!("cannot read {}: {e}", path.display())))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    parse_in(&text, dir).map_err(|e| e.prefixed(&format!("{}: ", path.display())))
}

/// Providers of a file's text; key files relative to the working directory.
pub(super) fn parse(text: &str) -> Result<Vec<Provider>, SettingErrors> {
    parse_in(text, Path::new("."))
}

/// Providers of a file's text; relative key files are looked for in `dir`.
pub(super) fn parse_in(text: &str, dir: &Path) -> Result<Vec<Provider>, SettingErrors> {
    let doc: toml::Table = text
        .parse()
        .map_err(|e| SettingErrors::one(syntax_error(text, &e)))?;
    let mut errors = SettingErrors::new();
    let mut tables = None;
    for (key, value) in doc {
        if key == "providers" {
            tables = Some(value);
        } else {
            errors.push(format!(
                "`{key}`: unknown table; providers go in [providers.<name>]"
            ));
        }
    }
    let tables = match tables {
        Some(toml::Value::Table(tables)) => tables,
        Some(_) => {
            errors.push("providers: must be tables, [providers.<name>]".to_owned());
            toml::Table::new()
        }
        None => toml::Table::new(),
    };
    if tables.is_empty() && errors.is_empty() {
        errors.push("no [providers.<name>] table".to_owned());
    }
    let mut providers = Vec::with_capacity(tables.len());
    for (name, table) in tables {
        let read = match table {
            toml::Value::Table(table) => Provider::from_table(&name, table, dir),
            _ => Err(SettingErrors::one(format!(
                "provider `{name}`: must be a table, [providers.{name}]"
            ))),
        };
        match read {
            Ok(provider) => providers.push(provider),
            Err(e) => errors.extend(e),
        }
    }
    if errors.is_empty() {
        Ok(providers)
    } else {
        Err(errors)
    }
}

/// `line 3, column 9: …` of a file that is not TOML.
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    let Some(at) = e.span().map(|s| s.start.min(text.len())) else {
        return format!("not TOML: {message}");
    };
    let before = &text.as_bytes()[..at];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let column = before.iter().rev().take_while(|b| **b != b'\n').count() + 1;
    format!("not TOML: line {line}, column {column}: {message}")
}
