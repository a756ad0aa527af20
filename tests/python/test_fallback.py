"""The Python client when the server is unreachable: fallback, never failing open."""

import asyncio
import socket
import time

import grpc
import pytest

import retrybudget
from retrybudget import AsyncBudgetClient, BudgetClient, ClientOptions
from retrybudget._bucket_math import BucketShape, RefreshPolicy
from retrybudget._proto import budget_pb2
from retrybudget._registry import TenantRegistry
from retrybudget._sync_engine import Outcome, SyncEngine

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


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class EngineHarness:
    """The Sync engine both clients share, driven as their refresher does (begin_step /
    end_attempt / next_plan / end_step), on a fake clock, each attempt answered by
    `handler(plan) -> Outcome` (which may advance the clock, as a waiting call takes time)."""

    def __init__(self, refresh_period: float = 0.2, sync_timeout: float = 1.0,
                 start: float = 100.0):
        self.clock = FakeClock(start)
        self.tenants = TenantRegistry(self.clock, lambda: None, "local_bucket",
                                      BucketShape(0, 0))
        self.engine = SyncEngine("engine-test", RefreshPolicy(refresh_period=refresh_period),
                                 sync_timeout, "", self.clock, self.tenants)
        self.handler = None
        self.plans = []

    def run_once(self) -> float:
        plan = self.engine.begin_step()
        while plan is not None:
            self.plans.append(plan)
            self.engine.end_attempt(plan, self.handler(plan))
            plan = self.engine.next_plan()
        return self.engine.end_step()

    def step_until_mode(self, budget, mode: str, at_most: float) -> None:
        """Runs steps at the times they ask for until `budget` is in `mode` (the clock is left
        at the step that switched it)."""
        give_up = self.clock() + at_most
        nxt = self.run_once()
        while budget.stats().mode != mode:
            assert nxt <= give_up, f"still in {budget.stats().mode}"
            self.clock.now = nxt
            nxt = self.run_once()


def granting_with_share(granted: int, share_capacity: float, share_refill_per_second: float,
                        lease_ttl_ms: int = 5000, next_sync_ms: int = 200):
    def handler(plan):
        response = budget_pb2.SyncResponse()
        for entry in plan.request.tenants:
            response.tenants.add(
                tenant=entry.tenant, granted=granted, lease_ttl_ms=lease_ttl_ms,
                next_sync_ms=next_sync_ms,
                safe_share=budget_pb2.SafeShare(capacity=share_capacity,
                                                refill_per_second=share_refill_per_second))
        return Outcome(response=response)
    return handler


def take_all(budget) -> int:
    taken = 0
    while budget.try_acquire():
        taken += 1
    return taken


# At 3600 s, (since + 0.2) - since < 0.2 in floating point: the step scheduled for the moment
# the server turns down must see it down all the same.
@pytest.mark.parametrize("start", [100.0, 3600.0])
def test_an_attempt_waiting_for_the_server_is_cut_short_when_the_server_turns_down(start):
    # After one failed attempt the next ones wait for the channel to connect, each up to its
    # deadline (sync_timeout, 1 s). The server turns "down" a refresh period (200 ms) after the
    # first failure, and the attempt waiting then is cut short for it: the spent lease falls
    # back at that moment, not when the wait gives up.
    h = EngineHarness(refresh_period=0.2, sync_timeout=1.0, start=start)
    budget = h.tenants.get_or_create("payments")
    h.handler = granting_with_share(3, share_capacity=2, share_refill_per_second=10)
    h.run_once()
    assert take_all(budget) == 3
    t0 = h.clock()
    sent = len(h.plans)

    # The first attempt fails at once (connection refused); the later ones wait out their
    # deadline, as a wait_for_ready call on a dead address does.
    def waiting(plan):
        if len(h.plans) == sent + 1:
            return Outcome(code=grpc.StatusCode.UNAVAILABLE, details="connection refused")
        h.clock.now += plan.timeout
        return Outcome(code=grpc.StatusCode.DEADLINE_EXCEEDED, details="waited for the channel")

    h.handler = waiting
    h.step_until_mode(budget, retrybudget.FALLBACK, at_most=3.0)
    assert len(h.plans) >= sent + 2, "no attempt waited for the channel"
    assert h.plans[sent + 1].wait_for_ready
    assert 0.2 <= h.clock() - t0 <= 0.25, \
        f"fell back {h.clock() - t0:.3f} s after the failure began (when an attempt gave up?)"


# Two tokens in all (no refill), a lease far longer than the test: once they are spent, only a
# server seen down makes the tenant fall back.
_TWO_TOKENS_POLICY = ('tenants { tenant: "t" policy { capacity: 2 refill_per_second: 0 '
                      'success_credit: 0 lease_ttl_ms: 60000 } }\n')


def _waiting_options(target: str) -> ClientOptions:
    # After a failed attempt each one may wait 5 s for the channel; the server is down 0.1 s
    # after the first failure.
    return ClientOptions(target=target, refresh_period=0.1, sync_timeout=5.0,
                         fallback_capacity=0, fallback_refill_per_second=0)


def _spent(budget) -> bool:
    take_all(budget)
    stats = budget.stats()
    return stats.tokens_received == 2 and stats.tokens_held == 0


def test_a_spent_lease_falls_back_soon_after_a_kill_not_when_a_waiting_sync_gives_up(
        start_server):
    server = start_server(_TWO_TOKENS_POLICY)
    with BudgetClient(_waiting_options(server.target)) as client:
        budget = client.tenant("t")
        wait_until(lambda: _spent(budget), what="both tokens leased and spent")
        killed = time.monotonic()
        server.kill()
        wait_until(lambda: budget.stats().mode == retrybudget.FALLBACK, timeout=10,
                   what="fallback after the kill")
        # The next Sync (within a refresh period) fails at once, the server is down a refresh
        # period later; an attempt waiting for the channel then is cut short (else: 5 s).
        assert time.monotonic() - killed < 2.0
        # Back up, the attempt waiting for the channel gets its answer: a lease again.
        server.restart()
        wait_until(lambda: budget.stats().mode == retrybudget.LEASE, what="a lease again")


@pytest.mark.asyncio
async def test_async_client_spent_lease_falls_back_soon_after_a_kill(start_server):
    server = start_server(_TWO_TOKENS_POLICY)

    async def until(predicate, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.005)

    async with AsyncBudgetClient(_waiting_options(server.target)) as client:
        budget = client.tenant("t")
        await until(lambda: _spent(budget))
        killed = time.monotonic()
        server.kill()
        await until(lambda: budget.stats().mode == retrybudget.FALLBACK)
        assert time.monotonic() - killed < 2.0
        # restart() blocks; run it off the loop so the refresher task keeps going.
        await asyncio.get_running_loop().run_in_executor(None, server.restart)
        await until(lambda: budget.stats().mode == retrybudget.LEASE)
