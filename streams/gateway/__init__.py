"""The model gateway: batches to fragments within a provider's limits (pure asyncio).

``Gateway.analyze(batch)`` is the one entry point; the limiter, buckets, retry
budget, cache and backend are built by the composition root and passed in.
"""

from streams.gateway.aimd import AIMDLimiter
from streams.gateway.backends import (
    ChatBackend,
    ChatResult,
    OpenAIBackend,
    RulesBackend,
    build_backend,
    parse_retry_after,
)
from streams.gateway.buckets import TokenBucket
from streams.gateway.cache import AnswerCache, MemoryCache, RedisCache, build_cache
from streams.gateway.gateway import Gateway
from streams.gateway.retry import RetryBudget, backoff_delay
from streams.records import BatchOutcome

__all__ = [
    "AIMDLimiter",
    "AnswerCache",
    "BatchOutcome",
    "ChatBackend",
    "ChatResult",
    "Gateway",
    "MemoryCache",
    "OpenAIBackend",
    "RedisCache",
    "RetryBudget",
    "RulesBackend",
    "TokenBucket",
    "backoff_delay",
    "build_backend",
    "build_cache",
    "parse_retry_after",
]
