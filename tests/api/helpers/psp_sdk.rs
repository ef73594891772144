//! The PSPs' own SDKs, run as a peer: `tests/psp-sdks/<scheme>.py` signs or verifies
//! with the SDK installed by `scripts/psp-sdks.sh` (a virtualenv under `target/`).
//! A missing SDK fails the test with the install's own message: CI installs them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The virtualenv's python, installing the SDKs on first use.
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new(repo().join("scripts/psp-sdks.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/psp-sdks.sh runs");
        assert!(
            out.status.success(),
            "scripts/psp-sdks.sh failed: the PSP SDKs could not be installed"
        );
        let stdout = String::from_utf8(out.stdout).expect("utf-8 path");
        PathBuf::from(
            stdout
                .lines()
                .last()
                .expect("the script prints the venv's python")
                .trim(),
        )
    })
}

/// Runs `tests/psp-sdks/<script>` with `args`, `stdin` on its standard input.
pub fn run(script: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(python())
        .arg(repo().join("tests/psp-sdks").join(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the SDK script starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("stdin written");
    child.wait_with_output().expect("the SDK script ends")
}
