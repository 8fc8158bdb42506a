"""A simulated OpenAI-compatible provider for tests, benchmarks and demos.

It behaves like a real one where the gateway cares: sliding-minute rpm/tpm limits
(429 + ``Retry-After``), a context limit (400 ``context_length_exceeded``),
truncation at ``max_tokens`` (``finish_reason: "length"``), latency growing with
input and output tokens, and seeded faults (5xx, stalls past the client timeout,
broken JSON, wrong refs). Answers are real analysis (``streams.gateway.rules.analyzer``)
written the way the prompts ask (``streams.dev.fakellm.judge``: causes state origin or
impact and the pattern, severity is calibrated, summaries say both), so a pipeline run
against it yields meaningful fragments in the model's shape; received bodies are
recorded so tests can prove no redacted secret reached the provider.

Control plane for other processes: ``GET /_fake/stats``, ``GET /_fake/requests``
(``?since=SEQ&limit=N``), ``POST /_fake/config`` (JSON patch), ``POST /_fake/reset``.
"""

from streams.dev.fakellm.config import (
    WINDOW_SECONDS,
    FakeLLMConfig,
    FakeLLMStats,
    SlidingWindow,
)
from streams.dev.fakellm.provider import TOKENS_PER_MESSAGE, FakeProvider
from streams.dev.fakellm.server import PROVIDER_KEY, FakeLLMServer, make_app, serve

__all__ = [
    "PROVIDER_KEY",
    "TOKENS_PER_MESSAGE",
    "WINDOW_SECONDS",
    "FakeLLMConfig",
    "FakeLLMServer",
    "FakeLLMStats",
    "FakeProvider",
    "SlidingWindow",
    "make_app",
    "serve",
]
