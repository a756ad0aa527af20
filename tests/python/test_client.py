"""The Python client against the real server: leases, the final Sync, options, races."""

import hashlib
import threading
import time

import pytest

import retrybudget
from retrybudget import BudgetClient, ClientOptions, InvalidOptions

from conftest import wait_until

# A bucket that never refills and earns nothing: every token is accounted for.
FIXED = 'tenants {{ tenant: "t" policy {{ capacity: {cap} refill_per_second: 0 ' \
        'success_credit: 0 lease_ttl_ms: {ttl} }} }}\n'


def options(target, **kw):
    kw.setdefault("refresh_period", 0.05)
    return ClientOptions(target=target, **kw)


@pytest.mark.parametrize("field,value,message", [
    ("refresh_period", 0, "options.refresh_period is 0"),
    ("min_sync_interval", 1.0, "options.min_sync_interval is 1.0"),
    ("sync_timeout", -1, "options.sync_timeout is -1"),
    ("max_reconnect_backoff", 0, "options.max_reconnect_backoff is 0"),
    ("lease_burst", -1, "options.lease_burst is -1"),
    ("fallback", "open", "options.fallback is 'open'"),
    ("fallback_capacity", -1.0, "options.fallback_capacity is -1.0"),
    ("fallback_refill_per_second", float("inf"), "options.fallback_refill_per_second is inf"),
    ("bearer_token", "has space", "options.bearer_token has character code 32 at position 3"),
    ("instance_id", "x" * 129, "options.instance_id is"),
    ("target", "", "options.target is ''"),
])
def test_bad_options_are_refused_naming_the_field_and_value(field, value, message):
    with pytest.raises(InvalidOptions) as error:
        BudgetClient(ClientOptions(**{field: value}))
    assert message in str(error.value)


def test_malformed_tenant_name_is_refused(start_server):
    server = start_server()
    with BudgetClient(options(server.target)) as client:
        with pytest.raises(InvalidOptions, match="tenant 'bad name' is malformed"):
            client.tenant("bad name")
        assert client.tenant("ok") is client.tenant("ok")


def test_close_sends_a_final_sync_returning_every_unspent_token(start_server):
    server = start_server(FIXED.format(cap=40, ttl=5000))
    client = BudgetClient(options(server.target, lease_burst=10))
    budget = client.tenant("t")
    wait_until(lambda: budget.stats().lease_active, what="a lease")
    assert budget.try_acquire()
    assert budget.try_acquire()
    held = budget.stats().tokens_held
    assert held > 0
    assert server.get_budget("t").tokens < 40 - 2  # the lease is out of the bucket
    assert client.close() is None
    stats = budget.stats()
    assert stats.retries_allowed == 2
    assert stats.tokens_held == 0
    assert stats.tokens_returned == stats.tokens_received - 2
    assert not budget.try_acquire()  # closed: deny for good
    status = server.get_budget("t")
    assert status.tokens == pytest.approx(38)
    assert status.retries_total == 2
    assert client.close() is None  # idempotent


def test_leaving_a_with_block_returns_the_lease(start_server):
    server = start_server(FIXED.format(cap=30, ttl=5000))
    with BudgetClient(options(server.target)) as client:
        budget = client.tenant("t")
        wait_until(lambda: budget.stats().lease_active, what="a lease")
        assert budget.try_acquire()
    assert server.get_budget("t").tokens == pytest.approx(29)
    with pytest.raises(retrybudget.ClientClosed):
        client.tenant("other")


def test_thirty_two_threads_racing_never_spend_more_than_the_bucket(start_server):
    server = start_server(FIXED.format(cap=200, ttl=5000))
    client = BudgetClient(options(server.target, min_sync_interval=0.001))
    budget = client.tenant("t")
    taken = [0] * 32
    go = threading.Event()

    def worker(i):
        go.wait()
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            if budget.try_acquire():
                taken[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    assert client.close() is None
    spent = sum(taken)
    stats = budget.stats()
    # Counted by the threads themselves, against the bound (no refill, no credit).
    assert spent <= 200
    assert spent >= 150, "the racing threads got far fewer tokens than the bucket held"
    assert stats.retries_allowed == spent
    assert stats.retries_denied > 0
    status = server.get_budget("t")
    assert status.retries_total == spent
    assert status.tokens == pytest.approx(200 - spent)


def test_a_lease_ends_at_send_time_plus_ttl_even_when_the_response_is_late(start_server,
                                                                          proxy_to):
    server = start_server(FIXED.format(cap=50, ttl=300))
    proxy = proxy_to(server.target)
    proxy.delay = 0.45  # every response arrives after the lease it carries has ended
    client = BudgetClient(options(proxy.target, refresh_period=1.0, sync_timeout=2.0))
    budget = client.tenant("t")
    wait_until(lambda: budget.stats().tokens_received > 0, what="a grant")
    stats = budget.stats()
    assert not stats.lease_active
    assert stats.tokens_held == 0
    assert stats.tokens_returned == stats.tokens_received  # taken back, never spendable
    assert not budget.try_acquire()
    proxy.delay = 0
    wait_until(lambda: budget.stats().lease_active, what="a timely lease")
    assert budget.try_acquire()
    client.close()


def test_a_lost_response_is_resent_with_the_same_seq_and_content(start_server, proxy_to):
    server = start_server(FIXED.format(cap=50, ttl=5000))
    proxy = proxy_to(server.target)
    client = BudgetClient(options(proxy.target))
    budget = client.tenant("t")
    wait_until(lambda: budget.stats().lease_active, what="a lease")
    proxy.drop_next = 1
    assert budget.try_acquire()
    wait_until(lambda: proxy.dropped, what="a lost response")
    lost = proxy.dropped[0]
    wait_until(lambda: any(r.seq > lost.seq for r in proxy.requests), what="a later request")
    resent = [r for r in proxy.requests if r.seq == lost.seq]
    assert len(resent) >= 2
    assert all(r.SerializeToString() == lost.SerializeToString() for r in resent)
    assert client.close() is None
    stats = budget.stats()
    # The grant of the lost response was received through the resend, once, and all of it
    # that was not spent went back: the bucket lost exactly the retries spent.
    status = server.get_budget("t")
    assert status.tokens == pytest.approx(50 - stats.retries_allowed)
    assert stats.tokens_returned == stats.tokens_received - stats.retries_allowed


def test_bearer_token_is_sent_and_a_refusal_denies_without_falling_back(start_server):
    digest = hashlib.sha256(b"s3cret-token").hexdigest()
    server = start_server(
        FIXED.format(cap=10, ttl=5000)
        + f'credentials {{ name: "w" token_sha256: "{digest}" tenants: "t" }}\n'
        + f'credentials {{ name: "a" token_sha256: "{hashlib.sha256(b"adm").hexdigest()}" '
          'admin: true }\n')
    with BudgetClient(options(server.target, bearer_token="s3cret-token")) as good:
        budget = good.tenant("t")
        wait_until(lambda: budget.stats().lease_active, what="a lease with the token")
    with BudgetClient(options(server.target, bearer_token="wrong")) as bad:
        budget = bad.tenant("t")
        wait_until(lambda: bad.last_sync_status(), what="a failed Sync")
        assert bad.last_sync_status().startswith("UNAUTHENTICATED") or \
            bad.last_sync_status().startswith("PERMISSION_DENIED")
        time.sleep(0.2)
        assert budget.stats().mode == retrybudget.NO_LEASE
        assert not budget.try_acquire()


def test_metrics_mirror_the_cpp_client_names(start_server):
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    server = start_server(FIXED.format(cap=10, ttl=5000))
    client = BudgetClient(options(server.target, metrics_registry=registry))
    budget = client.tenant("t")
    wait_until(lambda: budget.stats().lease_active, what="a lease")
    assert budget.try_acquire()
    budget.record_success()
    client.close()

    def value(name, **labels):
        return registry.get_sample_value(name, labels)

    assert value("retry_budget_client_retries_allowed_total", tenant="t") == 1
    assert value("retry_budget_client_successes_total", tenant="t") == 1
    assert value("retry_budget_client_syncs_total", result="ok") >= 2
    assert value("retry_budget_client_tokens_held", tenant="t") == 0
    assert value("retry_budget_client_mode", tenant="t", mode="no_lease") == 1
