//! The one HMAC-SHA256 check every HMAC scheme shares: any configured key
//! (rotation) against any signature the delivery carries, compared in
//! constant time by `Mac::verify_slice`.

use hmac::{Hmac, Mac};
use sha2::Sha256;

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
