//! The rows and parameters that pass between the engine and the driver.

use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use serde::Serialize;

use crate::task::TaskState;

/// The fence of a claimed task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub id: i64,
    pub owner: i64,
    pub token: i64,
}

/// What marks one of the engine's transactions on PostgreSQL, so that rescue and the
/// domain watchdog can find its session and end it: the node that runs it and a number of
/// that node's own (see [`super::Driver::transaction_begin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxMark {
    pub node: i64,
    pub run: i64,
}

/// How a lease claim cuts its page into chunks: `per` tasks each, the first chunk's run
/// `first`, the next ones' following it (see [`super::Driver::task_lease_page`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRuns {
    pub first: i64,
    pub per: i64,
}

/// What ends a lock claim's chunk for one of its tasks that ran past its timeout (see
/// [`super::Driver::task_charge_leased`]).
#[derive(Debug, Clone, Copy)]
pub struct LeaseCharge<'a> {
    /// The task charged a failure.
    pub task: i64,
    /// Every task of its chunk, `(id, token)` (their leases under those tokens are deleted;
    /// the others are not charged).
    pub chunk: &'a [(i64, i64)],
    /// What `last_error` says.
    pub error: &'a str,
    /// The retry's delay, when the failure is not the last.
    pub delay_ms: i64,
    /// Max attempts of tasks that set none.
    pub default_max_attempts: i32,
}

/// Where a task stands: its state and the claim it was last under.
#[derive(Debug, Clone, diesel::Queryable)]
pub struct ClaimState {
    pub state: String,
    pub owner: Option<i64>,
    pub claim_token: i64,
}

/// A task as stored.
#[derive(Debug, Clone)]
pub struct TaskRecord {
    pub id: i64,
    pub state: String,
    pub biz_data: String,
    pub tenant: Option<String>,
    pub priority: i32,
    pub failures: i32,
    pub last_error: Option<String>,
}

/// One task to insert. On PostgreSQL a batch travels as one JSON document of these (short
/// keys), so that any number of rows is one statement with one bind; on SQLite as bind
/// parameters.
#[derive(Debug, Serialize)]
pub struct InsertRow<'a> {
    pub k: &'a str,
    pub b: &'a str,
    /// The payload as JSON text.
    pub d: &'a str,
    pub t: Option<&'a str>,
    pub p: i16,
    pub m: Option<i32>,
    /// Delay in milliseconds.
    pub ms: i64,
}

/// Who claims, for what, and for how long: what every claim of a page is given (see
/// [`super::Driver::task_claim_page`]).
#[derive(Debug, Clone, Copy)]
pub struct Claiming<'a> {
    /// The claiming node: the claimed tasks' owner.
    pub owner: i64,
    /// What the claim may take.
    pub due: &'a super::Due<'a>,
    /// The tenants whose tasks are left to [`super::Driver::task_claim_limited`] (those with a
    /// `max_running`; that claim takes the tenants it is given instead).
    pub except: &'a [String],
    /// The most tasks it takes.
    pub limit: i64,
    /// The claimed tasks' deadline, from now.
    pub timeout_ms: i64,
}

/// A task's id and unique key.
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct TaskKey {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub keyword: String,
    #[diesel(sql_type = Text)]
    pub biz_id: String,
}

/// A claimed row, as the claim statement returns it.
#[derive(Debug, diesel::QueryableByName)]
pub struct ClaimRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub keyword: String,
    #[diesel(sql_type = Text)]
    pub biz_id: String,
    #[diesel(sql_type = Text)]
    pub biz_data: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub tenant: Option<String>,
    #[diesel(sql_type = Integer)]
    pub failures: i32,
    #[diesel(sql_type = Nullable<Integer>)]
    pub max_attempts: Option<i32>,
    #[diesel(sql_type = BigInt)]
    pub claim_token: i64,
    #[diesel(sql_type = Integer)]
    pub priority: i32,
}

/// The settings of one rescue pass.
#[derive(Debug, Clone, Copy)]
pub struct RescueParams {
    /// The rescuing node: live to itself whatever its heartbeat's age (while its row is
    /// alive), so never charged by its own pass for that; on PostgreSQL its statements'
    /// transactions hold its mark, by which another node's pass ends them if this one freezes
    /// inside one.
    pub node: i64,
    /// A node whose last heartbeat is older than this is dead.
    pub dead_after_ms: i64,
    /// Max attempts of tasks that set none.
    pub default_max_attempts: i32,
    /// The retry delay after the first failure; it doubles per failure.
    pub backoff_base_ms: i64,
    /// The longest retry delay.
    pub backoff_max_ms: i64,
    /// The relative jitter of each rescued task's delay (0 to 1).
    pub backoff_jitter: f64,
    /// `None`: the pass's statements take every lapsed task but the dying parents
    /// ([`super::Driver::task_rescue_dying`]); `Some(id)`: that task alone, if lapsed.
    pub only: Option<i64>,
}

/// A rescued task: its id, its new state (`pending` or `dead`), and why it was rescued
/// ("rescued from node N: …", as stored in `last_error`).
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct RescuedRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub state: String,
    #[diesel(sql_type = Text)]
    pub reason: String,
    /// Its keyword, biz_id and tenant (for the metrics and the dead-task hook).
    #[diesel(sql_type = Text)]
    pub keyword: String,
    #[diesel(sql_type = Text)]
    pub biz_id: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub tenant: Option<String>,
}

/// One line of the task statistics.
#[derive(Debug, Clone)]
pub struct KeywordStateCount {
    pub keyword: String,
    pub state: String,
    pub count: i64,
    /// Seconds since the oldest due pending task became due.
    pub oldest_due_secs: Option<f64>,
    /// Of the tasks counted, those pending and due now.
    pub due: i64,
}

/// One batch of a prune.
#[derive(Debug, Clone, Copy)]
pub struct PruneBatch<'a> {
    /// The finished states to delete.
    pub states: &'a [TaskState],
    /// Tasks that finished more than this long ago, by the database clock.
    pub older_than_ms: i64,
    /// Rows per batch.
    pub limit: i64,
    /// Where the previous batch stopped (0 at first): backends that walk the table resume
    /// after it.
    pub after_id: i64,
}

/// What one prune batch did.
#[derive(Debug, Clone, Default)]
pub struct PrunedBatch {
    /// Deleted tasks per state.
    pub deleted: Vec<(TaskState, u64)>,
    /// Whether another batch may find more.
    pub more: bool,
    /// Where the next batch resumes (see [`PruneBatch::after_id`]).
    pub resume_after: i64,
}

/// A tenant's row of `async_tenant`, with its queued and running tasks counted now.
#[derive(Debug, Clone)]
pub struct TenantRow {
    pub tenant: String,
    pub max_queued: Option<i32>,
    pub max_running: Option<i32>,
    pub weight: i32,
    pub queued: i64,
    pub running: i64,
    /// UTC, `YYYY-MM-DD HH:MM:SS.SSS`.
    pub updated_at: String,
    pub updated_by: String,
}

/// What a `tenant set` changes: `None` leaves a limit as it is (unlimited for a new tenant),
/// `Some(None)` removes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantSet {
    pub max_queued: Option<Option<i32>>,
    pub max_running: Option<Option<i32>>,
    pub weight: Option<i32>,
}

/// One row of `async_audit` to write.
#[derive(Debug, Clone, Copy)]
pub struct AuditEntry<'a> {
    pub actor: &'a str,
    pub action: &'a str,
    pub target: &'a str,
    /// A JSON object.
    pub detail: &'a str,
    pub affected: i64,
}

/// Which unfinished tasks an operator's change applies to: every condition given must hold.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskFilter<'a> {
    pub keyword: Option<&'a str>,
    pub tenant: Option<&'a str>,
}

/// A row of `async_domain`: a field left NULL takes the node's own configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRow {
    pub name: String,
    /// A JSON array of keywords.
    pub keywords: Option<String>,
    /// `max` or `reserved`.
    pub mode: Option<String>,
    pub threads: Option<i32>,
    pub queue: Option<i32>,
    pub timeout_ms: Option<i64>,
    pub paused: bool,
    pub released: bool,
    /// The keywords a pause or release holds on every node, a JSON array (NULL: none).
    pub held_keywords: Option<String>,
    pub version: i64,
    pub updated_at: String,
    pub updated_by: String,
}

/// A live node's published domains (`async_node.domains`, JSON of
/// [`crate::domain::NodeDomains`]; NULL before its first heartbeat).
#[derive(Debug, Clone, diesel::Queryable)]
pub struct NodeDomainsRow {
    pub id: i64,
    pub name: String,
    pub domains: Option<String>,
}

/// A row of `async_domain` as an operator's change leaves it, written whole (see
/// [`super::Driver::domain_write`]): `None` leaves a field to the nodes' own configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainWrite<'a> {
    pub name: &'a str,
    /// A JSON array of keywords.
    pub keywords: Option<String>,
    /// `max` or `reserved`.
    pub mode: Option<&'static str>,
    pub threads: Option<i32>,
    pub queue: Option<i32>,
    pub timeout_ms: Option<i64>,
    pub paused: bool,
    pub released: bool,
    /// A JSON array of the keywords the pause holds on every node.
    pub held_keywords: Option<String>,
}

/// Whose tasks a claim takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Pick<'a> {
    /// Every participant's, shared by weight; the ring of tenants starts after `after`.
    Fair {
        /// The tenant where the node's last claim stopped (`""`: none).
        after: &'a str,
        /// Where the walk around the ring that this claim continues began: `after` for a
        /// claim that begins one, an earlier claim's `after` for one that goes on where that
        /// claim's walk reached its bound. The ring stops before it would pass `lap` (each
        /// tenant is visited at most once per lap, in the database's order).
        lap: &'a str,
        /// What the node's claims have served each participant, over its weight.
        passes: &'a Passes,
    },
    /// One participant's only: a tenant's, or (`None`) the tasks without one.
    Solo {
        /// The participant.
        tenant: Option<&'a str>,
        /// Whether to ask if another participant has pending tasks (`crowded`).
        probe: bool,
    },
}

/// Each participant's pass: the tasks this node's claims (of one keyword set) served it,
/// over its weight. A fair claim ranks a participant's tasks from its pass, so that shares
/// even out across claims, whatever the page size.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Passes {
    /// Tenants with a pass…
    pub tenants: Vec<String>,
    /// …and their passes, in the same order.
    pub values: Vec<f64>,
    /// The pass of the tasks without a tenant.
    pub none: f64,
    /// The pass of a tenant not listed.
    pub base: f64,
}

/// What a claim took.
#[derive(Debug, Default)]
pub struct Picked {
    /// The rows claimed (or locked).
    pub rows: Vec<ClaimRow>,
    /// The weight of each participant with rows (a tenant, or `None`); a solo claim's is 1.
    pub weights: Vec<(Option<String>, i32)>,
    /// A [`Pick::Solo`] claim found another participant with pending tasks.
    pub crowded: bool,
    /// A [`Pick::Fair`] claim: the last tenant its ring walked to.
    pub ring_end: Option<String>,
    /// A [`Pick::Fair`] claim's ring stopped at its bound (the most tenants one statement
    /// visits), not because it came round to its lap's start: tenants after `ring_end` may
    /// have tasks due that it did not see.
    pub ring_cut: bool,
    /// The participants that had tasks due and shared a fair claim's page (a tenant, or
    /// `None`: the tasks without one); empty for a solo claim, and for a fair claim that
    /// took nothing.
    pub shared: Vec<Option<String>>,
    /// The claim's COMMIT failed (on a lost connection the server may have committed it and
    /// its reply be what was lost): `rows` may be claimed or not, and the caller gives them
    /// back (fenced by their tokens) before it reports this error.
    pub unconfirmed: Option<diesel::result::Error>,
}

impl Picked {
    /// A claim's `rows`, nothing else said.
    pub(super) fn of(rows: Vec<ClaimRow>) -> Picked {
        Picked {
            rows,
            ..Picked::default()
        }
    }
}

/// A row of one `id`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(diesel::QueryableByName)]
pub(super) struct IdRow {
    #[diesel(sql_type = BigInt)]
    pub(super) id: i64,
}

/// A row of one count, `n`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(diesel::QueryableByName)]
pub(super) struct CountRow {
    #[diesel(sql_type = BigInt)]
    pub(super) n: i64,
}

/// A row of one `state`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(diesel::QueryableByName)]
pub(super) struct StateRow {
    #[diesel(sql_type = Text)]
    pub(super) state: String,
}

/// A row of one `found`, whether something exists.
#[cfg(feature = "postgres")]
#[derive(diesel::QueryableByName)]
pub(super) struct FoundRow {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub(super) found: bool,
}
