//! `outbox nodes`: the worker processes, live and gone ([`crate::ops::nodes`]).

use std::time::Duration;

use chrono::SecondsFormat;
use clap::Args;

use super::out;
use super::parse_duration;
use super::table::{self, Align};
use crate::db::DatabaseUrl;
use crate::migrate::ensure_migrated;
use crate::ops::{nodes, NodeQuery, NodeStatus, DEFAULT_NODE_LIMIT};

/// The flags of `outbox nodes`.
#[derive(Debug, Args)]
pub struct NodesArgs {
    /// A node silent for longer is listed as silent (the workers' --dead-after).
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    dead_after: Duration,
    /// At most this many nodes, the most recent heartbeats first (at most 1000).
    #[arg(long, default_value_t = DEFAULT_NODE_LIMIT)]
    limit: usize,
    /// One JSON object per node per line.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(url: &DatabaseUrl, args: NodesArgs) -> crate::Result<()> {
    let query = NodeQuery::default()
        .limit(args.limit)
        .live_within(args.dead_after);
    // Checked before connecting: bad usage is reported as such.
    query.validate()?;
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    let nodes = nodes(&mut conn, &query)?;
    if args.json {
        out::json_lines(
            nodes
                .iter()
                .map(|node| serde_json::to_string(node).expect("a node serialises")),
        );
        return Ok(());
    }
    if nodes.is_empty() {
        out::lines(["no nodes: no worker has run on this database (or prune removed them)"]);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n.id.to_string(),
                n.name.clone(),
                n.status.as_str().to_owned(),
                table::age(n.heartbeat_age_secs),
                n.running.to_string(),
                n.started_at.to_rfc3339_opts(SecondsFormat::Secs, true),
            ]
        })
        .collect();
    let mut lines = table::render(
        &[
            ("id", Align::Right),
            ("name", Align::Left),
            ("status", Align::Left),
            ("heartbeat", Align::Right),
            ("running", Align::Right),
            ("started", Align::Left),
        ],
        &rows,
    );
    let live = nodes
        .iter()
        .filter(|n| n.status == NodeStatus::Live)
        .count();
    lines.push(format!("({live} live of {} listed)", nodes.len()));
    out::lines(lines);
    Ok(())
}
