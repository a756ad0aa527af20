"""The Python client when the server is unreachable: fallback, never failing open."""

import socket


import retrybudget
from retrybudget import BudgetClient, ClientOptions

from conftest import wait_until


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_client_that_never_reached_a_server_gets_the_configured_bucket_only():
    o = ClientOptions(target=f"127.0.0.1:{unused_port()}", refresh_period=0.05,
                      sync_timeout=0.2, fallback_capacity=2, fallback_refill_per_second=0)
    with BudgetClient(o) as client:
        budget = client.tenant("t")
        wait_until(lambda: budget.stats().mode == retrybudget.FALLBACK, what="fallback")
        allowed = sum(budget.try_acquire() for _ in range(100))
        assert allowed == 2
        stats = budget.stats()
        assert stats.fallback_allowed == 2
        assert stats.retries_denied == 98
    # Nothing could be reported: close() says so.


def test_deny_mode_allows_nothing_while_the_server_is_unreachable():
    o = ClientOptions(target=f"127.0.0.1:{unused_port()}", refresh_period=0.05,
                      sync_timeout=0.2, fallback="deny")
    with BudgetClient(o) as client:
        budget = client.tenant("t")
        wait_until(lambda: budget.stats().mode == retrybudget.DENY_FALLBACK, what="deny")
        assert not any(budget.try_acquire() for _ in range(100))


def test_killed_server_means_fallback_to_the_safe_share_and_a_restart_means_leases(
        start_server):
    # Capacity 8, no refill: this one instance's safe share is the whole bucket.
    server = start_server('tenants { tenant: "t" policy { capacity: 8 refill_per_second: 0 '
                          'success_credit: 0 lease_ttl_ms: 300 } }\n')
    o = ClientOptions(target=server.target, refresh_period=0.05, sync_timeout=0.3,
                      fallback_capacity=0, fallback_refill_per_second=0)
    client = BudgetClient(o)
    budget = client.tenant("t")
    wait_until(lambda: budget.stats().lease_active, what="a lease")
    server.kill()
    wait_until(lambda: budget.stats().mode == retrybudget.FALLBACK, timeout=5,
               what="fallback after the kill")
    in_fallback = sum(budget.try_acquire() for _ in range(100))
    # The safe share (capacity 8 for the only instance), not the configured 0, and never more.
    assert 1 <= in_fallback <= 8
    assert budget.stats().fallback_allowed == in_fallback
    server.restart()
    wait_until(lambda: budget.stats().mode == retrybudget.LEASE, timeout=10,
               what="a lease after the restart")
    assert client.close() is None
    stats = budget.stats()
    assert stats.fallback_allowed == in_fallback
    assert stats.tokens_held == 0
