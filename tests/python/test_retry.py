"""The retry helpers (blocking and asyncio), the tenacity hooks and AsyncBudgetClient."""

import asyncio
import threading

import pytest
import tenacity

import retrybudget
from retrybudget import (AsyncBudgetClient, BudgetClient, BudgetExhausted, ClientOptions,
                         RetryCancelled, RetryDeadlineExceeded, RetryPolicy,
                         async_call_with_retry, call_with_retry)
from retrybudget.tenacity import retry_if_budget_allows, stop_when_budget_exhausted

from conftest import wait_until

POLICY = 'tenants {{ tenant: "t" policy {{ capacity: {cap} refill_per_second: 0 ' \
         'success_credit: 0 lease_ttl_ms: 5000 }} }}\n'
FAST = RetryPolicy(max_attempts=10, initial_backoff=0.001, max_backoff=0.002)


@pytest.fixture
def leased(start_server):
    """leased(capacity, lease_burst) -> (client, budget) holding a lease."""
    clients = []

    def make(capacity=100, lease_burst=20):
        server = start_server(POLICY.format(cap=capacity))
        client = BudgetClient(ClientOptions(target=server.target, refresh_period=0.05,
                                            lease_burst=lease_burst))
        clients.append(client)
        budget = client.tenant("t")
        wait_until(lambda: budget.stats().lease_active, what="a lease")
        return client, budget

    yield make
    for client in clients:
        client.close()


def test_retries_until_success_with_one_idempotency_key_and_one_success(leased):
    _, budget = leased()
    keys = []

    def flaky(attempt):
        keys.append(attempt.idempotency_key)
        if attempt.number < 3:
            raise ConnectionError("backend down")
        return "row"

    assert call_with_retry(budget, flaky, policy=FAST) == "row"
    assert len(keys) == 3 and len(set(keys)) == 1
    stats = budget.stats()
    assert stats.retries_allowed == 2
    assert stats.successes == 1


def test_a_denied_retry_raises_budget_exhausted_from_the_last_error(leased):
    _, budget = leased(capacity=3, lease_burst=3)
    wait_until(lambda: budget.stats().tokens_held == 3, what="three tokens")

    def broken(attempt):
        raise ConnectionError(f"attempt {attempt.number}")

    with pytest.raises(BudgetExhausted) as error:
        call_with_retry(budget, broken, policy=FAST)
    assert isinstance(error.value.last_error, ConnectionError)
    assert error.value.__cause__ is error.value.last_error
    assert error.value.attempts == 4  # three retries from three tokens, then denied
    assert budget.stats().retries_allowed == 3


def test_non_retryable_errors_and_inner_budget_exhaustion_are_not_retried(leased):
    _, budget = leased()
    with pytest.raises(ValueError):
        call_with_retry(budget, lambda a: (_ for _ in ()).throw(ValueError("bad")), policy=FAST)
    inner = BudgetExhausted(ConnectionError("inner"), 2)
    with pytest.raises(BudgetExhausted) as error:
        call_with_retry(budget, lambda a: (_ for _ in ()).throw(inner), policy=FAST)
    assert error.value is inner
    assert budget.stats().retries_allowed == 0


def test_stop_during_a_backoff_refunds_the_token_and_raises_cancelled(leased):
    _, budget = leased()
    stop = threading.Event()
    slow = RetryPolicy(initial_backoff=30, max_backoff=30)

    def broken(attempt):
        threading.Timer(0.1, stop.set).start()
        raise ConnectionError("down")

    with pytest.raises(RetryCancelled):
        call_with_retry(budget, broken, policy=slow, random=lambda: 0.99, stop=stop)
    stats = budget.stats()
    assert stats.refunds == 1
    assert stats.retries_allowed == 0


def test_a_backoff_that_would_cross_the_deadline_takes_no_token(leased):
    _, budget = leased()
    slow = RetryPolicy(initial_backoff=10, max_backoff=10)
    with pytest.raises(RetryDeadlineExceeded):
        call_with_retry(budget, lambda a: (_ for _ in ()).throw(ConnectionError("x")),
                        policy=slow, timeout=0.5, random=lambda: 0.5)
    assert budget.stats().retries_allowed == 0


def test_bad_retry_policy_is_refused_before_any_attempt(leased):
    _, budget = leased()
    with pytest.raises(retrybudget.InvalidOptions, match="policy.max_attempts is 0"):
        call_with_retry(budget, lambda a: 1, policy=RetryPolicy(max_attempts=0))


def test_tenacity_retry_condition_spends_one_token_per_retry_and_records_success(leased):
    _, budget = leased(capacity=5, lease_burst=5)
    wait_until(lambda: budget.stats().tokens_held == 5, what="five tokens")
    calls = []

    @tenacity.retry(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_none(),
                    retry=retry_if_budget_allows(
                        budget, tenacity.retry_if_exception_type(ConnectionError)),
                    reraise=True)
    def sometimes():
        calls.append(1)
        if len(calls) % 3:
            raise ConnectionError("down")
        return "ok"

    assert sometimes() == "ok"           # attempts 1, 2 fail; 3 succeeds: 2 tokens
    assert budget.stats().successes == 1

    @tenacity.retry(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_none(),
                    retry=retry_if_budget_allows(budget), reraise=True)
    def three_failures():
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        three_failures()                 # 2 retries; the third failure stops: no token for it
    assert budget.stats().retries_allowed == 4

    @tenacity.retry(wait=tenacity.wait_none(),
                    retry=retry_if_budget_allows(budget))
    def always_down():
        raise ConnectionError("down")

    with pytest.raises(BudgetExhausted) as error:
        always_down()
    assert isinstance(error.value.last_error, ConnectionError)
    assert budget.stats().retries_allowed == 5
    assert budget.stats().tokens_held == 0


def test_tenacity_stop_condition_denies_with_budget_exhausted(leased):
    _, budget = leased(capacity=2, lease_burst=2)
    wait_until(lambda: budget.stats().tokens_held == 2, what="two tokens")

    @tenacity.retry(stop=tenacity.stop_after_attempt(10) | stop_when_budget_exhausted(budget),
                    wait=tenacity.wait_none())
    def always_down():
        raise ConnectionError("down")

    with pytest.raises(BudgetExhausted):
        always_down()
    assert budget.stats().retries_allowed == 2


@pytest.mark.asyncio
async def test_async_client_leases_and_many_coroutines_share_it(start_server):
    server = start_server(POLICY.format(cap=60))
    async with AsyncBudgetClient(ClientOptions(target=server.target, refresh_period=0.05,
                                               lease_burst=10)) as client:
        budget = client.tenant("t")
        for _ in range(500):
            if budget.stats().lease_active:
                break
            await asyncio.sleep(0.01)
        assert budget.stats().lease_active
        allowed = 0

        async def worker():
            nonlocal allowed
            for _ in range(100):
                if budget.try_acquire():
                    allowed += 1
                await asyncio.sleep(0.001)

        await asyncio.gather(*(worker() for _ in range(20)))
        assert 0 < allowed <= 60
    assert budget.stats().tokens_held == 0
    status = server.get_budget("t")
    assert status.tokens == pytest.approx(60 - allowed)
    assert status.retries_total == allowed


@pytest.mark.asyncio
async def test_cancelling_the_task_waiting_in_the_backoff_refunds_the_token(start_server):
    server = start_server(POLICY.format(cap=60))
    async with AsyncBudgetClient(ClientOptions(target=server.target,
                                               refresh_period=0.05)) as client:
        budget = client.tenant("t")
        for _ in range(500):
            if budget.stats().lease_active:
                break
            await asyncio.sleep(0.01)
        attempts = []

        async def broken(attempt):
            attempts.append(attempt.number)
            raise ConnectionError("down")

        task = asyncio.create_task(async_call_with_retry(
            budget, broken, policy=RetryPolicy(initial_backoff=30, max_backoff=30),
            random=lambda: 0.99))
        while not attempts:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # now in the backoff, holding a token
        assert budget.stats().retries_allowed == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stats = budget.stats()
        assert stats.refunds == 1
        assert stats.retries_allowed == 0
        assert attempts == [1]
    # A Sync during the backoff may have reported the token spent; the refund is reported too
    # and the token returned: the server counts no retry sent.
    assert server.get_budget("t").retries_total == 0


@pytest.mark.asyncio
async def test_async_client_falls_back_when_the_server_is_killed_and_returns_to_leases(
        start_server):
    server = start_server('tenants { tenant: "t" policy { capacity: 8 refill_per_second: 0 '
                          'success_credit: 0 lease_ttl_ms: 300 } }\n')

    async def until(predicate, timeout=10.0):
        for _ in range(int(timeout / 0.01)):
            if predicate():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out")

    async with AsyncBudgetClient(ClientOptions(target=server.target, refresh_period=0.05,
                                               sync_timeout=0.3, fallback_capacity=0,
                                               fallback_refill_per_second=0)) as client:
        budget = client.tenant("t")
        await until(lambda: budget.stats().lease_active)
        server.kill()
        await until(lambda: budget.stats().mode == retrybudget.FALLBACK, timeout=5)
        in_fallback = sum(budget.try_acquire() for _ in range(100))
        assert 1 <= in_fallback <= 8  # the safe share, never more
        # restart() blocks; run it off the loop so the refresher task keeps going.
        await asyncio.get_running_loop().run_in_executor(None, server.restart)
        await until(lambda: budget.stats().mode == retrybudget.LEASE)
    assert await client.close() is None
    stats = budget.stats()
    assert stats.fallback_allowed == in_fallback
    assert stats.tokens_held == 0
