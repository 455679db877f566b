//! A dedicated server (a PostgreSQL cluster, or a MariaDB server for MySQL), for the
//! scenarios that restart the server.

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::Instant;

use outbox::Backend;
use tempfile::TempDir;

use crate::db::Db;
use crate::scenario::{tail, Scenario};
use crate::{COMMAND_LIMIT, POLL};

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts");

/// A throwaway server of its own (`OUTBOX_PG_DIR=<tempdir> scripts/pg.sh start`, or
/// `OUTBOX_MYSQL_DIR=<tempdir> scripts/mysql.sh start`), stopped when dropped, also on a
/// panic; then its log is copied into the scenario's directory, which a failed scenario keeps.
pub struct Cluster {
    dir: TempDir,
    backend: Backend,
    server_url: String,
    /// Where the server's log goes on a panic.
    keep_log: std::path::PathBuf,
}

impl Cluster {
    pub fn start(sc: &Scenario, backend: Backend) -> Cluster {
        Cluster::from_script(sc, backend, &["start"])
    }

    /// A hot standby of `primary` (PostgreSQL), streaming from it: `pg.sh standby PORT`
    /// (`pg_basebackup -R`), on a state dir and a port of its own.
    pub fn standby_of(sc: &Scenario, primary: &Cluster) -> Cluster {
        assert_eq!(
            primary.backend,
            Backend::Postgres,
            "standbys are PostgreSQL's"
        );
        let port = primary.port().to_string();
        Cluster::from_script(sc, Backend::Postgres, &["standby", &port])
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        let authority = self.server_url.rsplit_once('@').expect("URL user").1;
        let host_port = authority.split('/').next().expect("URL host");
        host_port
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .unwrap_or_else(|| panic!("no port in {}", self.server_url))
    }

    /// A server started by `pg.sh ARGS` (or `mysql.sh`) on a new state dir, which prints
    /// its URL.
    fn from_script(sc: &Scenario, backend: Backend, args: &[&str]) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix(&format!("outbox-fault-{}-", backend.name()))
            .tempdir()
            .expect("cluster temp dir");
        let mut cluster = Cluster {
            backend,
            server_url: String::new(),
            keep_log: sc.path(&format!(
                "{}-server.log",
                dir.path().file_name().unwrap_or_default().to_string_lossy()
            )),
            dir,
        };
        cluster.server_url = cluster.script(sc, args).trim().to_owned();
        assert!(
            cluster
                .server_url
                .starts_with(&format!("{}://", backend.name())),
            "{} start printed {:?}",
            cluster.script_name(),
            cluster.server_url
        );
        cluster
    }

    /// `pg.sh` or `mysql.sh`.
    fn script_name(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "pg.sh",
            Backend::Mysql => "mysql.sh",
            Backend::Sqlite => unreachable!("no server for SQLite"),
        }
    }

    /// The command `scripts/pg.sh` (or `mysql.sh`) on this server's state dir.
    fn command(&self) -> Command {
        let variable = match self.backend {
            Backend::Mysql => "OUTBOX_MYSQL_DIR",
            _ => "OUTBOX_PG_DIR",
        };
        let mut command = Command::new("bash");
        command
            .arg(format!("{SCRIPTS}/{}", self.script_name()))
            .env(variable, self.dir.path())
            .stdin(Stdio::null());
        command
    }

    /// Runs `scripts/pg.sh ARGS` (or `mysql.sh`) on this server, within [`COMMAND_LIMIT`];
    /// returns stdout.
    pub fn script(&self, sc: &Scenario, args: &[&str]) -> String {
        let script = self.script_name();
        let label = format!("{script}-{}", args.join("-"));
        let n = sc.logs.borrow().len();
        let stdout = sc.path(&format!("{n:03}-{label}.out"));
        let stderr = sc.path(&format!("{n:03}-{label}.log"));
        sc.logs.borrow_mut().push(stderr.clone());
        let mut child = self
            .command()
            .args(args)
            .stdout(File::create(&stdout).expect("stdout file"))
            .stderr(File::create(&stderr).expect("stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
        let deadline = Instant::now() + COMMAND_LIMIT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{script} {args:?} did not finish within {COMMAND_LIMIT:?}");
            }
            std::thread::sleep(POLL);
        };
        assert!(
            status.success(),
            "{script} {args:?} failed ({status})\n{}",
            tail(&stderr, 30)
        );
        std::fs::read_to_string(&stdout).unwrap_or_default()
    }

    /// Creates a database on this server and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        let admin = Db::new(&self.server_url);
        admin.exec(&format!("CREATE DATABASE {name}"));
        let base = &self.server_url[..self.server_url.rfind('/').expect("URL path")];
        format!("{base}/{name}")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let script = self.script_name();
        // Before the stop, which removes the state dir.
        if std::thread::panicking() {
            let log = match self.backend {
                Backend::Mysql => "mysqld.log",
                _ => "postgres.log",
            };
            let _ = std::fs::copy(self.dir.path().join(log), &self.keep_log);
        }
        match self.command().arg("stop").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "{script} stop failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("cannot run {script} stop: {e}"),
        }
    }
}
