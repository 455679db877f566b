//! # outbox
//!
//! Runs business side-effects reliably, after the fact. A producer records "do X for
//! business object Y" as a row of `async_task` **inside its own business transaction**
//! ([`enqueue()`]); workers claim due tasks a page at a time with one `UPDATE`, run the handler
//! registered for each task's keyword in a rayon pool, and record the completion **in the
//! same transaction as the handler's side-effect**.
//!
//! ## Guarantees
//!
//! - A task exists if and only if the producer's transaction committed.
//! - `(keyword, biz_id)` is unique: enqueueing the same pair twice yields one task.
//! - **Exactly once** for effects a handler writes through its task's transaction
//!   ([`TaskTx::conn`]): the completion is fenced by owner and claim token and commits with
//!   them, so a handler whose claim was taken over, or that failed, leaves no effect.
//! - **At least once** for effects outside the database (HTTP calls, files, e-mail): make them
//!   idempotent by `biz_id`.
//!
//! Backends: PostgreSQL (`postgres://…`, any number of worker processes on any number of
//! machines), SQLite (a file, one machine) and MySQL/MariaDB (`mysql://…`), chosen by the URL
//! scheme, never one in place of the other. Each is a cargo feature (`postgres`, `sqlite`, both
//! by default; `mysql`), so that an SQLite-only build needs no libpq.
//!
//! ## A tour
//!
//! - **Producing**: [`DatabaseUrl`] parses a URL and [`DatabaseUrl::connect`] opens a
//!   [`DbConnection`]; [`run_migrations`] creates the tables; [`enqueue()`] and
//!   [`enqueue_batch`] write [`NewTask`]s in the caller's transaction ([`write_transaction`]).
//! - **Handling**: a [`Handler`] is a function of a [`TaskContext`] (keyword, biz_id, payload)
//!   and a [`TaskTx`] (the task's transaction); it returns a [`HandlerResult`], a
//!   [`HandlerError`] saying whether to retry ([`Backoff`]) or give up. A [`Registry`] maps
//!   keywords to handlers and cron schedules ([`schedule`]).
//! - **Running**: a [`Worker`] ([`WorkerConfig`]: threads, claims, timeouts, [`Strategy`])
//!   drains what is due ([`Worker::drain`]) or runs until a signal ([`Worker::run`]); a
//!   [`Fleet`] serves several databases. [`cli`] is the `outbox` command line as a library, for
//!   a binary that adds its own handlers.
//! - **Isolation**: [`domain`] shares a node's threads between sets of keywords; [`tenant`]
//!   quotas ([`set_tenant`]) bound a tenant's queued and running tasks; [`cancel()`] and
//!   [`retry()`] are the operator's levers.
//! - **Operations**: [`stats`], [`ops`] (list, show, nodes, audit), [`prune`], [`metrics`]
//!   (Prometheus), and with the `web` feature the dashboard (`web`).
//! - **Testing handlers**: with the `testing` feature, `testing` runs a handler against a
//!   scratch database and drains it.
//!
//! ```no_run
//! use outbox::{DatabaseUrl, HandlerResult, Registry, TaskContext, TaskTx, Worker, WorkerConfig};
//!
//! fn send_mail(task: &TaskContext, _tx: &mut TaskTx) -> HandlerResult {
//!     println!("mail for order {}", task.biz_id());
//!     Ok(())
//! }
//!
//! fn main() -> outbox::Result<()> {
//!     let url = DatabaseUrl::parse("app.db")?; // or postgres://…, mysql://…
//!     outbox::run_migrations(&mut url.connect()?)?;
//!     let mut registry = Registry::new();
//!     registry.register("mail.send", send_mail);
//!     let worker = Worker::new(&url, registry, WorkerConfig::default())?;
//!     let report = worker.drain()?; // or worker.run(): until SIGINT or SIGTERM
//!     println!("{report:?}");
//!     Ok(())
//! }
//! ```
//!
//! ## The guide
//!
//! The manual is the guide in `docs/guide/` of the repository (an mdBook; every Rust block in
//! it is a doctest of this crate): `getting-started.md`, `producing.md` (Rust, the SQL
//! contract, other languages), `handlers.md`, `running.md` (cron, a fleet, systemd, embedding,
//! testing), `configuration.md` (every flag and its default), `isolation.md`, `scheduling.md`,
//! `operations.md`, `failure.md` (failure behaviour and guarantees), `backends.md` and
//! `performance.md`, all under `docs/guide/src/`.
#![deny(unsafe_code)]
#![warn(missing_docs)]
// rust-version 1.95 (Cargo.toml; 1.80 before) lets clippy suggest `Option::is_none_or` and
// `is_multiple_of`, newer than 1.80. The three places it names (src/worker/claim.rs,
// fairness.rs) are code, left for a change of their own rather than one of the docs.
#![allow(clippy::unnecessary_map_or, clippy::manual_is_multiple_of)]

pub mod backoff;
pub mod cancel;
pub mod cli;
pub mod db;
pub mod domain;
mod driver;
pub mod enqueue;
pub mod error;
pub mod handler;
mod http;
mod log_label;
pub mod metrics;
pub mod migrate;
pub mod ops;
pub mod prune;
pub mod registry;
pub mod retry;
pub mod schedule;
pub mod schema;
mod sql;
pub mod stats;
pub mod strategy;
pub mod task;
pub mod tenant;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "web")]
pub mod web;
pub mod worker;

#[cfg(test)]
mod layout_tests;

pub use backoff::Backoff;
pub use cancel::{cancel, cancel_by_key, cancel_matching, Cancelled};
pub use db::{
    write_transaction, Backend, DatabaseUrl, DbConnection, DbPool, DEFAULT_CONNECT_TIMEOUT,
};
pub use enqueue::{enqueue, enqueue_batch, EnqueueConnection, EnqueueOptions, Enqueued};
pub use error::{Error, Result};
pub use handler::{Handler, HandlerError, HandlerResult, TaskContext, TaskTx};
pub use migrate::run_migrations;
pub use registry::Registry;
pub use retry::{retry, Retried};
pub use strategy::Strategy;
pub use task::{validate_keyword, ClaimedTask, NewTask, TaskState};
pub use tenant::{remove_tenant, set_tenant, tenants, Tenant, TenantLimits};
pub use worker::{
    ClaimStyle, CronPass, Report, RescueReport, ScheduledTick, Tally, Worker, WorkerConfig,
};
// A worker serving several databases (docs/guide/src/sharding.md), and the database a log
// record of one of its threads is about.
pub use log_label::log_database;
pub use worker::{DatabaseReport, Fleet};

/// Every Rust block of the README compiles (and runs, unless marked `no_run`) as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Every Rust block of the guide (`docs/guide/src/`, one item per chapter, in the order of its
/// `SUMMARY.md`) compiles, and runs unless marked `no_run`, as a doctest;
/// `scripts/doc-links.py` checks that no chapter is missing here.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../docs/guide/src/introduction.md")]
    pub struct Introduction;
    #[doc = include_str!("../docs/guide/src/getting-started.md")]
    pub struct GettingStarted;
    #[doc = include_str!("../docs/guide/src/producing.md")]
    pub struct Producing;
    #[doc = include_str!("../docs/guide/src/handlers.md")]
    pub struct Handlers;
    #[doc = include_str!("../docs/guide/src/running.md")]
    pub struct Running;
    #[doc = include_str!("../docs/guide/src/configuration.md")]
    pub struct Configuration;
    #[doc = include_str!("../docs/guide/src/isolation.md")]
    pub struct Isolation;
    #[doc = include_str!("../docs/guide/src/domains.md")]
    pub struct Domains;
    #[doc = include_str!("../docs/guide/src/tenants.md")]
    pub struct Tenants;
    #[doc = include_str!("../docs/guide/src/cancel.md")]
    pub struct Cancel;
    #[doc = include_str!("../docs/guide/src/scheduling.md")]
    pub struct Scheduling;
    #[doc = include_str!("../docs/guide/src/cron.md")]
    pub struct Cron;
    #[doc = include_str!("../docs/guide/src/chains.md")]
    pub struct Chains;
    #[doc = include_str!("../docs/guide/src/claims.md")]
    pub struct Claims;
    #[doc = include_str!("../docs/guide/src/operations.md")]
    pub struct Operations;
    #[doc = include_str!("../docs/guide/src/operator-commands.md")]
    pub struct OperatorCommands;
    #[doc = include_str!("../docs/guide/src/metrics.md")]
    pub struct Metrics;
    #[doc = include_str!("../docs/guide/src/dashboard.md")]
    pub struct Dashboard;
    #[doc = include_str!("../docs/guide/src/pruning.md")]
    pub struct Pruning;
    #[doc = include_str!("../docs/guide/src/failure.md")]
    pub struct Failure;
    #[doc = include_str!("../docs/guide/src/fault-harness.md")]
    pub struct FaultHarness;
    #[doc = include_str!("../docs/guide/src/backends.md")]
    pub struct Backends;
    #[doc = include_str!("../docs/guide/src/postgresql.md")]
    pub struct Postgresql;
    #[doc = include_str!("../docs/guide/src/sqlite.md")]
    pub struct Sqlite;
    #[doc = include_str!("../docs/guide/src/mysql.md")]
    pub struct Mysql;
    #[doc = include_str!("../docs/guide/src/sharding.md")]
    pub struct Sharding;
    #[doc = include_str!("../docs/guide/src/performance.md")]
    pub struct Performance;
    #[doc = include_str!("../docs/guide/src/notes.md")]
    pub struct Notes;
}
