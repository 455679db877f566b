//! `outbox web`: a small server-rendered dashboard of one database — tasks per keyword and
//! state, dead tasks with their errors, a task's page, nodes, domains and tenants,
//! schedules, the audit — with retry, cancel, pause and resume buttons.
//!
//! Every page is plain HTML rendered on the server (no JavaScript at all), refreshed by the
//! browser every [`WebConfig::refresh`]. The dashboard reads and changes the database only
//! through the library ([`crate::ops`], [`crate::domain::admin`], [`crate::stats`], …), so an
//! action from the web is the same change, audited the same way in the same transaction, as
//! the CLI's.
//!
//! ## Security model
//!
//! There is no login: whoever can reach the address can read the dashboard. So:
//!
//! - it listens on a loopback address unless told otherwise ([`DEFAULT_ADDR`]);
//! - it is **read-only** unless [`WebConfig::allow_actions`]: the buttons are not shown and
//!   every `POST` is refused with 403;
//! - every action is a `POST` carrying a per-process random token in a hidden field, and a
//!   `POST` whose `Origin` (or, without one, `Referer`) is not the dashboard itself is
//!   refused with 403, so another site open in the operator's browser cannot press a button;
//! - every request's `Host` must be an IP address, `localhost`, or a name given with
//!   [`WebConfig::allow_host`] (421 otherwise), so a DNS-rebinding page cannot reach it
//!   through a name of its own;
//! - pages may not be framed (`frame-ancestors 'none'`) and are not cached.
//!
//! Each change is audited as [`WebConfig::user`] (by default `web@<host>`).
//!
//! ```no_run
//! # fn main() -> outbox::Result<()> {
//! let url = outbox::DatabaseUrl::parse("app.db")?;
//! let config = outbox::web::WebConfig::new("127.0.0.1:0".parse().unwrap()).allow_actions(true);
//! let dashboard = outbox::web::Dashboard::start(&url, config)?;
//! println!("open http://{}/", dashboard.local_addr());
//! dashboard.stop();
//! # Ok(())
//! # }
//! ```

mod actions;
mod audit;
mod fleet;
mod guard;
mod layout;
mod overview;
mod problem;
mod server;
mod tasks;

use std::net::SocketAddr;
use std::time::Duration;

pub use server::Dashboard;

use crate::error::{Error, Result};

/// The address `outbox web` listens on unless told otherwise: loopback only.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8080";
/// How often the browser reloads a page unless told otherwise.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(5);
/// The database connections the dashboard holds at most.
pub const POOL_SIZE: u32 = 4;
/// The longest name [`WebConfig::user`] and [`WebConfig::allow_host`] accept.
const MAX_NAME_LEN: usize = 128;

/// How the dashboard is served.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WebConfig {
    /// Where to listen ([`DEFAULT_ADDR`]); port 0 picks a free port
    /// ([`Dashboard::local_addr`] tells which).
    pub addr: SocketAddr,
    /// Show the buttons and accept their `POST`s (`false`: read-only, by default).
    pub allow_actions: bool,
    /// Who the audit names for the changes made here (`None`: `web@<host>`).
    pub user: Option<String>,
    /// Host names accepted in the `Host` header besides IP addresses and `localhost`: the
    /// names operators type to reach the dashboard (a reverse proxy's, a machine's).
    pub allowed_hosts: Vec<String>,
    /// How often the browser reloads a page ([`DEFAULT_REFRESH`]; 1 s to 1 h).
    pub refresh: Duration,
}

impl WebConfig {
    /// A read-only dashboard on `addr`, refreshed every [`DEFAULT_REFRESH`].
    pub fn new(addr: SocketAddr) -> Self {
        WebConfig {
            addr,
            allow_actions: false,
            user: None,
            allowed_hosts: Vec::new(),
            refresh: DEFAULT_REFRESH,
        }
    }

    /// Shows the buttons and accepts their `POST`s.
    pub fn allow_actions(mut self, allow: bool) -> Self {
        self.allow_actions = allow;
        self
    }

    /// Audits the changes made here as `user`.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Also accepts `name` in the `Host` header.
    pub fn allow_host(mut self, name: impl Into<String>) -> Self {
        self.allowed_hosts.push(name.into().to_ascii_lowercase());
        self
    }

    /// Reloads pages every `every`.
    pub fn refresh(mut self, every: Duration) -> Self {
        self.refresh = every;
        self
    }

    /// The audit's name for this dashboard's changes: [`WebConfig::user`], or `web@<host>`.
    pub fn actor(&self) -> String {
        match &self.user {
            Some(user) => user.clone(),
            None => format!("web@{}", gethostname::gethostname().to_string_lossy()),
        }
    }

    /// Checks the configuration on its own, as [`Dashboard::start`] does before anything
    /// else: a user of 1 to 128 printable characters, host names of letters, digits, `.`
    /// and `-`, a refresh of 1 s to 1 h ([`Error::InvalidConfig`] naming the flag).
    pub fn validate(&self) -> Result<()> {
        if let Some(user) = &self.user {
            if user.is_empty() || user.len() > MAX_NAME_LEN || user.chars().any(char::is_control) {
                return Err(Error::InvalidConfig {
                    setting: "user",
                    reason: format!("must be 1 to {MAX_NAME_LEN} bytes without control characters"),
                });
            }
        }
        for host in &self.allowed_hosts {
            let valid = !host.is_empty()
                && host.len() <= MAX_NAME_LEN
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
            if !valid {
                return Err(Error::InvalidConfig {
                    setting: "allow-host",
                    reason: format!(
                        "{host:?} must be a host name (letters, digits, '.' and '-'), without a port"
                    ),
                });
            }
        }
        if self.refresh < Duration::from_secs(1) || self.refresh > Duration::from_secs(3600) {
            return Err(Error::InvalidConfig {
                setting: "refresh",
                reason: "must be between 1s and 1h".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> WebConfig {
        WebConfig::new(DEFAULT_ADDR.parse().expect("an address"))
    }

    #[test]
    fn defaults_are_read_only_on_loopback() {
        let config = config();
        assert!(!config.allow_actions);
        assert!(config.addr.ip().is_loopback());
        assert!(config.validate().is_ok());
        assert!(config.actor().starts_with("web@"));
        assert_eq!(config.clone().user("alice").actor(), "alice");
    }

    #[test]
    fn bad_settings_name_their_flag() {
        let error = config().user("").validate().unwrap_err();
        assert!(error.to_string().contains("user"), "{error}");
        let error = config().user("a\nb").validate().unwrap_err();
        assert!(error.to_string().contains("user"), "{error}");
        let error = config().allow_host("box:8080").validate().unwrap_err();
        assert!(error.to_string().contains("allow-host"), "{error}");
        let error = config()
            .refresh(Duration::from_millis(10))
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("refresh"), "{error}");
    }
}
