//! The worker processes, live and gone (`outbox nodes`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::list::check_limit;
use super::{age_secs, time_or_epoch};
use crate::db::DbConnection;
use crate::driver::ops::{node_list, NodeRow};
use crate::error::{OpContext, Result};
use crate::worker::{DEFAULT_DEAD_AFTER_BEATS, DEFAULT_HEARTBEAT};

/// The nodes [`nodes`] lists when asked for none: the most recent heartbeats first.
pub const DEFAULT_NODE_LIMIT: usize = 100;

/// How long a node may be silent and still count as live, unless a query says otherwise:
/// the workers' default `--dead-after` (3 heartbeats of 5 s), after which other nodes
/// rescue its tasks.
pub const DEFAULT_LIVE_WITHIN: Duration =
    Duration::from_secs(DEFAULT_HEARTBEAT.as_secs() * DEFAULT_DEAD_AFTER_BEATS as u64);

/// Whether a node is at work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    /// Its heartbeat is fresh.
    Live,
    /// It never said goodbye and its heartbeat is stale: killed, hung, or cut off from the
    /// database. Its running tasks are rescued once its silence passes the workers'
    /// `--dead-after`.
    Silent,
    /// It exited cleanly.
    Gone,
}

impl NodeStatus {
    /// `live`, `silent` or `gone`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Live => "live",
            NodeStatus::Silent => "silent",
            NodeStatus::Gone => "gone",
        }
    }
}

/// One worker process (a row of `async_node`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct NodeInfo {
    /// The node id (the `owner` of the tasks it claims).
    pub id: i64,
    /// `host:pid`.
    pub name: String,
    /// Live, silent or gone.
    pub status: NodeStatus,
    /// When it registered.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// Seconds since its last heartbeat, by the database clock.
    pub heartbeat_age_secs: f64,
    /// The tasks it holds `running` now.
    pub running: i64,
}

/// Which nodes [`nodes`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeQuery {
    /// At most this many, the most recent heartbeats first (1 to
    /// [`super::MAX_PAGE_LIMIT`]).
    pub limit: usize,
    /// A node silent for longer is [`NodeStatus::Silent`].
    pub live_within: Duration,
}

impl Default for NodeQuery {
    fn default() -> Self {
        NodeQuery {
            limit: DEFAULT_NODE_LIMIT,
            live_within: DEFAULT_LIVE_WITHIN,
        }
    }
}

impl NodeQuery {
    /// At most `limit` nodes.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Silent after `within` without a heartbeat.
    pub fn live_within(mut self, within: Duration) -> Self {
        self.live_within = within;
        self
    }

    /// Checks the query on its own ([`crate::Error::InvalidConfig`] naming `limit`).
    pub fn validate(&self) -> Result<()> {
        check_limit(self.limit).map(|_| ())
    }
}

/// The nodes, most recent heartbeat first, each with its heartbeat age (database clock) and
/// the tasks it runs now. Stopped nodes stay listed until `outbox prune` deletes their rows.
///
/// ```no_run
/// # fn main() -> outbox::Result<()> {
/// let mut conn = outbox::DatabaseUrl::parse("app.db")?.connect()?;
/// for node in outbox::ops::nodes(&mut conn, &outbox::ops::NodeQuery::default())? {
///     println!("{} {} {:.1}s ago, {} running", node.name, node.status.as_str(),
///              node.heartbeat_age_secs, node.running);
/// }
/// # Ok(())
/// # }
/// ```
pub fn nodes(conn: &mut DbConnection, query: &NodeQuery) -> Result<Vec<NodeInfo>> {
    let limit = check_limit(query.limit)?;
    let rows = node_list(conn, limit).op("node list")?;
    Ok(rows
        .into_iter()
        .map(|row| info(row, query.live_within))
        .collect())
}

fn info(row: NodeRow, live_within: Duration) -> NodeInfo {
    let now = time_or_epoch(&row.db_now);
    let heartbeat_at = time_or_epoch(&row.heartbeat_at);
    let heartbeat_age_secs = age_secs(now, heartbeat_at);
    let status = if row.state == "gone" {
        NodeStatus::Gone
    } else if heartbeat_age_secs <= live_within.as_secs_f64() {
        NodeStatus::Live
    } else {
        NodeStatus::Silent
    };
    NodeInfo {
        id: row.id,
        name: row.name,
        status,
        started_at: time_or_epoch(&row.started_at),
        heartbeat_at,
        heartbeat_age_secs,
        running: row.running,
    }
}
