"""Fixtures of the Python client's tests: the real retry-budget-server (path in
RETRY_BUDGET_SERVER_BIN) on 127.0.0.1:0, one per test, and a Sync proxy that loses responses."""

import os
import time

import pytest

from retrybudget.testing import ServerProcess

from sync_proxy import SyncProxy


def server_binary() -> str:
    binary = os.environ.get("RETRY_BUDGET_SERVER_BIN", "")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail(f"RETRY_BUDGET_SERVER_BIN={binary!r} is not an executable server binary")
    return binary


def policy_file(directory: str, text: str) -> str:
    path = os.path.join(directory, "policy.textproto")
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.fixture
def start_server(tmp_path):
    """start_server(policy_text) -> a started ServerProcess with that policy file."""
    started = []

    def start(policy_text: str = "") -> ServerProcess:
        directory = str(tmp_path / f"server{len(started)}")
        os.makedirs(directory)
        args = [f"--policy={policy_file(directory, policy_text)}"] if policy_text else []
        server = ServerProcess(server_binary(), directory, args).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def proxy_to():
    proxies = []

    def make(target: str) -> SyncProxy:
        proxy = SyncProxy(target)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()


def wait_until(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
