#!/usr/bin/env bash
# Throwaway local PostgreSQL cluster for the test suite and the benchmarks.
#
#   scripts/pg.sh start [--durable]      print the cluster URL (only thing on stdout)
#   scripts/pg.sh stop                   stop the cluster and delete its files
#   scripts/pg.sh url                    print the URL if running, else exit 1
#   scripts/pg.sh restart [fast|immediate]  restart on the same port
#   scripts/pg.sh ensure-libpq           install libpq-dev if its header is missing
#   scripts/pg.sh bindir                 print the server's bin dir (psql, pgbench…)
#   scripts/pg.sh standby PORT           a streaming standby of the cluster on 127.0.0.1:PORT
#                                        (pg_basebackup -R), started; print its URL
#   scripts/pg.sh halt [fast|immediate]  stop the server, keeping its files (failover)
#   scripts/pg.sh promote                promote a standby to primary (pg_ctl promote)
#
# The cluster lives entirely in a state dir (data dir, socket dir, log, port
# file), by default ${TMPDIR:-/tmp}/outbox-pg-<uid>-<hash of repo path>, so two
# clones or two users never share a cluster.  Override with OUTBOX_PG_DIR.
#
# stdout is reserved for the URL so callers can do url=$(scripts/pg.sh start);
# every diagnostic, and the output of every tool we run, goes to stderr.
set -euo pipefail

readonly PG_ROLE=outbox
readonly LIBPQ_HEADER=/usr/include/postgresql/libpq-fe.h

log() { printf 'pg.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

usage() {
    sed -n '4,13s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

# --- locations ---------------------------------------------------------------

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)

# A short, stable hash of the repo path keeps the state dirs of different
# clones apart.  cksum is POSIX and always present; sha256sum is nicer.
if command -v sha256sum >/dev/null 2>&1; then
    repo_hash=$(printf '%s' "$repo_root" | sha256sum | cut -c1-10)
else
    repo_hash=$(printf '%s' "$repo_root" | cksum | cut -d' ' -f1)
fi

state_dir=${OUTBOX_PG_DIR:-${TMPDIR:-/tmp}/outbox-pg-$(id -u)-$repo_hash}
# Everything below is run with cwd=/ (see run_pg), so the path must be absolute.
[[ $state_dir == /* ]] || state_dir=$PWD/$state_dir
state_dir=${state_dir%/}

readonly data_dir=$state_dir/data
readonly sock_dir=$state_dir/sock
readonly log_file=$state_dir/postgres.log
readonly port_file=$state_dir/port
readonly mode_file=$state_dir/mode
# Presence of this marker is what allows `stop` to rm -rf the state dir: a
# mistyped OUTBOX_PG_DIR (say, $HOME) must never be deleted.
readonly marker_file=$state_dir/.outbox-pg

# --- privileges ---------------------------------------------------------------

is_root() { [[ $(id -u) -eq 0 ]]; }

# initdb, pg_ctl and postgres refuse to run as root.  As root we run them as the
# `postgres` system user (created by Debian's package) or, failing that, as a
# dedicated system user we create.  As non-root we run them as ourselves.
pg_user=
pick_pg_user() {
    is_root || return 0
    if id -u postgres >/dev/null 2>&1; then
        pg_user=postgres
    else
        if ! id -u outbox-pg >/dev/null 2>&1; then
            log "creating system user outbox-pg to run PostgreSQL (it refuses to run as root)"
            useradd --system --no-create-home --shell /usr/sbin/nologin outbox-pg >&2 ||
                die "useradd outbox-pg failed"
        fi
        pg_user=outbox-pg
    fi
}

# Run a server-side command as $pg_user.  Details that matter:
#  - cwd=/ : the server user usually cannot enter the caller's cwd (e.g. /root),
#    and initdb/postgres would warn or fail trying to.
#  - 9>&- : fd 9 holds our flock; pg_ctl forks the postmaster, which would
#    otherwise inherit the fd and hold the lock for the cluster's lifetime.
#  - stdout>&2 : keep stdout clean for the URL.
run_pg() {
    (
        cd /
        if [[ -z $pg_user ]]; then
            "$@"
        elif command -v runuser >/dev/null 2>&1; then
            runuser -u "$pg_user" -- "$@"
        else
            # su takes a single command string; %q quoting is POSIX-sh safe for
            # the printable arguments we pass.
            su -s /bin/sh "$pg_user" -c "$(printf '%q ' "$@")"
        fi
    ) 9>&- >&2
}

# --- packages -----------------------------------------------------------------

apt_updated=
apt_install() {
    is_root || die "need to install Debian package(s) '$*' but not running as root; install them (apt-get install $*) and retry"
    command -v apt-get >/dev/null 2>&1 || die "need package(s) '$*' but apt-get is not available; install them manually"
    if [[ -z $apt_updated ]]; then
        log "apt-get update"
        apt-get update -qq >&2 || die "apt-get update failed"
        apt_updated=1
    fi
    log "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" </dev/null >&2 ||
        die "apt-get install $* failed"
}

ensure_libpq() {
    # The Rust build (diesel -> pq-sys) links libpq; libpq-dev ships the header,
    # the libpq.so symlink and pg_config.
    [[ -e $LIBPQ_HEADER ]] || apt_install libpq-dev
}

bindir=
find_bindir() {
    local dir cand
    if command -v pg_config >/dev/null 2>&1; then
        dir=$(pg_config --bindir 2>/dev/null || true)
        if [[ -n $dir && -x $dir/initdb ]]; then
            bindir=$dir
            return 0
        fi
    fi
    # Newest versioned Debian layout (sort -V so 9.6 < 10 < 15 < 16).
    cand=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/initdb' 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -n $cand ]]; then
        bindir=${cand%/initdb}
        return 0
    fi
    if cand=$(command -v initdb 2>/dev/null); then
        # Resolve symlinks (e.g. /usr/local/bin/initdb -> .../15/bin/initdb) so
        # pg_ctl, postgres and pg_isready come from the same installation.
        cand=$(readlink -f "$cand")
        bindir=${cand%/initdb}
        return 0
    fi
    return 1
}

ensure_server() {
    find_bindir && return 0
    log "no PostgreSQL server binaries found; installing Debian's postgresql package"
    is_root || die "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found and not running as root; install PostgreSQL (e.g. apt-get install postgresql) and retry"
    # Debian's postinst would otherwise create and start a 'main' cluster on
    # port 5432 that we neither want nor manage.  Installing postgresql-common
    # first lets us switch that off before the server package is configured.
    apt_install postgresql-common
    local conf=/etc/postgresql-common/createcluster.conf
    if [[ -f $conf ]]; then
        sed -ri 's/^#?[[:space:]]*(create_main_cluster)[[:space:]]*=.*$/\1 = false/' "$conf"
    fi
    apt_install postgresql
    find_bindir || die "installed postgresql but still cannot find initdb"
}

# pg_isready is a client tool: prefer the server's bindir, else PATH.
pg_isready_bin() {
    if [[ -x $bindir/pg_isready ]]; then
        printf '%s\n' "$bindir/pg_isready"
    elif command -v pg_isready >/dev/null 2>&1; then
        command -v pg_isready
    else
        die "pg_isready not found (neither in $bindir nor on PATH)"
    fi
}

# --- cluster helpers ------------------------------------------------------------

url_for() { printf 'postgres://%s@127.0.0.1:%s/postgres\n' "$PG_ROLE" "$1"; }

recorded_port() {
    local port
    [[ -r $port_file ]] || return 1
    port=$(<"$port_file")
    [[ $port =~ ^[0-9]+$ ]] || return 1
    printf '%s\n' "$port"
}

# pg_ctl status: 0 = running, 3 = not running, 4 = no usable data dir.
# pg_ctl only does kill(pid, 0), which succeeds on a zombie: a postmaster that
# was killed (e.g. by a fault test) is reparented to PID 1, which may take a
# moment to reap it.  Treat a zombie postmaster as dead.
server_running() {
    [[ -f $data_dir/PG_VERSION ]] || return 1
    run_pg "$bindir/pg_ctl" status -D "$data_dir" >/dev/null 2>&1 || return 1
    local pid state
    pid=$(head -n 1 "$data_dir/postmaster.pid" 2>/dev/null) || return 0
    if [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/stat ]]; then
        # Field 3 of /proc/PID/stat is the state; the comm before it is in
        # parentheses and cannot contain ") " for postgres.
        state=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 0
        [[ $state != Z ]] || return 1
    fi
    return 0
}

accepting() {
    "$(pg_isready_bin)" -q -h 127.0.0.1 -p "$1" -U "$PG_ROLE" -d postgres -t 5 >/dev/null 2>&1
}

wait_ready() {
    local port=$1 i
    for ((i = 0; i < 120; i++)); do
        accepting "$port" && return 0
        sleep 0.5
    done
    return 1
}

fail_with_log() {
    log "error: $*"
    if [[ -r $log_file ]]; then
        log "last 30 lines of $log_file:"
        tail -n 30 "$log_file" >&2 || true
    fi
    exit 1
}

# A port is free if nothing accepts a TCP connection on it.  There is a window
# between this check and the postmaster's bind(); start_server retries on
# "address in use" to cover it.
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

# postgres -o options.  The non-durable variant (default, tests) trades crash
# safety for speed:
#  - fsync=off / full_page_writes=off only risk data on an OS crash or power
#    loss, not on a postgres crash.
#  - synchronous_commit stays on: off loses acknowledged commits when postgres
#    itself crashes (`restart immediate` discards WAL still in shared memory;
#    measured: 43 of 19,826 lost), which would break the fault suite's "nothing
#    acknowledged is lost" checks, and with fsync=off it gained nothing here.
server_opts() {
    local port=$1 mode=$2
    local opts="-c listen_addresses=127.0.0.1 -p $port -k $sock_dir -c max_connections=300 -c shared_buffers=128MB"
    if [[ $mode != durable ]]; then
        opts+=" -c fsync=off -c full_page_writes=off"
    fi
    # More server settings for a profile, e.g.
    # OUTBOX_PG_EXTRA_OPTS='-c shared_preload_libraries=pg_stat_statements'.
    opts+=" ${OUTBOX_PG_EXTRA_OPTS:-}"
    printf '%s\n' "$opts"
}

# Serialise concurrent invocations on the same state dir (e.g. two test runs).
lock_state() {
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>>"$state_dir/.lock"
    flock -w 120 9 || die "timed out waiting for lock on $state_dir"
}

current_mode() {
    if [[ -r $mode_file ]]; then cat "$mode_file"; else echo nondurable; fi
}

# --- commands ---------------------------------------------------------------------

cmd_start() {
    local mode=nondurable
    while (($#)); do
        case $1 in
        --durable) mode=durable ;;
        *) usage ;;
        esac
        shift
    done

    ensure_server
    ensure_libpq
    pick_pg_user

    # The unix socket path is limited to ~107 bytes; fail clearly rather than
    # with postgres' cryptic message.
    if ((${#sock_dir} + 18 > 107)); then
        die "socket path under $sock_dir would be too long; set OUTBOX_PG_DIR to a shorter path"
    fi

    if [[ -e $state_dir && ! -f $marker_file && -n $(ls -A "$state_dir" 2>/dev/null) ]]; then
        die "$state_dir exists, is not empty and was not created by pg.sh; refusing to use it"
    fi
    mkdir -p "$state_dir"
    touch "$marker_file"
    lock_state

    local port i
    if server_running; then
        port=$(recorded_port) || die "a cluster is running in $data_dir but $port_file is missing; run '$0 stop' first"
        # It may still be starting up (e.g. crash recovery after `restart
        # immediate`), or be dying: wait for one or the other.
        for ((i = 0; i < 120; i++)); do
            accepting "$port" && break
            server_running || break
            sleep 0.5
        done
    fi
    if server_running; then
        accepting "$port" || fail_with_log "cluster in $data_dir is running but not accepting connections on port $port"
        local running_mode
        running_mode=$(current_mode)
        if [[ $mode == durable && $running_mode != durable ]]; then
            die "the running cluster is not durable (fsync=off); run '$0 stop' first to start it with --durable"
        elif [[ $mode != "$running_mode" ]]; then
            log "note: reusing the already running $running_mode cluster"
        fi
        log "reusing running cluster on port $port"
        url_for "$port"
        return 0
    fi

    # Anything left here is a dead cluster (killed, reboot, failed start): it is
    # throwaway by definition, so start from scratch rather than trying to
    # recover it.
    rm -rf "$data_dir" "$sock_dir" "$port_file" "$mode_file" "$log_file"
    mkdir -p "$sock_dir"
    : >"$log_file"
    if [[ -n $pg_user ]]; then
        chown -R "$pg_user" "$state_dir"
        # The server user must be able to reach the state dir (e.g. not the case
        # for a state dir under /root).
        run_pg test -w "$state_dir" -a -x "$state_dir" 2>/dev/null ||
            die "user $pg_user cannot access $state_dir (a parent directory is not traversable?); set OUTBOX_PG_DIR or TMPDIR elsewhere, e.g. /tmp"
    fi
    chmod 0700 "$sock_dir"

    log "initdb in $data_dir (as ${pg_user:-$(id -un)}, binaries from $bindir)"
    run_pg "$bindir/initdb" -D "$data_dir" -U "$PG_ROLE" --auth=trust -E UTF8 \
        --locale=C --no-sync >>"$log_file" 2>&1 ||
        fail_with_log "initdb failed"
    printf '%s\n' "$mode" >"$mode_file"
    start_on_free_port "$mode"
}

# Starts the cluster in $data_dir on a free port and prints its URL; retries on another port
# when one is taken between the pick and the bind.
start_on_free_port() {
    local mode=$1 port attempt opts
    for ((attempt = 1; attempt <= 5; attempt++)); do
        port=$(pick_port) || die "could not find a free port in 20000-40000 after 50 tries"
        printf '%s\n' "$port" >"$port_file"
        opts=$(server_opts "$port" "$mode")
        log "starting postgres on 127.0.0.1:$port ($mode)"
        if run_pg "$bindir/pg_ctl" start -w -t 60 -D "$data_dir" -l "$log_file" -o "$opts"; then
            wait_ready "$port" || fail_with_log "postgres started but pg_isready fails on port $port"
            url_for "$port"
            return 0
        fi
        # Someone grabbed the port between pick_port and bind(): try another.
        if tail -n 20 "$log_file" | grep -qi 'could not bind\|address already in use'; then
            log "port $port taken meanwhile, retrying"
            continue
        fi
        break
    done
    fail_with_log "pg_ctl start failed"
}

# Prepares an empty state dir for a new cluster (as cmd_start does) and locks it.
fresh_state_dir() {
    if ((${#sock_dir} + 18 > 107)); then
        die "socket path under $sock_dir would be too long; set OUTBOX_PG_DIR to a shorter path"
    fi
    if [[ -e $state_dir && ! -f $marker_file && -n $(ls -A "$state_dir" 2>/dev/null) ]]; then
        die "$state_dir exists, is not empty and was not created by pg.sh; refusing to use it"
    fi
    mkdir -p "$state_dir"
    touch "$marker_file"
    lock_state
    if server_running; then
        die "a cluster already runs in $data_dir; run '$0 stop' first"
    fi
    rm -rf "$data_dir" "$sock_dir" "$port_file" "$mode_file" "$log_file"
    mkdir -p "$sock_dir"
    : >"$log_file"
    if [[ -n $pg_user ]]; then
        chown -R "$pg_user" "$state_dir"
        run_pg test -w "$state_dir" -a -x "$state_dir" 2>/dev/null ||
            die "user $pg_user cannot access $state_dir (a parent directory is not traversable?); set OUTBOX_PG_DIR or TMPDIR elsewhere, e.g. /tmp"
    fi
    chmod 0700 "$sock_dir"
}

# A hot standby of the (non-durable) cluster on 127.0.0.1:$1, in this state dir: a base
# backup with -R (standby.signal and primary_conninfo, streaming as $PG_ROLE, which initdb
# made a superuser; initdb's pg_hba.conf lets 127.0.0.1 replicate), started on a port of
# its own. It is not a synchronous standby until the primary names it in
# synchronous_standby_names (ALTER SYSTEM there: a setting in the copy would make the
# promoted standby wait for a standby it does not have).
cmd_standby() {
    (($# == 1)) && [[ $1 =~ ^[0-9]+$ ]] || usage
    local primary_port=$1
    ensure_server
    pick_pg_user
    fresh_state_dir
    log "pg_basebackup -R from 127.0.0.1:$primary_port into $data_dir"
    run_pg "$bindir/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U "$PG_ROLE" \
        -D "$data_dir" -R -X stream -c fast --no-sync >>"$log_file" 2>&1 ||
        fail_with_log "pg_basebackup failed"
    # The copy has the primary's postmaster.opts and pid file of no use here.
    rm -f "$data_dir/postmaster.opts" "$data_dir/postmaster.pid"
    printf '%s\n' nondurable >"$mode_file"
    start_on_free_port nondurable
}

# Stops the server, keeping its files (`stop` deletes them): an `immediate` halt is a crash
# of the primary, for a failover.
cmd_halt() {
    local how=${1:-fast}
    (($# <= 1)) || usage
    case $how in
    fast | immediate) ;;
    *) usage ;;
    esac
    [[ -f $marker_file ]] || die "no cluster in $state_dir"
    find_bindir || die "PostgreSQL binaries not found"
    pick_pg_user
    lock_state
    server_running || die "the cluster in $data_dir is not running"
    log "stopping postgres ($how) in $data_dir, keeping its files"
    run_pg "$bindir/pg_ctl" stop -w -t 60 -m "$how" -D "$data_dir" ||
        fail_with_log "pg_ctl stop -m $how failed"
}

# Promotes a standby (`standby`) to a primary, waiting until it accepts writes.
cmd_promote() {
    (($# == 0)) || usage
    [[ -f $marker_file ]] || die "no cluster in $state_dir"
    find_bindir || die "PostgreSQL binaries not found"
    pick_pg_user
    lock_state
    server_running || die "the cluster in $data_dir is not running"
    log "promoting the standby in $data_dir"
    run_pg "$bindir/pg_ctl" promote -w -t 60 -D "$data_dir" ||
        fail_with_log "pg_ctl promote failed"
}

cmd_stop() {
    (($# == 0)) || usage
    if [[ ! -d $state_dir ]]; then
        log "nothing to stop ($state_dir does not exist)"
        return 0
    fi
    [[ -f $marker_file ]] || die "$state_dir was not created by pg.sh; refusing to delete it"
    lock_state
    if [[ -f $data_dir/PG_VERSION ]]; then
        find_bindir || die "PostgreSQL binaries not found; cannot stop the cluster in $data_dir"
        pick_pg_user
        if server_running; then
            log "stopping postgres in $data_dir"
            if ! run_pg "$bindir/pg_ctl" stop -w -t 60 -m fast -D "$data_dir"; then
                log "fast shutdown failed, trying immediate"
                run_pg "$bindir/pg_ctl" stop -w -t 30 -m immediate -D "$data_dir" ||
                    fail_with_log "could not stop postgres in $data_dir"
            fi
        fi
    fi
    rm -rf "$state_dir"
    log "removed $state_dir"
}

cmd_url() {
    (($# == 0)) || usage
    local port
    [[ -f $marker_file ]] || exit 1
    find_bindir || exit 1
    pick_pg_user
    port=$(recorded_port) || exit 1
    server_running || exit 1
    accepting "$port" || exit 1
    url_for "$port"
}

cmd_restart() {
    local how=${1:-fast}
    (($# <= 1)) || usage
    case $how in
    fast | immediate) ;;
    *) usage ;;
    esac
    [[ -f $marker_file ]] || die "no cluster in $state_dir; run '$0 start' first"
    find_bindir || die "PostgreSQL binaries not found"
    pick_pg_user
    lock_state
    local port
    port=$(recorded_port) || die "no port recorded in $port_file"
    server_running || die "the cluster in $data_dir is not running; run '$0 start'"
    log "restarting postgres ($how) on port $port"
    # Pass -o explicitly (instead of relying on postmaster.opts) so the port and
    # durability mode are exactly those recorded at start.
    run_pg "$bindir/pg_ctl" restart -w -t 60 -m "$how" -D "$data_dir" -l "$log_file" \
        -o "$(server_opts "$port" "$(current_mode)")" ||
        fail_with_log "pg_ctl restart failed"
    wait_ready "$port" || fail_with_log "postgres restarted but is not accepting connections on port $port"
    log "restarted; accepting connections on port $port"
}

main() {
    (($# >= 1)) || usage
    local cmd=$1
    shift
    case $cmd in
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    url) cmd_url "$@" ;;
    restart) cmd_restart "$@" ;;
    standby) cmd_standby "$@" ;;
    halt) cmd_halt "$@" ;;
    promote) cmd_promote "$@" ;;
    ensure-libpq) ensure_libpq ;;
    bindir) ensure_server && find_bindir && echo "$bindir" ;;
    -h | --help | help) usage ;;
    *) usage ;;
    esac
}

main "$@"
