"""A refund is a refund, against the real server: a token taken for a retry that is never sent
(a backoff stopped or cancelled) AFTER a Sync reported it spent goes back to the server's bucket,
the server's retries_total counts only the retries sent, and the client's stats add up."""

import asyncio
import threading

import pytest

import retrybudget
from retrybudget import (AsyncBudgetClient, BudgetClient, ClientOptions, RetryCancelled,
                         RetryPolicy, async_call_with_retry, call_with_retry)

from conftest import wait_until

CAPACITY = 20
POLICY = (f'tenants {{ tenant: "t" policy {{ capacity: {CAPACITY} refill_per_second: 0 '
          'success_credit: 0 lease_ttl_ms: 60000 } }\n')
SLOW = RetryPolicy(initial_backoff=30, max_backoff=30)


def options(server):
    # The whole bucket in one lease, a Sync every 50 ms.
    return ClientOptions(target=server.target, refresh_period=0.05, lease_burst=CAPACITY)


def check_stats_add_up(stats):
    leased_spent = stats.retries_allowed - stats.fallback_allowed
    assert stats.tokens_received == leased_spent + stats.tokens_returned + stats.tokens_held, \
        stats


def check_server_whole(server, final_status):
    # The final Sync was accepted (a server that did not know refunds would refuse it: spent
    # 1 + returned 20 > received 20).
    assert final_status is None, final_status
    status = server.get_budget("t")
    assert status.retries_total == 0, status   # no retry was sent
    assert status.refunded_total == 1, status
    assert status.tokens == pytest.approx(CAPACITY), status  # the token is back in the bucket


def test_a_stopped_backoffs_token_reported_spent_goes_back_to_the_servers_bucket(start_server):
    server = start_server(POLICY)
    client = BudgetClient(options(server))
    budget = client.tenant("t")
    wait_until(lambda: budget.stats().tokens_held == CAPACITY, what="the whole bucket leased")
    stop = threading.Event()
    failed = threading.Event()
    result = []

    def broken(attempt):
        failed.set()
        raise ConnectionError("down")

    def call():
        try:
            call_with_retry(budget, broken, policy=SLOW, random=lambda: 0.99, stop=stop)
        except RetryCancelled as error:
            result.append(error)

    caller = threading.Thread(target=call)
    caller.start()
    assert failed.wait(10)
    wait_until(lambda: budget.stats().retries_allowed == 1, what="the token taken")
    # A Sync reported the token spent before the refund.
    wait_until(lambda: server.get_budget("t").retries_total == 1, what="the spend reported")
    stop.set()
    caller.join(10)
    assert len(result) == 1
    stats = budget.stats()
    assert (stats.refunds, stats.retries_allowed, stats.tokens_held) == (1, 0, CAPACITY)
    check_stats_add_up(stats)
    final = client.close()
    stats = budget.stats()
    assert (stats.tokens_received, stats.tokens_returned, stats.tokens_held) == \
        (CAPACITY, CAPACITY, 0)
    check_stats_add_up(stats)
    check_server_whole(server, final)


@pytest.mark.asyncio
async def test_a_cancelled_async_backoffs_token_goes_back_to_the_servers_bucket(start_server):
    server = start_server(POLICY)
    loop = asyncio.get_running_loop()
    client = AsyncBudgetClient(options(server))
    budget = client.tenant("t")
    for _ in range(1000):
        if budget.stats().tokens_held == CAPACITY:
            break
        await asyncio.sleep(0.01)
    assert budget.stats().tokens_held == CAPACITY

    async def broken(attempt):
        raise ConnectionError("down")

    task = asyncio.create_task(async_call_with_retry(budget, broken, policy=SLOW,
                                                     random=lambda: 0.99))
    for _ in range(1000):
        if budget.stats().retries_allowed == 1:
            break
        await asyncio.sleep(0.01)
    # A Sync reported the token spent before the refund (the admin call off the loop).
    for _ in range(1000):
        status = await loop.run_in_executor(None, server.get_budget, "t")
        if status.retries_total == 1:
            break
        await asyncio.sleep(0.01)
    assert status.retries_total == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stats = budget.stats()
    assert (stats.refunds, stats.retries_allowed, stats.tokens_held) == (1, 0, CAPACITY)
    final = await client.close()
    stats = budget.stats()
    assert (stats.tokens_returned, stats.tokens_held) == (CAPACITY, 0)
    check_stats_add_up(stats)
    check_server_whole(server, final)


def test_a_token_refunded_then_spent_again_is_one_retry_sent(start_server):
    server = start_server(POLICY)
    with BudgetClient(options(server)) as client:
        budget = client.tenant("t")
        wait_until(lambda: budget.stats().tokens_held == CAPACITY, what="the whole bucket")
        assert budget.try_acquire()
        wait_until(lambda: server.get_budget("t").retries_total == 1, what="the spend reported")
        budget.refund()
        wait_until(lambda: (server.get_budget("t").refunded_total,
                            server.get_budget("t").retries_total) == (1, 0), what="the refund")
        assert budget.try_acquire()      # the same token spent again: the retry is sent
        wait_until(lambda: server.get_budget("t").retries_total == 1, what="one retry sent")
        check_stats_add_up(budget.stats())
    status = server.get_budget("t")
    assert (status.retries_total, status.refunded_total) == (1, 1), status
    assert status.tokens == pytest.approx(CAPACITY - 1), status


def test_a_fallback_token_refunded_after_its_report_is_reported_as_a_fallback_refund(
        start_server, proxy_to):
    server = start_server('tenants { tenant: "t" policy { capacity: 20 refill_per_second: 0 '
                          'success_credit: 0 lease_ttl_ms: 300 } }\n')
    # Through a proxy that loses responses: the server applies every request while the client
    # sees it unreachable and spends its fallback bucket.
    proxy = proxy_to(server.target)
    client = BudgetClient(ClientOptions(target=proxy.target, refresh_period=0.05,
                                        sync_timeout=0.2))
    budget = client.tenant("t")
    wait_until(lambda: budget.stats().lease_active, what="a lease")
    proxy.drop_next = 1_000_000
    wait_until(lambda: budget.stats().mode == retrybudget.FALLBACK, what="the fallback")
    assert budget.try_acquire()
    assert budget.stats().fallback_allowed == 1

    def seen(predicate):
        return any(predicate(t) for r in list(proxy.requests) for t in r.tenants)

    wait_until(lambda: seen(lambda t: t.fallback_spent == 1), what="the fallback spend reported")
    budget.refund()
    wait_until(lambda: seen(lambda t: t.fallback_refunded == 1), what="the refund reported")
    proxy.drop_next = 0
    wait_until(lambda: budget.stats().mode == retrybudget.LEASE, what="leases again")
    final = client.close()
    assert final is None, final
    stats = budget.stats()
    assert (stats.retries_allowed, stats.fallback_allowed, stats.refunds) == (0, 0, 1)
    check_stats_add_up(stats)
    status = server.get_budget("t")
    assert (status.retries_total, status.fallback_retries_total) == (0, 0), status
    assert (status.refunded_total, status.fallback_refunded_total) == (1, 1), status
