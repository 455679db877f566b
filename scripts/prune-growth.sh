#!/usr/bin/env bash
# Shows that async_task stops growing once finished tasks are pruned (PostgreSQL):
#
#   scripts/prune-growth.sh [--cycles N] [--tasks N] [--reset-autovacuum] [--vacuum] [--keep]
#
#   --cycles N           cycles to run (default 5)
#   --tasks N            demo orders per cycle (default 10000: 20,000 tasks)
#   --reset-autovacuum   drop the table's autovacuum settings from the migration first, to
#                        compare with PostgreSQL's defaults
#   --vacuum             run VACUUM async_task after each prune (the floor autovacuum tends to)
#   --keep               keep the database at the end (its URL is printed)
#
# Each cycle runs `outbox demo --tasks N` (enqueues 2N tasks, drains them) and then
# `outbox prune --older-than 0s`, and prints the size of async_task with its indexes
# (pg_total_relation_size), its heap alone, its live rows, and its dead row versions
# (n_dead_tup) with the number of autovacuum runs so far. The figures are about size, not
# speed. Autovacuum looks at a database once per autovacuum_naptime (1 min by default), so
# the size settles only after a few minutes' worth of cycles. Uses the PostgreSQL named by OUTBOX_TEST_PG_URL, else the cluster of
# scripts/pg.sh (reused if running, else started and stopped at the end), and a fresh
# database on it, dropped at the end.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo_root=$PWD

cycles=5
tasks=10000
reset_autovacuum=
vacuum=
keep=
while (($#)); do
    case $1 in
    --cycles) cycles=${2:?--cycles needs a number}; shift ;;
    --tasks) tasks=${2:?--tasks needs a number}; shift ;;
    --reset-autovacuum) reset_autovacuum=1 ;;
    --vacuum) vacuum=1 ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '4,11s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) sed -n '4,11s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
    esac
    shift
done
[[ $cycles =~ ^[1-9][0-9]*$ && $tasks =~ ^[1-9][0-9]*$ ]] || {
    echo "prune-growth.sh: --cycles and --tasks take positive numbers" >&2
    exit 2
}

log() { printf '==> %s\n' "$*" >&2; }

# psql: from the same installation as the server binaries scripts/pg.sh uses.
find_psql() {
    local dir cand
    if command -v pg_config >/dev/null 2>&1; then
        dir=$(pg_config --bindir 2>/dev/null || true)
        [[ -n $dir && -x $dir/psql ]] && { printf '%s\n' "$dir/psql"; return 0; }
    fi
    cand=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/psql' 2>/dev/null | sort -V | tail -n 1 || true)
    [[ -n $cand ]] && { printf '%s\n' "$cand"; return 0; }
    command -v psql
}

cleanup=()
on_exit() {
    local i
    for ((i = ${#cleanup[@]} - 1; i >= 0; i--)); do
        eval "${cleanup[i]}" || true
    done
}
trap on_exit EXIT

if [[ -n ${OUTBOX_TEST_PG_URL:-} ]]; then
    server=$OUTBOX_TEST_PG_URL
elif server=$(scripts/pg.sh url 2>/dev/null); then
    log "reusing the running cluster of scripts/pg.sh"
else
    log "starting a throwaway cluster (scripts/pg.sh start)"
    cleanup+=('scripts/pg.sh stop')
    server=$(scripts/pg.sh start)
fi
psql=$(find_psql) || { echo "prune-growth.sh: psql not found" >&2; exit 1; }

log "cargo build --release"
cargo build --release --quiet -p outbox-handlers --bin outbox
outbox=$repo_root/target/release/outbox

db=outbox_prune_growth_$$
url=${server%/*}/$db
"$psql" -X -q -v ON_ERROR_STOP=1 "$server" -c "CREATE DATABASE $db"
if [[ -z $keep ]]; then
    cleanup+=("\"$psql\" -X -q \"$server\" -c 'DROP DATABASE IF EXISTS $db WITH (FORCE)'")
fi
export DATABASE_URL=$url
"$outbox" migrate >/dev/null

sql() { "$psql" -X -q -t -A -F ' ' -v ON_ERROR_STOP=1 "$url" -c "$1"; }

if [[ -n $reset_autovacuum ]]; then
    sql "ALTER TABLE async_task RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
                                       autovacuum_analyze_scale_factor, autovacuum_analyze_threshold)"
fi
options=$(sql "SELECT coalesce(array_to_string(reloptions, ', '), 'PostgreSQL defaults')
               FROM pg_class WHERE relname = 'async_task'")
log "async_task autovacuum settings: $options"
log "server: $(sql "SELECT current_setting('server_version') || ', autovacuum_naptime ' ||
                           current_setting('autovacuum_naptime')")"

printf '%-6s %12s %12s %10s %10s %12s %10s\n' \
    cycle total_kib heap_kib rows n_dead_tup autovacuums seconds
for ((cycle = 1; cycle <= cycles; cycle++)); do
    started=$SECONDS
    "$outbox" demo --tasks "$tasks" >/dev/null
    "$outbox" prune --older-than 0s >/dev/null
    [[ -z $vacuum ]] || sql "VACUUM async_task"
    # The outbox processes have exited, so their statistics have reached the server.
    read -r total heap rows dead vacuums < <(sql "
        SELECT pg_total_relation_size('async_task') / 1024,
               pg_relation_size('async_task') / 1024,
               (SELECT count(*) FROM async_task),
               n_dead_tup,
               autovacuum_count
        FROM pg_stat_user_tables WHERE relname = 'async_task'")
    printf '%-6s %12s %12s %10s %10s %12s %10s\n' \
        "$cycle" "$total" "$heap" "$rows" "$dead" "$vacuums" "$((SECONDS - started))"
done
if [[ -n $keep ]]; then
    log "kept the database: $url"
fi
