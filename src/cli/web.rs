//! `outbox web`: serves the dashboard ([`crate::web`]) until SIGINT or SIGTERM.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use super::parse_duration;
use crate::db::DatabaseUrl;
use crate::error::{Error, Result};
use crate::web::{Dashboard, WebConfig, DEFAULT_ADDR};

/// The flags of `outbox web`.
#[derive(Debug, Args)]
pub struct WebArgs {
    /// Where to listen, IP:PORT. Loopback by default: a non-loopback address serves the
    /// dashboard, which has no login, to the network (port 0 picks a free port).
    #[arg(long, default_value = DEFAULT_ADDR)]
    addr: SocketAddr,
    /// Show the retry, cancel, pause and resume buttons and accept them (read-only
    /// otherwise).
    #[arg(long)]
    allow_actions: bool,
    /// Who the audit names for the changes made on the dashboard (default: web@HOST, HOST being this machine's name).
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// Also answer to this host name (the one in the browser's address bar, a reverse
    /// proxy's), besides IP addresses and localhost; repeatable.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
    /// How often the pages reload themselves (1s to 1h).
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    refresh: Duration,
}

impl WebArgs {
    fn config(&self) -> WebConfig {
        let mut config = WebConfig::new(self.addr)
            .allow_actions(self.allow_actions)
            .refresh(self.refresh);
        if let Some(user) = &self.user {
            config = config.user(user.clone());
        }
        for host in &self.allow_hosts {
            config = config.allow_host(host.clone());
        }
        config
    }
}

pub(super) fn run(url: &DatabaseUrl, args: WebArgs) -> Result<()> {
    let config = args.config();
    // Checked before connecting: bad usage is reported as such.
    config.validate()?;
    // Installed before serving, so that a signal that comes early is not missed.
    let mut signals = Signals::new([SIGINT, SIGTERM]).map_err(|source| Error::Signal { source })?;
    let dashboard = Dashboard::start(url, config.clone())?;
    let addr = dashboard.local_addr();
    if !addr.ip().is_loopback() {
        eprintln!(
            "outbox web: warning: {addr} is not a loopback address: anyone who can reach it \
             can read the dashboard{} (there is no login)",
            if config.allow_actions {
                " and retry, cancel, pause and resume"
            } else {
                ""
            }
        );
    }
    let mode = if config.allow_actions {
        format!("actions allowed, audited as {}", config.actor())
    } else {
        "read-only".to_owned()
    };
    println!("outbox web: serving http://{addr}/ ({mode}); stop with Ctrl-C");
    // Scripts and tests read the line above to find a port chosen with :0.
    let _ = std::io::stdout().flush();
    let _ = signals.forever().next();
    dashboard.stop();
    Ok(())
}
