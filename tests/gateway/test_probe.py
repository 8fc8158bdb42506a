"""Which reasons retry on their own, and the provider's health probe the re-drive waits for."""

from __future__ import annotations

import pytest

from streams.errors import PermanentModelError, RateLimited, TransientModelError
from streams.gateway.probe import backend_probe
from streams.gateway.reasons import TRANSIENT_REASONS, is_transient, kind_of

from helpers import answers


def test_reasons_from_exhausted_retries_are_transient_and_bad_answers_are_not() -> None:
    for reason in ("model_unavailable", "retry_budget_exhausted", "timeout", "rate_limited",
                   "server_error", "connection"):
        assert is_transient(reason), reason
    for reason in ("malformed_output", "schema", "unknown_ref", "duplicate_ref",
                   "missing_records", "truncated", "context_length", "model_rejected",
                   "quota_exhausted", "internal_error", "a_reason_added_later"):
        assert kind_of(reason) == "permanent", reason
    assert "quota_exhausted" not in TRANSIENT_REASONS  # a person must act first


@pytest.mark.parametrize(("error", "healthy"), [
    (None, True),
    (PermanentModelError("400 for the tiny prompt", reason="model_rejected"), True),
    (RateLimited("429", retry_after=3.0), False),
    (TransientModelError("503", reason="server_error"), False),
    (TransientModelError("no answer", reason="timeout"), False),
])
async def test_the_probe_is_one_small_request_healthy_when_the_provider_answers(
        error: Exception | None, healthy: bool) -> None:
    backend = answers(error) if error is not None else answers()
    probe = backend_probe(backend, model="m", timeout_seconds=5.0)
    assert await probe() is healthy
    assert [r.max_tokens for r in backend.requests] == [1]
