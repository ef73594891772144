//! Who is asking: the two tokens, sessions, CSRF tokens, and the throttle of
//! failed sign-ins.
//!
//! # What must stay true
//!
//! - A session is a cookie the server can check without keeping it: role,
//!   expiry and a random id, MACed (HMAC-SHA256) with the role's token. A
//!   token that changes (its file re-read on SIGHUP) makes every session
//!   made with the old one fail its MAC: signed out. Twelve hours after
//!   sign-in it expires, whatever the cookie's own expiry says.
//! - A CSRF token is a MAC of the session's id with the same key: bound to
//!   the session, unknowable without the token, and nothing to store.
//! - Tokens are compared as SHA-256 digests in constant time; no token, MAC
//!   or cookie is ever logged.
//! - A peer that fails [`MAX_FAILURES`] sign-ins within [`FAILURE_WINDOW`]
//!   is answered 429 until the window ends, whatever it sends then, so it
//!   cannot keep guessing; the token's length (32 bytes at least) is what
//!   makes guessing hopeless, the throttle keeps a scanner from hammering.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::config::console::{ConsoleConfig, Token};

/// A session's life from sign-in.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The session cookie's name.
pub const COOKIE: &str = "fencehook_console";

/// Failed sign-ins one peer may make per [`FAILURE_WINDOW`].
pub const MAX_FAILURES: u32 = 5;

/// The window failed sign-ins are counted in.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Peers whose failures are remembered at once; beyond it the oldest
/// windows are forgotten first (a flood of addresses cannot grow memory).
const MAX_PEERS: usize = 4096;

/// What a signed-in user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads every page; replays nothing, sees no raw body.
    Viewer,
    /// Also replays dead events and sees stored bodies.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }

    fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            _ => None,
        }
    }
}

/// A checked session (or Bearer token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub role: Role,
    /// The session's random id (hex); `None` for a Bearer token, which is
    /// sent by a script on every request and needs no CSRF token.
    pub id: Option<String>,
    /// The CSRF token of this session's forms.
    pub csrf: Option<String>,
}

/// The tokens in force, replaced whole on SIGHUP.
pub struct Tokens {
    current: RwLock<(Option<Token>, Option<Token>)>,
}

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &[u8], parts: &[&str]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    for p in parts {
        m.update(p.as_bytes());
        m.update(b"\0");
    }
    m
}

/// Constant-time equality of two digests.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    pub fn new(cfg: &ConsoleConfig) -> Tokens {
        Tokens {
            current: RwLock::new((cfg.viewer.clone(), cfg.operator.clone())),
        }
    }

    pub fn replace(&self, viewer: Option<Token>, operator: Option<Token>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (viewer, operator);
    }

    fn token(&self, role: Role) -> Option<Token> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        match role {
            Role::Viewer => current.0.clone(),
            Role::Operator => current.1.clone(),
        }
    }

    /// The role whose token `presented` is, if any (both compared, in
    /// constant time).
    pub fn role_of(&self, presented: &[u8]) -> Option<Role> {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        let viewer = self
            .token(Role::Viewer)
            .is_some_and(|t| same(&t.digest(), &digest));
        let operator = self
            .token(Role::Operator)
            .is_some_and(|t| same(&t.digest(), &digest));
        match (viewer, operator) {
            (_, true) => Some(Role::Operator),
            (true, false) => Some(Role::Viewer),
            _ => None,
        }
    }

    /// A new session cookie's value for `role`, valid from `now` (unix
    /// seconds) for [`SESSION_LIFETIME`].
    pub fn mint(&self, role: Role, now: i64) -> Option<String> {
        let token = self.token(role)?;
        let id = hex::encode(rand::random::<[u8; 16]>());
        let expires = (now + SESSION_LIFETIME.as_secs() as i64).to_string();
        let tag = mac(token.secret(), &["session", role.as_str(), &expires, &id])
            .finalize()
            .into_bytes();
        Some(format!(
            "{}.{expires}.{id}.{}",
            role.as_str(),
            hex::encode(tag)
        ))
    }

    /// The session a cookie value stands for, if it is genuine, made with
    /// the token in force, and not expired at `now`.
    pub fn check(&self, cookie: &str, now: i64) -> Option<Session> {
        let mut parts = cookie.split('.');
        let (role, expires, id, tag) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let role = Role::parse(role)?;
        let token = self.token(role)?;
        let tag = hex::decode(tag).ok()?;
        mac(token.secret(), &["session", role.as_str(), expires, id])
            .verify_slice(&tag)
            .ok()?;
        let expires: i64 = expires.parse().ok()?;
        if now >= expires || expires - now > SESSION_LIFETIME.as_secs() as i64 {
            return None;
        }
        let csrf = hex::encode(mac(token.secret(), &["csrf", id]).finalize().into_bytes());
        Some(Session {
            role,
            id: Some(id.to_owned()),
            csrf: Some(csrf),
        })
    }
}

impl Session {
    /// Whether `presented` is this session's CSRF token (constant time).
    /// A Bearer session has none and needs none: browsers never attach an
    /// `Authorization` header on their own.
    pub fn csrf_ok(&self, presented: Option<&str>) -> bool {
        match (&self.csrf, presented) {
            (None, _) if self.id.is_none() => true,
            (Some(ours), Some(theirs)) => {
                let a: [u8; 32] = Sha256::digest(ours.as_bytes()).into();
                let b: [u8; 32] = Sha256::digest(theirs.as_bytes()).into();
                same(&a, &b)
            }
            _ => false,
        }
    }
}

/// Failed sign-ins per peer address, in fixed windows.
#[derive(Default)]
pub struct Throttle {
    peers: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Throttle {
    /// `Some(wait)` when `peer` is throttled now: how long until it may try again.
    pub fn blocked(&self, peer: IpAddr) -> Option<Duration> {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let (start, failures) = *peers.get(&peer)?;
        let left = FAILURE_WINDOW.checked_sub(start.elapsed())?;
        (failures >= MAX_FAILURES).then_some(left)
    }

    /// Counts one failed sign-in of `peer`.
    pub fn failed(&self, peer: IpAddr) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if peers.len() >= MAX_PEERS && !peers.contains_key(&peer) {
            peers.retain(|_, (start, _)| start.elapsed() < FAILURE_WINDOW);
            if peers.len() >= MAX_PEERS {
                if let Some(oldest) = peers.iter().min_by_key(|(_, (s, _))| *s).map(|(ip, _)| *ip) {
                    peers.remove(&oldest);
                }
            }
        }
        let entry = peers.entry(peer).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= FAILURE_WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn token(byte: char) -> Token {
        let dir = std::env::temp_dir().join(format!("fh-auth-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let p: PathBuf = dir.join("t");
        std::fs::write(&p, byte.to_string().repeat(40)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let t = crate::config::console::read_tokens(Some(&p), None)
            .unwrap()
            .0
            .unwrap();
        std::fs::remove_dir_all(dir).unwrap();
        t
    }

    #[test]
    fn a_session_holds_until_it_expires_or_its_token_changes_and_its_csrf_is_its_own() {
        let tokens = Tokens::new(&ConsoleConfig {
            viewer: Some(token('v')),
            operator: Some(token('o')),
            secure_cookie: false,
        });
        assert_eq!(
            tokens.role_of("o".repeat(40).as_bytes()),
            Some(Role::Operator)
        );
        assert_eq!(
            tokens.role_of("v".repeat(40).as_bytes()),
            Some(Role::Viewer)
        );
        assert_eq!(tokens.role_of(b"nope"), None);

        let now = 1_000_000;
        let cookie = tokens.mint(Role::Operator, now).unwrap();
        let s = tokens.check(&cookie, now + 60).unwrap();
        assert_eq!(s.role, Role::Operator);
        assert!(s.csrf_ok(s.csrf.as_deref()));
        assert!(!s.csrf_ok(None));
        assert!(!s.csrf_ok(Some("0000")));
        let other = tokens
            .check(&tokens.mint(Role::Operator, now).unwrap(), now)
            .unwrap();
        assert!(
            !s.csrf_ok(other.csrf.as_deref()),
            "another session's CSRF token"
        );

        // Twelve hours, then gone.
        assert!(tokens.check(&cookie, now + 12 * 3600 - 1).is_some());
        assert!(tokens.check(&cookie, now + 12 * 3600).is_none());
        // A role or an expiry edited: the MAC fails.
        let forged = cookie.replacen("operator", "viewer", 1);
        assert!(tokens.check(&forged, now).is_none());
        let later = cookie.replacen(
            &(now + 12 * 3600).to_string(),
            &(now + 99 * 3600).to_string(),
            1,
        );
        assert!(tokens.check(&later, now).is_none());
        // The token file changes: every session made with the old one is out.
        tokens.replace(Some(token('v')), Some(token('n')));
        assert!(tokens.check(&cookie, now + 60).is_none());
    }

    #[test]
    fn a_peer_is_throttled_after_five_failures_and_others_are_not() {
        let t = Throttle::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..MAX_FAILURES - 1 {
            t.failed(a);
        }
        assert!(t.blocked(a).is_none());
        t.failed(a);
        let wait = t.blocked(a).expect("throttled");
        assert!(wait <= FAILURE_WINDOW);
        assert!(t.blocked(b).is_none());
    }
}
