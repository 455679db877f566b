//! `outbox stats`: tasks per keyword, then the domains' slot use summed over the live nodes
//! ([`crate::domain::admin::list`]).

use clap::Args;

use super::out::say;
use crate::db::DatabaseUrl;
use crate::domain::admin;
use crate::migrate::ensure_migrated;
use crate::registry::Registry;
use crate::stats::{keyword_stats, KeywordStats};

/// The flags of `outbox stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// One JSON object per keyword per line, then one per domain per line (with the key
    /// `domain`).
    #[arg(long)]
    json: bool,
}

pub(super) fn run(url: &DatabaseUrl, registry: &Registry, args: StatsArgs) -> crate::Result<()> {
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    let stats = keyword_stats(&mut conn, registry)?;
    let domains = admin::list(&mut conn)?;
    if args.json {
        for line in &stats {
            println!("{}", serde_json::to_string(line).expect("stats serialise"));
        }
        for domain in &domains {
            println!(
                "{}",
                serde_json::to_string(domain).expect("a domain serialises")
            );
        }
        return Ok(());
    }
    if stats.is_empty() {
        say!("no tasks");
    } else {
        print_keywords(&stats);
    }
    // Nothing to show when no live node published its domains and no row sets one.
    if !domains.is_empty() {
        say!();
        super::domain::print_table(&domains);
    }
    Ok(())
}

fn print_keywords(stats: &[KeywordStats]) {
    say!(
        "{:<32} {:>8} {:>8} {:>8} {:>10} {:>8} {:>9} {:>12}",
        "keyword",
        "blocked",
        "pending",
        "running",
        "done",
        "dead",
        "cancelled",
        "oldest due"
    );
    for s in stats {
        let oldest = s
            .oldest_due_secs
            .map_or_else(|| "-".to_owned(), |secs| format!("{secs:.1}s"));
        say!(
            "{:<32} {:>8} {:>8} {:>8} {:>10} {:>8} {:>9} {:>12}",
            s.keyword,
            s.blocked,
            s.pending,
            s.running,
            s.done,
            s.dead,
            s.cancelled,
            oldest
        );
    }
    let unserved: Vec<&str> = stats
        .iter()
        .filter(|s| !s.served && (s.pending > 0 || s.blocked > 0))
        .map(|s| s.keyword.as_str())
        .collect();
    if !unserved.is_empty() {
        say!();
        say!(
            "no handler in this binary for: {} (their tasks stay pending)",
            unserved.join(", ")
        );
    }
}
