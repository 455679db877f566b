//! The driver on MySQL 8 and MariaDB 10.6+: seed 003's claim, one `UPDATE … ORDER BY …
//! LIMIT` over rows picked with `SKIP LOCKED`, the page read back by owner and claim token
//! (MySQL has no `UPDATE … RETURNING`); times are UTC `DATETIME(3)` written by the server's
//! clock (every session's time zone is UTC); migrations under a named lock.

// Every time column is written with this expression (millisecond precision, UTC: the
// session's time zone is set to UTC when the connection is configured).
macro_rules! now {
    () => {
        "UTC_TIMESTAMP(3)"
    };
}

mod chain;
mod claim;
mod domain;
mod enqueue;
mod fair;
mod list;
mod maintenance;
mod operate;
mod ops;
mod schedule;
mod task;
mod tenant;

use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::mysql::MysqlConnection;
use diesel::{QueryResult, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use super::{
    AuditEntry, ChunkRuns, Claim, ClaimRow, ClaimState, DomainRow, DomainWrite, Driver, Due,
    InsertRow, KeywordStateCount, LeaseCharge, MigrationError, Pick, Picked, PruneBatch,
    PrunedBatch, RescueParams, RescuedRow, TaskFilter, TaskKey, TaskRecord, TenantRow, TenantSet,
    TxMark,
};

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/mysql");

/// The named lock that serialises concurrent migration runs (`GET_LOCK`).
const MIGRATION_LOCK: &str = "outbox.migrations";

/// How long a migration run waits for another one's lock, in seconds.
const MIGRATION_LOCK_WAIT_S: u32 = 300;

impl Driver for MysqlConnection {
    /// UTC as the session's time zone (every time is the server's UTC clock), `utf8mb4`,
    /// strict SQL mode (a value out of range is an error, never truncated), standard SQL
    /// strings (`||` concatenates, `"` quotes names, a backslash is an ordinary character),
    /// and READ
    /// COMMITTED: a claim's or rescue's re-check reads the latest committed rows, as on
    /// PostgreSQL, and InnoDB takes no gap locks on the claim index.
    fn connection_configure(&mut self) -> QueryResult<()> {
        self.batch_execute(
            "SET time_zone = '+00:00', NAMES utf8mb4 COLLATE utf8mb4_bin, \
             sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION,PIPES_AS_CONCAT,ANSI_QUOTES,NO_BACKSLASH_ESCAPES'; \
             SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        )
    }

    fn transaction_begin(&mut self, _mark: Option<TxMark>) -> QueryResult<()> {
        AnsiTransactionManager::begin_transaction(self)
    }

    /// Under a named lock (`GET_LOCK`): a second process waits instead of racing. MySQL's
    /// DDL is not transactional, so a migration that fails half-way leaves its first
    /// statements applied; each migration of this tree is written to be re-run after a
    /// failure (`IF NOT EXISTS`).
    fn migrations_run(&mut self) -> Result<Vec<String>, MigrationError> {
        #[derive(diesel::QueryableByName)]
        struct Locked {
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
            locked: Option<i32>,
        }
        let locked: Locked = diesel::sql_query(format!(
            "SELECT GET_LOCK('{MIGRATION_LOCK}', {MIGRATION_LOCK_WAIT_S}) AS locked"
        ))
        .get_result(self)?;
        if locked.locked != Some(1) {
            return Err(format!(
                "timed out after {MIGRATION_LOCK_WAIT_S} s waiting for another process's migrations (lock {MIGRATION_LOCK})"
            )
            .into());
        }
        let applied = self
            .run_pending_migrations(MIGRATIONS)
            .map(|v| v.iter().map(ToString::to_string).collect::<Vec<_>>());
        let unlocked = self.batch_execute(&format!("DO RELEASE_LOCK('{MIGRATION_LOCK}')"));
        let applied = applied?;
        unlocked?;
        Ok(applied)
    }

    fn migrations_known(&self) -> Result<Vec<String>, MigrationError> {
        super::migration_versions::<diesel::mysql::Mysql>(&MIGRATIONS)
    }

    /// The JSON text as given: the column is `JSON` (MariaDB: `LONGTEXT` checked by
    /// `JSON_VALID`), its size bounded on the text.
    fn task_payload_len(&self, json: &str, _value: &serde_json::Value) -> usize {
        json.len()
    }

    fn atomically(
        &mut self,
        f: &mut dyn FnMut(&mut dyn Driver) -> QueryResult<()>,
    ) -> QueryResult<()> {
        diesel::Connection::transaction(self, |conn| f(conn))
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
        claim::claim_page(self, owner, due, except, pick, limit, timeout_ms)
    }

    fn task_claim_limited(
        &mut self,
        owner: i64,
        due: &Due<'_>,
        tenants: &[String],
        limit: i64,
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>> {
        claim::claim_limited(self, owner, due, tenants, limit, timeout_ms)
    }

    fn task_claim_plan(&mut self, due: &Due<'_>, limit: i64) -> QueryResult<Vec<String>> {
        claim::claim_plan(self, due, limit)
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
        claim::claim_suspect(self, owner, due, except, timeout_ms)
    }

    fn task_suspects_exist(&mut self) -> QueryResult<bool> {
        claim::suspects_exist(self)
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
        maintenance::connection_id(self).map(Some)
    }

    fn backend_cancel(&mut self, pid: i32) -> QueryResult<bool> {
        maintenance::kill_query(self, pid)
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
