"""The mixed fleet: C++ workers (retry-budget-fleet) and Python workers on one tenant, one real
server, the invariant judged on the counts of both (tools/fleet/mixed_fleet.py)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import server_binary

DRIVER = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "fleet", "mixed_fleet.py")


def run_mixed_fleet(*extra):
    fleet = os.environ.get("RETRY_BUDGET_FLEET_BIN", "")
    if not fleet or not os.access(fleet, os.X_OK):
        pytest.fail(f"RETRY_BUDGET_FLEET_BIN={fleet!r} is not an executable fleet tool")
    # 2 C++ workers x 2 threads and 2 Python workers x 2 threads; every attempt fails, so the
    # fleet wants thousands of retries a second against a bound of a few hundred.
    result = subprocess.run(
        [sys.executable, DRIVER, f"--server-bin={server_binary()}", f"--fleet-bin={fleet}",
         "--cpp-workers=2", "--cpp-threads=2", "--py-workers=2", "--py-threads=2",
         "--failure-rate=1", "--capacity=20", "--refill=60", "--credit=0.01",
         "--lease-ttl-ms=1000", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert result.stdout.strip(), f"no report; exit {result.returncode}: {result.stderr[-2000:]}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return result.returncode, report


def expect_both_languages_counted_and_within(code, r):
    assert code == 0, r
    assert r["within_budget"], r
    assert r["retries_allowed"] <= r["bound"]
    # Both kinds of worker spent from the one budget, and each library agrees with its workers.
    assert r["cpp"]["retries_allowed"] > 0 and r["python"]["retries_allowed"] > 0, r
    assert r["retries_allowed"] == r["cpp"]["retries_allowed"] + r["python"]["retries_allowed"]
    assert r["cpp_library"]["retries_allowed"] == r["cpp"]["retries_allowed"]
    assert r["python"]["lib_retries_allowed"] == r["python"]["retries_allowed"]
    assert r["python"]["lib_tokens_held"] == 0
    assert r["cpp_library"]["tokens_held_at_exit"] == 0
    assert r["python"]["shutdown_status"] == "OK"
    assert r["cpp_library"]["shutdown_status"] == "OK"
    # Behavioural, not a speed test: try_acquire() never waited for the network.
    assert r["python"]["max_try_acquire_ms"] < 50, r["python"]
    assert r["cpp"]["max_try_acquire_ms"] < 50, r["cpp"]


def test_cpp_and_python_workers_share_one_budget_and_spend_at_least_ninety_percent():
    code, r = run_mixed_fleet("--duration=3")
    expect_both_languages_counted_and_within(code, r)
    assert r["fallback_allowance"] == 0
    assert r["utilisation"] >= 0.9, r
    # The budget bound: the fleet wanted far more retries than it was allowed.
    assert r["cpp"]["retries_denied"] + r["python"]["retries_denied"] > 5 * r["retries_allowed"]


def test_server_killed_and_restarted_mid_run_stays_within_leases_plus_fallback():
    code, r = run_mixed_fleet("--duration=4", "--kill-server-after=1", "--restart-after=1.5")
    expect_both_languages_counted_and_within(code, r)
    assert "restart_at_seconds" in r["chaos"], r
    # Both languages fell back, spent within their fallback allowance, and went back to leases.
    assert r["python"]["lib_fallback_allowed"] > 0, r["python"]
    assert r["python"]["lib_fallback_allowed"] <= r["python"]["fallback_allowance"]
    assert r["cpp_fallback"]["library_fallback_allowed"] > 0, r["cpp_fallback"]
    assert r["cpp_fallback"]["library_fallback_allowed"] <= r["cpp"]["fallback_allowance"]
    fallback_spent = (r["python"]["lib_fallback_allowed"]
                      + r["cpp_fallback"]["library_fallback_allowed"])
    assert r["retries_allowed"] - fallback_spent <= r["lease_bound"], r
    assert r["python"]["workers_back_on_lease"] == 2, r["python"]
    assert r["cpp_fallback"]["workers_back_on_lease"] == 2, r["cpp_fallback"]
