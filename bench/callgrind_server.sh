#!/usr/bin/env bash
# Instructions per call, counted: the budget server and the echo server under the same load
# (bench_server_load, 1 call in flight; 32 too on request), with 1 and 8 tenants per request,
# each server run under valgrind's callgrind. The count covers every thread of the server
# process (gRPC's included) over the measured part of the run: bench_server_load zeroes the
# counters when it starts (callgrind_control -z) and dumps them when it ends (-d); the calls are
# the handler's (RetryBudgetServiceImpl::Sync or CallbackEchoService::Echo) in that same dump.
#
# Why: on this VM perf has no hardware counters and its clock samples pile up in the kernel's
# scheduler (section 2c of docs/BENCHMARKS.md), so a 10-20% difference in CPU per call is
# below what sampling or timing can resolve in one run. An instruction count does not move with
# the machine's load: the same build gives the same count to within ~1% (what gRPC's timers
# and pollers do in the window), so two builds can be compared call for call. It counts
# instructions, not time: cache misses and the kernel's share do not show.
#
#   bench/callgrind_server.sh BUILD_DIR OUT_DIR [SERVER_BIN]
# Writes OUT_DIR/<server>_<tenants>t.annotate (callgrind_annotate: inclusive costs; its list of
# self costs is of no use on a dump taken mid-run, where it puts all under the threads' entry)
# and prints one JSON line per run. SERVER_BIN (default BUILD_DIR/server/retry-budget-server)
# lets two builds of the server be compared under the same load generator.
#   IN_FLIGHT="1 32"  adds runs at 32 calls in flight (2 channels x 16; names end _32inflight)
#   TENANTS="8"       only these tenants per request (default "1 8")
#   SERVERS=retry-budget-server  only this server (default "echo_callback retry-budget-server"):
#                     the echo server's count does not move with the budget server's code
#   KEEP_DUMPS=1      keeps the callgrind files (<name>.cg.<pid>.1 is the measured part), e.g.
#                     for `callgrind_annotate --tree=caller` or kcachegrind
# Needs valgrind (Debian's package of that name) and a BUILD_DIR with debug info
# (RelWithDebInfo, `make build`).
set -euo pipefail
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $0 BUILD_DIR OUT_DIR [SERVER_BIN]" >&2; exit 2; }
build=$1
out=$2
server_bin=${3:-$build/server/retry-budget-server}
command -v callgrind_control > /dev/null ||
  { echo "$0: valgrind is missing (apt-get install valgrind)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

# Each run: in flight ("1" or "32"), tenants per request, server.
runs=()
for in_flight in ${IN_FLIGHT:-1}; do
  case $in_flight in 1 | 32) ;; *) echo "$0: IN_FLIGHT takes 1 and 32" >&2; exit 2 ;; esac
  for tenants in ${TENANTS:-1 8}; do
    for server in ${SERVERS:-echo_callback retry-budget-server}; do
      runs+=("$in_flight $tenants $server")
    done
  done
done

for run in "${runs[@]}"; do
  read -r in_flight tenants server <<< "$run"
  if [ "$in_flight" = 1 ]; then
    channels=1 per_channel=1 name="${server}_${tenants}t"
  else
    channels=2 per_channel=16 name="${server}_${tenants}t_32inflight"
  fi
  rm -f "$out/$name".cg.*
  "$build/bench/bench_server_load" --servers="$server" --server_bin="$server_bin" \
    --tenants_per_request="$tenants" --channels="$channels" --in_flight="$per_channel" \
    --rounds=1 --warmup=8s --duration=10s \
    --server_prefix="valgrind --tool=callgrind --callgrind-out-file=$out/$name.cg.%p" \
    --at_measure_start="callgrind_control -z {pid} > /dev/null" \
    --at_measure_end="callgrind_control -d {pid} > /dev/null" \
    > "$out/$name.load.jsonl" 2> "$out/$name.load.err" || true
  dump=$(ls "$out/$name".cg.*.1 2> /dev/null | head -1 || true)
  [ -n "$dump" ] || { echo "$0: $name: no callgrind dump (see $out/$name.load.err)" >&2; continue; }
  callgrind_annotate --inclusive=yes --threshold=100 "$dump" > "$out/$name.annotate" \
    2> /dev/null || true
  python3 - "$name" "$dump" "$out/$name.annotate" <<'EOF'
import json, re, sys
name, dump, annotate = sys.argv[1:4]
handlers = ("RetryBudgetServiceImpl::Sync(", "CallbackEchoService::Echo(")
KEY = {"RetryBudgetServiceImpl::Sync", "CallbackEchoService::Echo", "ParseRequest",
       "SerializeResponse", "ValidateRequest", "IsValidTenantName", "BudgetCore::Sync",
       "BudgetCore::ApplyEntry", "BudgetCore::Grant", "BudgetCore::Credit", "WriteResponse",
       "Fingerprint", "Tenant::SetActive", "Tenant::SweepActive", "InstanceTenants::Find",
       "CheckAgainstApplied", "v1::SyncResponse::Clear", "v1::SyncRequest::Clear", "malloc",
       "free", "operator new", "absl::debian3::Mutex::Lock", "grpc_core::ExecCtx::Flush"}
total = calls = 0
callee = ""
names = {}  # callgrind's name compression: "(id) name" the first time, "(id)" after
for line in open(dump, errors="replace"):
    if line.startswith(("totals:", "summary:")):
        total = max(total, int(line.split()[1]))
    elif line.startswith(("fn=", "cfn=")):
        m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
        if m and m.group(2):
            names[m.group(1)] = m.group(2)
        if line.startswith("cfn="):
            callee = names.get(m.group(1), "") if m else line[4:]
    elif line.startswith("calls=") and any(h in callee for h in handlers):
        calls += int(line[6:].split()[0])
# Inclusive cost per call of the functions that make up a call (the largest entry of each name:
# callgrind lists a function once per file its inlined code came from).
inclusive = {}
for line in open(annotate, errors="replace"):
    m = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
    if not m:
        continue
    fn = re.sub(r"^(=> )?(\S*?\.(cc|h|c|S|inc|hpp)|\?\?\?):", "", m.group(2)).split(" [")[0]
    fn = fn.replace("(anonymous namespace)::", "")
    short = fn.split("(")[0].split("<")[0]
    short = short.replace("retrybudget::", "").replace("core_internal::", "")
    for key in KEY:
        if short == key or short.endswith("::" + key):
            inclusive[key] = max(inclusive.get(key, 0), int(m.group(1).replace(",", "")))
print(json.dumps({"callgrind": name, "calls": calls,
                  "instructions_per_call": round(total / max(1, calls)),
                  "inclusive_per_call": {k: round(v / max(1, calls)) for k, v in
                                         sorted(inclusive.items(), key=lambda kv: -kv[1])}}))
EOF
  [ -n "${KEEP_DUMPS:-}" ] || rm -f "$out/$name".cg.*
done
