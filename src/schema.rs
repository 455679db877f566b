//! The outbox tables, declared once for every backend with diesel's `table!`: what the query
//! builder checks a query against, in the shape `diesel print-schema` writes.
//!
//! Each backend has its own migrations (`migrations/postgres`, `sqlite`, `mysql`), and
//! `print-schema` would read one backend's catalogue; this file is their common view, kept
//! in step with all three by the suite's `catalogue` test (a fresh database of each backend,
//! migrated, compared table by table and column by column: names, nullability and a type
//! family). Change a migration and this file together.
//!
//! The SQL types are those every backend loads, so that a query written with them runs on
//! [`crate::DbConnection`]:
//!
//! - ids and counters: `BigInt`, `Integer` or `SmallInt` as PostgreSQL stores them (its
//!   loads check the width; SQLite's `INTEGER` is 64-bit, and MySQL's loads narrow a
//!   value that fits);
//! - times: `Timestamp`, read as a UTC `NaiveDateTime`. PostgreSQL stores `timestamptz`,
//!   which it sends in `timestamp`'s format; SQLite stores text, MySQL `DATETIME(3)`, both in
//!   UTC. A `Timestamp` bound against a PostgreSQL column is converted by the session's time
//!   zone: compare with the database clock (`now`), not with a bound time;
//! - flags: `Bool` (`boolean`, SQLite's 0/1 `INTEGER`, MySQL's `TINYINT(1)`).
//!
//! Where a column's type differs by backend in a way `table!` cannot say, the portable
//! mapping is chosen and the column says so: `biz_data` and `detail` are JSON, stored as
//! `jsonb` on PostgreSQL and as text elsewhere. They are declared `Text`, but PostgreSQL
//! neither loads `jsonb` as `Text` nor takes a `Text` bind for it: queries that read or
//! write them stay per backend.
//!
//! A few tables and one column exist on one backend only, for that backend's mechanism;
//! each says which. A query that names them is for that backend alone.

// `table!` writes a struct per column; a column is documented by its migration (and here
// only where its backends differ).
#![allow(missing_docs)]

diesel::table! {
    /// What operators changed, written in the transaction of the change.
    async_audit (id) {
        id -> BigInt,
        at -> Timestamp,
        actor -> Text,
        action -> Text,
        target -> Text,
        /// JSON: `jsonb` on PostgreSQL (see the module's note), text elsewhere.
        detail -> Text,
        affected -> BigInt,
    }
}

diesel::table! {
    /// Task domains' run-time control: resources, pause, force-release.
    async_domain (name) {
        name -> Text,
        /// A JSON array of keywords, as text on every backend.
        keywords -> Nullable<Text>,
        mode -> Nullable<Text>,
        threads -> Nullable<Integer>,
        queue -> Nullable<Integer>,
        timeout_ms -> Nullable<BigInt>,
        paused -> Bool,
        released -> Bool,
        version -> BigInt,
        updated_at -> Timestamp,
        updated_by -> Text,
        held_keywords -> Nullable<Text>,
    }
}

diesel::table! {
    /// PostgreSQL and MySQL: the leases of lock claims, one per task of a running chunk.
    async_lease (task_id) {
        task_id -> BigInt,
        node_id -> BigInt,
        token -> BigInt,
        chunk -> Integer,
        deadline_at -> Timestamp,
    }
}

diesel::table! {
    /// MySQL only: the row that operators' changes of domains and paused keywords lock in
    /// turn (MySQL has no transaction-long lock on a name).
    async_lock (name) {
        name -> Text,
    }
}

diesel::table! {
    /// One worker process, alive while its heartbeat is fresh.
    async_node (id) {
        id -> BigInt,
        name -> Text,
        started_at -> Timestamp,
        heartbeat_at -> Timestamp,
        state -> Text,
        domains -> Nullable<Text>,
        strategy -> Text,
        weight -> Integer,
        running -> BigInt,
    }
}

diesel::table! {
    /// Keywords an operator paused.
    async_pause (keyword) {
        keyword -> Text,
        paused_at -> Timestamp,
        paused_by -> Text,
    }
}

diesel::table! {
    /// Cron schedules, one per keyword.
    async_schedule (keyword) {
        keyword -> Text,
        expression -> Text,
        since -> Timestamp,
        last_tick -> Nullable<Timestamp>,
        updated_at -> Timestamp,
        updated_by -> Text,
    }
}

diesel::table! {
    /// The tasks.
    async_task (id) {
        id -> BigInt,
        keyword -> Text,
        biz_id -> Text,
        /// JSON: `jsonb` on PostgreSQL (see the module's note), text elsewhere.
        biz_data -> Text,
        tenant -> Nullable<Text>,
        state -> Text,
        failures -> Integer,
        max_attempts -> Nullable<Integer>,
        priority -> SmallInt,
        run_at -> Timestamp,
        owner -> Nullable<BigInt>,
        claim_token -> BigInt,
        parent_id -> Nullable<BigInt>,
        last_error -> Nullable<Text>,
        created_at -> Timestamp,
        updated_at -> Timestamp,
        claimed_at -> Nullable<Timestamp>,
        deadline_at -> Nullable<Timestamp>,
        finished_at -> Nullable<Timestamp>,
        blocked_by -> Integer,
        has_children -> Bool,
        suspect -> Integer,
        /// MySQL only, generated: the tenant while the task is pending (the tenant index's key).
        pending_tenant -> Nullable<Text>,
        /// MySQL only, generated: 1 while the task is a pending suspect (the suspects' index).
        pending_suspect -> Nullable<Integer>,
    }
}

diesel::table! {
    /// Parent → child links of task chains.
    async_task_parent (child_id, parent_id) {
        child_id -> BigInt,
        parent_id -> BigInt,
    }
}

diesel::table! {
    /// Tenant quotas; a tenant without a row is unlimited and weighs 1.
    async_tenant (tenant) {
        tenant -> Text,
        max_queued -> Nullable<Integer>,
        max_running -> Nullable<Integer>,
        weight -> Integer,
        updated_at -> Timestamp,
        updated_by -> Text,
        /// MySQL only: bumped by each enqueue checked against `max_queued`.
        enqueue_seq -> BigInt,
    }
}

diesel::table! {
    /// MySQL only: bumped by each enqueue checked against a tenant's `max_queued` from a
    /// snapshot that was not current.
    async_tenant_late_enqueue (tenant) {
        tenant -> Text,
        enqueue_seq -> BigInt,
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    async_audit,
    async_domain,
    async_lease,
    async_lock,
    async_node,
    async_pause,
    async_schedule,
    async_task,
    async_task_parent,
    async_tenant,
    async_tenant_late_enqueue,
);
