"""Re-drive policy: which reasons retry on their own, probe gating, backoff, pacing."""

from __future__ import annotations

import pytest

from streams.errors import PermanentModelError, RateLimited, TransientModelError
from streams.gateway.backends import ChatResult
from streams.gateway.reasons import TRANSIENT_REASONS, is_transient, kind_of
from streams.gateway.redrive import RedriveGate, backend_probe, redrive_fetch
from streams.records import Review

from helpers import FakeClock


def test_reasons_from_exhausted_retries_are_transient_and_bad_answers_are_not() -> None:
    for reason in ("model_unavailable", "retry_budget_exhausted", "timeout", "rate_limited",
                   "server_error", "connection"):
        assert is_transient(reason), reason
    for reason in ("malformed_output", "schema", "unknown_ref", "duplicate_ref",
                   "missing_records", "truncated", "context_length", "model_rejected",
                   "quota_exhausted", "internal_error", "a_reason_added_later"):
        assert kind_of(reason) == "permanent", reason
    assert "quota_exhausted" not in TRANSIENT_REASONS  # a person must act first


class ScriptedProbe:
    def __init__(self, answers: list[bool]) -> None:
        self.answers = answers
        self.calls = 0

    async def __call__(self) -> bool:
        self.calls += 1
        return self.answers.pop(0)


async def test_failed_probes_back_off_exponentially_up_to_the_cap_then_reset() -> None:
    clock = FakeClock()
    probe = ScriptedProbe([False] * 6 + [True, False])
    gate = RedriveGate(probe, backoff_base=5.0, backoff_max=60.0, records_per_second=100.0,
                       sleep=clock.sleep, clock=clock)
    results = [await gate.healthy() for _ in range(7)]
    clock.advance(5.0)  # a healthy answer is trusted for one backoff step
    results.append(await gate.healthy())
    assert results == [False] * 6 + [True, False]
    assert clock.slept == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 5.0]  # reset after success
    assert gate.failures == 1 and probe.calls == gate.probes == 8


async def test_pacing_bounds_the_rate_of_re_driven_records() -> None:
    clock = FakeClock()
    gate = RedriveGate(ScriptedProbe([]), backoff_base=1.0, backoff_max=1.0,
                       records_per_second=200.0, sleep=clock.sleep)
    for _ in range(10):
        await gate.pace(100)
    await gate.pace(0)
    assert clock.now == pytest.approx(5.0)  # 1,000 records at 200/s


def test_impossible_gate_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RedriveGate(ScriptedProbe([]), backoff_base=10, backoff_max=5, records_per_second=1)
    with pytest.raises(ValueError):
        RedriveGate(ScriptedProbe([]), backoff_base=1, backoff_max=5, records_per_second=0)


class Backend:
    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.requests: list[int] = []

    async def chat(self, *, model: str, messages: list, max_tokens: int,
                   timeout: float) -> ChatResult:
        self.requests.append(max_tokens)
        if self.error is not None:
            raise self.error
        return ChatResult(content="pong", finish_reason="stop", prompt_tokens=5,
                          completion_tokens=1)

    async def close(self) -> None:
        return None


@pytest.mark.parametrize(("error", "healthy"), [
    (None, True),
    (PermanentModelError("400 for the tiny prompt", reason="model_rejected"), True),
    (RateLimited("429", retry_after=3.0), False),
    (TransientModelError("503", reason="server_error"), False),
    (TransientModelError("no answer", reason="timeout"), False),
])
async def test_the_probe_is_one_small_request_healthy_when_the_provider_answers(
        error: Exception | None, healthy: bool) -> None:
    backend = Backend(error)
    probe = backend_probe(backend, model="m", timeout_seconds=5.0)
    assert await probe() is healthy
    assert backend.requests == [1]


class Message:
    def __init__(self, offset: int, value: bytes | None) -> None:
        self.offset = offset
        self.value = value


def review_message(offset: int, reason: str, first: int) -> Message:
    review = Review(id=f"r-{offset}", lane="slow", reason=reason, detail="",
                    covered={"raw/0": [[first, first + 9]]}, record_ids=[], model="m",
                    prompt_version="v1")
    return Message(offset, review.model_dump_json().encode())


async def test_a_fetch_re_drives_transient_reviews_and_passes_permanent_ones() -> None:
    clock = FakeClock()
    gate = RedriveGate(ScriptedProbe([True, True]), backoff_base=1.0, backoff_max=8.0,
                       records_per_second=10.0, sleep=clock.sleep, clock=clock)
    sent: list[str] = []

    async def redrive(review: Review) -> int:
        sent.append(review.id)
        return 10

    fetched = {"review/0": [review_message(5, "model_unavailable", 0),
                            review_message(6, "schema", 10),
                            Message(7, b"not a review")],
               "review/1": [review_message(3, "retry_budget_exhausted", 20)]}
    outcome = await redrive_fetch(fetched, gate, redrive)
    assert sent == ["r-5", "r-3"]  # the permanent one stays parked
    assert outcome.done == {"review/0": 8, "review/1": 4} and not outcome.blocked
    assert (outcome.redriven, outcome.skipped) == (20, 1)
    assert clock.now == pytest.approx(2.0)  # 20 records paced at 10/s


async def test_a_failed_probe_stops_the_fetch_before_the_review_it_guards() -> None:
    clock = FakeClock()
    gate = RedriveGate(ScriptedProbe([True, False]), backoff_base=3.0, backoff_max=8.0,
                       records_per_second=1000.0, sleep=clock.sleep, clock=clock)
    sent: list[str] = []

    async def redrive(review: Review) -> int:
        sent.append(review.id)
        clock.advance(3.0)  # past the step a healthy probe is trusted for
        return 0

    fetched = {"review/0": [review_message(0, "timeout", 0), review_message(1, "schema", 10),
                            review_message(2, "model_unavailable", 20),
                            review_message(3, "model_unavailable", 30)],
               "review/1": [review_message(9, "model_unavailable", 40)]}
    outcome = await redrive_fetch(fetched, gate, redrive)
    assert outcome.blocked and sent == ["r-0"]
    # offset 2 and everything after it (both partitions) are read again after the backoff
    assert outcome.done == {"review/0": 2}
    assert clock.slept == [3.0]
