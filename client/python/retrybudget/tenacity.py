"""tenacity integration: an existing `@retry(...)` becomes budgeted with one added argument.

    from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential
    from retrybudget.tenacity import retry_if_budget_allows

    @retry(stop=stop_after_attempt(4), wait=wait_random_exponential(0.05, 2),
           retry=retry_if_budget_allows(budget, retry_if_exception_type(ConnectionError)))
    def fetch(): ...

retry_if_budget_allows(budget, retry=..., cost=1) wraps the decorator's `retry=` condition
(default: any exception). It counts each call once with budget.record_request() (when its first
attempt ends: tenacity asks the condition after every attempt). On a success it calls
budget.record_success(). On a failure that `retry` would retry and that the decorator's own
`stop` would not stop, it takes the retry's cost with try_acquire(cost): taken, tenacity sleeps
and retries; denied, BudgetExhausted is raised from the attempt's exception (no RetryError, no
further attempt). So tokens are spent exactly for each retry sent. `cost` is an int in
[1, 1000000] or a function of the attempt's exception returning one (retrybudget.retry.aws_cost:
5, a timeout 10).

stop_when_budget_exhausted(budget, cost=1) is the same decision as a stop condition, for code
that keeps its `retry=` as it is: put it LAST in the stop chain, `stop=stop_after_attempt(4) |
stop_when_budget_exhausted(budget)` (tenacity evaluates `|` left to right and stops at the first
that says stop, so the budget is asked only when nothing else stops). Denied, it raises
BudgetExhausted from the attempt's exception. It cannot see successes nor every call's first
attempt: call budget.record_success() yourself, and pass `before=record_request(budget)` to the
decorator (or use retry_if_budget_allows).

The hooks do not wait for a new client's first answer (a condition cannot tell a blocking
caller from an event loop, whose refresher a blocking wait would stall): until the tenant's first
lease try_acquire() denies, so call budget.wait_ready(timeout) (or await budget.ready(timeout))
once after creating the client.

A token is taken before tenacity's sleep; tenacity's sleep cannot be interrupted, so a caller that
must cancel during the backoff (and get the token refunded) uses retrybudget.call_with_retry or
async_call_with_retry instead."""

import tenacity as _tenacity

from ._types import BudgetExhausted
from .retry import RetryPolicy


def _pricer(cost):
    """cost (an int or a function of the exception) as a function of the exception; an int out
    of range is refused now (InvalidOptions naming policy.cost)."""
    policy = RetryPolicy(cost=cost)
    policy.validate()
    return policy.cost_of


def record_request(budget):
    """A `before=` hook for tenacity: budget.record_request() once per call (before its first
    attempt)."""
    def before(retry_state) -> None:
        if retry_state.attempt_number == 1:
            budget.record_request()
    return before


class retry_if_budget_allows(_tenacity.retry_base):  # noqa: N801 - tenacity's naming
    def __init__(self, budget, retry=None, cost=1):
        self._budget = budget
        self._retry = retry if retry is not None else _tenacity.retry_if_exception_type()
        self._cost_of = _pricer(cost)

    def __call__(self, retry_state) -> bool:
        if retry_state.attempt_number == 1:
            self._budget.record_request()
        outcome = retry_state.outcome
        if not outcome.failed:
            if not self._retry(retry_state):
                self._budget.record_success()
                return False
            return True  # a result the caller retries on (retry_if_result): not a success
        if not self._retry(retry_state):
            return False
        # The decorator's own stop condition ends the call anyway: no token for it.
        if retry_state.retry_object.stop(retry_state):
            return True
        error = outcome.exception()
        if self._budget.try_acquire(self._cost_of(error)):
            return True
        raise BudgetExhausted(error, retry_state.attempt_number) from error


class stop_when_budget_exhausted(_tenacity.stop.stop_base):  # noqa: N801
    def __init__(self, budget, cost=1):
        self._budget = budget
        self._cost_of = _pricer(cost)

    def __call__(self, retry_state) -> bool:
        error = retry_state.outcome.exception()
        if self._budget.try_acquire(self._cost_of(error)):
            return False
        raise BudgetExhausted(error, retry_state.attempt_number) from error
