//! Stripe's API, as fencehook reads it with a provider's `api_key`: the
//! credentials (here) and what is asked with them.
//!
//! The key is a restricted key with Events read (or a secret key); it
//! reads the merchant's account, so it is never logged, never in a
//! `Debug` output, and a key published in Stripe's docs or fencehook's own
//! files is refused like a published webhook secret (`Setup::api_key`).

/// Stripe's production API.
pub const DEFAULT_API_URL: &str = "https://api.stripe.com";

/// What a Stripe API key starts with: a secret key or a restricted key, live
/// or test mode. A publishable key (`pk_`) reads nothing.
const KEY_PREFIXES: [&str; 4] = ["sk_live_", "sk_test_", "rk_live_", "rk_test_"];

/// One provider's access to Stripe's API.
pub struct Api {
    /// Without a trailing `/`; paths are appended (`/v1/events`).
    url: String,
    /// `Bearer <api_key>`; never logged.
    bearer: String,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Api {
    /// The API at `url` with `key`; the error names the setting at fault.
    pub fn new(key: &str, url: &str) -> Result<Api, (&'static str, String)> {
        super::fetch::check_api_url(url).map_err(|e| ("api_url", format!("{url}: {e}")))?;
        let prefixed = KEY_PREFIXES.iter().any(|p| {
            key.strip_prefix(p).is_some_and(|rest| {
                !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric())
            })
        });
        if !prefixed {
            return Err((
                "api_key",
                "a Stripe API key starts with sk_live_, sk_test_, rk_live_ or rk_test_ (a restricted key with Events read will do; not the webhook's whsec_ secret)".into(),
            ));
        }
        Ok(Api {
            url: url.trim_end_matches('/').to_owned(),
            bearer: format!("Bearer {key}"),
        })
    }

    /// The base URL, without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The `Authorization` header's value.
    pub fn authorization(&self) -> &str {
        &self.bearer
    }

    /// Whether the API is reached without TLS (a local test server).
    pub fn allows_plain_http(&self) -> bool {
        self.url.starts_with("http://")
    }
}

#[cfg(test)]
mod tests {
    use crate::providers::{EventsApi, Provider};

    const SECRET: &str = "whsec_test_secret_for_fencehook_unit_tests";

    fn stripe(extra: &str) -> Result<Provider, String> {
        Provider::from_toml_str(&format!(
            "[providers.shop]\nscheme = \"stripe\"\nsecrets = [\"{SECRET}\"]\n{extra}"
        ))
        .map(|mut p| p.remove(0))
        .map_err(|e| e.lines().join("; "))
    }

    #[test]
    fn a_stripe_provider_without_a_key_cannot_reconcile_and_with_one_can() {
        assert_eq!(stripe("").unwrap().events_api(), EventsApi::NoCredentials);
        let p = stripe("api_key = \"rk_test_51Abc0Events0Read\"").unwrap();
        assert_eq!(p.events_api(), EventsApi::Ready);
        assert!(p.exposures().is_empty() && p.warnings().is_empty());
        let local =
            stripe("api_key = \"sk_test_x1\"\napi_url = \"http://127.0.0.1:4010\"").unwrap();
        assert!(
            local.warnings()[0].contains("api_url is http://"),
            "{:?}",
            local.warnings()
        );
    }

    #[test]
    fn stripe_api_settings_are_checked_naming_the_setting() {
        let e = stripe("api_key = \"whsec_abc\"").unwrap_err();
        assert!(
            e.starts_with("provider `shop`: api_key: a Stripe API key starts with"),
            "{e}"
        );
        let e = stripe("api_key = \"pk_test_abc\"").unwrap_err();
        assert!(e.starts_with("provider `shop`: api_key:"), "{e}");
        let e = stripe("api_url = \"https://api.stripe.com\"").unwrap_err();
        assert!(
            e.starts_with("provider `shop`: api_url: only with api_key"),
            "{e}"
        );
        let e =
            stripe("api_key = \"sk_test_x1\"\napi_url = \"http://api.stripe.com\"").unwrap_err();
        assert!(
            e.starts_with(
                "provider `shop`: api_url: http://api.stripe.com: must start with https://"
            ),
            "{e}"
        );
        let e = stripe("api_keys = \"sk_test_x1\"").unwrap_err();
        assert!(e.contains("did you mean api_key?"), "{e}");
    }

    #[test]
    fn stripe_docs_example_keys_are_refused_like_published_secrets() {
        for key in [
            "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
            "sk_test_BQokikJOvBiI2HlWgH4olfQ2",
        ] {
            let p = stripe(&format!("api_key = \"{key}\"")).unwrap();
            assert_eq!(
                p.exposures(),
                ["provider `shop`: api_key: is an API key published in the PSP's docs or fencehook's own files, not your account's"],
            );
        }
    }

    #[test]
    fn the_key_is_never_in_debug_output() {
        let api = super::Api::new("sk_test_secretvalue1", "https://api.stripe.com").unwrap();
        assert!(!format!("{api:?}").contains("secretvalue1"));
        let p = stripe("api_key = \"sk_test_secretvalue1\"").unwrap();
        assert!(!format!("{p:?}").contains("secretvalue1"));
    }
}
