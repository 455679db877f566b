#!/usr/bin/env bash
# The PostgreSQL cost of a task, without the worker (docs/guide/src/performance.md, "Performance"):
#
#   scripts/pg-cycle.sh [--tasks N] [--clients C]
#
# Runs the worker's own SQL in pgbench on a throwaway durable cluster (or on
# OUTBOX_BENCH_PG_URL): each cycle claims 50 pending tasks in one statement (as
# the worker's claim does, `synchronous_commit` off) and marks them done with the
# fenced 50-task completion in a transaction of its own (as batched mode does).
# Three measurements, each on a fresh database of N no-op tasks:
#   claim+complete   the cycle on the schema the migrations create;
#   claim only       the claim alone: the cost of one write per task;
#   HOT-friendly     the cycle on a variant schema whose completions can be HOT
#                    (the claim index on `owner IS NULL`, no index naming `state`
#                    or `finished_at`, fillfactor 75) — what a redesign would buy;
#   one write        one transaction that locks 50 pending tasks (`FOR UPDATE SKIP
#                    LOCKED`, no claim written) and marks them done: one row version
#                    per task, the cost of a claim that is the row lock of the task's
#                    own transaction.
# Prints cycles/s (pgbench's tps) and tasks/s for each.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo_root=$PWD

tasks=200000 clients=4
while (($#)); do
    case $1 in
    --tasks) tasks=$2; shift ;;
    --clients) clients=$2; shift ;;
    *) echo "usage: $0 [--tasks N] [--clients C]" >&2; exit 2 ;;
    esac
    shift
done
((tasks >= 50 * clients)) || { echo "--tasks must be at least 50 × --clients" >&2; exit 2; }
cycles=$((tasks / 50 / clients))

step() { printf '\n==> %s\n' "$*" >&2; }

step "cargo build --release"
cargo build --release --locked -p outbox-handlers >&2
outbox=$repo_root/target/release/outbox
bindir=$("$repo_root/scripts/pg.sh" bindir)

work=$(mktemp -d)
own_cluster=
cleanup() {
    rm -rf "$work"
    if [[ -n $own_cluster ]]; then "$repo_root/scripts/pg.sh" stop || true; fi
}
trap cleanup EXIT
if [[ -n ${OUTBOX_BENCH_PG_URL:-} ]]; then
    pg_url=$OUTBOX_BENCH_PG_URL
else
    export OUTBOX_PG_DIR=${TMPDIR:-/tmp}/outbox-bench-pg-$(id -u)
    own_cluster=1
    step "starting a durable PostgreSQL cluster (fsync on)"
    pg_url=$("$repo_root/scripts/pg.sh" start --durable)
fi
base=${pg_url%/*}

claim_sql() { # $1: the pending-task predicate
    cat <<SQL
\set owner :client_id + 1
WITH picked AS (SELECT id FROM async_task WHERE $1 AND run_at <= now() AND keyword = ANY('{noop}')
                ORDER BY priority, run_at, id LIMIT 50 FOR UPDATE SKIP LOCKED),
     upd AS (UPDATE async_task t SET state = 'running', owner = :owner, claim_token = t.claim_token + 1,
                    claimed_at = now(), updated_at = now(), deadline_at = now() + interval '5 minutes'
             FROM picked, (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush_wait
             WHERE t.id = picked.id RETURNING t.id, t.claim_token)
SELECT string_agg(id::text, ',') AS ids, string_agg(claim_token::text, ',') AS toks FROM upd \gset
SQL
}
complete_sql() {
    cat <<'SQL'
BEGIN;
UPDATE async_task t SET state = 'done', finished_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE t.owner = :owner AND t.id = ANY(ARRAY[:ids]::bigint[]) AND t.state = 'running'
  AND t.claim_token = (ARRAY[:toks]::bigint[])[array_position(ARRAY[:ids]::bigint[], t.id)];
COMMIT;
SQL
}
# pgbench needs each statement on one line.
oneline() { awk '/^\\/ { if (s != "") print s; s = ""; print; next } { s = s " " $0 } /;$/ || /\\gset$/ { print s; s = "" } END { if (s != "") print s }'; }
{ claim_sql "state = 'pending'"; complete_sql; } | oneline >"$work/cycle.sql"
claim_sql "state = 'pending'" | oneline >"$work/claim.sql"
oneline >"$work/one_write.sql" <<'SQL'
BEGIN;
SELECT string_agg(id::text, ',') AS ids FROM (SELECT id FROM async_task WHERE state = 'pending' AND run_at <= now() AND keyword = ANY('{noop}')
    ORDER BY priority, run_at, id LIMIT 50 FOR UPDATE SKIP LOCKED) picked \gset
UPDATE async_task SET state = 'done', finished_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = ANY(ARRAY[:ids]::bigint[]) AND state = 'pending';
COMMIT;
SQL
{ claim_sql "owner IS NULL AND state = 'pending'"; complete_sql; } | oneline >"$work/hot.sql"

fresh_db() { # $1: name, $2: extra SQL after the migrations
    "$bindir/psql" -qX "$base/postgres" -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" >&2
    "$outbox" migrate --database-url "$base/$1" >&2
    if [[ -n $2 ]]; then "$bindir/psql" -qX -v ON_ERROR_STOP=1 "$base/$1" -c "$2" >&2; fi
    "$bindir/psql" -qX -v ON_ERROR_STOP=1 "$base/$1" \
        -c "INSERT INTO async_task (keyword, biz_id) SELECT 'noop', g::text FROM generate_series(1, $tasks) g" \
        -c "VACUUM ANALYZE async_task" >&2
}
measure() { # $1: label, $2: database, $3: script
    local tps
    tps=$("$bindir/pgbench" -n -c "$clients" -j 2 -t "$cycles" -f "$3" "$base/$2" 2>/dev/null |
        sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    [[ -n $tps ]] || { echo "pgbench failed on $2" >&2; exit 1; }
    awk -v label="$1" -v tps="$tps" 'BEGIN { printf "%-16s %8.0f cycles/s  %8.0f tasks/s\n", label, tps, tps * 50 }'
}
hot_schema="ALTER TABLE async_task SET (fillfactor = 75);
DROP INDEX async_task_claim_idx;
CREATE INDEX async_task_claim_idx ON async_task (priority, run_at, id) WHERE owner IS NULL;
DROP INDEX async_task_owner_idx;
DROP INDEX async_task_finished_idx;"

step "claim+complete"; fresh_db outbox_cycle ""; measure "claim+complete" outbox_cycle "$work/cycle.sql"
step "claim only"; fresh_db outbox_cycle ""; measure "claim only" outbox_cycle "$work/claim.sql"
step "HOT-friendly"; fresh_db outbox_cycle "$hot_schema"; measure "HOT-friendly" outbox_cycle "$work/hot.sql"
step "one write"; fresh_db outbox_cycle ""; measure "one write" outbox_cycle "$work/one_write.sql"
"$bindir/psql" -qX "$base/postgres" -c "DROP DATABASE outbox_cycle" >&2
