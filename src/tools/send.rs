//! `fencehook send`: sign one delivery the way a provider's scheme does, send
//! it, print the answer. For demos and for trying a providers file by hand.
//!
//! The HMAC schemes sign with `--secret`; the RSA schemes with the private
//! key in `--private-key` (PEM, PKCS#8 or PKCS#1, as `openssl genpkey`
//! writes it), plus what each needs: `--serial` and `--apiv3-key`
//! (wechatpay), `--app-id` (alipay), `--webhook-id` and `--cert-url`
//! (paypal).
//!
//! With the providers file the service reads (`--providers`, or
//! `FENCEHOOK_PROVIDERS`), `--provider NAME` is enough for what the file
//! holds: the scheme, the secret (the first of `secrets`: wechatpay's APIv3
//! key), alipay's `app_id`, paypal's `webhook_id`. Never the private key: the
//! file names public keys only. Flags given on the command line win over the
//! file. [`PspArgs`] and [`Psp`] are shared with `fencehook load`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use fencehook::config::setting;
use fencehook::outbound;
use fencehook::providers::keys::RsaSigner;
pub use fencehook::providers::psp::{Credentials, Delivery, Key, Notice, PspError};
use fencehook::providers::{Provider, SchemeKind};
use http_body_util::{BodyExt, Full};

/// The environment variable of `--secret`: the built-in `generic`
/// provider's secret, which the service ignores once a providers file is
/// given.
pub const SECRET_ENV: &str = setting::FENCEHOOK_GENERIC_SECRET;
/// The environment variable of `--apiv3-key`.
pub const APIV3_KEY_ENV: &str = setting::FENCEHOOK_WECHATPAY_APIV3_KEY;

/// Who a delivery is signed as, and with what: the flags `send` and `load`
/// share.
#[derive(Debug, Clone, Args)]
pub struct PspArgs {
    /// Provider name in /webhooks/{provider}; with a providers file, the
    /// entry whose scheme and keys sign.
    #[arg(long, default_value = "generic")]
    pub provider: String,
    /// The providers file the service reads: --provider's entry gives the
    /// scheme and what the file holds of its keys (the first of `secrets`,
    /// alipay's app_id, paypal's webhook_id); flags given here win.
    #[arg(long, env = setting::FENCEHOOK_PROVIDERS, value_name = "FILE")]
    pub providers: Option<PathBuf>,
    /// Wire format: standard (Standard Webhooks, generic payload), stripe (a
    /// signed Stripe event), adyen (a one-item notification batch), wechatpay
    /// (an encrypted API v3 notification), alipay (a form-encoded
    /// notification), paypal (a v2 capture event), paddle (a Paddle Billing
    /// event), square (a Square payment or refund event), checkout (a
    /// Checkout.com event), razorpay (a Razorpay event), mollie (the form
    /// `id=tr_…` Mollie posts, unsigned: the payment's id, a refund's
    /// payment's; the service books what Mollie's API says of it, not the
    /// amount or type given here). Default: the providers file's, else
    /// standard.
    #[arg(long, value_parser = parse_scheme)]
    pub scheme: Option<SchemeKind>,
    /// Signing secret of the HMAC schemes: whsec_<base64> (standard), the
    /// endpoint's whsec_... (stripe), the HMAC key in hex (adyen), the
    /// notification destination's secret key pdl_ntf_... (paddle), the
    /// subscription's signature key (square), the webhook's signature key
    /// (checkout), the webhook secret (razorpay).
    #[arg(long, env = SECRET_ENV, hide_env_values = true)]
    pub secret: Option<String>,
    /// wechatpay, alipay, paypal: the PEM file of the RSA private key that
    /// plays the PSP's (its public key or certificate is in the providers
    /// file, which never holds the private key).
    #[arg(long, value_name = "FILE")]
    pub private_key: Option<PathBuf>,
    /// wechatpay: Wechatpay-Serial, the serial (or PUB_KEY_ID_…) the
    /// providers file maps to the public key of --private-key.
    #[arg(long)]
    pub serial: Option<String>,
    /// wechatpay: the APIv3 key (32 characters) that encrypts the resource.
    #[arg(long, env = APIV3_KEY_ENV, hide_env_values = true)]
    pub apiv3_key: Option<String>,
    /// alipay: the application's app_id.
    #[arg(long)]
    pub app_id: Option<String>,
    /// paypal: PAYPAL-CERT-URL, where the provider fetches the certificate
    /// of --private-key (under its cert_url_prefixes).
    #[arg(long)]
    pub cert_url: Option<String>,
    /// square: the notification URL the webhook subscription is registered
    /// with (part of what Square signs; the providers file's when absent).
    #[arg(long)]
    pub notification_url: Option<String>,
}

fn parse_scheme(s: &str) -> Result<SchemeKind, String> {
    s.parse()
}

fn psp_error(flag: &'static str, reason: impl Into<String>) -> PspError {
    PspError::new(flag, reason)
}

/// The flags a scheme's [`Key`]s are given by that have an environment
/// variable (hidden in `--help`: they are secrets).
const KEY_ENV: &[(&str, &str)] = &[("secret", SECRET_ENV), ("apiv3-key", APIV3_KEY_ENV)];

/// A flag's value unless it is merely its environment variable's. After
/// parsing, clap no longer says where a value came from, so a value equal to
/// the variable's is taken as the variable's: it then yields to the
/// providers file, as `FENCEHOOK_GENERIC_SECRET` does in the service.
fn on_command_line<'a>(
    value: Option<&'a str>,
    flag: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<&'a str> {
    let value = value?;
    let var = KEY_ENV
        .iter()
        .find(|(f, _)| *f == flag)
        .map(|(_, var)| *var);
    match var {
        Some(var) if env(var).as_deref() == Some(value) => None,
        _ => Some(value),
    }
}

impl PspArgs {
    /// The provider to sign as: flags given on the command line, then its
    /// entry in the providers file, then the defaults. `webhook_id` is
    /// paypal's (the caller's `--webhook-id`). Reads the private key, when
    /// given, once.
    pub fn resolve(&self, webhook_id: Option<&str>) -> Result<Psp, PspError> {
        let file = match &self.providers {
            Some(path) => Some((
                path.as_path(),
                fencehook::providers::load_file(path).map_err(|e| psp_error("providers", e))?,
            )),
            None => None,
        };
        let file = file
            .as_ref()
            .map(|(path, providers)| (*path, providers.as_slice()));
        self.resolve_in(file, webhook_id, &|var| std::env::var(var).ok())
    }

    /// The value of the flag a [`Key`] names (`webhook_id`: the caller's
    /// `--webhook-id`). A scheme whose PSP side asks for a key of a flag
    /// not here needs its flag added (to [`PspArgs`], and this match).
    fn flag<'a>(&'a self, flag: &str, webhook_id: Option<&'a str>) -> Option<&'a str> {
        match flag {
            "secret" => self.secret.as_deref(),
            "serial" => self.serial.as_deref(),
            "apiv3-key" => self.apiv3_key.as_deref(),
            "app-id" => self.app_id.as_deref(),
            "cert-url" => self.cert_url.as_deref(),
            "notification-url" => self.notification_url.as_deref(),
            "webhook-id" => webhook_id,
            _ => None,
        }
    }

    /// [`PspArgs::resolve`] with the providers file already read and the
    /// environment given (tests).
    fn resolve_in(
        &self,
        file: Option<(&Path, &[Provider])>,
        webhook_id: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Psp, PspError> {
        let entry = match file {
            None => None,
            Some((path, providers)) => Some(
                providers
                    .iter()
                    .find(|p| p.name == self.provider)
                    .ok_or_else(|| {
                        let names: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
                        psp_error(
                            "provider",
                            format!(
                                "`{}` is not in the providers file {} (it has {})",
                                self.provider,
                                path.display(),
                                names.join(", ")
                            ),
                        )
                    })?,
            ),
        };
        let scheme = self
            .scheme
            .or(entry.map(Provider::scheme))
            .unwrap_or(SchemeKind::Standard);
        // Each key the scheme asks for: its flag, else what the provider's
        // table gives of it (a flag that is only its environment
        // variable's yields to the table).
        let mut keys = BTreeMap::new();
        for key in scheme.spec().keys {
            let flag = self.flag(key.flag, webhook_id);
            let value = match entry {
                None => flag,
                Some(p) => on_command_line(flag, key.flag, env).or(p.psp_value(key)),
            };
            if let Some(value) = value {
                keys.insert(key.flag, value.to_owned());
            }
        }
        let signer = match &self.private_key {
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| psp_error("private-key", format!("{}: {e}", path.display())))?;
                Some(Arc::new(RsaSigner::from_pem(&pem).map_err(|e| {
                    psp_error("private-key", format!("{}: {e}", path.display()))
                })?))
            }
            None => None,
        };
        Ok(Psp {
            provider: self.provider.clone(),
            scheme,
            from_file: file.map(|(path, _)| path.display().to_string()),
            keys,
            signer,
        })
    }
}

/// Who a delivery is signed as: the provider, its scheme, and what signs for
/// it, from the flags and the providers file ([`PspArgs::resolve`]). A
/// key the scheme needs and did not get is an error when it is used,
/// naming its flag.
#[derive(Clone)]
pub struct Psp {
    pub provider: String,
    pub scheme: SchemeKind,
    /// The providers file the provider was found in, for messages.
    from_file: Option<String>,
    /// The scheme's keys, by flag.
    keys: BTreeMap<&'static str, String>,
    signer: Option<Arc<RsaSigner>>,
}

impl std::fmt::Debug for Psp {
    // Keys are never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Psp")
            .field("provider", &self.provider)
            .field("scheme", &self.scheme)
            .field("from_file", &self.from_file)
            .finish_non_exhaustive()
    }
}

impl Psp {
    /// Checks that everything the scheme signs a built delivery with is
    /// there and usable, so a run can refuse to start rather than fail every
    /// delivery.
    pub fn check(&self) -> Result<(), PspError> {
        self.scheme.spec().check(self)
    }
}

/// What each scheme asks for, answered from the flags and the providers
/// file, or the error naming the flag that gives it.
impl Credentials for Psp {
    fn key(&self, key: &Key) -> Result<&str, PspError> {
        self.keys.get(key.flag).map(String::as_str).ok_or_else(|| {
            let var = KEY_ENV
                .iter()
                .find(|(f, _)| *f == key.flag)
                .map(|(_, v)| *v);
            let file = key.in_file.then_some("a providers file");
            let or: Vec<&str> = var.into_iter().chain(file).collect();
            let or = if or.is_empty() {
                String::new()
            } else {
                format!(" (or {})", or.join(", or "))
            };
            psp_error(
                key.flag,
                format!("scheme {} needs {}{or}", self.scheme.as_str(), key.what),
            )
        })
    }

    /// The private key; its absence is explained as the file's when the
    /// provider came from one, since a user may expect the file to hold it.
    fn signer(&self) -> Result<&RsaSigner, PspError> {
        self.signer.as_deref().ok_or_else(|| {
            let reason = match &self.from_file {
                Some(file) => format!(
                    "provider `{}` ({}) signs with an RSA private key, which the providers file {file} cannot give (it holds public keys only): give the PEM file",
                    self.provider,
                    self.scheme.as_str()
                ),
                None => format!(
                    "scheme {} signs with an RSA private key: give the PEM file",
                    self.scheme.as_str()
                ),
            };
            psp_error("private-key", reason)
        })
    }
}

/// `fencehook send`: sign one delivery the way the provider's scheme does and send it.
#[derive(Debug, Clone, Args)]
pub struct SendArgs {
    /// Base URL of the public listener.
    #[arg(long, env = setting::FENCEHOOK_URL, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    #[command(flatten)]
    pub psp: PspArgs,
    /// The id of what the event is about: a payment's PaymentIntent id
    /// (stripe) or pspReference (adyen); for a refund or a dispute, its own
    /// id (`re_…`, `dp_…`; the refund's or dispute's pspReference).
    #[arg(long)]
    pub transaction_id: String,
    /// Amount in minor units (cents, fen).
    #[arg(long, default_value_t = 1000)]
    pub amount: i64,
    /// ISO 4217 code; default CNY for wechatpay and alipay, EUR otherwise.
    #[arg(long)]
    pub currency: Option<String>,
    /// payment.succeeded | payment.failed | refund.succeeded | refund.failed |
    /// dispute.funds_withdrawn | dispute.funds_reinstated, sent as the
    /// scheme's native event (see docs/providers.md); any other value is sent
    /// verbatim as the native type (e.g. customer.created, CAPTURE).
    #[arg(long, default_value = "payment.succeeded")]
    pub event_type: String,
    /// Send this raw JSON body instead of building one from the flags (adyen:
    /// every item's hmacSignature is computed and set).
    #[arg(long)]
    pub body: Option<String>,
    /// webhook-id header (standard), event id (stripe, checkout) or
    /// X-Razorpay-Event-Id (razorpay), default a new one per call; paypal: the webhook id the provider is configured with
    /// (part of what PayPal signs; the providers file's when absent).
    #[arg(long)]
    pub webhook_id: Option<String>,
    /// Refunds and disputes: the transaction id of the payment they take
    /// money from (a PaymentIntent id, or a Charge id for a payment without
    /// one, for stripe; the payment's pspReference for adyen, sent as
    /// `originalReference`). Required to build a stripe or adyen refund or
    /// dispute; the standard scheme sends what it is given.
    #[arg(long)]
    pub payment_transaction_id: Option<String>,
}

impl SendArgs {
    /// What the delivery announces, in `scheme`'s usual currency unless
    /// `--currency` says otherwise.
    pub fn notice(&self, scheme: SchemeKind) -> Notice {
        Notice {
            transaction_id: self.transaction_id.clone(),
            amount: self.amount,
            currency: self
                .currency
                .clone()
                .unwrap_or_else(|| scheme.spec().currency.to_owned()),
            event_type: self.event_type.clone(),
            payment_transaction_id: self.payment_transaction_id.clone(),
        }
    }
}

/// Sends the delivery; returns the HTTP status and body text.
pub async fn send(args: &SendArgs) -> Result<(u16, String), String> {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as i64;
    let psp = args.psp.resolve(args.webhook_id.as_deref())?;
    // A scheme whose PSP side asks for a webhook id (paypal) reads
    // --webhook-id as the provider's, not the delivery's.
    let delivery_id = if psp
        .scheme
        .spec()
        .keys
        .iter()
        .any(|k| k.flag == "webhook-id")
    {
        None
    } else {
        args.webhook_id.as_deref()
    };
    let Delivery {
        body,
        headers,
        content_type,
    } = build_delivery(
        &psp,
        &args.notice(psp.scheme),
        args.body.as_deref(),
        delivery_id,
        ts,
    )?;
    let uri = format!(
        "{}/webhooks/{}",
        args.url.trim_end_matches('/'),
        psp.provider
    );
    let mut req = hyper::Request::post(&uri).header("content-type", content_type);
    for (name, value) in headers {
        req = req.header(name, value);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("bad request for {uri}: {e}"))?;
    let resp = outbound::new(Duration::from_secs(5))
        .request(req)
        .await
        .map_err(|e| {
            if e.is_connect() {
                format!(
                    "cannot reach {uri}: {} (is `fencehook serve` running there?)",
                    fencehook::report::chain(&e)
                )
            } else {
                format!("POST {uri}: {}", fencehook::report::chain(&e))
            }
        })?;
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let mut out = String::from_utf8_lossy(&text).into_owned();
    if let Some(r) = retry_after {
        out.push_str(&format!(" (Retry-After: {r})"));
    }
    Ok((status, out))
}

/// The delivery of `notice`, shaped and signed as `psp.scheme` does at unix
/// time `ts` (the scheme's PSP side). `body` replaces the built body (signed
/// as is; adyen's items signed, alipay's form re-signed); `delivery_id` is
/// the delivery's own id where the scheme has one (standard's webhook-id,
/// the event id of stripe and paypal, wechatpay's notification id), a new
/// one when `None`.
pub fn build_delivery(
    psp: &Psp,
    notice: &Notice,
    body: Option<&str>,
    delivery_id: Option<&str>,
    ts: i64,
) -> Result<Delivery, String> {
    let spec = psp.scheme.spec();
    let delivery_id = match delivery_id {
        Some(id) => id.to_owned(),
        None => format!(
            "{}{}",
            spec.delivery_id_prefix,
            uuid::Uuid::new_v4().simple()
        ),
    };
    spec.deliver(psp, notice, body, &delivery_id, ts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencehook::providers::psp::{names_a_payment, SECRET};
    use fencehook::providers::Item;

    const STANDARD: &str = "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM=";
    const STRIPE: &str = "whsec_stripe_cli_test";
    const ADYEN: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// The id `send` is given for each kind: the payment's, the refund's or
    /// the dispute's own.
    fn id_for(event_type: &str) -> &'static str {
        match event_type.split('.').next() {
            Some("refund") => "re_cli_1",
            Some("dispute") => "dp_cli_1",
            _ => "pi_cli_1",
        }
    }

    /// No flags but `--provider p`; no providers file, no environment.
    fn psp_args() -> PspArgs {
        PspArgs {
            provider: "p".into(),
            providers: None,
            scheme: None,
            secret: None,
            private_key: None,
            serial: None,
            apiv3_key: None,
            app_id: None,
            cert_url: None,
            notification_url: None,
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn psp(scheme: SchemeKind, secret: &str) -> Psp {
        let args = PspArgs {
            scheme: Some(scheme),
            secret: Some(secret.into()),
            ..psp_args()
        };
        args.resolve_in(None, None, &no_env).unwrap()
    }

    fn notice(event_type: &str) -> Notice {
        Notice {
            transaction_id: id_for(event_type).into(),
            amount: 1234,
            currency: "EUR".into(),
            event_type: event_type.into(),
            payment_transaction_id: names_a_payment(event_type).then(|| "pi_cli_0".to_owned()),
        }
    }

    fn accepted(provider: &Provider, delivery: Delivery) -> Vec<Item> {
        let mut h = http::HeaderMap::new();
        for (name, value) in delivery.headers {
            h.insert(name, value.parse().unwrap());
        }
        block_on(provider.accept(&h, delivery.body.as_bytes(), 1_700_000_000))
            .expect("the provider accepts what send signs")
    }

    #[test]
    fn a_psp_shaped_refund_or_dispute_without_its_payment_is_not_built() {
        for scheme in [SchemeKind::Stripe, SchemeKind::Adyen] {
            for event_type in ["refund.succeeded", "dispute.funds_withdrawn"] {
                let mut n = notice(event_type);
                n.payment_transaction_id = None;
                let err =
                    build_delivery(&psp(scheme, ADYEN), &n, None, None, 1_700_000_000).unwrap_err();
                assert!(err.contains("--payment-transaction-id"), "{err}");
            }
        }
    }

    #[test]
    fn a_stripe_refund_of_a_payment_without_payment_intent_names_its_charge() {
        let mut n = notice("refund.succeeded");
        n.payment_transaction_id = Some("ch_legacy_1".into());
        let delivery = build_delivery(
            &psp(SchemeKind::Stripe, STRIPE),
            &n,
            None,
            None,
            1_700_000_000,
        )
        .unwrap();
        let provider = Provider::new("p", SchemeKind::Stripe, &[STRIPE.to_owned()], None).unwrap();
        let items = accepted(&provider, delivery);
        let [Item::Event(e)] = items.as_slice() else {
            panic!("{items:?}")
        };
        assert_eq!(e.parent_transaction_id.as_deref(), Some("ch_legacy_1"));
    }

    #[test]
    fn a_standard_delivery_without_a_currency_flag_is_in_euros() {
        let args = SendArgs {
            url: "http://127.0.0.1:1".into(),
            psp: psp_args(),
            transaction_id: "tx_1".into(),
            amount: 100,
            currency: None,
            event_type: "payment.succeeded".into(),
            body: None,
            webhook_id: None,
            payment_transaction_id: None,
        };
        let delivery = build_delivery(
            &psp(SchemeKind::Standard, STANDARD),
            &args.notice(SchemeKind::Standard),
            None,
            None,
            1_700_000_000,
        )
        .unwrap();
        let body: serde_json::Value = serde_json::from_str(&delivery.body).unwrap();
        assert_eq!(body["currency"], "EUR");
        assert_eq!(args.notice(SchemeKind::Alipay).currency, "CNY");
    }

    const FILE: &str = r#"
[providers.shop]
scheme = "stripe"
secrets = ["whsec_new_endpoint", "whsec_old_endpoint"]

[providers.generic]
scheme = "standard"
secrets = ["whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM="]
"#;

    fn from_file(args: &PspArgs, env: &dyn Fn(&str) -> Option<String>) -> Result<Psp, PspError> {
        let providers = Provider::from_toml_str(FILE).unwrap();
        args.resolve_in(Some((Path::new("providers.toml"), &providers)), None, env)
    }

    #[test]
    fn a_provider_of_the_file_gives_its_scheme_and_first_secret() {
        let args = PspArgs {
            provider: "shop".into(),
            ..psp_args()
        };
        let psp = from_file(&args, &no_env).unwrap();
        assert_eq!(psp.scheme, SchemeKind::Stripe);
        assert_eq!(psp.key(&SECRET), Ok("whsec_new_endpoint"));
        assert!(psp.check().is_ok());
        let shown = format!("{psp:?}");
        assert!(!shown.contains("whsec"), "{shown}");
    }

    #[test]
    fn flags_on_the_command_line_win_over_the_file_and_the_environment_does_not() {
        let args = PspArgs {
            provider: "shop".into(),
            secret: Some("whsec_from_the_command_line".into()),
            ..psp_args()
        };
        assert_eq!(
            from_file(&args, &no_env).unwrap().key(&SECRET),
            Ok("whsec_from_the_command_line")
        );
        // The same value from FENCEHOOK_GENERIC_SECRET: the built-in
        // generic provider's, which a file's provider does not use.
        let env = |var: &str| (var == SECRET_ENV).then(|| "whsec_from_the_command_line".to_owned());
        assert_eq!(
            from_file(&args, &env).unwrap().key(&SECRET),
            Ok("whsec_new_endpoint")
        );
        let args = PspArgs {
            scheme: Some(SchemeKind::Standard),
            ..args
        };
        assert_eq!(
            from_file(&args, &no_env).unwrap().scheme,
            SchemeKind::Standard
        );
        // Without a file, the environment's value is the secret, as before.
        assert_eq!(
            args.resolve_in(None, None, &env).unwrap().key(&SECRET),
            Ok("whsec_from_the_command_line")
        );
    }

    #[test]
    fn a_provider_the_file_does_not_have_is_an_error_naming_those_it_has() {
        let args = PspArgs {
            provider: "shpo".into(),
            ..psp_args()
        };
        let err = from_file(&args, &no_env).unwrap_err();
        assert_eq!(err.flag, "provider");
        assert_eq!(
            err.to_string(),
            "--provider: `shpo` is not in the providers file providers.toml (it has generic, shop)"
        );
    }

    #[test]
    fn without_a_file_the_scheme_is_standard_and_a_missing_secret_names_the_flag() {
        let unsigned = psp_args().resolve_in(None, None, &no_env).unwrap();
        assert_eq!(unsigned.scheme, SchemeKind::Standard);
        assert_eq!(unsigned.check().unwrap_err().flag, "secret");
        let bad = psp(SchemeKind::Standard, "hunter2").check().unwrap_err();
        assert_eq!(bad.flag, "secret");
    }
}

/// `send` for the RSA schemes, against providers that know the test keys.
#[cfg(all(test, feature = "test-support"))]
mod rsa_tests {
    use std::path::PathBuf;

    use super::*;
    use fencehook::domain::EventKind;
    use fencehook::providers::{testkeys, Item, Provider};

    const SERIAL: &str = "PUB_KEY_ID_0000000000000024101100397200000006";
    const APIV3: &str = "fencehook-send-apiv3-key-32bytes";
    /// The secret of each HMAC scheme's provider (`--secret`).
    const SECRETS: &[(SchemeKind, &str)] = &[
        (SchemeKind::Standard, "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM="),
        (SchemeKind::Stripe, "whsec_stripe_cli_test"),
        (
            SchemeKind::Adyen,
            "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
        ),
        (
            SchemeKind::Paddle,
            "pdl_ntf_01hv8x0sendtestsecretxxxx_c2VuZCB0ZXN0IHNlY3JldCBmb3IgcGFkZGxl",
        ),
        (SchemeKind::Square, "fencehook-send-test-square-key"),
        (
            SchemeKind::Checkout,
            "fencehook-send-checkout-signature-key",
        ),
        (
            SchemeKind::Razorpay,
            "fencehook-send-razorpay-webhook-secret",
        ),
    ];

    fn secret_of(scheme: SchemeKind) -> Option<&'static str> {
        SECRETS.iter().find(|(k, _)| *k == scheme).map(|(_, s)| *s)
    }
    const APP_ID: &str = "2021000000000000";
    const WEBHOOK_ID: &str = "WH-SEND-TEST";
    const CERT_URL: &str = "https://api.paypal.com/v1/notifications/certs/CERT-send-test";
    const NOTIFICATION_URL: &str = "https://hooks.example.com/webhooks/square";
    const MOLLIE_KEY: &str = "test_fencehookUnitTestKey0123456789abc";
    const NOW: i64 = 1_700_000_000;

    /// Test key 0's private key in a file, as a user would pass it.
    fn key_file() -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "fencehook-send-test-{}-{}.pem",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&path, testkeys::private_key_pem(0)).unwrap();
        path
    }

    /// The table of a provider `name` of `scheme` that knows test key 0
    /// (`key.pem` beside the file).
    fn table(name: &str, scheme: SchemeKind) -> String {
        let settings = match (scheme, secret_of(scheme)) {
            (SchemeKind::Square, Some(secret)) => {
                format!("secrets = [\"{secret}\"]\nnotification_url = \"{NOTIFICATION_URL}\"")
            }
            (_, Some(secret)) => format!("secrets = [\"{secret}\"]"),
            (SchemeKind::Mollie, None) => {
                format!("api_key = \"{MOLLIE_KEY}\"\napi_url = \"http://127.0.0.1:9\"")
            }
            (SchemeKind::WechatPay, None) => {
                format!("secrets = [\"{APIV3}\"]\nplatform_keys = {{ {SERIAL} = \"key.pem\" }}")
            }
            (SchemeKind::Alipay, None) => {
                format!("app_id = \"{APP_ID}\"\npublic_keys = [\"key.pem\"]")
            }
            _ => format!("webhook_id = \"{WEBHOOK_ID}\""),
        };
        format!(
            "[providers.{name}]\nscheme = \"{}\"\n{settings}\n",
            scheme.as_str()
        )
    }

    /// The providers of these tables, test key 0's public key beside them.
    fn providers(tables: &str) -> Vec<Provider> {
        let key = testkeys::public_key_pem(0);
        testkeys::providers_file(tables, &[("key.pem", key.as_bytes())]).unwrap()
    }

    fn provider(scheme: SchemeKind) -> Provider {
        let p = providers(&table("p", scheme)).remove(0);
        if scheme == SchemeKind::Paypal {
            let cert = testkeys::certificate(
                0,
                "0ABC",
                "CN=messageverificationcerts.paypal.com",
                0,
                4_000_000_000,
            );
            p.preload_paypal_certificate(CERT_URL, cert.as_bytes())
                .unwrap();
        }
        p
    }

    /// Every flag a scheme may need.
    fn psp_args(scheme: SchemeKind, key: &std::path::Path) -> PspArgs {
        PspArgs {
            provider: "p".into(),
            providers: None,
            scheme: Some(scheme),
            secret: secret_of(scheme).map(str::to_owned),
            private_key: Some(key.to_owned()),
            serial: Some(SERIAL.into()),
            apiv3_key: Some(APIV3.into()),
            app_id: Some(APP_ID.into()),
            cert_url: Some(CERT_URL.into()),
            notification_url: Some(NOTIFICATION_URL.into()),
        }
    }

    fn resolve(args: &PspArgs) -> Result<Psp, PspError> {
        args.resolve_in(None, Some(WEBHOOK_ID), &|_| None)
    }

    fn notice(scheme: SchemeKind, event_type: &str) -> Notice {
        let refund_like = event_type.starts_with("refund.") || event_type.starts_with("dispute.");
        Notice {
            transaction_id: if refund_like { "RF-1" } else { "PAY-1" }.into(),
            amount: 1234,
            currency: scheme.spec().currency.into(),
            event_type: event_type.into(),
            payment_transaction_id: refund_like.then(|| "PAY-0".to_owned()),
        }
    }

    fn received(psp: &Psp, n: &Notice) -> Result<Item, String> {
        let Delivery {
            body,
            headers,
            content_type,
        } = build_delivery(psp, n, None, None, NOW)?;
        let mut h = http::HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
        for (name, value) in headers {
            h.insert(name, value.parse().unwrap());
        }
        let p = provider(psp.scheme);
        assert!(p.accepts_content_type(&h), "{psp:?}: {content_type}");
        let mut items = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(p.accept(&h, body.as_bytes(), NOW))
            .map_err(|e| format!("{psp:?} {}: {e}", n.event_type))?;
        assert_eq!(items.len(), 1);
        Ok(items.remove(0))
    }

    /// What each scheme's delivery carries, shape and ids, is its own
    /// round-trip property (providers::<scheme>::round_trip); here, that
    /// `send` hands every scheme the keys of its flags.
    #[test]
    fn send_builds_each_kind_a_psp_sends_as_a_delivery_its_provider_maps_to_that_kind_and_refuses_the_others(
    ) {
        let key = key_file();
        for &scheme in SchemeKind::ALL {
            let psp = resolve(&psp_args(scheme, &key)).unwrap();
            assert_eq!(psp.check(), Ok(()));
            for &kind in EventKind::ALL {
                let n = notice(scheme, kind.as_str());
                if !scheme.spec().sends(kind) {
                    let err = build_delivery(&psp, &n, None, None, NOW).unwrap_err();
                    assert!(
                        err.contains("sends no notification"),
                        "{scheme:?} {kind:?}: {err}"
                    );
                    continue;
                }
                if scheme == SchemeKind::Mollie {
                    // The form names the payment; what is booked is what
                    // Mollie's API answers (tests/api/psp_mollie.rs).
                    let d = build_delivery(&psp, &n, None, None, NOW).unwrap();
                    let named = n.payment_transaction_id.as_deref().unwrap_or("PAY-1");
                    assert_eq!(d.body, format!("id={named}"), "{kind:?}");
                    continue;
                }
                match received(&psp, &n) {
                    Ok(Item::Event(e)) => assert_eq!(
                        (
                            e.event_type,
                            e.parent_transaction_id.as_deref(),
                            e.amount_minor,
                            e.currency.as_str()
                        ),
                        (
                            kind,
                            n.payment_transaction_id.as_deref(),
                            1234,
                            scheme.spec().currency
                        ),
                        "{scheme:?}"
                    ),
                    other => panic!("{scheme:?} {kind:?}: {other:?}"),
                }
            }
        }
        // Native types the provider does not book: ignored.
        for (scheme, native) in [
            (SchemeKind::Standard, "customer.created"),
            (SchemeKind::Stripe, "customer.created"),
            (SchemeKind::Adyen, "CAPTURE"),
            (SchemeKind::WechatPay, "REFUND.ABNORMAL"),
            (SchemeKind::Alipay, "WAIT_BUYER_PAY"),
            (SchemeKind::Paypal, "PAYMENT.CAPTURE.PENDING"),
            (SchemeKind::Paddle, "transaction.paid"),
            (SchemeKind::Square, "order.updated"),
            (SchemeKind::Checkout, "payment_approved"),
            (SchemeKind::Razorpay, "payment.authorized"),
        ] {
            let mut n = notice(scheme, native);
            n.payment_transaction_id = Some("PAY-0".into());
            let psp = resolve(&psp_args(scheme, &key)).unwrap();
            assert!(
                matches!(received(&psp, &n), Ok(Item::Ignored { .. })),
                "{scheme:?} {native}"
            );
        }
        let _ = std::fs::remove_file(key);
    }

    #[test]
    fn what_each_rsa_scheme_needs_is_asked_for_by_flag() {
        let key = key_file();
        for (scheme, clear, flag) in [
            (SchemeKind::WechatPay, "serial", "--serial"),
            (SchemeKind::WechatPay, "apiv3_key", "--apiv3-key"),
            (SchemeKind::WechatPay, "private_key", "--private-key"),
            (SchemeKind::Alipay, "app_id", "--app-id"),
            (SchemeKind::Paypal, "webhook_id", "--webhook-id"),
            (SchemeKind::Paypal, "cert_url", "--cert-url"),
        ] {
            let mut a = psp_args(scheme, &key);
            let mut webhook_id = Some(WEBHOOK_ID);
            match clear {
                "serial" => a.serial = None,
                "apiv3_key" => a.apiv3_key = None,
                "private_key" => a.private_key = None,
                "app_id" => a.app_id = None,
                "webhook_id" => webhook_id = None,
                _ => a.cert_url = None,
            }
            let psp = a.resolve_in(None, webhook_id, &|_| None).unwrap();
            let err = build_delivery(&psp, &notice(scheme, "payment.succeeded"), None, None, NOW)
                .unwrap_err();
            assert!(err.contains(flag), "{scheme:?}: {err}");
            assert!(
                psp.check().unwrap_err().to_string().contains(flag),
                "{scheme:?}"
            );
        }
        let psp = resolve(&psp_args(SchemeKind::Alipay, &key)).unwrap();
        let mut n = notice(SchemeKind::Alipay, "payment.succeeded");
        n.currency = "USD".into();
        assert!(build_delivery(&psp, &n, None, None, NOW)
            .unwrap_err()
            .contains("CNY"));
        let mut missing = psp_args(SchemeKind::Alipay, &key);
        missing.private_key = Some(key.with_extension("missing"));
        assert_eq!(resolve(&missing).unwrap_err().flag, "private-key");
        let _ = std::fs::remove_file(key);
    }

    #[test]
    fn a_providers_file_gives_the_apiv3_key_the_app_id_and_the_webhook_id_but_never_the_private_key(
    ) {
        let key = key_file();
        let providers = providers(
            &[
                SchemeKind::WechatPay,
                SchemeKind::Alipay,
                SchemeKind::Paypal,
            ]
            .map(|scheme| table(scheme.as_str(), scheme))
            .concat(),
        );
        let file = Some((Path::new("providers.toml"), providers.as_slice()));
        for scheme in [
            SchemeKind::WechatPay,
            SchemeKind::Alipay,
            SchemeKind::Paypal,
        ] {
            let only_name = PspArgs {
                provider: scheme.as_str().into(),
                providers: None,
                scheme: None,
                secret: None,
                private_key: None,
                serial: None,
                apiv3_key: None,
                app_id: None,
                cert_url: None,
                notification_url: None,
            };
            let psp = only_name.resolve_in(file, None, &|_| None).unwrap();
            assert_eq!(psp.scheme, scheme);
            let err = psp.signer().unwrap_err();
            assert_eq!(err.flag, "private-key");
            assert!(err.reason.contains("holds public keys only"), "{err}");
            // With the private key, and what the file cannot know (the
            // serial, the certificate's URL), it signs what the provider accepts.
            let with_key = PspArgs {
                private_key: Some(key.clone()),
                serial: Some(SERIAL.into()),
                cert_url: Some(CERT_URL.into()),
                ..only_name
            };
            let psp = with_key.resolve_in(file, None, &|_| None).unwrap();
            assert_eq!(psp.check(), Ok(()));
            assert!(
                matches!(
                    received(&psp, &notice(scheme, "payment.succeeded")),
                    Ok(Item::Event(_))
                ),
                "{scheme:?}"
            );
        }
        let _ = std::fs::remove_file(key);
    }
}
