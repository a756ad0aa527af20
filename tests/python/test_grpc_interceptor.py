"""The gRPC client interceptors (BudgetInterceptor, AioBudgetInterceptor) against the real
budget server, in front of a real gRPC backend in this process (a BudgetAdminService whose
GetBudget follows a script: fail with a code, fail with a pushback, answer slowly, answer)."""

import asyncio
import threading
import time
from concurrent import futures
from typing import List, NamedTuple, Optional

import grpc
import grpc.aio
import pytest

import retrybudget
from retrybudget import (AsyncBudgetClient, BudgetClient, BudgetExhausted, ClientOptions,
                         RetryDeadlineExceeded, RetryPolicy)
from retrybudget._proto import budget_pb2, budget_pb2_grpc

POLICY = ('tenants { tenant: "t" policy { capacity: 100 refill_per_second: 0 '
          'success_credit: 0 lease_ttl_ms: 60000 } }\n'
          'tenants { tenant: "empty" policy { capacity: 10 initial_tokens: 0 '
          'refill_per_second: 0 success_credit: 0 } }\n')
FAST = RetryPolicy(max_attempts=5, initial_backoff=0.001, max_backoff=0.002)
REQUEST = budget_pb2.GetBudgetRequest(tenant="backend")
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class Seen(NamedTuple):
    """One attempt as the backend received it."""
    metadata: dict
    arrived: float            # time.monotonic()
    time_remaining: Optional[float]


def fail(code=UNAVAILABLE, pushback_ms: Optional[str] = None):
    def step(context):
        if pushback_ms is not None:
            context.set_trailing_metadata(((retrybudget.RETRY_PUSHBACK_HEADER, pushback_ms),))
        context.set_code(code)
        context.set_details(f"scripted {code.name}")
        return budget_pb2.GetBudgetResponse()
    return step


def answer(context):
    return budget_pb2.GetBudgetResponse(budget=budget_pb2.BudgetStatus(tenant="answered"))


def slow(seconds: float):
    """Answers after `seconds`, or gives up as soon as the caller's deadline passed."""
    def step(context):
        end = time.monotonic() + seconds
        while context.is_active() and time.monotonic() < end:
            time.sleep(0.005)
        return answer(context)
    return step


class Backend(budget_pb2_grpc.BudgetAdminServiceServicer):
    """A gRPC server on 127.0.0.1:0 whose GetBudget runs script[n] for its n-th call (the last
    step for every later one) and records each call."""

    def __init__(self, script):
        self._script = script
        self._lock = threading.Lock()
        self.seen: List[Seen] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        budget_pb2_grpc.add_BudgetAdminServiceServicer_to_server(self, self._server)
        self.target = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def GetBudget(self, request, context):  # noqa: N802 - the generated name
        with self._lock:
            n = len(self.seen)
            self.seen.append(Seen(dict(context.invocation_metadata()), time.monotonic(),
                                  context.time_remaining()))
        return self._script[min(n, len(self._script) - 1)](context)

    def keys(self):
        return [s.metadata.get(retrybudget.IDEMPOTENCY_KEY_HEADER) for s in self.seen]

    def previous_attempts(self):
        return [s.metadata.get(retrybudget.PREVIOUS_ATTEMPTS_HEADER) for s in self.seen]

    def stop(self):
        self._server.stop(0)


@pytest.fixture
def backend():
    started = []

    def make(*script) -> Backend:
        b = Backend(list(script))
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


def client_options(server):
    # Leases of 20 tokens: enough for a first retry of cost 10.
    return ClientOptions(target=server.target, refresh_period=0.05, lease_burst=20)


def blocking_stub(backend_target, *interceptors):
    channel = grpc.intercept_channel(
        grpc.insecure_channel(backend_target, options=retrybudget.DISABLE_GRPC_RETRIES),
        *interceptors)
    return channel, budget_pb2_grpc.BudgetAdminServiceStub(channel)


def test_retries_until_success_each_attempt_with_one_key_and_the_server_counts_the_tokens(
        start_server, backend):
    server = start_server(POLICY)
    b = backend(fail(UNAVAILABLE), fail(grpc.StatusCode.ABORTED), answer)
    client = BudgetClient(client_options(server))
    budget = client.tenant("t")  # no wait: the first retry waits for the tenant's first answer
    channel, stub = blocking_stub(b.target, retrybudget.BudgetInterceptor(budget, FAST))
    with channel:
        reply, call = stub.GetBudget.with_call(REQUEST, timeout=10,
                                               metadata=(("x-caller", "me"),))
    assert reply.budget.tenant == "answered"
    assert call.code() == grpc.StatusCode.OK
    keys = b.keys()
    assert len(keys) == 3 and len(set(keys)) == 1 and len(keys[0]) == 32, keys
    assert b.previous_attempts() == [None, "1", "2"]
    assert all(s.metadata.get("x-caller") == "me" for s in b.seen)
    stats = budget.stats()
    assert (stats.requests, stats.retries_allowed, stats.retries_denied, stats.successes) == \
        (1, 2, 0, 1), stats
    assert client.close() is None
    # (The request may have gone into the instance's first report, a baseline the server
    # records without counting: the server's requests_total is not asserted here.)
    status = server.get_budget("t")
    assert (status.retries_total, status.retries_allowed_total, status.successes_total) == \
        (2, 2, 1), status


def test_aws_costs_take_5_tokens_after_an_error_and_10_after_an_attempts_timeout(
        start_server, backend):
    server = start_server(POLICY)
    # Attempt 1 UNAVAILABLE (a retry of 5), attempt 2 outlives its own 0.3 s (DEADLINE_EXCEEDED
    # with the call's deadline far: a retry of 10), attempt 3 answers.
    b = backend(fail(UNAVAILABLE), slow(30), answer)
    client = BudgetClient(client_options(server))
    budget = client.tenant("t")
    policy = RetryPolicy(max_attempts=5, initial_backoff=0.001, max_backoff=0.002,
                         per_attempt_timeout=0.3, cost=retrybudget.aws_cost)
    channel, stub = blocking_stub(b.target, retrybudget.BudgetInterceptor(budget, policy))
    with channel:
        reply = stub.GetBudget(REQUEST, timeout=20,
                               metadata=((retrybudget.IDEMPOTENCY_KEY_HEADER, "caller-key"),))
    assert reply.budget.tenant == "answered"
    assert b.keys() == ["caller-key"] * 3  # the caller's own key, on every attempt
    assert all(s.time_remaining <= 0.305 for s in b.seen), b.seen
    stats = budget.stats()
    assert (stats.retries_allowed, stats.tokens_spent) == (2, 15), stats
    assert client.close() is None
    status = server.get_budget("t")
    assert (status.retries_allowed_total, status.retries_total) == (2, 15), status


def test_an_empty_tenant_denies_the_first_retry_with_the_last_status_marked(
        start_server, backend):
    server = start_server(POLICY)
    b = backend(fail(UNAVAILABLE, pushback_ms="1"))
    with BudgetClient(client_options(server)) as client:
        empty = client.tenant("empty")
        channel, stub = blocking_stub(b.target, retrybudget.BudgetInterceptor(empty, FAST))
        with channel:
            with pytest.raises(grpc.RpcError) as raised:
                stub.GetBudget(REQUEST, timeout=10)
            future = stub.GetBudget.future(REQUEST, timeout=10)
            assert isinstance(future.exception(), BudgetExhausted)
        error = raised.value
        assert isinstance(error, BudgetExhausted) and error.attempts == 1
        assert error.code() == UNAVAILABLE
        assert error.details() == "scripted UNAVAILABLE (retry budget exhausted after 1 " \
                                  "attempt(s))"
        assert (retrybudget.BUDGET_EXHAUSTED_TRAILER, "1") in error.trailing_metadata()
        assert error.last_error.code() == UNAVAILABLE
        assert len(b.seen) == 2  # one attempt per call
        stats = empty.stats()
        assert (stats.requests, stats.retries_allowed, stats.retries_denied) == (2, 0, 2)

        # Stacked layers do not multiply: an outer interceptor with tokens does not retry a
        # call its inner layer's budget denied.
        rich = client.tenant("t")
        rich.wait_ready(10)
        outer = retrybudget.BudgetInterceptor(rich, FAST)
        channel, stub = blocking_stub(b.target, outer, retrybudget.BudgetInterceptor(empty, FAST))
        with channel:
            with pytest.raises(BudgetExhausted):
                stub.GetBudget(REQUEST, timeout=10)
        assert len(b.seen) == 3
        assert rich.stats().retries_allowed == 0
    assert server.get_budget("empty").retries_denied_total == 3


def test_the_calls_timeout_is_the_deadline_of_every_attempt_and_of_every_backoff(
        start_server, backend):
    server = start_server(POLICY)
    # Attempts at 0 and 0.3 s; then a pushback to 0.6 s would cross the deadline at 0.5 s.
    timeout = 0.5
    b = backend(fail(UNAVAILABLE, pushback_ms="300"))
    with BudgetClient(client_options(server)) as client:
        budget = client.tenant("t")
        assert budget.wait_ready(10)
        channel, stub = blocking_stub(b.target, retrybudget.BudgetInterceptor(budget, FAST))
        with channel:
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as raised:
                stub.GetBudget(REQUEST, timeout=timeout)
        error = raised.value
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert isinstance(error, RetryDeadlineExceeded)
        assert error.last_error.code() == UNAVAILABLE
        seen = b.seen
        assert 1 <= len(seen) <= 2, seen
        # Every attempt carried a deadline within the call's. grpc-timeout is relative, so the
        # backend's deadline is the call's plus the time from sending to receiving (and the
        # header rounds up to the millisecond): 0.1 s of slack for a loaded machine (9 ms was
        # seen), where an attempt given the whole timeout again would be 0.3 s over.
        for s in seen:
            assert s.arrived + s.time_remaining <= start + timeout + 0.1, (s, start)
        for before, after in zip(seen, seen[1:]):
            assert after.arrived - before.arrived >= 0.28, seen
        # A token for each retry sent, none for the backoff that would have crossed the deadline.
        stats = budget.stats()
        assert (stats.retries_allowed, stats.refunds) == (len(seen) - 1, 0), stats


def test_the_calls_own_deadline_a_negative_pushback_and_other_codes_are_not_retried(
        start_server, backend):
    server = start_server(POLICY)
    with BudgetClient(client_options(server)) as client:
        budget = client.tenant("t")
        assert budget.wait_ready(10)
        interceptor = retrybudget.BudgetInterceptor(budget, FAST)
        for step, timeout, code in (
                (slow(30), 0.2, grpc.StatusCode.DEADLINE_EXCEEDED),
                (fail(UNAVAILABLE, pushback_ms="-1"), 10, UNAVAILABLE),
                (fail(UNAVAILABLE, pushback_ms="soon"), 10, UNAVAILABLE),
                (fail(grpc.StatusCode.INVALID_ARGUMENT), 10, grpc.StatusCode.INVALID_ARGUMENT)):
            b = backend(step)
            channel, stub = blocking_stub(b.target, interceptor)
            with channel:
                with pytest.raises(grpc.RpcError) as raised:
                    stub.GetBudget(REQUEST, timeout=timeout)
            assert raised.value.code() == code
            assert not isinstance(raised.value, (BudgetExhausted, RetryDeadlineExceeded))
            assert len(b.seen) == 1
        assert budget.stats().retries_allowed == 0


async def until(predicate, timeout: float = 10.0):
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


@pytest.mark.asyncio
async def test_aio_retries_with_one_key_and_cancelling_a_backoff_refunds_its_token(
        start_server, backend):
    server = start_server(POLICY)
    loop = asyncio.get_running_loop()
    client = AsyncBudgetClient(client_options(server))
    budget = client.tenant("t")
    assert await budget.ready(10)  # both requests after the first report: both counted
    b = backend(fail(UNAVAILABLE), answer)
    async with grpc.aio.insecure_channel(
            b.target, options=retrybudget.DISABLE_GRPC_RETRIES,
            interceptors=[retrybudget.AioBudgetInterceptor(budget, FAST)]) as channel:
        reply = await budget_pb2_grpc.BudgetAdminServiceStub(channel).GetBudget(REQUEST,
                                                                                timeout=10)
    assert reply.budget.tenant == "answered"
    assert len(set(b.keys())) == 1 and b.previous_attempts() == [None, "1"]
    assert budget.stats().retries_allowed == 1

    # A pushback of 30 s: the call waits in its backoff holding a token, then is cancelled.
    b = backend(fail(UNAVAILABLE, pushback_ms="30000"))
    async with grpc.aio.insecure_channel(
            b.target, options=retrybudget.DISABLE_GRPC_RETRIES,
            interceptors=[retrybudget.AioBudgetInterceptor(budget, FAST)]) as channel:
        call = budget_pb2_grpc.BudgetAdminServiceStub(channel).GetBudget(REQUEST, timeout=60)
        await until(lambda: budget.stats().retries_allowed == 2)
        # A Sync reported the token spent before the refund.
        for _ in range(1000):
            status = await loop.run_in_executor(None, server.get_budget, "t")
            if status.retries_total == 2:
                break
            await asyncio.sleep(0.01)
        assert status.retries_total == 2
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert len(b.seen) == 1
    stats = budget.stats()
    assert (stats.requests, stats.retries_allowed, stats.refunds, stats.successes) == \
        (2, 1, 1, 1), stats
    assert await client.close() is None
    status = await loop.run_in_executor(None, server.get_budget, "t")
    assert (status.retries_total, status.refunded_total, status.requests_total) == (1, 1, 2), \
        status


@pytest.mark.asyncio
async def test_aio_an_empty_tenant_denies_and_a_backoff_past_the_deadline_is_not_started(
        start_server, backend):
    server = start_server(POLICY)
    async with AsyncBudgetClient(client_options(server)) as client:
        empty = client.tenant("empty")
        b = backend(fail(UNAVAILABLE))
        async with grpc.aio.insecure_channel(
                b.target, options=retrybudget.DISABLE_GRPC_RETRIES,
                interceptors=[retrybudget.AioBudgetInterceptor(empty, FAST)]) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await budget_pb2_grpc.BudgetAdminServiceStub(channel).GetBudget(REQUEST,
                                                                                timeout=10)
        error = raised.value
        assert isinstance(error, BudgetExhausted) and error.attempts == 1
        assert error.code() == UNAVAILABLE
        assert (retrybudget.BUDGET_EXHAUSTED_TRAILER, "1") in tuple(error.trailing_metadata())
        assert len(b.seen) == 1

        rich = client.tenant("t")
        assert await rich.ready(10)
        b = backend(fail(UNAVAILABLE, pushback_ms="5000"))
        async with grpc.aio.insecure_channel(
                b.target, options=retrybudget.DISABLE_GRPC_RETRIES,
                interceptors=[retrybudget.AioBudgetInterceptor(rich, FAST)]) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await budget_pb2_grpc.BudgetAdminServiceStub(channel).GetBudget(REQUEST,
                                                                                timeout=2)
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert isinstance(raised.value, RetryDeadlineExceeded)
        assert len(b.seen) == 1 and rich.stats().retries_allowed == 0
