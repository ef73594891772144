//! RSA public keys and certificates for the schemes that sign with RSA
//! (`wechatpay`, `alipay`, `paypal`), and the one SHA256withRSA check they share.
//!
//! A key can be given as a PEM public key (`BEGIN PUBLIC KEY`, SPKI; or
//! `BEGIN RSA PUBLIC KEY`, PKCS#1), a PEM or DER X.509 certificate (its
//! subject key is used), or the bare base64 of a DER SubjectPublicKeyInfo,
//! the form Alipay's console and SDKs hand out. Only RSA keys of 2048 to 8192
//! bits verify (ring's `RSA_PKCS1_2048_8192_SHA256`): the PSPs' keys are 2048.
//!
//! Parsing is DER via x509-cert (pure Rust); the arithmetic is ring's.
//! Verification is public-key only; signing (for `fencehook send` and the
//! tests) is ring's constant-time RSA.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ring::signature::{self, RsaKeyPair, UnparsedPublicKey};
use x509_cert::der::{Decode, Encode};
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::Certificate;

/// `rsaEncryption` (PKCS #1): the only key algorithm these schemes use.
const RSA_ENCRYPTION: &str = "1.2.840.113549.1.1.1";

/// An RSA public key, kept as its PKCS#1 `RSAPublicKey` DER (what ring reads).
#[derive(Clone, PartialEq, Eq)]
pub struct RsaPublicKey {
    pkcs1: Vec<u8>,
}

impl std::fmt::Debug for RsaPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RsaPublicKey")
    }
}

impl RsaPublicKey {
    /// The key of a DER SubjectPublicKeyInfo; refused unless it is RSA.
    pub fn from_spki_der(der: &[u8]) -> Result<RsaPublicKey, String> {
        let spki = SubjectPublicKeyInfoOwned::from_der(der)
            .map_err(|e| format!("not a DER SubjectPublicKeyInfo: {e}"))?;
        RsaPublicKey::from_spki(&spki)
    }

    fn from_spki(spki: &SubjectPublicKeyInfoOwned) -> Result<RsaPublicKey, String> {
        if spki.algorithm.oid.to_string() != RSA_ENCRYPTION {
            return Err(format!(
                "the key is not an RSA key (algorithm {})",
                spki.algorithm.oid
            ));
        }
        let pkcs1 = spki
            .subject_public_key
            .as_bytes()
            .ok_or("the key's BIT STRING has unused bits")?
            .to_vec();
        RsaPublicKey::from_pkcs1_der(pkcs1)
    }

    fn from_pkcs1_der(pkcs1: Vec<u8>) -> Result<RsaPublicKey, String> {
        let bits = modulus_bits(&pkcs1).ok_or("not a PKCS#1 RSAPublicKey")?;
        if !(2048..=8192).contains(&bits) {
            return Err(format!(
                "an RSA key of {bits} bits (2048 to 8192 are accepted)"
            ));
        }
        Ok(RsaPublicKey { pkcs1 })
    }

    /// A key as a file or setting holds it: PEM (`PUBLIC KEY`, `RSA PUBLIC
    /// KEY` or `CERTIFICATE`: the first block), DER (SPKI or certificate), or
    /// bare base64 of a DER SPKI (whitespace allowed).
    pub fn parse(bytes: &[u8]) -> Result<RsaPublicKey, String> {
        let text = std::str::from_utf8(bytes).ok();
        if let Some(pem) = text.and_then(|t| first_pem_block(t)) {
            let (label, der) = x509_cert::der::pem::decode_vec(pem.as_bytes())
                .map_err(|e| format!("not valid PEM: {e}"))?;
            return match label {
                "PUBLIC KEY" => RsaPublicKey::from_spki_der(&der),
                "RSA PUBLIC KEY" => RsaPublicKey::from_pkcs1_der(der),
                "CERTIFICATE" => Ok(CertificateInfo::from_der(&der)?.key),
                other => Err(format!(
                    "a PEM `{other}` block; expected PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE"
                )),
            };
        }
        if let Some(text) = text {
            let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            if let Ok(der) = B64.decode(compact.as_bytes()) {
                return RsaPublicKey::from_spki_der(&der);
            }
        }
        // Raw DER: a certificate or an SPKI.
        match CertificateInfo::from_der(bytes) {
            Ok(cert) => Ok(cert.key),
            Err(_) => RsaPublicKey::from_spki_der(bytes)
                .map_err(|_| "neither PEM, base64 nor DER of a public key or certificate".into()),
        }
    }

    /// Whether `signature` is a SHA256withRSA (PKCS#1 v1.5) signature of
    /// `message` by this key.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&signature::RSA_PKCS1_2048_8192_SHA256, &self.pkcs1)
            .verify(message, signature)
            .is_ok()
    }

    /// The key as PEM `PUBLIC KEY` (SPKI).
    pub fn to_pem(&self) -> String {
        use x509_cert::der::asn1::BitString;
        use x509_cert::spki::AlgorithmIdentifierOwned;
        let spki = SubjectPublicKeyInfoOwned {
            algorithm: AlgorithmIdentifierOwned {
                oid: RSA_ENCRYPTION.parse().expect("a valid OID"),
                parameters: Some(x509_cert::der::asn1::Null.into()),
            },
            subject_public_key: BitString::from_bytes(&self.pkcs1).expect("any bytes"),
        };
        let der = spki.to_der().expect("an SPKI encodes");
        x509_cert::der::pem::encode_string("PUBLIC KEY", x509_cert::der::pem::LineEnding::LF, &der)
            .expect("PEM encodes")
    }
}

/// The first `-----BEGIN …-----` … `-----END …-----` block of a text, if any
/// (certificate files often carry a chain, or text before the block).
fn first_pem_block(text: &str) -> Option<&str> {
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start..];
    let end_marker = rest.find("-----END ")?;
    let close = rest[end_marker + 9..].find("-----")? + end_marker + 9 + 5;
    Some(&rest[..close])
}

/// The bit length of the modulus of a PKCS#1 `RSAPublicKey` DER, if it is one.
fn modulus_bits(pkcs1: &[u8]) -> Option<usize> {
    use x509_cert::der::asn1::UintRef;
    use x509_cert::der::{Reader, SliceReader};
    let mut reader = SliceReader::new(pkcs1).ok()?;
    let (n, e) = reader
        .sequence(|r| Ok((r.decode::<UintRef<'_>>()?, r.decode::<UintRef<'_>>()?)))
        .ok()?;
    reader.finish(()).ok()?;
    let n = n.as_bytes();
    let first = *n.first()?;
    if e.as_bytes().is_empty() {
        return None;
    }
    Some((n.len() - 1) * 8 + (8 - first.leading_zeros() as usize))
}

/// What the schemes need from an X.509 certificate.
#[derive(Debug, Clone)]
pub struct CertificateInfo {
    pub key: RsaPublicKey,
    /// The serial number in upper-case hex, without leading zeros (how
    /// WeChat Pay names a platform certificate in `Wechatpay-Serial`).
    pub serial_hex: String,
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
}

impl CertificateInfo {
    pub fn from_der(der: &[u8]) -> Result<CertificateInfo, String> {
        let cert =
            Certificate::from_der(der).map_err(|e| format!("not a DER X.509 certificate: {e}"))?;
        CertificateInfo::of(&cert)
    }

    /// The first certificate of a PEM text (a leaf followed by its chain is
    /// usual), or of DER bytes.
    pub fn parse(bytes: &[u8]) -> Result<CertificateInfo, String> {
        match std::str::from_utf8(bytes).ok().and_then(first_pem_block) {
            Some(pem) => {
                let (label, der) = x509_cert::der::pem::decode_vec(pem.as_bytes())
                    .map_err(|e| format!("not valid PEM: {e}"))?;
                if label != "CERTIFICATE" {
                    return Err(format!("a PEM `{label}` block, not a CERTIFICATE"));
                }
                CertificateInfo::from_der(&der)
            }
            None => CertificateInfo::from_der(bytes),
        }
    }

    fn of(cert: &Certificate) -> Result<CertificateInfo, String> {
        let tbs = &cert.tbs_certificate;
        let key = RsaPublicKey::from_spki(&tbs.subject_public_key_info)?;
        let serial = tbs.serial_number.as_bytes();
        let trimmed = match serial.iter().position(|b| *b != 0) {
            Some(i) => &serial[i..],
            None => &serial[serial.len().saturating_sub(1)..],
        };
        let secs = |t: x509_cert::time::Time| {
            i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
        };
        Ok(CertificateInfo {
            key,
            serial_hex: hex::encode_upper(trimmed),
            not_before: secs(tbs.validity.not_before),
            not_after: secs(tbs.validity.not_after),
        })
    }

    /// Whether `now` (unix seconds) is within the validity period.
    pub fn is_valid_at(&self, now: i64) -> bool {
        self.not_before <= now && now <= self.not_after
    }
}

/// An RSA private key that signs SHA256withRSA (PKCS#1 v1.5), as the PSPs
/// do: for `fencehook send` and the tests.
pub struct RsaSigner {
    key: RsaKeyPair,
}

impl std::fmt::Debug for RsaSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RsaSigner")
    }
}

impl RsaSigner {
    /// A PEM private key: `PRIVATE KEY` (PKCS#8) or `RSA PRIVATE KEY` (PKCS#1),
    /// as `openssl genpkey` / `openssl genrsa` write them.
    pub fn from_pem(pem: &[u8]) -> Result<RsaSigner, String> {
        let text = std::str::from_utf8(pem).map_err(|_| "the key file is not text (PEM)")?;
        let block = first_pem_block(text).ok_or("no PEM block in the key file")?;
        let (label, der) = x509_cert::der::pem::decode_vec(block.as_bytes())
            .map_err(|e| format!("not valid PEM: {e}"))?;
        let key = match label {
            "PRIVATE KEY" => RsaKeyPair::from_pkcs8(&der),
            "RSA PRIVATE KEY" => RsaKeyPair::from_der(&der),
            other => {
                return Err(format!(
                    "a PEM `{other}` block; expected PRIVATE KEY or RSA PRIVATE KEY"
                ))
            }
        }
        .map_err(|e| format!("not a usable RSA private key (2048 bits or more): {e}"))?;
        Ok(RsaSigner { key })
    }

    /// The SHA256withRSA signature of `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let mut sig = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &signature::RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                message,
                &mut sig,
            )
            .expect("the buffer is the modulus length");
        sig
    }

    /// The base64 of [`RsaSigner::sign`], the form every one of these PSPs sends.
    pub fn sign_base64(&self, message: &[u8]) -> String {
        B64.encode(self.sign(message))
    }

    /// The matching public key.
    pub fn public_key(&self) -> RsaPublicKey {
        RsaPublicKey {
            pkcs1: self.key.public().as_ref().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

    fn read(path: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn a_key_is_read_from_pem_bare_base64_der_or_a_certificate_and_they_agree() {
        let signer = super::super::testkeys::signer(0);
        let key = signer.public_key();
        let pem = key.to_pem();
        assert_eq!(RsaPublicKey::parse(pem.as_bytes()).unwrap(), key);
        let base64: String = pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(RsaPublicKey::parse(base64.as_bytes()).unwrap(), key);
        let der = x509_cert::der::pem::decode_vec(pem.as_bytes()).unwrap().1;
        assert_eq!(RsaPublicKey::parse(&der).unwrap(), key);
        let cert = super::super::testkeys::certificate(0, "ABC123", "CN=test", 0, 4_000_000_000);
        assert_eq!(RsaPublicKey::parse(cert.as_bytes()).unwrap(), key);
        let info = CertificateInfo::parse(cert.as_bytes()).unwrap();
        assert_eq!(info.serial_hex, "ABC123");
        assert!(info.is_valid_at(1) && !info.is_valid_at(4_000_000_001));
        let message = b"{ts}\n{nonce}\n{body}\n";
        assert!(key.verifies(message, &signer.sign(message)));
        assert!(!key.verifies(b"other bytes", &signer.sign(message)));
        assert!(!super::super::testkeys::signer(1)
            .public_key()
            .verifies(message, &signer.sign(message)));
    }

    #[test]
    fn the_psps_published_keys_and_certificates_parse() {
        for path in [
            "alipay/payment_trade_success.sandbox.alipay_public_key.txt",
            "alipay/refund_full_trade_closed.alipay_public_key.txt",
            "wechatpay/sdk_vector_wechatpay_go/platform_cert_test.pem",
            "paypal/CERT-360caa42-fca2a594-1a5f47cb.pem",
        ] {
            RsaPublicKey::parse(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
        let wechat = CertificateInfo::parse(&read(
            "wechatpay/sdk_vector_wechatpay_go/platform_cert_test.pem",
        ))
        .unwrap();
        assert_eq!(wechat.serial_hex, "D7CE59D1F522D701");
        let paypal =
            CertificateInfo::parse(&read("paypal/CERT-360caa42-fca2a594-1a5f47cb.pem")).unwrap();
        // Valid 2024-03-08 to 2025-03-07.
        assert!(paypal.is_valid_at(1_722_627_304));
        assert!(!paypal.is_valid_at(1_741_478_400));
    }

    #[test]
    fn what_is_no_rsa_key_is_refused_with_a_reason() {
        for bad in [
            &b""[..],
            b"not a key",
            b"-----BEGIN PUBLIC KEY-----\n%%%\n-----END PUBLIC KEY-----\n",
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            b"MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A",
        ] {
            assert!(RsaPublicKey::parse(bad).is_err(), "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn key_and_certificate_parsers_never_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
            text in "(-----BEGIN (PUBLIC KEY|CERTIFICATE)-----\n)?[A-Za-z0-9+/=\n]{0,300}(\n-----END (PUBLIC KEY|CERTIFICATE)-----)?",
        ) {
            let _ = RsaPublicKey::parse(&bytes);
            let _ = CertificateInfo::parse(&bytes);
            let _ = RsaPublicKey::parse(text.as_bytes());
            let _ = CertificateInfo::parse(text.as_bytes());
            let _ = RsaSigner::from_pem(text.as_bytes());
        }
    }
}
