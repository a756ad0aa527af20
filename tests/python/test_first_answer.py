"""No denial before the first answer: a new client's first retry is granted when the server holds
tokens (the helpers wait for the tenant's first answer inside their backoff); the wait is bounded
by the deadline and ended by `stop` / task cancellation; an unreachable server gives the
configured fallback, never an open door."""

import asyncio
import socket
import threading

import pytest

import retrybudget
from retrybudget import (AsyncBudgetClient, BudgetClient, BudgetExhausted, ClientOptions,
                         RetryCancelled, RetryDeadlineExceeded, RetryPolicy,
                         async_call_with_retry, call_with_retry)

POLICY = 'tenants { tenant: "t" policy { capacity: 50 refill_per_second: 0 ' \
         'success_credit: 0 lease_ttl_ms: 5000 } }\n'
# Backoffs far shorter than a Sync round trip: without the wait for the first answer, the
# retry would be asked for before any lease could have arrived.
TINY = RetryPolicy(max_attempts=3, initial_backoff=0.0001, max_backoff=0.0001)


def fails_once():
    calls = []

    def fn(attempt):
        calls.append(attempt.number)
        if len(calls) == 1:
            raise ConnectionError("backend down")
        return "ok"
    return fn, calls


def closed_port_target() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


# How long the proxy holds each Sync response in the tests of waits that must end before it.
HELD = 2.0


@pytest.fixture
def held_back(start_server, proxy_to):
    """A real server behind a proxy that holds every Sync response HELD seconds: the first
    answer is far away. Set proxy.delay = 0 to let the rest (the final Sync) through."""
    server = start_server(POLICY)
    proxy = proxy_to(server.target)
    proxy.delay = HELD
    return server, proxy


def test_a_new_clients_first_call_that_fails_once_gets_its_success(start_server):
    server = start_server(POLICY)
    with BudgetClient(ClientOptions(target=server.target)) as client:
        budget = client.tenant("t")  # its first answer is a round trip away: the call is first
        fn, calls = fails_once()
        assert call_with_retry(budget, fn, policy=TINY, timeout=10) == "ok"
        assert calls == [1, 2]
        stats = budget.stats()
        assert stats.retries_allowed == 1
        assert stats.retries_denied == 0
        assert stats.successes == 1
    assert server.get_budget("t").retries_total == 1


@pytest.mark.asyncio
async def test_a_new_async_clients_first_call_that_fails_once_gets_its_success(start_server):
    server = start_server(POLICY)
    async with AsyncBudgetClient(ClientOptions(target=server.target)) as client:
        budget = client.tenant("t")
        assert not budget.is_ready()
        fn, calls = fails_once()

        async def afn(attempt):
            return fn(attempt)

        assert await async_call_with_retry(budget, afn, policy=TINY, timeout=10) == "ok"
        assert calls == [1, 2]
        stats = budget.stats()
        assert (stats.retries_allowed, stats.retries_denied, stats.successes) == (1, 0, 1)
    assert server.get_budget("t").retries_total == 1


def test_wait_ready_returns_once_the_first_lease_is_held(start_server):
    server = start_server(POLICY)
    with BudgetClient(ClientOptions(target=server.target)) as client:
        budget = client.tenant("t")
        assert budget.wait_ready(10)
        stats = budget.stats()
        assert stats.mode == retrybudget.LEASE and stats.tokens_held > 0
        assert budget.try_acquire()


@pytest.mark.asyncio
async def test_await_ready_returns_once_the_first_lease_is_held(start_server):
    server = start_server(POLICY)
    async with AsyncBudgetClient(ClientOptions(target=server.target)) as client:
        budget = client.tenant("t")
        assert not budget.is_ready()
        assert await budget.ready(10)
        assert budget.stats().tokens_held > 0
        assert budget.try_acquire()


def test_first_syncs_of_new_tenants_are_not_held_back_by_the_minimum_interval(start_server):
    server = start_server(POLICY)
    # A minimum interval far longer than the test: only a first Sync can go out in time.
    options = ClientOptions(target=server.target, refresh_period=30, min_sync_interval=30)
    with BudgetClient(options) as client:
        assert client.tenant("a").wait_ready(10)
        second = client.tenant("b")
        assert second.wait_ready(10)
        assert second.stats().mode == retrybudget.LEASE


@pytest.mark.parametrize("fallback,expect_ok,mode", [
    ("local_bucket", True, retrybudget.FALLBACK),
    ("deny", False, retrybudget.DENY_FALLBACK),
])
def test_an_unreachable_server_gives_the_configured_fallback(fallback, expect_ok, mode):
    options = ClientOptions(target=closed_port_target(), fallback=fallback,
                            fallback_capacity=1, fallback_refill_per_second=0,
                            sync_timeout=2)
    with BudgetClient(options) as client:
        budget = client.tenant("t")
        fn, calls = fails_once()
        if expect_ok:
            assert call_with_retry(budget, fn, policy=TINY, timeout=20) == "ok"
        else:
            with pytest.raises(BudgetExhausted):
                call_with_retry(budget, fn, policy=TINY, timeout=20)
        assert budget.is_ready()
        stats = budget.stats()
        assert stats.mode == mode
        assert stats.retries_allowed == (1 if expect_ok else 0)
        assert stats.fallback_allowed == stats.retries_allowed
        # Never more than the fallback bucket held.
        assert not budget.try_acquire()


def test_stop_ends_the_wait_for_the_first_answer_without_taking_a_token(held_back):
    _, proxy = held_back
    with BudgetClient(ClientOptions(target=proxy.target, sync_timeout=30)) as client:
        budget = client.tenant("t")
        stop = threading.Event()
        fn, calls = fails_once()

        def first_fails_then_stop(attempt):
            threading.Timer(0.05, stop.set).start()
            return fn(attempt)

        assert budget.wait_ready(0.05) is False
        with pytest.raises(RetryCancelled):
            call_with_retry(budget, first_fails_then_stop, policy=TINY, stop=stop)
        assert not budget.is_ready()       # it did not wait for the answer
        assert calls == [1]
        stats = budget.stats()
        assert (stats.retries_allowed, stats.retries_denied, stats.refunds) == (0, 0, 0)
        proxy.delay = 0


def test_the_deadline_bounds_the_wait_for_the_first_answer(held_back):
    _, proxy = held_back
    with BudgetClient(ClientOptions(target=proxy.target, sync_timeout=30)) as client:
        budget = client.tenant("t")
        fn, calls = fails_once()
        with pytest.raises(RetryDeadlineExceeded):
            call_with_retry(budget, fn, policy=TINY, timeout=0.3)
        assert not budget.is_ready()
        assert calls == [1]
        assert budget.stats().retries_allowed == 0
        proxy.delay = 0


@pytest.mark.asyncio
async def test_cancelling_the_task_ends_the_wait_for_the_first_answer(held_back):
    _, proxy = held_back
    async with AsyncBudgetClient(ClientOptions(target=proxy.target,
                                               sync_timeout=30)) as client:
        budget = client.tenant("t")
        attempts = []

        async def broken(attempt):
            attempts.append(attempt.number)
            raise ConnectionError("down")

        task = asyncio.create_task(async_call_with_retry(budget, broken, policy=TINY))
        for _ in range(500):
            if attempts:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # now waiting for the first answer
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not budget.is_ready()
        assert attempts == [1]
        stats = budget.stats()
        assert (stats.retries_allowed, stats.refunds) == (0, 0)
        # ready() with a timeout returns False rather than waiting on.
        assert await budget.ready(0.05) is False
        proxy.delay = 0


@pytest.mark.asyncio
async def test_blocking_waits_on_the_async_clients_loop_never_stall_its_refresher(held_back):
    _, proxy = held_back
    async with AsyncBudgetClient(ClientOptions(target=proxy.target)) as client:
        budget = client.tenant("t")
        with pytest.raises(RuntimeError):
            budget.wait_ready(1)
        # The blocking helper on the loop's thread does not wait for the answer (it could not
        # come): the budget decides at once.
        fn, calls = fails_once()
        with pytest.raises(BudgetExhausted):
            call_with_retry(budget, fn, policy=TINY)
        assert calls == [1]
        # From another thread, the wait is allowed and ends with the answer.
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, budget.wait_ready, 30)
        proxy.delay = 0
