//! The driver on PostgreSQL: `SKIP LOCKED` claims, `jsonb` payloads, `NOTIFY` on enqueue, an
//! advisory lock around migrations.

mod domain;
mod fair;
mod lease;
mod maintenance;
mod operate;
mod ops;
mod payload;
mod schedule;
mod task;
mod tenant;

use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::pg::PgConnection;
use diesel::QueryResult;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use super::{
    AuditEntry, ChunkRuns, Claim, ClaimRow, ClaimState, DomainRow, DomainWrite, Driver, Due,
    InsertRow, KeywordStateCount, LeaseCharge, MigrationError, Pick, Picked, PruneBatch,
    PrunedBatch, RescueParams, RescuedRow, TaskFilter, TaskKey, TaskRecord, TenantRow, TenantSet,
    TxMark,
};

/// The channel on which enqueues of due tasks notify idle workers (the enqueue statement
/// names it too).
const NOTIFY_CHANNEL: &str = "outbox_task";

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// The advisory lock key that serialises concurrent migration runs ("outbox" in ASCII).
const MIGRATION_LOCK_KEY: i64 = 0x6f7574626f78;

impl Driver for PgConnection {
    fn connection_configure(&mut self) -> QueryResult<()> {
        Ok(())
    }

    fn transaction_begin(&mut self, mark: Option<TxMark>) -> QueryResult<()> {
        match mark {
            // One round trip for both: the locks are numbers, not text from elsewhere.
            Some(mark) => AnsiTransactionManager::begin_transaction_sql(
                self,
                &format!(
                    "BEGIN; SELECT pg_advisory_xact_lock_shared({}, {}), \
                     pg_advisory_xact_lock_shared({}, {})",
                    lease::NODE_CLASS,
                    lease::key(mark.node),
                    lease::RUN_CLASS,
                    lease::key(mark.run)
                ),
            ),
            None => AnsiTransactionManager::begin_transaction(self),
        }
    }

    /// In one transaction holding a transaction-scoped advisory lock: a second process waits
    /// instead of racing, and behind PgBouncer in transaction mode the lock is held by the
    /// server connection that runs the migrations (a session lock would be taken on one server
    /// connection and released on another, or never). diesel's harness runs each migration in
    /// a savepoint inside it; PostgreSQL's DDL is transactional, so a failure applies nothing.
    fn migrations_run(&mut self) -> Result<Vec<String>, MigrationError> {
        let mut applied = Err(MigrationError::from("not run"));
        diesel::Connection::transaction(self, |conn| -> QueryResult<()> {
            conn.batch_execute(&format!(
                "SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})"
            ))?;
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
        super::migration_versions::<diesel::pg::Pg>(&MIGRATIONS)
    }

    fn task_payload_len(&self, _json: &str, value: &serde_json::Value) -> usize {
        payload::jsonb_text_len(value)
    }

    fn task_insert_many(&mut self, rows: &[InsertRow<'_>]) -> QueryResult<Vec<TaskKey>> {
        task::insert_many(self, rows)
    }

    fn atomically(
        &mut self,
        f: &mut dyn FnMut(&mut dyn Driver) -> QueryResult<()>,
    ) -> QueryResult<()> {
        diesel::Connection::transaction(self, |conn| f(conn))
    }

    fn task_link_parents(&mut self, links: &[(i64, i64)]) -> QueryResult<usize> {
        task::link_parents(self, links)
    }

    fn task_find_many(&mut self, keys_json: &str) -> QueryResult<Vec<TaskKey>> {
        task::find_many(self, keys_json)
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
        tenant::claim_limited(self, owner, due, tenants, limit, timeout_ms)
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

    fn task_lease_page(
        &mut self,
        owner: i64,
        chunk: ChunkRuns,
        due: &Due<'_>,
        except: &[String],
        pick: &Pick<'_>,
        limit: i64,
        timeout_ms: i64,
    ) -> QueryResult<(Picked, Vec<i64>)> {
        lease::lease_page(self, owner, chunk, due, except, pick, limit, timeout_ms)
    }

    fn task_lease_plan(&mut self, due: &Due<'_>, limit: i64) -> QueryResult<Vec<String>> {
        lease::lease_plan(self, due, limit)
    }

    fn task_complete_leased(&mut self, owner: i64, ids: &[i64]) -> QueryResult<usize> {
        lease::complete_leased(self, owner, ids)
    }

    fn task_claim_leased(
        &mut self,
        owner: i64,
        ids: &[i64],
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>> {
        lease::claim_leased(self, owner, ids, timeout_ms)
    }

    fn task_release_leased(&mut self, owner: i64, ids: &[i64]) -> QueryResult<usize> {
        lease::release_leased(self, owner, ids)
    }

    fn task_charge_leased(
        &mut self,
        owner: i64,
        charge: &LeaseCharge<'_>,
    ) -> QueryResult<Option<String>> {
        lease::charge_leased(self, owner, charge)
    }

    fn task_rescue_leases(&mut self, rescue: &RescueParams) -> QueryResult<Vec<RescuedRow>> {
        lease::rescue_leases(self, rescue)
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

    fn session_end_stale(&mut self, dead_after_ms: i64) -> QueryResult<i64> {
        lease::end_stale_sessions(self, dead_after_ms)
    }

    fn session_end(&mut self, mark: TxMark) -> QueryResult<bool> {
        lease::end_session(self, mark)
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
        self.batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}"))?;
        Ok(true)
    }

    fn listen_poll(&mut self) -> QueryResult<bool> {
        let mut woke = false;
        for notification in self.notifications_iter() {
            notification?;
            woke = true;
        }
        Ok(woke)
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
