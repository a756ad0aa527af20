"""gRPC client interceptors that retry unary-unary calls through the retry budget, as Go's
UnaryClientInterceptor, the JS retryInterceptor and the C++ RetryUnary():

    channel = grpc.intercept_channel(
        grpc.insecure_channel(target, options=retrybudget.DISABLE_GRPC_RETRIES),
        retrybudget.BudgetInterceptor(budget))
    channel = grpc.aio.insecure_channel(target, options=retrybudget.DISABLE_GRPC_RETRIES,
                                        interceptors=[retrybudget.AioBudgetInterceptor(budget)])

Each call runs through call_with_retry / async_call_with_retry (retry.py), so the rules are
the helpers' own:
 * budget.record_request() once per call, budget.record_success() once when an attempt
   succeeds; every retry takes budget.try_acquire(cost), the cost from RetryPolicy.cost (an
   int, or a function of the failed attempt's grpc.RpcError, e.g. retrybudget.aws_cost: 5, and
   10 after DEADLINE_EXCEEDED); a new client's first retry waits for the tenant's first answer
   inside the backoff.
 * Retried: UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, and DEADLINE_EXCEEDED while the call's
   own deadline has time left (an attempt's own timeout, RetryPolicy.per_attempt_timeout); any
   other code, or RetryPolicy.is_retryable saying no, ends the call with that status unchanged.
 * The call's timeout is the overall deadline: each attempt gets the time left (at most
   per_attempt_timeout), and a backoff that would end at or after the deadline is not started
   (no token taken): the call fails with DEADLINE_EXCEEDED, an error that is also a
   RetryDeadlineExceeded (`last_error`: the last attempt's error).
 * The backoff is full jitter, or the server's pushback: trailer `grpc-retry-pushback-ms` >= 0
   replaces it; a negative or unparsable value means "do not retry".
 * Every attempt carries metadata `x-idempotency-key` (the same on all attempts of a call: the
   caller's own value when its metadata has one, else a fresh random key) and, on retries,
   `grpc-previous-rpc-attempts` (the attempts before this one, as gRFC A6).
 * A retry the budget denies ends the call at once with the last attempt's code: the error is
   also a BudgetExhausted (`last_error`, `attempts`), its details end with "(retry budget
   exhausted after N attempt(s))" and its trailers hold `retry-budget-exhausted: N`. An
   attempt's error that is already a BudgetExhausted (an inner budgeted layer said no) is
   never retried.
 * asyncio: cancelling the call (call.cancel(), or its task) cancels the attempt in flight,
   or ends the backoff and refund()s the retry's tokens, or ends the wait for the tenant's
   first answer (no token taken yet).
Streaming calls pass through untouched (neither class intercepts them). The blocking
interceptor has no cancellation but the deadline; a `.future()` call through it blocks the
calling thread until the call has ended (the returned future is already done).

Channels should be built with DISABLE_GRPC_RETRIES: gRPC's own retries would be a second,
budget-blind retry layer, and while they are on gRPC drops `grpc-previous-rpc-attempts`.
Both classes are thread-safe: nothing is kept between calls."""

import collections
import dataclasses
import time
from typing import Callable, List, Optional, Tuple

import grpc
import grpc.aio

from ._types import BudgetExhausted
from .retry import (Attempt, RetryDeadlineExceeded, RetryPolicy, async_call_with_retry,
                    call_with_retry)

IDEMPOTENCY_KEY_HEADER = "x-idempotency-key"
PREVIOUS_ATTEMPTS_HEADER = "grpc-previous-rpc-attempts"
RETRY_PUSHBACK_HEADER = "grpc-retry-pushback-ms"
BUDGET_EXHAUSTED_TRAILER = "retry-budget-exhausted"
# Channel options that turn gRPC's built-in retries off (grpc.insecure_channel(target,
# options=DISABLE_GRPC_RETRIES)).
DISABLE_GRPC_RETRIES = (("grpc.enable_retries", 0),)

# A pushback past an hour is read as an hour, as Go's ParseRetryPushback does.
_MAX_PUSHBACK = 3600.0


def parse_retry_pushback(trailers) -> Optional[float]:
    """The server's pushback in `trailers` (pairs, or grpc.aio.Metadata), in seconds: None when
    `grpc-retry-pushback-ms` is absent; its value when a non-negative integer; -1.0 ("do not
    retry") when it is negative or unparsable. Only the first value counts."""
    for key, value in trailers or ():
        if key != RETRY_PUSHBACK_HEADER:
            continue
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        try:
            ms = int(str(value).strip())
        except ValueError:
            return -1.0
        return -1.0 if ms < 0 else min(ms / 1000.0, _MAX_PUSHBACK)
    return None


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                         "compression")), grpc.ClientCallDetails):
    """An attempt's grpc.ClientCallDetails (the blocking API)."""


class _Plan:
    """One intercepted call: its deadline, idempotency key and policy, and each attempt's
    details. The policy's is_retryable also refuses DEADLINE_EXCEEDED once the call's own
    deadline has passed (the call ran out of time; an attempt's own timeout is retried)."""

    def __init__(self, policy: RetryPolicy, details, clock: Callable[[], float]):
        self.details = details
        self.clock = clock
        timeout = getattr(details, "timeout", None)
        self.deadline = None if timeout is None else clock() + timeout
        # The deadline the last attempt was given: the call's own when per_attempt_timeout did
        # not cut it shorter.
        self.attempt_deadline: Optional[float] = None
        self.metadata = _pairs(getattr(details, "metadata", None))
        self.key = next((v for k, v in self.metadata if k == IDEMPOTENCY_KEY_HEADER), "")
        if isinstance(self.key, bytes):
            self.key = self.key.decode("ascii", "replace")
        is_retryable = policy.is_retryable
        self.policy = dataclasses.replace(
            policy, is_retryable=lambda error: is_retryable(error) and not self._out_of_time(error))

    def _out_of_time(self, error: BaseException) -> bool:
        # gRPC's timer may end an attempt a little before this clock reaches the deadline: an
        # attempt that had all the call's time left ran out of the call's time.
        return (self.deadline is not None and _code(error) == grpc.StatusCode.DEADLINE_EXCEEDED
                and (self.clock() >= self.deadline
                     or (self.attempt_deadline is not None
                         and self.attempt_deadline >= self.deadline)))

    def attempt_metadata(self, attempt: Attempt) -> List[Tuple[str, str]]:
        own = (IDEMPOTENCY_KEY_HEADER, PREVIOUS_ATTEMPTS_HEADER)
        pairs = [(k, v) for k, v in self.metadata if k not in own]
        pairs.append((IDEMPOTENCY_KEY_HEADER, attempt.idempotency_key))
        if attempt.number > 1:
            pairs.append((PREVIOUS_ATTEMPTS_HEADER, str(attempt.number - 1)))
        return pairs

    def blocking_details(self, attempt: Attempt):
        self.attempt_deadline = attempt.attempt_deadline
        timeout, metadata = attempt.timeout(self.clock), self.attempt_metadata(attempt)
        d = _replaced(self.details, timeout, metadata)
        return d if d is not None else _CallDetails(
            self.details.method, timeout, metadata, getattr(self.details, "credentials", None),
            getattr(self.details, "wait_for_ready", None),
            getattr(self.details, "compression", None))

    def aio_details(self, attempt: Attempt):
        self.attempt_deadline = attempt.attempt_deadline
        timeout = attempt.timeout(self.clock)
        metadata = grpc.aio.Metadata(*self.attempt_metadata(attempt))
        d = _replaced(self.details, timeout, metadata)
        return d if d is not None else grpc.aio.ClientCallDetails(
            self.details.method, timeout, metadata, getattr(self.details, "credentials", None),
            getattr(self.details, "wait_for_ready", None))


def _replaced(details, timeout, metadata):
    """`details` with this timeout and metadata when it is a namedtuple that has them (gRPC's
    own, keeping any field a newer gRPC adds), else None."""
    replace = getattr(details, "_replace", None)
    if replace is None:
        return None
    try:
        return replace(timeout=timeout, metadata=metadata)
    except (TypeError, ValueError):
        return None


def _pairs(metadata) -> List[Tuple[str, str]]:
    return [(k, v) for k, v in (metadata or ())]


def _code(error: BaseException):
    code = getattr(error, "code", None)
    return code() if callable(code) else None


class _Last:
    """The last attempt's outcome (blocking: the grpc.Call / Future) and error."""

    def __init__(self):
        self.outcome = None
        self.error: Optional[BaseException] = None


def _exhausted_details(last: BaseException, attempts: int) -> str:
    return f"{last.details()} (retry budget exhausted after {attempts} attempt(s))"


def _deadline_details(ended: RetryDeadlineExceeded) -> str:
    reason = str(ended).split("; last error:", 1)[0]
    last = ended.last_error
    if last is None or _code(last) is None:
        return f"{reason} (retry budget interceptor)"
    return f"{reason} (retry budget interceptor); last attempt: {last.code().name} " \
           f"{last.details()}"


def _exhausted_trailers(last: BaseException, attempts: int) -> List[Tuple[str, str]]:
    return _pairs(last.trailing_metadata()) + [(BUDGET_EXHAUSTED_TRAILER, str(attempts))]


class _EndedCall(grpc.RpcError, grpc.Call, grpc.Future):
    """A call the interceptor ended (not the last attempt's own status): a done grpc.Call and
    grpc.Future whose result() raises it."""

    def _set_status(self, code, details, initial, trailing) -> None:
        self._code = code
        self._details = details
        self._initial = initial
        self._trailing = tuple(trailing)

    def code(self):
        return self._code

    def details(self):
        return self._details

    def initial_metadata(self):
        return self._initial

    def trailing_metadata(self):
        return self._trailing

    def debug_error_string(self) -> str:
        return self._details

    def is_active(self) -> bool:
        return False

    def time_remaining(self):
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout=None):
        raise self

    def exception(self, timeout=None):
        return self

    def traceback(self, timeout=None):
        return self.__traceback__

    def add_done_callback(self, fn) -> None:
        fn(self)


class BudgetExhaustedRpcError(BudgetExhausted, _EndedCall):
    """The blocking interceptor's denied call: the last attempt's code, its details marked,
    trailer `retry-budget-exhausted`; a BudgetExhausted and a grpc.RpcError."""

    def __init__(self, last, attempts: int):
        BudgetExhausted.__init__(self, last, attempts)
        self._set_status(last.code(), _exhausted_details(last, attempts),
                         last.initial_metadata(), _exhausted_trailers(last, attempts))


class RetryDeadlineRpcError(RetryDeadlineExceeded, _EndedCall):
    """The blocking interceptor's call that ran out of time before a retry: DEADLINE_EXCEEDED;
    a RetryDeadlineExceeded (`last_error`) and a grpc.RpcError."""

    def __init__(self, ended: RetryDeadlineExceeded):
        details = _deadline_details(ended)
        RetryDeadlineExceeded.__init__(self, details, ended.last_error)
        self._set_status(grpc.StatusCode.DEADLINE_EXCEEDED, details, None, ())


class AioBudgetExhaustedError(BudgetExhausted, grpc.aio.AioRpcError):
    """AioBudgetInterceptor's denied call: as BudgetExhaustedRpcError, a grpc.aio.AioRpcError."""

    def __init__(self, last, attempts: int):
        grpc.aio.AioRpcError.__init__(
            self, last.code(), last.initial_metadata(),
            grpc.aio.Metadata(*_exhausted_trailers(last, attempts)),
            _exhausted_details(last, attempts), last.debug_error_string())
        self.last_error = last
        self.attempts = attempts

    __str__ = grpc.aio.AioRpcError.__str__
    __repr__ = grpc.aio.AioRpcError.__repr__


class AioRetryDeadlineError(RetryDeadlineExceeded, grpc.aio.AioRpcError):
    """AioBudgetInterceptor's call that ran out of time before a retry: as
    RetryDeadlineRpcError, a grpc.aio.AioRpcError."""

    def __init__(self, ended: RetryDeadlineExceeded):
        details = _deadline_details(ended)
        grpc.aio.AioRpcError.__init__(self, grpc.StatusCode.DEADLINE_EXCEEDED,
                                      grpc.aio.Metadata(), grpc.aio.Metadata(), details, details)
        self.last_error = ended.last_error

    __str__ = grpc.aio.AioRpcError.__str__
    __repr__ = grpc.aio.AioRpcError.__repr__


class _BudgetedCalls:
    """What both interceptors hold: the budget, the validated policy, and call_with_retry's
    `random` and `clock`."""

    def __init__(self, budget, policy: Optional[RetryPolicy] = None, *,
                 random: Optional[Callable[[], float]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self._budget = budget
        self._policy = policy if policy is not None else RetryPolicy()
        self._policy.validate()
        self._random = random
        self._clock = clock


class BudgetInterceptor(_BudgetedCalls, grpc.UnaryUnaryClientInterceptor):
    """For grpc.intercept_channel(channel, BudgetInterceptor(budget)): every unary-unary call
    of the channel retried as described at the top of this module. `budget`: a TenantBudget
    (or anything with its methods); `policy`: a RetryPolicy (InvalidOptions here when it is
    bad; a cost function returning a bad cost raises InvalidOptions from the call); `random`
    and `clock` as call_with_retry's."""

    def intercept_unary_unary(self, continuation, client_call_details, request):
        plan = _Plan(self._policy, client_call_details, self._clock)
        last = _Last()

        def attempt(a: Attempt):
            outcome = continuation(plan.blocking_details(a), request)
            error = outcome.exception()  # blocks until a .future() call has ended
            if error is None:
                return outcome
            last.outcome, last.error = outcome, error
            if isinstance(error, grpc.Call):
                a.pushback = parse_retry_pushback(error.trailing_metadata())
            raise error

        try:
            return call_with_retry(self._budget, attempt, policy=plan.policy,
                                   deadline=plan.deadline, idempotency_key=plan.key,
                                   random=self._random, clock=self._clock)
        except Exception as ended:  # noqa: BLE001 - sorted below
            if ended is last.error:
                return last.outcome  # the last attempt's status, unchanged
            if isinstance(ended, BudgetExhausted) and isinstance(last.error, grpc.Call):
                return BudgetExhaustedRpcError(last.error, ended.attempts)
            if isinstance(ended, RetryDeadlineExceeded):
                return RetryDeadlineRpcError(ended)
            raise


class AioBudgetInterceptor(_BudgetedCalls, grpc.aio.UnaryUnaryClientInterceptor):
    """For grpc.aio channels (interceptors=[AioBudgetInterceptor(budget)]): as
    BudgetInterceptor, with async_call_with_retry; a call that ends in error raises
    grpc.aio.AioRpcError (AioBudgetExhaustedError, AioRetryDeadlineError, or the last
    attempt's own)."""

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        plan = _Plan(self._policy, client_call_details, self._clock)
        last = _Last()

        async def attempt(a: Attempt):
            try:
                call = await continuation(plan.aio_details(a), request)
                await call
            except grpc.aio.AioRpcError as error:
                last.error = error
                a.pushback = parse_retry_pushback(error.trailing_metadata())
                raise
            return call

        try:
            return await async_call_with_retry(self._budget, attempt, policy=plan.policy,
                                               deadline=plan.deadline, idempotency_key=plan.key,
                                               random=self._random, clock=self._clock)
        except Exception as ended:  # noqa: BLE001 - sorted below
            if ended is last.error:
                raise
            if isinstance(ended, BudgetExhausted) and isinstance(last.error,
                                                                 grpc.aio.AioRpcError):
                raise AioBudgetExhaustedError(last.error, ended.attempts) from last.error
            if isinstance(ended, RetryDeadlineExceeded):
                raise AioRetryDeadlineError(ended) from ended.last_error
            raise


__all__ = [
    "AioBudgetExhaustedError", "AioBudgetInterceptor", "AioRetryDeadlineError",
    "BUDGET_EXHAUSTED_TRAILER", "BudgetExhaustedRpcError", "BudgetInterceptor",
    "DISABLE_GRPC_RETRIES", "IDEMPOTENCY_KEY_HEADER", "PREVIOUS_ATTEMPTS_HEADER",
    "RETRY_PUSHBACK_HEADER", "RetryDeadlineRpcError", "parse_retry_pushback",
]
