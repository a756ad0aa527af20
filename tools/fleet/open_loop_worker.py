#!/usr/bin/env python3
"""The Python open-loop worker of bench/metastable.py's fleet (docs/BENCHMARKS.md 13): the
protocol of bench/metastable_worker.cc with the fleet strategy and immediate resends, on the
retrybudget package (the Go and Node workers' open-loop modes are tools/fleet/go_worker/
open_loop.go and tools/fleet/js_worker/open-loop.mjs).

    PYTHONPATH=build/client/python/gen:client/python python3 tools/fleet/open_loop_worker.py \\
        --backend=TARGET --server=BUDGET --tenant=T --rate=R --phase=P --epoch-ms=E \\
        --duration=SECONDS --timeout-ms=MS --max-attempts=N

It waits for the tenant's first answer (wait_ready), prints {"ready":true}, then from the epoch
for DURATION starts R logical calls per second (one every 1/R s, shifted by P of an interval),
whatever happened to earlier ones. A call is attempts of the backend's Work RPC (grpc futures),
each with a deadline of MS; a failed attempt is resent at once while attempts remain and
try_acquire() allows (a denied resend ends the call as failed); a success calls
record_success(). One JSON line per second ({"t":T,"offered","ok","failed","attempts","retries",
"denied"}, printed once the second is 2 s old), then {"totals":{...}}. Closing stdin stops the
calls early. The Work request is encoded by hand (field 1, attempt, a varint): no generated code
of bench/metastable.proto is needed.
"""

import argparse
import sys
import threading
import time

WORK = "/retrybudget.bench.MetastableBackend/Work"
KEYS = ("offered", "ok", "failed", "attempts", "retries", "denied")


class Rows:
    """Per-second rows from the epoch. Thread-safe."""

    def __init__(self, epoch):
        self.epoch = epoch
        self.lock = threading.Lock()
        self.rows = {}
        self.totals = dict.fromkeys(KEYS, 0)
        self.in_flight = 0

    def add(self, **delta):
        t = int((time.time() - self.epoch) // 1)
        with self.lock:
            row = self.rows.setdefault(t, dict.fromkeys(KEYS, 0))
            for k, v in delta.items():
                row[k] += v
                self.totals[k] += v

    @staticmethod
    def fields(row):
        return ",".join(f'"{k}":{row[k]}' for k in KEYS)

    def print_before(self, before):
        with self.lock:
            for t in sorted(self.rows):
                if t >= before:
                    break
                print(f'{{"t":{t},{self.fields(self.rows.pop(t))}}}', flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--tenant", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--phase", type=float, default=0)
    ap.add_argument("--epoch-ms", type=int, required=True)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--timeout-ms", type=int, default=1000)
    ap.add_argument("--max-attempts", type=int, default=5)
    a = ap.parse_args()
    if not a.rate > 0 or not 0 <= a.phase < 1 or a.max_attempts < 1 or a.timeout_ms < 1:
        ap.error(f"--rate={a.rate} --phase={a.phase} --max-attempts={a.max_attempts} "
                 f"--timeout-ms={a.timeout_ms}: need rate > 0, phase in [0, 1), attempts >= 1, "
                 "timeout >= 1")
    import grpc
    import retrybudget

    client = retrybudget.BudgetClient(retrybudget.ClientOptions(target=a.server))
    budget = client.tenant(a.tenant)
    if not budget.wait_ready(10):
        print("open_loop_worker: no answer from the budget server within 10 s", file=sys.stderr)
        return 1
    channel = grpc.insecure_channel(a.backend)
    work = channel.unary_unary(WORK)  # bytes in, bytes out
    epoch = a.epoch_ms / 1000.0
    rows = Rows(epoch)
    print('{"ready":true}', flush=True)

    stop = threading.Event()

    def watch_stdin():
        while sys.stdin.buffer.read1(4096):
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    done = threading.Event()
    idle = threading.Condition()

    def printer():
        while not done.wait(0.25):
            rows.print_before(int(time.time() - epoch) - 2)

    printing = threading.Thread(target=printer)
    printing.start()

    def end_call():
        with idle:
            rows.in_flight -= 1
            idle.notify_all()

    def send(n):
        rows.add(attempts=1, retries=1 if n > 1 else 0)
        future = work.future(bytes([0x08, n]), timeout=a.timeout_ms / 1000.0)
        future.add_done_callback(lambda f: on_done(f, n))

    def on_done(future, n):
        if future.code() == grpc.StatusCode.OK:
            budget.record_success()
            rows.add(ok=1)
            end_call()
        elif n >= a.max_attempts:
            rows.add(failed=1)
            end_call()
        elif not budget.try_acquire():
            rows.add(denied=1, failed=1)
            end_call()
        else:
            send(n + 1)

    interval = 1.0 / a.rate
    first = epoch + a.phase * interval
    end = epoch + a.duration
    i = 0
    while True:
        at = first + i * interval
        if at >= end or stop.is_set():
            break
        wait = at - time.time()
        if wait > 0:
            time.sleep(wait)
        with idle:
            rows.in_flight += 1
        rows.add(offered=1)
        send(1)
        i += 1
    with idle:
        idle.wait_for(lambda: rows.in_flight == 0)
    done.set()
    printing.join()
    rows.print_before(1 << 62)
    print(f'{{"totals":{{{Rows.fields(rows.totals)}}}}}', flush=True)
    channel.close()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
