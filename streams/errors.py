"""One small exception hierarchy for retro-stream.

Catch at the level you can act on::

    RetroError
    ├── ConfigError              settings are wrong; fix the environment or flags
    ├── BrokerError              the local broker launcher failed (Java, Maven, ports)
    ├── RecordError              one input record is unusable -> dead letter, never a crash
    │   ├── DecodeError          bytes are not text we can repair
    │   └── RecordTooLarge       over the configured size limit
    ├── ModelError               a model call failed
    │   ├── TransientModelError  worth retrying: rate limited, timeout, 5xx
    │   │   └── RateLimited      429; carries retry_after seconds
    │   └── PermanentModelError  retrying the same request will not help
    │       ├── ContextTooLong   prompt over the model context; split the batch
    │       ├── Truncated        answer cut at max_tokens; split the batch
    │       └── MalformedOutput  answer is not the JSON we asked for
    └── ValidationFailed         a model answer broke the fragment contract -> review topic

Every error carries a ``reason``: a short stable code used in dead-letter and
review messages and as a metric label, plus a human message saying what to do.
"""

from __future__ import annotations


class RetroError(Exception):
    """Root of every error retro-stream raises on purpose."""

    reason: str = "error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class ConfigError(RetroError):
    reason = "config"


class BrokerError(RetroError):
    reason = "broker"


class RecordError(RetroError):
    reason = "bad_record"


class DecodeError(RecordError):
    reason = "undecodable"


class RecordTooLarge(RecordError):
    reason = "too_large"


class ModelError(RetroError):
    reason = "model_error"


class TransientModelError(ModelError):
    reason = "transient"


class RateLimited(TransientModelError):
    reason = "rate_limited"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentModelError(ModelError):
    reason = "permanent"


class ContextTooLong(PermanentModelError):
    reason = "context_length"


class Truncated(PermanentModelError):
    reason = "truncated"


class MalformedOutput(PermanentModelError):
    reason = "malformed_output"


class ValidationFailed(RetroError):
    reason = "validation_failed"
