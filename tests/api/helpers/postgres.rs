//! A private PostgreSQL cluster (initdb + pg_ctl from the installed server
//! binaries) for settings a test must not set on the shared server, such as
//! `synchronous_standby_names`. Run as the `postgres` user when the tests run
//! as root (PostgreSQL refuses root). Stopped and removed when dropped.

use std::path::PathBuf;
use std::process::Command;

pub struct PrivatePostgres {
    dir: PathBuf,
    pub port: u16,
}

pub fn bindir() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries under /usr/lib/postgresql")
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop().expect("an initdb")
}

/// `cmd` as the user that may run PostgreSQL.
fn as_pg(program: PathBuf, args: &[&str]) -> Command {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false);
    if root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program).args(args);
        cmd
    } else {
        let mut cmd = Command::new(program);
        cmd.args(args);
        cmd
    }
}

impl PrivatePostgres {
    /// A new cluster on a free loopback port, started with `settings`
    /// (`name=value`, as `postgres -c` takes them).
    pub async fn start(settings: &[&str]) -> PrivatePostgres {
        let port = super::closed_port().await;
        let dir = std::env::temp_dir().join(format!(
            "fencehook-pg-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let pg = PrivatePostgres { dir, port };
        let dir = pg.dir.display().to_string();
        let _ = Command::new("chown").args(["postgres:", &dir]).status();
        let data = format!("{dir}/data");
        let bin = bindir();
        let initdb = as_pg(
            bin.join("initdb"),
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-locale",
                "--no-sync",
            ],
        )
        .output()
        .expect("initdb runs");
        assert!(initdb.status.success(), "initdb: {initdb:?}");
        let mut opts = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={dir} -c fsync=off"
        );
        for s in settings {
            opts.push_str(&format!(" -c {s}"));
        }
        let log = format!("{dir}/postgres.log");
        let started = as_pg(
            bin.join("pg_ctl"),
            &[
                "-D", &data, "-l", &log, "-w", "-t", "60", "-o", &opts, "start",
            ],
        )
        .output()
        .expect("pg_ctl runs");
        assert!(
            started.status.success(),
            "pg_ctl start: {started:?} {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        pg
    }

    /// The URL of database `db` on this cluster.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let data = format!("{}/data", self.dir.display());
        let _ = as_pg(
            bindir().join("pg_ctl"),
            &["-D", &data, "-m", "immediate", "-w", "stop"],
        )
        .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
