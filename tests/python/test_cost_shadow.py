"""Issue 36's client rules on one TenantBudget without a server (client/conformance/RULES.md:
cost.*, shadow.*, requests.*): retries costing more than one token, shadow mode, requests
counted and funding the fallback bucket; and the retry helpers' and tenacity hooks' cost and
record_request()."""

import asyncio
import threading

import grpc
import pytest
import tenacity

import retrybudget
from retrybudget import (BudgetExhausted, InvalidOptions, RetryCancelled, RetryPolicy,
                         async_call_with_retry, aws_cost, call_with_retry)
from retrybudget._bucket_math import BucketShape, FallbackBucket, RefreshPolicy
from retrybudget._proto import budget_pb2
from retrybudget.tenacity import (record_request, retry_if_budget_allows,
                                  stop_when_budget_exhausted)
from retrybudget.tenant_budget import DOWN, UNREACHABLE, TenantBudget

SHADOW = budget_pb2.MODE_SHADOW
ENFORCE = budget_pb2.MODE_ENFORCE


class Waker:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


def new_budget(waker=None):
    return TenantBudget("t", waker or (lambda: None), 0.0, "local_bucket", BucketShape(1, 0.1))


def grant(budget, granted, mode=budget_pb2.MODE_UNSPECIFIED, at=0.0, ttl_ms=5000, share=None):
    g = budget_pb2.TenantGrant(tenant="t", granted=granted, lease_ttl_ms=ttl_ms, mode=mode)
    if share is not None:
        g.safe_share.CopyFrom(share)
    budget.apply_grant(g, budget_pb2.TenantSync(tenant="t", want=granted), at, at,
                       RefreshPolicy())
    return budget


def report(budget, now=0.0):
    out = budget_pb2.TenantSync()
    budget.fill_sync(now, RefreshPolicy(), out)
    return out


# ---- cost.all-or-nothing ----

def test_a_retry_of_cost_c_takes_c_tokens_or_none():
    budget = grant(new_budget(), 10)
    assert budget.try_acquire(4) and budget.try_acquire(5)
    assert not budget.try_acquire(2)  # one token left: no partial take
    assert budget.stats().tokens_held == 1
    assert budget.try_acquire()  # the last one, cost 1
    out = report(budget)
    assert (out.retries_spent, out.retries_allowed, out.retries_denied) == (10, 3, 1)
    stats = budget.stats()
    assert (stats.retries_allowed, stats.tokens_spent, stats.retries_denied) == (3, 10, 1)


@pytest.mark.parametrize("cost", [0, -1, 1_000_001, 2.0, 1.5, True, False, "3", None])
def test_a_cost_out_of_range_is_a_value_error_naming_cost_and_changes_nothing(cost):
    budget = grant(new_budget(), 5)
    with pytest.raises(ValueError, match=f"cost is {cost!r}"):
        budget.try_acquire(cost)
    with pytest.raises(ValueError, match=f"cost is {cost!r}"):
        budget.refund(cost)
    stats = budget.stats()
    assert (stats.tokens_held, stats.retries_allowed, stats.retries_denied,
            stats.refunds) == (5, 0, 0, 0)


def test_the_largest_cost_is_one_million():
    budget = grant(new_budget(), 1_000_000)
    assert budget.try_acquire(1_000_000)
    assert budget.stats().tokens_held == 0


def test_a_denial_of_any_cost_wakes_the_refresher():
    waker = Waker()
    budget = grant(new_budget(waker), 3)
    assert not budget.try_acquire(4)
    assert waker.calls == 1


def test_a_costly_take_across_the_low_water_mark_wakes_the_refresher():
    waker = Waker()
    budget = grant(new_budget(waker), 10)  # mark 2
    assert budget.try_acquire(5) and waker.calls == 0  # 5 left
    assert budget.try_acquire(4) and waker.calls == 1  # 1 left: jumped over the mark


def test_demand_counts_tokens_so_the_lease_asked_for_is_in_tokens():
    cheap, costly = grant(new_budget(), 100), grant(new_budget(), 100)
    for _ in range(10):
        assert cheap.try_acquire(1) and costly.try_acquire(10)
    assert report(costly, 0.5).want > 5 * report(cheap, 0.5).want


# ---- cost.refund ----

def test_a_refund_of_cost_c_gives_c_tokens_back_like_c_single_refunds():
    budget = grant(new_budget(), 10)
    assert budget.try_acquire(6)
    budget.refund(6)
    stats = budget.stats()
    assert (stats.tokens_held, stats.refunds, stats.retries_allowed, stats.tokens_spent) == (
        10, 1, 0, 0)


def test_a_costly_retry_refunded_after_its_report_is_reported_refunded():
    budget = grant(new_budget(), 10)
    assert budget.try_acquire(6)
    assert report(budget).retries_spent == 6
    budget.refund(6)
    out = report(budget)
    assert (out.retries_spent, out.retries_refunded, out.retries_allowed) == (6, 6, 1)


def test_retries_allowed_reported_is_never_above_retries_spent():
    # Taken and refunded before any report: in no retries_spent, so not in retries_allowed.
    budget = grant(new_budget(), 10)
    assert budget.try_acquire()
    budget.refund()
    out = report(budget)
    assert (out.retries_spent, out.retries_allowed) == (0, 0)


# ---- shadow.mode-from-response ----

def test_the_mode_follows_every_applied_entry():
    budget = new_budget()
    assert budget.stats().enforcement == "enforce"  # a new tenant enforces
    grant(budget, 0, SHADOW, ttl_ms=100)
    assert budget.stats().enforcement == "shadow"
    budget.step(0.2, UNREACHABLE)  # fallback keeps it
    assert budget.stats().mode == "fallback" and budget.stats().enforcement == "shadow"
    budget.apply_refusal("NOT_FOUND", "no such tenant", 0.3, RefreshPolicy())
    assert budget.stats().enforcement == "shadow"  # an entry with an error keeps it
    grant(budget, 0, budget_pb2.MODE_UNSPECIFIED, at=6.1)
    assert budget.stats().enforcement == "enforce"
    grant(budget, 0, SHADOW, at=6.2)
    grant(budget, 0, ENFORCE, at=6.3)
    assert budget.stats().enforcement == "enforce"


# ---- shadow.allow-and-count ----

def test_shadow_allows_what_enforcement_denies_taking_no_token_and_counts_it():
    waker = Waker()
    budget = grant(new_budget(waker), 3, SHADOW)
    assert budget.try_acquire(2)      # backed: 1 left
    assert budget.try_acquire(2)      # would be denied: allowed, no token taken
    assert waker.calls == 1           # woken as the denial would have
    assert budget.try_acquire(1)      # the last token, backed
    stats = budget.stats()
    assert (stats.tokens_held, stats.retries_allowed, stats.tokens_spent, stats.retries_denied,
            stats.shadow_denied, stats.unbacked) == (0, 2, 3, 0, 1, 2)
    out = report(budget)
    assert (out.retries_spent, out.retries_allowed, out.retries_denied, out.shadow_denied) == (
        3, 2, 0, 1)


def test_shadow_signals_demand_as_the_denial_would_have():
    enforced, shadow = grant(new_budget(), 0), grant(new_budget(), 0, SHADOW)
    for _ in range(20):
        assert not enforced.try_acquire(3)
        assert shadow.try_acquire(3)
    assert report(shadow, 0.5).want == report(enforced, 0.5).want > 2


def test_shadow_goes_through_the_fallback_bucket_first():
    budget = grant(new_budget(), 0, SHADOW, ttl_ms=100,
                   share=budget_pb2.SafeShare(capacity=2, refill_per_second=0))
    budget.step(0.2, UNREACHABLE)
    assert budget.stats().mode == "fallback"
    assert budget.try_acquire() and budget.try_acquire() and budget.try_acquire()
    stats = budget.stats()
    assert (stats.fallback_allowed, stats.shadow_denied) == (2, 1)


def test_an_enforced_tenant_after_shadow_denies_again():
    budget = grant(new_budget(), 0, SHADOW)
    assert budget.try_acquire()
    grant(budget, 0, ENFORCE, at=0.1)
    assert not budget.try_acquire()
    assert (budget.stats().shadow_denied, budget.stats().retries_denied) == (1, 1)


# ---- shadow.refund-unbacked-first ----

def test_a_refund_cancels_unbacked_permits_first_and_gives_nothing_back():
    budget = grant(new_budget(), 2, SHADOW)
    assert budget.try_acquire(2)      # backed
    assert budget.try_acquire(3)      # unbacked 3
    budget.refund(2)                  # unbacked 3 >= 2: 1 left unbacked, no token back
    stats = budget.stats()
    assert (stats.tokens_held, stats.refunds, stats.unbacked) == (0, 0, 1)
    budget.refund(2)                  # unbacked 1 < 2: a normal refund
    stats = budget.stats()
    assert (stats.tokens_held, stats.refunds, stats.unbacked) == (2, 1, 1)
    assert report(budget).shadow_denied == 1  # a would-be denial stays counted


# ---- requests.counted ----

def test_requests_are_reported_cumulative_in_every_entry():
    budget = grant(new_budget(), 5)
    for _ in range(3):
        budget.record_request()
    assert report(budget).requests == 3
    budget.record_request()
    assert report(budget).requests == 4
    assert budget.stats().requests == 4


# ---- requests.fallback-credit ----

def test_a_fallback_bucket_funds_itself_with_the_credit_of_requests_up_to_its_cap():
    bucket = FallbackBucket(BucketShape(capacity=4, refill_per_second=0, request_credit=0.5),
                            0.0)
    assert bucket.refill(0.0, 0) == 4
    assert bucket.refill(0.0, 4, requests=10) == 0 and bucket.last_requests_credited == 0
    assert bucket.refill(1.0, 1, requests=3) == 1
    assert bucket.last_requests_credited == 3
    # Successes first, then requests, from one room.
    both = FallbackBucket(BucketShape(capacity=2, refill_per_second=0, success_credit=1,
                                      request_credit=1), 0.0, start_full=False)
    assert both.refill(0.0, 0, successes=1, requests=5) == 2
    assert (both.last_credited, both.last_requests_credited) == (1, 1)


def _in_fallback(request_credit, capacity=10):
    budget = grant(new_budget(), 0, ttl_ms=100,
                   share=budget_pb2.SafeShare(capacity=capacity, refill_per_second=0,
                                              request_credit=request_credit))
    report(budget, 0.05)  # a request built before the fallback carries 0 requests
    budget.step(0.2, UNREACHABLE)
    assert budget.stats().mode == "fallback"
    return budget


def test_requests_in_fallback_deposit_request_credit_each_once():
    budget = _in_fallback(request_credit=0.5)
    assert sum(budget.try_acquire() for _ in range(12)) == 10
    for _ in range(5):
        budget.record_request()
    budget.step(0.3, UNREACHABLE)
    stats = budget.stats()
    assert (stats.requests, stats.requests_credited_locally, stats.tokens_held) == (5, 5, 2)
    budget.step(0.4, UNREACHABLE)  # never credited twice
    assert budget.stats().requests_credited_locally == 5
    out = report(budget, 0.5)
    assert (out.requests, out.requests_credited_locally) == (5, 5)


def test_a_request_already_carried_by_a_request_is_the_servers_to_credit():
    budget = grant(new_budget(), 0, ttl_ms=100,
                   share=budget_pb2.SafeShare(capacity=10, refill_per_second=0,
                                              request_credit=1))
    budget.record_request()
    budget.record_request()
    assert report(budget, 0.05).requests == 2  # the server may credit these two
    budget.step(0.2, UNREACHABLE)
    assert sum(budget.try_acquire() for _ in range(10)) == 10
    budget.record_request()
    budget.step(0.3, UNREACHABLE)
    assert budget.stats().requests_credited_locally == 1


def test_a_request_whose_credit_does_not_fit_is_not_counted():
    budget = _in_fallback(request_credit=3, capacity=4)
    assert budget.try_acquire(2)  # room for 2 tokens: no request of 3 fits
    budget.record_request()
    budget.step(0.3, UNREACHABLE)
    assert budget.stats().requests_credited_locally == 0
    assert budget.try_acquire(2)  # room for 4: one fits
    budget.step(0.4, DOWN)
    assert budget.stats().requests_credited_locally == 0  # considered already: left to the server
    budget.record_request()
    budget.step(0.5, DOWN)
    assert budget.stats().requests_credited_locally == 1


# ---- metrics ----

def _sample(registry, name, tenant="t"):
    return registry.get_sample_value(name, {"tenant": tenant})


def test_metrics_export_shadow_denied_and_requests():
    prometheus_client = pytest.importorskip("prometheus_client")
    from retrybudget.metrics import PrometheusClientMetrics

    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusClientMetrics(registry)
    budget = grant(new_budget(), 1, SHADOW)
    budget.record_request()
    assert budget.try_acquire(1) and budget.try_acquire(5)
    metrics.tenant_updated("t", budget.stats())
    assert _sample(registry, "retry_budget_client_requests_total") == 1
    assert _sample(registry, "retry_budget_client_shadow_denied_total") == 1
    assert _sample(registry, "retry_budget_client_retries_allowed_total") == 1
    assert not _sample(registry, "retry_budget_client_retries_denied_total")


# ---- the retry helpers ----

FAST = RetryPolicy(max_attempts=4, initial_backoff=0.0, max_backoff=0.0)


def failing(errors):
    """fn(attempt) raising errors[0], errors[1], ... then returning "ok"."""
    def fn(attempt):
        if attempt.number <= len(errors):
            raise errors[attempt.number - 1]
        return "ok"
    return fn


def test_the_helper_takes_the_policys_cost_per_retry_and_records_one_request():
    budget = grant(new_budget(), 100)
    policy = RetryPolicy(max_attempts=4, initial_backoff=0, max_backoff=0, cost=3)
    assert call_with_retry(budget, failing([ConnectionError()] * 2), policy=policy) == "ok"
    stats = budget.stats()
    assert (stats.requests, stats.retries_allowed, stats.tokens_spent, stats.successes) == (
        1, 2, 6, 1)


def test_the_helper_prices_each_retry_by_the_error_aws_shape():
    budget = grant(new_budget(), 100)
    policy = RetryPolicy(max_attempts=4, initial_backoff=0, max_backoff=0, cost=aws_cost)
    assert call_with_retry(budget, failing([ConnectionError(), TimeoutError()]),
                           policy=policy) == "ok"
    assert budget.stats().tokens_spent == 15  # 5 after ConnectionError, 10 after a timeout


class _Rpc(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code


def test_aws_cost_is_ten_for_timeouts_and_five_otherwise():
    assert aws_cost(TimeoutError()) == 10
    assert aws_cost(_Rpc(grpc.StatusCode.DEADLINE_EXCEEDED)) == 10
    assert aws_cost(_Rpc(grpc.StatusCode.UNAVAILABLE)) == 5
    assert aws_cost(ConnectionError()) == 5


def test_a_retry_costing_more_than_what_is_left_is_denied_whole():
    budget = grant(new_budget(), 7)
    policy = RetryPolicy(max_attempts=4, initial_backoff=0, max_backoff=0, cost=5)
    with pytest.raises(BudgetExhausted) as error:
        call_with_retry(budget, failing([ConnectionError()] * 3), policy=policy)
    assert error.value.attempts == 2
    assert budget.stats().tokens_held == 2


@pytest.mark.parametrize("cost", [0, 1_000_001, True, 2.5])
def test_a_bad_cost_in_the_policy_is_refused_before_any_attempt(cost):
    budget = grant(new_budget(), 5)
    with pytest.raises(InvalidOptions, match="policy.cost is"):
        call_with_retry(budget, lambda a: "ok", policy=RetryPolicy(cost=cost))
    assert budget.stats().requests == 0


def test_a_bad_cost_from_the_policys_function_is_refused_naming_it():
    budget = grant(new_budget(), 5)
    policy = RetryPolicy(max_attempts=4, initial_backoff=0, max_backoff=0, cost=lambda e: 0)
    with pytest.raises(InvalidOptions, match="policy.cost returned for ConnectionError"):
        call_with_retry(budget, failing([ConnectionError()]), policy=policy)
    assert budget.stats().tokens_held == 5


def test_a_stopped_backoff_refunds_the_cost_it_took():
    budget = grant(new_budget(), 10)
    stop = threading.Event()
    policy = RetryPolicy(initial_backoff=30, max_backoff=30, cost=4)

    def fn(attempt):
        threading.Timer(0.05, stop.set).start()
        raise ConnectionError("down")

    with pytest.raises(RetryCancelled):
        call_with_retry(budget, fn, policy=policy, random=lambda: 0.99, stop=stop)
    stats = budget.stats()
    assert (stats.tokens_held, stats.refunds, stats.requests) == (10, 1, 1)


@pytest.mark.asyncio
async def test_the_async_helper_takes_the_cost_and_refunds_it_when_cancelled():
    budget = grant(new_budget(), 10)
    policy = RetryPolicy(max_attempts=4, initial_backoff=0, max_backoff=0, cost=2)

    async def flaky(attempt):
        if attempt.number < 3:
            raise ConnectionError()
        return "ok"

    assert await async_call_with_retry(budget, flaky, policy=policy) == "ok"
    assert (budget.stats().tokens_spent, budget.stats().requests) == (4, 1)

    async def broken(attempt):
        raise ConnectionError()

    slow = RetryPolicy(initial_backoff=30, max_backoff=30, cost=3)
    task = asyncio.create_task(async_call_with_retry(budget, broken, policy=slow,
                                                     random=lambda: 0.99))
    while budget.stats().tokens_held != 3:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stats = budget.stats()
    assert (stats.tokens_held, stats.refunds, stats.requests) == (6, 1, 2)


# ---- tenacity ----

def test_tenacity_condition_takes_the_cost_and_records_one_request_per_call():
    budget = grant(new_budget(), 100)

    @tenacity.retry(stop=tenacity.stop_after_attempt(4), wait=tenacity.wait_none(),
                    retry=retry_if_budget_allows(budget, cost=aws_cost))
    def fetch(errors):
        if errors:
            raise errors.pop(0)
        return "ok"

    assert fetch([ConnectionError(), TimeoutError()]) == "ok"
    assert fetch([]) == "ok"
    stats = budget.stats()
    assert (stats.requests, stats.successes, stats.retries_allowed, stats.tokens_spent) == (
        2, 2, 2, 15)


def test_tenacity_stop_takes_the_cost_and_the_before_hook_records_requests():
    budget = grant(new_budget(), 7)

    @tenacity.retry(stop=tenacity.stop_after_attempt(10)
                    | stop_when_budget_exhausted(budget, cost=3),
                    wait=tenacity.wait_none(), before=record_request(budget))
    def broken():
        raise ConnectionError()

    with pytest.raises(BudgetExhausted) as error:
        broken()
    assert error.value.attempts == 3
    stats = budget.stats()
    assert (stats.requests, stats.tokens_held, stats.retries_allowed) == (1, 1, 2)


def test_tenacity_hooks_refuse_a_bad_cost():
    budget = new_budget()
    with pytest.raises(InvalidOptions, match="policy.cost is 0"):
        retry_if_budget_allows(budget, cost=0)
    with pytest.raises(InvalidOptions, match="policy.cost is 1.5"):
        stop_when_budget_exhausted(budget, cost=1.5)


def test_the_package_exports_the_new_names():
    for name in ("aws_cost", "ENFORCE", "SHADOW"):
        assert name in retrybudget.__all__ and hasattr(retrybudget, name)


# ---- against the real server ----

FIXED = 'tenants {{ tenant: "t" policy {{ capacity: {cap} refill_per_second: 0 ' \
        'success_credit: 0 lease_ttl_ms: 5000 {extra} }} }}\n'


def _client(server, **kw):
    kw.setdefault("refresh_period", 0.05)
    return retrybudget.BudgetClient(retrybudget.ClientOptions(target=server.target, **kw))


def test_a_cost_5_retry_takes_5_tokens_of_the_servers_bucket(start_server):
    from conftest import wait_until

    server = start_server(FIXED.format(cap=22, extra=""))
    client = _client(server, lease_burst=22)
    budget = client.tenant("t")
    wait_until(lambda: budget.stats().tokens_held == 22, what="the whole bucket leased")
    policy = RetryPolicy(max_attempts=10, initial_backoff=0, max_backoff=0, cost=5)
    with pytest.raises(BudgetExhausted) as error:
        call_with_retry(budget, failing([ConnectionError()] * 10), policy=policy)
    assert error.value.attempts == 5  # four retries of 5 from 22 tokens, the fifth denied
    assert client.close() is None
    status = server.get_budget("t")
    assert (status.retries_total, status.retries_allowed_total, status.requests_total) == (
        20, 4, 1)
    assert status.tokens == 2  # the 2 left went back with the final Sync


def test_a_shadow_tenant_denies_nothing_counts_would_be_denials_and_follows_a_switch(
        start_server):
    from conftest import wait_until

    server = start_server(FIXED.format(cap=3, extra="mode: MODE_SHADOW"))
    client = _client(server, lease_burst=3)
    budget = client.tenant("t")
    wait_until(lambda: budget.stats().tokens_held == 3, what="the whole bucket leased")
    assert budget.stats().enforcement == "shadow"
    assert all(budget.try_acquire() for _ in range(10))
    stats = budget.stats()
    assert (stats.retries_allowed, stats.retries_denied, stats.shadow_denied) == (3, 0, 7)
    wait_until(lambda: server.get_budget("t").shadow_denied_total == 7,
               what="the would-be denials reported")
    # Switched to enforce live: the client follows within a refresh period, no restart.
    server.put_policy("t", capacity=3, refill_per_second=0, success_credit=0,
                      lease_ttl_ms=5000, mode=budget_pb2.MODE_ENFORCE)
    wait_until(lambda: budget.stats().enforcement == "enforce", what="the switch to enforce")
    assert not budget.try_acquire()
    assert client.close() is None
    status = server.get_budget("t")
    assert (status.shadow_denied_total, status.retries_denied_total) == (7, 1)


def test_threads_taking_random_costs_never_spend_more_than_the_bucket(start_server):
    import random
    import time

    server = start_server(FIXED.format(cap=400, extra=""))
    client = _client(server, min_sync_interval=0.001)
    budget = client.tenant("t")
    tokens, retries = [0] * 16, [0] * 16
    go = threading.Event()

    def worker(i):
        rng = random.Random(i)
        go.wait()
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            cost = rng.randint(1, 7)
            if budget.try_acquire(cost):
                tokens[i] += cost
                retries[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    assert client.close() is None
    spent = sum(tokens)
    assert 300 <= spent <= 400, spent  # never a partial take, never more than the bucket
    stats = budget.stats()
    assert (stats.tokens_spent, stats.retries_allowed) == (spent, sum(retries))
    assert stats.retries_denied > 0
    status = server.get_budget("t")
    assert (status.retries_total, status.retries_allowed_total) == (spent, sum(retries))
    assert status.tokens == pytest.approx(400 - spent)


def test_a_windowed_tenant_gets_each_request_once_and_spends_within_its_window(start_server):
    import time

    # A floor of 0.5 retries a second over a window of 10 s (5 tokens), and 0.5 a request.
    server = start_server('tenants { tenant: "window" policy { retry_ratio: 0.5 '
                          'min_retries_per_second: 0.5 ttl_ms: 10000 } }\n')
    client = _client(server)
    budget = client.tenant("window")
    assert budget.wait_ready(5)
    for i in range(40):
        assert call_with_retry(budget, lambda attempt: i) == i
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        budget.try_acquire(2)  # a retry of 2 tokens: the bound counts tokens
        time.sleep(0.002)
    assert client.close() is None
    stats = budget.stats()
    status = server.get_budget("window")
    assert stats.requests == 40
    assert status.requests_total == 40  # each request reported once
    assert stats.tokens_spent <= 5 + 0.5 * 40, stats
    assert stats.tokens_spent == 2 * stats.retries_allowed
    assert (status.retries_total, status.retries_allowed_total) == (stats.tokens_spent,
                                                                   stats.retries_allowed)
