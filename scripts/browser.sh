#!/usr/bin/env bash
# The headless browser of the dashboard's end-to-end test (handlers/tests/cli/web_browser.rs).
#
#   scripts/browser.sh ensure     install Debian's chromium and chromium-driver if missing
#   scripts/browser.sh driver     print the path of chromedriver (exit 1 if missing)
#
# The test drives Chromium through chromedriver (the W3C WebDriver protocol: JSON over
# HTTP on a loopback port), so it needs both packages.  Installing needs root and apt-get,
# as scripts/pg.sh does for PostgreSQL; every diagnostic goes to stderr and stdout carries
# only what `driver` prints.
set -euo pipefail

log() { printf 'browser.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

usage() {
    sed -n '4,5s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

find_driver() {
    local cand
    for cand in "${OUTBOX_CHROMEDRIVER:-}" "$(command -v chromedriver 2>/dev/null || true)" \
        /usr/bin/chromedriver /usr/lib/chromium/chromedriver; do
        if [[ -n $cand && -x $cand ]]; then
            printf '%s\n' "$cand"
            return 0
        fi
    done
    return 1
}

find_browser() {
    command -v chromium >/dev/null 2>&1 || [[ -x /usr/bin/chromium ]]
}

ensure() {
    if find_driver >/dev/null && find_browser; then
        return 0
    fi
    [[ $(id -u) -eq 0 ]] ||
        die "chromium and chromium-driver are missing and not running as root; install them (apt-get install chromium chromium-driver) and retry"
    command -v apt-get >/dev/null 2>&1 ||
        die "chromium and chromium-driver are missing and apt-get is not available; install them manually"
    log "apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed"
    log "apt-get install chromium chromium-driver"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver fonts-dejavu-core </dev/null >&2 ||
        die "apt-get install chromium chromium-driver failed"
    find_driver >/dev/null || die "installed chromium-driver but cannot find chromedriver"
    find_browser || die "installed chromium but cannot find it"
}

main() {
    (($# == 1)) || usage
    case $1 in
    ensure) ensure ;;
    driver) find_driver ;;
    *) usage ;;
    esac
}

main "$@"
