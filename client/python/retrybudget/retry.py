"""The retry helper, as the C++ retrybudget::Retry: runs an operation and retries it so that
callers never write the loop themselves.

    result = retrybudget.call_with_retry(budget, lambda attempt: db.get(key, attempt.key),
                                         timeout=2.0, stop=stop_event)

What one logical call does:
 * The first attempt is always sent (unless already stopped or past the deadline), and
   counted with budget.record_request() (once per call); the budget decides every RETRY: one
   budget.try_acquire(cost) per retry, `cost` from the policy (1 by default, or a function of
   the failed attempt's error: AWS's shape, 5 for a retryable error and 10 for a timeout).
 * After a failed attempt, in this order: stopped? -> retryable? -> attempts left? -> backoff
   (server pushback or full-jitter exponential) -> would the backoff end at or after the overall
   deadline? (then RetryDeadlineExceeded now, no token taken) -> a tenant that has not had its
   first answer yet (a new client: budget.is_ready() False) is waited for, the time counting
   as backoff, bounded by the deadline, ended by `stop` / task cancellation (no token taken
   yet) -> try_acquire() (denied: BudgetExhausted from the last error) -> wait the rest of the
   backoff, woken by `stop` (stopped or, in asyncio, cancelled: the retry's cost is refund()ed
   and RetryCancelled / CancelledError raised) -> next attempt.
 * A call that succeeds, at any attempt, calls record_success() exactly once.
 * Every attempt of a call sees the same idempotency key.
 * A BudgetExhausted raised by an attempt (an inner retry layer's budget said no) is never
   retried: stacked retry layers must not multiply.
Thread-safety: nothing is kept between calls; any number of threads (or tasks) may call it."""

import asyncio
import random as _random
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, TypeVar, Union

import grpc

from ._types import BudgetExhausted, InvalidOptions
from .tenant_budget import MAX_COST

_RETRYABLE_GRPC_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED)


class RetryCancelled(Exception):
    """The call's `stop` event was set (before an attempt or during a backoff)."""


class RetryDeadlineExceeded(TimeoutError):
    """The overall deadline passed, or a backoff would have crossed it. `last_error` (also
    `__cause__`) is the last attempt's error, None if no attempt ran."""

    def __init__(self, message: str, last_error: Optional[BaseException]):
        super().__init__(message)
        self.last_error = last_error


def default_is_retryable(error: BaseException) -> bool:
    """gRPC UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, DEADLINE_EXCEEDED; ConnectionError and
    TimeoutError."""
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return error.code() in _RETRYABLE_GRPC_CODES
    return isinstance(error, (ConnectionError, TimeoutError))


@dataclass(frozen=True)
class RetryPolicy:
    """Which failures are retried, how often and how far apart (seconds)."""
    # Most attempts of one logical call, the first included (1 = never retry). >= 1.
    max_attempts: int = 4
    # Backoff before retry k is uniform in [0, min(max_backoff, initial * multiplier^(k-1))).
    initial_backoff: float = 0.05
    max_backoff: float = 5.0
    multiplier: float = 2.0
    # Time allowed to one attempt (Attempt.attempt_deadline); None: only the overall deadline.
    per_attempt_timeout: Optional[float] = None
    # Which exceptions are retried.
    is_retryable: Callable[[BaseException], bool] = field(default=default_is_retryable)
    # Tokens one retry takes (try_acquire(cost)): an int in [1, 1000000], or a function of the
    # failed attempt's error returning one, e.g. aws_cost (5, a timeout 10) or a price by the
    # request's size. The cost taken is the cost refunded when the retry is not sent.
    cost: Union[int, Callable[[BaseException], int]] = 1

    def validate(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or self.max_attempts < 1:
            raise InvalidOptions(f"policy.max_attempts is {self.max_attempts!r}; it must be >= 1")
        if not self.initial_backoff >= 0:
            raise InvalidOptions(f"policy.initial_backoff is {self.initial_backoff}; it must be "
                                 ">= 0")
        if not self.max_backoff >= self.initial_backoff:
            raise InvalidOptions(f"policy.max_backoff is {self.max_backoff}; it must be >= "
                                 f"initial_backoff = {self.initial_backoff}")
        if not self.multiplier >= 1:
            raise InvalidOptions(f"policy.multiplier is {self.multiplier}; it must be >= 1")
        if self.per_attempt_timeout is not None and not self.per_attempt_timeout > 0:
            raise InvalidOptions(f"policy.per_attempt_timeout is {self.per_attempt_timeout}; it "
                                 "must be > 0")
        if not callable(self.cost):
            _check_policy_cost(self.cost, "policy.cost is")

    def cost_of(self, error: BaseException) -> int:
        """The cost of a retry after `error`; InvalidOptions naming policy.cost when the cost
        (or what its function returned) is not an int in [1, 1000000]."""
        if not callable(self.cost):
            _check_policy_cost(self.cost, "policy.cost is")
            return self.cost
        cost = self.cost(error)
        _check_policy_cost(cost, f"policy.cost returned for {error!r}")
        return cost


def _check_policy_cost(cost, what: str) -> None:
    if isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST:
        raise InvalidOptions(f"{what} {cost!r}; it must be an integer in [1, {MAX_COST}]")


def aws_cost(error: BaseException) -> int:
    """AWS SDKs' standard retry quota's prices, for RetryPolicy(cost=aws_cost): a retry after
    a timeout (TimeoutError, gRPC DEADLINE_EXCEEDED) costs 10 tokens, after any other error 5."""
    if isinstance(error, TimeoutError):
        return 10
    if isinstance(error, grpc.RpcError) and hasattr(error, "code") \
            and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return 10
    return 5


@dataclass
class Attempt:
    """What an attempt is told about itself (times are on the call's clock, time.monotonic by
    default); it may set `pushback` (seconds >= 0: the server asked for this delay; < 0: do not
    retry) before raising."""
    number: int
    idempotency_key: str
    deadline: Optional[float]
    attempt_deadline: Optional[float]
    stop: Optional[threading.Event] = None
    pushback: Optional[float] = None

    def timeout(self, clock=time.monotonic) -> Optional[float]:
        """Seconds left to this attempt's deadline (None: none), for an RPC's timeout=."""
        return None if self.attempt_deadline is None else max(0.0, self.attempt_deadline - clock())


def new_idempotency_key() -> str:
    """A fresh random 128-bit key as 32 lowercase hex characters."""
    return secrets.token_hex(16)


def compute_backoff(policy: RetryPolicy, retry: int, random_value: float) -> float:
    """Full-jitter backoff before retry `retry` (1 = the first retry), for a value in [0, 1)."""
    ceiling = min(policy.max_backoff, policy.initial_backoff * policy.multiplier ** (retry - 1))
    return ceiling * min(max(random_value, 0.0), 1.0)


class _Loop:
    """The decisions of the loop, shared by the blocking and the asyncio helper."""

    def __init__(self, budget, policy, timeout, deadline, idempotency_key, random, clock, stop):
        policy.validate()
        self.budget = budget
        self.policy = policy
        self.clock = clock
        self.random = random or _random.random
        self.stop = stop
        if deadline is None and timeout is not None:
            deadline = clock() + timeout
        self.deadline = deadline
        self.key = idempotency_key or new_idempotency_key()
        self.number = 0
        self.last_error = None
        self.cost = 0  # of the retry whose token was taken last

    def first_attempt(self) -> Attempt:
        """The call's first attempt (next_attempt()), counted as one request."""
        attempt = self.next_attempt()
        self.budget.record_request()
        return attempt

    def next_attempt(self) -> Attempt:
        if self.stop is not None and self.stop.is_set():
            raise RetryCancelled("the call was stopped") from self.last_error
        now = self.clock()
        if self.deadline is not None and now >= self.deadline:
            raise RetryDeadlineExceeded(
                f"deadline exceeded before attempt {self.number + 1}; last error: "
                f"{self.last_error!r}", self.last_error) from self.last_error
        self.number += 1
        attempt_deadline = self.deadline
        if self.policy.per_attempt_timeout is not None:
            own = now + self.policy.per_attempt_timeout
            attempt_deadline = own if attempt_deadline is None else min(own, attempt_deadline)
        return Attempt(self.number, self.key, self.deadline, attempt_deadline, self.stop)

    def after_failure(self, attempt: Attempt, error: BaseException) -> float:
        """Raises `error` (or what replaces it) when the call ends here; otherwise returns the
        backoff to wait before the next attempt (acquire() then takes its token)."""
        self.last_error = error
        if self.stop is not None and self.stop.is_set():
            raise RetryCancelled("the call was stopped") from error
        if isinstance(error, BudgetExhausted) or not self.policy.is_retryable(error):
            raise error
        if isinstance(error, TimeoutError) and self.deadline is not None \
                and self.clock() >= self.deadline:
            raise error
        if self.number >= self.policy.max_attempts:
            raise error
        if attempt.pushback is not None and attempt.pushback < 0:
            raise error
        backoff = (attempt.pushback if attempt.pushback is not None
                   else compute_backoff(self.policy, self.number, self.random()))
        if self.deadline is not None and self.clock() + backoff >= self.deadline:
            raise RetryDeadlineExceeded(
                f"the backoff of {backoff:.3f}s would end past the deadline; last error: "
                f"{error!r}", error) from error
        return backoff

    def awaiting_first_answer(self) -> bool:
        """The tenant has not had its first answer yet (a new client): its denial would say
        nothing about the budget, so the helper waits for the answer before asking."""
        is_ready = getattr(self.budget, "is_ready", None)
        return is_ready is not None and not is_ready()

    def ready_wait_limit(self) -> Optional[float]:
        """How long the wait for the first answer may last: to the deadline (None: no limit;
        the answer comes within the client's sync_timeout even when the server is down)."""
        return None if self.deadline is None else max(0.0, self.deadline - self.clock())

    def acquire(self, backoff: float, waited: float) -> float:
        """After any wait for the first answer (`waited` seconds of the backoff spent in it):
        takes the token or raises; returns what is left of the backoff to wait."""
        error = self.last_error
        left = max(0.0, backoff - waited)
        if self.deadline is not None and self.clock() + left >= self.deadline:
            raise RetryDeadlineExceeded(
                f"the rest of the backoff, {left:.3f}s after {waited:.3f}s waiting for the "
                f"budget's first answer, would end past the deadline; last error: {error!r}",
                error) from error
        cost = self.policy.cost_of(error)
        if not self.budget.try_acquire(cost):
            raise BudgetExhausted(error, self.number) from error
        self.cost = cost
        return left


T = TypeVar("T")


def call_with_retry(budget, fn: Callable[[Attempt], T], *,
                    policy: Optional[RetryPolicy] = None,
                    timeout: Optional[float] = None, deadline: Optional[float] = None,
                    stop: Optional[threading.Event] = None, idempotency_key: str = "",
                    random: Optional[Callable[[], float]] = None,
                    clock: Callable[[], float] = time.monotonic) -> T:
    """Runs fn(attempt) and retries it as described at the top of this module. Blocks for at
    most about the deadline (`timeout` seconds from now, or the absolute `deadline` on `clock`)
    and wakes at once when `stop` is set. Returns fn's first result; raises the error that ended
    the call: a non-retryable error or the last one unchanged, BudgetExhausted, RetryCancelled,
    RetryDeadlineExceeded, or InvalidOptions for a bad policy (no attempt made)."""
    loop = _Loop(budget, policy or RetryPolicy(), timeout, deadline, idempotency_key, random,
                 clock, stop)
    attempt = loop.first_attempt()
    while True:
        try:
            result = fn(attempt)
        except Exception as error:  # noqa: BLE001 - the policy decides
            backoff = loop.after_failure(attempt, error)
        else:
            budget.record_success()
            return result
        waited = 0.0
        # (Not on the event loop of an AsyncBudgetClient: the answer could not come while this
        # thread blocks; its budget then decides at once.)
        if loop.awaiting_first_answer() and getattr(budget, "_may_block", lambda: True)():
            started = clock()
            if not _wait_ready(budget, loop.ready_wait_limit(), stop):
                raise RetryCancelled("the call was stopped during a backoff") from loop.last_error
            waited = clock() - started
        backoff = loop.acquire(backoff, waited)
        waiter = stop if stop is not None else threading.Event()
        if waiter.wait(backoff):
            budget.refund(loop.cost)  # the retry is never sent
            raise RetryCancelled("the call was stopped during a backoff") from loop.last_error
        attempt = loop.next_attempt()


# While waiting for a tenant's first answer with a `stop` event, how often `stop` is looked at
# (a threading.Event cannot wait for two events at once; the wait is about one Sync round trip).
_STOP_POLL = 0.002


def _wait_ready(budget, limit: Optional[float], stop: Optional[threading.Event]) -> bool:
    """Waits for the budget's first answer, at most `limit` seconds (None: no limit); False when
    `stop` was set. A wait that ends without the answer leaves the decision to acquire()."""
    if stop is None:
        budget.wait_ready(limit)
        return True
    end = None if limit is None else time.monotonic() + limit
    while not stop.is_set():
        left = _STOP_POLL if end is None else min(_STOP_POLL, end - time.monotonic())
        if left <= 0 or budget.wait_ready(left):
            return not stop.is_set()
    return False


async def async_call_with_retry(budget, fn: Callable[[Attempt], Awaitable[T]], *,
                                policy: Optional[RetryPolicy] = None,
                                timeout: Optional[float] = None,
                                deadline: Optional[float] = None, idempotency_key: str = "",
                                random: Optional[Callable[[], float]] = None,
                                clock: Callable[[], float] = time.monotonic) -> T:
    """call_with_retry() for a coroutine function fn(attempt). Cancelling the task cancels it:
    an attempt in flight gets the CancelledError; cancelled during a backoff, the token taken for
    the next retry is refund()ed and CancelledError propagates."""
    loop = _Loop(budget, policy or RetryPolicy(), timeout, deadline, idempotency_key, random,
                 clock, None)
    attempt = loop.first_attempt()
    while True:
        try:
            result = await fn(attempt)
        except Exception as error:  # noqa: BLE001 - CancelledError is a BaseException
            backoff = loop.after_failure(attempt, error)
        else:
            budget.record_success()
            return result
        waited = 0.0
        if loop.awaiting_first_answer():
            started = clock()
            await budget.ready(loop.ready_wait_limit())  # cancelled with the task: no token yet
            waited = clock() - started
        backoff = loop.acquire(backoff, waited)
        try:
            await asyncio.sleep(backoff)
        except asyncio.CancelledError:
            budget.refund(loop.cost)  # the retry is never sent
            raise
        attempt = loop.next_attempt()
