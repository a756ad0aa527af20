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

run() {
  local name=$1
  shift
  echo "== $name: $*" >&2
  local start=$SECONDS
  # Server logs go to stderr; JSON lines to stdout.
  "$@" > "$out/$name.log" 2> "$out/$name.stderr"
  grep '^{' "$out/$name.log" | tee -a "$out/results.jsonl" | grep "\"bench\":\"$name\"" || true
  echo "   ($name took $((SECONDS - start)) s)" >&2
}

run client_fast_path "$bin/bench_client_fast_path" --benchmark_min_time=0.3 --benchmark_color=false
run server_load "$bin/bench_server_load"
run redis_peer "$bin/bench_redis_peer"
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
