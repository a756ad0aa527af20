"""AsyncBudgetClient: BudgetClient's semantics on grpc.aio, for asyncio programs. The refresher
is a task on the running loop; the TenantBudget handles are the same objects as with threads
(try_acquire() never awaits, never blocks, never does I/O) and may be used from any number of
coroutines (and threads).

    async with retrybudget.AsyncBudgetClient(ClientOptions(target=...)) as client:
        budget = client.tenant("payments-db")
        result = await retrybudget.async_call_with_retry(budget, fetch)
"""

import asyncio
import dataclasses
import threading
from typing import Optional

import grpc

from ._proto import budget_pb2_grpc
from ._sync_engine import Outcome
from .client import make_channel, make_tenants_and_engine
from .options import ClientOptions, validate_and_default
from .tenant_budget import TenantBudget

_MAX_IDLE_SLEEP = 60.0


class AsyncBudgetClient:
    """Create it inside a running event loop (it starts its refresher task there). Raises
    InvalidOptions for bad options. `await close()` (or leaving `async with`) sends the final
    Sync returning every unspent token, then stops the task."""

    def __init__(self, options: Optional[ClientOptions] = None):
        o = validate_and_default(options if options is not None else ClientOptions())
        self.options = o
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._channel = make_channel(o, aio=True)
        # Connect now, so that a tenant's first Sync finds the connection made or under way.
        self._channel.get_state(try_to_connect=True)
        self._stub = budget_pb2_grpc.RetryBudgetServiceStub(self._channel)
        # Owner address -> (channel, stub), for the tenants a cluster redirected.
        self._owner_channels = {}
        self._tenants, self._engine = make_tenants_and_engine(o, self._wake)
        self._clock = o.clock
        self._wake_event = asyncio.Event()
        self._waiting_call = None
        self._waiting_woken = False
        self._stopping = False
        self._closed = False
        self._final_status = None
        self._close_lock = asyncio.Lock()
        self._task = self._loop.create_task(self._run(), name="retrybudget-refresher")

    @property
    def instance_id(self) -> str:
        return self.options.instance_id

    def tenant(self, name: str) -> TenantBudget:
        """As BudgetClient.tenant()."""
        budget = self._tenants.get_or_create(name)
        budget._refresher_thread = self._loop_thread
        return budget

    def last_sync_status(self):
        return self._engine.last_status

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
        return False

    def _wake(self) -> None:
        # From the loop's thread: set the event directly (no I/O). From another thread: hand it
        # to the loop (this path writes to the loop's wake-up pipe; it is rare).
        if threading.get_ident() == self._loop_thread:
            self._wake_now()
        else:
            try:
                self._loop.call_soon_threadsafe(self._wake_now)
            except RuntimeError:
                pass  # the loop is closed: nothing left to wake

    def _wake_now(self) -> None:
        self._wake_event.set()
        call = self._waiting_call
        if call is not None and not self._waiting_woken:
            self._waiting_woken = True
            call.cancel()

    def _stub_for(self, address):
        """As BudgetClient._stub_for() (channels of dropped routes are closed in the task)."""
        for dropped in self._engine.dropped_addresses:
            channel = self._owner_channels.pop(dropped, (None, None))[0]
            if channel is not None:
                self._loop.create_task(channel.close())
        self._engine.dropped_addresses.clear()
        if address is None:
            return self._stub
        if address not in self._owner_channels:
            channel = make_channel(dataclasses.replace(self.options, target=address), aio=True,
                                   main=False)
            self._owner_channels[address] = (channel,
                                             budget_pb2_grpc.RetryBudgetServiceStub(channel))
        return self._owner_channels[address][1]

    async def _call_sync(self, request, timeout, wait_for_ready, cancellable,
                         stub=None) -> Outcome:
        stub = stub if stub is not None else self._stub
        call = stub.Sync(request, timeout=timeout, metadata=self._engine.metadata,
                               wait_for_ready=wait_for_ready)
        if cancellable and wait_for_ready:
            self._waiting_call = call
            self._waiting_woken = False
        try:
            return Outcome(response=await call)
        except asyncio.CancelledError:
            if self._waiting_woken and call.cancelled():
                return Outcome(code=grpc.StatusCode.CANCELLED, details="cancelled", woken=True)
            raise
        except grpc.RpcError as error:
            return Outcome(code=error.code(), details=error.details() or "")
        finally:
            if cancellable and wait_for_ready:
                self._waiting_call = None

    async def _run(self) -> None:
        engine = self._engine
        while not self._stopping:
            self._wake_event.clear()
            plan = engine.begin_step()
            while plan is not None:
                outcome = await self._call_sync(plan.request, plan.timeout, plan.wait_for_ready,
                                                True, self._stub_for(plan.address))
                engine.end_attempt(plan, outcome)
                plan = engine.next_plan()
            nxt = engine.end_step()
            if self._stopping:
                return
            if self._wake_event.is_set():
                continue
            delay = min(nxt - self._clock(), _MAX_IDLE_SLEEP)
            if delay > 0:
                try:
                    await asyncio.wait_for(self._wake_event.wait(), delay)
                except asyncio.TimeoutError:
                    pass

    async def close(self):
        """As BudgetClient.close(): None when the final Sync got a response, else the error."""
        async with self._close_lock:
            if self._closed:
                return self._final_status
            self._stopping = True
            self._wake_event.set()
            # The step in flight (its Sync bounded by sync_timeout) finishes first.
            await asyncio.shield(self._task)
            self._tenants.close()
            self._final_status = await self._final_sync()
            self._closed = True
            await self._channel.close()
            for channel, _ in self._owner_channels.values():
                await channel.close()
            return self._final_status

    async def _final_sync(self):
        engine = self._engine
        if not engine.begin_final():
            return None
        # Every server that holds tenants of this instance gets its final Sync.
        final = engine.next_final()
        while final is not None:
            address, request = final
            wait = engine.final_wait_for_ready(address)
            stub = self._stub_for(address)
            attempt = 1
            while True:
                outcome = await self._call_sync(request, engine.sync_timeout, wait, False, stub)
                delay = engine.end_final(outcome, attempt)
                if delay is None:
                    break
                await asyncio.sleep(delay)
                attempt += 1
            final = engine.next_final()
        engine.finish_final()
        return engine.last_status
