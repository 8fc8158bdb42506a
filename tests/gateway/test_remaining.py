"""The provider's remaining quota caps the buckets: x-ratelimit-remaining-* less the
calls sent since the answer that carried it, until its x-ratelimit-reset-*.

The last test replays the LiteLLM test's failure in virtual time: a provider with a
sliding one-minute window, a worker whose bucket refills while that window is full.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections import deque
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

from streams.dev.fakellm import FakeLLMConfig, FakeLLMServer
from streams.dev.fakellm.provider import _duration
from streams.errors import RateLimited
from streams.gateway.aimd import AIMDLimiter
from streams.gateway.backends import (
    ChatRequest,
    ChatResult,
    HandlerBackend,
    OpenAIBackend,
    parse_ratelimit,
    parse_ratelimit_reset,
    parse_reset,
)
from streams.gateway.buckets import REMAINING_DEFAULT_SECONDS, TokenBucket
from streams.gateway.caller import ModelCaller
from streams.gateway.retry import RetryBudget
from streams.gateway.telemetry import LaneMetrics

from helpers import FakeClock, answers

T = TypeVar("T")


def bucket(t: FakeClock, rate: float = 600, capacity: float | None = None) -> TokenBucket:
    return TokenBucket(rate_per_minute=rate, capacity=capacity, clock=t, sleep=t.sleep)


# --- the bucket ------------------------------------------------------------------


async def test_remaining_caps_takes_until_its_reset() -> None:
    t = FakeClock()
    b = bucket(t)  # 100 tokens: the bucket alone would admit them all
    b.follow_remaining(3, reset=20.0)
    assert b.available == 3
    assert [b.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert b.available == 0
    t.now += 19.9
    assert not b.try_acquire()  # the provider's count still binds
    t.now += 0.1
    assert b.try_acquire()  # reset: the provider is back to its initial state
    assert b.headroom == float("inf")


async def test_acquire_waits_for_the_reset_not_the_refill() -> None:
    t = FakeClock()
    b = bucket(t)
    b.follow_remaining(0, reset=6.5)
    ticket = await b.acquire()
    assert t.now == pytest.approx(6.5)
    assert ticket == 1


async def test_without_a_reset_time_the_count_binds_for_a_minute() -> None:
    t = FakeClock()
    b = bucket(t)
    b.follow_remaining(0, reset=None)
    t.now += REMAINING_DEFAULT_SECONDS - 0.01
    assert not b.try_acquire()
    t.now += 0.01
    assert b.try_acquire()


async def test_calls_in_flight_sent_after_the_answered_one_are_not_counted_yet() -> None:
    t = FakeClock()
    b = bucket(t)
    async with b.hold() as first, b.hold() as second, b.hold() as third:
        # the provider counted ``first`` and what came before it, not the two after
        b.follow_remaining(5, reset=30.0, ticket=first)
        assert (second, third) == (first + 1, first + 2)
        assert b.headroom == 3
        # a later answer to ``second`` has counted ``second`` too, and ``first``
        b.follow_remaining(5, reset=30.0, ticket=second)
        assert b.headroom == 4
    # answered ones are no longer in flight; takes after the count still subtract
    b.follow_remaining(5, reset=30.0, ticket=third)
    assert b.headroom == 5
    await b.acquire()
    assert b.headroom == 4
    # without a ticket every held take may be uncounted
    async with b.hold(), b.hold():
        b.follow_remaining(5, reset=30.0)
        assert b.headroom == 3


async def test_token_counts_cap_by_amount_and_never_fail_as_too_large() -> None:
    t = FakeClock()
    b = bucket(t, rate=60_000)
    b.follow_remaining(1500, reset=2.0)
    assert b.try_acquire(1000)
    assert not b.try_acquire(1000)  # 500 left by the provider's count
    await b.acquire(1000)  # waits for the reset, no "can never fit"
    assert t.now == pytest.approx(2.0)


async def test_a_waiter_looks_again_when_a_newer_count_arrives() -> None:
    t = FakeClock()
    sleeping: list[asyncio.Future[None]] = []

    async def sleep(seconds: float) -> None:  # a sleep that only ends when told
        sleeping.append(asyncio.get_running_loop().create_future())
        await sleeping[-1]

    b = TokenBucket(rate_per_minute=600, clock=t, sleep=sleep)
    b.follow_remaining(0, reset=60.0)
    waiter = asyncio.create_task(b.acquire())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done() and len(sleeping) == 1
    t.now += 0.5
    b.follow_remaining(2, reset=60.0)  # an answer in flight says there is room
    assert await asyncio.wait_for(waiter, 1) == 1
    assert sleeping[0].cancelled()  # it did not sleep out the minute


async def test_the_count_does_not_raise_the_bucket_or_lift_a_penalty() -> None:
    t = FakeClock()
    b = bucket(t, rate=60, capacity=2)
    b.follow_remaining(50, reset=30.0)
    assert b.available == 2  # the bucket's own limit still applies
    b.penalize(5.0)
    assert b.available == 0


# --- the headers -------------------------------------------------------------------


def test_reset_headers_in_both_forms_the_longer_counts() -> None:
    headers = {"x-ratelimit-reset-requests": "1s", "llm_provider-x-ratelimit-reset-requests":
               "6m0s", "LLM_PROVIDER-X-RATELIMIT-RESET-TOKENS": "20ms",
               "x-ratelimit-reset-tokens-day": "3h"}
    assert parse_ratelimit_reset(headers) == {"requests": 360.0, "tokens": 0.02}
    assert parse_ratelimit_reset({"x-ratelimit-reset-requests": "soon"}) == {}
    # a 429's wait from the reset header is unchanged: the exhausted limit's
    assert parse_reset(headers, "tokens") == 0.02
    assert parse_reset(headers) == 0.02


def test_remaining_forwarded_by_litellm_is_read_the_lower_counts() -> None:
    headers = {"x-ratelimit-remaining-requests": "12",
               "llm_provider-x-ratelimit-remaining-requests": "9"}
    assert parse_ratelimit(headers) == {"remaining-requests": 9}


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "0s"), (-1.0, "0s"), (0.0004, "1ms"), (0.12, "120ms"), (1.0, "1s"),
    (59.52, "59.52s"), (60.0, "1m0s"), (360.0, "6m0s"), (61.0012, "1m1.002s"),
])
def test_the_fake_provider_writes_openai_durations(seconds: float, text: str) -> None:
    assert _duration(seconds) == text


async def test_the_fake_provider_says_what_is_left_and_when_it_resets() -> None:
    t = FakeClock(start=100.0)
    config = FakeLLMConfig(rpm=3, tpm=100_000)
    async with FakeLLMServer(config, clock=t, sleep=_no_sleep) as server:
        backend = OpenAIBackend(base_url=server.base_url, api_key=None)
        try:
            answers = []
            for step in (0.0, 10.0):
                t.now += step
                answers.append(await backend.chat(
                    model="fake-gpt", messages=[{"role": "user", "content": "hi"}],
                    max_tokens=20, timeout=10))
        finally:
            await backend.close()
    first, second = answers
    assert first.ratelimit["remaining-requests"] == 2
    assert first.ratelimit_reset["requests"] == 60.0  # this call leaves the window then
    assert second.ratelimit["remaining-requests"] == 1
    assert second.ratelimit_reset == {"requests": 60.0, "tokens": 60.0}
    assert second.ratelimit["remaining-tokens"] < 100_000


async def _no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


# --- the caller ----------------------------------------------------------------------


def caller(backend: Any, t: Any, *, rpm: float = 600, follow: bool = True,
           limiter: AIMDLimiter | None = None, attempts: int = 1) -> ModelCaller:
    return ModelCaller(
        backend=backend, model="m", timeout_seconds=30,
        limiter=limiter or AIMDLimiter(start=5, maximum=20, pause_seconds=0, clock=t),
        rpm=TokenBucket(rate_per_minute=rpm, clock=t, sleep=t.sleep),
        tpm=TokenBucket(rate_per_minute=1e9, clock=t, sleep=t.sleep),
        retry_budget=RetryBudget(minimum=100), max_attempts=attempts, backoff_base=1.0,
        calibration=None, telemetry=LaneMetrics(None, "fast"), sleep=t.sleep,
        rng=random.Random(0), follow_remaining=follow)


def answer(remaining: int, reset: float | None = None, tokens: int | None = None) -> ChatResult:
    ratelimit = {"limit-requests": 60, "remaining-requests": remaining}
    resets = {} if reset is None else {"requests": reset, "tokens": reset}
    if tokens is not None:
        ratelimit["remaining-tokens"] = tokens
    return ChatResult("{}", "stop", 10, 5, ratelimit=ratelimit, ratelimit_reset=resets)


MESSAGES = [{"role": "user", "content": "hi"}]


async def test_an_answer_caps_the_next_calls_until_its_reset() -> None:
    t = FakeClock()
    c = caller(answers(answer(1, 12.0, tokens=50_000), answer(0, 12.0), answer(5, 1.0)), t)
    for _ in range(3):
        result, _calls = await c.request(MESSAGES, prompt_tokens=10, max_tokens=10, observe=None)
        assert isinstance(result, ChatResult)
    # the second call went at once (1 left), the third waited for the second's reset
    assert t.slept == [pytest.approx(12.0)]
    assert c.tpm.headroom == float("inf")  # the third answer named no tokens
    assert c.rpm.headroom == 5


async def test_a_429s_counts_bind_until_the_wait_it_asks_for() -> None:
    t = FakeClock()
    limited = RateLimited("429", retry_after=4.0, limit="requests",
                          ratelimit={"remaining-requests": 0, "remaining-tokens": 900})
    c = caller(answers(limited, answer(10)), t, attempts=2)
    result, calls = await c.request(MESSAGES, prompt_tokens=10, max_tokens=10, observe=None)
    assert isinstance(result, ChatResult) and calls == 2
    # the retry went when the 429 said (and a token refilled), not a minute later
    assert 4.0 <= t.now < 4.2


async def test_switched_off_the_counts_are_ignored() -> None:
    t = FakeClock()
    c = caller(answers(answer(0, 30.0), answer(0, 30.0)), t, follow=False)
    for _ in range(2):
        await c.request(MESSAGES, prompt_tokens=10, max_tokens=10, observe=None)
    assert t.slept == [] and c.rpm.headroom == float("inf")


# --- the failure of the LiteLLM test, in virtual time -----------------------------------


class VirtualTime:
    """A clock and sleep for many tasks: time jumps to the next wake-up once every task
    waits, so a simulated minute costs no wall time and concurrent sleeps overlap."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._timers, (self.now + max(0.0, seconds), self._seq, future))
        await future

    async def run(self, work: Awaitable[T]) -> T:
        task = asyncio.ensure_future(work)
        while True:
            for _ in range(200):  # let every task run until it waits on a timer
                await asyncio.sleep(0)
            if task.done():
                return task.result()
            while self._timers and self._timers[0][2].done():  # cancelled sleeps
                heapq.heappop(self._timers)
            assert self._timers, "every task waits and no timer is set"
            when, _, future = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            future.set_result(None)


class SlidingWindowProvider:
    """A provider allowing ``rpm`` requests per sliding minute, counted on arrival, with
    OpenAI's headers computed when it answers (the fake provider's rules)."""

    def __init__(self, clock: VirtualTime, rpm: int, *, network: float, service: float) -> None:
        self.clock, self.rpm, self.network, self.service = clock, rpm, network, service
        self.window: deque[float] = deque()
        self.requests = self.limited = 0

    def _used(self) -> int:
        while self.window and self.window[0] <= self.clock.now - 60:
            self.window.popleft()
        return len(self.window)

    def _headers(self) -> tuple[dict[str, int], dict[str, float]]:
        used = self._used()
        reset = self.window[-1] + 60 - self.clock.now if self.window else 0.0
        return ({"limit-requests": self.rpm, "remaining-requests": self.rpm - used},
                {"requests": reset})

    async def answer(self, request: ChatRequest) -> ChatResult:
        await self.clock.sleep(self.network)
        self.requests += 1
        if self._used() >= self.rpm:
            self.limited += 1
            wait = self.window[0] + 60 - self.clock.now
            ratelimit, _ = self._headers()
            await self.clock.sleep(self.network)
            raise RateLimited("429", retry_after=wait, limit="requests", ratelimit=ratelimit)
        self.window.append(self.clock.now)
        await self.clock.sleep(self.service)
        ratelimit, reset = self._headers()
        await self.clock.sleep(self.network)
        return ChatResult("{}", "stop", 10, 5, ratelimit=ratelimit, ratelimit_reset=reset)


async def _replay(*, follow: bool, network: float) -> tuple[SlidingWindowProvider, float, int]:
    """68 calls at up to 20 at once against 60 rpm, the LiteLLM test's shape."""
    clock = VirtualTime()
    provider = SlidingWindowProvider(clock, 60, network=network, service=0.5)
    c = caller(HandlerBackend(provider.answer), clock, rpm=60, follow=follow, attempts=3,
               limiter=AIMDLimiter(start=5, maximum=20, pause_seconds=0, clock=clock))

    async def one() -> bool:
        result, _ = await c.request(MESSAGES, prompt_tokens=10, max_tokens=10, observe=None)
        return isinstance(result, ChatResult)

    async def all_calls() -> int:
        return sum(await asyncio.gather(*(one() for _ in range(68))))

    answered = await clock.run(all_calls())
    return provider, clock.now, answered


@pytest.mark.parametrize("network", [0.005, 0.05])  # direct, and through a proxy's hop
async def test_no_429s_when_the_bucket_follows_the_remaining_count(network: float) -> None:
    before, _, _ = await _replay(follow=False, network=network)
    assert before.limited > 0  # what the LiteLLM test saw: the bucket refills too early

    provider, took, answered = await _replay(follow=True, network=network)
    assert answered == 68 and provider.requests == 68
    assert provider.limited == 0
    # the last 8 go when the first minute's calls have left the provider's window
    assert 60 < took < 75
