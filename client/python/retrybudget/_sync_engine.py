"""The leasing protocol of one client, without its transport (a port of the C++ Refresher's
RunOnce / SyncLocked / ApplyResponseLocked / FinalSyncLocked). The thread of BudgetClient and
the task of AsyncBudgetClient drive it and only do the I/O:

    plan = engine.begin_step()        # steps the tenants; a Sync attempt to send, or None
    if plan: engine.end_attempt(plan, <outcome of sending plan.request>)
    next_time = engine.end_step()     # steps the tenants again with the outcome

Protocol rules kept here (docs/DESIGN.md, "Leasing protocol"):
 * One request carries every tenant. A NEW request gets seq + 1. A failed request (any error,
   deadline included) is resent unchanged, same seq, after a backoff, while it is younger than
   refresh_period (from its first send); an older one is abandoned for a new request.
 * A failure other than UNAUTHENTICATED / PERMISSION_DENIED means the server is unreachable
   (tenants whose lease ended fall back); those two mean it refuses (deny); a response means it
   answers. A `stale` response is dropped.
 * Leases end at the request's FIRST send + lease_ttl_ms.
 * Syncs are never closer than min_sync_interval; an attempt's deadline is the earliest of
   sync_timeout, the next lease expiry and the next fallback step (>= 20 ms away); an attempt
   cut short by it, or cancelled by a wake while waiting for a connection, is "interrupted":
   no verdict, no backoff, the same request goes out again at once.
 * The first attempt after a success is fail-fast; later ones wait for the channel to connect.

Not thread-safe: the driver serialises calls (it holds `mu` for a whole step)."""

import logging
import threading
from dataclasses import dataclass, field
from typing import List, Optional

import grpc

from ._bucket_math import (INFINITE_FUTURE, INFINITE_PAST,
                           MIN_FALLBACK_STEP_WINDOW, RefreshPolicy, retry_backoff)
from ._proto import budget_pb2
from .tenant_budget import ANSWERING, REFUSING, UNREACHABLE

_log = logging.getLogger("retrybudget")
_DEADLINE_SLACK = 0.001
_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


@dataclass
class _Pending:
    request: "budget_pb2.SyncRequest"
    tenants: list
    first_sent: float


@dataclass
class Plan:
    """One Sync attempt to send: `request` with `timeout` seconds, wait_for_ready or not."""
    request: "budget_pb2.SyncRequest"
    timeout: float
    wait_for_ready: bool
    sent: float
    deadline: float


@dataclass
class Outcome:
    """What sending a Plan gave: code None for a response."""
    code: Optional[grpc.StatusCode] = None
    details: str = ""
    response: Optional["budget_pb2.SyncResponse"] = None
    woken: bool = False  # cancelled by a wake while waiting for a connection


@dataclass
class _StepState:
    tenants: List = field(default_factory=list)
    now: float = 0.0


class SyncEngine:
    def __init__(self, instance_id: str, policy: RefreshPolicy, sync_timeout: float,
                 bearer_token: str, clock, registry, metrics=None):
        self.mu = threading.Lock()
        self.instance_id = instance_id
        self.policy = policy
        self.sync_timeout = sync_timeout
        self.metadata = (("authorization", f"Bearer {bearer_token}"),) if bearer_token else None
        self._clock = clock
        self._registry = registry
        self._metrics = metrics
        self.seq = 0
        self._pending: Optional[_Pending] = None
        self._last_send = INFINITE_PAST
        self._retry_at = INFINITE_PAST
        self.failures = 0
        self.last_status = None  # None: OK; else "CODE: details"
        self.server_state = ANSWERING
        self.shut_down = False
        self._step = _StepState()
        self._final_tenants = []

    def _sync_due(self, tenants) -> float:
        if self._pending is not None:
            return self._retry_at
        if not tenants:
            return INFINITE_FUTURE
        due = min(t.sync_due_at() for t in tenants)
        if due == INFINITE_FUTURE:
            return due
        return max(due, self._last_send + self.policy.min_sync_interval)

    def begin_step(self) -> Optional[Plan]:
        if self.shut_down:
            self._step = _StepState()
            return None
        tenants = self._registry.snapshot()
        now = self._clock()
        next_step = INFINITE_FUTURE
        lease_ends = INFINITE_FUTURE
        for t in tenants:
            next_step = min(next_step, t.step(now, self.server_state))
            lease_ends = min(lease_ends, t.lease_ends_at())
        self._step = _StepState(tenants, now)
        if not tenants or self._sync_due(tenants) > now:
            return None
        cut = min(lease_ends, max(next_step, now + MIN_FALLBACK_STEP_WINDOW))
        if (self._pending is not None
                and now - self._pending.first_sent >= self.policy.refresh_period):
            self._pending = None  # failing for a whole refresh period: a new request
        if self._pending is None:
            request = budget_pb2.SyncRequest(instance_id=self.instance_id)
            self.seq += 1
            request.seq = self.seq
            for t in tenants:
                t.fill_sync(now, self.policy, request.tenants.add())
            self._pending = _Pending(request, list(tenants), now)
        self._last_send = now
        deadline = min(now + self.sync_timeout, cut)
        return Plan(self._pending.request, max(0.0, deadline - now), self.failures > 0, now,
                    deadline)

    def end_attempt(self, plan: Plan, outcome: Outcome) -> None:
        received = self._clock()
        if self._metrics is not None:
            self._metrics.sync_attempted(outcome.code is None)
        self.last_status = (None if outcome.code is None
                            else f"{outcome.code.name}: Sync to the budget server failed: "
                                 f"{outcome.details}")
        cut_short = (plan.deadline < plan.sent + self.sync_timeout
                     and outcome.code == grpc.StatusCode.DEADLINE_EXCEEDED
                     and received >= plan.deadline - _DEADLINE_SLACK)
        if cut_short or (outcome.woken and outcome.code == grpc.StatusCode.CANCELLED):
            self._retry_at = received
            return
        if outcome.code is None:
            self.server_state = ANSWERING
        elif outcome.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            self.server_state = REFUSING
        else:
            self.server_state = UNREACHABLE
        if outcome.code is not None:
            self.failures += 1
            self._retry_at = max(received, plan.sent + retry_backoff(self.failures, self.policy))
            if self.failures == 1:
                _log.error("retrybudget: Sync seq %d failed; retrying (tenants whose lease ends "
                           "meanwhile fall back): %s", plan.request.seq, self.last_status)
            return
        if self.failures > 0:
            _log.info("retrybudget: Sync seq %d succeeded after %d failed attempts",
                      plan.request.seq, self.failures)
        self.failures = 0
        done, self._pending = self._pending, None
        if outcome.response.stale:
            _log.error("retrybudget: Sync seq %d answered as stale; ignored", done.request.seq)
            return
        self._apply_response(done, outcome.response, received)

    def _apply_response(self, pending: _Pending, response, received: float) -> None:
        n = min(len(response.tenants), len(pending.request.tenants))
        if len(response.tenants) != len(pending.request.tenants):
            _log.error("retrybudget: Sync response has %d tenant entries for %d in the request",
                       len(response.tenants), len(pending.request.tenants))
        for i in range(n):
            grant = response.tenants[i]
            sent = pending.request.tenants[i]
            if grant.tenant != sent.tenant:
                _log.error("retrybudget: Sync response entry %d is for tenant %r, not %r", i,
                           grant.tenant, sent.tenant)
                continue
            if grant.HasField("error") and grant.error.code != 0:
                code_name = _CODE_NAMES.get(grant.error.code, f"CODE_{grant.error.code}")
                _log.error("retrybudget: budget server refused tenant %r (%s): %s", sent.tenant,
                           code_name, grant.error.message)
                pending.tenants[i].apply_refusal(code_name, grant.error.message, received,
                                                 self.policy)
                continue
            pending.tenants[i].apply_grant(grant, sent, pending.first_sent, received,
                                           self.policy)

    def end_step(self) -> float:
        """Steps the tenants again with the attempt's outcome; returns the next step's time."""
        tenants = self._step.tenants
        if self.shut_down or not tenants:
            return INFINITE_FUTURE
        now = self._clock()
        nxt = self._sync_due(tenants)
        for t in tenants:
            nxt = min(nxt, t.step(now, self.server_state))
        self.update_metrics(tenants)
        return nxt

    def update_metrics(self, tenants) -> None:
        if self._metrics is not None:
            for t in tenants:
                self._metrics.tenant_updated(t.tenant, t.stats())

    # ---- the final Sync ----

    def begin_final(self) -> Optional["budget_pb2.SyncRequest"]:
        """Shuts every tenant down and builds the final request (new seq, final=true, every
        counter, want 0); None when there is nothing to report or it was already built."""
        if self.shut_down:
            return None
        self.shut_down = True
        tenants = self._registry.snapshot()
        self._step = _StepState()
        request = budget_pb2.SyncRequest(instance_id=self.instance_id, final=True)
        self.seq += 1
        request.seq = self.seq
        now = self._clock()
        for t in tenants:
            t.fill_final(now, request.tenants.add())
        self._pending = None
        self._final_tenants = tenants
        return request if tenants else None

    def final_wait_for_ready(self) -> bool:
        # With the server known unreachable, fail fast rather than hold close() 3 x timeout.
        return self.server_state != UNREACHABLE

    def end_final(self, outcome: Outcome) -> None:
        if self._metrics is not None:
            self._metrics.sync_attempted(outcome.code is None)
        self.last_status = (None if outcome.code is None
                            else f"{outcome.code.name}: Sync to the budget server failed: "
                                 f"{outcome.details}")

    def finish_final(self) -> None:
        if self.last_status is not None:
            _log.error("retrybudget: final Sync failed; unspent tokens are forfeited: %s",
                       self.last_status)
        self.update_metrics(self._final_tenants)
