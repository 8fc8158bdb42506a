"""One model request within the provider's limits, retried while it is worth it.

The transport policy, apart from what a batch means: AIMD slot (fresh work at
priority 0, retries at 1), then the RPM and TPM buckets, then the call under a
timeout. A 429 shrinks concurrency and blocks the buckets for its Retry-After;
429s and transient errors retry with jittered exponential backoff while attempts
and the global retry budget last. Everything else is handed back to the gateway.
Every answer's ``x-ratelimit-remaining-*`` caps the buckets until its reset, less
the calls sent since (``TokenBucket.follow_remaining``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from streams.clock import Sleep
from streams.errors import (
    ContextTooLong,
    ModelError,
    PermanentModelError,
    RateLimited,
    TransientModelError,
)
from streams.gateway.aimd import AIMDLimiter
from streams.gateway.backends import ChatBackend, ChatResult
from streams.gateway.buckets import TokenBucket
from streams.gateway.retry import RetryBudget, backoff_delay
from streams.gateway.telemetry import LaneMetrics, call_status

logger = logging.getLogger(__name__)


class Calibration(Protocol):
    """What the gateway needs of ``streams.tokens.TokenCalibration``."""

    def observe(self, model: str, estimated: int, reported: int) -> None: ...

    def adjust(self, model: str, estimated: int) -> int: ...


@dataclass(frozen=True)
class CallFailure:
    """Why a request ended without an answer."""

    reason: str  # the review reason if the batch cannot be split (further)
    detail: str
    split: bool = False  # True: the batch may succeed in smaller pieces
    output: str | None = None  # the model's answer, if there was one
    split_reason: str | None = None  # the splits metric label, when it differs from reason


class ModelCaller:
    """Sends requests for one lane; shares limiter, buckets and budget with its peers."""

    def __init__(
        self,
        *,
        backend: ChatBackend,
        model: str,
        timeout_seconds: float,
        limiter: AIMDLimiter,
        rpm: TokenBucket,
        tpm: TokenBucket,
        retry_budget: RetryBudget,
        max_attempts: int,
        backoff_base: float,
        calibration: Calibration | None,
        telemetry: LaneMetrics,
        sleep: Sleep,
        rng: random.Random,
        advertised: Callable[[Mapping[str, int]], None] | None = None,
        follow_remaining: bool = True,
    ) -> None:
        """``advertised`` hears the x-ratelimit-* counts of every answer (429s too), so the
        shared quota can follow what the provider advertises (``QuotaShare.advertise``);
        ``follow_remaining``: cap the buckets by each answer's remaining counts."""
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds}")
        self.backend = backend
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.limiter = limiter
        self.rpm = rpm
        self.tpm = tpm
        self.retry_budget = retry_budget
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.calibration = calibration
        self.telemetry = telemetry
        self._sleep = sleep
        self._rng = rng
        self.advertised = advertised
        self.follow_remaining = follow_remaining

    async def request(
        self,
        messages: list[dict[str, Any]],
        *,
        prompt_tokens: int,
        max_tokens: int,
        observe: int | None,
    ) -> tuple[ChatResult | CallFailure, int]:
        """(an answer or why there is none, backend calls made).

        ``observe``: the batch's raw token estimate, fed to calibration with the
        prompt tokens the provider reports (None when the prompt is not the batch's).
        """
        self.retry_budget.on_request()
        lane = self.telemetry.lane
        calls = 0
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            try:
                calls += 1
                result = await self._call(
                    messages, prompt_tokens, max_tokens, priority=0 if attempt == 1 else 1
                )
            except RateLimited as exc:
                failure: ModelError = exc
                retry_after = exc.retry_after
                self._on_rate_limited(retry_after, exc)
            except TransientModelError as exc:
                failure = exc
            except ContextTooLong as exc:
                return CallFailure("context_length", str(exc), split=True), calls
            except PermanentModelError as exc:
                return CallFailure(exc.reason, str(exc)), calls
            else:
                self._on_success(result, observe)
                return result, calls
            last = f"last: {failure.reason}: {failure}"
            if attempt >= self.max_attempts:
                return CallFailure("model_unavailable", f"{attempt} attempts failed; {last}"), calls
            if not self.retry_budget.try_spend():
                self.telemetry.budget_exhausted()
                detail = f"the global retry budget is empty (many failures at once); {last}"
                return CallFailure("retry_budget_exhausted", detail), calls
            delay = backoff_delay(attempt, base=self.backoff_base, rng=self._rng)
            if retry_after is not None:
                delay = max(delay, retry_after)
            self.telemetry.retry(failure.reason)
            logger.info(
                "%s lane: attempt %d failed (%s), retry in %.2fs", lane, attempt, failure, delay
            )
            await self._sleep(delay)

    async def _call(
        self, messages: list[dict[str, Any]], prompt_tokens: int, max_tokens: int, *, priority: int
    ) -> ChatResult:
        async with self.limiter.slot(priority):
            self._gauges(held=0)
            # a repair prompt may estimate above the capacity the gateway checked
            tokens = min(prompt_tokens + max_tokens, self.tpm.capacity)
            try:
                async with self.rpm.hold(1) as request, self.tpm.hold(tokens) as charged:
                    try:
                        result = await self._timed(messages, max_tokens)
                    except RateLimited as exc:
                        # a 429's counts bind until the wait it asks for
                        self._remaining(exc.ratelimit, {}, exc.retry_after, request, charged)
                        raise
                    self._remaining(result.ratelimit, result.ratelimit_reset, None, request,
                                    charged)
                    return result
            finally:
                self._gauges(held=1)  # the slot is released right after this

    def _remaining(self, ratelimit: Mapping[str, int], reset: Mapping[str, float],
                   default_reset: float | None, request: int, charged: int) -> None:
        """Cap the buckets by the remaining counts of the answer to these tickets."""
        if not self.follow_remaining:
            return
        for kind, bucket, ticket in (("requests", self.rpm, request),
                                     ("tokens", self.tpm, charged)):
            remaining = ratelimit.get(f"remaining-{kind}")
            if remaining is not None:
                bucket.follow_remaining(remaining, reset=reset.get(kind, default_reset),
                                        ticket=ticket)

    async def _timed(self, messages: list[dict[str, Any]], max_tokens: int) -> ChatResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(self.timeout_seconds):
                result = await self.backend.chat(
                    model=self.model,
                    messages=messages,
                    max_tokens=max_tokens,
                    timeout=self.timeout_seconds,
                )
        except TimeoutError as exc:
            self.telemetry.call("timeout", loop.time() - started)
            raise TransientModelError(
                f"no answer within {self.timeout_seconds:g}s; raise the lane's "
                "timeout_seconds if the model is just slow",
                reason="timeout",
            ) from exc
        except ModelError as exc:
            self.telemetry.call(call_status(exc), loop.time() - started)
            raise
        status = "truncated" if result.finish_reason == "length" else "ok"
        self.telemetry.call(status, loop.time() - started)
        return result

    def _on_success(self, result: ChatResult, observe: int | None) -> None:
        self.limiter.on_success()
        if self.calibration is not None and observe is not None and result.prompt_tokens > 0:
            self.calibration.observe(self.model, observe, result.prompt_tokens)
        self.telemetry.tokens(result.prompt_tokens, result.completion_tokens)
        self._provider_quota(result.ratelimit)
        self._gauges(held=0)

    def _on_rate_limited(self, retry_after: float | None, exc: RateLimited) -> None:
        self.limiter.on_rate_limited()
        if retry_after:
            self.rpm.penalize(retry_after)
            self.tpm.penalize(retry_after)
        self.telemetry.rate_limited(exc.limit)
        self._provider_quota(exc.ratelimit)
        self._gauges(held=0)

    def _provider_quota(self, ratelimit: dict[str, int]) -> None:
        self.telemetry.provider_quota(ratelimit)
        if ratelimit and self.advertised is not None:
            self.advertised(ratelimit)

    def _gauges(self, *, held: int) -> None:
        self.telemetry.concurrency(self.limiter.limit, self.limiter.in_flight - held)
        self.telemetry.buckets(self.rpm.available, self.tpm.available)
