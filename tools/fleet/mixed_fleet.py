#!/usr/bin/env python3
"""mixed-fleet: C++ workers (retry-budget-fleet) and Python worker processes (the retrybudget
package) on ONE tenant at the same time, against one real server, and DESIGN.md's invariant
checked on the counts of both:

    retries_allowed(C++) + retries_allowed(Python)
        <= bound = initial + refill * elapsed + credit * (successes of both)
                   + fallback_allowance(C++) + fallback_allowance(Python)

exactly as fleet_report.cc computes it (BudgetBound, Judge). The driver owns the server (on
127.0.0.1:0, with a policy file and a data directory, so a restart keeps the buckets): it starts
the Python workers (each prints `ready`), reads the level (GetBudget: `initial`), starts the
clock, starts retry-budget-fleet --server=... (which keeps the server's policy) and writes `go`
to the Python workers. With --kill-server-after=S --restart-after=R it SIGKILLs the server S
seconds into the run and restarts it R seconds later on the same port. The clock stops when the
fleet tool and every Python worker have exited. One JSON line on stdout; exit 0 within budget,
1 over it, 3 no verdict.

A Python worker behaves as a fleet-tool worker with --strategy=budget: `--threads` threads make
logical calls to a simulated backend (`--call-latency`, failing with `--failure-rate`); a failed
attempt is retried only when try_acquire() allows; a success calls record_success(). Its
fallback allowance is the sum over its fallback episodes of the local bucket's capacity (at
least 1 when it refills) + refill * seconds, from the client's own record of the buckets it
made (TenantBudget.fallback_allowance()).

    PYTHONPATH=build/client/python/gen:client/python python3 tools/fleet/mixed_fleet.py \\
        --server-bin=build/server/retry-budget-server \\
        --fleet-bin=build/tools/fleet/retry-budget-fleet --duration=3
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

_WORKER_ROLE = "--worker"


# ---------------------------------------------------------------------------------------------
# The Python worker process
# ---------------------------------------------------------------------------------------------

def run_worker(args) -> int:
    import retrybudget

    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 3
    client = retrybudget.BudgetClient(retrybudget.ClientOptions(target=args.server))
    budget = client.tenant(args.tenant)
    lock = threading.Lock()
    totals = {"calls": 0, "attempts": 0, "successes": 0, "failures": 0, "retries_allowed": 0,
              "retries_denied": 0}
    max_try_acquire = [0.0]
    end = time.monotonic() + args.duration
    done = threading.Event()

    def thread_main(seed):
        rng = random.Random(seed)
        counts = dict.fromkeys(totals, 0)
        longest = 0.0
        while time.monotonic() < end:
            counts["calls"] += 1
            while True:
                counts["attempts"] += 1
                if args.call_latency > 0:
                    time.sleep(args.call_latency)
                if rng.random() >= args.failure_rate:
                    budget.record_success()
                    counts["successes"] += 1
                    break
                start = time.perf_counter()
                allowed = budget.try_acquire()
                longest = max(longest, time.perf_counter() - start)
                if not allowed:
                    counts["retries_denied"] += 1
                    counts["failures"] += 1
                    break
                counts["retries_allowed"] += 1
        with lock:
            for k, v in counts.items():
                totals[k] += v
            max_try_acquire[0] = max(max_try_acquire[0], longest)

    # Lease -> fallback -> lease, as seen by polling the mode.
    seen = {"fallback": False, "lease_after_fallback": False}

    def monitor():
        while not done.wait(0.01):
            mode = budget.stats().mode
            if mode in (retrybudget.FALLBACK, retrybudget.DENY_FALLBACK):
                seen["fallback"] = True
            elif mode == retrybudget.LEASE and seen["fallback"]:
                seen["lease_after_fallback"] = True

    watcher = threading.Thread(target=monitor)
    watcher.start()
    threads = [threading.Thread(target=thread_main, args=(args.seed * 1000 + i,))
               for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    status = client.close()
    stats = budget.stats()
    line = dict(totals)
    line.update({
        "lib_retries_allowed": stats.retries_allowed,
        "lib_fallback_allowed": stats.fallback_allowed,
        "lib_tokens_held": stats.tokens_held,
        "fallback_allowance": budget.fallback_allowance(time.monotonic()),
        "saw_fallback": seen["fallback"],
        "lease_after_fallback": seen["lease_after_fallback"],
        "shutdown_status": "OK" if status is None else status,
        "max_try_acquire_ms": max_try_acquire[0] * 1000,
    })
    print(json.dumps(line), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------

def policy_text(args) -> str:
    return (f'tenants {{ tenant: "{args.tenant}" policy {{ capacity: {args.capacity} '
            f'refill_per_second: {args.refill} success_credit: {args.credit} '
            f'lease_ttl_ms: {args.lease_ttl_ms} }} }}\n')


def run_driver(args) -> int:
    from retrybudget.testing import ServerProcess

    with tempfile.TemporaryDirectory(prefix="mixed-fleet-") as directory:
        policy = os.path.join(directory, "policy.textproto")
        with open(policy, "w") as f:
            f.write(policy_text(args))
        server = ServerProcess(args.server_bin, directory, [f"--policy={policy}"]).start()
        try:
            return drive(args, server)
        finally:
            server.kill()


def drive(args, server) -> int:
    me = os.path.abspath(__file__)
    py_workers = []
    for i in range(args.py_workers):
        py_workers.append(subprocess.Popen(
            [sys.executable, me, _WORKER_ROLE, f"--server={server.target}",
             f"--tenant={args.tenant}", f"--threads={args.py_threads}",
             f"--duration={args.duration}", f"--failure-rate={args.failure_rate}",
             f"--call-latency={args.call_latency}", f"--seed={args.seed + i}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for w in py_workers:
        if w.stdout.readline().strip() != "ready":
            print("mixed-fleet: a Python worker failed to start", file=sys.stderr)
            return 3
    # The policy file names the tenant (a restarted server reads it again); PutPolicy of the same
    # policy creates its bucket, whose level is then `initial`.
    server.put_policy(args.tenant, capacity=args.capacity, refill_per_second=args.refill,
                      success_credit=args.credit, lease_ttl_ms=args.lease_ttl_ms)
    initial = server.get_budget(args.tenant).tokens
    start = time.monotonic()
    fleet = subprocess.Popen(
        [args.fleet_bin, f"--server={server.target}", f"--tenant={args.tenant}",
         f"--workers={args.cpp_workers}", f"--threads={args.cpp_threads}",
         f"--duration={args.duration}", f"--failure-rate={args.failure_rate}",
         f"--call-latency={int(args.call_latency * 1e6)}us", f"--seed={args.seed}"],
        stdout=subprocess.PIPE, text=True)
    for w in py_workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    chaos = {}
    chaos_thread = None
    if args.kill_server_after is not None:
        def chaos_main():
            time.sleep(max(0.0, start + args.kill_server_after - time.monotonic()))
            server.kill()
            chaos["kill_at_seconds"] = time.monotonic() - start
            time.sleep(args.restart_after)
            server.restart()
            chaos["restart_at_seconds"] = time.monotonic() - start
        chaos_thread = threading.Thread(target=chaos_main)
        chaos_thread.start()
    py_lines = []
    for w in py_workers:
        out, _ = w.communicate(timeout=args.duration + 60)
        if w.returncode != 0 or not out.strip():
            print(f"mixed-fleet: a Python worker exited {w.returncode}", file=sys.stderr)
            return 3
        py_lines.append(json.loads(out.strip().splitlines()[-1]))
    fleet_out, _ = fleet.communicate(timeout=args.duration + 60)
    elapsed = time.monotonic() - start
    if chaos_thread is not None:
        chaos_thread.join()
    if fleet.returncode not in (0, 1) or not fleet_out.strip():
        print(f"mixed-fleet: retry-budget-fleet exited {fleet.returncode}", file=sys.stderr)
        return 3
    cpp = json.loads(fleet_out.strip().splitlines()[-1])

    py = {k: sum(line[k] for line in py_lines)
          for k in ("calls", "attempts", "successes", "failures", "retries_allowed",
                    "retries_denied", "lib_retries_allowed", "lib_fallback_allowed",
                    "lib_tokens_held", "fallback_allowance")}
    py["workers"] = len(py_lines)
    py["threads"] = args.py_threads
    py["workers_back_on_lease"] = sum(1 for line in py_lines if line["lease_after_fallback"])
    py["shutdown_status"] = next((line["shutdown_status"] for line in py_lines
                                  if line["shutdown_status"] != "OK"), "OK")
    py["max_try_acquire_ms"] = max((line["max_try_acquire_ms"] for line in py_lines),
                                   default=0)
    successes = cpp["successes"] + py["successes"]
    spent = cpp["retries_allowed"] + py["retries_allowed"]
    # fleet_report.cc: BudgetBound() + the fallback allowance (Judge()).
    lease_bound = initial + args.refill * elapsed + args.credit * successes
    fallback_allowance = cpp["fallback_allowance"] + py["fallback_allowance"]
    bound = lease_bound + fallback_allowance
    report = {
        "tenant": args.tenant,
        "policy": {"capacity": args.capacity, "refill_per_second": args.refill,
                   "success_credit": args.credit, "lease_ttl_ms": args.lease_ttl_ms,
                   "initial_tokens": initial},
        "elapsed_seconds": elapsed,
        "retries_allowed": spent,
        "successes": successes,
        "lease_bound": lease_bound,
        "fallback_allowance": fallback_allowance,
        "bound": bound,
        "within_budget": spent <= bound,
        "utilisation": spent / bound if bound > 0 else None,
        "cpp": {k: cpp.get(k) for k in ("workers", "threads", "calls", "successes",
                                        "retries_allowed", "retries_denied",
                                        "fallback_allowance", "max_try_acquire_ms")},
        "cpp_library": cpp.get("library"),
        "cpp_fallback": cpp.get("fallback"),
        "python": py,
    }
    if chaos:
        report["chaos"] = chaos
    print(json.dumps(report), flush=True)
    return 0 if report["within_budget"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description="C++ and Python workers on one retry budget")
    parser.add_argument(_WORKER_ROLE, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--server", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--server-bin", help="retry-budget-server binary")
    parser.add_argument("--fleet-bin", help="retry-budget-fleet binary")
    parser.add_argument("--tenant", default="mixed")
    parser.add_argument("--cpp-workers", type=int, default=2)
    parser.add_argument("--cpp-threads", type=int, default=2)
    parser.add_argument("--py-workers", type=int, default=2)
    parser.add_argument("--py-threads", type=int, default=2)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds")
    parser.add_argument("--failure-rate", type=float, default=1.0)
    parser.add_argument("--call-latency", type=float, default=0.001, help="seconds")
    parser.add_argument("--capacity", type=float, default=20)
    parser.add_argument("--refill", type=float, default=60)
    parser.add_argument("--credit", type=float, default=0.01)
    parser.add_argument("--lease-ttl-ms", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--kill-server-after", type=float, default=None, help="seconds")
    parser.add_argument("--restart-after", type=float, default=1.0, help="seconds")
    args = parser.parse_args()
    if args.worker:
        return run_worker(args)
    if not args.server_bin or not args.fleet_bin:
        parser.error("--server-bin and --fleet-bin are required")
    return run_driver(args)


if __name__ == "__main__":
    sys.exit(main())
