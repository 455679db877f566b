# Sourced by scripts/bench.sh --peers (it sets repo_root, outbox, pg_url, rounds, out and
# step): outbox head to head with graphile-worker, interleaved on one PostgreSQL cluster.

# graphile-worker's newest release, and the one before it kept for continuity (each round runs
# both: a figure from another day is context, never a ratio).
peer_version=0.18.0
peer_versions=(0.18.0 0.17.3)
peer_jobs=50000

# graphile-worker $1 and its runner in target/peers/$1/, from the npm registry (once per
# version); sets peer_dir.
install_peer() {
    local version=$1 dir=$repo_root/target/peers/$1
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        step "installing Node.js (Debian's nodejs and npm; a benchmark dependency only)"
        apt-get update -qq >&2 && apt-get install -y -qq nodejs npm >&2
    fi
    if [[ $(node -p "require('$dir/node_modules/graphile-worker/package.json').version" 2>/dev/null) != "$version" ]]; then
        step "installing graphile-worker $version into $dir"
        mkdir -p "$dir"
        [[ -f $dir/package.json ]] || echo '{"private": true}' >"$dir/package.json"
        npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "graphile-worker@$version" >&2
    fi
    cp "$repo_root/scripts/peers/graphile-worker.mjs" "$dir/"
    peer_dir=$dir
}

# One graphile-worker $1 drain of $peer_jobs jobs with preset $2 on a scratch database;
# prints its JSON line.
graphile_once() {
    local version=$1 preset=$2 psql db base
    psql="$("$repo_root/scripts/pg.sh" bindir)/psql"
    db=peer_bench_$$_$RANDOM
    base=${pg_url%/*}
    "$psql" "$pg_url" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $db" >&2
    local line status=0
    line=$(cd "$repo_root/target/peers/$version" && node graphile-worker.mjs "$base/$db" "$preset" "$peer_jobs") || status=$?
    "$psql" "$pg_url" -q -c "DROP DATABASE $db" >&2 || true
    ((status == 0)) || { echo "graphile-worker $version ($preset) failed" >&2; return 1; }
    echo "$line"
}

# One outbox drain of $peer_jobs tasks in mode $1 (claim style $2, default auto); prints its
# JSON line.
outbox_once() {
    "$outbox" bench --json --database-url "$pg_url" --runs 1 --mode "$1" --claim "${2:-auto}" --tasks "$peer_jobs"
}

field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
ratio() { python3 -c "print(round($1 / $2, 3))"; }

run_peers() {
    local version
    for version in "${peer_versions[@]}"; do
        install_peer "$version"
    done
    echo "# $(date -u +%FT%TZ) peers: graphile-worker ${peer_versions[*]}, $peer_jobs jobs, $rounds rounds, $(git -C "$repo_root" rev-parse --short HEAD)" >>"$out"
    local round fast_new fast_old lease stamp default strict
    local -a lease_new=() lease_old=() stamp_new=() strict_default=()
    for ((round = 1; round <= rounds; round++)); do
        step "round $round of $rounds"
        fast_new=$(field "$(graphile_once 0.18.0 fast)" jobs_per_s)
        fast_old=$(field "$(graphile_once 0.17.3 fast)" jobs_per_s)
        lease=$(field "$(outbox_once batched)" tasks_per_s)
        stamp=$(field "$(outbox_once batched stamp)" tasks_per_s)
        default=$(field "$(graphile_once 0.18.0 default)" jobs_per_s)
        strict=$(field "$(outbox_once strict)" tasks_per_s)
        lease_new+=("$(ratio "$lease" "$fast_new")")
        lease_old+=("$(ratio "$lease" "$fast_old")")
        stamp_new+=("$(ratio "$stamp" "$fast_new")")
        strict_default+=("$(ratio "$strict" "$default")")
        printf 'round %d: graphile-worker 0.18.0 fast %s, 0.17.3 fast %s jobs/s; outbox batched (lock claims) %s = %s / %s x, (stamp claims) %s = %s x; graphile-worker 0.18.0 defaults %s, outbox strict %s = %s x\n' \
            "$round" "$fast_new" "$fast_old" "$lease" "${lease_new[-1]}" "${lease_old[-1]}" "$stamp" "${stamp_new[-1]}" "$default" "$strict" "${strict_default[-1]}"
        printf '{"peers_round":%d,"peer":"graphile-worker","jobs":%d,"graphile_0_18_fast_per_s":%s,"graphile_0_17_fast_per_s":%s,"outbox_batched_lock_per_s":%s,"outbox_batched_stamp_per_s":%s,"graphile_0_18_default_per_s":%s,"outbox_strict_per_s":%s,"lock_vs_0_18":%s,"lock_vs_0_17":%s,"stamp_vs_0_18":%s,"strict_vs_0_18_default":%s}\n' \
            "$round" "$peer_jobs" "$fast_new" "$fast_old" "$lease" "$stamp" "$default" "$strict" \
            "${lease_new[-1]}" "${lease_old[-1]}" "${stamp_new[-1]}" "${strict_default[-1]}" >>"$out"
    done
    local medians
    medians=$(python3 - "${lease_new[*]}" "${lease_old[*]}" "${stamp_new[*]}" "${strict_default[*]}" <<'PY'
import json, statistics, sys
names = ["lock_vs_0_18", "lock_vs_0_17", "stamp_vs_0_18", "strict_vs_0_18_default"]
out = {"peers_medians": True}
for name, arg in zip(names, sys.argv[1:]):
    xs = [float(x) for x in arg.split()]
    out[name] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "rounds": xs}
print(json.dumps(out))
PY
)
    echo "$medians" >>"$out"
    python3 - "$medians" <<'PY'
import json, sys
m = json.loads(sys.argv[1])
labels = {
    "lock_vs_0_18": "outbox batched, lock claims (the default) / graphile-worker 0.18.0 fast",
    "lock_vs_0_17": "outbox batched, lock claims / graphile-worker 0.17.3 fast",
    "stamp_vs_0_18": "outbox batched, stamp claims / graphile-worker 0.18.0 fast",
    "strict_vs_0_18_default": "outbox strict / graphile-worker 0.18.0 defaults",
}
for key, label in labels.items():
    r = m[key]
    print(f"median of {len(r['rounds'])} rounds: {label} = {r['median']} ({r['min']}-{r['max']})")
PY
}
