#!/usr/bin/env bash
# The standard benchmark set (docs/guide/src/performance.md, "Performance"):
#
#   scripts/bench.sh [--quick] [--out FILE]
#   scripts/bench.sh --peers [--rounds N] [--out FILE]
#   scripts/bench.sh --metrics [--rounds N] [--out FILE]
#
# Builds the release binary (with the `mysql` feature), starts a throwaway PostgreSQL
# cluster with default durability (fsync on; its own state dir, apart from the test cluster)
# unless OUTBOX_BENCH_PG_URL is set, and a durable throwaway MariaDB (InnoDB's log flushed at
# each commit, as PostgreSQL's WAL) unless OUTBOX_BENCH_MYSQL_URL is set, and runs on the three
# backends:
#   1. strict and batched drains of 20,000 no-op tasks against their references
#      (5 runs each, medians), and strict once more with a handler that opens its
#      transaction (--open-tx), as one writing to the database does;
#   2. the scale test: the first 10,000 tasks of a 1,000,000-task backlog, against
#      a 10,000-task backlog, with the claim's plan (PostgreSQL; 3 runs; PostgreSQL and
#      SQLite);
#   3. commit-to-start latency with LISTEN/NOTIFY and with polling (PostgreSQL);
#   4. what the metrics cost: N rounds (default 7) of a drain of 20,000 no-op tasks with
#      --metrics-addr (scraped every second) against one without, interleaved (which goes
#      first alternates), strict and batched; the figure is the median of the rounds' ratios.
# Every configuration prints one JSON line (also appended to --out, default
# target/bench/results.jsonl); human-readable progress goes to stderr.
# --quick: 1 run each and a 100,000-task backlog, to check that it all works.
#
# --metrics: only the metrics' cost (4. above), on both backends.
#
# --peers: instead of the set above, outbox head to head with graphile-worker 0.18.0, its newest
# release, and 0.17.3 (installed from the npm registry into target/peers/VERSION/; Node is a
# benchmark dependency only), interleaved on the same cluster, N rounds (default 5) of:
# graphile-worker 0.18.0's fast preset (local queue, batched completion, concurrency 4),
# 0.17.3's fast preset, outbox batched with lock claims (the default), outbox batched with
# stamp claims, graphile-worker 0.18.0's defaults (concurrency 10), outbox strict; 50,000
# no-op jobs each (start-up weighs on neither side), on a scratch database each. Prints each
# round's ratios (outbox batched, each claim style, / graphile fast; outbox strict / graphile
# defaults) and their medians, and appends one JSON line per round and one of the medians to
# --out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo_root=$PWD

runs=5 scale_runs=3 backlog=1000000 out=target/bench/results.jsonl peers=false rounds=5
metrics_only=false metrics_rounds=7
while (($#)); do
    case $1 in
    --quick) runs=1 scale_runs=1 backlog=100000 metrics_rounds=1 ;;
    --out) out=$2; shift ;;
    --peers) peers=true ;;
    --rounds) rounds=$2 metrics_rounds=$2; shift ;;
    --metrics) metrics_only=true ;;
    *) echo "usage: $0 [--quick] [--out FILE] | --peers [--rounds N] [--out FILE] | --metrics [--rounds N] [--out FILE]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$(dirname "$out")"

step() { printf '\n==> %s\n' "$*" >&2; }

step "cargo build --release"
cargo build --release --locked -p outbox-handlers --features mysql >&2
outbox=${CARGO_TARGET_DIR:-$repo_root/target}/release/outbox

if [[ -n ${OUTBOX_BENCH_PG_URL:-} ]]; then
    pg_url=$OUTBOX_BENCH_PG_URL
else
    # A cluster of its own: the test cluster runs with fsync off.
    export OUTBOX_PG_DIR=${TMPDIR:-/tmp}/outbox-bench-pg-$(id -u)
    trap '"$repo_root/scripts/pg.sh" stop || true' EXIT
    step "starting a durable PostgreSQL cluster (fsync on)"
    pg_url=$("$repo_root/scripts/pg.sh" start --durable)
fi
if [[ -n ${OUTBOX_BENCH_MYSQL_URL:-} ]]; then
    mysql_url=$OUTBOX_BENCH_MYSQL_URL
else
    export OUTBOX_MYSQL_DIR=${TMPDIR:-/tmp}/outbox-bench-my-$(id -u)
    trap '"$repo_root/scripts/pg.sh" stop || true; "$repo_root/scripts/mysql.sh" stop || true' EXIT
    step "starting a durable MariaDB server"
    mysql_url=$("$repo_root/scripts/mysql.sh" start --durable)
fi
sqlite_url=${TMPDIR:-/tmp}/outbox-bench-unused.db # bench works on scratch files next to it

{
    echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores, $(git rev-parse --short HEAD)"
} >>"$out"

backend_name() {
    case $1 in
    postgres*) echo postgres ;;
    mysql*) echo mysql ;;
    *) echo sqlite ;;
    esac
}

bench() {
    local label=$1
    shift
    step "$label: outbox bench $*"
    "$outbox" bench --json "$@" | tee -a "$out"
}

metrics_cost() {
    local url name
    for url in "$pg_url" "$mysql_url" "$sqlite_url"; do
        name=$(backend_name "$url")
        bench "$name metrics cost" --database-url "$url" --runs "$metrics_rounds" --mode both --metrics-cost
    done
}

if $metrics_only; then
    metrics_cost
    step "results appended to $out"
    exit 0
fi

if $peers; then
    . "$repo_root/scripts/peers/peers.sh"
    run_peers
    step "results appended to $out"
    exit 0
fi

for url in "$pg_url" "$mysql_url" "$sqlite_url"; do
    name=$(backend_name "$url")
    bench "$name throughput" --database-url "$url" --runs "$runs" --mode both
    bench "$name strict, handler in its transaction" --database-url "$url" --runs "$runs" --mode strict --open-tx
    [[ $name != mysql ]] || continue
    bench "$name scale: backlog 10000" --database-url "$url" --runs "$scale_runs" --mode strict --tasks 10000
    bench "$name scale: backlog $backlog" --database-url "$url" --runs "$scale_runs" --mode strict --tasks 10000 --backlog "$backlog"
done
step "postgres claim plan at a backlog of $backlog"
"$outbox" bench --database-url "$pg_url" --runs 1 --mode strict --tasks 1000 --backlog "$backlog" --explain | grep -A30 '^claim plan' | sed -n '1,/^  strict/p' | sed '$d' >&2
bench "postgres latency" --database-url "$pg_url" --latency
metrics_cost
step "results appended to $out"
