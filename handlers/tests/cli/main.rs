//! Smoke tests of the built `outbox` binary: each test runs it as a separate process, in a
//! temporary directory of its own as working directory, and checks its exit code, its
//! output and what it left in the database.
//!
//! Exit codes under test (see `outbox::cli`): 0 success, 1 the command failed, 2 bad usage
//! or invalid input. Every child process is waited for with a time limit, so a hanging
//! command fails its test instead of hanging the suite.
//!
//! Layout: one module per command family (`usage`, `demo`, `enqueue`, `work`, `prune`,
//! `bench`, `domain`, `ops_tasks`, `ops_fleet`, `strategy`; `secrets`: no password in any
//! output; `terminal`: control characters escaped; `producers`: the SQL contract
//! held by a Python producer), so a test's full name is, e.g.,
//! `demo::demo_on_postgres`; the modules they share are listed below.

#[path = "../../../tests/suite/support.rs"]
mod support;
// Scraping a metrics endpoint and parsing the exposition, as the suite does.
#[path = "../../../tests/suite/scrape.rs"]
mod scrape;
// The dashboard's tests' HTTP client, shared with the suite's.
#[path = "../../../tests/suite/http.rs"]
mod http;
// Misbehaving clients, for the HTTP servers' bounds.
#[path = "../../../tests/suite/siege.rs"]
mod siege;

// Support: running the binary, looking into databases, driving a browser.
mod binary;
mod db;
mod webdriver;

// The command families.
mod bench;
mod demo;
mod domain;
mod enqueue;
mod metrics;
mod ops_fleet;
mod ops_tasks;
mod pgbouncer;
mod producers;
mod prune;
mod roles;
mod schedules;
mod secrets;
mod shards;
mod strategy;
mod terminal;
mod transcripts;
mod usage;
mod web;
mod work;
