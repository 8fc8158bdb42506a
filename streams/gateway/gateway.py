"""The model gateway: one batch in, fragments and reviews out, never an exception.

For each batch::

    cache hit (answer re-validated against this batch)  -> fragments
    otherwise: AIMD slot (fresh 0, retries 1) -> RPM, TPM buckets -> backend.chat
        429            shrink concurrency, honour Retry-After, retry within budget
        5xx / timeout  exponential backoff with jitter, retry within budget
        context / cut  split the batch in half and analyze both (recursively)
        bad JSON       one repair request, then review
        bad contract   review with the validation reason

Every record of the batch ends in exactly one fragment or one review: the halves of
a split partition the batch, and each leaf either validates (fragments cover its
records exactly once) or becomes a review covering all of its records.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from streams.batching import Batch
from streams.errors import (
    ConfigError,
    ContextTooLong,
    MalformedOutput,
    ModelError,
    PermanentModelError,
    RateLimited,
    TransientModelError,
    Truncated,
    ValidationFailed,
)
from streams.fragments import parse_answer, review_for, validate_answer
from streams.gateway.aimd import AIMDLimiter
from streams.gateway.backends import ChatBackend, ChatResult
from streams.gateway.buckets import TokenBucket
from streams.gateway.cache import AnswerCache
from streams.gateway.retry import RetryBudget, backoff_delay
from streams.metrics import Metrics
from streams.prompt import Detail, build_messages, cache_key, max_output_tokens, repair_messages
from streams.records import Fragment, Lane, Review

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


class Calibration(Protocol):
    """What the gateway needs of ``streams.clean.tokens.TokenCalibration``."""

    def observe(self, model: str, estimated: int, reported: int) -> None: ...

    def adjust(self, model: str, estimated: int) -> int: ...


@dataclass
class BatchOutcome:
    """What became of one batch: its fragments and reviews together cover it exactly."""

    fragments: list[Fragment] = field(default_factory=list)
    reviews: list[Review] = field(default_factory=list)
    calls: int = 0  # backend calls made, retries and repairs included
    cache_hits: int = 0


@dataclass(frozen=True)
class _Failure:
    """Why a conversation with the model ended without an answer."""

    reason: str
    detail: str
    split: bool = False  # True: the batch may succeed in smaller pieces


class Gateway:
    """Sends batches of one lane to a model, within the provider's limits."""

    def __init__(
        self,
        *,
        backend: ChatBackend,
        lane: Lane,
        model: str,
        prompt_version: str,
        detail: Detail,
        context_window: int,
        output_reserve: float,
        timeout_seconds: float,
        limiter: AIMDLimiter,
        rpm: TokenBucket,
        tpm: TokenBucket,
        retry_budget: RetryBudget,
        cache: AnswerCache | None,
        max_attempts: int = 3,
        backoff_base: float = 1.0,
        calibration: Calibration | None = None,
        metrics: Metrics | None = None,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds}")
        if context_window <= 0:
            raise ValueError(f"context_window must be positive, got {context_window}")
        if output_reserve < 0:
            raise ValueError(f"output_reserve must not be negative, got {output_reserve}")
        self.backend = backend
        self.lane: Lane = lane
        self.model = model
        self.prompt_version = prompt_version
        self.detail: Detail = detail
        self.context_window = context_window
        self.output_reserve = output_reserve
        self.timeout_seconds = timeout_seconds
        self.limiter = limiter
        self.rpm = rpm
        self.tpm = tpm
        self.retry_budget = retry_budget
        self.cache = cache
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.calibration = calibration
        self.metrics = metrics
        self._sleep = sleep
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"Gateway(lane={self.lane!r}, model={self.model!r}, backend={self.backend!r})"

    async def analyze(self, batch: Batch) -> BatchOutcome:
        """Fragments and reviews for ``batch``; every record ends in exactly one of them."""
        outcome = BatchOutcome()
        await self._analyze(batch, outcome)
        if self.metrics is not None and outcome.fragments:
            self.metrics.fragments.labels(self.lane).inc(len(outcome.fragments))
        return outcome

    # -- one batch ---------------------------------------------------------------

    async def _analyze(self, batch: Batch, out: BatchOutcome) -> None:
        key: str | None = None
        if self.cache is not None:
            key = cache_key(
                batch, model=self.model, prompt_version=self.prompt_version, detail=self.detail
            )
            if await self._from_cache(key, batch, out):
                return
        estimated = batch.estimated_input_tokens
        if self.calibration is not None:
            estimated = self.calibration.adjust(self.model, estimated)
        try:
            max_tokens = max_output_tokens(
                estimated, context_window=self.context_window, output_reserve=self.output_reserve
            )
        except ContextTooLong as exc:
            await self._split(
                batch, out, reason="context_length", why="context_length", detail=str(exc)
            )
            return

        if estimated + max_tokens > self.tpm.capacity:
            raise ConfigError(
                f"a {self.lane} batch needs ~{estimated + max_tokens} tokens (prompt plus "
                f"reserved answer) but the tokens-per-minute bucket holds {self.tpm.capacity:g}; "
                "raise RETRO_MODEL__TPM or lower the lane's input_budget"
            )
        messages = build_messages(batch, detail=self.detail, prompt_version=self.prompt_version)
        prompt_tokens = estimated
        observe: int | None = batch.estimated_input_tokens
        repaired = False
        while True:
            result = await self._converse(messages, prompt_tokens, max_tokens, observe, out)
            if isinstance(result, _Failure):
                if result.split:
                    await self._split(
                        batch, out, reason=result.reason, why=result.reason, detail=result.detail
                    )
                else:
                    self._review(batch, out, reason=result.reason, detail=result.detail)
                return
            if result.finish_reason == "length":
                await self._split(
                    batch,
                    out,
                    reason="truncated",
                    why="truncated",
                    output=result.content,
                    detail=f"the answer was cut at max_tokens={max_tokens}",
                )
                return
            try:
                answer = parse_answer(result.content)
                fragments = validate_answer(
                    batch, answer, model=self.model, prompt_version=self.prompt_version
                )
            except MalformedOutput as exc:
                if repaired:
                    self._review(
                        batch,
                        out,
                        reason="malformed_output",
                        output=result.content,
                        detail=f"no usable JSON after one repair request: {exc}",
                    )
                    return
                repaired = True
                logger.info(
                    "%s lane: malformed answer, asking once for a repair: %s", self.lane, exc
                )
                if self.metrics is not None:
                    self.metrics.retries.labels(self.lane, "malformed_output").inc()
                messages = repair_messages(messages, result.content, str(exc))
                prompt_tokens = estimated + result.completion_tokens
                observe = None  # the repair prompt is not what the batch estimate measured
                continue
            except Truncated as exc:
                await self._split(
                    batch,
                    out,
                    reason="truncated",
                    why=exc.reason,
                    detail=str(exc),
                    output=result.content,
                )
                return
            except ValidationFailed as exc:
                self._review(batch, out, reason=exc.reason, detail=str(exc), output=result.content)
                return
            out.fragments.extend(fragments)
            if self.cache is not None and key is not None:
                await self.cache.set(key, result.content)
            return

    async def _from_cache(self, key: str, batch: Batch, out: BatchOutcome) -> bool:
        assert self.cache is not None
        text = await self.cache.get(key)
        fragments: list[Fragment] | None = None
        if text is not None:
            try:
                fragments = validate_answer(
                    batch, parse_answer(text), model=self.model, prompt_version=self.prompt_version
                )
            except (ModelError, ValidationFailed) as exc:
                logger.info(
                    "%s lane: cached answer does not fit this batch (%s); calling the model",
                    self.lane,
                    exc,
                )
        if self.metrics is not None:
            self.metrics.cache.labels(self.lane, "hit" if fragments is not None else "miss").inc()
        if fragments is None:
            return False
        out.fragments.extend(fragments)
        out.cache_hits += 1
        return True

    async def _split(
        self,
        batch: Batch,
        out: BatchOutcome,
        *,
        reason: str,
        why: str,
        detail: str,
        output: str | None = None,
    ) -> None:
        """Analyze both halves; a batch that cannot be halved goes to review as ``reason``."""
        if batch.record_count < 2:
            self._review(
                batch,
                out,
                reason=reason,
                detail=detail + "; a single record cannot be split further",
                output=output,
            )
            return
        try:
            left, right = batch.split()
        except ValueError as exc:
            self._review(batch, out, reason=reason, detail=f"{detail}; {exc}", output=output)
            return
        logger.info(
            "%s lane: splitting a batch of %d records (%s): %s",
            self.lane,
            batch.record_count,
            why,
            detail,
        )
        if self.metrics is not None:
            self.metrics.splits.labels(self.lane, why).inc()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._analyze(left, out))
            group.create_task(self._analyze(right, out))

    def _review(
        self,
        batch: Batch,
        out: BatchOutcome,
        *,
        reason: str,
        detail: str,
        output: str | None = None,
    ) -> None:
        review = review_for(
            batch,
            reason=reason,
            detail=detail,
            model=self.model,
            prompt_version=self.prompt_version,
            output=output,
        )
        out.reviews.append(review)
        logger.warning(
            "%s lane: %d records (%s) to review, %s: %s",
            self.lane,
            batch.record_count,
            _where(review.covered),
            reason,
            detail,
        )
        if self.metrics is not None:
            self.metrics.reviews.labels(self.lane, reason).inc()

    # -- one request, with retries -----------------------------------------------

    async def _converse(
        self,
        messages: list[dict[str, Any]],
        prompt_tokens: int,
        max_tokens: int,
        observe: int | None,
        out: BatchOutcome,
    ) -> ChatResult | _Failure:
        """One request and its retries: a result, or why there is none."""
        self.retry_budget.on_request()
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            try:
                return await self._call(
                    messages,
                    prompt_tokens,
                    max_tokens,
                    observe,
                    out,
                    priority=0 if attempt == 1 else 1,
                )
            except RateLimited as exc:
                failure: ModelError = exc
                retry_after = exc.retry_after
                self._on_rate_limited(retry_after)
            except TransientModelError as exc:
                failure = exc
            except ContextTooLong as exc:
                return _Failure("context_length", str(exc), split=True)
            except PermanentModelError as exc:
                return _Failure(exc.reason, str(exc))
            if attempt >= self.max_attempts:
                return _Failure(
                    "model_unavailable",
                    f"{attempt} attempts failed; last: {failure.reason}: {failure}",
                )
            if not self.retry_budget.try_spend():
                if self.metrics is not None:
                    self.metrics.retry_budget_exhausted.labels(self.lane).inc()
                return _Failure(
                    "retry_budget_exhausted",
                    f"the global retry budget is empty (too many failures across batches); "
                    f"last: {failure.reason}: {failure}",
                )
            delay = backoff_delay(attempt, base=self.backoff_base, rng=self._rng)
            if retry_after is not None:
                delay = max(delay, retry_after)
            if self.metrics is not None:
                self.metrics.retries.labels(self.lane, failure.reason).inc()
            logger.info(
                "%s lane: attempt %d failed (%s), retrying in %.2fs",
                self.lane,
                attempt,
                failure.reason,
                delay,
            )
            await self._sleep(delay)

    async def _call(
        self,
        messages: list[dict[str, Any]],
        prompt_tokens: int,
        max_tokens: int,
        observe: int | None,
        out: BatchOutcome,
        *,
        priority: int,
    ) -> ChatResult:
        async with self.limiter.slot(priority):
            self._gauges()
            try:
                await self.rpm.acquire(1)
                # a repair prompt may estimate above the capacity checked in _analyze
                await self.tpm.acquire(min(prompt_tokens + max_tokens, self.tpm.capacity))
                out.calls += 1
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
                    self._count_call("timeout", loop.time() - started)
                    raise TransientModelError(
                        f"no answer within {self.timeout_seconds:g}s; raise the lane's "
                        "timeout_seconds if the model is just slow",
                        reason="timeout",
                    ) from exc
                except ModelError as exc:
                    self._count_call(_status(exc), loop.time() - started)
                    raise
                status = "truncated" if result.finish_reason == "length" else "ok"
                self._count_call(status, loop.time() - started)
                self._on_success(result, observe)
                return result
            finally:
                self._gauges(leaving=True)

    # -- feedback and metrics -----------------------------------------------------

    def _on_success(self, result: ChatResult, observe: int | None) -> None:
        self.limiter.on_success()
        if self.calibration is not None and observe is not None and result.prompt_tokens > 0:
            self.calibration.observe(self.model, observe, result.prompt_tokens)
        if self.metrics is not None:
            self.metrics.tokens.labels(self.lane, "prompt").inc(result.prompt_tokens)
            self.metrics.tokens.labels(self.lane, "completion").inc(result.completion_tokens)
            self.metrics.concurrency_limit.labels(self.lane).set(self.limiter.limit)

    def _on_rate_limited(self, retry_after: float | None) -> None:
        self.limiter.on_rate_limited()
        if retry_after:
            self.rpm.penalize(retry_after)
            self.tpm.penalize(retry_after)
        if self.metrics is not None:
            self.metrics.rate_limited.labels(self.lane).inc()
            self.metrics.concurrency_limit.labels(self.lane).set(self.limiter.limit)

    def _count_call(self, status: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.model_calls.labels(self.lane, status).inc()
            self.metrics.model_latency.labels(self.lane).observe(seconds)

    def _gauges(self, *, leaving: bool = False) -> None:
        if self.metrics is not None:
            # on the way out the slot is still held; it is released right after
            held = self.limiter.in_flight - (1 if leaving else 0)
            self.metrics.in_flight.labels(self.lane).set(max(0, held))
            self.metrics.concurrency_limit.labels(self.lane).set(self.limiter.limit)


def _status(exc: ModelError) -> str:
    """The ``status`` label of a failed call (metrics.py: rate_limited|error|timeout|context)."""
    if isinstance(exc, RateLimited):
        return "rate_limited"
    if isinstance(exc, ContextTooLong):
        return "context"
    if exc.reason == "timeout":
        return "timeout"
    return "error"


def _where(covered: dict[str, list[list[int]]]) -> str:
    """``topic/partition@first-last`` for a log line, shortened when there are many parts."""
    parts = [f"{tp}@{ranges[0][0]}-{ranges[-1][1]}" for tp, ranges in covered.items() if ranges]
    return ", ".join(parts[:3]) + (f" (+{len(parts) - 3} more)" if len(parts) > 3 else "")
