#!/usr/bin/env python3
"""mixed-fleet: workers of every language on ONE tenant at the same time (C++ workers of
retry-budget-fleet, Python worker processes of the retrybudget package, Go workers of
tools/fleet/go_worker and Node workers of tools/fleet/js_worker), against one real server or a
real cluster, and DESIGN.md's invariant checked on the sum of their own counts:

    sum over languages of the tokens their retries took (--retry-cost each; in --mode=shadow
    less the would-be denials, which took none)
        <= bound = initial + refill * elapsed + credit * (successes of all)
                   + the fallback allowance of every worker

exactly as fleet_report.cc computes it (BudgetBound, Judge). The driver owns the deployment:
one server on 127.0.0.1:0 with a policy file and a data directory (a restart keeps the buckets),
or with --cluster=N a real etcd cluster and N servers through tests/support/cluster-under-test.
It starts the non-C++ workers (each prints `ready`), creates the bucket and reads its level on
the tenant's server (PutPolicy, GetBudget: `initial`), starts the clock, starts
retry-budget-fleet --server=TARGET (which keeps the server's policy) and writes `go T0` to the
other workers. --kill-server-after=S SIGKILLs the server S seconds into the run (in a cluster:
the server that owns the tenant's shard) and --restart-after=R starts it again R seconds later
(on the same port). The clock stops when every process has exited. One JSON line on stdout;
exit 0 within budget, 1 over it, 3 no verdict.

Every non-C++ worker speaks one protocol (tools/fleet/README.md, "The mixed fleet"): flags
--server --tenant --threads --duration --failure-rate --call-latency --seed [--timeline-slice]
[--retry-cost] [--call-interval] [--max-attempts];
`ready`, then the start signal `go T0` on stdin (T0: the run's start on CLOCK_MONOTONIC, in
microseconds, which the timelines count from; tools/fleet/start_signal.h); `--threads` loops make logical calls to a simulated backend
(`--call-latency`, failing with `--failure-rate`; paced, one every `--call-interval` seconds,
when given), each call's request recorded before its first attempt, a failed attempt is
retried only when the budget's try-acquire of `--retry-cost` tokens allows (and the call ends
failed after `--max-attempts` attempts, 0: no cap, or at the end of the run), a success is
recorded; then the client is closed (final Sync) and
one JSON line of counts (with their timelines per --timeline-slice) is printed. The fleet tool
runs these workers too (--foreign-workers), beside its C++ ones under its cluster chaos and
fault proxy. Its fallback allowance is the sum over its fallback episodes of the local
bucket's capacity (at least 1 when it refills) + refill * seconds, from the client's own record
of the buckets it made (Python: TenantBudget.fallback_allowance()).

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

def start_signal_origin_us(line: str, now_us: int):
    """The timelines' origin (CLOCK_MONOTONIC microseconds) a start signal gives a worker that
    read it at `now_us`: N for "go N" (the fleet's start, tools/fleet/start_signal.h), `now_us`
    for a bare "go"; None for anything else or an origin after `now_us`."""
    words = line.split()
    if words == ["go"]:
        return now_us
    if len(words) != 2 or words[0] != "go" or not words[1].isdigit() or int(words[1]) > now_us:
        return None
    return int(words[1])


def run_worker(args) -> int:
    import retrybudget

    print("ready", flush=True)
    signal = sys.stdin.readline()
    # time.monotonic() is CLOCK_MONOTONIC, the clock of the start signal's origin.
    origin_us = start_signal_origin_us(signal, time.monotonic_ns() // 1000)
    if origin_us is None:
        print(f"python worker: bad start signal {signal.strip()!r} (want 'go' or 'go "
              "<CLOCK_MONOTONIC microseconds, not after now>')", file=sys.stderr)
        return 3
    origin = origin_us / 1e6
    client = retrybudget.BudgetClient(retrybudget.ClientOptions(target=args.server))
    budget = client.tenant(args.tenant)
    # Calls start once the tenant's first answer is in (as the fleet tool's C++ workers do): a
    # client is in enforce mode and has no lease until then, and what it counts before it is the
    # server's baseline. Bounded, so a server that is down does not hold the run.
    budget.wait_ready(3.0)
    lock = threading.Lock()
    totals = {"calls": 0, "attempts": 0, "successes": 0, "failures": 0, "retries_allowed": 0,
              "retries_denied": 0, "requests": 0, "tokens_spent": 0}
    cost = args.retry_cost
    max_try_acquire = [0.0]
    begin = time.monotonic()
    end = begin + args.duration
    done = threading.Event()
    # Per slice of --timeline-slice seconds from the start signal's origin (the fleet's start,
    # whenever this worker began), by the call's start: calls, retries sent, retries denied,
    # successes (the fleet tool's timelines).
    slices = int((end - origin) / args.timeline_slice) + 2
    timelines = {k: [0] * slices for k in ("calls", "retries", "denied", "successes")}
    # Counted when the request is recorded / the tokens are taken (the windowed bound).
    at_timelines = {"requests": [], "tokens": []}

    def count_at(timeline, n):
        i = max(0, int((time.monotonic() - origin) / args.timeline_slice))
        timeline.extend([0] * (i + 1 - len(timeline)))
        timeline[i] += n

    def add_into(total, part):
        total.extend([0] * (len(part) - len(total)))
        for i, v in enumerate(part):
            total[i] += v

    def thread_main(seed):
        rng = random.Random(seed)
        counts = dict.fromkeys(totals, 0)
        mine = {k: [0] * slices for k in timelines}
        mine_at = {k: [] for k in at_timelines}
        longest = 0.0
        k = 0
        while True:
            if args.call_interval > 0:
                time.sleep(max(0.0, begin + k * args.call_interval - time.monotonic()))
                k += 1
            now = time.monotonic()
            if now >= end:
                break
            i = min(int((now - origin) / args.timeline_slice), slices - 1)  # now < end: < slices - 1
            counts["calls"] += 1
            mine["calls"][i] += 1
            budget.record_request()
            counts["requests"] += 1
            count_at(mine_at["requests"], 1)
            attempt = 0
            while True:
                attempt += 1
                counts["attempts"] += 1
                if args.call_latency > 0:
                    time.sleep(args.call_latency)
                if rng.random() >= args.failure_rate:
                    budget.record_success()
                    counts["successes"] += 1
                    mine["successes"][i] += 1
                    break
                if (args.max_attempts > 0 and attempt >= args.max_attempts) or \
                        time.monotonic() >= end:
                    counts["failures"] += 1
                    break
                start = time.perf_counter()
                allowed = budget.try_acquire(cost)
                longest = max(longest, time.perf_counter() - start)
                if not allowed:
                    counts["retries_denied"] += 1
                    counts["failures"] += 1
                    mine["denied"][i] += 1
                    break
                counts["retries_allowed"] += 1
                counts["tokens_spent"] += cost
                mine["retries"][i] += 1
                count_at(mine_at["tokens"], cost)
        with lock:
            for k, v in counts.items():
                totals[k] += v
            for k, v in mine.items():
                timelines[k] = [a + b for a, b in zip(timelines[k], v)]
            for k, v in mine_at.items():
                add_into(at_timelines[k], v)
            max_try_acquire[0] = max(max_try_acquire[0], longest)

    # Lease -> fallback -> lease, as seen by polling the mode.
    seen = {"fallback": False, "lease_after_fallback": False}

    # When this client's tenant changed mode (enforce <-> shadow), ms from the origin, as polled.
    mode_changes = []
    shadow = [False]

    def monitor():
        while not done.wait(0.01):
            stats = budget.stats()
            if (stats.enforcement == retrybudget.SHADOW) != shadow[0]:
                shadow[0] = not shadow[0]
                mode_changes.append(max(0, int((time.monotonic() - origin) * 1000)))
            mode = stats.mode
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
        "lib_successes_credited_locally": stats.successes_credited_locally,
        "lib_requests": stats.requests,
        "lib_shadow_denied": stats.shadow_denied,
        "fallback_allowance": budget.fallback_allowance(time.monotonic()),
        "saw_fallback": seen["fallback"],
        "lease_after_fallback": seen["lease_after_fallback"],
        "shutdown_status": "OK" if status is None else status,
        "max_try_acquire_ms": max_try_acquire[0] * 1000,
        "mode_changes_ms": mode_changes,
    })
    while slices > 0 and timelines["calls"][slices - 1] == 0:  # the empty tail
        slices -= 1
    line["timeline_slice_seconds"] = args.timeline_slice
    line["timeline_origin_us"] = origin_us
    for k, v in timelines.items():
        line[f"{k}_timeline"] = v[:slices]
    for k, v in at_timelines.items():
        line[f"{k}_timeline"] = v
    print(json.dumps(line), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------

# The counts every worker of every language reports (its JSON line), summed per language.
_SUMMED = ("calls", "attempts", "successes", "failures", "retries_allowed", "retries_denied",
           "lib_retries_allowed", "lib_fallback_allowed", "lib_tokens_held", "fallback_allowance",
           "lib_successes_credited_locally", "requests", "tokens_spent", "lib_requests",
           "lib_shadow_denied")


def policy_text(args) -> str:
    return (f'tenants {{ tenant: "{args.tenant}" policy {{ capacity: {args.capacity} '
            f'refill_per_second: {args.refill} success_credit: {args.credit} '
            f'lease_ttl_ms: {args.lease_ttl_ms} mode: MODE_{args.mode.upper()} }} }}\n')


def load_flags(args):
    """The load's flags every worker (and retry-budget-fleet) gets beyond the protocol's own:
    the cost per retry, the pace and the attempts per call, only when not the default."""
    flags = []
    if args.retry_cost != 1:
        flags.append(f"--retry-cost={args.retry_cost}")
    if args.call_interval > 0:
        flags.append(f"--call-interval={args.call_interval}")
    if args.max_attempts > 0:
        flags.append(f"--max-attempts={args.max_attempts}")
    return flags


def admin_call(address: str, method: str, request):
    """One BudgetAdminService call to one server (HOST:PORT)."""
    import grpc
    from retrybudget._proto import budget_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = budget_pb2_grpc.BudgetAdminServiceStub(channel)
        return getattr(stub, method)(request, timeout=10)


class SingleServer:
    """The real server on 127.0.0.1:0 with a policy file and a data directory (a restart keeps
    the buckets). Chaos: kill -9, then a restart on the same port."""

    def __init__(self, args, directory, policy):
        from retrybudget.testing import ServerProcess

        self.server = ServerProcess(args.server_bin, directory, [f"--policy={policy}"]).start()
        self.target = self.server.target

    def admin_address(self, tenant: str) -> str:
        return self.server.target

    def kill(self, tenant: str) -> dict:
        self.server.kill()
        return {}

    def restart(self) -> None:
        self.server.restart()

    def close(self) -> None:
        self.server.kill()


class Cluster:
    """A real 3-node etcd cluster and N real servers in cluster mode, driven through
    tests/support/cluster-under-test (the project's one launcher). Chaos: kill -9 of the server
    that owns the tenant's shard; the others take the shard over once its etcd lease expires."""

    def __init__(self, args, policy):
        self.process = subprocess.Popen(
            [args.cluster_bin, f"--server-bin={args.server_bin}", f"--servers={args.cluster}",
             f"--shards={args.shards}", f"--etcd-lease-ttl={args.etcd_lease_ttl}",
             f"--policy={policy}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"cluster-under-test exited {self.process.wait()} before serving")
        self.info = json.loads(line)
        self.target = self.info["target"]
        self.killed = []

    def command(self, line: str) -> dict:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline() or '{"ok":false,"error":"exited"}')
        if not answer.get("ok"):
            raise RuntimeError(f"cluster-under-test: {line}: {answer.get('error')}")
        return answer

    def admin_address(self, tenant: str) -> str:
        return self.command(f"owner {tenant}")["address"]

    def kill(self, tenant: str) -> dict:
        owner = self.command(f"owner {tenant}")
        self.command(f"kill {owner['index']}")
        self.killed.append(owner["index"])
        return {"killed_owner": owner["index"]}

    def restart(self) -> None:
        for index in self.killed:
            self.command(f"restart {index}")
        self.killed = []

    def owner_after_kill(self, tenant: str, timeout: float = 30.0) -> int:
        """The tenant's new owner: the killed server's etcd key stays until its lease runs out,
        so the owner is read until it is another server."""
        deadline = time.monotonic() + timeout
        while True:
            index = self.command(f"owner {tenant}")["index"]
            if index not in self.killed or time.monotonic() > deadline:
                return index
            time.sleep(0.05)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
                self.process.wait(30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


def worker_kinds(args):
    """(language, how many, argv prefix) of every non-C++ worker kind asked for."""
    kinds = [("python", args.py_workers, args.py_threads,
              [sys.executable, os.path.abspath(__file__), _WORKER_ROLE])]
    if args.go_workers:
        kinds.append(("go", args.go_workers, args.go_threads, [args.go_worker_bin]))
    if args.js_workers:
        kinds.append(("js", args.js_workers, args.js_threads, [args.node, args.js_worker]))
    return [k for k in kinds if k[1] > 0]


def run_driver(args) -> int:
    with tempfile.TemporaryDirectory(prefix="mixed-fleet-") as directory:
        policy = os.path.join(directory, "policy.textproto")
        with open(policy, "w") as f:
            f.write(policy_text(args))
        deployment = Cluster(args, policy) if args.cluster else SingleServer(args, directory,
                                                                             policy)
        try:
            return drive(args, deployment)
        finally:
            deployment.close()


def drive(args, deployment) -> int:
    from retrybudget._proto import budget_pb2

    workers = []  # (language, Popen)
    for language, count, threads, prefix in worker_kinds(args):
        for i in range(count):
            workers.append((language, subprocess.Popen(
                prefix + [f"--server={deployment.target}", f"--tenant={args.tenant}",
                          f"--threads={threads}", f"--duration={args.duration}",
                          f"--failure-rate={args.failure_rate}",
                          f"--call-latency={args.call_latency}", f"--seed={args.seed + i}"]
                + load_flags(args),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)))
    for language, w in workers:
        if w.stdout.readline().strip() != "ready":
            print(f"mixed-fleet: a {language} worker failed to start", file=sys.stderr)
            return 3
    # The policy file names the tenant (a restarted server reads it again); PutPolicy of the same
    # policy creates its bucket (on the shard's owner, in a cluster), whose level is `initial`.
    admin = deployment.admin_address(args.tenant)
    admin_call(admin, "PutPolicy", budget_pb2.PutPolicyRequest(
        tenant=args.tenant, policy=budget_pb2.BudgetPolicy(
            capacity=args.capacity, refill_per_second=args.refill, success_credit=args.credit,
            lease_ttl_ms=args.lease_ttl_ms,
            mode=budget_pb2.MODE_SHADOW if args.mode == "shadow" else budget_pb2.MODE_ENFORCE)))
    initial = admin_call(admin, "GetBudget",
                         budget_pb2.GetBudgetRequest(tenant=args.tenant)).budget.tokens
    start_ns = time.monotonic_ns()
    start = start_ns / 1e9
    fleet = None
    if args.cpp_workers > 0:
        fleet = subprocess.Popen(
            [args.fleet_bin, f"--server={deployment.target}", f"--tenant={args.tenant}",
             f"--workers={args.cpp_workers}", f"--threads={args.cpp_threads}",
             f"--duration={args.duration}", f"--failure-rate={args.failure_rate}",
             f"--call-latency={int(args.call_latency * 1e6)}us", f"--seed={args.seed}",
             f"--call-interval={int(args.call_interval * 1e6)}us",
             f"--max-attempts={args.max_attempts}", f"--retry-cost={args.retry_cost}"],
            stdout=subprocess.PIPE, text=True)
    for _, w in workers:
        w.stdin.write(f"go {start_ns // 1000}\n")  # the timelines' origin: the level read
        w.stdin.flush()
    chaos = {}
    chaos_thread = None
    if args.kill_server_after is not None:
        def chaos_main():
            time.sleep(max(0.0, start + args.kill_server_after - time.monotonic()))
            chaos.update(deployment.kill(args.tenant))
            chaos["kill_at_seconds"] = time.monotonic() - start
            if args.cluster:
                chaos["new_owner"] = deployment.owner_after_kill(args.tenant)
                chaos["new_owner_at_seconds"] = time.monotonic() - start
            if args.restart_after is not None:
                time.sleep(max(0.0, start + args.kill_server_after + args.restart_after
                               - time.monotonic()))
                deployment.restart()
                chaos["restart_at_seconds"] = time.monotonic() - start
        chaos_thread = threading.Thread(target=chaos_main)
        chaos_thread.start()
    lines = {}
    for language, w in workers:
        out, _ = w.communicate(timeout=args.duration + 60)
        if w.returncode != 0 or not out.strip():
            print(f"mixed-fleet: a {language} worker exited {w.returncode}", file=sys.stderr)
            return 3
        lines.setdefault(language, []).append(json.loads(out.strip().splitlines()[-1]))
    cpp = None
    if fleet is not None:
        fleet_out, _ = fleet.communicate(timeout=args.duration + 60)
        if fleet.returncode not in (0, 1) or not fleet_out.strip():
            print(f"mixed-fleet: retry-budget-fleet exited {fleet.returncode}", file=sys.stderr)
            return 3
        cpp = json.loads(fleet_out.strip().splitlines()[-1])
    elapsed = time.monotonic() - start
    if chaos_thread is not None:
        chaos_thread.join()

    parts = {}
    for language, language_lines in lines.items():
        part = {k: sum(line[k] for line in language_lines) for k in _SUMMED}
        # What success-funded fallback deposited: funded by successes already in the bound's
        # credit * successes, so it is not added to the bound, only to a part's fallback check.
        part["success_credit_deposited"] = args.credit * part["lib_successes_credited_locally"]
        part["workers"] = len(language_lines)
        part["workers_back_on_lease"] = sum(1 for line in language_lines
                                            if line["lease_after_fallback"])
        part["shutdown_status"] = next((line["shutdown_status"] for line in language_lines
                                        if line["shutdown_status"] != "OK"), "OK")
        part["max_try_acquire_ms"] = max(line["max_try_acquire_ms"] for line in language_lines)
        parts[language] = part
    successes = sum(p["successes"] for p in parts.values())
    # fleet_report.cc's Verdict::spent: the tokens of every retry sent, less the would-be denials
    # of a shadow tenant (each let through at the cost without a token).
    tokens = sum(p["tokens_spent"] for p in parts.values())
    shadow_denied = sum(p["lib_shadow_denied"] for p in parts.values())
    spent = tokens - args.retry_cost * shadow_denied
    fallback_allowance = sum(p["fallback_allowance"] for p in parts.values())
    if cpp is not None:
        successes += cpp["successes"]
        tokens += cpp["tokens_spent"]
        shadow_denied += cpp["shadow_denied"]
        spent += cpp["spent"]
        fallback_allowance += cpp["fallback_allowance"]
    # fleet_report.cc: BudgetBound() + the fallback allowance (Judge()).
    lease_bound = initial + args.refill * elapsed + args.credit * successes
    bound = lease_bound + fallback_allowance
    report = {
        "tenant": args.tenant,
        "deployment": f"cluster of {args.cluster}" if args.cluster else "one server",
        "policy": {"capacity": args.capacity, "refill_per_second": args.refill,
                   "success_credit": args.credit, "lease_ttl_ms": args.lease_ttl_ms,
                   "initial_tokens": initial},
        "elapsed_seconds": elapsed,
        "mode": args.mode,
        "retry_cost": args.retry_cost,
        "retries_allowed": sum(p["retries_allowed"] for p in parts.values())
        + (cpp["retries_allowed"] if cpp is not None else 0),
        "tokens_spent": tokens,
        "shadow_denied": shadow_denied,
        "spent": spent,
        "successes": successes,
        "lease_bound": lease_bound,
        "fallback_allowance": fallback_allowance,
        "bound": bound,
        "within_budget": spent <= bound,
        "utilisation": spent / bound if bound > 0 else None,
        "languages": (["cpp"] if cpp is not None else []) + list(parts),
    }
    if cpp is not None:
        report["cpp"] = {k: cpp.get(k) for k in ("workers", "threads", "calls", "successes",
                                                 "retries_allowed", "retries_denied",
                                                 "tokens_spent", "shadow_denied",
                                                 "fallback_allowance", "max_try_acquire_ms")}
        report["cpp_library"] = cpp.get("library")
        report["cpp_fallback"] = cpp.get("fallback")
    report.update(parts)
    if chaos:
        report["chaos"] = chaos
    print(json.dumps(report), flush=True)
    return 0 if report["within_budget"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description="C++, Python, Go and JavaScript workers on one retry budget")
    parser.add_argument(_WORKER_ROLE, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--server", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--timeline-slice", type=float, default=0.1, help=argparse.SUPPRESS)
    parser.add_argument("--retry-cost", type=int, default=1, help="tokens per retry")
    parser.add_argument("--call-interval", type=float, default=0.0,
                        help="seconds between a loop's call starts (0: back to back)")
    parser.add_argument("--max-attempts", type=int, default=0, help="per call, 0: no cap")
    parser.add_argument("--mode", choices=("enforce", "shadow"), default="enforce",
                        help="the policy's mode")
    parser.add_argument("--server-bin", help="retry-budget-server binary")
    parser.add_argument("--fleet-bin", help="retry-budget-fleet binary (the C++ workers)")
    parser.add_argument("--tenant", default="mixed")
    parser.add_argument("--cpp-workers", type=int, default=2)
    parser.add_argument("--cpp-threads", type=int, default=2)
    parser.add_argument("--py-workers", type=int, default=2)
    parser.add_argument("--py-threads", type=int, default=2)
    parser.add_argument("--go-worker-bin", help="the Go worker (tools/fleet/go_worker)")
    parser.add_argument("--go-workers", type=int, default=0)
    parser.add_argument("--go-threads", type=int, default=2, help="goroutines per Go worker")
    parser.add_argument("--js-worker", help="the Node worker script (tools/fleet/js_worker)")
    parser.add_argument("--node", default="node", help="the node binary for --js-worker")
    parser.add_argument("--js-workers", type=int, default=0)
    parser.add_argument("--js-threads", type=int, default=2, help="async loops per JS worker")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds")
    parser.add_argument("--failure-rate", type=float, default=1.0)
    parser.add_argument("--call-latency", type=float, default=0.001, help="seconds")
    parser.add_argument("--capacity", type=float, default=20)
    parser.add_argument("--refill", type=float, default=60)
    parser.add_argument("--credit", type=float, default=0.01)
    parser.add_argument("--lease-ttl-ms", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cluster", type=int, default=0,
                        help="run N servers on etcd (cluster-under-test) instead of one")
    parser.add_argument("--cluster-bin", help="tests/support/cluster-under-test binary")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--etcd-lease-ttl", default="2s")
    parser.add_argument("--kill-server-after", type=float, default=None,
                        help="seconds; kill -9 the server (in a cluster: the tenant's owner)")
    parser.add_argument("--restart-after", type=float, default=None,
                        help="seconds after the kill; start the killed server again (default: "
                             "1 s for one server, never in a cluster)")
    args = parser.parse_args()
    if args.worker:
        return run_worker(args)
    if not args.server_bin or (args.cpp_workers > 0 and not args.fleet_bin):
        parser.error("--server-bin and --fleet-bin are required")
    if args.go_workers and not args.go_worker_bin:
        parser.error("--go-workers needs --go-worker-bin")
    if args.js_workers and not args.js_worker:
        parser.error("--js-workers needs --js-worker")
    if args.cluster and not args.cluster_bin:
        parser.error("--cluster needs --cluster-bin")
    if args.restart_after is None and not args.cluster:
        args.restart_after = 1.0
    return run_driver(args)


if __name__ == "__main__":
    sys.exit(main())
