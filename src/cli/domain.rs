//! `outbox domain list|set|release`, `outbox pause NAME`, `outbox resume NAME`.

use std::time::Duration;

use clap::{Args, Subcommand};

use super::out::say;
use super::parse_duration;
use crate::db::{DatabaseUrl, DbConnection};
use crate::domain::admin::{self, Changed, DomainChange, DomainView, Target};
use crate::domain::validate_name;
use crate::error::Result;
use crate::migrate::ensure_migrated;

/// The subcommands of `outbox domain`.
#[derive(Debug, Args)]
pub struct DomainArgs {
    #[command(subcommand)]
    command: DomainCommand,
}

#[derive(Debug, Subcommand)]
enum DomainCommand {
    /// List the domains (from async_domain and the live nodes) with their slot use, and the
    /// keywords paused on their own.
    List {
        /// One JSON object per domain per line, then one per paused keyword.
        #[arg(long)]
        json: bool,
    },
    /// Create or change a domain's row; live nodes apply it at their next heartbeat. A
    /// setting left out keeps its value (for a domain the nodes are configured with, theirs).
    Set {
        /// The domain (a-z, 0-9 and . _ : -, at most 64 characters; not `default`).
        name: String,
        /// Its keywords, comma-separated (each in one domain only).
        #[arg(long, value_delimiter = ',', value_name = "KEYWORD,…")]
        keywords: Option<Vec<String>>,
        /// MAX mode: at most N of each node's threads run its tasks at once.
        #[arg(long, value_name = "N", value_parser = parse_count, allow_negative_numbers = true, conflicts_with = "reserved")]
        max: Option<usize>,
        /// RESERVED mode: N threads of each node kept for it; it borrows free threads of
        /// default when they are busy.
        #[arg(long, value_name = "N", value_parser = parse_count, allow_negative_numbers = true)]
        reserved: Option<usize>,
        /// Claimed tasks that may wait for one of its threads, per node.
        #[arg(long, value_name = "N", value_parser = parse_count, allow_negative_numbers = true)]
        queue: Option<usize>,
        /// How long one of its handlers may run (500ms, 30s, 5m…).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// Print what changed as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Force-release a domain: paused, its reserved threads given to default, until
    /// `outbox resume NAME`.
    Release {
        /// The domain.
        name: String,
        /// Print what changed as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// The argument of `outbox pause` and `outbox resume`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// A domain (`default` included), or else a keyword.
    name: String,
    /// Print what changed as one JSON object.
    #[arg(long)]
    json: bool,
}

/// A whole number of at least 0 (a negative one is refused saying so, not as a flag).
fn parse_count(text: &str) -> std::result::Result<usize, String> {
    let n: i64 = text
        .parse()
        .map_err(|_| format!("expected a whole number, not {text:?}"))?;
    usize::try_from(n).map_err(|_| format!("must be at least 0, not {n}"))
}

fn connect(url: &DatabaseUrl) -> Result<DbConnection> {
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    Ok(conn)
}

pub(super) fn run(url: &DatabaseUrl, args: DomainArgs) -> Result<()> {
    match args.command {
        DomainCommand::List { json } => list(url, json),
        DomainCommand::Set {
            name,
            keywords,
            max,
            reserved,
            queue,
            timeout,
            json,
        } => {
            let mut change = DomainChange {
                keywords,
                queue,
                timeout,
                ..DomainChange::default()
            };
            if let Some(n) = max {
                change = change.max(n);
            }
            if let Some(n) = reserved {
                change = change.reserved(n);
            }
            // Checked before connecting: bad usage is reported as such, whatever the database.
            change.validate(&name)?;
            let mut conn = connect(url)?;
            let changed = admin::set(&mut conn, &name, &change, &super::actor())?;
            report(&changed, json, &change.describe());
            Ok(())
        }
        DomainCommand::Release { name, json } => {
            admin::validate_release(&name)?;
            let mut conn = connect(url)?;
            let changed = admin::release(&mut conn, &name, &super::actor())?;
            report(&changed, json, "");
            Ok(())
        }
    }
}

pub(super) fn run_pause(url: &DatabaseUrl, args: PauseArgs, pause: bool) -> Result<()> {
    validate_name(&args.name)?;
    let mut conn = connect(url)?;
    let changed = if pause {
        admin::pause(&mut conn, &args.name, &super::actor())?
    } else {
        admin::resume(&mut conn, &args.name, &super::actor())?
    };
    report(&changed, args.json, "");
    Ok(())
}

/// One line saying what changed (or one JSON object).
fn report(changed: &Changed, json: bool, what: &str) {
    if json {
        println!(
            "{}",
            serde_json::to_string(changed).expect("a change serialises")
        );
        return;
    }
    let target = match changed.target {
        Target::Domain => "domain",
        Target::Keyword => "keyword",
    };
    let name = &changed.name;
    let nodes = match changed.nodes {
        0 => "no live node has it yet".to_owned(),
        1 => "1 live node applies it at its next heartbeat".to_owned(),
        n => format!("{n} live nodes apply it at their next heartbeat"),
    };
    let done = match changed.action {
        "domain.set" => format!("set ({what})"),
        "domain.release" => "released: paused, its reserved threads go to default".to_owned(),
        "domain.pause" | "keyword.pause" => {
            "paused: none of its tasks is claimed until it is resumed".to_owned()
        }
        _ => "resumed".to_owned(),
    };
    if changed.changed {
        let version = changed
            .setting
            .as_ref()
            .map_or_else(String::new, |s| format!(", version {}", s.version));
        say!("{target} {name} {done}{version}; {nodes}");
    } else {
        let state = match changed.action {
            "domain.set" => "already set so",
            "domain.release" => "already released",
            "domain.pause" | "keyword.pause" => "already paused",
            _ => "not paused",
        };
        say!("{target} {name} is {state}; nothing written");
    }
}

fn list(url: &DatabaseUrl, json: bool) -> Result<()> {
    let mut conn = connect(url)?;
    let domains = admin::list(&mut conn)?;
    let paused = admin::paused_keywords(&mut conn)?;
    if json {
        for domain in &domains {
            println!(
                "{}",
                serde_json::to_string(domain).expect("a domain serialises")
            );
        }
        for keyword in &paused {
            println!(
                "{}",
                serde_json::json!({"keyword": keyword, "paused": true})
            );
        }
        return Ok(());
    }
    if domains.is_empty() {
        say!("no domains: no row in async_domain, and no live node has published its own");
    } else {
        print_table(&domains);
    }
    if !paused.is_empty() {
        say!();
        say!("keywords paused on their own: {}", paused.join(", "));
    }
    Ok(())
}

/// The domains as a table (also under `outbox stats`).
pub(super) fn print_table(domains: &[DomainView]) {
    say!(
        "{:<24} {:<12} {:>5} {:>7} {:>8} {:>8} {:>7} {:>7} {:>6} {:>5}  {:<8} keywords",
        "domain",
        "mode",
        "nodes",
        "threads",
        "reserved",
        "borrowed",
        "running",
        "queued",
        "stuck",
        "queue",
        "state"
    );
    for d in domains {
        let mode = match (d.mode, d.per_node) {
            (Some(mode), Some(n)) => format!("{} {n}", mode.as_str().to_uppercase()),
            (Some(mode), None) => mode.as_str().to_uppercase(),
            (None, _) => "-".to_owned(),
        };
        let state = if d.released {
            "released"
        } else if d.paused {
            "paused"
        } else {
            "active"
        };
        let queue = d.queue.map_or_else(|| "-".to_owned(), |q| q.to_string());
        say!(
            "{:<24} {:<12} {:>5} {:>7} {:>8} {:>8} {:>7} {:>7} {:>6} {:>5}  {:<8} {}",
            d.domain,
            mode,
            d.nodes,
            d.threads,
            d.reserved,
            d.borrowed,
            d.running,
            d.queued,
            d.stuck,
            queue,
            state,
            d.keywords.join(",")
        );
    }
}
