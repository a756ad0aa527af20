#!/usr/bin/env bash
# Runs every benchmark once, in order, from a build directory that holds the bench binaries, and
# collects what they print. `make bench` calls it; by hand:
#   bench/run_all.sh build-bench
# Writes into BUILD_DIR/bench-results/: results.jsonl (every JSON line, the summaries included),
# one .log per bench (its full output), and the amplification plots (PNG, gnuplot). Exits
# non-zero if a bench fails to run; a missed target is reported, not a failure (nothing here is a
# timed test).
set -euo pipefail

build_dir=${1:?usage: run_all.sh BUILD_DIR}
bin=$build_dir/bench
out=$build_dir/bench-results
src=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
: > "$out/results.jsonl"

machine() {
  echo "{\"bench\":\"machine\",\"nproc\":$(nproc),\"cpu\":\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')\",\"mem_total_kb\":$(awk '/MemTotal/ {print $2}' /proc/meminfo),\"kernel\":\"$(uname -r)\",\"date\":\"$(date -u +%FT%TZ)\"}"
}
machine | tee -a "$out/results.jsonl"

# run NAME COMMAND...: NAME names the logs and is the "bench" field of the summary line shown.
# run_as LOG NAME COMMAND...: the same with logs named LOG (a bench run more than once).
run_as() {
  local log=$1 name=$2
  shift 2
  echo "== $log: $*" >&2
  local start=$SECONDS
  # Server logs go to stderr; JSON lines to stdout.
  "$@" > "$out/$log.log" 2> "$out/$log.stderr"
  grep '^{' "$out/$log.log" | tee -a "$out/results.jsonl" | grep "\"bench\":\"$name\"" || true
  echo "   ($log took $((SECONDS - start)) s)" >&2
}
run() { run_as "$1" "$@"; }

run client_fast_path "$bin/bench_client_fast_path" --benchmark_min_time=0.3 --benchmark_color=false
run server_load "$bin/bench_server_load"
# Issue 20's cells: the budget server against the echo server at 1 call in flight and at 32
# (2 channels x 16), 1 and 8 tenants per request, metrics off and on; the summary lines' "targets".
# Five shorter rounds rather than three: a ratio is taken within a round, and on this shared VM
# one round in three can be 15% off, which the median of three does not always outvote.
issue20=(--servers=echo_callback,retry-budget-server,retry-budget-server-metrics
  --rounds=5 --warmup=0.5s --duration=2s)
run_as server_load_1_in_flight server_load "$bin/bench_server_load" "${issue20[@]}" \
  --channels=1 --in_flight=1
run_as server_load_32_in_flight server_load "$bin/bench_server_load" "${issue20[@]}" \
  --channels=2 --in_flight=16
run redis_peer "$bin/bench_redis_peer"
# Issue 34: a new client's first lease and first retry, over 200 fresh clients.
run first_lease "$bin/bench_first_lease" --clients=200
run scaling "$bin/bench_scaling"
run amplification "$bin/bench_amplification" --out_dir="$out" --fleet_sizes=2,8,32 --sweep_regimes=outage,degraded
# 3 etcd members + 3 servers and a single server on the same box; about 1.5 minutes.
run cluster "$bin/bench_cluster"

if command -v gnuplot > /dev/null; then
  (cd "$out" && gnuplot "$src/plots.gp")
  echo "plots: $out/amplification_outage.png $out/amplification_by_regime.png $out/amplification_fleet_size.png" >&2
else
  echo "gnuplot not installed: no plots (apt-get install gnuplot-nox)" >&2
fi
echo "all results: $out/results.jsonl" >&2
