//! The driver on SQLite: one writer at a time, so the claim needs no `SKIP LOCKED`; times
//! are text written by SQLite's own clock; migrations in an exclusive transaction.

// Every time column is written with this expression (millisecond precision, UTC), so that
// times compare correctly as text. The migrations' column defaults use the same.
macro_rules! now {
    () => {
        "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    };
}

mod domain;
mod enqueue;
mod fair;
mod maintenance;
mod operate;
mod ops;
mod schedule;
mod task;
mod tenant;

use std::time::{Duration, Instant};

use diesel::connection::{AnsiTransactionManager, SimpleConnection};
use diesel::sqlite::SqliteConnection;
use diesel::QueryResult;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use super::{
    AuditEntry, ChunkRuns, Claim, ClaimRow, ClaimState, DomainRow, DomainWrite, Driver, Due,
    InsertRow, KeywordStateCount, LeaseCharge, MigrationError, Pick, Picked, PruneBatch,
    PrunedBatch, RescueParams, RescuedRow, TaskFilter, TaskKey, TaskRecord, TenantRow, TenantSet,
    TxMark,
};
use crate::db::SQLITE_BUSY_TIMEOUT;

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

impl Driver for SqliteConnection {
    /// WAL so readers never block the writer, `synchronous=NORMAL` (durable at checkpoints,
    /// never corrupt), a busy timeout so that competing writers queue instead of failing,
    /// and foreign keys on.
    ///
    /// Switching a new file to WAL needs an exclusive lock and SQLite reports `database is
    /// locked` at once, without consulting the busy timeout, when another process holds the
    /// file (five `migrate`s at once on a new file): that is retried until the busy timeout.
    fn connection_configure(&mut self) -> QueryResult<()> {
        self.batch_execute(&format!(
            "PRAGMA busy_timeout = {};",
            SQLITE_BUSY_TIMEOUT.as_millis()
        ))?;
        let give_up = Instant::now() + SQLITE_BUSY_TIMEOUT;
        loop {
            match self.batch_execute("PRAGMA journal_mode = WAL;") {
                Err(diesel::result::Error::DatabaseError(_, info))
                    if info.message().contains("locked") && Instant::now() < give_up =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                other => break other,
            }
        }?;
        self.batch_execute("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")
    }

    fn transaction_begin(&mut self, _mark: Option<TxMark>) -> QueryResult<()> {
        AnsiTransactionManager::begin_transaction_sql(self, "BEGIN IMMEDIATE")
    }

    /// In an `EXCLUSIVE` transaction: diesel's harness runs each migration in a savepoint
    /// inside it, and a second process waits (busy timeout) instead of racing.
    fn migrations_run(&mut self) -> Result<Vec<String>, MigrationError> {
        let mut applied = Err(MigrationError::from("not run"));
        self.exclusive_transaction(|conn| -> QueryResult<()> {
            applied = conn
                .run_pending_migrations(MIGRATIONS)
                .map(|v| v.iter().map(ToString::to_string).collect());
            match &applied {
                Ok(_) => Ok(()),
                Err(_) => Err(diesel::result::Error::RollbackTransaction),
            }
        })
        .or_else(|e| match e {
            diesel::result::Error::RollbackTransaction => Ok(()),
            other => Err(other),
        })?;
        applied
    }

    fn migrations_known(&self) -> Result<Vec<String>, MigrationError> {
        super::migration_versions::<diesel::sqlite::Sqlite>(&MIGRATIONS)
    }

    fn task_payload_len(&self, json: &str, _value: &serde_json::Value) -> usize {
        json.len()
    }

    fn atomically(
        &mut self,
        f: &mut dyn FnMut(&mut dyn Driver) -> QueryResult<()>,
    ) -> QueryResult<()> {
        if crate::db::transaction::depth_of(self) == Some(0) {
            self.immediate_transaction(|conn| f(conn))
        } else {
            diesel::Connection::transaction(self, |conn| f(conn))
        }
    }

    fn task_link_parents(&mut self, links: &[(i64, i64)]) -> QueryResult<usize> {
        enqueue::link_parents(self, links)
    }

    fn task_insert_many(&mut self, rows: &[InsertRow<'_>]) -> QueryResult<Vec<TaskKey>> {
        enqueue::insert_many(self, rows)
    }

    fn task_find_many(&mut self, keys_json: &str) -> QueryResult<Vec<TaskKey>> {
        enqueue::find_many(self, keys_json)
    }

    fn task_claim_page(
        &mut self,
        owner: i64,
        due: &Due<'_>,
        except: &[String],
        pick: &Pick<'_>,
        limit: i64,
        timeout_ms: i64,
    ) -> QueryResult<Picked> {
        task::claim_page(self, owner, due, except, pick, limit, timeout_ms)
    }

    fn task_claim_limited(
        &mut self,
        owner: i64,
        due: &Due<'_>,
        tenants: &[String],
        limit: i64,
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>> {
        task::claim_limited(self, owner, due, tenants, limit, timeout_ms)
    }

    fn task_claim_plan(&mut self, due: &Due<'_>, limit: i64) -> QueryResult<Vec<String>> {
        task::claim_plan(self, due, limit)
    }

    fn task_complete(&mut self, claim: &Claim) -> QueryResult<usize> {
        task::complete(self, claim)
    }

    fn task_complete_many(&mut self, owner: i64, claims: &[(i64, i64)]) -> QueryResult<usize> {
        task::complete_many(self, owner, claims)
    }

    fn task_cancel(&mut self, id: i64) -> QueryResult<usize> {
        task::cancel(self, id)
    }

    fn task_cancel_matching(&mut self, filter: &TaskFilter<'_>, dry_run: bool) -> QueryResult<i64> {
        operate::cancel_matching(self, filter, dry_run)
    }

    fn task_retry(&mut self, id: i64) -> QueryResult<usize> {
        operate::retry(self, id)
    }

    fn audit_insert(&mut self, audit: &AuditEntry<'_>) -> QueryResult<usize> {
        operate::audit(self, audit)
    }

    // Lock claims are PostgreSQL's (the worker refuses the setting on other backends
    // before any of these could run).
    fn task_lease_page(
        &mut self,
        _: i64,
        _: ChunkRuns,
        _: &Due<'_>,
        _: &[String],
        _: &Pick<'_>,
        _: i64,
        _: i64,
    ) -> QueryResult<(Picked, Vec<i64>)> {
        Err(lock_claims_unsupported())
    }

    fn task_lease_plan(&mut self, _: &Due<'_>, _: i64) -> QueryResult<Vec<String>> {
        Err(lock_claims_unsupported())
    }

    fn task_complete_leased(&mut self, _: i64, _: &[i64]) -> QueryResult<usize> {
        Err(lock_claims_unsupported())
    }

    fn task_claim_leased(&mut self, _: i64, _: &[i64], _: i64) -> QueryResult<Vec<ClaimRow>> {
        Err(lock_claims_unsupported())
    }

    fn task_release_leased(&mut self, _: i64, _: &[i64]) -> QueryResult<usize> {
        Err(lock_claims_unsupported())
    }

    fn task_charge_leased(&mut self, _: i64, _: &LeaseCharge<'_>) -> QueryResult<Option<String>> {
        Err(lock_claims_unsupported())
    }

    fn task_rescue_leases(&mut self, _: &RescueParams) -> QueryResult<Vec<RescuedRow>> {
        Ok(Vec::new())
    }

    fn task_claim_suspect(
        &mut self,
        owner: i64,
        due: &Due<'_>,
        except: &[String],
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>> {
        task::claim_suspect(self, owner, due, except, timeout_ms)
    }

    fn task_suspects_exist(&mut self) -> QueryResult<bool> {
        task::suspects_exist(self)
    }

    fn session_end_stale(&mut self, _: i64) -> QueryResult<i64> {
        Ok(0)
    }

    fn session_end(&mut self, _: TxMark) -> QueryResult<bool> {
        Ok(false)
    }

    fn task_fail_retry(&mut self, claim: &Claim, error: &str, delay_ms: i64) -> QueryResult<usize> {
        task::fail_retry(self, claim, error, delay_ms)
    }

    fn task_fail_dead(&mut self, claim: &Claim, error: &str) -> QueryResult<usize> {
        task::fail_dead(self, claim, error)
    }

    fn task_release(&mut self, claim: &Claim, note: Option<&str>) -> QueryResult<usize> {
        task::release(self, claim, note)
    }

    fn task_get_claim(&mut self, id: i64) -> QueryResult<Option<ClaimState>> {
        task::get_claim(self, id)
    }

    fn task_get_by_key(&mut self, keyword: &str, biz_id: &str) -> QueryResult<Option<TaskRecord>> {
        task::get_by_key(self, keyword, biz_id)
    }

    fn task_rescue_many(&mut self, rescue: &RescueParams) -> QueryResult<Vec<RescuedRow>> {
        task::rescue_many(self, rescue)
    }

    fn task_count_by_keyword_state(&mut self) -> QueryResult<Vec<KeywordStateCount>> {
        maintenance::count_by_keyword_state(self)
    }

    fn task_prune_batch(&mut self, batch: &PruneBatch<'_>) -> QueryResult<PrunedBatch> {
        maintenance::prune_tasks(self, batch)
    }

    fn tenant_set(
        &mut self,
        tenant: &str,
        set: &TenantSet,
        audit: &AuditEntry<'_>,
    ) -> QueryResult<TenantRow> {
        tenant::set(self, tenant, set, audit)
    }

    fn tenant_remove(&mut self, tenant: &str, audit: &AuditEntry<'_>) -> QueryResult<usize> {
        tenant::remove(self, tenant, audit)
    }

    fn tenant_list(&mut self) -> QueryResult<Vec<TenantRow>> {
        tenant::list(self)
    }

    fn tenant_over_max_queued(
        &mut self,
        tenants: &[(String, i64)],
    ) -> QueryResult<Option<(String, i64)>> {
        tenant::over_max_queued(self, tenants)
    }

    fn node_register(&mut self, name: &str) -> QueryResult<i64> {
        maintenance::node_register(self, name)
    }

    fn node_heartbeat(&mut self, node_id: i64, domains: &str) -> QueryResult<usize> {
        maintenance::node_heartbeat(self, node_id, domains)
    }

    fn backend_pid(&mut self) -> QueryResult<Option<i32>> {
        Ok(None)
    }

    fn backend_cancel(&mut self, _pid: i32) -> QueryResult<bool> {
        Ok(false)
    }

    fn node_prune_batch(
        &mut self,
        older_than_ms: i64,
        silent_ms: i64,
        limit: i64,
    ) -> QueryResult<usize> {
        maintenance::prune_nodes(self, older_than_ms, silent_ms, limit)
    }

    fn listen_start(&mut self) -> QueryResult<bool> {
        Ok(false)
    }

    fn listen_poll(&mut self) -> QueryResult<bool> {
        Ok(false)
    }

    fn domain_lock(&mut self) -> QueryResult<()> {
        domain::lock(self)
    }

    fn domain_write(
        &mut self,
        row: &DomainWrite<'_>,
        audit: &AuditEntry<'_>,
    ) -> QueryResult<DomainRow> {
        domain::write(self, row, audit)
    }

    fn keyword_pause(&mut self, keyword: &str, audit: &AuditEntry<'_>) -> QueryResult<usize> {
        domain::pause(self, keyword, audit)
    }

    fn keyword_resume(&mut self, keyword: &str, audit: &AuditEntry<'_>) -> QueryResult<usize> {
        domain::resume(self, keyword, audit)
    }
}

fn lock_claims_unsupported() -> diesel::result::Error {
    diesel::result::Error::QueryBuilderError(
        "lock claims need PostgreSQL (an unlogged lease table and advisory locks)".into(),
    )
}
