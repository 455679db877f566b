#!/usr/bin/env bash
# The Python virtual environment of the SQL producer tests (tests/producers/):
#
#   scripts/producers.sh ensure   create it if missing (python3 -m venv, then
#                                 pip install psycopg[binary] PyMySQL) and print its python
#   scripts/producers.sh python   print its python, exit 1 if it is not built
#
# It lives in target/producers-venv at the repo root (OUTBOX_PRODUCERS_VENV overrides).
# The CLI test binary calls `ensure` itself (handlers/tests/cli/producers.rs), so the tests
# never skip; scripts/test.sh calls it first so that pip's output comes before cargo's.
# Concurrent callers (the tests of each backend run in parallel) are serialised by a lock.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=${OUTBOX_PRODUCERS_VENV:-$PWD/target/producers-venv}
python=$venv/bin/python

ready() { [[ -x $python ]] && "$python" -c 'import psycopg, pymysql, sqlite3' 2>/dev/null; }

case ${1:-} in
ensure)
    mkdir -p "$(dirname "$venv")"
    exec 9>"$venv.lock"
    flock 9
    if ! ready; then
        rm -rf "$venv"
        python3 -m venv "$venv" >&2
        "$python" -m pip install --quiet 'psycopg[binary]>=3.1,<4' 'PyMySQL>=1.1,<2' >&2
        ready || { echo "producers.sh: $venv has no psycopg or PyMySQL after pip install" >&2; exit 1; }
    fi
    echo "$python"
    ;;
python)
    ready || { echo "producers.sh: no producer venv at $venv; run scripts/producers.sh ensure" >&2; exit 1; }
    echo "$python"
    ;;
*)
    echo "usage: scripts/producers.sh ensure|python" >&2
    exit 2
    ;;
esac
