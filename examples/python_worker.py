#!/usr/bin/env python3
"""python-worker: a Python worker that calls the flaky backend through the retry helper, with
its retries paid from the fleet's shared budget (retry-budget-server): examples/flaky_backend's
flaky-worker, in Python. C++ and Python workers on one tenant share one budget.

    retry-budget-server --listen=127.0.0.1:50051 &
    flaky-backend --address=127.0.0.1:50061 --failure_probability=0.4 &
    PYTHONPATH=build/client/python/gen:client/python \\
        python3 examples/python_worker.py --budget_server=127.0.0.1:50051 \\
        --backend=127.0.0.1:50061 --calls=200

(With the package installed, `pip install ./client/python`, only build/client/python/gen is
needed on PYTHONPATH, for flaky_pb2.) Each logical call's first attempt is free, every retry
takes a token; a denied retry fails the call at once ("budget exhausted"). Ctrl-C cancels the
call in flight (its backoff) at once, refunding the token it held."""

import argparse
import signal
import sys
import threading

import grpc

import flaky_pb2
import flaky_pb2_grpc
import retrybudget


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget_server", default="127.0.0.1:50051")
    parser.add_argument("--backend", default="127.0.0.1:50061")
    parser.add_argument("--tenant", default="flaky-echo")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--interval_ms", type=int, default=10)
    parser.add_argument("--deadline_ms", type=int, default=2000)
    parser.add_argument("--max_attempts", type=int, default=4)
    parser.add_argument("--initial_backoff_ms", type=int, default=20)
    parser.add_argument("--max_backoff_ms", type=int, default=500)
    args = parser.parse_args()

    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    policy = retrybudget.RetryPolicy(max_attempts=args.max_attempts,
                                     initial_backoff=args.initial_backoff_ms / 1000,
                                     max_backoff=args.max_backoff_ms / 1000)
    counts = {"ok": 0, "failed": 0, "budget_exhausted": 0, "cancelled": 0, "attempts": 0}
    options = retrybudget.ClientOptions(target=args.budget_server)
    with retrybudget.BudgetClient(options) as client, \
            grpc.insecure_channel(args.backend) as channel:
        budget = client.tenant(args.tenant)
        echo = flaky_pb2_grpc.FlakyEchoStub(channel)

        def attempt(a: retrybudget.Attempt):
            counts["attempts"] += 1
            return echo.Echo(flaky_pb2.EchoRequest(message=f"call {i}"), timeout=a.timeout(),
                             metadata=(("x-idempotency-key", a.idempotency_key),))

        for i in range(args.calls):
            if stop.is_set():
                break
            try:
                retrybudget.call_with_retry(budget, attempt, policy=policy,
                                            timeout=args.deadline_ms / 1000, stop=stop)
                counts["ok"] += 1
            except retrybudget.BudgetExhausted as error:
                counts["budget_exhausted"] += 1
                print(f"call {i}: {error.last_error.code().name} [budget exhausted]")
            except retrybudget.RetryCancelled:
                counts["cancelled"] += 1
            except (grpc.RpcError, TimeoutError) as error:
                counts["failed"] += 1
                print(f"call {i}: {error!r}")
            stop.wait(args.interval_ms / 1000)
    stats = budget.stats()  # after the final Sync: unspent tokens returned
    print(f"python-worker: ok={counts['ok']} (in {counts['attempts']} attempts) "
          f"failed={counts['failed']} budget_exhausted={counts['budget_exhausted']} "
          f"cancelled={counts['cancelled']} | budget: allowed={stats.retries_allowed} "
          f"denied={stats.retries_denied} fallback={stats.fallback_allowed} "
          f"returned={stats.tokens_returned}")
    if client.close() is not None:
        print(f"python-worker: final sync: {client.close()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
