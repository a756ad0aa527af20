"""retrybudget: Python workers leasing retry tokens from a retry-budget server, sharing one
fleet-wide budget with C++ workers. See README.md ("Python workers") and docs/DESIGN.md.

    import retrybudget
    with retrybudget.BudgetClient(retrybudget.ClientOptions(target="127.0.0.1:50051")) as c:
        budget = c.tenant("payments-db")
        row = retrybudget.call_with_retry(budget, lambda attempt: db.get(key), timeout=2.0)
"""

import pkgutil

# The generated modules (retrybudget.v1.budget_pb2, ...) may live in another sys.path entry (the
# build tree's gen/ directory) than this source: let the package span both.
__path__ = pkgutil.extend_path(__path__, __name__)

from ._types import (DENY_FALLBACK, ENFORCE, FALLBACK, LEASE, MODES, NO_LEASE,  # noqa: E402
                     SHADOW, BudgetExhausted, ClientClosed, InvalidOptions, TenantStats)
from .options import ClientOptions  # noqa: E402
from .client import BudgetClient  # noqa: E402
from .aio import AsyncBudgetClient  # noqa: E402
from .retry import (Attempt, RetryCancelled, RetryDeadlineExceeded, RetryPolicy,  # noqa: E402
                    async_call_with_retry, aws_cost, call_with_retry, compute_backoff,
                    default_is_retryable, new_idempotency_key)
from .tenant_budget import TenantBudget  # noqa: E402
from .grpc_interceptor import (BUDGET_EXHAUSTED_TRAILER, DISABLE_GRPC_RETRIES,  # noqa: E402
                               IDEMPOTENCY_KEY_HEADER, PREVIOUS_ATTEMPTS_HEADER,
                               RETRY_PUSHBACK_HEADER, AioBudgetExhaustedError,
                               AioBudgetInterceptor, AioRetryDeadlineError,
                               BudgetExhaustedRpcError, BudgetInterceptor, RetryDeadlineRpcError,
                               parse_retry_pushback)

__all__ = [
    "AioBudgetExhaustedError", "AioBudgetInterceptor", "AioRetryDeadlineError",
    "AsyncBudgetClient", "Attempt", "BUDGET_EXHAUSTED_TRAILER", "BudgetClient",
    "BudgetExhausted", "BudgetExhaustedRpcError", "BudgetInterceptor", "ClientClosed",
    "ClientOptions", "DENY_FALLBACK", "DISABLE_GRPC_RETRIES", "ENFORCE", "FALLBACK",
    "IDEMPOTENCY_KEY_HEADER", "InvalidOptions", "LEASE", "MODES", "NO_LEASE",
    "PREVIOUS_ATTEMPTS_HEADER", "RETRY_PUSHBACK_HEADER", "RetryCancelled",
    "RetryDeadlineExceeded", "RetryDeadlineRpcError", "RetryPolicy", "SHADOW", "TenantBudget",
    "TenantStats", "async_call_with_retry", "aws_cost", "call_with_retry", "compute_backoff",
    "default_is_retryable", "new_idempotency_key", "parse_retry_pushback",
]
