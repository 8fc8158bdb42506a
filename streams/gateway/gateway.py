"""The model gateway: one batch in, fragments and reviews out, never an exception.

For each batch::

    cache hit (answer re-validated against this batch)  -> fragments
    otherwise one request (caller.py: AIMD slot, RPM/TPM buckets, retries, budget)
        context too long, answer cut, refs missing  -> split in half, analyze both
        not JSON                                    -> one repair request, then review
        breaks the contract / model unavailable     -> review with the reason

Every record of the batch ends in exactly one fragment or one review: the halves of
a split partition the batch, and each leaf either validates (fragments cover its
records exactly once) or becomes a review covering all of its records.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from streams.batch.answers import parse_answer, review_for, validate_answer
from streams.batch.prompt import (
    Detail,
    build_messages,
    cache_key,
    max_output_tokens,
    repair_messages,
)
from streams.batch.window import Batch
from streams.errors import (
    ConfigError,
    ContextTooLong,
    MalformedOutput,
    ModelError,
    Truncated,
    ValidationFailed,
)
from streams.gateway.aimd import AIMDLimiter
from streams.gateway.backends import ChatBackend, ChatResult
from streams.gateway.buckets import TokenBucket
from streams.gateway.cache import AnswerCache
from streams.gateway.caller import CallFailure, ModelCaller
from streams.gateway.retry import RetryBudget
from streams.gateway.rollup_prompt import (
    estimate_tokens,
    parse_rollup,
    rollup_cache_key,
    rollup_repair_messages,
)
from streams.records import BatchOutcome, Fragment, Lane

logger = logging.getLogger(__name__)


class Gateway:
    """Sends batches of one lane to a model, within the provider's limits.

    The limiter, buckets, retry budget, cache and calibration may be shared with
    the other lane's gateway: they describe one provider account.
    """

    def __init__(
        self,
        caller: ModelCaller,
        *,
        prompt_version: str,
        detail: Detail,
        context_window: int,
        output_reserve: float,
        cache: AnswerCache | None = None,
    ) -> None:
        """``caller`` is one lane's way to the provider (limits, retries, telemetry;
        built by ``streams.gateway.factory``); the rest is how this lane asks."""
        if context_window <= 0:
            raise ValueError(f"context_window must be positive, got {context_window}")
        if output_reserve < 0:
            raise ValueError(f"output_reserve must not be negative, got {output_reserve}")
        self.caller = caller
        self.telemetry = caller.telemetry
        self.lane: Lane = caller.telemetry.lane
        self.model = caller.model
        self.calibration = caller.calibration
        self.prompt_version = prompt_version
        self.detail: Detail = detail
        self.context_window = context_window
        self.output_reserve = output_reserve
        self.cache = cache

    def __repr__(self) -> str:
        return f"Gateway(lane={self.lane!r}, model={self.model!r}, backend={self.backend!r})"

    @property
    def backend(self) -> ChatBackend:
        return self.caller.backend

    @property
    def limiter(self) -> AIMDLimiter:
        return self.caller.limiter

    @property
    def rpm(self) -> TokenBucket:
        return self.caller.rpm

    @property
    def tpm(self) -> TokenBucket:
        return self.caller.tpm

    @property
    def retry_budget(self) -> RetryBudget:
        return self.caller.retry_budget

    async def analyze(self, batch: Batch) -> BatchOutcome:
        """Fragments and reviews for ``batch``; every record ends in exactly one of them."""
        outcome = BatchOutcome()
        await self._analyze(batch, outcome)
        self.telemetry.fragments(len(outcome.fragments))
        return outcome

    async def summarize(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 400,
        prompt_tokens: int | None = None,
    ) -> tuple[str | None, str | None]:
        """(summary, None) or (None, reason) for a roll-up prompt
        (``streams.report.analysis.rollup``).

        The same path as a batch: cache, then the caller (AIMD slot, RPM/TPM buckets,
        retries with backoff and Retry-After, retry budget), one repair request for a
        malformed answer. Never raises for model errors. ``prompt_tokens`` defaults to
        a generous estimate from the characters (~3 per token), for the TPM bucket.
        """
        key: str | None = None
        if self.cache is not None:
            key = rollup_cache_key(messages, model=self.model, prompt_version=self.prompt_version)
            cached = await self._summary_from_cache(key)
            if cached is not None:
                return cached, None
        estimated = prompt_tokens if prompt_tokens is not None else estimate_tokens(messages)
        repaired = False
        while True:
            result, _calls = await self.caller.request(
                messages, prompt_tokens=estimated, max_tokens=max_tokens, observe=None
            )
            if isinstance(result, CallFailure):
                logger.warning(
                    "%s lane: no roll-up summary, %s: %s", self.lane, result.reason, result.detail
                )
                return None, result.reason
            if result.finish_reason == "length":
                logger.warning("%s lane: roll-up summary cut at %d tokens", self.lane, max_tokens)
                return None, "truncated"
            try:
                summary = parse_rollup(result.content)
            except MalformedOutput as exc:
                if repaired:
                    logger.warning(
                        "%s lane: roll-up answer malformed after one repair: %s", self.lane, exc
                    )
                    return None, "malformed_output"
                repaired = True
                logger.info("%s lane: malformed roll-up answer, one repair: %s", self.lane, exc)
                self.telemetry.retry("malformed_output")
                messages = rollup_repair_messages(messages, result.content, str(exc))
                estimated += result.completion_tokens
                continue
            if self.cache is not None and key is not None:
                await self.cache.set(key, result.content)
            return summary, None

    async def _summary_from_cache(self, key: str) -> str | None:
        assert self.cache is not None
        text = await self.cache.get(key)
        summary: str | None = None
        if text is not None:
            try:
                summary = parse_rollup(text)
            except MalformedOutput as exc:
                logger.info("%s lane: cached roll-up answer is unusable: %s", self.lane, exc)
        self.telemetry.cache(hit=summary is not None)
        return summary

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
                estimated, context_window=self.context_window, output_reserve=self.output_reserve,
                groups=len(batch.groups),
            )
        except ContextTooLong as exc:
            await self._fail(batch, out, CallFailure("context_length", str(exc), split=True))
            return
        if estimated + max_tokens > self.tpm.capacity:
            raise ConfigError(
                f"a {self.lane} batch needs ~{estimated + max_tokens} tokens (prompt plus "
                f"reserved answer) but the tokens-per-minute bucket holds {self.tpm.capacity:g}; "
                "raise RETRO_MODEL__TPM or lower the lane's input_budget"
            )

        messages = build_messages(batch, detail=self.detail, prompt_version=self.prompt_version)
        prompt_tokens, observe = estimated, batch.estimated_input_tokens
        repaired = False
        while True:
            result, calls = await self.caller.request(
                messages, prompt_tokens=prompt_tokens, max_tokens=max_tokens, observe=observe
            )
            out.calls += calls
            if isinstance(result, CallFailure):
                await self._fail(batch, out, result)
                return
            verdict = self._judge(batch, result)
            if isinstance(verdict, list):
                out.fragments.extend(verdict)
                if self.cache is not None and key is not None:
                    await self.cache.set(key, result.content)
                return
            if isinstance(verdict, MalformedOutput):
                if not repaired:
                    repaired = True
                    logger.info("%s lane: malformed answer, one repair: %s", self.lane, verdict)
                    self.telemetry.retry("malformed_output")
                    messages = repair_messages(messages, result.content, str(verdict))
                    prompt_tokens = estimated + result.completion_tokens
                    observe = None  # this prompt is not what the batch estimate measured
                    continue
                verdict = CallFailure(
                    "malformed_output",
                    f"no usable JSON after one repair request: {verdict}",
                    output=result.content,
                )
            await self._fail(batch, out, verdict)
            return

    def _judge(
        self, batch: Batch, result: ChatResult
    ) -> list[Fragment] | CallFailure | MalformedOutput:
        """Fragments from an answer, or what to do about it."""
        if result.finish_reason == "length":
            detail = "the answer was cut at max_tokens"
            return CallFailure("truncated", detail, split=True, output=result.content)
        try:
            answer = parse_answer(result.content)
            return validate_answer(
                batch, answer, model=self.model, prompt_version=self.prompt_version
            )
        except MalformedOutput as exc:
            return exc
        except Truncated as exc:
            return CallFailure(
                "truncated", str(exc), split=True, output=result.content, split_reason=exc.reason
            )
        except ValidationFailed as exc:
            return CallFailure(exc.reason, str(exc), output=result.content)

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
                logger.info("%s lane: cached answer does not fit this batch: %s", self.lane, exc)
        self.telemetry.cache(hit=fragments is not None)
        if fragments is None:
            return False
        out.fragments.extend(fragments)
        out.cache_hits += 1
        return True

    async def _fail(self, batch: Batch, out: BatchOutcome, failure: CallFailure) -> None:
        """Split when smaller pieces may succeed and the batch can be halved, else review."""
        if not failure.split:
            self._review(batch, out, failure)
            return
        if batch.record_count < 2:
            detail = f"{failure.detail}; a single record cannot be split further"
            self._review(batch, out, failure, detail=detail)
            return
        try:
            left, right = batch.split()
        except ValueError as exc:
            self._review(batch, out, failure, detail=f"{failure.detail}; {exc}")
            return
        why = failure.split_reason or failure.reason
        logger.info(
            "%s lane: splitting %d records (%s): %s",
            self.lane,
            batch.record_count,
            why,
            failure.detail,
        )
        self.telemetry.split(why)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._analyze(left, out))
            group.create_task(self._analyze(right, out))

    def _review(
        self, batch: Batch, out: BatchOutcome, failure: CallFailure, *, detail: str | None = None
    ) -> None:
        review = review_for(
            batch,
            reason=failure.reason,
            detail=detail or failure.detail,
            model=self.model,
            prompt_version=self.prompt_version,
            output=failure.output,
        )
        out.reviews.append(review)
        logger.warning(
            "%s lane: %d records (%s) to review, %s: %s",
            self.lane,
            batch.record_count,
            _where(review.covered),
            review.reason,
            review.detail,
        )
        self.telemetry.review(review.reason)


def _where(covered: dict[str, list[list[int]]]) -> str:
    """``topic/partition@first-last`` for a log line, shortened when there are many parts."""
    parts = [f"{tp}@{ranges[0][0]}-{ranges[-1][1]}" for tp, ranges in covered.items() if ranges]
    return ", ".join(parts[:3]) + (f" (+{len(parts) - 3} more)" if len(parts) > 3 else "")
