#!/usr/bin/env bash
# The one test command of the project (README and CI both call it):
#
#   scripts/test.sh [--long] [ARGS...]
#
#   --long   run the fault suite (handlers/tests/fault/) in its long profile
#            (≥ 50 kills, more restarts; tens of minutes) instead of the short one
#   ARGS     passed to the main `cargo test`, e.g. scripts/test.sh -- --nocapture
#
# Runs the documentation's link check (scripts/doc-links.py), rustdoc with -D warnings, `cargo
# package -p outbox` (the published crate builds), rustfmt, clippy (the workspace, and
# the library with each backend feature alone) and the whole test suite (unit tests, doctests, the
# integration suite, the CLI tests with the dashboard's headless-browser test, and the fault suite
# with the seeded fault harness's fixed seeds, chaos::seed_*: docs/guide/src/fault-harness.md; the
# CLI tests through a real PgBouncer, scripts/pgbouncer.sh, and under a role without DDL rights;
# chromium and chromium-driver are installed if missing), with the `mysql` feature, against a
# PostgreSQL given by OUTBOX_TEST_PG_URL, or a throwaway local cluster started by scripts/pg.sh and
# stopped on exit, and a MySQL/MariaDB given by OUTBOX_TEST_MYSQL_URL, or a throwaway MariaDB
# started by scripts/mysql.sh and stopped on exit (the SQL producer tests' Python venv is built by
# scripts/producers.sh); then, if that passed, the fault suite's PostgreSQL scenarios and the MySQL ones
# where a lease outlives its chunk once more with lock claims (OUTBOX_FAULT_CLAIM=lock: --claim
# lock --commit-batch 20; about two minutes in the short profile).
set -euo pipefail

# Work from the repo root whatever the caller's cwd, so cargo finds the
# workspace and scripts/pg.sh hashes the same repo path as a manual run.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo_root=$PWD

step() { printf '\n==> %s\n' "$*" >&2; }

export OUTBOX_FAULT_PROFILE=short
if [[ ${1:-} == --long ]]; then
    OUTBOX_FAULT_PROFILE=long
    shift
fi

# Full backtraces from panicking tests make CI failures diagnosable.
export RUST_BACKTRACE=1

# The dashboard's end-to-end test drives a real headless Chromium through chromedriver
# (handlers/tests/cli/web.rs); install Debian's packages first if they are missing, as
# scripts/pg.sh does PostgreSQL. The test is never skipped: without them it fails.
step "headless browser for the dashboard test (scripts/browser.sh ensure)"
"$repo_root/scripts/browser.sh" ensure

pg_started=
if [[ -n ${OUTBOX_TEST_PG_URL:-} ]]; then
    step "using PostgreSQL at OUTBOX_TEST_PG_URL"
    # pg.sh start would have made sure libpq-dev is there; with an external
    # server nobody did, and the build (diesel -> pq-sys) links libpq.
    "$repo_root/scripts/pg.sh" ensure-libpq
elif url=$("$repo_root/scripts/pg.sh" url 2>/dev/null); then
    # Someone (a developer, a benchmark) already runs this clone's cluster:
    # reuse it and leave it running, it is not ours to stop.
    step "reusing running local PostgreSQL $url"
    export OUTBOX_TEST_PG_URL=$url
else
    step "starting throwaway PostgreSQL (scripts/pg.sh start)"
    # Install the trap before starting so a half-started cluster is cleaned up
    # too.  `|| true`: a failing cleanup must not mask the test result.
    pg_started=1
    trap '"$repo_root/scripts/pg.sh" stop || true' EXIT
    url=$("$repo_root/scripts/pg.sh" start)
    export OUTBOX_TEST_PG_URL=$url
    printf '    %s\n' "$url" >&2
fi

# The MySQL backend's tests (every suite test has a `mysql` variant; the fault suite's
# kill/restart scenarios too) run on MariaDB from Debian's packages, installed and started by
# scripts/mysql.sh as pg.sh does PostgreSQL. They are never skipped: the build below enables
# the `mysql` feature, which links the MySQL client library (libmariadb-dev-compat).
mysql_started=
unpacked=
# One trap for both servers from here on (installed before the start, so that a half-started
# server is cleaned up too), and the packaged crate's unpacked copy (below).
stop_servers() {
    [[ -z $unpacked ]] || rm -rf "$unpacked"
    # The PgBouncers the CLI tests start (handlers/tests/cli/pgbouncer.rs, by
    # scripts/pgbouncer.sh, which installs Debian's package if missing) are this run's.
    "$repo_root/scripts/pgbouncer.sh" stop || true
    [[ -z $mysql_started ]] || "$repo_root/scripts/mysql.sh" stop || true
    [[ -z $pg_started ]] || "$repo_root/scripts/pg.sh" stop || true
}
trap stop_servers EXIT

if [[ -n ${OUTBOX_TEST_MYSQL_URL:-} ]]; then
    step "using MySQL at OUTBOX_TEST_MYSQL_URL"
    "$repo_root/scripts/mysql.sh" ensure-client
elif url=$("$repo_root/scripts/mysql.sh" url 2>/dev/null); then
    step "reusing running local MariaDB $url"
    export OUTBOX_TEST_MYSQL_URL=$url
else
    step "starting throwaway MariaDB (scripts/mysql.sh start)"
    mysql_started=1
    url=$("$repo_root/scripts/mysql.sh" start)
    export OUTBOX_TEST_MYSQL_URL=$url
    printf '    %s\n' "$url" >&2
fi
# The SQL producer tests (handlers/tests/cli/producers.rs) run a Python producer from a
# virtual environment; build it here (python3 -m venv, pip install psycopg[binary]) so that
# pip's output and any failure come before cargo's. The test would build it too: never skipped.
step "Python venv for the SQL producer tests (scripts/producers.sh ensure)"
"$repo_root/scripts/producers.sh" ensure >/dev/null

# PgBouncer (transaction and session mode) in front of the test cluster, for the CLI tests
# that run every command through it; started here so that an install's output comes first.
step "PgBouncer in front of the test cluster (scripts/pgbouncer.sh start transaction|session)"
"$repo_root/scripts/pgbouncer.sh" start transaction >/dev/null
"$repo_root/scripts/pgbouncer.sh" start session >/dev/null

# Every relative link and #anchor of README.md and the guide resolves, every guide chapter is
# a doctest, and every docs/….md path the code and scripts name exists (seconds, no build).
step "documentation links (scripts/doc-links.py)"
python3 "$repo_root/scripts/doc-links.py"

# Every public item documented, no broken or private intra-doc link (the library with all its
# features, as docs.rs shows it; the handlers crate's library, whose `outbox` binary would
# collide with the library's page).
step "cargo doc (RUSTDOCFLAGS=-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked --lib -p outbox -p outbox-handlers --all-features

# The crate as crates.io would receive it (Cargo.toml's `include`) builds on its own: its
# migrations, build script and licences are in it. `--allow-dirty`: a developer's run checks
# the working tree as it is. The packaged crate is unpacked outside the workspace and its
# library's tests built there with the default features, once for two checks: that it
# builds, and that a build without the `mysql` feature refuses a mysql:// URL naming the
# feature (`db::url`). (`cargo package`'s own verification would build it a second time.)
step "cargo package -p outbox, its library tested unpacked (default features)"
target_dir=${CARGO_TARGET_DIR:-$repo_root/target}
rm -f "$target_dir"/package/outbox-*.crate
cargo package -p outbox --locked --allow-dirty --no-verify
unpacked=$(mktemp -d)
tar xzf "$target_dir"/package/outbox-*.crate -C "$unpacked"
CARGO_TARGET_DIR=$target_dir cargo test --locked --lib --manifest-path "$unpacked"/outbox-*/Cargo.toml -- db::url
rm -rf "$unpacked"
unpacked=

step "cargo fmt"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked --features outbox-handlers/mysql -- -D warnings

# A user without the MySQL client library builds the default features (the packaged crate
# above); an SQLite-only user builds without libpq, and so on: each backend feature alone
# must build (and lint) cleanly.
for backend in sqlite postgres mysql; do
    step "cargo clippy -p outbox --no-default-features --features $backend"
    cargo clippy -p outbox --lib --locked --no-default-features --features "$backend" -- -D warnings
done

step "cargo test"
# A stale fault report from an earlier run must not be shown as this run's.
rm -f target/tmp/fault-report.txt target/tmp/fault-report-lock.txt
# The output is kept to add up every test binary's "test result" line: cargo's own last line
# is that of the last binary only (a doctest run with nothing in it, say), so the run ends
# with one plain total.
test_log=$(mktemp)
# Four test threads on two cores: most of the integration suite's tests wait on a server, a
# timeout or a worker's thread rather than compute (its wall time fell from 168 s to 107 s;
# six threads gained nothing more). The fault scenarios run one at a time whatever this says.
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-4}
set +e
cargo test --workspace --locked --features outbox-handlers/mysql "$@" 2>&1 | tee "$test_log"
status=${PIPESTATUS[0]}
set -e
if [[ $status -eq 0 ]]; then
    # The run above covers the workers' default claims (stamping: strict mode). Lock claims
    # fail differently (a killed chunk rolls back instead of being rescued), and the
    # scenarios assert that when OUTBOX_FAULT_CLAIM=lock; SQLite has no lock claims, so its
    # scenarios and the migration races (no worker) are not run again. On MySQL only the
    # scenarios where a lease outlives its chunk run again (kills, a freeze, poison tasks and
    # hangs, SIGTERM mid-batch): the others' batched workers took lock claims by default above.
    # A fleet's restarts run once: its loops are the single database's, whose restarts run here.
    # `--workspace` as above, so that the features resolve alike and the test binary built
    # there is reused (`-p outbox-handlers` would build another).
    step "fault suite with lock claims (OUTBOX_FAULT_CLAIM=lock, PostgreSQL and MySQL scenarios)"
    set +e
    OUTBOX_FAULT_CLAIM=lock cargo test --workspace --locked --features outbox-handlers/mysql --test fault -- \
        --skip migrations:: --skip chains_of_three_with_kills_mysql --skip cron_fleet_runs_every_tick_exactly_once_mysql \
        --skip in_a_loop_mysql --skip overlapping_drains_mysql --skip restarted_mid_run_fast_mysql \
        --skip restarted_mid_run_immediate_mysql --skip shutdown_timeout_mysql --skip fleet_restarted \
        _postgres _mysql kill:: connections:: restart:: drains:: sigterm_past \
        2>&1 | tee -a "$test_log"
    status=${PIPESTATUS[0]}
    set -e
fi
read -r passed failed < <(awk '/^test result:/ { p += $4; f += $6 } END { print p + 0, f + 0 }' "$test_log")
rm -f "$test_log"
if [[ $status -ne 0 ]]; then
    echo "tests: $passed passed, $failed failed"
    exit "$status"
fi
fault_report=target/tmp/fault-report.txt
if [[ -f $fault_report ]]; then
    step "fault suite figures ($OUTBOX_FAULT_PROFILE profile)"
    cat "$fault_report"
fi
fault_report=target/tmp/fault-report-lock.txt
if [[ -f $fault_report ]]; then
    step "fault suite figures with lock claims ($OUTBOX_FAULT_PROFILE profile)"
    cat "$fault_report"
fi
step "all checks passed"
echo "tests: $passed passed, $failed failed"
