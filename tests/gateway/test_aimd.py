"""AIMDLimiter: limits adapt, waiters are fair and prioritised, nothing leaks on cancel."""

from __future__ import annotations

import asyncio

import pytest

from streams.gateway.aimd import AIMDLimiter

from helpers import FakeClock


@pytest.fixture
async def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A fake clock that is also the loop's clock, so pause timers follow it."""
    fake = FakeClock(start=1000.0)
    monkeypatch.setattr(asyncio.get_running_loop(), "time", fake)
    return fake


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_impossible_settings_are_rejected_up_front() -> None:
    with pytest.raises(ValueError, match="minimum"):
        AIMDLimiter(minimum=0)
    with pytest.raises(ValueError, match="maximum"):
        AIMDLimiter(start=2, minimum=3, maximum=2)
    with pytest.raises(ValueError, match="start"):
        AIMDLimiter(start=30, maximum=20)
    with pytest.raises(ValueError, match="decrease_factor"):
        AIMDLimiter(decrease_factor=1.0)
    with pytest.raises(ValueError, match="decrease_factor"):
        AIMDLimiter(decrease_factor=0)
    with pytest.raises(ValueError, match="pause_seconds"):
        AIMDLimiter(pause_seconds=-1)


async def test_additive_increase_stops_at_maximum(clock: FakeClock) -> None:
    limiter = AIMDLimiter(start=5, increase=1, maximum=8, clock=clock)
    seen = []
    for _ in range(6):
        limiter.on_success()
        seen.append(limiter.limit)
    assert seen == [6, 7, 8, 8, 8, 8]


async def test_multiplicative_decrease_has_a_floor(clock: FakeClock) -> None:
    limiter = AIMDLimiter(start=20, maximum=20, minimum=3, pause_seconds=1.0, clock=clock)
    seen = []
    for _ in range(4):
        limiter.on_rate_limited()
        seen.append(limiter.limit)
        clock.advance(1.5)  # past the pause window: the next 429 counts again
    assert seen == [10, 5, 3, 3]


async def test_a_burst_of_429s_halves_once_per_pause_window(clock: FakeClock) -> None:
    limiter = AIMDLimiter(start=16, maximum=20, pause_seconds=1.0, clock=clock)
    for _ in range(5):  # five calls that were in flight together all come back 429
        limiter.on_rate_limited()
    assert limiter.limit == 8
    clock.advance(0.5)
    limiter.on_rate_limited()
    assert limiter.limit == 8  # still the same window
    clock.advance(0.6)
    limiter.on_rate_limited()
    assert limiter.limit == 4


async def test_limit_bounds_concurrency(clock: FakeClock) -> None:
    limiter = AIMDLimiter(start=2, maximum=4, clock=clock)
    running = 0
    peak = 0
    gate = asyncio.Event()

    async def work() -> None:
        nonlocal running, peak
        async with limiter.slot():
            running += 1
            peak = max(peak, running)
            await gate.wait()
            running -= 1

    tasks = [asyncio.create_task(work()) for _ in range(6)]
    await settle()
    assert (limiter.in_flight, limiter.waiting, peak) == (2, 4, 2)
    gate.set()
    await asyncio.gather(*tasks)
    assert peak == 2
    assert (limiter.in_flight, limiter.waiting) == (0, 0)


async def test_retries_are_served_after_fresh_waiters(clock: FakeClock) -> None:
    limiter = AIMDLimiter(start=1, maximum=1, clock=clock)
    order: list[str] = []
    await limiter.acquire()  # hold the only slot

    async def take(name: str, priority: int) -> None:
        async with limiter.slot(priority=priority):
            order.append(name)

    # the retries arrive first, yet every fresh request goes before them
    tasks = [
        asyncio.create_task(take("retry-1", 1)),
        asyncio.create_task(take("fresh-1", 0)),
        asyncio.create_task(take("retry-2", 1)),
        asyncio.create_task(take("fresh-2", 0)),
    ]
    await settle()
    assert order == []
    limiter.release()
    await asyncio.gather(*tasks)
    assert order == ["fresh-1", "fresh-2", "retry-1", "retry-2"]


async def test_pause_holds_new_acquisitions_until_it_ends(clock: FakeClock) -> None:
    limiter = AIMDLimiter(start=4, maximum=4, pause_seconds=1.0, clock=clock)
    limiter.on_rate_limited()
    assert limiter.limit == 2 and limiter.paused
    acquired = asyncio.Event()

    async def take() -> None:
        async with limiter.slot():
            acquired.set()

    task = asyncio.create_task(take())
    await settle()
    assert not acquired.is_set()  # a free slot exists, but the pause holds it back
    clock.advance(0.5)
    await settle()
    assert not acquired.is_set()
    clock.advance(0.6)
    await settle()
    assert acquired.is_set()
    await task
    assert limiter.in_flight == 0


async def test_a_cancelled_waiter_leaves_the_queue(clock: FakeClock) -> None:
    limiter = AIMDLimiter(start=1, maximum=1, clock=clock)
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    other = asyncio.create_task(limiter.acquire(priority=1))
    await settle()
    assert limiter.waiting == 2
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.waiting == 1
    limiter.release()  # goes to the remaining waiter, not to the cancelled one
    await other
    assert (limiter.in_flight, limiter.waiting) == (1, 0)
    limiter.release()
    assert limiter.in_flight == 0


async def test_a_slot_granted_to_a_cancelled_waiter_is_handed_back(clock: FakeClock) -> None:
    limiter = AIMDLimiter(start=1, maximum=1, clock=clock)
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await settle()
    limiter.release()  # grants the slot to the waiter ...
    waiter.cancel()  # ... which is cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (limiter.in_flight, limiter.waiting) == (0, 0)
    async with limiter.slot():  # the slot is usable again
        assert limiter.in_flight == 1


async def test_a_lower_limit_applies_as_slots_come_back(clock: FakeClock) -> None:
    limiter = AIMDLimiter(start=4, maximum=4, pause_seconds=0.0, clock=clock)
    for _ in range(4):
        await limiter.acquire()
    limiter.on_rate_limited()
    assert limiter.limit == 2
    waiter = asyncio.create_task(limiter.acquire())
    limiter.release()
    limiter.release()
    await settle()
    assert not waiter.done()  # 2 still in flight == the new limit
    limiter.release()
    await settle()
    assert waiter.done()
    assert limiter.in_flight == 2


def test_release_without_acquire_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        AIMDLimiter().release()
