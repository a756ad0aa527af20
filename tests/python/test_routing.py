"""The Python client in front of a cluster (thread and asyncio): tenants synced with the server
that owns their shard, learnt from redirects. The servers here are in-process fakes of the
cluster's answers (fake_cluster.py); the end-to-end tests with real servers on etcd live with
the cluster tests."""

import asyncio
import time

import pytest

from retrybudget import BudgetClient, ClientOptions
from retrybudget._sync_engine import MAX_REDIRECT_HOPS
from retrybudget.options import channel_options
from retrybudget.aio import AsyncBudgetClient

from conftest import wait_until
from fake_cluster import FakeCluster


@pytest.fixture
def cluster():
    c = FakeCluster()
    yield c
    c.stop()


def options(target: str, **kw) -> ClientOptions:
    return ClientOptions(target=target, instance_id="routing-test", refresh_period=0.1,
                         sync_timeout=1.0, **kw)


def tenants_of(request):
    return [t.tenant for t in request.tenants]


def test_redirected_tenant_is_synced_with_its_owner(cluster):
    s1, s2, s3 = cluster.addresses
    cluster.owner.update({"a": s1, "b": s2, "c": s3, "d": s2})
    with BudgetClient(options(s1)) as client:
        budgets = {name: client.tenant(name) for name in "abcd"}
        wait_until(lambda: all(b.stats().mode == "lease" for b in budgets.values()),
                   what="every tenant leased")
        assert budgets["b"].try_acquire()
        mark = len(cluster.all_received())
        time.sleep(0.5)
        later = cluster.all_received()[mark:]
    # Once redirected, each server gets only its own tenants: one Sync per owner per refresh.
    for address, request in later:
        if request.final:
            continue
        expected = {s1: {"a"}, s2: {"b", "d"}, s3: {"c"}}[address]
        assert set(tenants_of(request)) <= expected, (address, tenants_of(request))


def test_seq_increases_across_servers_and_final_reaches_every_owner(cluster):
    s1, s2, s3 = cluster.addresses
    cluster.owner.update({"a": s1, "b": s2, "c": s3})
    client = BudgetClient(options(s1))
    budgets = [client.tenant(name) for name in "abc"]
    wait_until(lambda: all(b.stats().mode == "lease" for b in budgets), what="leased")
    assert client.close() is None
    seqs = [r.seq for _, r in cluster.all_received()]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for address, tenant in ((s1, "a"), (s2, "b"), (s3, "c")):
        last = cluster.requests_to(address)[-1]
        assert last.final and tenants_of(last) == [tenant], address


def test_shard_without_owner_keeps_the_lease_then_falls_back(cluster):
    s1, s2, s3 = cluster.addresses
    cluster.lease_ttl_ms = 800
    cluster.owner["a"] = s2
    with BudgetClient(options(s1)) as client:
        a = client.tenant("a")
        wait_until(lambda: a.stats().mode == "lease", what="leased")
        leased_at = time.monotonic()
        cluster.owner["a"] = ""  # s2 lost the shard; no owner yet
        wait_until(lambda: a.stats().mode != "lease", what="lease ended")
        assert time.monotonic() - leased_at >= 0.5  # kept to its expiry, not dropped at once
        assert a.stats().mode == "fallback"  # never fail open
        cluster.owner["a"] = s3  # a new owner: redirected there, leased again
        wait_until(lambda: a.stats().mode == "lease", what="leased by the new owner")
        assert cluster.requests_to(s3)


def test_redirect_loop_is_bounded(cluster):
    s1, s2, _ = cluster.addresses
    cluster.owner["a"] = s2
    cluster.claims[(s2, "a")] = s1  # s1 says s2, s2 says s1
    with BudgetClient(options(s1)) as client:
        a = client.tenant("a")
        time.sleep(1.0)
        assert a.stats().mode == "fallback"
        # About one redirect chain per refresh period (0.1 s), never a busy loop.
        assert len(cluster.all_received()) <= (MAX_REDIRECT_HOPS + 1) * 12


def test_multi_address_target_skips_a_dead_address(cluster):
    s1 = cluster.addresses[0]
    dead = FakeCluster(servers=1)
    dead_address = dead.addresses[0]
    dead.stop()
    target = f"ipv4:{dead_address},{s1}"
    with BudgetClient(options(target)) as client:
        a = client.tenant("a")
        wait_until(lambda: a.stats().mode == "lease", what="leased through the live address")


@pytest.mark.asyncio
async def test_asyncio_client_follows_redirects_and_final_reaches_every_owner(cluster):
    s1, s2, s3 = cluster.addresses
    cluster.owner.update({"a": s1, "b": s2, "c": s3})
    client = AsyncBudgetClient(options(s1))
    budgets = [client.tenant(name) for name in "abc"]
    for _ in range(200):
        if all(b.stats().mode == "lease" for b in budgets):
            break
        await asyncio.sleep(0.02)
    assert all(b.stats().mode == "lease" for b in budgets)
    assert await client.close() is None
    for address, tenant in ((s1, "a"), (s2, "b"), (s3, "c")):
        last = cluster.requests_to(address)[-1]
        assert last.final and tenants_of(last) == [tenant], address


def test_redirects_are_counted(cluster):
    from prometheus_client import CollectorRegistry
    s1, s2, s3 = cluster.addresses
    cluster.owner.update({"a": s2, "b": s3})
    registry = CollectorRegistry()
    with BudgetClient(options(s1, metrics_registry=registry)) as client:
        budgets = [client.tenant(name) for name in "ab"]
        wait_until(lambda: all(b.stats().mode == "lease" for b in budgets), what="leased")
        assert registry.get_sample_value("retry_budget_client_redirects_total") == 2


def test_dns_target(cluster):
    # localhost may resolve to ::1 as well, where nothing listens: round_robin skips it.
    port = cluster.servers[0].port
    with BudgetClient(options(f"dns:///localhost:{port}")) as client:
        a = client.tenant("a")
        wait_until(lambda: a.stats().mode == "lease", what="leased through a dns target")


def test_unreachable_owner_sends_its_tenants_back_to_the_target(cluster):
    s1, s2, s3 = cluster.addresses
    cluster.owner["a"] = s2
    with BudgetClient(options(s1)) as client:
        a = client.tenant("a")
        wait_until(lambda: a.stats().mode == "lease", what="leased by s2")
        cluster.servers[1].stop()  # s2 dies; s3 takes the shard over
        cluster.owner["a"] = s3
        received_before = a.stats().tokens_received
        wait_until(lambda: a.try_acquire() is not None and cluster.requests_to(s3)
                   and a.stats().tokens_received > received_before,
                   what="leased by s3 after s2 died")
        assert a.stats().mode == "lease"


def test_main_channel_is_round_robin_and_owner_channels_pick_first():
    o = options("ipv4:127.0.0.1:1,127.0.0.1:2")
    assert ("grpc.lb_policy_name", "round_robin") in channel_options(o)
    assert all(name != "grpc.lb_policy_name" for name, _ in channel_options(o, main=False))


def test_syncs_of_a_multi_address_target_reach_every_server(cluster):
    target = "ipv4:" + ",".join(cluster.addresses)
    with BudgetClient(options(target)) as client:
        a = client.tenant("a")  # no owner listed: whoever is asked grants it
        wait_until(lambda: a.try_acquire() is not None and
                   {address for address, _ in cluster.all_received()} == set(cluster.addresses),
                   what="Syncs on every address of the target")


def test_hung_first_address_holds_only_the_syncs_sent_to_it(cluster):
    s1, s2, s3 = cluster.addresses
    cluster.owner["a"] = s1
    with BudgetClient(options(f"ipv4:{s1},{s2},{s3}")) as client:
        a = client.tenant("a")
        # A few Syncs: those of the target that reach s2 or s3 are redirected to s1.
        wait_until(lambda: a.stats().mode == "lease" and
                   sum(tenants_of(r) == ["a"] for _, r in cluster.all_received()) >= 4,
                   what="leased by s1")
        cluster.hang(s1)  # paused, connections open; s2 takes the shard over
        cluster.owner["a"] = s2
        hung_at = time.monotonic()
        sent_to_s2 = len(cluster.requests_to(s2))
        received = a.stats().tokens_received
        try:
            # The owner route fails for sync_timeout (1 s) plus a refresh period, then the
            # target's Syncs: one of them at most waits out sync_timeout on s1.
            wait_until(lambda: a.try_acquire() is not None and
                       a.stats().tokens_received > received and
                       any(tenants_of(r) == ["a"] for r in cluster.requests_to(s2)[sent_to_s2:]),
                       timeout=5.0, what="leased by s2 while s1 hangs")
            print(f"leased by s2 {time.monotonic() - hung_at:.2f} s after s1 hung")
        finally:
            cluster.resume(s1)
