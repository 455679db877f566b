//! A dedicated PostgreSQL cluster, for the scenarios that restart the server.

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::Instant;

use tempfile::TempDir;

use crate::db::Db;
use crate::scenario::{tail, Scenario};
use crate::{COMMAND_LIMIT, POLL};

const PG_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg.sh");

/// A throwaway cluster of its own (`OUTBOX_PG_DIR=<tempdir> scripts/pg.sh start`), stopped
/// when dropped, also on a panic.
pub struct Cluster {
    dir: TempDir,
    server_url: String,
}

impl Cluster {
    pub fn start(sc: &Scenario) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("outbox-fault-pg-")
            .tempdir()
            .expect("cluster temp dir");
        let mut cluster = Cluster {
            dir,
            server_url: String::new(),
        };
        cluster.server_url = cluster.pg_sh(sc, &["start"]).trim().to_owned();
        assert!(
            cluster.server_url.starts_with("postgres://"),
            "pg.sh start printed {:?}",
            cluster.server_url
        );
        cluster
    }

    /// Runs `scripts/pg.sh ARGS` on this cluster, within [`COMMAND_LIMIT`]; returns stdout.
    pub fn pg_sh(&self, sc: &Scenario, args: &[&str]) -> String {
        let label = format!("pg.sh-{}", args.join("-"));
        let n = sc.logs.borrow().len();
        let stdout = sc.path(&format!("{n:03}-{label}.out"));
        let stderr = sc.path(&format!("{n:03}-{label}.log"));
        sc.logs.borrow_mut().push(stderr.clone());
        let mut child = Command::new("bash")
            .arg(PG_SH)
            .args(args)
            .env("OUTBOX_PG_DIR", self.dir.path())
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("stdout file"))
            .stderr(File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start pg.sh");
        let deadline = Instant::now() + COMMAND_LIMIT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("pg.sh {args:?} did not finish within {COMMAND_LIMIT:?}");
            }
            std::thread::sleep(POLL);
        };
        assert!(
            status.success(),
            "pg.sh {args:?} failed ({status})\n{}",
            tail(&stderr, 30)
        );
        std::fs::read_to_string(&stdout).unwrap_or_default()
    }

    /// Creates a database on this cluster and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        let admin = Db::new(&self.server_url);
        admin.exec(&format!("CREATE DATABASE {name}"));
        let base = &self.server_url[..self.server_url.rfind('/').expect("URL path")];
        format!("{base}/{name}")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = Command::new("bash")
            .arg(PG_SH)
            .arg("stop")
            .env("OUTBOX_PG_DIR", self.dir.path())
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "pg.sh stop failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("cannot run pg.sh stop: {e}"),
        }
    }
}
