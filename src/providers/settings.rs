//! The settings a `[providers.<name>]` table may hold: the providers file's
//! one vocabulary. Which of them a scheme takes, and what they mean to it,
//! is the scheme's (`Scheme::SETTINGS`, `Scheme::build`); the timestamp
//! window shared by the schemes that sign one is here.

use std::collections::BTreeMap;

/// Timestamp window of the schemes that sign one (Standard Webhooks, Stripe,
/// WeChat Pay).
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// Above this, a timestamp window no longer protects against replays in any
/// useful sense. Allowed (verifying a PSP's test vectors from years ago needs
/// it), but warned about at start.
pub const TOLERANCE_WARN_SECS: u64 = 3600;

/// Largest `tolerance_secs`: past it a timestamp check is no check, and the
/// window would no longer fit the arithmetic on Unix times.
pub const MAX_TOLERANCE_SECS: u64 = 100 * 365 * 86_400;

/// Everything a `[providers.<name>]` table may set, key files already read
/// (as `(where it came from, contents)`). Which settings a scheme takes:
///
/// | scheme | required | optional |
/// | --- | --- | --- |
/// | standard, stripe, adyen | `secrets` | `tolerance_secs` (not adyen) |
/// | wechatpay | `secrets` (APIv3 keys), `platform_keys` | `tolerance_secs` |
/// | alipay | `app_id`, `public_keys` | – |
/// | paypal | `webhook_id` | `cert_url_prefixes`, `max_age_secs`, `future_skew_secs`, `confirm`, `api_url`, `client_id`, `client_secret` |
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub secrets: Option<Vec<String>>,
    pub tolerance_secs: Option<u64>,
    /// WeChat Pay: serial (`Wechatpay-Serial`) → certificate or public key.
    pub platform_keys: Option<BTreeMap<String, Vec<u8>>>,
    pub app_id: Option<String>,
    pub public_keys: Option<Vec<(String, Vec<u8>)>>,
    pub webhook_id: Option<String>,
    pub cert_url_prefixes: Option<Vec<String>>,
    /// PayPal: how old a transmission time may be (default 3 days).
    pub max_age_secs: Option<u64>,
    /// PayPal: how far ahead of the clock a transmission time may be.
    pub future_skew_secs: Option<u64>,
    /// PayPal: `offline` (the default) or `api` (fetch-to-confirm).
    pub confirm: Option<String>,
    /// PayPal, `confirm = "api"`: the REST API's base URL and the app's credentials.
    pub api_url: Option<String>,
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
}

impl Settings {
    /// The names of the settings given.
    pub(super) fn given(&self) -> Vec<&'static str> {
        let mut given = Vec::new();
        let mut note = |set: bool, name| {
            if set {
                given.push(name)
            }
        };
        note(self.secrets.is_some(), "secrets");
        note(self.tolerance_secs.is_some(), "tolerance_secs");
        note(self.platform_keys.is_some(), "platform_keys");
        note(self.app_id.is_some(), "app_id");
        note(self.public_keys.is_some(), "public_keys");
        note(self.webhook_id.is_some(), "webhook_id");
        note(self.cert_url_prefixes.is_some(), "cert_url_prefixes");
        note(self.max_age_secs.is_some(), "max_age_secs");
        note(self.future_skew_secs.is_some(), "future_skew_secs");
        note(self.confirm.is_some(), "confirm");
        note(self.api_url.is_some(), "api_url");
        note(self.client_id.is_some(), "client_id");
        note(self.client_secret.is_some(), "client_secret");
        given
    }

    /// `tolerance_secs`, or its default.
    pub fn tolerance(&self) -> u64 {
        self.tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS)
    }

    /// `secrets`, or none.
    pub fn secrets(&self) -> &[String] {
        self.secrets.as_deref().unwrap_or_default()
    }
}
