# Sourced by scripts/bench.sh --peers (it sets repo_root, outbox, pg_url, rounds, out and
# step): outbox head to head with graphile-worker, interleaved on one PostgreSQL cluster.

peer_version=0.17.3
peer_jobs=20000

# graphile-worker and its runner in target/peers/, from the npm registry (once per version).
install_peer() {
    local dir=$repo_root/target/peers
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        step "installing Node.js (Debian's nodejs and npm; a benchmark dependency only)"
        apt-get update -qq >&2 && apt-get install -y -qq nodejs npm >&2
    fi
    if [[ $(node -p "require('$dir/node_modules/graphile-worker/package.json').version" 2>/dev/null) != "$peer_version" ]]; then
        step "installing graphile-worker $peer_version into $dir"
        mkdir -p "$dir"
        [[ -f $dir/package.json ]] || echo '{"private": true}' >"$dir/package.json"
        npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "graphile-worker@$peer_version" >&2
    fi
    cp "$repo_root/scripts/peers/graphile-worker.mjs" "$dir/"
    peer_dir=$dir
}

# One graphile-worker drain of $peer_jobs jobs with preset $1 on a scratch database; prints
# its JSON line.
graphile_once() {
    local preset=$1 psql db base
    psql="$("$repo_root/scripts/pg.sh" bindir)/psql"
    db=peer_bench_$$_$RANDOM
    base=${pg_url%/*}
    "$psql" "$pg_url" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $db" >&2
    local line status=0
    line=$(cd "$peer_dir" && node graphile-worker.mjs "$base/$db" "$preset" "$peer_jobs") || status=$?
    "$psql" "$pg_url" -q -c "DROP DATABASE $db" >&2 || true
    ((status == 0)) || { echo "graphile-worker ($preset) failed" >&2; return 1; }
    echo "$line"
}

# One outbox drain of $peer_jobs tasks in mode $1; prints its JSON line.
outbox_once() {
    "$outbox" bench --json --database-url "$pg_url" --runs 1 --mode "$1" --tasks "$peer_jobs"
}

field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

run_peers() {
    install_peer
    echo "# $(date -u +%FT%TZ) peers: graphile-worker $peer_version, $rounds rounds, $(git -C "$repo_root" rev-parse --short HEAD)" >>"$out"
    local round fast batched default strict r_batched r_strict
    local -a batched_ratios=() strict_ratios=()
    for ((round = 1; round <= rounds; round++)); do
        step "round $round of $rounds"
        fast=$(graphile_once fast)
        batched=$(outbox_once batched)
        default=$(graphile_once default)
        strict=$(outbox_once strict)
        local gf ob gd os
        gf=$(field "$fast" jobs_per_s)
        ob=$(field "$batched" tasks_per_s)
        gd=$(field "$default" jobs_per_s)
        os=$(field "$strict" tasks_per_s)
        r_batched=$(python3 -c "print(round($ob / $gf, 3))")
        r_strict=$(python3 -c "print(round($os / $gd, 3))")
        batched_ratios+=("$r_batched")
        strict_ratios+=("$r_strict")
        printf 'round %d: outbox batched %s tasks/s / graphile-worker fast %s jobs/s = %s; outbox strict %s / graphile-worker defaults %s = %s\n' \
            "$round" "$ob" "$gf" "$r_batched" "$os" "$gd" "$r_strict"
        printf '{"peers_round":%d,"peer":"graphile-worker","peer_version":"%s","jobs":%d,"graphile_fast_per_s":%s,"outbox_batched_per_s":%s,"batched_ratio":%s,"graphile_default_per_s":%s,"outbox_strict_per_s":%s,"strict_ratio":%s}\n' \
            "$round" "$peer_version" "$peer_jobs" "$gf" "$ob" "$r_batched" "$gd" "$os" "$r_strict" >>"$out"
    done
    local medians
    medians=$(python3 - "${batched_ratios[*]}" "${strict_ratios[*]}" <<'PY'
import json, statistics, sys
b = [float(x) for x in sys.argv[1].split()]
s = [float(x) for x in sys.argv[2].split()]
print(json.dumps({"peers_medians": True, "rounds": len(b),
                  "batched_ratio_median": statistics.median(b), "batched_ratio_min": min(b), "batched_ratio_max": max(b),
                  "strict_ratio_median": statistics.median(s), "strict_ratio_min": min(s), "strict_ratio_max": max(s)}))
PY
)
    echo "$medians" >>"$out"
    printf 'medians over %d rounds: outbox batched / graphile-worker fast = %s (%s–%s); outbox strict / graphile-worker defaults = %s (%s–%s)\n' \
        "$rounds" "$(field "$medians" batched_ratio_median)" "$(field "$medians" batched_ratio_min)" "$(field "$medians" batched_ratio_max)" \
        "$(field "$medians" strict_ratio_median)" "$(field "$medians" strict_ratio_min)" "$(field "$medians" strict_ratio_max)"
}
