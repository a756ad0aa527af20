#!/usr/bin/env python3
"""first_lease: how long a new Python client's tenant takes from its handle to its first lease,
on loopback against the real server: for each of N fresh clients (BudgetClient with a thread,
AsyncBudgetClient with asyncio), the time from `client.tenant(name)` to the moment the handle
holds leased tokens (wait_ready() / await ready() returned and stats() shows the lease). Prints
the median, p90, p99 and max in milliseconds.

    python3 client/python/bench/first_lease.py --server_bin=build/server/retry-budget-server
    python3 client/python/bench/first_lease.py --target=127.0.0.1:50051 --clients=200

With --server_bin it starts its own server (port 0, a temporary data directory). Every client
leases the same tenant; one client before the timed ones makes the server create the tenant
(its time, which includes that, is printed apart as `first ever`). Needs the package importable
(installed, or PYTHONPATH=build/client/python/gen:client/python). --new_tenants gives every
client a tenant the server does not know yet: the time then includes the server creating its
bucket (a reservation written to its data directory before the first grant)."""

import argparse
import asyncio
import statistics
import sys
import tempfile
import time

import retrybudget
from retrybudget.testing import ServerProcess


def summary(name: str, ms) -> str:
    xs = sorted(ms)

    def pct(p):
        return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]
    return (f"{name}: n={len(xs)} median={statistics.median(xs):.2f} ms p90={pct(0.9):.2f} "
            f"p99={pct(0.99):.2f} max={xs[-1]:.2f}")


def one_thread_client(target: str, tenant: str, gap: float) -> float:
    with retrybudget.BudgetClient(retrybudget.ClientOptions(target=target)) as client:
        if gap:
            time.sleep(gap)
        start = time.perf_counter()
        budget = client.tenant(tenant)
        if not budget.wait_ready(10):
            raise SystemExit("no answer within 10 s")
        took = time.perf_counter() - start
        stats = budget.stats()
        if stats.mode != retrybudget.LEASE or stats.tokens_held == 0:
            raise SystemExit(f"the first answer was not a lease: {stats}")
        return took * 1000


async def one_async_client(target: str, tenant: str, gap: float) -> float:
    async with retrybudget.AsyncBudgetClient(retrybudget.ClientOptions(target=target)) as client:
        if gap:
            await asyncio.sleep(gap)
        start = time.perf_counter()
        budget = client.tenant(tenant)
        if not await budget.ready(10):
            raise SystemExit("no answer within 10 s")
        took = time.perf_counter() - start
        stats = budget.stats()
        if stats.mode != retrybudget.LEASE or stats.tokens_held == 0:
            raise SystemExit(f"the first answer was not a lease: {stats}")
        return took * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="")
    parser.add_argument("--server_bin", default="")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--tenant", default="bench-first-lease")
    parser.add_argument("--gap_ms", type=float, default=0,
                        help="wait between creating the client and its tenant handle")
    parser.add_argument("--new_tenants", action="store_true",
                        help="a tenant the server does not know yet for every client (the "
                             "server creates its bucket during the first Sync)")
    args = parser.parse_args()
    if bool(args.target) == bool(args.server_bin):
        parser.error("give exactly one of --target and --server_bin")
    server = None
    directory = None
    if args.server_bin:
        directory = tempfile.TemporaryDirectory(prefix="first-lease-")
        server = ServerProcess(args.server_bin, directory.name).start()
    target = args.target or server.target
    gap = args.gap_ms / 1000
    try:
        print(f"first ever (the server creates the tenant): "
              f"{one_thread_client(target, args.tenant, gap):.2f} ms")
        def tenant(kind: str, i: int) -> str:
            return f"{args.tenant}-{kind}-{i}" if args.new_tenants else args.tenant

        thread_ms = [one_thread_client(target, tenant("thread", i), gap)
                     for i in range(args.clients)]
        print(summary("BudgetClient (thread)", thread_ms))

        async def run_async():
            return [await one_async_client(target, tenant("async", i), gap)
                    for i in range(args.clients)]
        print(summary("AsyncBudgetClient (asyncio)", asyncio.run(run_async())))
    finally:
        if server is not None:
            server.stop()
            directory.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
