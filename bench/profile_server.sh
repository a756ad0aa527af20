#!/usr/bin/env bash
# Where a Sync's CPU goes: perf profiles of the budget server and of the echo server under the
# same load (bench_server_load), at 1 call in flight and at 32 (2 channels x 16), with 1 and with
# 8 tenants per request. For each of the 8 runs: a flame graph (bench/flamegraph.py, SVG) and the
# folded stacks in OUT_DIR, and one line of where the samples went (this project's code,
# protobuf, gRPC, libc, the kernel). docs/BENCHMARKS.md section 2c reads them.
#   bench/profile_server.sh BUILD_DIR OUT_DIR
# Needs perf (Debian's linux-perf; software clock sampling, so it works in a VM without hardware
# counters) and a BUILD_DIR with debug info (RelWithDebInfo, `make build`).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR OUT_DIR" >&2; exit 2; }
build=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
command -v perf > /dev/null || { echo "$0: perf is missing (apt-get install linux-perf)" >&2; exit 2; }
mkdir -p "$out"
load="$build/bench/bench_server_load"

profile() {  # server channels in_flight tenants
  local server=$1 channels=$2 in_flight=$3 tenants=$4
  local name="${server}_${channels}x${in_flight}_${tenants}t"
  "$load" --servers="$server" --channels="$channels" --in_flight="$in_flight" \
    --tenants_per_request="$tenants" --rounds=1 --warmup=1.5s --duration=4s \
    > "$out/$name.load.jsonl" 2> /dev/null &
  local bench=$!
  local pid=""
  for _ in $(seq 50); do
    sleep 0.1
    if [ "$server" = echo_callback ]; then
      pid=$(pgrep -n -f -- "--serve=echo_callback" || true)
    else
      pid=$(pgrep -n -f "retry-budget-server --listen=127.0.0.1:0" || true)
    fi
    [ -n "$pid" ] && break
  done
  [ -n "$pid" ] || { echo "$0: $server did not start" >&2; wait "$bench" || true; return 1; }
  sleep 1.5  # past the start and into the warm-up
  perf record -q -e cpu-clock -F 997 --call-graph dwarf,16384 -p "$pid" -o "$out/$name.data" \
    -- sleep 3 > /dev/null 2>&1 || true
  wait "$bench" || true
  perf script -i "$out/$name.data" 2> /dev/null > "$out/$name.script"
  perf report -i "$out/$name.data" --no-children --sort dso --stdio -g none 2> /dev/null \
    | grep -E '^ +[0-9.]+%' > "$out/$name.dso" || true
  python3 "$here/flamegraph.py" --folded < "$out/$name.script" > "$out/$name.folded"
  python3 "$here/flamegraph.py" --min-percent=0.5 \
    --title "$server, $((channels * in_flight)) in flight, $tenants tenant(s) per request" \
    < "$out/$name.script" > "$out/$name.svg"
  rm -f "$out/$name.data" "$out/$name.script"
  # One line: the load's figures, the share of samples inside the RPC handler (the budget's
  # Sync or the echo), and the samples by library (the leaf frame's).
  python3 - "$name" "$out/$name.folded" "$out/$name.load.jsonl" "$out/$name.dso" <<'EOF'
import json, sys
name, folded, load, dso = sys.argv[1:5]
total = inside = 0
for line in open(folded):
    stack, n = line.rsplit(" ", 1)
    total += int(n)
    if "RetryBudgetServiceImpl::Sync" in stack or "CallbackEchoService::Echo" in stack:
        inside += int(n)
by_library = {}
for line in open(dso):
    pct, lib = line.split(None, 1)
    lib = lib.strip().rsplit("/", 1)[-1]
    by_library[lib] = float(pct.rstrip("%")) / 100
run = next((json.loads(l) for l in open(load) if '"server_load_run"' in l), {})
print(json.dumps({"profile": name, "samples": total,
                  "calls_per_second": run.get("calls_per_second"),
                  "server_cpu_us_per_call": run.get("server_cpu_us_per_call"),
                  "in_handler_share": round(inside / max(1, total), 3),
                  "by_library": {k: round(v, 3) for k, v in by_library.items() if v >= 0.005}}))
EOF
}

for in_flight in "1 1" "2 16"; do
  read -r channels per_channel <<< "$in_flight"
  for tenants in 1 8; do
    for server in echo_callback retry-budget-server; do
      profile "$server" "$channels" "$per_channel" "$tenants"
    done
  done
done
