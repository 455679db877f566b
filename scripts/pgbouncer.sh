#!/usr/bin/env bash
# Throwaway local PgBouncer in front of the test PostgreSQL, for the test suite and benchmarks.
#
#   scripts/pgbouncer.sh start [transaction|session]  print its URL (only thing on stdout)
#   scripts/pgbouncer.sh url [transaction|session]    print the URL if running, else exit 1
#   scripts/pgbouncer.sh stop                         stop every mode's PgBouncer, delete files
#
# One PgBouncer per pool mode (transaction by default), each in its own state dir (config,
# auth file, log, pid and port files) under ${TMPDIR:-/tmp}/outbox-pgb-<uid>-<hash of repo
# path>/<mode> (override the parent with OUTBOX_PGBOUNCER_DIR), listening on a free loopback
# port, run as a non-root user, installed from Debian's package (pgbouncer) when missing, as
# scripts/pg.sh does PostgreSQL. It forwards every database name to the same database of the
# server named by OUTBOX_TEST_PG_URL, or of `scripts/pg.sh url`, with that URL's user, who is
# trusted (no password: loopback, tests only). The URL printed names the database `postgres`;
# replace the path to reach another database of the server through it.
#
# The pools are sized for a test run (100 server connections per database and user, 1,000
# clients): in session mode each client holds a server connection while it is connected.
set -euo pipefail

log() { printf 'pgbouncer.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
usage() {
    sed -n '4,6s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
repo_hash=$(printf '%s' "$repo_root" | sha256sum | cut -c1-10)
top_dir=${OUTBOX_PGBOUNCER_DIR:-${TMPDIR:-/tmp}/outbox-pgb-$(id -u)-$repo_hash}
[[ $top_dir == /* ]] || top_dir=$PWD/$top_dir
top_dir=${top_dir%/}
# Presence of this marker is what allows `stop` to rm -rf the directory.
readonly marker_file=$top_dir/.outbox-pgbouncer

is_root() { [[ $(id -u) -eq 0 ]]; }

# PgBouncer refuses to run as root: as root, run it as Debian's `postgres` user (the
# postgresql packages create it) or as the dedicated user pg.sh creates.
run_user=
pick_user() {
    is_root || return 0
    if id -u postgres >/dev/null 2>&1; then
        run_user=postgres
    elif id -u outbox-pg >/dev/null 2>&1; then
        run_user=outbox-pg
    else
        die "no user to run pgbouncer as (postgres or outbox-pg); start scripts/pg.sh first"
    fi
}

run_as() {
    (
        cd /
        if [[ -z $run_user ]]; then "$@"; else runuser -u "$run_user" -- "$@"; fi
    ) 9>&- >&2
}

apt_updated=
apt_install() {
    is_root || die "need Debian package(s) '$*' but not running as root; install them (apt-get install $*) and retry"
    command -v apt-get >/dev/null 2>&1 || die "need package(s) '$*' but apt-get is not available"
    if [[ -z $apt_updated ]]; then
        log "apt-get update"
        apt-get update -qq >&2 || die "apt-get update failed"
        apt_updated=1
    fi
    log "apt-get install $*"
    # Debian's postinst would start a system-wide pgbouncer; without an init system it does
    # not, and we never use that one.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" </dev/null >&2 ||
        die "apt-get install $* failed"
}

bouncer=
ensure_bouncer() {
    bouncer=$(command -v pgbouncer 2>/dev/null || true)
    [[ -n $bouncer ]] && return 0
    [[ -x /usr/sbin/pgbouncer ]] && bouncer=/usr/sbin/pgbouncer && return 0
    log "no pgbouncer found; installing Debian's pgbouncer package"
    apt_install pgbouncer
    bouncer=$(command -v pgbouncer 2>/dev/null || echo /usr/sbin/pgbouncer)
    [[ -x $bouncer ]] || die "installed pgbouncer but cannot find its binary"
}

# The server behind: OUTBOX_TEST_PG_URL, else the running scripts/pg.sh cluster.
server_url() {
    if [[ -n ${OUTBOX_TEST_PG_URL:-} ]]; then
        printf '%s\n' "$OUTBOX_TEST_PG_URL"
    else
        "$repo_root/scripts/pg.sh" url 2>/dev/null ||
            die "no PostgreSQL: set OUTBOX_TEST_PG_URL or run scripts/pg.sh start first"
    fi
}

pick_port() {
    local i port
    for ((i = 0; i < 50; i++)); do
        port=$((20000 + RANDOM % 20001))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            printf '%s\n' "$port"
            return 0
        fi
    done
    return 1
}

mode_arg() {
    case ${1:-transaction} in
    transaction | session) printf '%s\n' "${1:-transaction}" ;;
    *) usage ;;
    esac
}

bouncer_pid() {
    local pid
    [[ -r $1/pgbouncer.pid ]] || return 1
    pid=$(<"$1/pgbouncer.pid")
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    printf '%s\n' "$pid"
}

accepting() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The URL through the PgBouncer of state dir $1: the server URL's user, its port.
url_for() {
    local dir=$1 port user
    port=$(<"$dir/port")
    user=$(<"$dir/user")
    printf 'postgres://%s@127.0.0.1:%s/postgres\n' "$user" "$port"
}

cmd_start() {
    local mode dir url rest user host_port host server_port port i j pid
    mode=$(mode_arg "$@")
    dir=$top_dir/$mode
    ensure_bouncer
    pick_user
    if [[ -e $top_dir && ! -f $marker_file && -n $(ls -A "$top_dir" 2>/dev/null) ]]; then
        die "$top_dir exists, is not empty and was not created by pgbouncer.sh; refusing to use it"
    fi
    mkdir -p "$dir"
    touch "$marker_file"
    exec 9>>"$top_dir/.lock"
    flock -w 120 9 || die "timed out waiting for the lock on $top_dir"
    url=$(server_url)
    if bouncer_pid "$dir" >/dev/null && accepting "$(<"$dir/port")" &&
        [[ $(cat "$dir/server" 2>/dev/null) == "$url" ]]; then
        log "reusing running $mode-mode pgbouncer on port $(<"$dir/port")"
        url_for "$dir"
        return 0
    fi
    # Not running, or in front of another server (the test cluster was restarted elsewhere).
    if pid=$(bouncer_pid "$dir"); then kill "$pid" 2>/dev/null || true; fi
    # postgres://USER[:PASSWORD]@HOST:PORT/DB: the test clusters trust their user.
    rest=${url#*://}
    user=${rest%%@*}
    user=${user%%:*}
    host_port=${rest#*@}
    host_port=${host_port%%/*}
    host=${host_port%%:*}
    server_port=${host_port##*:}
    [[ $server_port =~ ^[0-9]+$ ]] || die "cannot read the server's port from $url"

    rm -f "$dir"/*.ini "$dir"/*.log "$dir"/*.txt "$dir/port" "$dir/user"
    printf '"%s" ""\n' "$user" >"$dir/users.txt"
    printf '%s\n' "$user" >"$dir/user"
    printf '%s\n' "$url" >"$dir/server"
    [[ -z $run_user ]] || chown -R "$run_user" "$dir"
    for ((i = 0; i < 5; i++)); do
        port=$(pick_port) || die "no free port in 20000-40000 after 50 tries"
        cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=$host port=$server_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = $mode
default_pool_size = 100
max_client_conn = 1000
max_db_connections = 0
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
admin_users = $user
ignore_startup_parameters = extra_float_digits
server_check_delay = 0
EOF
        printf '%s\n' "$port" >"$dir/port"
        [[ -z $run_user ]] || chown -R "$run_user" "$dir"
        log "starting pgbouncer ($mode mode) on 127.0.0.1:$port in front of $host:$server_port"
        run_as "$bouncer" -d -q "$dir/pgbouncer.ini" || true
        for ((j = 0; j < 40; j++)); do
            accepting "$port" && bouncer_pid "$dir" >/dev/null && {
                url_for "$dir"
                return 0
            }
            sleep 0.25
        done
        if grep -qi 'address already in use' "$dir/pgbouncer.log" 2>/dev/null; then
            log "port $port taken meanwhile, retrying"
            continue
        fi
        break
    done
    [[ -r $dir/pgbouncer.log ]] && tail -n 20 "$dir/pgbouncer.log" >&2
    die "pgbouncer did not start"
}

cmd_url() {
    local mode dir
    mode=$(mode_arg "$@")
    dir=$top_dir/$mode
    bouncer_pid "$dir" >/dev/null || exit 1
    accepting "$(<"$dir/port")" || exit 1
    url_for "$dir"
}

cmd_stop() {
    (($# == 0)) || usage
    [[ -d $top_dir ]] || return 0
    [[ -f $marker_file ]] || die "$top_dir was not created by pgbouncer.sh; refusing to delete it"
    local dir pid i
    for dir in "$top_dir"/transaction "$top_dir"/session; do
        pid=$(bouncer_pid "$dir") || continue
        log "stopping pgbouncer in $dir (pid $pid)"
        kill -INT "$pid" 2>/dev/null || true
        for ((i = 0; i < 40; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -9 "$pid" 2>/dev/null || true
    done
    rm -rf "$top_dir"
    log "removed $top_dir"
}

main() {
    (($# >= 1)) || usage
    local cmd=$1
    shift
    case $cmd in
    start) cmd_start "$@" ;;
    url) cmd_url "$@" ;;
    stop) cmd_stop "$@" ;;
    *) usage ;;
    esac
}

main "$@"
