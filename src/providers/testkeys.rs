//! Keys and certificates the tests of the RSA schemes make for themselves
//! (feature `test-support`, and the crate's own unit tests): nothing secret
//! is committed, and every key is thrown away with the test process.
//!
//! Keys are generated once per process (2048-bit RSA generation takes a
//! while) from fixed seeds, so a failing test can be rerun with the same keys.

use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

use rand::SeedableRng;
use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use x509_cert::builder::{Builder, CertificateBuilder, Profile};
use x509_cert::der::EncodePem;
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::{Time, Validity};

use super::keys::RsaSigner;

/// How many distinct keys the tests can ask for (index 0 to KEYS - 1).
pub const KEYS: usize = 4;

fn keys() -> &'static [rsa::RsaPrivateKey] {
    static KEYS_CELL: OnceLock<Vec<rsa::RsaPrivateKey>> = OnceLock::new();
    KEYS_CELL.get_or_init(|| {
        (0..KEYS as u64)
            .map(|i| {
                let mut rng = rand::rngs::StdRng::seed_from_u64(0xFE4C_E400 + i);
                rsa::RsaPrivateKey::new(&mut rng, 2048).expect("a 2048-bit key")
            })
            .collect()
    })
}

fn key(i: usize) -> &'static rsa::RsaPrivateKey {
    &keys()[i]
}

/// Test key `i` as PEM PKCS#8 (`BEGIN PRIVATE KEY`), as `openssl genpkey` writes it.
pub fn private_key_pem(i: usize) -> String {
    key(i)
        .to_pkcs8_pem(LineEnding::LF)
        .expect("encodes")
        .to_string()
}

/// The public half of test key `i` as PEM `PUBLIC KEY`.
pub fn public_key_pem(i: usize) -> String {
    key(i)
        .to_public_key()
        .to_public_key_pem(LineEnding::LF)
        .expect("encodes")
}

/// The public half of test key `i` as Alipay hands its keys out: the bare
/// base64 of the DER SubjectPublicKeyInfo, on one line.
pub fn public_key_base64(i: usize) -> String {
    public_key_pem(i)
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect()
}

/// A signer with test key `i`.
pub fn signer(i: usize) -> RsaSigner {
    RsaSigner::from_pem(private_key_pem(i).as_bytes()).expect("ring reads the key")
}

/// A certificate authority of test key `i` named `subject`, valid for a
/// century from 2020 (PEM): the private CA of the TLS-to-PostgreSQL tests.
pub fn ca_certificate(i: usize, subject: &str) -> String {
    certificate(
        i,
        &format!("0{}", i + 1),
        subject,
        1_577_836_800,
        4_733_510_400,
    )
}

/// A server certificate of test key `leaf` for the address `ip` and
/// `localhost`, issued by the CA [`ca_certificate`] made of key `ca` and
/// `ca_subject`.
pub fn server_certificate(
    leaf: usize,
    ip: std::net::Ipv4Addr,
    ca: usize,
    ca_subject: &str,
) -> String {
    use x509_cert::der::asn1::{Ia5String, OctetString};
    use x509_cert::ext::pkix::name::GeneralName;
    use x509_cert::ext::pkix::SubjectAltName;

    let time = |secs: u64| Time::try_from(UNIX_EPOCH + Duration::from_secs(secs)).expect("a time");
    let signing_key = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key(ca).clone());
    let spki = SubjectPublicKeyInfoOwned::from_key(key(leaf).to_public_key()).expect("an SPKI");
    let mut builder = CertificateBuilder::new(
        Profile::Leaf {
            issuer: ca_subject.parse().expect("a distinguished name"),
            enable_key_agreement: false,
            enable_key_encipherment: true,
        },
        SerialNumber::new(&[0x10 + leaf as u8]).expect("a serial"),
        Validity {
            not_before: time(1_577_836_800),
            not_after: time(4_733_510_400),
        },
        "CN=localhost".parse().expect("a distinguished name"),
        spki,
        &signing_key,
    )
    .expect("a certificate builder");
    // rustls (webpki) matches the host against the subjectAltName only.
    builder
        .add_extension(&SubjectAltName(vec![
            GeneralName::DnsName(Ia5String::new("localhost").expect("IA5")),
            GeneralName::IpAddress(OctetString::new(ip.octets().to_vec()).expect("octets")),
        ]))
        .expect("an extension");
    builder
        .build::<rsa::pkcs1v15::Signature>()
        .expect("signs")
        .to_pem(LineEnding::LF)
        .expect("encodes")
}

/// A self-signed PEM certificate of test key `i`: serial `serial_hex`
/// (hex), `subject` (e.g. `CN=messageverificationcerts.paypal.com`), valid
/// from `not_before` to `not_after` (unix seconds).
pub fn certificate(
    i: usize,
    serial_hex: &str,
    subject: &str,
    not_before: u64,
    not_after: u64,
) -> String {
    let mut serial = hex::decode(serial_hex).expect("the serial is hex");
    if serial.first().is_none_or(|b| *b >= 0x80) {
        // DER integers are signed: a leading zero keeps the serial positive.
        serial.insert(0, 0);
    }
    let time = |secs: u64| Time::try_from(UNIX_EPOCH + Duration::from_secs(secs)).expect("a time");
    let signing_key = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key(i).clone());
    let spki = SubjectPublicKeyInfoOwned::from_key(key(i).to_public_key()).expect("an SPKI");
    let subject: Name = subject.parse().expect("a distinguished name");
    let builder = CertificateBuilder::new(
        Profile::Root,
        SerialNumber::new(&serial).expect("a serial"),
        Validity {
            not_before: time(not_before),
            not_after: time(not_after),
        },
        subject,
        spki,
        &signing_key,
    )
    .expect("a certificate builder");
    builder
        .build::<rsa::pkcs1v15::Signature>()
        .expect("signs")
        .to_pem(LineEnding::LF)
        .expect("encodes")
}

/// The providers of a providers file's `text`, its key files read as a
/// user's would be: `files` (name relative to the file, contents) written
/// into a directory of their own, removed once read.
pub fn providers_file(
    text: &str,
    files: &[(&str, &[u8])],
) -> Result<Vec<super::Provider>, super::SettingErrors> {
    let dir = std::env::temp_dir().join(format!(
        "fencehook-providers-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    for (name, contents) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().expect("a file in the directory"))
            .expect("a temporary directory");
        std::fs::write(path, contents).expect("a key file");
    }
    let providers = super::file::parse_in(text, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    providers
}
