"""The fake provider's settings, counters and sliding-minute rate window.

Kept apart from the HTTP handling so the limits and validation read on their own.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WINDOW_SECONDS = 60.0
_INT_FIELDS = {"rpm", "tpm", "context", "seed", "max_recorded", "truncate_min_tokens",
               "context_error_min_tokens"}
_NULLABLE = {"rpm", "tpm", "api_key"}
_RATE_FIELDS = {"error_rate", "timeout_rate", "malformed_rate", "wrong_ids_rate",
                "truncate_rate", "context_error_rate"}
_MAY_BE_ZERO = {"seed", "truncate_min_tokens", "context_error_min_tokens"}
_ABOVE_ZERO = {"window_seconds"}  # a window of 0 s would never limit anything


@dataclass
class FakeLLMConfig:
    """What the simulated provider does; mutable at run time (tests switch faults)."""

    model: str = "fake-gpt"
    rpm: int | None = None  # requests per sliding window; None: unlimited
    tpm: int | None = None  # prompt + max_tokens per sliding window; None: unlimited
    # the window rpm and tpm count in: a minute, as providers count; tests shorten it so
    # that a 429's Retry-After costs seconds, not a minute
    window_seconds: float = WINDOW_SECONDS
    context: int = 8192
    base_latency: float = 0.02  # seconds per request
    per_input_token: float = 0.00002  # seconds per prompt token
    per_output_token: float = 0.0002  # seconds per completion token
    error_rate: float = 0.0  # share answered 500/502/503
    timeout_rate: float = 0.0  # share that stall for stall_seconds, then 504
    stall_seconds: float = 600.0  # longer than any client timeout
    malformed_rate: float = 0.0  # share answered 200 with content that is not JSON
    wrong_ids_rate: float = 0.0  # share whose answer drops a ref or adds an unknown one
    # share of answers cut at half their length (finish_reason "length"), as a model
    # that runs out of output tokens does; the gateway then splits the batch
    truncate_rate: float = 0.0
    # share of requests refused with 400 context_length_exceeded although they fit the
    # declared context (the provider counts tokens differently); the gateway splits
    context_error_rate: float = 0.0
    # the two faults hit only answers / prompts above these many tokens, as real ones
    # hit long requests: the gateway's split halves eventually pass (0: any size)
    truncate_min_tokens: int = 0
    context_error_min_tokens: int = 0
    seed: int = 0
    api_key: str | None = None  # if set, requests need "Authorization: Bearer <key>"
    max_recorded: int = 10_000  # request bodies kept for inspection

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Reject impossible settings up front, with the field named."""
        for name in (f.name for f in dataclasses.fields(self)):
            value = getattr(self, name)
            if value is None and name in _NULLABLE:
                continue
            if name in ("model", "api_key"):
                ok, wanted = isinstance(value, str) and bool(value), "a non-empty string"
            elif name in _INT_FIELDS:
                ok = isinstance(value, int) and not isinstance(value, bool)
                floor = 0 if name in _MAY_BE_ZERO else 1
                ok = ok and (name == "seed" or value >= floor)
                wanted = f"an integer >= {floor}"
            else:
                number = isinstance(value, int | float) and not isinstance(value, bool)
                if name in _ABOVE_ZERO:
                    ok, wanted = number and 0 < value < math.inf, "a number above 0"
                else:
                    top = 1.0 if name in _RATE_FIELDS else math.inf
                    ok, wanted = number and 0 <= value <= top, f"a number in [0, {top}]"
            if not ok:
                raise ValueError(f"{name} must be {wanted}, got {value!r}")

    def patch(self, changes: Mapping[str, Any]) -> None:
        """Apply a JSON patch in place, all or nothing."""
        names = {f.name for f in dataclasses.fields(self)}
        if unknown := sorted(set(changes) - names):
            raise ValueError(f"unknown config fields {unknown}; known: {sorted(names)}")
        candidate = dataclasses.replace(self, **changes)  # validates
        for name in changes:
            setattr(self, name, getattr(candidate, name))

    def public(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "api_key": "***" if self.api_key else None}


@dataclass
class FakeLLMStats:
    """Each finished chat request counts under exactly one outcome, besides ``requests``.

    ``ok`` is a complete, well-formed answer; ``truncated`` / ``malformed`` /
    ``wrong_ids`` are 200s with that defect; ``timeouts`` are stalled requests.
    """

    requests: int = 0
    ok: int = 0
    rate_limited: int = 0
    errors_5xx: int = 0
    timeouts: int = 0
    malformed: int = 0
    wrong_ids: int = 0
    context_errors: int = 0
    truncated: int = 0
    bad_requests: int = 0
    cancelled: int = 0  # the client hung up before the answer (not a stall)
    prompt_tokens: int = 0  # served in 200 answers
    completion_tokens: int = 0
    in_flight: int = 0
    max_in_flight: int = 0


class SlidingWindow:
    """Amounts spent in the last ``seconds``; says how long until ``need`` more fits."""

    __slots__ = ("_entries", "seconds")

    def __init__(self, seconds: float = WINDOW_SECONDS) -> None:
        self.seconds = seconds
        self._entries: deque[tuple[float, int]] = deque()

    def used(self, now: float) -> int:
        while self._entries and self._entries[0][0] <= now - self.seconds:
            self._entries.popleft()
        return sum(amount for _, amount in self._entries)

    def until_empty(self, now: float) -> float:
        """Seconds until nothing is left in the window (the limit back to its initial state)."""
        self.used(now)
        return self._entries[-1][0] + self.seconds - now if self._entries else 0.0

    def add(self, now: float, amount: int) -> None:
        self._entries.append((now, amount))

    def wait(self, now: float, limit: int, need: int) -> float:
        """Seconds until ``used + need <= limit``: 0 if it fits now, a full window if never."""
        used = self.used(now)
        if used + need <= limit:
            return 0.0
        if need <= limit:
            for stamp, amount in self._entries:
                used -= amount
                if used + need <= limit:
                    return stamp + self.seconds - now
        return self.seconds

    def clear(self) -> None:
        self._entries.clear()
