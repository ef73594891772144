//! What a scheme has at hand while it builds a provider from its settings
//! ([`Scheme::build`](super::Scheme::build)): the provider's name, which
//! every error and warning names; the time (a certificate's validity); the
//! providers file's directory, which relative key files are read from; and
//! where it says what start should know of the provider besides the
//! provider itself: warnings, exposed secrets and keys, and the values the
//! tools that play its PSP may sign with.

use std::fmt::Display;
use std::path::Path;

use super::psp::Key;
use super::published;

/// What building one provider has at hand, and what it found out.
pub struct Setup<'a> {
    provider: &'a str,
    dir: &'a Path,
    now: i64,
    /// The scheme's own idea of a secret too short to be its PSP's.
    short_secret: &'a dyn Fn(&str) -> Option<String>,
    /// The key a secret signs with, by the scheme's decoding.
    key_bytes: &'a dyn Fn(&str) -> Option<Vec<u8>>,
    found: Found,
}

/// What a build says of its provider besides the provider (see
/// [`Provider::warnings`](super::Provider::warnings),
/// [`Provider::exposures`](super::Provider::exposures) and
/// [`Provider::psp_value`](super::Provider::psp_value)).
#[derive(Default)]
pub(super) struct Found {
    pub warnings: Vec<String>,
    pub exposures: Vec<String>,
    /// By the flag of the [`Key`] they are offered as.
    pub psp_side: Vec<(&'static str, String)>,
}

/// An error of one setting: its name and what is wrong.
pub type SettingError = (&'static str, String);

impl<'a> Setup<'a> {
    pub(super) fn new(
        provider: &'a str,
        dir: &'a Path,
        now: i64,
        short_secret: &'a dyn Fn(&str) -> Option<String>,
        key_bytes: &'a dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Setup<'a> {
        Setup {
            provider,
            dir,
            now,
            short_secret,
            key_bytes,
            found: Found::default(),
        }
    }

    /// Unix seconds at start.
    pub fn now(&self) -> i64 {
        self.now
    }

    /// `provider `shop`: field: why`, the line a bad setting stops the start with.
    pub fn error(&self, field: &str, why: impl Display) -> String {
        format!("provider `{}`: {field}: {why}", self.provider)
    }

    /// `provider `shop`: what`, for what concerns no one field.
    pub fn line(&self, what: impl Display) -> String {
        format!("provider `{}`: {what}", self.provider)
    }

    /// [`Setup::error`] of a [`SettingError`].
    pub fn setting(&self, (field, why): SettingError) -> String {
        self.error(field, why)
    }

    /// A required setting's value, or the error naming it and `what` it is.
    pub fn required<T>(&self, value: Option<T>, field: &str, what: &str) -> Result<T, String> {
        value.ok_or_else(|| self.error(field, format!("required ({what})")))
    }

    /// A setting that starts but is probably a mistake, said at start.
    pub fn warn(&mut self, what: impl Display) {
        let line = self.line(what);
        self.found.warnings.push(line);
    }

    /// The secrets of `field` (they sign or decrypt deliveries): each one
    /// published in fencehook's own files, or shorter than the PSP issues,
    /// is an exposure: anyone could sign with it. Published ones are
    /// compared as the keys the scheme decodes them to, not as strings.
    pub fn secrets(&mut self, field: &str, secrets: Vec<String>) -> Vec<String> {
        for (i, secret) in secrets.iter().enumerate() {
            let what = published::secret(secret, self.key_bytes)
                .map(str::to_owned)
                .or_else(|| (self.short_secret)(secret).map(|s| format!("a secret of {s}")));
            if let Some(what) = what {
                let line = self.error(
                    field,
                    format!("secret {} is {what}: anyone can sign deliveries", i + 1),
                );
                self.found.exposures.push(line);
            }
        }
        secrets
    }

    /// An API key of `field` (it reads the merchant's account at the PSP):
    /// one published in fencehook's own files, or in the PSP's own docs
    /// (`published.txt` lists them), is an exposure like a published
    /// secret: it is no one's account, or everyone's.
    pub fn api_key(&mut self, field: &str, key: &str) {
        if published::secret(key, &|k: &str| Some(k.as_bytes().to_vec())).is_some() {
            let line = self.error(
                field,
                "is an API key published in the PSP's docs or fencehook's own files, not your account's",
            );
            self.found.exposures.push(line);
        }
    }

    /// The contents of the key or certificate file `path` of `field`
    /// (`label`: which of the field's files, when it names them), relative to
    /// the providers file. The example's placeholder key is an exposure.
    pub fn key_file(
        &mut self,
        field: &str,
        label: Option<&str>,
        path: &str,
    ) -> Result<Vec<u8>, String> {
        let full = self.dir.join(path);
        let which = label.map(|l| format!("{l}: ")).unwrap_or_default();
        let contents = std::fs::read(&full).map_err(|e| {
            self.error(field, format!("{which}cannot read {}: {e}", full.display()))
        })?;
        if published::is_placeholder_key(&contents) {
            let line = self.error(
                field,
                format!(
                    "{} is the example's placeholder key (deploy/keys), not the PSP's",
                    label.unwrap_or(path)
                ),
            );
            self.found.exposures.push(line);
        }
        Ok(contents)
    }

    /// `value`, as the tools that play this provider's PSP may sign with it
    /// for `key` (`fencehook send --provider NAME` without the flag).
    pub fn offer(&mut self, key: &Key, value: &str) {
        self.found.psp_side.push((key.flag, value.to_owned()));
    }

    pub(super) fn into_found(self) -> Found {
        self.found
    }
}
