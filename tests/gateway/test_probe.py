"""Which reasons retry on their own, and the provider's health probe the re-drive waits for."""

from __future__ import annotations

import pytest

from streams.errors import PermanentModelError, RateLimited, TransientModelError
from streams.gateway.backends import ChatResult
from streams.gateway.probe import backend_probe
from streams.gateway.reasons import TRANSIENT_REASONS, is_transient, kind_of


def test_reasons_from_exhausted_retries_are_transient_and_bad_answers_are_not() -> None:
    for reason in ("model_unavailable", "retry_budget_exhausted", "timeout", "rate_limited",
                   "server_error", "connection"):
        assert is_transient(reason), reason
    for reason in ("malformed_output", "schema", "unknown_ref", "duplicate_ref",
                   "missing_records", "truncated", "context_length", "model_rejected",
                   "quota_exhausted", "internal_error", "a_reason_added_later"):
        assert kind_of(reason) == "permanent", reason
    assert "quota_exhausted" not in TRANSIENT_REASONS  # a person must act first


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
