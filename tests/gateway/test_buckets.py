"""TokenBucket: rate over a fake clock, capacity errors, provider penalties, FIFO waiters."""

from __future__ import annotations

import asyncio

import pytest

from streams.gateway.buckets import TokenBucket

from helpers import FakeClock


def bucket(t: FakeClock, **kwargs: float) -> TokenBucket:
    return TokenBucket(clock=t, sleep=t.sleep, **kwargs)


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="rate_per_minute"):
        TokenBucket(rate_per_minute=0)
    with pytest.raises(ValueError, match="capacity"):
        TokenBucket(rate_per_minute=60, capacity=0)


async def test_starts_full_and_refills_at_the_rate() -> None:
    t = FakeClock()
    b = bucket(t, rate_per_minute=60, capacity=10)  # one token per second
    assert b.available == 10
    assert b.try_acquire(10)
    assert not b.try_acquire(1)
    t.now += 2.5
    assert b.available == pytest.approx(2.5)
    t.now += 100
    assert b.available == 10  # never above capacity


async def test_acquire_waits_exactly_as_long_as_the_rate_requires() -> None:
    t = FakeClock()
    b = bucket(t, rate_per_minute=120, capacity=2)  # two per second
    start = t.now
    for _ in range(6):
        await b.acquire()
    # two at once, then four more at 0.5 s each
    assert t.now - start == pytest.approx(2.0)


async def test_requests_per_minute_over_a_simulated_minute() -> None:
    t = FakeClock()
    b = bucket(t, rate_per_minute=60, capacity=5)
    times = []
    while t.now < 60:
        await b.acquire()
        times.append(t.now)
    in_first_minute = [x for x in times if x < 60]
    # the burst of 5, then one per second
    assert 60 <= len(in_first_minute) <= 65


async def test_amount_over_capacity_fails_up_front_and_names_the_setting() -> None:
    t = FakeClock()
    b = bucket(t, rate_per_minute=1000, capacity=1000)
    b.setting = "RETRO_MODEL__TPM"
    with pytest.raises(ValueError, match="RETRO_MODEL__TPM"):
        await b.acquire(1001)
    with pytest.raises(ValueError, match="can never fit"):
        b.try_acquire(5000)
    assert t.slept == []


async def test_penalize_empties_and_blocks_for_the_retry_after() -> None:
    t = FakeClock()
    b = bucket(t, rate_per_minute=600, capacity=100)
    b.penalize(3.0)
    assert b.available == 0
    t.now += 2.9
    assert b.available == 0  # still blocked: no refill during the penalty
    assert not b.try_acquire(1)
    t.now += 0.2
    assert b.available == pytest.approx(1.0)  # 0.1 s of refill at 10/s


async def test_acquire_after_a_penalty_waits_for_block_then_refill() -> None:
    t = FakeClock()
    b = bucket(t, rate_per_minute=600, capacity=100)
    b.penalize(3.0)
    await b.acquire(5)
    # blocked until 3.0, then 5 tokens at 10/s
    assert t.now == pytest.approx(3.5)


async def test_a_waiter_sleeps_through_the_penalty() -> None:
    t = FakeClock()
    b = bucket(t, rate_per_minute=60, capacity=1)
    b.penalize(10)
    await b.acquire()
    assert t.now == pytest.approx(11.0)  # 10 s blocked, then 1 s for the token


async def test_waiters_are_served_in_arrival_order() -> None:
    t = FakeClock()
    b = bucket(t, rate_per_minute=60, capacity=10)
    assert b.try_acquire(10)
    order: list[str] = []

    async def take(name: str, amount: float) -> None:
        await b.acquire(amount)
        order.append(name)

    tasks = [
        asyncio.create_task(take("big", 8)),
        asyncio.create_task(take("small-1", 1)),
        asyncio.create_task(take("small-2", 1)),
    ]
    await asyncio.sleep(0)
    assert not b.try_acquire(1)  # someone is queued: no jumping the line
    await asyncio.gather(*tasks)
    assert order == ["big", "small-1", "small-2"]
