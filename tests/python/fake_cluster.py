"""Several in-process gRPC budget servers on 127.0.0.1:0 answering Sync as servers of a cluster
would (the redirect contract of budget.proto, TenantError.owner): each grants the tenants it
owns, answers FAILED_PRECONDITION with the owner's address for the others, and UNAVAILABLE with
no owner for a tenant whose shard has none. A stand-in for the cluster server in the client's
routing tests; the end-to-end tests with real servers on etcd live with the cluster tests."""

import threading
from concurrent import futures

import grpc

from retrybudget._proto import budget_pb2, budget_pb2_grpc


class _Server(budget_pb2_grpc.RetryBudgetServiceServicer):
    def __init__(self, cluster: "FakeCluster"):
        self._cluster = cluster
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        budget_pb2_grpc.add_RetryBudgetServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self._server.start()

    def Sync(self, request, context):  # noqa: N802 - gRPC's name
        return self._cluster.answer(self.address, request, context)

    def stop(self) -> None:
        self._server.stop(0)


class FakeCluster:
    def __init__(self, servers: int = 3, lease_ttl_ms: int = 5000):
        self._mu = threading.Lock()
        self.lease_ttl_ms = lease_ttl_ms
        self.owner = {}     # tenant -> address ("" : no owner); unlisted: whoever is asked
        self.claims = {}    # (address, tenant) -> owner that server claims (a stale view)
        self.received = []  # (address, SyncRequest), in order
        self.hung = {}      # address -> Event: its Syncs wait until set (a paused server)
        self.servers = [_Server(self) for _ in range(servers)]

    @property
    def addresses(self):
        return [s.address for s in self.servers]

    def requests_to(self, address):
        with self._mu:
            return [r for a, r in self.received if a == address]

    def all_received(self):
        with self._mu:
            return list(self.received)

    def hang(self, address) -> None:
        """The server at `address` stops answering, its connections open (as under SIGSTOP)."""
        with self._mu:
            self.hung.setdefault(address, threading.Event())

    def resume(self, address) -> None:
        with self._mu:
            event = self.hung.pop(address, None)
        if event is not None:
            event.set()

    def answer(self, address, request, context):
        with self._mu:
            hung = self.hung.get(address)
        if hung is not None:
            hung.wait()
        with self._mu:
            self.received.append((address, request))
            response = budget_pb2.SyncResponse()
            for entry in request.tenants:
                grant = response.tenants.add(tenant=entry.tenant)
                owner = self.claims.get((address, entry.tenant),
                                        self.owner.get(entry.tenant, address))
                if owner == "":
                    grant.error.code = grpc.StatusCode.UNAVAILABLE.value[0]
                    grant.error.message = "shard has no owner"
                elif owner != address:
                    grant.error.code = grpc.StatusCode.FAILED_PRECONDITION.value[0]
                    grant.error.message = "not the owner"
                    grant.error.owner = owner
                else:
                    grant.granted = 0 if request.final else 10
                    grant.lease_ttl_ms = self.lease_ttl_ms
                    grant.next_sync_ms = 100
            return response

    def stop(self) -> None:
        for address in list(self.hung):
            self.resume(address)
        for s in self.servers:
            s.stop()
