//! `make test` on a fresh machine: what its tests run (nginx, Chromium,
//! Patroni, promtool, …) is installed by `make test` itself, said on its
//! first lines, instead of a failure naming `make tools`.
//!
//! The machine is made to lack nginx: the programs are looked for in a
//! directory (`TOOLS_PATH`) holding every other one, and apt-get (the Debian
//! archive: an outside party) is a stand-in that records what it was asked
//! and "installs" nginx there. cargo is a stand-in too (the real one runs
//! this very test): the run checked is make's, in the order it runs things.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The programs `scripts/tools.sh` looks for, and their packages.
fn tools() -> Vec<(String, String)> {
    let out = std::process::Command::new(format!("{ROOT}/scripts/tools.sh"))
        .args(["list", "all"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let mut words = l.split_whitespace();
            (
                words.next().unwrap().to_owned(),
                words.next().unwrap().to_owned(),
            )
        })
        .collect()
}

struct Machine {
    dir: PathBuf,
}

impl Machine {
    /// Every program there but `absent`.
    fn without(absent: &str) -> Machine {
        let dir =
            std::env::temp_dir().join(format!("fencehook-fresh-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        for (program, _) in tools() {
            if program != absent {
                script(&dir.join("bin").join(&program), "exit 0");
            }
        }
        let m = Machine { dir };
        script(
            &m.dir.join("apt-get"),
            &format!(
                "echo \"$*\" >> {log}\nfor p in \"$@\"; do [ \"$p\" = {absent} ] && printf '#!/bin/sh\\n' > {bin}/{absent} && chmod +x {bin}/{absent}; done\nexit 0",
                log = m.dir.join("apt.log").display(),
                bin = m.dir.join("bin").display(),
            ),
        );
        script(
            &m.dir.join("cargo"),
            &format!(
                "echo \"$*\" >> {log}\necho 'test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out'",
                log = m.dir.join("cargo.log").display()
            ),
        );
        m
    }

    fn log(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.join(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `make <target>` here: (exit code, stdout and stderr).
    fn make(&self, target: &str) -> (i32, String) {
        let mut cmd = std::process::Command::new("make");
        cmd.args(["--no-print-directory", "-C", ROOT, target])
            .arg(format!("CARGO={}", self.dir.join("cargo").display()))
            .arg(format!("PG_URL={}", crate::helpers::database_admin_url()))
            .arg(format!("REDIS_URL={}", crate::helpers::redis_url()))
            .env("TOOLS_PATH", self.dir.join("bin"))
            .env("TOOLS_APT_GET", self.dir.join("apt-get"));
        // Not the make running this test, if one does.
        for var in ["MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"] {
            cmd.env_remove(var);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn make_test_without_nginx_installs_it_first_says_so_on_its_first_lines_and_passes() {
    let machine = Machine::without("nginx");
    let (code, out) = machine.make("test");
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with(
            "fencehook: these programs are missing, so they are installed now (Debian's packages: nginx)"
        ) && lines[1].contains("nginx (nginx): tests/api/deploy.rs"),
        "said first:\n{out}"
    );
    let apt = machine.log("apt.log");
    assert_eq!(apt.len(), 2, "{apt:?}");
    assert!(apt[0].ends_with("update -qq"), "{apt:?}");
    assert!(
        apt[1].ends_with("install -y --no-install-recommends nginx"),
        "only what is missing: {apt:?}"
    );
    assert_eq!(
        machine.log("cargo.log"),
        [
            "test --locked --features test-support --lib --bins",
            "test --locked --features test-support --test api",
        ],
        "then both runs:\n{out}"
    );
    assert!(out.trim_end().ends_with("2 passed, 0 failed"), "{out}");

    // Nothing missing any more: nothing installed, nothing said about it.
    let (code, out) = machine.make("test");
    assert_eq!(code, 0, "{out}");
    assert_eq!(machine.log("apt.log").len(), 2, "no second install");
    assert!(!out.contains("missing"), "{out}");
}

#[test]
fn make_test_integration_alone_installs_what_is_missing_too() {
    let machine = Machine::without("promtool");
    let (code, out) = machine.make("test-integration");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with(
            "fencehook: these programs are missing, so they are installed now (Debian's packages: prometheus)"
        ),
        "{out}"
    );
    assert!(machine.log("apt.log")[1].ends_with(" prometheus"));
}
