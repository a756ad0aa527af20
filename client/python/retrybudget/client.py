"""BudgetClient: one per worker process, one TenantBudget per tenant it retries against, and one
background refresher thread that leases tokens for all of them with one Sync RPC.

    client = retrybudget.BudgetClient(retrybudget.ClientOptions(target="127.0.0.1:50051"))
    budget = client.tenant("payments-db")
    if call_failed and budget.try_acquire(): retry()      # else fail now
    if call_succeeded: budget.record_success()
    client.close()                                         # or use `with BudgetClient(...)`

The hot path is local (no RPC); when the server is unreachable the client never fails open: it
spends its lease to its expiry, then falls back to a local bucket sized by the server's last
SafeShares (ClientOptions.fallback), and goes back to leases when the server answers again."""

import dataclasses
import threading
from typing import Optional

import grpc

from ._bucket_math import BucketShape, RefreshPolicy
from ._proto import budget_pb2_grpc
from ._registry import TenantRegistry
from ._sync_engine import Outcome, SyncEngine
from .options import ClientOptions, channel_options, validate_and_default
from .tenant_budget import TenantBudget

# The thread never sleeps longer than this in one go.
_MAX_IDLE_SLEEP = 60.0


def make_channel(o: ClientOptions, aio: bool = False, main: bool = True):
    """The channel to o.target: the main one (round_robin), or an owner's (`main` False)."""
    mod = grpc.aio if aio else grpc
    args = channel_options(o, main)
    if o.channel_credentials is None:
        return mod.insecure_channel(o.target, options=args)
    return mod.secure_channel(o.target, o.channel_credentials, options=args)


def start_connecting(channel) -> None:
    """Starts connecting `channel` now, so that a tenant's first Sync finds the connection made
    or under way. Through the channel core's try-to-connect check, which grpc's own
    connectivity watcher uses; grpc.channel_ready_future would do it with a polling thread that
    delays a first Sync made at once by about 0.3 ms. A channel without it (another grpc
    version, a test's channel) connects at its first Sync as before."""
    check = getattr(getattr(channel, "_channel", None), "check_connectivity_state", None)
    if check is not None:
        try:
            check(True)
        except Exception:  # noqa: BLE001 - an optimisation only
            pass


def make_metrics(o: ClientOptions):
    if o.metrics_registry is None:
        return None
    from .metrics import PrometheusClientMetrics
    return PrometheusClientMetrics(o.metrics_registry)


def make_tenants_and_engine(o: ClientOptions, wake):
    """The tenant registry and the Sync engine over it, as both clients (threads, asyncio) use
    them; `wake` is called when a tenant needs the refresher sooner."""
    tenants = TenantRegistry(o.clock, wake, o.fallback,
                             BucketShape(o.fallback_capacity, o.fallback_refill_per_second))
    engine = SyncEngine(
        o.instance_id, RefreshPolicy(o.refresh_period, o.min_sync_interval, o.lease_burst),
        o.sync_timeout, o.bearer_token, o.clock, tenants, make_metrics(o))
    return tenants, engine


class BudgetClient:
    """Thread-safe. Creating it starts the refresher (and the connection) and does not wait for
    the server: until a tenant's first answer, about one round trip after its handle is created,
    its try_acquire() denies (budget.wait_ready() waits for it; the retry helpers do). close()
    (or leaving a `with` block) sends a final Sync that reports every counter and returns every
    unspent token (at most 3 attempts, same seq, each bounded by sync_timeout), then stops the
    refresher. Raises InvalidOptions for bad options, naming the field and value."""

    def __init__(self, options: Optional[ClientOptions] = None, *, _channel=None,
                 _owner_channel_factory=None):
        o = validate_and_default(options if options is not None else ClientOptions())
        self.options = o
        self._channel = _channel if _channel is not None else make_channel(o)
        # Owner address -> (channel, stub), for the tenants a cluster redirected.
        self._owner_channels = {}
        self._owner_channel_factory = _owner_channel_factory
        self._stub = budget_pb2_grpc.RetryBudgetServiceStub(self._channel)
        start_connecting(self._channel)
        self._tenants, self._engine = make_tenants_and_engine(o, self._wake)
        self._clock = o.clock
        self._wake_mu = threading.Lock()
        self._wake_event = threading.Event()
        self._stopping = False
        self._waiting_call = None
        self._waiting_woken = False
        self._close_mu = threading.Lock()
        self._final_status = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="retrybudget-refresher",
                                        daemon=True)
        self._thread.start()

    @property
    def instance_id(self) -> str:
        return self.options.instance_id

    def tenant(self, name: str) -> TenantBudget:
        """The handle for `name` (created on first call; the same object afterwards). Raises
        InvalidOptions for a malformed name or past 256 tenants, ClientClosed after close().
        Takes a lock: keep the handle rather than calling this per retry."""
        return self._tenants.get_or_create(name)

    def last_sync_status(self):
        """None when the last Sync attempt got a response, else "CODE: message"."""
        return self._engine.last_status

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- the refresher thread ----

    def _wake(self) -> None:
        with self._wake_mu:
            self._wake_event.set()
            call = self._waiting_call
            if call is not None and not self._waiting_woken:
                # A Sync waiting for the channel to connect would hold the wake to its deadline.
                self._waiting_woken = True
                call.cancel()

    def _call_sync(self, request, timeout: float, wait_for_ready: bool,
                   cancellable: bool, stub=None) -> Outcome:
        stub = stub if stub is not None else self._stub
        if not (cancellable and wait_for_ready):
            # Nothing will cancel it: the blocking call, which waits for its completion in this
            # thread (a future's result comes through another thread: about 0.7 ms more per
            # Sync on loopback).
            try:
                return Outcome(response=stub.Sync(request, timeout=timeout,
                                                  metadata=self._engine.metadata,
                                                  wait_for_ready=wait_for_ready))
            except grpc.RpcError as error:
                return Outcome(code=error.code(), details=error.details() or "")
        # Waiting for the channel to connect: a wake cancels it (see _wake).
        future = stub.Sync.future(request, timeout=timeout, metadata=self._engine.metadata,
                                  wait_for_ready=wait_for_ready)
        with self._wake_mu:
            self._waiting_call = future
            self._waiting_woken = False
        try:
            return Outcome(response=future.result())
        except grpc.FutureCancelledError:
            return Outcome(code=grpc.StatusCode.CANCELLED, details="cancelled", woken=True)
        except grpc.RpcError as error:
            return Outcome(code=error.code(), details=error.details() or "")
        finally:
            with self._wake_mu:
                self._waiting_call = None

    def _stub_for(self, address):
        """The stub of the main target (None) or of an owner (a channel of its own, with the
        main target's credentials and options, closed once the engine drops the route)."""
        for dropped in self._engine.dropped_addresses:
            channel = self._owner_channels.pop(dropped, (None, None))[0]
            if channel is not None:
                channel.close()
        self._engine.dropped_addresses.clear()
        if address is None:
            return self._stub
        if address not in self._owner_channels:
            channel = (self._owner_channel_factory(address)
                       if self._owner_channel_factory is not None
                       else make_channel(dataclasses.replace(self.options, target=address),
                                         main=False))
            self._owner_channels[address] = (channel,
                                             budget_pb2_grpc.RetryBudgetServiceStub(channel))
        return self._owner_channels[address][1]

    def _run_once(self) -> float:
        with self._engine.mu:
            plan = self._engine.begin_step()
            while plan is not None:
                outcome = self._call_sync(plan.request, plan.timeout, plan.wait_for_ready, True,
                                          self._stub_for(plan.address))
                self._engine.end_attempt(plan, outcome)
                plan = self._engine.next_plan()
            return self._engine.end_step()

    def _loop(self) -> None:
        while True:
            with self._wake_mu:
                self._wake_event.clear()
            nxt = self._run_once()
            with self._wake_mu:
                if self._stopping:
                    return
                if self._wake_event.is_set():
                    continue
            delay = min(nxt - self._clock(), _MAX_IDLE_SLEEP)
            if delay > 0:
                self._wake_event.wait(delay)
            with self._wake_mu:
                if self._stopping:
                    return

    def close(self):
        """Reports everything and returns all unspent tokens now, then stops the refresher;
        afterwards try_acquire() denies. Idempotent. Returns None when the final Sync got a
        response (or there was nothing to report), else its error as "CODE: message"."""
        with self._close_mu:
            if self._closed:
                return self._final_status
            with self._wake_mu:
                self._stopping = True
                self._wake_event.set()
            self._thread.join()
            self._tenants.close()
            self._final_status = self._final_sync()
            self._closed = True
            self._channel.close()
            for channel, _ in self._owner_channels.values():
                channel.close()
            return self._final_status

    def _final_sync(self):
        engine = self._engine
        with engine.mu:
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
                    outcome = self._call_sync(request, engine.sync_timeout, wait, False, stub)
                    delay = engine.end_final(outcome, attempt)
                    if delay is None:
                        break
                    threading.Event().wait(delay)
                    attempt += 1
                final = engine.next_final()
            engine.finish_final()
            return engine.last_status
