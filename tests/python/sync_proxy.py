"""A gRPC proxy for RetryBudgetService.Sync on 127.0.0.1:0 that forwards every request to the
real server and, on demand, loses the response (the server applied the request; the client gets
UNAVAILABLE) or holds it for a while. It records every request it saw."""

import threading
import time
from concurrent import futures

import grpc

from retrybudget._proto import budget_pb2_grpc


class SyncProxy(budget_pb2_grpc.RetryBudgetServiceServicer):
    def __init__(self, upstream: str):
        self._channel = grpc.insecure_channel(upstream)
        self._stub = budget_pb2_grpc.RetryBudgetServiceStub(self._channel)
        self._mu = threading.Lock()
        self.requests = []           # every SyncRequest received, in order
        self.drop_next = 0           # lose the responses of this many next requests
        self.dropped = []            # the requests whose response was lost
        self.delay = 0.0             # seconds to hold each response
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        budget_pb2_grpc.add_RetryBudgetServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def Sync(self, request, context):  # noqa: N802 - gRPC's name
        with self._mu:
            self.requests.append(request)
            drop = self.drop_next > 0 and not request.final
            if drop:
                self.drop_next -= 1
                self.dropped.append(request)
            delay = self.delay
        response = self._stub.Sync(request, timeout=5)
        if delay:
            time.sleep(delay)
        if drop:
            context.abort(grpc.StatusCode.UNAVAILABLE, "response lost by the test proxy")
        return response

    def stop(self) -> None:
        self._server.stop(0)
        self._channel.close()
