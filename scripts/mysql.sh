#!/usr/bin/env bash
# Throwaway local MariaDB server for the test suite and the benchmarks (the MySQL backend).
#
#   scripts/mysql.sh start [--durable]   print the server's URL (only thing on stdout)
#   scripts/mysql.sh stop                stop the server and delete its files
#   scripts/mysql.sh restart [fast|immediate]  restart on the same port and data dir
#   scripts/mysql.sh url                 print the URL if running, else exit 1
#   scripts/mysql.sh ensure-client       install the MySQL client library headers if missing
#
# As scripts/pg.sh does for PostgreSQL: the server lives entirely in a state dir (data dir,
# socket, log, port file), by default ${TMPDIR:-/tmp}/outbox-my-<uid>-<hash of repo path>
# (override with OUTBOX_MYSQL_DIR), runs as a non-root user, listens on a free loopback port,
# and is installed from Debian's packages (mariadb-server) when missing. The URL names the
# database `outbox`, owned by the password-less user `outbox`, who may create databases.
#
# Without --durable the server trades crash safety for speed as the PostgreSQL test cluster
# does: InnoDB writes its log at each commit but does not flush it (a killed server keeps
# every commit; an OS crash may lose the last second), and the binary log is off.
#
# `restart fast` shuts the server down cleanly (SIGTERM: it finishes and flushes, clients are
# disconnected); `restart immediate` kills it (SIGKILL: a crash, InnoDB recovers from its log
# at the next start). Either way it starts again on the same port, data dir and settings, and
# the command returns once it accepts connections (after crash recovery).
set -euo pipefail

readonly MY_USER=outbox
readonly CLIENT_HEADER=/usr/include/mariadb/mysql.h

log() { printf 'mysql.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
usage() {
    sed -n '4,9s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
repo_hash=$(printf '%s' "$repo_root" | sha256sum | cut -c1-10)
state_dir=${OUTBOX_MYSQL_DIR:-${TMPDIR:-/tmp}/outbox-my-$(id -u)-$repo_hash}
[[ $state_dir == /* ]] || state_dir=$PWD/$state_dir
state_dir=${state_dir%/}
readonly data_dir=$state_dir/data
readonly sock=$state_dir/mysqld.sock
readonly log_file=$state_dir/mysqld.log
readonly pid_file=$state_dir/mysqld.pid
readonly port_file=$state_dir/port
readonly marker_file=$state_dir/.outbox-mysql
readonly flush_file=$state_dir/flush

is_root() { [[ $(id -u) -eq 0 ]]; }

# mariadbd refuses to run as root without --user; as root we run it as the `mysql` system user
# (created by Debian's package), otherwise as ourselves.
my_user=
pick_user() {
    is_root || return 0
    id -u mysql >/dev/null 2>&1 || die "no system user 'mysql' (Debian's mariadb-server creates it)"
    my_user=mysql
}

run_as() {
    (
        cd /
        if [[ -z $my_user ]]; then "$@"; else runuser -u "$my_user" -- "$@"; fi
    ) 9>&- >&2
}

apt_updated=
apt_install() {
    is_root || die "need Debian package(s) '$*' but not running as root; install them (apt-get install $*) and retry"
    if [[ -z $apt_updated ]]; then
        log "apt-get update"
        apt-get update -qq >&2 || die "apt-get update failed"
        apt_updated=1
    fi
    log "apt-get install $*"
    # Debian's postinst tries to start a system-wide server; without an init system (or with
    # policy-rc.d denying it) it does not, and we never use that one.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" </dev/null >&2 ||
        die "apt-get install $* failed"
}

# The Rust build with the `mysql` feature (diesel -> mysqlclient-sys) links libmariadb;
# libmariadb-dev-compat adds the libmysqlclient names and mysqlclient.pc it looks for.
ensure_client() {
    if [[ -e $CLIENT_HEADER ]] && command -v pkg-config >/dev/null 2>&1 &&
        pkg-config --exists mysqlclient 2>/dev/null; then
        return 0
    fi
    apt_install libmariadb-dev libmariadb-dev-compat pkg-config
}

ensure_server() {
    command -v mariadbd >/dev/null 2>&1 && command -v mariadb-install-db >/dev/null 2>&1 &&
        return 0
    log "no MariaDB server found; installing Debian's mariadb-server package"
    apt_install mariadb-server
}

recorded_port() {
    local port
    [[ -r $port_file ]] || return 1
    port=$(<"$port_file")
    [[ $port =~ ^[0-9]+$ ]] || return 1
    printf '%s\n' "$port"
}

url_for() { printf 'mysql://%s@127.0.0.1:%s/outbox\n' "$MY_USER" "$1"; }

server_pid() {
    local pid
    [[ -r $pid_file ]] || return 1
    pid=$(<"$pid_file")
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    printf '%s\n' "$pid"
}

client() { mariadb --no-defaults -uroot --socket="$sock" "$@"; }

accepting() { mariadb-admin --no-defaults -uroot --socket="$sock" ping >/dev/null 2>&1; }

fail_with_log() {
    log "error: $*"
    [[ -r $log_file ]] && tail -n 30 "$log_file" >&2
    exit 1
}

pick_port() {
    local i port
    for ((i = 0; i < 50; i++)); do
        port=$((40001 + RANDOM % 20000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            printf '%s\n' "$port"
            return 0
        fi
    done
    return 1
}

lock_state() {
    exec 9>>"$state_dir/.lock"
    flock -w 120 9 || die "timed out waiting for the lock on $state_dir"
}

# Starts mariadbd on port $1 (innodb_flush_log_at_trx_commit $2) on the data dir as it is,
# and waits until it accepts connections (crash recovery included) or gives up.
launch() {
    local port=$1 flush=$2 i since
    # Only this start's lines of the log count (a restart appends to it).
    since=$(($(stat -c %s "$log_file" 2>/dev/null || echo 0) + 1))
    # setsid: the server outlives this script (and a test run's process group).
    run_as setsid mariadbd --no-defaults --datadir="$data_dir" --socket="$sock" \
        --port="$port" --bind-address=127.0.0.1 --pid-file="$pid_file" \
        --log-error="$log_file" --skip-name-resolve --max-connections=400 \
        --innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=$flush \
        --character-set-server=utf8mb4 --collation-server=utf8mb4_bin \
        --default-time-zone=+00:00 --skip-log-bin </dev/null >/dev/null 2>&1 9>&- &
    for ((i = 0; i < 120; i++)); do
        accepting && break
        if tail -c +"$since" "$log_file" | grep -qi 'address already in use\|do you already have another'; then
            break
        fi
        sleep 0.5
    done
}

cmd_start() {
    local durable=
    while (($#)); do
        case $1 in
        --durable) durable=1 ;;
        *) usage ;;
        esac
        shift
    done
    ensure_server
    ensure_client
    pick_user
    if [[ -e $state_dir && ! -f $marker_file && -n $(ls -A "$state_dir" 2>/dev/null) ]]; then
        die "$state_dir exists, is not empty and was not created by mysql.sh; refusing to use it"
    fi
    mkdir -p "$state_dir"
    touch "$marker_file"
    lock_state
    local port
    if server_pid >/dev/null && port=$(recorded_port) && accepting; then
        log "reusing running server on port $port"
        url_for "$port"
        return 0
    fi
    if pid=$(server_pid); then kill -9 "$pid" 2>/dev/null || true; fi
    rm -rf "$data_dir" "$port_file" "$log_file" "$sock" "$pid_file"
    mkdir -p "$data_dir"
    : >"$log_file"
    [[ -z $my_user ]] || chown -R "$my_user" "$state_dir"
    log "mariadb-install-db in $data_dir (as ${my_user:-$(id -un)})"
    run_as mariadb-install-db --no-defaults --datadir="$data_dir" --auth-root-authentication-method=socket \
        --skip-test-db ${my_user:+--user=$my_user} >>"$log_file" 2>&1 ||
        fail_with_log "mariadb-install-db failed"
    local flush=2
    [[ -z $durable ]] || flush=1
    printf '%s\n' "$flush" >"$flush_file"
    local attempt
    for ((attempt = 1; attempt <= 5; attempt++)); do
        port=$(pick_port) || die "no free port in 40001-60000 after 50 tries"
        printf '%s\n' "$port" >"$port_file"
        log "starting mariadbd on 127.0.0.1:$port"
        launch "$port" "$flush"
        if accepting; then
            client -e "CREATE USER IF NOT EXISTS '$MY_USER'@'127.0.0.1';
                       CREATE USER IF NOT EXISTS '$MY_USER'@'localhost';
                       GRANT ALL ON *.* TO '$MY_USER'@'127.0.0.1' WITH GRANT OPTION;
                       GRANT ALL ON *.* TO '$MY_USER'@'localhost' WITH GRANT OPTION;
                       CREATE DATABASE IF NOT EXISTS outbox;" >&2 ||
                fail_with_log "could not create the user $MY_USER"
            url_for "$port"
            return 0
        fi
        if grep -qi 'address already in use' "$log_file"; then
            log "port $port taken meanwhile, retrying"
            : >"$log_file"
            continue
        fi
        break
    done
    fail_with_log "mariadbd did not start"
}

cmd_stop() {
    if [[ ! -d $state_dir ]]; then
        log "nothing to stop ($state_dir does not exist)"
        return 0
    fi
    [[ -f $marker_file ]] || die "$state_dir was not created by mysql.sh; refusing to delete it"
    lock_state
    local pid i
    if pid=$(server_pid); then
        log "stopping mariadbd ($pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 120; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$state_dir"
    log "removed $state_dir"
}

cmd_restart() {
    local how=${1:-fast} signal
    case $how in
    fast) signal=TERM ;;
    immediate) signal=KILL ;;
    *) usage ;;
    esac
    [[ -f $marker_file ]] || die "no server to restart ($state_dir was not created by mysql.sh start)"
    pick_user
    lock_state
    local port pid flush=2 i
    port=$(recorded_port) || die "no port recorded in $state_dir: start the server first"
    [[ ! -r $flush_file ]] || flush=$(<"$flush_file")
    pid=$(server_pid) || die "the server in $state_dir is not running: start it first"
    log "restart $how: SIG$signal to mariadbd ($pid)"
    kill -"$signal" "$pid" 2>/dev/null || true
    for ((i = 0; i < 240; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.25
    done
    kill -0 "$pid" 2>/dev/null && die "mariadbd ($pid) did not exit within 60 s of SIG$signal"
    rm -f "$sock" "$pid_file"
    log "starting mariadbd again on 127.0.0.1:$port"
    launch "$port" "$flush"
    accepting || fail_with_log "mariadbd did not start again on port $port"
    url_for "$port"
}

cmd_url() {
    local port
    [[ -f $marker_file ]] || exit 1
    port=$(recorded_port) || exit 1
    server_pid >/dev/null || exit 1
    accepting || exit 1
    url_for "$port"
}

main() {
    (($# >= 1)) || usage
    local cmd=$1
    shift
    case $cmd in
    start) cmd_start "$@" ;;
    stop) cmd_stop ;;
    restart) cmd_restart "$@" ;;
    url) cmd_url ;;
    ensure-client) ensure_client ;;
    *) usage ;;
    esac
}

main "$@"
