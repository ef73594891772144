//! The console's settings: two token files and the cookie's `Secure` flag.
//! They live in the config room (the console reads them from here), so the
//! settings never import the console they configure.
//! Read and checked at start (a bad file stops the start with one line
//! naming its setting) and again on SIGHUP (a bad file then keeps the
//! tokens in force).

use std::path::{Path, PathBuf};

use clap::Args;
use sha2::{Digest, Sha256};

use super::{setting, ConfigError};

/// Shortest token accepted: 32 bytes, 256 bits when random.
pub const MIN_TOKEN_BYTES: usize = 32;

/// Flags and environment of the console (flattened into `fencehook serve`).
#[derive(Debug, Clone, Args, Default)]
pub struct ConsoleArgs {
    /// File holding the console's viewer token (reads everything, replays
    /// nothing). At least 32 bytes, not readable by group or others. With
    /// neither token file set, /console is 404.
    #[arg(long, env = setting::FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE)]
    pub console_viewer_token_file: Option<PathBuf>,
    /// File holding the console's operator token (also replays dead events
    /// and sees raw stored bodies). Same rules as the viewer's.
    #[arg(long, env = setting::FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE)]
    pub console_operator_token_file: Option<PathBuf>,
    /// Mark the console's session cookie `Secure` (the console is reached
    /// over HTTPS, through a TLS front).
    #[arg(long, env = setting::FENCEHOOK_CONSOLE_SECURE_COOKIE, default_value_t = false, action = clap::ArgAction::Set)]
    pub console_secure_cookie: bool,
}

/// One role's token: the secret and the file it came from. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    secret: Vec<u8>,
    pub file: PathBuf,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("file", &self.file)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl Token {
    /// The secret's bytes (the key of the role's session MACs).
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// SHA-256 of the secret: what a presented token is compared with, in
    /// constant time, so the comparison's duration says nothing about it.
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(&self.secret).into()
    }
}

/// The console's settings, validated.
#[derive(Debug, Clone, Default)]
pub struct ConsoleConfig {
    pub viewer: Option<Token>,
    pub operator: Option<Token>,
    pub secure_cookie: bool,
}

impl ConsoleConfig {
    /// Whether `/console` is served at all.
    pub fn enabled(&self) -> bool {
        self.viewer.is_some() || self.operator.is_some()
    }
}

pub const VIEWER_SETTING: &str = setting::FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE;
pub const OPERATOR_SETTING: &str = setting::FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE;

impl ConsoleArgs {
    pub fn validate(&self) -> Result<ConsoleConfig, ConfigError> {
        read_tokens(
            self.console_viewer_token_file.as_deref(),
            self.console_operator_token_file.as_deref(),
        )
        .map(|(viewer, operator)| ConsoleConfig {
            viewer,
            operator,
            secure_cookie: self.console_secure_cookie,
        })
    }
}

/// Both token files, read and checked (start and SIGHUP).
pub fn read_tokens(
    viewer: Option<&Path>,
    operator: Option<&Path>,
) -> Result<(Option<Token>, Option<Token>), ConfigError> {
    let viewer = viewer.map(|p| read_token(VIEWER_SETTING, p)).transpose()?;
    let operator = operator
        .map(|p| read_token(OPERATOR_SETTING, p))
        .transpose()?;
    if let (Some(v), Some(o)) = (&viewer, &operator) {
        if v.secret == o.secret {
            return Err(bad(
                OPERATOR_SETTING,
                format!("holds the same token as {fencehook_console_viewer_token_file}: a viewer could replay", fencehook_console_viewer_token_file = setting::FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE),
            ));
        }
    }
    Ok((viewer, operator))
}

fn bad(setting: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        setting,
        reason: reason.into(),
    }
}

/// One token file: readable by its owner, by no other user, and by its
/// group only when that group is the one this process runs as; at least
/// [`MIN_TOKEN_BYTES`] once a trailing newline is dropped (`echo` and
/// editors add one).
///
/// The group exception is how Kubernetes mounts a Secret for a non-root
/// process: owned by root, group the pod's `fsGroup`, mode 0440 at the
/// least (`defaultMode` 0400 is widened to it). With `runAsGroup` equal to
/// `fsGroup` that group is the process's own, as `root:fencehook 0640` is for
/// the systemd unit's user; a group of other users never reads a token.
fn read_token(setting: &'static str, path: &Path) -> Result<Token, ConfigError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let shown = path.display();
    let meta =
        std::fs::metadata(path).map_err(|e| bad(setting, format!("cannot read {shown}: {e}")))?;
    let mode = meta.permissions().mode();
    let own_group = effective_gid() == Some(meta.gid());
    if mode & 0o004 != 0 || (mode & 0o040 != 0 && !own_group) {
        return Err(bad(
            setting,
            format!(
                "{shown} is readable by group or others (mode {:o}, group {}): chmod 600 it (group-readable only by this process's own group)",
                mode & 0o777,
                meta.gid()
            ),
        ));
    }
    let bytes =
        std::fs::read(path).map_err(|e| bad(setting, format!("cannot read {shown}: {e}")))?;
    let mut secret = bytes;
    while secret.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        secret.pop();
    }
    if secret.len() < MIN_TOKEN_BYTES {
        return Err(bad(
            setting,
            format!(
                "{shown} holds {} bytes; a console token needs at least {MIN_TOKEN_BYTES} (e.g. `openssl rand -hex 32`)",
                secret.len()
            ),
        ));
    }
    Ok(Token {
        secret,
        file: path.to_owned(),
    })
}

/// This process's effective group ID (Linux: `/proc/self/status`); `None`
/// where it cannot be read, and then no group is trusted.
fn effective_gid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let gids = status.lines().find_map(|l| l.strip_prefix("Gid:"))?;
    // Real, effective, saved, filesystem.
    gids.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(dir: &Path, name: &str, body: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("fh-console-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn token_files_must_be_long_readable_by_no_other_user_or_group_and_distinct() {
        let d = dir();
        let good = "v".repeat(32) + "\n";
        let viewer = file(&d, "viewer", &good, 0o600);
        let (v, o) = read_tokens(Some(&viewer), None).unwrap();
        assert_eq!(
            v.unwrap().secret().len(),
            32,
            "the trailing newline is not part of it"
        );
        assert!(o.is_none());

        let short = file(&d, "short", &"s".repeat(31), 0o600);
        let e = read_tokens(Some(&short), None).unwrap_err();
        assert_eq!(e.setting, VIEWER_SETTING);
        assert!(e.reason.contains("31 bytes"), "{e}");

        let world = file(&d, "world", &"w".repeat(40), 0o604);
        let e = read_tokens(None, Some(&world)).unwrap_err();
        assert_eq!(e.setting, OPERATOR_SETTING);
        assert!(e.reason.contains("group or others"), "{e}");
        let own = effective_gid().expect("this process's group");
        // Group-readable by this process's own group: Kubernetes' Secret
        // mount (root:<fsGroup> 0440), the unit's root:fencehook 0640.
        let grouped = file(&d, "grouped", &"g".repeat(40), 0o640);
        std::os::unix::fs::chown(&grouped, None, Some(own)).unwrap();
        assert!(read_tokens(Some(&grouped), None).is_ok());
        // By any other group: refused. Giving the file another group needs
        // root (or membership of it); tests run as root.
        let other = file(&d, "other", &"o".repeat(40), 0o640);
        if std::os::unix::fs::chown(&other, None, Some(own + 1)).is_ok() {
            let e = read_tokens(None, Some(&other)).unwrap_err();
            assert_eq!(e.setting, OPERATOR_SETTING);
            assert!(e.reason.contains("group or others"), "{e}");
            std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
            assert!(
                read_tokens(None, Some(&other)).is_ok(),
                "not group-readable: fine"
            );
        } else {
            eprintln!("SKIPPED the other group's file: chown needs root");
        }

        let e = read_tokens(None, Some(&d.join("missing"))).unwrap_err();
        assert_eq!(e.setting, OPERATOR_SETTING);
        assert!(e.reason.contains("cannot read"), "{e}");

        let same = file(&d, "same", &good, 0o400);
        let e = read_tokens(Some(&viewer), Some(&same)).unwrap_err();
        assert_eq!(e.setting, OPERATOR_SETTING);

        let shown = format!("{:?}", read_tokens(Some(&viewer), None).unwrap().0);
        assert!(
            !shown.contains("vvvv"),
            "Debug never shows the secret: {shown}"
        );
        std::fs::remove_dir_all(d).unwrap();
    }
}
