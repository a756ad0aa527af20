"""tenacity integration: an existing `@retry(...)` becomes budgeted with one added argument.

    from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential
    from retrybudget.tenacity import retry_if_budget_allows

    @retry(stop=stop_after_attempt(4), wait=wait_random_exponential(0.05, 2),
           retry=retry_if_budget_allows(budget, retry_if_exception_type(ConnectionError)))
    def fetch(): ...

retry_if_budget_allows(budget, retry=...) wraps the decorator's `retry=` condition (default: any
exception). On a success it calls budget.record_success(). On a failure that `retry` would retry
and that the decorator's own `stop` would not stop, it takes one token with try_acquire(): taken,
tenacity sleeps and retries; denied, BudgetExhausted is raised from the attempt's exception (no
RetryError, no further attempt). So a token is spent exactly for each retry sent.

stop_when_budget_exhausted(budget) is the same decision as a stop condition, for code that
keeps its `retry=` as it is: put it LAST in the stop chain, `stop=stop_after_attempt(4) |
stop_when_budget_exhausted(budget)` (tenacity evaluates `|` left to right and stops at the first
that says stop, so the budget is asked only when nothing else stops). Denied, it raises
BudgetExhausted from the attempt's exception. It cannot see successes: call
budget.record_success() yourself, or use retry_if_budget_allows.

The hooks do not wait for a new client's first answer (a condition cannot tell a blocking
caller from an event loop, whose refresher a blocking wait would stall): until the tenant's first
lease try_acquire() denies, so call budget.wait_ready(timeout) (or await budget.ready(timeout))
once after creating the client.

A token is taken before tenacity's sleep; tenacity's sleep cannot be interrupted, so a caller that
must cancel during the backoff (and get the token refunded) uses retrybudget.call_with_retry or
async_call_with_retry instead."""

import tenacity as _tenacity

from ._types import BudgetExhausted


class retry_if_budget_allows(_tenacity.retry_base):  # noqa: N801 - tenacity's naming
    def __init__(self, budget, retry=None):
        self._budget = budget
        self._retry = retry if retry is not None else _tenacity.retry_if_exception_type()

    def __call__(self, retry_state) -> bool:
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
        if self._budget.try_acquire():
            return True
        error = outcome.exception()
        raise BudgetExhausted(error, retry_state.attempt_number) from error


class stop_when_budget_exhausted(_tenacity.stop.stop_base):  # noqa: N801
    def __init__(self, budget):
        self._budget = budget

    def __call__(self, retry_state) -> bool:
        if self._budget.try_acquire():
            return False
        error = retry_state.outcome.exception()
        raise BudgetExhausted(error, retry_state.attempt_number) from error
