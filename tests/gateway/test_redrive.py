"""Re-drive policy: which reasons retry on their own, probe gating, backoff, pacing."""

from __future__ import annotations

import pytest

from streams.errors import PermanentModelError, RateLimited, TransientModelError
from streams.gateway.backends import ChatResult
from streams.gateway.reasons import TRANSIENT_REASONS, is_transient, kind_of
from streams.gateway.redrive import RedriveGate, backend_probe

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
                       sleep=clock.sleep)
    results = [await gate.healthy() for _ in range(8)]
    assert results == [False] * 6 + [True, False]
    assert clock.slept == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 5.0]  # reset after success
    assert gate.failures == 1


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
