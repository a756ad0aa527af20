#!/usr/bin/env python3
"""The Python client's hot path: TenantBudget.try_acquire() and record_success() against a bare
lock-guarded counter (the least a thread-safe Python counter costs), in the same run. No server:
the lease is filled once with 2^31-1 tokens, so every timed call is a fast-path take (as in
bench/client_fast_path_benchmark.cc). Fastest of --repetitions; ns per operation per thread
(wall time), 1 and 2 threads (the GIL serialises them: the 2-thread figure shows contention).

    PYTHONPATH=build/client/python/gen:client/python python3 bench/python_fast_path_bench.py
"""

import argparse
import json
import threading
import time

from retrybudget._bucket_math import MAX_LEASE_TOKENS, BucketShape
from retrybudget.tenant_budget import TenantBudget


class BareCounter:
    """A lock-guarded counter: the baseline."""

    def __init__(self):
        self._lock = threading.Lock()
        self._n = MAX_LEASE_TOKENS

    def take(self) -> bool:
        with self._lock:
            self._n -= 1
        return True


def time_per_op(make_op, threads: int, n: int) -> float:
    ops = [make_op() for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    elapsed = [0.0] * threads

    def run(i):
        op = ops[i]
        barrier.wait()
        start = time.perf_counter_ns()
        for _ in range(n):
            op()
        elapsed[i] = time.perf_counter_ns() - start

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    for w in workers:
        w.join()
    return max(elapsed) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=1_000_000)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    budget = TenantBudget("bench", lambda: None, time.monotonic(), "local_bucket",
                          BucketShape(1, 0.1))
    budget._deposit(MAX_LEASE_TOKENS, 0)  # one lease for the whole run
    bare = BareCounter()
    cases = {
        "bare_lock_counter": lambda: bare.take,
        "try_acquire": lambda: budget.try_acquire,
        "record_success": lambda: budget.record_success,
    }
    results = {}
    for threads in (1, 2):
        for name, make in cases.items():
            best = min(time_per_op(make, threads, args.iterations // threads)
                       for _ in range(args.repetitions))
            results[f"{name}_{threads}t_ns"] = round(best, 1)
        for name in ("try_acquire", "record_success"):
            results[f"{name}_vs_bare_{threads}t"] = round(
                results[f"{name}_{threads}t_ns"] / results[f"bare_lock_counter_{threads}t_ns"], 2)
    assert budget.stats().retries_denied == 0
    print(json.dumps(results))


if __name__ == "__main__":
    main()
