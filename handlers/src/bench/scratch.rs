//! Scratch databases the benchmarks create and drop, and this process's resource use.

use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use diesel::connection::SimpleConnection;
use outbox::{Backend, DatabaseUrl};

/// A scratch database, dropped (or deleted) when this is dropped.
pub(crate) struct Scratch {
    pub(crate) url: DatabaseUrl,
    /// PostgreSQL: the server URL to drop the database from, and its name.
    pg: Option<(DatabaseUrl, String)>,
    /// SQLite: the file.
    file: Option<std::path::PathBuf>,
}

impl Scratch {
    /// A new empty database next to `url`: on its PostgreSQL server (the role needs
    /// `CREATEDB`), or a temporary SQLite file.
    pub(crate) fn create(url: &DatabaseUrl) -> anyhow::Result<Scratch> {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("outbox_bench_{}_{n}", std::process::id());
        match url.backend() {
            Backend::Postgres | Backend::Mysql => {
                let scratch = DatabaseUrl::parse(&with_database(url.as_str(), &name))?;
                let mut admin = url.connect()?;
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
                    .and_then(|_| admin.batch_execute(&format!("CREATE DATABASE {name}")))
                    .context(
                        "creating the scratch database (the role needs CREATEDB, on MySQL CREATE)",
                    )?;
                Ok(Scratch {
                    url: scratch,
                    pg: Some((url.clone(), name)),
                    file: None,
                })
            }
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{name}.db"));
                let text = path
                    .to_str()
                    .context("the temp dir is not UTF-8")?
                    .to_owned();
                Ok(Scratch {
                    url: DatabaseUrl::parse(&text)?,
                    pg: None,
                    file: Some(path),
                })
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some((server, name)) = &self.pg {
            if let Ok(mut admin) = server.connect() {
                let force = match server.backend() {
                    Backend::Postgres => " WITH (FORCE)",
                    _ => "",
                };
                let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name}{force}"));
            }
        }
        if let Some(file) = &self.file {
            for suffix in ["", "-wal", "-shm"] {
                let mut path = file.clone().into_os_string();
                path.push(suffix);
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// `url` with its database name replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let rest_at = url.find("://").map_or(0, |i| i + 3);
    let (head, rest) = url.split_at(rest_at);
    let (before_query, query) = match rest.find('?') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = before_query.split('/').next().unwrap_or(before_query);
    format!("{head}{authority}/{name}{query}")
}

/// User + system CPU seconds of this process.
pub(crate) fn cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            seconds(usage.user_time()) + seconds(usage.system_time())
        }
        Err(_) => f64::NAN,
    }
}

/// Peak resident set of this process, MiB (Linux reports `ru_maxrss` in KiB).
pub(crate) fn peak_rss_mib() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(f64::NAN, |u| u.max_rss() as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_name_is_replaced() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/app?sslmode=disable", "x"),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgresql://h", "x"), "postgresql://h/x");
    }
}
