"""The gateway's metrics for one lane; every method is a no-op without a registry.

Keeps ``if metrics is not None`` out of the retry and split logic, and keeps the
label values (metrics.py) in one place.
"""

from __future__ import annotations

from streams.errors import ContextTooLong, ModelError, RateLimited
from streams.metrics import Metrics
from streams.records import Lane


def call_status(exc: ModelError) -> str:
    """The ``status`` label of a failed call: rate_limited | context | timeout | error."""
    if isinstance(exc, RateLimited):
        return "rate_limited"
    if isinstance(exc, ContextTooLong):
        return "context"
    if exc.reason == "timeout":
        return "timeout"
    return "error"


class LaneMetrics:
    __slots__ = ("lane", "metrics")

    def __init__(self, metrics: Metrics | None, lane: Lane) -> None:
        self.metrics = metrics
        self.lane: Lane = lane

    def call(self, status: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.model_calls.labels(self.lane, status).inc()
            self.metrics.model_latency.labels(self.lane).observe(seconds)

    def tokens(self, prompt: int, completion: int) -> None:
        if self.metrics is not None:
            self.metrics.tokens.labels(self.lane, "prompt").inc(prompt)
            self.metrics.tokens.labels(self.lane, "completion").inc(completion)

    def concurrency(self, limit: int, in_flight: int) -> None:
        if self.metrics is not None:
            self.metrics.concurrency_limit.labels(self.lane).set(limit)
            self.metrics.in_flight.labels(self.lane).set(max(0, in_flight))

    def rate_limited(self) -> None:
        if self.metrics is not None:
            self.metrics.rate_limited.labels(self.lane).inc()

    def retry(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.retries.labels(self.lane, reason).inc()

    def budget_exhausted(self) -> None:
        if self.metrics is not None:
            self.metrics.retry_budget_exhausted.labels(self.lane).inc()

    def cache(self, hit: bool) -> None:
        if self.metrics is not None:
            self.metrics.cache.labels(self.lane, "hit" if hit else "miss").inc()

    def split(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.splits.labels(self.lane, reason).inc()

    def review(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.reviews.labels(self.lane, reason).inc()

    def fragments(self, count: int) -> None:
        if self.metrics is not None and count:
            self.metrics.fragments.labels(self.lane).inc(count)
