"""Backoff delays and the global retry budget."""

from __future__ import annotations

import random

import pytest

from streams.gateway.retry import RetryBudget, backoff_delay


@pytest.mark.parametrize(("attempt", "nominal"), [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0)])
def test_delays_double_with_equal_jitter(attempt: int, nominal: float) -> None:
    rng = random.Random(7)
    delays = [backoff_delay(attempt, rng=rng) for _ in range(2000)]
    assert all(nominal / 2 <= d <= nominal for d in delays)
    # jitter really spreads the delays over the whole band
    assert min(delays) < nominal * 0.55
    assert max(delays) > nominal * 0.95
    assert len(set(delays)) > 1900


def test_delays_grow_on_average() -> None:
    rng = random.Random(1)
    means = [sum(backoff_delay(a, rng=rng) for _ in range(500)) / 500 for a in (1, 2, 3)]
    assert means[0] < means[1] < means[2]
    assert means == pytest.approx([0.75, 1.5, 3.0], rel=0.05)


def test_base_and_cap() -> None:
    rng = random.Random(3)
    assert 0.25 <= backoff_delay(1, base=0.5, rng=rng) <= 0.5
    assert all(5.0 <= backoff_delay(20, cap=10.0, rng=rng) <= 10.0 for _ in range(100))


def test_same_seed_same_delays() -> None:
    a = [backoff_delay(n, rng=random.Random(42)) for n in (1, 2, 3)]
    b = [backoff_delay(n, rng=random.Random(42)) for n in (1, 2, 3)]
    assert a == b


def test_attempts_start_at_one() -> None:
    with pytest.raises(ValueError, match="start at 1"):
        backoff_delay(0, rng=random.Random())


def test_budget_refuses_after_the_minimum_is_spent() -> None:
    budget = RetryBudget(ratio=0.2, minimum=3)
    assert [budget.try_spend() for _ in range(5)] == [True, True, True, False, False]


def test_fresh_requests_earn_retries_at_the_ratio() -> None:
    budget = RetryBudget(ratio=0.2, minimum=0, capacity=10)
    assert not budget.try_spend()
    for _ in range(4):
        budget.on_request()
    assert not budget.try_spend()  # 0.8 of a retry is not a retry
    budget.on_request()
    assert budget.try_spend()
    assert not budget.try_spend()


def test_a_fault_cannot_become_a_retry_storm() -> None:
    """Every request fails: retries stay near ratio * requests + the starting balance."""
    budget = RetryBudget(ratio=0.2, minimum=10)
    retries = 0
    requests = 1000
    for _ in range(requests):
        budget.on_request()
        for _attempt in range(2):  # each request would like two retries
            if budget.try_spend():
                retries += 1
    assert retries <= 0.2 * requests + 10
    assert retries >= 0.2 * requests - 1


def test_a_long_healthy_stretch_does_not_bank_unbounded_retries() -> None:
    budget = RetryBudget(ratio=0.2, minimum=10)
    for _ in range(100_000):
        budget.on_request()
    assert budget.balance == 10
    assert sum(budget.try_spend() for _ in range(100)) == 10


def test_bad_budget_settings() -> None:
    with pytest.raises(ValueError):
        RetryBudget(ratio=-0.1)
    with pytest.raises(ValueError):
        RetryBudget(minimum=-1)
    with pytest.raises(ValueError):
        RetryBudget(minimum=10, capacity=5)
