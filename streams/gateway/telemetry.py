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


GENAI_OPERATION = "chat"
# OpenTelemetry gen_ai.token.type values for our token kinds
GENAI_TOKEN_TYPE = {"prompt": "input", "completion": "output"}


class LaneMetrics:
    """One lane's model telemetry, under retro_* names and the OpenTelemetry GenAI ones.

    ``model`` and ``provider`` fill ``gen_ai_request_model`` and ``gen_ai_provider_name``
    (one value each per deployment, so the cardinality stays low).
    """

    __slots__ = ("lane", "metrics", "model", "provider")

    def __init__(self, metrics: Metrics | None, lane: Lane, *, model: str = "",
                 provider: str = "openai") -> None:
        self.metrics = metrics
        self.lane: Lane = lane
        self.model = model
        self.provider = provider
        if metrics is not None:
            self._genai_duration("")  # successes start at 0, so the panel has a series
            self._genai_duration("rate_limited")

    def _genai_duration(self, error_type: str) -> object:
        assert self.metrics is not None
        return self.metrics.genai_duration.labels(GENAI_OPERATION, self.provider, self.model,
                                                  error_type)

    def call(self, status: str, seconds: float) -> None:
        """One backend call ended: ``status`` ok | truncated | a ``call_status`` failure."""
        if self.metrics is not None:
            self.metrics.model_calls.labels(self.lane, status).inc()
            self.metrics.model_latency.labels(self.lane).observe(seconds)
            # semconv: error.type is absent on success; a cut answer still is one
            error_type = "" if status in ("ok", "truncated") else status
            self._genai_duration(error_type).observe(seconds)  # type: ignore[attr-defined]

    def tokens(self, prompt: int, completion: int) -> None:
        if self.metrics is not None:
            self.metrics.tokens.labels(self.lane, "prompt").inc(prompt)
            self.metrics.tokens.labels(self.lane, "completion").inc(completion)
            for kind, count in (("prompt", prompt), ("completion", completion)):
                self.metrics.genai_tokens.labels(
                    GENAI_OPERATION, self.provider, self.model, GENAI_TOKEN_TYPE[kind]
                ).observe(count)

    def provider_quota(self, ratelimit: dict[str, int]) -> None:
        """The provider's own view of the quota (x-ratelimit-* headers), when it sends it."""
        if self.metrics is None:
            return
        for key, value in ratelimit.items():
            which, kind = key.split("-", 1)
            gauge = self.metrics.provider_remaining if which == "remaining" else (
                self.metrics.provider_limit)
            gauge.labels(kind).set(value)

    def buckets(self, requests: float, tokens: float) -> None:
        if self.metrics is not None:
            self.metrics.bucket_available.labels("requests").set(requests)
            self.metrics.bucket_available.labels("tokens").set(tokens)

    def concurrency(self, limit: int, in_flight: int) -> None:
        if self.metrics is not None:
            self.metrics.concurrency_limit.labels(self.lane).set(limit)
            self.metrics.in_flight.labels(self.lane).set(max(0, in_flight))

    def rate_limited(self, limit: str = "unknown") -> None:
        """A 429; ``limit`` is the quota it names (requests | tokens | unknown)."""
        if self.metrics is not None:
            self.metrics.rate_limited.labels(self.lane, limit).inc()

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
