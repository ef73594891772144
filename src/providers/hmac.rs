//! What the HMAC schemes share: the one HMAC-SHA256 check (any configured
//! key, for rotation, against any signature the delivery carries, compared
//! in constant time by `Mac::verify_slice`), the keys made of the secrets as
//! configured, the PSP side's check of its secret, and the providers-file tables of the schemes whose settings are
//! their secrets (and a timestamp window).

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use super::psp::{self, Credentials, PspError};
use super::settings::{Secrets, Tolerance};
use super::setup::Setup;

type HmacSha256 = Hmac<Sha256>;

/// True when the HMAC-SHA256 of the concatenated `message` parts under one of
/// `keys` equals one of `candidates`.
pub(crate) fn any_key_verifies(
    keys: &[Vec<u8>],
    message: &[&[u8]],
    candidates: &[Vec<u8>],
) -> bool {
    keys.iter().any(|key| {
        let mac = mac(key, message);
        candidates
            .iter()
            .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
    })
}

/// The keys of a scheme that keys its HMAC with each secret's bytes as
/// configured; an empty secret is refused with `empty`.
pub(crate) fn keys(secrets: &[String], empty: &str) -> Result<Vec<Vec<u8>>, String> {
    if secrets.iter().any(String::is_empty) {
        return Err(empty.to_owned());
    }
    Ok(secrets.iter().map(|s| s.as_bytes().to_vec()).collect())
}

/// The PSP side's check of a scheme that signs with [`psp::SECRET`]: it is
/// given and not empty (else `empty`).
pub(crate) fn check_secret(psp: &dyn Credentials, empty: &str) -> Result<(), PspError> {
    if psp.key(&psp::SECRET)?.is_empty() {
        return Err(PspError::new("secret", empty));
    }
    Ok(())
}

/// The HMAC-SHA256 of the concatenated `message` parts, for signing.
pub(crate) fn sign(key: &[u8], message: &[&[u8]]) -> Vec<u8> {
    mac(key, message).finalize().into_bytes().to_vec()
}

fn mac(key: &[u8], message: &[&[u8]]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    for part in message {
        mac.update(part);
    }
    mac
}

/// The table of a scheme that signs with HMAC secrets over a timestamp it
/// checks (standard, stripe): the secrets (several: rotation) and the
/// timestamp window.
#[derive(Deserialize)]
pub struct TimedTable {
    pub(super) secrets: Option<Secrets>,
    pub(super) tolerance_secs: Option<Tolerance>,
}

impl TimedTable {
    /// Its secrets (the first offered to the tools as the signing secret)
    /// and its timestamp window in seconds.
    pub(super) fn read(self, setup: &mut Setup) -> Result<(Vec<String>, u64), String> {
        let secrets = read_secrets(self.secrets, setup)?;
        let window = Tolerance::secs(self.tolerance_secs, "tolerance_secs", setup);
        Ok((secrets, window))
    }
}

/// The table of a scheme that signs with HMAC secrets and no timestamp
/// (adyen).
#[derive(Deserialize)]
pub struct Table {
    secrets: Option<Secrets>,
}

impl Table {
    /// Its secrets, the first offered to the tools as the signing secret.
    pub(super) fn read(self, setup: &mut Setup) -> Result<Vec<String>, String> {
        read_secrets(self.secrets, setup)
    }
}

fn read_secrets(secrets: Option<Secrets>, setup: &mut Setup) -> Result<Vec<String>, String> {
    let secrets = setup.required(secrets, "secrets", "a list of strings")?;
    let secrets = setup.secrets("secrets", secrets.into_vec());
    setup.offer(&psp::SECRET, &secrets[0]);
    Ok(secrets)
}

/// The table of a provider of an HMAC scheme with these secrets and window
/// (see [`Provider::new`](super::Provider::new)).
pub(super) fn table(secrets: &[String], tolerance_secs: Option<u64>) -> toml::Table {
    let mut table = toml::Table::new();
    table.insert("secrets".into(), secrets.to_vec().into());
    if let Some(t) = tolerance_secs {
        // A window past i64 is refused as out of range when read back.
        table.insert(
            "tolerance_secs".into(),
            toml::Value::Integer(i64::try_from(t).unwrap_or(i64::MAX)),
        );
    }
    table
}
