"""The conformance corpus (client/conformance/README.md) through the Python client's engine: one
case per scenario file of client/conformance/scenarios/. Each scenario drives the code a worker
runs, the tenant registry, TenantBudget and SyncEngine made by client.make_tenants_and_engine,
as BudgetClient's refresher thread drives them (begin_step / end_attempt / next_plan / end_step,
and begin_final / next_final / end_final at shutdown), with two things replaced: the clock (a fake one the
scenario moves) and the transport (each Sync attempt's outcome scripted by the scenario).

Strict: an unknown key anywhere, an attempt more or fewer than the scenario lists, or a request
that differs in any field fails the case. `expect_wait_for_ready` is checked (the engine's plan
says it). A `refund` step's `expect` true / false is not checked: the Python client's refund()
returns nothing. `"expect": "cost_out_of_range"` (a `try_acquire` or `refund` step with a `cost`
outside [1, 1000000]) is the ValueError naming `cost` that Python raises there."""

import json
import math
import os

import grpc
import pytest
from google.protobuf import json_format

from retrybudget._proto import budget_pb2
from retrybudget._sync_engine import Outcome
from retrybudget.client import make_tenants_and_engine
from retrybudget.options import ClientOptions, validate_and_default

_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                       "client", "conformance")
_SCENARIOS = os.path.join(_CORPUS, "scenarios")
_TOLERANCE_MS = 0.001

_TOP_KEYS = {"name", "rules", "description", "options", "steps"}
_OPTION_KEYS = {"instance_id", "refresh_period_ms", "min_sync_interval_ms", "lease_burst",
                "sync_timeout_ms", "fallback", "fallback_capacity", "fallback_refill_per_second"}
_ACTIONS = {"tenant", "try_acquire", "record_success", "record_request", "refund", "run",
            "shutdown", "expect_tenant"}
_STEP_EXTRA = {"try_acquire": {"expect", "cost"}, "refund": {"expect", "cost"}}
_COST_OUT_OF_RANGE = "cost_out_of_range"
_ATTEMPT_KEYS = {"expect", "expect_address", "expect_timeout_ms", "expect_wait_for_ready",
                 "after_ms", "response", "error", "message", "lost"}
_TENANT_FIELDS = {"mode", "tokens_held", "retries_allowed", "retries_denied",
                  "fallback_allowed", "successes", "successes_credited_locally",
                  "tokens_received", "tokens_returned", "refunds", "error", "shadow",
                  "shadow_denied", "requests", "requests_credited_locally"}
_STATS_FIELDS = _TENANT_FIELDS - {"mode", "error", "shadow"}


class ScenarioError(AssertionError):
    """The scenario is not written as README.md says (the case fails: never skipped)."""


def _scenario_files():
    if not os.path.isdir(_SCENARIOS):
        return []
    return sorted(f for f in os.listdir(_SCENARIOS) if f.endswith(".json"))


def _rule_ids():
    ids = set()
    with open(os.path.join(_CORPUS, "RULES.md")) as f:
        for line in f:
            if line.startswith("- `"):
                ids.add(line[3:line.index("`", 3)])
    return ids


class FakeClock:
    """Seconds, as the Python client's clock; moved only by the scenario."""

    def __init__(self):
        self.now = 0.0
        self.next_wake = math.inf  # seconds, as the last run's end_step() said

    def __call__(self) -> float:
        return self.now

    def set_ms(self, ms: float, where: str) -> None:
        if ms < _ms(self.now) - _TOLERANCE_MS:
            raise ScenarioError(f"{where}: at_ms {ms} is earlier than the clock "
                                f"({_ms(self.now):.3f} ms)")
        self.now = max(self.now, ms / 1000.0)
        # A step at the time the last run said the next is due runs at exactly that time, as
        # the driver sleeping until it would: the engine's times are float seconds, where
        # 0.001 + 0.05 > 0.051, while the corpus's milliseconds are exact.
        if abs(_ms(self.next_wake) - ms) <= _TOLERANCE_MS:
            self.now = max(self.now, self.next_wake)


def _unknown(keys, allowed, where):
    extra = set(keys) - set(allowed)
    if extra:
        raise ScenarioError(f"{where}: unknown key(s) {sorted(extra)}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _close_ms(actual_s: float, expected_ms, what: str) -> None:
    if expected_ms is None:
        assert math.isinf(actual_s), f"{what}: {_ms(actual_s):.3f} ms, expected never (null)"
        return
    assert not math.isinf(actual_s) and abs(_ms(actual_s) - expected_ms) <= _TOLERANCE_MS, (
        f"{what}: {_ms(actual_s):.3f} ms, expected {expected_ms} ms")


def _as_dict(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


class Runner:
    def __init__(self, scenario: dict, file_name: str):
        self.file_name = file_name
        self.scenario = scenario
        self.clock = FakeClock()
        self.options = self._options(scenario.get("options", {}))
        self.tenants, self.engine = make_tenants_and_engine(self.options, lambda: None)
        self.handles = {}
        # A scenario whose answers name an owner checks addresses only where it writes them.
        self.redirects = '"owner": "' in json.dumps(scenario["steps"]).replace('"owner": ""', "")

    def _options(self, given: dict):
        _unknown(given, _OPTION_KEYS, "options")
        ms = {k: given[k] / 1000.0 for k in ("refresh_period_ms", "min_sync_interval_ms",
                                            "sync_timeout_ms") if k in given}
        o = ClientOptions(
            instance_id=given.get("instance_id", "conformance"),
            refresh_period=ms.get("refresh_period_ms", 0.2),
            min_sync_interval=ms.get("min_sync_interval_ms", 0.005),
            lease_burst=given.get("lease_burst", 2),
            sync_timeout=ms.get("sync_timeout_ms", 1.0),
            fallback=given.get("fallback", "local_bucket"),
            fallback_capacity=given.get("fallback_capacity", 1),
            fallback_refill_per_second=given.get("fallback_refill_per_second", 0.1),
            clock=self.clock)
        return validate_and_default(o)

    # ---- the steps ----

    def run(self) -> None:
        for i, step in enumerate(self.scenario["steps"]):
            where = f"step {i} (at_ms {step.get('at_ms')})"
            if not _is_number(step.get("at_ms")):
                raise ScenarioError(f"{where}: at_ms (milliseconds) is required")
            actions = [k for k in step if k in _ACTIONS]
            if len(actions) != 1:
                raise ScenarioError(f"{where}: exactly one action key expected, found "
                                    f"{actions or 'none'}")
            action = actions[0]
            _unknown(step, {"at_ms", action} | _STEP_EXTRA.get(action, set()), where)
            self.clock.set_ms(step["at_ms"], where)
            getattr(self, "_" + action)(step, f"{where} {action}")

    def _handle(self, name, where):
        if name not in self.handles:
            raise ScenarioError(f"{where}: tenant {name!r} was never asked for (a `tenant` step)")
        return self.handles[name]

    def _tenant(self, step, where):
        self.handles[step["tenant"]] = self.tenants.get_or_create(step["tenant"])

    @staticmethod
    def _cost(step, where):
        cost = step.get("cost", 1)
        if not isinstance(cost, int) or isinstance(cost, bool):
            raise ScenarioError(f"{where}: cost {cost!r} is not an integer")
        return cost

    def _call_with_cost(self, method, step, where):
        """method(cost); the expected ValueError naming `cost` when the step expects
        cost_out_of_range (then None)."""
        cost = self._cost(step, where)
        if step.get("expect") != _COST_OUT_OF_RANGE:
            return method(cost)
        with pytest.raises(ValueError, match=f"cost is {cost}") as error:
            method(cost)
        assert type(error.value) is ValueError, f"{where}: {error.value!r}"
        return None

    def _try_acquire(self, step, where):
        if not isinstance(step.get("expect"), bool) and step.get("expect") != _COST_OUT_OF_RANGE:
            raise ScenarioError(f"{where}: `expect` true / false / {_COST_OUT_OF_RANGE!r} is "
                                "required")
        got = self._call_with_cost(self._handle(step["try_acquire"], where).try_acquire, step,
                                   where)
        if step["expect"] != _COST_OUT_OF_RANGE:
            assert got == step["expect"], f"{where}: try_acquire() returned {got}"

    def _record_success(self, step, where):
        self._handle(step["record_success"], where).record_success()

    def _record_request(self, step, where):
        self._handle(step["record_request"], where).record_request()

    def _refund(self, step, where):
        if "expect" in step and not isinstance(step["expect"], bool) \
                and step["expect"] != _COST_OUT_OF_RANGE:
            raise ScenarioError(f"{where}: `expect` must be true / false / "
                                f"{_COST_OUT_OF_RANGE!r}")
        # refund() returns nothing: `expect` true / false is not checked.
        self._call_with_cost(self._handle(step["refund"], where).refund, step, where)

    def _expect_tenant(self, step, where):
        for name, fields in step["expect_tenant"].items():
            _unknown(fields, _TENANT_FIELDS, f"{where} {name}")
            budget = self._handle(name, where)
            stats = budget.stats()
            actual = {k: getattr(stats, k) for k in _STATS_FIELDS}
            actual["mode"] = budget.lease_mode
            actual["shadow"] = stats.enforcement == "shadow"
            actual["error"] = "OK" if stats.error is None else stats.error.split(":", 1)[0]
            for key, expected in fields.items():
                assert actual[key] == expected, (
                    f"{where}: tenant {name!r} {key} is {actual[key]!r}, expected {expected!r} "
                    f"(all: {actual})")

    def _run(self, step, where):
        run = step["run"]
        _unknown(run, {"attempts", "next_wake_ms"}, where)
        attempts = self._attempts(run, where)
        engine = self.engine
        with engine.mu:
            plan = engine.begin_step()
            n = 0
            while plan is not None:
                self._check_count(n, attempts, plan.request, where)
                a = attempts[n]
                self._check_attempt(a, plan.request, plan.address, plan.timeout,
                                    plan.wait_for_ready, f"{where} attempt {n}")
                engine.end_attempt(plan, self._outcome(a, plan.deadline, f"{where} attempt {n}"))
                n += 1
                plan = engine.next_plan()
            nxt = engine.end_step()
        self.clock.next_wake = nxt
        assert n == len(attempts), f"{where}: {n} attempt(s) sent, expected {len(attempts)}"
        if "next_wake_ms" in run:
            _close_ms(nxt, run["next_wake_ms"], f"{where}: next wake")

    def _shutdown(self, step, where):
        final = step["shutdown"]
        _unknown(final, {"attempts", "expect_status"}, where)
        attempts = self._attempts(final, where)
        engine = self.engine
        self.tenants.close()  # as BudgetClient.close()
        n = 0
        with engine.mu:
            item = engine.next_final() if engine.begin_final() else None
            while item is not None:
                address, request = item
                wait = engine.final_wait_for_ready(address)
                attempt = 1
                while True:
                    self._check_count(n, attempts, request, where)
                    a = attempts[n]
                    sent = self.clock.now
                    self._check_attempt(a, request, address, engine.sync_timeout, wait,
                                        f"{where} attempt {n}")
                    outcome = self._outcome(a, sent + engine.sync_timeout,
                                            f"{where} attempt {n}")
                    n += 1
                    delay = engine.end_final(outcome, attempt)
                    if delay is None:
                        break
                    self.clock.now += delay  # the driver's sleep before the next attempt
                    attempt += 1
                item = engine.next_final()
            engine.finish_final()
        assert n == len(attempts), f"{where}: {n} attempt(s) sent, expected {len(attempts)}"
        if "expect_status" in final:
            status = engine.last_status
            got = "OK" if status is None else status.split(":", 1)[0]
            assert got == final["expect_status"], f"{where}: final status {status!r}"

    # ---- attempts ----

    @staticmethod
    def _attempts(block, where):
        attempts = block.get("attempts")
        if not isinstance(attempts, list):
            raise ScenarioError(f"{where}: `attempts` (a list) is required")
        for i, a in enumerate(attempts):
            _unknown(a, _ATTEMPT_KEYS, f"{where} attempt {i}")
            outcomes = [k for k in ("response", "error", "lost") if k in a]
            if len(outcomes) != 1:
                raise ScenarioError(f"{where} attempt {i}: exactly one of response / error / "
                                    f"lost expected, found {outcomes or 'none'}")
            if "message" in a and "error" not in a:
                raise ScenarioError(f"{where} attempt {i}: `message` without `error`")
            if "lost" in a and ("after_ms" in a or a["lost"] is not True):
                raise ScenarioError(f"{where} attempt {i}: `lost` must be true, without after_ms")
            if "expect" not in a:
                raise ScenarioError(f"{where} attempt {i}: no `expect` request")
            for key in ("expect_timeout_ms", "after_ms"):
                if key in a and not (_is_number(a[key]) and a[key] >= 0):
                    raise ScenarioError(f"{where} attempt {i}: {key} is {a[key]!r}")
            if "expect_wait_for_ready" in a and not isinstance(a["expect_wait_for_ready"], bool):
                raise ScenarioError(f"{where} attempt {i}: expect_wait_for_ready is "
                                    f"{a['expect_wait_for_ready']!r}; expected true / false")
        return attempts

    @staticmethod
    def _check_count(n, attempts, request, where):
        assert n < len(attempts), (
            f"{where}: attempt {n} sent, only {len(attempts)} expected: {_as_dict(request)}")

    def _check_attempt(self, a, request, address, timeout, wait_for_ready, where):
        expected = dict(a["expect"])
        expected.setdefault("instance_id", self.options.instance_id)
        try:
            want = json_format.ParseDict(expected, budget_pb2.SyncRequest())
        except json_format.ParseError as error:
            raise ScenarioError(f"{where}: expect is not a SyncRequest: {error}") from error
        assert request == want, (f"{where}: request\n  sent     {_as_dict(request)}\n"
                                 f"  expected {_as_dict(want)}")
        got_address = "" if address is None else address
        if "expect_address" in a or not self.redirects:
            assert got_address == a.get("expect_address", ""), (
                f"{where}: sent to {got_address!r}, expected {a.get('expect_address', '')!r}")
        if "expect_timeout_ms" in a:
            _close_ms(timeout, a["expect_timeout_ms"], f"{where}: timeout")
        if "expect_wait_for_ready" in a:
            assert wait_for_ready == a["expect_wait_for_ready"], (
                f"{where}: wait_for_ready is {wait_for_ready}")

    def _outcome(self, a, deadline, where) -> Outcome:
        if "lost" in a:
            self.clock.now = max(self.clock.now, deadline)
            return Outcome(code=grpc.StatusCode.DEADLINE_EXCEEDED, details="Deadline Exceeded")
        after = a.get("after_ms", 0) / 1000.0
        if self.clock.now + after > deadline + 1e-9:
            raise ScenarioError(f"{where}: after_ms {a.get('after_ms')} is past the attempt's "
                                f"deadline ({_ms(deadline):.3f} ms)")
        self.clock.now += after
        if "error" in a:
            code = getattr(grpc.StatusCode, str(a["error"]), None)
            if not isinstance(code, grpc.StatusCode) or code == grpc.StatusCode.OK:
                raise ScenarioError(f"{where}: error {a['error']!r} is not a gRPC code name")
            return Outcome(code=code, details=a.get("message", ""))
        try:
            response = json_format.ParseDict(a["response"], budget_pb2.SyncResponse())
        except json_format.ParseError as error:
            raise ScenarioError(f"{where}: response is not a SyncResponse: {error}") from error
        return Outcome(response=response)


@pytest.mark.parametrize("file_name", _scenario_files())
def test_scenario(file_name):
    with open(os.path.join(_SCENARIOS, file_name)) as f:
        scenario = json.load(f)
    _unknown(scenario, _TOP_KEYS, file_name)
    assert scenario.get("name") == file_name[:-len(".json")], (
        f"{file_name}: name {scenario.get('name')!r} is not the file's name")
    rules = scenario.get("rules")
    if not isinstance(rules, list) or not rules:
        raise ScenarioError(f"{file_name}: `rules` must list at least one rule id")
    unknown = set(rules) - _rule_ids()
    if unknown:
        raise ScenarioError(f"{file_name}: rules {sorted(unknown)} are not in RULES.md")
    if not isinstance(scenario.get("description"), str):
        raise ScenarioError(f"{file_name}: `description` (a sentence) is required")
    if not isinstance(scenario.get("steps"), list) or not scenario["steps"]:
        raise ScenarioError(f"{file_name}: `steps` (a list, not empty) is required")
    Runner(scenario, file_name).run()


def test_the_corpus_is_there():
    assert _scenario_files(), f"no scenarios in {_SCENARIOS}"
