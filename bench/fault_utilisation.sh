#!/usr/bin/env bash
# Utilisation of the budget through faults: the fleet tool's runs of docs/BENCHMARKS.md section 9
# (about 2 minutes per build),
# each with every build given, one after the other in the same invocation, so that the figures
# compare (same machine, same minute). Prints one JSON line per run (the fleet tool's report,
# with "scenario" and "build" added) and a table at the end.
#   bench/fault_utilisation.sh build                  # this tree's build
#   bench/fault_utilisation.sh before-build build     # an older build (e.g. of main) first
# A build directory must hold server/retry-budget-server and tools/fleet/retry-budget-fleet.
#   bench/fault_utilisation.sh --only=kill9_restart build   # one scenario
# `utilisation` is retries allowed / the bound (initial + refill * elapsed + credit * successes +
# the fallback allowance); `utilisation_vs_ideal` (fleet tools that have it) is retries allowed /
# what one ideal central bucket would have allowed the run's own demand.
set -euo pipefail
only=""
case "${1:-}" in --only=*) only=${1#--only=}; shift ;; esac
[ $# -ge 1 ] || { echo "usage: $0 [--only=SCENARIO] BUILD_DIR [BUILD_DIR...]" >&2; exit 2; }

# One workload for every scenario: 4 workers x 2 threads, half the attempts fail, a budget funded
# mostly by successes (credit 0.1 per success, refill 10/s), lease TTL 2 s.
common=(--tenant=t --workers=4 --threads=2 --failure-rate=0.5 --capacity=50 --refill=10
        --credit=0.1 --lease-ttl-ms=2000)
scenarios=(
  "steady|--duration=10"
  "kill9_restart|--duration=12 --kill-server-after=3 --restart-after=2"
  "sigstop_4s|--duration=10 --stop-server-after=3 --resume-after=4"
  "drop30_dup_replay|--duration=10 --fault-drop-response=0.3 --fault-duplicate-request=0.1 --fault-replay-old=0.1"
  # 3 servers on a real etcd cluster, the servers' default --etcd_lease_ttl (5 s).
  "cluster_owner_kill9|--duration=16 --cluster=3 --cluster-chaos=kill:owner@5"
)

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for scenario in "${scenarios[@]}"; do
  name=${scenario%%|*}
  [ -z "$only" ] || [ "$only" = "$name" ] || continue
  read -r -a extra <<< "${scenario#*|}"
  for build in "$@"; do
    line=$("$build/tools/fleet/retry-budget-fleet" --spawn-server="$build/server/retry-budget-server" \
             "${common[@]}" "${extra[@]}" 2> /dev/null | tail -1) || true
    [ -n "$line" ] || { echo "{\"scenario\":\"$name\",\"build\":\"$build\",\"error\":\"no report\"}"; continue; }
    python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["scenario"]=sys.argv[2]; r["build"]=sys.argv[3]; print(json.dumps(r))' \
      "$line" "$name" "$build" | tee -a "$results"
  done
done
python3 - "$results" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("\n| scenario | build | within budget | utilisation | utilisation_vs_ideal | fallback spent | credit deposited in fallback |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    f = r.get("fallback") or {}
    vs = r.get("utilisation_vs_ideal")
    print(f"| {r['scenario']} | {r['build']} | {r.get('within_budget')} | {r.get('utilisation', 0):.3f} | "
          f"{'-' if vs is None else f'{vs:.3f}'} | {f.get('library_fallback_allowed', 0)} | "
          f"{f.get('success_credit_deposited', '-')} |")
EOF
