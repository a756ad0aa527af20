"""examples/python_worker.py against the real flaky-backend and server: it runs, its calls end
as successes or budget exhaustion, and it reports its budget."""

import os
import re
import subprocess
import sys

import pytest

from conftest import wait_until

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python_worker.py")


def test_python_worker_example_spends_the_budget_then_sheds_retries(start_server, tmp_path):
    backend_bin = os.environ.get("FLAKY_BACKEND_BIN", "")
    if not backend_bin or not os.access(backend_bin, os.X_OK):
        pytest.fail(f"FLAKY_BACKEND_BIN={backend_bin!r} is not an executable")
    server = start_server('tenants { tenant: "flaky-echo" policy { capacity: 10 '
                          'refill_per_second: 0 success_credit: 0 } }\n')
    log = open(tmp_path / "backend.out", "w+")
    backend = subprocess.Popen([backend_bin, "--address=127.0.0.1:0",
                                "--failure_probability=0.5"], stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        def listening():
            log.seek(0)
            m = re.search(r"listening on (127\.0\.0\.1:\d+)", log.read())
            return m and m.group(1)

        address = wait_until(listening, what="the flaky backend")
        out = subprocess.run([sys.executable, EXAMPLE, f"--budget_server={server.target}",
                              f"--backend={address}", "--calls=100", "--interval_ms=0"],
                             capture_output=True, text=True, timeout=120)
    finally:
        backend.kill()
        backend.wait()
        log.close()
    assert out.returncode == 0, out.stderr
    summary = re.search(r"ok=(\d+) .* failed=(\d+) budget_exhausted=(\d+) cancelled=0 \| "
                        r"budget: allowed=(\d+)", out.stdout)
    assert summary, out.stdout
    ok, failed, exhausted, allowed = map(int, summary.groups())
    assert ok + failed + exhausted == 100
    assert exhausted > 0          # half the attempts fail: 10 tokens do not cover them
    assert allowed <= 10          # never more retries than the bucket held
    assert "[budget exhausted]" in out.stdout
