//! Secrets and keys that must never serve because they are published in
//! fencehook's own files: anyone who has read the repository can sign with
//! them, and deliveries would be booked that no PSP sent. (Those shorter
//! than their PSP issues, a guess away, are the scheme's to say,
//! `Scheme::short_secret`.) A provider's build checks its secrets and key
//! files against this list as it reads them (`Setup::secrets`,
//! `Setup::key_file`).
//!
//! The published list is read from the repository's files as they were
//! built (`include_str!`): every `secrets` entry of
//! `deploy/providers.example.toml`, the placeholder key under `deploy/keys`,
//! and every secret-shaped token quoted in the README, the docs, the
//! environment example, the Kubernetes Secrets' example and the Makefile (the development secret
//! `make run` uses, Adyen's library test key, the examples' `whsec_…`). A
//! secret added to any of them later is refused without a change here.
//!
//! Found here, refused by the configuration at start and on SIGHUP unless
//! `FENCEHOOK_ALLOW_PUBLISHED_SECRETS` says this is development.

use std::collections::HashSet;
use std::sync::OnceLock;

/// The example providers file, as shipped.
const EXAMPLE_PROVIDERS: &str = include_str!("../../deploy/providers.example.toml");

/// The example's placeholder public key (WeChat Pay, Alipay).
const PLACEHOLDER_KEY: &str = include_str!("../../deploy/keys/PLACEHOLDER_public_key.pem");

/// Files whose quoted secrets are published.
const DOCUMENTS: &[&str] = &[
    include_str!("../../README.md"),
    include_str!("../../docs/providers.md"),
    include_str!("../../docs/reference.md"),
    include_str!("../../docs/operations.md"),
    include_str!("../../docs/load.md"),
    include_str!("../../deploy/fencehook.env.example"),
    include_str!("../../deploy/kubernetes/secrets.example.yaml"),
    include_str!("../../Makefile"),
];

/// Every published secret, read once.
fn published() -> &'static HashSet<String> {
    static PUBLISHED: OnceLock<HashSet<String>> = OnceLock::new();
    PUBLISHED.get_or_init(|| {
        let mut all: HashSet<String> = example_secrets(EXAMPLE_PROVIDERS).into_iter().collect();
        for doc in DOCUMENTS {
            all.extend(quoted_secrets(doc));
        }
        all.insert(super::DEV_SECRET.to_owned());
        all
    })
}

/// The `secrets` of every table of a providers file's text.
fn example_secrets(text: &str) -> Vec<String> {
    let Ok(doc) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let providers = doc.get("providers").and_then(|p| p.as_table());
    providers
        .into_iter()
        .flat_map(|t| t.values())
        .filter_map(|p| p.get("secrets")?.as_array())
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

/// Secret-shaped tokens of a document: `whsec_…` strings, runs of 64 hex
/// digits (an Adyen key), and every string quoted on a `secrets = [...]`
/// line (a TOML example of any scheme).
fn quoted_secrets(text: &str) -> Vec<String> {
    let token_char = |c: char| c.is_ascii_alphanumeric() || "+/=_-".contains(c);
    let mut found: Vec<String> = text
        .split(|c: char| !token_char(c))
        .filter(|t| {
            (t.starts_with("whsec_") && t.len() > "whsec_".len())
                || (t.len() == 64 && t.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .map(str::to_owned)
        .collect();
    for line in text
        .lines()
        .filter(|l| l.trim_start().starts_with("secrets"))
    {
        found.extend(line.split('"').skip(1).step_by(2).map(str::to_owned));
    }
    found
}

/// Why `secret` must not serve, if it is published: the development
/// secret, or one quoted in fencehook's own files.
pub(super) fn secret(secret: &str) -> Option<&'static str> {
    if !published().contains(secret) {
        return None;
    }
    Some(if secret == super::DEV_SECRET {
        "the DEVELOPMENT secret published in the README"
    } else {
        "a secret published in fencehook's own files (the example providers file or the docs)"
    })
}

/// Whether a key file's contents are the example's placeholder key (its
/// base64 body, whatever the line breaks).
pub(super) fn is_placeholder_key(contents: &[u8]) -> bool {
    let squeeze = |s: &str| -> String {
        s.lines()
            .filter(|l| !l.starts_with("-----"))
            .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
            .collect()
    };
    let placeholder = squeeze(PLACEHOLDER_KEY);
    std::str::from_utf8(contents).is_ok_and(|text| squeeze(text) == placeholder)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::{load_file, Provider, SchemeKind};

    /// What a provider of `scheme` with this one secret is refused for.
    fn exposure(scheme: SchemeKind, secret: &str) -> Option<String> {
        let p = Provider::new("p", scheme, &[secret.to_owned()], None).unwrap();
        p.exposures().first().cloned()
    }

    #[test]
    fn the_published_list_holds_the_examples_the_docs_and_the_development_secret() {
        let all = published();
        for s in [
            super::super::DEV_SECRET,
            "whsec_PLACEHOLDER_stripe_endpoint_signing_secret",
            "0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF",
            "PLACEHOLDER-apiv3-key-32-chars!!",
            // Adyen's library test key, quoted in the docs.
            "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
            "whsec_new_endpoint_secret",
        ] {
            assert!(all.contains(s), "{s} is not in the published list");
        }
        assert!(!all.contains("whsec_"));
    }

    #[test]
    fn every_secret_and_key_of_the_example_providers_file_is_refused() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/providers.example.toml");
        let providers = load_file(std::path::Path::new(path)).expect("the example parses");
        let mut with_secrets = 0;
        for p in &providers {
            if p.scheme() == SchemeKind::Paypal {
                // No secret of its own: a webhook id and PayPal's certificate.
                continue;
            }
            with_secrets += 1;
            let exposures = p.exposures();
            assert!(!exposures.is_empty(), "{} is not refused", p.name);
            assert!(
                exposures[0].starts_with(&format!("provider `{}`: ", p.name)),
                "{exposures:?}"
            );
        }
        assert_eq!(with_secrets, 7);
        for secret in example_secrets(EXAMPLE_PROVIDERS) {
            assert!(published().contains(&secret), "{secret}");
        }
    }

    #[test]
    fn secrets_shorter_than_their_psp_issues_are_exposed_and_real_sized_ones_are_not() {
        for (scheme, short) in [
            (SchemeKind::Stripe, "whsec_a"),
            (SchemeKind::Stripe, "whsec_0123456789abcdef0123456789abcde"),
            (SchemeKind::Standard, "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM="),
            (SchemeKind::Adyen, "00112233445566778899AABBCCDDEEFF"),
            (SchemeKind::Paddle, "pdl_ntf_01hshort"),
        ] {
            assert!(exposure(scheme, short).is_some(), "{short}");
        }
        for (scheme, ok) in [
            (SchemeKind::Stripe, "whsec_0123456789abcdef0123456789abcdef"),
            (
                SchemeKind::Standard,
                "whsec_dGVzdC1zZWNyZXQtZm9yLWZlbmNlaG9vay10ZXN0cw==",
            ),
            (
                SchemeKind::Adyen,
                "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF",
            ),
            (
                SchemeKind::Paddle,
                "pdl_ntf_01hv8x2axb33yr5y238zfwcn5p_0123456789abcdefghijklmnopqrstuv",
            ),
        ] {
            assert_eq!(exposure(scheme, ok), None, "{ok}");
        }
        let p = Provider::new("stripe", SchemeKind::Stripe, &["whsec_a".into()], None).unwrap();
        assert!(
            p.exposures()[0].starts_with("provider `stripe`: secrets: "),
            "{:?}",
            p.exposures()
        );
    }

    #[test]
    fn the_placeholder_key_is_recognised_whatever_its_line_breaks() {
        assert!(is_placeholder_key(PLACEHOLDER_KEY.as_bytes()));
        let one_line: String = PLACEHOLDER_KEY
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        assert!(is_placeholder_key(one_line.as_bytes()));
        assert!(!is_placeholder_key(
            b"MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA"
        ));
    }
}
