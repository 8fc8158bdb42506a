"""One small exception hierarchy for retro-stream.

Catch at the level you can act on::

    RetroError                   exit 1 at the command line unless a subclass says
    ├── UsageError               the command line is wrong (exit 64)
    ├── InputError               a named input file is missing, a folder or unreadable (66)
    ├── OutputError              an output file cannot be written (73)
    ├── ConfigError              settings are wrong; fix the environment or flags (78)
    ├── KafkaUnreachable         no bootstrap server answered in time (69)
    ├── PortInUse                a port we must listen on is taken (75)
    ├── BrokerError              the local broker launcher failed: Java, Maven, ports (70)
    ├── DeliveryFailed           records did not reach Kafka, even after retries (74)
    ├── NotAuthorized            this Kafka user may not read or write a topic it needs (77)
    ├── RecordError              one input record is unusable -> dead letter, never a crash
    │   ├── DecodeError          bytes are not text we can repair
    │   ├── RecordTooLarge       over the configured size limit
    │   └── BadLaneRecord        a lane message is not a normalized record
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
The command line prints that message as one line and exits with ``exit_code``, so
scripts can tell the failures apart (codes follow BSD ``sysexits.h`` where one fits).
Besides these, ``retro audit`` exits 2 when records are missing or double-counted,
and a command whose reader closed the pipe (``retro clean ... | head``) exits 141,
as a process killed by SIGPIPE would.
"""

from __future__ import annotations


class RetroError(Exception):
    """Root of every error retro-stream raises on purpose."""

    reason: str = "error"
    exit_code: int = 1

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class UsageError(RetroError):
    reason = "usage"
    exit_code = 64


class InputError(RetroError):
    reason = "input"
    exit_code = 66


class OutputError(RetroError):
    reason = "output"
    exit_code = 73


class ConfigError(RetroError):
    reason = "config"
    exit_code = 78


class KafkaUnreachable(RetroError):
    reason = "kafka_unreachable"
    exit_code = 69


class PortInUse(RetroError):
    reason = "port_in_use"
    exit_code = 75


class BrokerError(RetroError):
    reason = "broker"
    exit_code = 70


class DeliveryFailed(RetroError):
    reason = "delivery_failed"
    exit_code = 74


class NotAuthorized(RetroError):
    """The broker refused this user a topic: an empty answer would read as "nothing there"."""

    reason = "not_authorized"
    exit_code = 77  # EX_NOPERM


class RecordError(RetroError):
    reason = "bad_record"


class DecodeError(RecordError):
    reason = "undecodable"


class RecordTooLarge(RecordError):
    reason = "too_large"


class BadLaneRecord(RecordError):
    reason = "bad_record"


class ModelError(RetroError):
    reason = "model_error"


class TransientModelError(ModelError):
    reason = "transient"


class RateLimited(TransientModelError):
    reason = "rate_limited"

    def __init__(self, message: str, *, retry_after: float | None = None,
                 limit: str = "unknown", ratelimit: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.limit = limit  # which quota the provider says ran out: requests | tokens | unknown
        self.ratelimit = ratelimit or {}  # x-ratelimit-* headers of the 429


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


EXIT_AUDIT_FAILED = 2  # `retro audit`: records missing or counted twice
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away
