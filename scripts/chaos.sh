#!/usr/bin/env bash
# The seeded fault harness (handlers/tests/fault/chaos/): random configurations, workloads
# and faults on the real binaries and servers, the invariants checked after each run.
#
#   scripts/chaos.sh --seed N                   replay seed N (its plan; it prints `seed N`)
#   scripts/chaos.sh [--seeds N] [--minutes M] [--first S]
#                                               N seeds (default 20) from S (default: from
#                                               the clock), stopping after M minutes (default
#                                               30); prints each seed and its report
#   scripts/chaos.sh --soak [--minutes M]       one long run (default 60 minutes): continuous
#                                               work and faults, RSS, threads and connections
#                                               sampled (they must stay bounded)
#
# Servers as scripts/test.sh: OUTBOX_TEST_PG_URL / OUTBOX_TEST_MYSQL_URL, or throwaway ones
# started here (scripts/pg.sh, scripts/mysql.sh) and stopped at the end. Each run's report is
# appended to target/tmp/fault-report.txt; a failed seed's process logs are kept (the path is
# printed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo_root=$PWD

seed= seeds=20 minutes= first= soak=false
while (($#)); do
    case $1 in
    --seed) seed=$2; shift ;;
    --seeds) seeds=$2; shift ;;
    --minutes) minutes=$2; shift ;;
    --first) first=$2; shift ;;
    --soak) soak=true ;;
    *) echo "usage: $0 --seed N | [--seeds N] [--minutes M] [--first S] | --soak [--minutes M]" >&2; exit 2 ;;
    esac
    shift
done

pg_started= mysql_started=
stop_servers() {
    [[ -z $mysql_started ]] || "$repo_root/scripts/mysql.sh" stop || true
    [[ -z $pg_started ]] || "$repo_root/scripts/pg.sh" stop || true
}
trap stop_servers EXIT
if [[ -z ${OUTBOX_TEST_PG_URL:-} ]]; then
    if url=$("$repo_root/scripts/pg.sh" url 2>/dev/null); then
        export OUTBOX_TEST_PG_URL=$url
    else
        pg_started=1
        OUTBOX_TEST_PG_URL=$("$repo_root/scripts/pg.sh" start)
        export OUTBOX_TEST_PG_URL
    fi
fi
if [[ -z ${OUTBOX_TEST_MYSQL_URL:-} ]]; then
    if url=$("$repo_root/scripts/mysql.sh" url 2>/dev/null); then
        export OUTBOX_TEST_MYSQL_URL=$url
    else
        mysql_started=1
        OUTBOX_TEST_MYSQL_URL=$("$repo_root/scripts/mysql.sh" start)
        export OUTBOX_TEST_MYSQL_URL
    fi
fi

export OUTBOX_CHAOS_SEED=$seed OUTBOX_CHAOS_SEEDS=$seeds OUTBOX_CHAOS_FIRST=$first
if $soak; then
    export OUTBOX_CHAOS_SOAK_MINUTES=${minutes:-60}
    test_name=chaos::soak
else
    export OUTBOX_CHAOS_MINUTES=${minutes:-30}
    test_name=chaos::from_env
fi
# Not exec: the EXIT trap stops the servers this script started.
cargo test --workspace --locked --features outbox-handlers/mysql --test fault -- \
    --ignored --exact "$test_name" --nocapture
