//! Secrets and keys that must never serve because they are published in
//! fencehook's own files: anyone who has read the repository can sign with
//! them, and deliveries would be booked that no PSP sent. (Those shorter
//! than their PSP issues, a guess away, are the scheme's to say,
//! `Scheme::short_secret`.) A provider's build checks its secrets and key
//! files against this list as it reads them (`Setup::secrets`,
//! `Setup::key_file`).
//!
//! The published list is data, not prose: every `secrets` entry of
//! `deploy/providers.example.toml` and the placeholder key under
//! `deploy/keys` (both read as they were built, `include_str!`), the
//! development secret `make run` uses, and `published.txt` beside this
//! file: every secret-shaped token quoted in the README, the docs, the
//! environment example, the Kubernetes Secrets' example and the Makefile
//! (Adyen's library test key, the examples' `whsec_…`). The service never
//! compiles the prose in, so editing a page does not rebuild it; a test
//! reads those files and fails, naming the line to add, when one quotes a
//! secret the list lacks.
//!
//! A secret is compared with them as the key its scheme signs with
//! (`Scheme::key_bytes`), not as a string: a published Adyen key spelt in
//! lower case is the published key. Found here, refused by the configuration
//! at start and on SIGHUP unless `FENCEHOOK_ALLOW_PUBLISHED_SECRETS` says
//! this is development. A test reads the repository's code, tests, docs
//! and examples for secret-shaped tokens a provider would serve.

use std::collections::HashSet;
use std::sync::OnceLock;

/// The example providers file, as shipped.
const EXAMPLE_PROVIDERS: &str = include_str!("../../deploy/providers.example.toml");

/// The example's placeholder public key (WeChat Pay, Alipay).
const PLACEHOLDER_KEY: &str = include_str!("../../deploy/keys/PLACEHOLDER_public_key.pem");

/// The secrets quoted in the repository's prose and examples, one a line
/// (`#` starts a comment line).
const PUBLISHED_LIST: &str = include_str!("published.txt");

/// The secrets of [`PUBLISHED_LIST`].
fn listed() -> impl Iterator<Item = &'static str> {
    PUBLISHED_LIST
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// Every published secret, read once.
fn published() -> &'static HashSet<String> {
    static PUBLISHED: OnceLock<HashSet<String>> = OnceLock::new();
    PUBLISHED.get_or_init(|| {
        let mut all: HashSet<String> = example_secrets(EXAMPLE_PROVIDERS).into_iter().collect();
        all.extend(listed().map(str::to_owned));
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

/// Why `secret` must not serve, if it is published: the development
/// secret, or one quoted in fencehook's own files. Compared as keys:
/// `key_bytes` is the scheme's decoding (`Scheme::key_bytes`), and a secret
/// is published when it decodes to the key a published one decodes to (a
/// hex key's other case, a base64 key's other padding); one that does not
/// decode is compared as it is spelled.
pub(super) fn secret(
    secret: &str,
    key_bytes: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Option<&'static str> {
    let same = |known: &str| match (key_bytes(secret), key_bytes(known)) {
        (Some(key), Some(known_key)) => key == known_key,
        _ => secret == known,
    };
    let known = published().iter().find(|known| same(known))?;
    Some(if known == super::DEV_SECRET {
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

    /// Whether `token` has the shape of a Mollie API key.
    fn mollie_key(token: &str) -> bool {
        let rest = token
            .strip_prefix("live_")
            .or_else(|| token.strip_prefix("test_"));
        rest.is_some_and(|r| r.len() >= 30 && r.bytes().all(|b| b.is_ascii_alphanumeric()))
    }

    /// Secret-shaped tokens of a document: `whsec_…` strings, runs of 64 hex
    /// digits (an Adyen key), Mollie API keys, and every string quoted on a
    /// `secrets = [...]` or `api_key = "…"` line (a TOML example of any
    /// scheme).
    fn quoted_secrets(text: &str) -> Vec<String> {
        let token_char = |c: char| c.is_ascii_alphanumeric() || "+/=_-".contains(c);
        let mut found: Vec<String> = text
            .split(|c: char| !token_char(c))
            .filter(|t| {
                (t.starts_with("whsec_") && t.len() > "whsec_".len())
                    || (t.len() == 64 && t.chars().all(|c| c.is_ascii_hexdigit()))
                    || mollie_key(t)
            })
            .map(str::to_owned)
            .collect();
        for line in text.lines().filter(|l| {
            let l = l.trim_start();
            l.starts_with("secrets") || l.starts_with("api_key")
        }) {
            found.extend(line.split('"').skip(1).step_by(2).map(str::to_owned));
        }
        found
    }

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
        // Mollie's is its api_key (the example key of Mollie's docs).
        assert_eq!(with_secrets, 10);
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

    /// A secret not published anywhere, made at run time (any literal in
    /// the repository would be found by the scan below).
    fn unpublished_hex_key() -> String {
        let digits: String = (0u8..32)
            .map(|i| format!("{:02X}", i.wrapping_mul(37).wrapping_add(11)))
            .collect();
        assert!(!published().contains(&digits));
        digits
    }

    #[test]
    fn a_published_secret_is_refused_in_every_spelling_of_its_key() {
        let adyen_key = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
        for spelling in [
            adyen_key.to_owned(),
            adyen_key.to_ascii_lowercase(),
            // Half and half: the same 32 bytes.
            format!(
                "{}{}",
                &adyen_key[..32].to_ascii_lowercase(),
                &adyen_key[32..]
            ),
        ] {
            let what = exposure(SchemeKind::Adyen, &spelling);
            assert!(
                what.as_deref().is_some_and(|w| w.contains("published")),
                "{spelling}: {what:?}"
            );
        }
        // Adyen's other library test key (its PHP library's), quoted in the docs.
        let php_key = "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00";
        for spelling in [php_key.to_owned(), php_key.to_ascii_lowercase()] {
            assert!(
                exposure(SchemeKind::Adyen, &spelling).is_some(),
                "{spelling}"
            );
        }
        let unpublished = unpublished_hex_key();
        assert_eq!(exposure(SchemeKind::Adyen, &unpublished), None);
        assert_eq!(
            exposure(SchemeKind::Adyen, &unpublished.to_ascii_lowercase()),
            None
        );
    }

    /// The test suite's own secret-shaped tokens that a provider serves: the
    /// secrets its tests sign with (its `serve` and `work` processes start
    /// with them, without `FENCEHOOK_ALLOW_PUBLISHED_SECRETS`), and a
    /// signature that looks like an Adyen key. Anyone can read them too; they
    /// stay servable for the suite, by name here. A new secret-shaped token
    /// anywhere else (the code, the docs, the examples) must be refused: in
    /// the docs' published set, or short.
    const SUITE_SECRETS: &[&str] = &[
        // tests/api/helpers: the generic provider of every test.
        "whsec_dGVzdC1zZWNyZXQtZm9yLWZlbmNlaG9vay10ZXN0cw==",
        "whsec_d3Jvbmctc2VjcmV0LXdyb25nLXNlY3JldA==",
        "whsec_b3RoZXItc2VjcmV0LW5vdC10aGUtcHJvdmlkZXJzLW93bg==",
        "whsec_b3RoZXItc2VjcmV0LW5vdC10aGUtcHJvdmlkZXJzLW9uZQ==",
        "whsec_bmV3LXNlY3JldC1mb3ItcmVsb2FkLXRlc3Q=",
        "whsec_shop_endpoint_secret_new_0123456789",
        "whsec_shop_endpoint_secret_old_0123456789",
        "whsec_0123456789abcdef0123456789abcdef",
        "whsec_fencehook_stripe_integration_secret",
        "whsec_fencehook_chaos_stripe_endpoint_secret",
        "whsec_fencehook_stripe_secret_before_the_roll",
        "whsec_test_secret_for_fencehook_unit_tests",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        // tests/api/downstream_trust.rs: the order service's secret (FENCEHOOK_DOWNSTREAM_SECRET).
        "whsec_b3JkZXItc2VydmljZS1zZWNyZXQtZm9yLXRlc3RzLSE=",
        // An Adyen key no PSP issued: the suite's "unknown key".
        "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF",
        // Mollie API keys of the suite (src/providers/mollie.rs, tests/api/psp_mollie.rs).
        "test_fencehookUnitTestKey0123456789abc",
        "test_fencehookIntegrationKey0123456789",
        // A Stripe signature (src/providers/stripe.rs), not a key.
        "c62c74be83bf90fc7fd50fd5f300b08b9422fa8f94a3512cbf7603665610ac52",
    ];

    /// Every file of the repository's `src/`, `tests/`, `docs/`, `deploy/`
    /// and `scripts/`, and its top-level documents.
    fn repository_files() -> Vec<std::path::PathBuf> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files: Vec<_> = ["README.md", "CHANGELOG.md", "Makefile", "Containerfile"]
            .iter()
            .map(|f| root.join(f))
            .collect();
        let mut dirs: Vec<_> = ["src", "tests", "docs", "deploy", "scripts"]
            .iter()
            .map(|d| root.join(d))
            .collect();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    files.push(path);
                }
            }
        }
        files
    }

    /// Whether a provider of any scheme that takes `token` as a secret
    /// would serve it: it builds, and nothing exposes it.
    fn served(token: &str) -> Vec<SchemeKind> {
        let mut served: Vec<SchemeKind> =
            [SchemeKind::Standard, SchemeKind::Stripe, SchemeKind::Adyen]
                .into_iter()
                .filter(|&scheme| {
                    Provider::new("p", scheme, &[token.to_owned()], None)
                        .is_ok_and(|p| p.exposures().is_empty())
                })
                .collect();
        let mollie = format!("[providers.p]\nscheme = \"mollie\"\napi_key = {token:?}\n");
        if Provider::from_toml_str(&mollie).is_ok_and(|p| p[0].exposures().is_empty()) {
            served.push(SchemeKind::Mollie);
        }
        served
    }

    #[test]
    fn every_secret_shaped_token_in_the_repository_is_refused_as_published_or_short() {
        let mut servable = Vec::new();
        for path in repository_files() {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue; // not text
            };
            for token in quoted_secrets(&text) {
                let schemes = served(&token);
                if !schemes.is_empty() && !SUITE_SECRETS.contains(&token.as_str()) {
                    servable.push(format!("{}: {token} ({schemes:?})", path.display()));
                }
            }
        }
        servable.sort();
        servable.dedup();
        assert!(
            servable.is_empty(),
            "secret-shaped tokens a provider would serve, though anyone can read them:\n{}",
            servable.join("\n")
        );
    }

    /// The files whose quoted secrets are published: the README, every page
    /// of docs/, the settings and Kubernetes Secrets' examples, the Makefile.
    fn published_documents() -> Vec<std::path::PathBuf> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files: Vec<_> = [
            "README.md",
            "Makefile",
            "deploy/fencehook.env.example",
            "deploy/kubernetes/secrets.example.yaml",
        ]
        .iter()
        .map(|f| root.join(f))
        .collect();
        for entry in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
            if entry.path().extension().is_some_and(|e| e == "md") {
                files.push(entry.path());
            }
        }
        files
    }

    #[test]
    fn every_secret_quoted_in_the_readme_the_docs_and_the_examples_is_in_the_published_list() {
        let listed: HashSet<&str> = listed().collect();
        let mut missing = Vec::new();
        for path in published_documents() {
            let text = std::fs::read_to_string(&path).unwrap();
            for token in quoted_secrets(&text) {
                if !listed.contains(token.as_str()) && token != super::super::DEV_SECRET {
                    missing.push(format!("{token}   ({})", path.display()));
                }
            }
        }
        missing.sort();
        missing.dedup();
        assert!(
            missing.is_empty(),
            "secrets quoted in the docs but not published; add each line to src/providers/published.txt:\n{}",
            missing.join("\n")
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
