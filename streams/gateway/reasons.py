"""Which review reasons are transient (worth re-driving on their own) and which stay.

The one place that classifies the reasons a review can carry. A *transient* review
parked its records because the provider could not answer then (unavailable after
all attempts, the retry budget spent in a burst of failures, timeouts, 429s, 5xx,
connection errors); the same records are expected to succeed once the provider
recovers, so the worker re-drives them with backoff (``streams/report/ops/redrive.py``).
Every other reason is *permanent* for an automatic retry: the model answered and the
answer could not be used after one repair (``malformed_output``, ``schema``,
``unknown_ref``, ``duplicate_ref``, ``missing_records``, ``truncated`` or
``context_length`` for a single record), the provider refused the request
(``model_rejected``, ``quota_exhausted``: a person must act first) or our own code
failed (``internal_error``). They stay in review until someone re-drives them with
``retro review --redrive``. Reasons not listed here are treated as permanent, so a
new reason is never retried in a loop by accident.
"""

from __future__ import annotations

from typing import Literal

# reasons emitted by streams/gateway/caller.py (after retries) and backends.py
TRANSIENT_REASONS: frozenset[str] = frozenset({
    "model_unavailable",  # every attempt failed with 429 / 5xx / timeout / connection
    "retry_budget_exhausted",  # the global retry budget was empty during a failure burst
    "timeout",
    "rate_limited",
    "server_error",
    "connection",
})

Kind = Literal["transient", "permanent"]


def is_transient(reason: str) -> bool:
    """True when the records of a review with ``reason`` may succeed if simply sent again."""
    return reason in TRANSIENT_REASONS


def kind_of(reason: str) -> Kind:
    return "transient" if is_transient(reason) else "permanent"
