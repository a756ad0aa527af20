"""The tenants a client knows, by name. Thread-safe."""

import threading

from ._bucket_math import BucketShape
from ._types import ClientClosed, InvalidOptions
from .tenant_budget import TenantBudget, check_tenant_name

# One Sync carries at most 256 entries (budget.proto).
MAX_TENANTS_PER_CLIENT = 256


class TenantRegistry:
    def __init__(self, clock, waker, fallback_mode: str, never_reached: BucketShape):
        self._clock = clock
        self._waker = waker
        self._fallback_mode = fallback_mode
        self._never_reached = never_reached
        self._mu = threading.Lock()
        self._by_name = {}
        self._ordered = []
        self._closed = False

    def get_or_create(self, name: str) -> TenantBudget:
        with self._mu:
            budget = self._by_name.get(name)
            if budget is not None:
                return budget
            check_tenant_name(name)
            if self._closed:
                raise ClientClosed(f"tenant {name!r} asked for after close()")
            if len(self._ordered) >= MAX_TENANTS_PER_CLIENT:
                raise InvalidOptions(f"tenant {name!r} would be tenant number "
                                     f"{len(self._ordered) + 1}; one client may use at most "
                                     f"{MAX_TENANTS_PER_CLIENT}")
            budget = TenantBudget(name, self._waker, self._clock(), self._fallback_mode,
                                  self._never_reached)
            self._by_name[name] = budget
            self._ordered.append(budget)
        self._waker()  # its first lease is asked for at once
        return budget

    def snapshot(self):
        with self._mu:
            return list(self._ordered)

    def close(self) -> None:
        with self._mu:
            self._closed = True
