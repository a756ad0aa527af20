"""The Python client's pure logic, without a server: the same numbers as the C++ client's
refresh_policy, demand_estimator, fallback_bucket and tenant_ledger."""

import random

import pytest

from retrybudget import RetryPolicy, compute_backoff
from retrybudget._bucket_math import (BucketShape, DemandEstimator, FallbackBucket,
                                      RecentSmallest, RefreshPolicy, low_water_mark,
                                      next_sync_delay, retry_backoff, want_for)
from retrybudget._ledger import FALLBACK, LEASE, TenantLedger


def test_low_water_mark_is_a_fifth_rounded_up():
    assert [low_water_mark(g) for g in (0, 1, 5, 6, 100)] == [0, 1, 1, 2, 20]


def test_next_sync_delay_is_the_hint_within_the_client_bounds():
    p = RefreshPolicy(refresh_period=0.2, min_sync_interval=0.005)
    assert next_sync_delay(0, p) == 0.2
    assert next_sync_delay(50, p) == 0.05
    assert next_sync_delay(1, p) == 0.005
    assert next_sync_delay(10_000, p) == 0.2


def test_sync_retry_backoff_doubles_from_twenty_ms_to_one_second():
    p = RefreshPolicy()
    assert [retry_backoff(f, p) for f in (1, 2, 3, 7, 20)] == [0.02, 0.04, 0.08, 1.0, 1.0]


def test_want_covers_a_period_of_demand_plus_burst_minus_held():
    assert want_for(0, 0.2, 2, 0) == 2
    assert want_for(100, 0.2, 2, 5) == 17
    assert want_for(100, 0.2, 2, 50) == 0
    assert want_for(1e12, 1, 0, 0) == 1_000_000


def test_demand_rate_converges_to_a_steady_rate():
    d = DemandEstimator(0.0)
    for i in range(1, 101):
        d.observe(i * 0.1, i * 10)  # 100 per second
    assert d.rate == pytest.approx(100, rel=0.1)


def test_fallback_bucket_never_hands_out_more_than_capacity_plus_refill_times_elapsed():
    rng = random.Random(3)
    bucket = FallbackBucket(BucketShape(capacity=5, refill_per_second=20), 0.0)
    held, handed_out, now = 0, 0, 0.0
    for _ in range(5000):
        now += rng.uniform(0, 0.01)
        added = bucket.refill(now, held)
        held += added
        handed_out += added
        taken = rng.randint(0, held)
        held -= taken
    assert handed_out - held <= 5 + 20 * now + 1e-6
    assert handed_out - held >= 0.9 * (5 + 20 * now) - 5  # and it does refill


def test_a_refilling_share_below_one_token_grows_to_one_whole_token():
    bucket = FallbackBucket(BucketShape(capacity=0.25, refill_per_second=0.5), 0.0)
    assert bucket.refill(0.0, 0) == 0
    assert bucket.refill(2.0, 0) == 1
    assert bucket.next_token_at() == float("inf")  # full


def test_the_smallest_share_of_the_last_minute_is_kept():
    r = RecentSmallest()
    r.note(BucketShape(10, 30), 0.0)
    r.note(BucketShape(40, 90), 30.0)
    assert r.get(59.0) == BucketShape(10, 30)
    assert r.get(200.0) is None


def _wire(ledger, held):
    """The ledger's wire counters after a report with `held` tokens in the word."""
    ledger.report(held)
    return dict(spent=ledger.reported_spent, refunded=ledger.reported_refunded,
                fallback_spent=ledger.reported_fallback_spent,
                fallback_refunded=ledger.reported_fallback_refunded,
                returned=ledger.tokens_returned, received=ledger.tokens_received)


def _check_wire_rules(w):
    """The constraints the server checks on every report (budget.proto, TenantSync)."""
    assert w["refunded"] <= w["spent"]
    assert w["fallback_refunded"] <= w["fallback_spent"]
    assert w["fallback_refunded"] <= w["refunded"]
    assert (w["spent"] - w["fallback_spent"]) - (w["refunded"] - w["fallback_refunded"]) \
        + w["returned"] <= w["received"]


def _check_monotonic(before, after):
    for k, v in before.items():
        assert after[k] >= v, (k, before, after)


def test_ledger_a_refund_after_its_report_is_reported_refunded_and_the_token_returned():
    ledger = TenantLedger()
    ledger.received(10, 10)
    w1 = _wire(ledger, held=7)                       # 3 taken
    assert (w1["spent"], w1["refunded"]) == (3, 0)
    w2 = _wire(ledger, held=8)                       # one refunded after the report
    assert (w2["spent"], w2["refunded"]) == (3, 1)   # 2 sent
    ledger.withdrew(8, 0)                            # expiry: all 8 go back, the refunded one too
    w3 = _wire(ledger, held=0)
    assert w3["returned"] == 8
    assert w3["spent"] - w3["refunded"] == 2
    assert w3["spent"] - w3["refunded"] + w3["returned"] == w3["received"]
    for before, after in ((w1, w2), (w2, w3)):
        _check_monotonic(before, after)
        _check_wire_rules(after)
    assert ledger.exact_spent(0) == 2


def test_ledger_a_refunded_token_spent_again_is_counted_again_and_the_rest_returned():
    ledger = TenantLedger()
    ledger.received(5, 5)
    w1 = _wire(ledger, held=4)                       # take
    w2 = _wire(ledger, held=5)                       # refund after the report
    assert (w2["spent"], w2["refunded"]) == (1, 1)
    w3 = _wire(ledger, held=4)                       # the same token taken again
    assert (w3["spent"], w3["refunded"]) == (2, 1)
    w4 = _wire(ledger, held=5)                       # and refunded again
    assert (w4["spent"], w4["refunded"]) == (2, 2)
    w5 = _wire(ledger, held=3)                       # two taken for good
    assert w5["spent"] - w5["refunded"] == 2
    ledger.withdrew(3, 0)
    w6 = _wire(ledger, held=0)
    assert w6["returned"] == 3
    assert w6["spent"] - w6["refunded"] + w6["returned"] == w6["received"] == 5
    prev = w1
    for w in (w2, w3, w4, w5, w6):
        _check_monotonic(prev, w)
        _check_wire_rules(w)
        prev = w


def test_ledger_a_refund_before_any_report_is_simply_not_spent():
    ledger = TenantLedger()
    ledger.received(4, 4)
    w = _wire(ledger, held=4)                        # taken and refunded between two reports
    assert (w["spent"], w["refunded"]) == (0, 0)


def test_ledger_fallback_refunds_are_reported_as_fallback_refunds():
    ledger = TenantLedger()
    ledger.switch_to(FALLBACK)
    ledger.fallback_deposited(3)
    w1 = _wire(ledger, held=1)                       # 2 fallback tokens taken
    assert (w1["spent"], w1["fallback_spent"]) == (2, 2)
    w2 = _wire(ledger, held=2)                       # one refunded after the report
    assert (w2["spent"], w2["refunded"], w2["fallback_spent"], w2["fallback_refunded"]) \
        == (2, 1, 2, 1)
    assert (w2["received"], w2["returned"]) == (0, 0)  # fallback tokens never count there
    _check_monotonic(w1, w2)
    _check_wire_rules(w2)
    assert ledger.exact_fallback_spent(2) == 1


def test_ledger_a_refund_landing_after_the_source_switched_stays_spent_in_the_old_books():
    ledger = TenantLedger()
    ledger.switch_to(FALLBACK)
    ledger.fallback_deposited(1)
    w1 = _wire(ledger, held=0)                       # the fallback token taken and reported
    assert (w1["spent"], w1["fallback_spent"]) == (1, 1)
    ledger.withdrew(0, 0)                            # a grant: the (empty) word swapped
    ledger.switch_to(LEASE)
    ledger.received(5, 5)
    # The fallback token is refunded into the word, which now holds leased tokens: 6 held.
    w2 = _wire(ledger, held=6)
    _check_monotonic(w1, w2)
    _check_wire_rules(w2)
    assert ledger.exact_spent(6) == 1                # the safe direction: still counted spent
    ledger.withdrew(6, 0)                            # expiry: only the 5 leased ones go out
    w3 = _wire(ledger, held=0)
    assert w3["returned"] == 5
    assert w3["spent"] - w3["refunded"] == 1         # the refund is absorbed, never gained
    _check_monotonic(w2, w3)
    _check_wire_rules(w3)
    # The refunded token spent from the lease, with leased ones: counted once in total.
    ledger2 = TenantLedger()
    ledger2.switch_to(FALLBACK)
    ledger2.fallback_deposited(1)
    _wire(ledger2, held=0)
    ledger2.withdrew(0, 0)
    ledger2.switch_to(LEASE)
    ledger2.received(5, 5)
    w = _wire(ledger2, held=3)                       # refund (6), then 3 taken: 3 held
    _check_wire_rules(w)
    ledger2.withdrew(3, 0)
    w = _wire(ledger2, held=0)
    _check_wire_rules(w)
    assert w["returned"] == 3
    assert ledger2.exact_spent(0) == 3               # 1 fallback - 1 refunded + 3 leased


def test_ledger_counters_never_go_back_under_random_takes_refunds_and_withdrawals():
    rng = random.Random(34)
    for _ in range(200):
        ledger = TenantLedger()
        held = 0
        taken = refunds = 0
        prev = _wire(ledger, held)
        for _ in range(60):
            op = rng.randrange(6)
            if op == 0 and ledger.source == LEASE:
                n = rng.randrange(1, 5)
                ledger.received(n, n)
                held += n
            elif op == 0:
                n = rng.randrange(1, 3)
                ledger.fallback_deposited(n)
                held += n
            elif op == 1 and held > 0:
                held -= 1
                taken += 1
            elif op == 2 and taken > refunds:
                held += 1
                refunds += 1
            elif op == 3:
                ledger.withdrew(held, 0)
                held = 0
                if rng.random() < 0.5:
                    ledger.switch_to(FALLBACK if ledger.source == LEASE else LEASE)
            w = _wire(ledger, held)
            _check_monotonic(prev, w)
            _check_wire_rules(w)
            # Never more than really sent is missing, never a token gained.
            assert w["spent"] - w["refunded"] >= 0
            assert ledger.exact_spent(held) >= taken - refunds  # absorbed only ever adds
            prev = w


def test_full_jitter_backoff_is_uniform_below_the_capped_exponential_ceiling():
    p = RetryPolicy(initial_backoff=0.05, max_backoff=1.0, multiplier=2)
    assert compute_backoff(p, 1, 0.5) == pytest.approx(0.025)
    assert compute_backoff(p, 3, 0.999) == pytest.approx(0.2 * 0.999)
    assert compute_backoff(p, 10, 0.5) == pytest.approx(0.5)
    assert compute_backoff(p, 2, 7.0) == pytest.approx(0.1)  # clamped to [0, 1]


def test_a_fallback_bucket_funds_itself_with_the_credit_of_successes_up_to_its_cap():
    bucket = FallbackBucket(BucketShape(capacity=4, refill_per_second=0, success_credit=0.5), 0.0)
    assert bucket.refill(0.0, 0) == 4          # starts full
    assert bucket.refill(0.0, 4, successes=10) == 0 and bucket.last_credited == 0  # full
    assert bucket.refill(1.0, 1, successes=3) == 1  # 3 taken: room for 3 tokens = 6 successes
    assert bucket.last_credited == 3            # 1.5 tokens: one whole token now
    assert bucket.refill(2.0, 2, successes=10) == 2
    assert bucket.last_credited == 3            # room 1.5 + the half left = 2 whole tokens


def test_credit_funded_fallback_hands_out_at_most_capacity_refill_and_the_credit_it_took():
    rng = random.Random(5)
    bucket = FallbackBucket(BucketShape(capacity=5, refill_per_second=3, success_credit=0.1), 0.0)
    held, handed_out, credited, now = 0, 0, 0, 0.0
    for _ in range(5000):
        now += rng.uniform(0, 0.01)
        added = bucket.refill(now, held, successes=rng.randint(0, 30))
        credited += bucket.last_credited
        held += added
        handed_out += added
        held -= rng.randint(0, held)
    assert credited > 0
    assert handed_out - held <= 5 + 3 * now + 0.1 * credited + 1e-6


def _leased_budget(granted: int, share_capacity: float, share_refill: float = 0):
    from retrybudget._proto import budget_pb2
    from retrybudget.tenant_budget import TenantBudget

    budget = TenantBudget("t", lambda: None, 0.0, "local_bucket", BucketShape(1, 0.1))
    grant = budget_pb2.TenantGrant(tenant="t", granted=granted, lease_ttl_ms=5000,
                                   safe_share=budget_pb2.SafeShare(
                                       capacity=share_capacity, refill_per_second=share_refill))
    budget.apply_grant(grant, budget_pb2.TenantSync(tenant="t", want=granted), 0.0, 0.0,
                       RefreshPolicy())
    return budget


def test_a_spent_lease_falls_back_once_the_server_is_down_not_at_its_expiry():
    from retrybudget.tenant_budget import DOWN, UNREACHABLE

    budget = _leased_budget(2, share_capacity=3, share_refill=10)
    assert budget.try_acquire() and budget.try_acquire() and not budget.try_acquire()
    budget.step(0.1, UNREACHABLE)  # a blip: the spent lease denies until it is renewed
    assert budget.stats().mode == "lease" and not budget.try_acquire()
    budget.step(0.3, DOWN)  # down for a refresh period: fallback long before 5 s
    assert budget.stats().mode == "fallback"
    # The bucket starts empty (the share of the burst went in the lease): refill only.
    assert not budget.try_acquire()
    budget.step(0.4, DOWN)
    assert sum(budget.try_acquire() for _ in range(5)) == 1


def test_a_lease_with_tokens_left_is_spent_while_the_server_is_down():
    from retrybudget.tenant_budget import DOWN

    budget = _leased_budget(4, share_capacity=3)
    assert budget.try_acquire()
    budget.step(2.0, DOWN)
    assert budget.stats().mode == "lease"
    assert sum(budget.try_acquire() for _ in range(10)) == 3
    assert budget.stats().fallback_allowed == 0
