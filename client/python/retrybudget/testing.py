"""For tests, benches and fleet drivers: the real retry-budget-server as a child process on
loopback (port 0, the port read from its --port_file, as tests/integration/server_process.cc
does), killed and restarted on the same port with the same data directory, and a few admin
calls. Not for production use."""

import os
import signal
import subprocess
import time
from typing import List, Optional

import grpc

from ._proto import budget_pb2, budget_pb2_grpc

_START_TIMEOUT = 20.0


class ServerProcess:
    """One retry-budget-server child. `directory` holds its port file, output log and data
    directory (persistence: a restart keeps the buckets)."""

    def __init__(self, binary: str, directory: str, args: Optional[List[str]] = None):
        self.binary = binary
        self.directory = directory
        self.args = list(args or [])
        self.port = 0
        self.process: Optional[subprocess.Popen] = None
        os.makedirs(os.path.join(directory, "data"), exist_ok=True)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _spawn(self, listen: str) -> subprocess.Popen:
        port_file = os.path.join(self.directory, "port")
        if os.path.exists(port_file):
            os.remove(port_file)
        log = open(os.path.join(self.directory, "output"), "ab")
        argv = [self.binary, f"--listen={listen}", f"--port_file={port_file}",
                "--metrics_listen=", f"--data_dir={os.path.join(self.directory, 'data')}"]
        process = subprocess.Popen(argv + self.args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode}; output:\n"
                                   + self.output())
            try:
                with open(port_file) as f:
                    text = f.read().strip()
                if text:
                    self.port = int(text)
                    return process
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.01)
        process.kill()
        raise RuntimeError("the server did not write its port file; output:\n" + self.output())

    def start(self) -> "ServerProcess":
        self.process = self._spawn("127.0.0.1:0")
        return self

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def restart(self) -> None:
        """Starts it again on the same port (retried while the old socket is still held)."""
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                self.process = self._spawn(f"127.0.0.1:{self.port}")
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> Optional[int]:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def output(self) -> str:
        try:
            with open(os.path.join(self.directory, "output"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    # ---- admin ----

    def _admin(self):
        channel = grpc.insecure_channel(self.target)
        return channel, budget_pb2_grpc.BudgetAdminServiceStub(channel)

    def put_policy(self, tenant: str, **policy) -> "budget_pb2.BudgetStatus":
        channel, stub = self._admin()
        with channel:
            return stub.PutPolicy(budget_pb2.PutPolicyRequest(
                tenant=tenant, policy=budget_pb2.BudgetPolicy(**policy)), timeout=10).budget

    def get_budget(self, tenant: str) -> "budget_pb2.BudgetStatus":
        channel, stub = self._admin()
        with channel:
            return stub.GetBudget(budget_pb2.GetBudgetRequest(tenant=tenant), timeout=10).budget
