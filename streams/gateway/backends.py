"""Model transports: an OpenAI-compatible HTTP client, the offline rules analyzer, and
a provider in memory whose answers a function gives (``HandlerBackend``).

The gateway talks to a ``ChatBackend`` and nothing else, so retries, splitting and
validation are tested offline against a ``HandlerBackend``, and a real provider, the
simulated provider and the embedded analyzer are interchangeable.

HTTP outcomes map to the errors of ``streams.errors`` at this boundary::

    2xx                          ChatResult
    429                          RateLimited(retry_after)   (out of quota: Permanent)
    408, 409, 425, 5xx, timeout,
    connection errors            TransientModelError        (reason "timeout" for timeouts)
    400/413/422 "context length" ContextTooLong
    other 4xx                    PermanentModelError        (reason "model_rejected")

Gateways in front of the provider change the details, not the mapping: a LiteLLM proxy
passes the provider's headers on as ``llm_provider-*``, replaces error codes with the
status ("429") and answers 429 itself when no upstream deployment is free. The wait a
429 asks for is read from ``Retry-After`` / ``retry-after-ms`` in either form, then from
the message ("try again in 20ms"), then from the ``x-ratelimit-reset-*`` headers; quota
exhaustion is told apart from a rate limit by its code or its message; a refused key or
an unknown model says whose key and which setting (``culprit_hint``).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import aiohttp
from pydantic import SecretStr

from streams.batch.prompt import extract_payload
from streams.errors import (
    ConfigError,
    ContextTooLong,
    MalformedOutput,
    PermanentModelError,
    RateLimited,
    TransientModelError,
)
from streams.gateway.rules.analyzer import analyze
from streams.settings import ModelSettings
from streams.tokens import PieceCounter

logger = logging.getLogger(__name__)

_CONTEXT_HINT = re.compile(
    r"context[ _-]?length|context[ _-]?window|maximum context|too many tokens|"
    r"prompt is too long|reduce the length|max_tokens is too large",
    re.IGNORECASE,
)
_TRANSIENT_STATUS = frozenset({408, 409, 425})
# a proxy is asked to give up this much (at most a tenth of the timeout) before we do
PROXY_TIMEOUT_MARGIN = 2.0
_MAX_DETAIL_CHARS = 300


@dataclass
class ChatResult:
    """One completion: the text and what the provider said about it."""

    content: str
    finish_reason: str  # "stop", "length" (cut at max_tokens), ...
    prompt_tokens: int
    completion_tokens: int
    # the provider's x-ratelimit-{limit,remaining}-{requests,tokens} headers, if it sends them
    ratelimit: dict[str, int] = field(default_factory=dict)
    # seconds until each of those resets ({"requests": 1.0, "tokens": 0.02}), if it says
    ratelimit_reset: dict[str, float] = field(default_factory=dict)


class ChatBackend(Protocol):
    """A chat completion transport; raises only ``streams.errors.ModelError`` subclasses."""

    async def chat(
        self, *, model: str, messages: list[dict[str, Any]], max_tokens: int, timeout: float
    ) -> ChatResult: ...

    async def close(self) -> None: ...


class _Counter(Protocol):
    def count(self, text: str) -> int: ...


# --- OpenAI-compatible HTTP ------------------------------------------------------


class OpenAIBackend:
    """``POST {base_url}/chat/completions`` in JSON mode, one reused HTTP session.

    The API key goes into the Authorization header and nowhere else: not into
    ``repr``, logs or error messages (provider error text is scrubbed of it too).
    """

    __slots__ = ("_api_key", "_retries_warned", "_session", "_session_factory", "base_url",
                 "proxy", "proxy_num_retries")

    proxy: str | None  #: "litellm <version>" once a LiteLLM proxy answered, else None
    proxy_num_retries: int  #: sent as x-litellm-num-retries; -1 sends nothing

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | SecretStr | None,
        session_factory: Callable[[], aiohttp.ClientSession] | None = None,
        proxy_num_retries: int = 0,
    ) -> None:
        if not base_url:
            raise ConfigError(
                "the openai backend needs a base URL; set RETRO_MODEL__BASE_URL "
                "(e.g. http://127.0.0.1:8000/v1)"
            )
        self.base_url = base_url.rstrip("/")
        if isinstance(api_key, SecretStr):
            api_key = api_key.get_secret_value()
        self._api_key = api_key or None
        self._session_factory = session_factory
        self._session: aiohttp.ClientSession | None = None
        self.proxy_num_retries = proxy_num_retries
        self.proxy = None
        self._retries_warned = False

    def __repr__(self) -> str:
        key = "'***'" if self._api_key else "None"
        return f"OpenAIBackend(base_url={self.base_url!r}, api_key={key})"

    def _client(self) -> aiohttp.ClientSession:
        # created on first use, inside the running loop that will use it
        if self._session is None or self._session.closed:
            factory = self._session_factory or aiohttp.ClientSession
            self._session = factory()
        return self._session

    async def close(self) -> None:
        """Close the HTTP session; a later call opens a new one."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def chat(
        self, *, model: str, messages: list[dict[str, Any]], max_tokens: int, timeout: float
    ) -> ChatResult:
        url = f"{self.base_url}/chat/completions"
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "response_format": {"type": "json_object"},
        }
        data = json.dumps(body, ensure_ascii=False, sort_keys=True).encode()
        headers = {"Accept": "application/json", "Content-Type": "application/json",
                   **self._call_headers(data, timeout)}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        logger.debug(
            "model request: POST %s model=%s messages=%d max_tokens=%d",
            url,
            model,
            len(messages),
            max_tokens,
        )
        try:
            async with self._client().post(
                url, data=data, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                status = response.status
                response_headers: Mapping[str, str] = response.headers
                text = await response.text()
        except TimeoutError as exc:
            raise TransientModelError(
                f"no answer from {url} within {timeout:g}s; the lane timeout_seconds may be "
                "too short for this model",
                reason="timeout",
            ) from exc
        except aiohttp.ClientError as exc:
            raise TransientModelError(
                f"cannot reach the model at {url}: {self._scrub(repr(exc))}", reason="connection"
            ) from exc
        logger.debug("model response: %s from %s (%d bytes)", status, url, len(text))
        self._see_proxy(response_headers)
        if 200 <= status < 300:
            result = self._result(text, url)
            result.ratelimit = parse_ratelimit(response_headers)
            result.ratelimit_reset = parse_ratelimit_reset(response_headers)
            return result
        raise self._error(status, response_headers, text, url)

    def _call_headers(self, data: bytes, timeout: float) -> dict[str, str]:
        """Headers that keep a gateway from paying for a call twice.

        ``Idempotency-Key``: a hash of the request body, so the same batch sent again
        (after a timeout) carries the same key and a gateway that honours the header can
        answer it once; other servers ignore it. ``x-litellm-num-retries``: a LiteLLM
        proxy makes no retries of its own (its retries wait out 429s while this worker's
        timeout runs, then the worker resends and both calls are paid); the worker's
        retry loop, buckets and AIMD see every 429 instead. ``x-litellm-timeout``: the
        proxy gives up a little before this worker does, so no call is left running when
        the worker retries. Every other server ignores the x-litellm-* headers.
        """
        digest = hashlib.sha256(data).hexdigest()
        headers = {"Idempotency-Key": f"retro-{digest[:40]}",
                   "x-litellm-timeout": f"{timeout - min(PROXY_TIMEOUT_MARGIN, timeout / 10):g}"}
        if self.proxy_num_retries >= 0:
            headers["x-litellm-num-retries"] = str(self.proxy_num_retries)
        return headers

    def _see_proxy(self, response_headers: Mapping[str, str]) -> None:
        """Notice a LiteLLM proxy in front of the provider; say once what to set."""
        headers = {k.lower(): v for k, v in response_headers.items()}
        if self.proxy is None and any(k.startswith("x-litellm-") for k in headers):
            version = headers.get("x-litellm-version") or "unknown version"
            self.proxy = f"litellm {version}"
            upstream = headers.get("x-litellm-model-api-base")
            where = f"LiteLLM proxy {version} at {self.base_url}" + (
                f" (upstream {upstream})" if upstream else "")
            if self.proxy_num_retries >= 0:
                logger.info(
                    "model calls go through a %s: each call asks it for %d retries of its "
                    "own (x-litellm-num-retries, RETRO_MODEL__PROXY_NUM_RETRIES) and to give "
                    "up within the lane timeout (x-litellm-timeout), so this worker's rate "
                    "limiting sees every 429; if the proxy ignores these headers, set "
                    "num_retries: 0 in its litellm_settings or router_settings", where,
                    self.proxy_num_retries)
            else:
                logger.warning(
                    "model calls go through a %s and RETRO_MODEL__PROXY_NUM_RETRIES=-1 leaves "
                    "its retries on: it waits out 429s itself while the lane timeout runs, "
                    "and a call the worker resends after that timeout is paid twice; set "
                    "num_retries: 0 in its litellm_settings or router_settings (or "
                    "RETRO_MODEL__PROXY_NUM_RETRIES=0), or raise RETRO_FAST__TIMEOUT_SECONDS "
                    "and RETRO_SLOW__TIMEOUT_SECONDS above its retry horizon (num_retries x "
                    "the provider's Retry-After)", where)
        attempted = headers.get("x-litellm-attempted-retries")
        if (attempted and not self._retries_warned and self.proxy_num_retries >= 0
                and _int(attempted) > self.proxy_num_retries):
            self._retries_warned = True
            logger.warning(
                "the LiteLLM proxy at %s retried a call %s times although asked for %d "
                "(x-litellm-num-retries): its retries wait out 429s while the lane timeout "
                "runs; set num_retries: 0 in its litellm_settings or router_settings, or "
                "raise RETRO_FAST__TIMEOUT_SECONDS and RETRO_SLOW__TIMEOUT_SECONDS above "
                "its retry horizon", self.base_url, attempted, self.proxy_num_retries)

    def _result(self, text: str, url: str) -> ChatResult:
        try:
            data = json.loads(text)
            choice = data["choices"][0]
            content = choice["message"].get("content") or ""
            finish_reason = choice.get("finish_reason") or "stop"
            usage = data.get("usage") or {}
        except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise TransientModelError(
                f"{url} answered 2xx without a chat completion body "
                f"(starts: {self._scrub(text[:120])!r})",
                reason="bad_response",
            ) from exc
        if not isinstance(content, str):
            content = json.dumps(content)
        return ChatResult(
            content=content,
            finish_reason=str(finish_reason),
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
        )

    def _error(self, status: int, headers: Mapping[str, str], text: str, url: str) -> Exception:
        code, message = _error_info(text)
        message = self._scrub(message)
        said = f"{url} answered {status}" + (f" ({code})" if code else "") + f": {message}"
        if status == 429:
            if is_quota_exhausted(code, message):
                return PermanentModelError(
                    said + "; the account is out of quota, retrying will not help",
                    reason="quota_exhausted",
                )
            ratelimit = parse_ratelimit(headers)
            limit = exhausted_limit(ratelimit, message)
            return RateLimited(said, retry_after=retry_hint(headers, message, limit),
                               limit=limit, ratelimit=ratelimit)
        if status >= 500 or status in _TRANSIENT_STATUS:
            return TransientModelError(said, reason="timeout" if status == 408 else "server_error")
        if status in (400, 413, 422) and _CONTEXT_HINT.search(f"{code} {message}"):
            return ContextTooLong(said + "; the batch will be split")
        return PermanentModelError(said + culprit_hint(status, code, message),
                                   reason="model_rejected")

    def _scrub(self, text: str) -> str:
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text[:_MAX_DETAIL_CHARS]


# a gateway passing on its upstream's refusal: "litellm.AuthenticationError:
# AuthenticationError: OpenAIException - Incorrect API key provided"
_UPSTREAM_REFUSAL = re.compile(r"\blitellm\.\w+Error\b|\b[A-Z]\w*Exception\s+-\s")
_MODEL_UNKNOWN = re.compile(
    r"invalid model|model_not_found|model[^.;]{0,80}(?:does not exist|not found)|"
    r"unknown model|no such model|not allowed to access model", re.IGNORECASE)


def culprit_hint(status: int, code: str | None, message: str) -> str:
    """What to check for a refused request, naming the setting or the party at fault."""
    text = f"{code or ''} {message}"
    if _MODEL_UNKNOWN.search(text) and status in (400, 401, 403, 404, 422):
        return ("; the provider or proxy does not know this model (or this key may not "
                "use it): check RETRO_MODEL__NAME against its model list (GET /v1/models)")
    if status in (401, 403):
        if _UPSTREAM_REFUSAL.search(message):
            return ("; the gateway's upstream provider refused the gateway's own provider "
                    "key (RETRO_MODEL__API_KEY was accepted): fix the api_key in the gateway's "
                    "model configuration (LiteLLM: model_list litellm_params.api_key)")
        return "; check RETRO_MODEL__API_KEY"
    if status == 404:
        return "; check RETRO_MODEL__BASE_URL and RETRO_MODEL__NAME"
    return ""


def _int(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def _error_info(text: str) -> tuple[str | None, str]:
    """(code, message) of an OpenAI-style error body, or the body's start."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None, text.strip()[:_MAX_DETAIL_CHARS] or "(empty body)"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        return (str(code) if code else None), str(error.get("message") or "")
    if isinstance(error, str):
        return None, error
    if isinstance(data, dict) and "detail" in data:
        return None, str(data["detail"])
    return None, text.strip()[:_MAX_DETAIL_CHARS]


# Gateways (LiteLLM's proxy) pass the provider's own headers on under this prefix, beside
# their own: ``llm_provider-retry-after``, ``llm_provider-x-ratelimit-limit-requests``, ...
PROVIDER_PREFIX = "llm_provider-"
_RATELIMIT_HEADER = re.compile(
    r"(?:llm_provider-)?x-ratelimit-(limit|remaining)-(requests|tokens)")
_LIMIT_IN_MESSAGE = re.compile(r"\b(requests|tokens) per (?:min|day)", re.IGNORECASE)
# a gateway's own 429 when every upstream deployment is cooling down (LiteLLM's router)
_NO_DEPLOYMENTS = re.compile(r"no deployments available", re.IGNORECASE)
GATEWAY_RETRY_SECONDS = 5.0  # LiteLLM's default cooldown, when its 429 names no wait
# "Please try again in 6m0s", "try again in 20ms", "Try again in 5 seconds", "retry in 41.2s"
_WAIT_IN_MESSAGE = re.compile(
    r"\b(?:try|retry)(?: again)?(?: after| in)\s+(\d[\dhms.]*)"
    r"(?:\s*(milliseconds?|ms|seconds?|secs?|minutes?|mins?)\b)?", re.IGNORECASE)
_DURATION = re.compile(
    r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?"
    r"(?:(\d+(?:\.\d+)?)ms)?")
_UNIT_SECONDS = {"ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "s": 1.0,
                 "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0, "min": 60.0,
                 "mins": 60.0, "minute": 60.0, "minutes": 60.0}
# out of quota (money, a plan), not out of rate: by code, or by message when a gateway
# replaced the code with "429" (LiteLLM does); a per-minute window or a stated wait means
# a rate limit worded as a quota (Vertex AI, Gemini)
_QUOTA_CODE = re.compile(r"quota|billing", re.IGNORECASE)
_QUOTA_MESSAGE = re.compile(
    r"insufficient_quota|exceeded your current quota|quota exceeded|exceeded (?:the |your )?"
    r"quota|\bbilling\b", re.IGNORECASE)
_RATE_WINDOW = re.compile(r"per[ _-]?(?:second|minute|min)\b|_per_minute|per_second",
                          re.IGNORECASE)


def parse_ratelimit(headers: Mapping[str, str]) -> dict[str, int]:
    """``{"remaining-tokens": 1200, "limit-requests": 500, ...}`` from OpenAI-style headers
    (also sent by vLLM gateways, Azure OpenAI and others) and from the ``llm_provider-``
    copies a LiteLLM proxy adds beside its own; where both say, the lower counts (the
    tighter limit binds). Unparseable and negative values are skipped."""
    out: dict[str, int] = {}
    for key, value in headers.items():
        match = _RATELIMIT_HEADER.fullmatch(key.lower())
        if match:
            try:
                number = int(float(value))
            except ValueError:
                continue
            if number < 0:
                continue
            name = f"{match[1]}-{match[2]}"
            out[name] = min(out.get(name, number), number)
    return out


def parse_ratelimit_reset(headers: Mapping[str, str]) -> dict[str, float]:
    """``{"requests": 1.0, "tokens": 360.0}``: seconds until each limit resets, from
    ``x-ratelimit-reset-requests`` / ``-tokens`` in OpenAI's duration form ("1s", "6m0s")
    or their ``llm_provider-`` copies (all a LiteLLM proxy forwards); the longer where
    both say."""
    lowered = {k.lower(): v for k, v in headers.items()}
    out: dict[str, float] = {}
    for kind in ("requests", "tokens"):
        found = [d for prefix in ("", PROVIDER_PREFIX)
                 if (v := lowered.get(f"{prefix}x-ratelimit-reset-{kind}")) is not None
                 and (d := parse_duration(v)) is not None]
        if found:
            out[kind] = max(found)
    return out


def exhausted_limit(ratelimit: Mapping[str, int], message: str) -> str:
    """Which quota a 429 is about: requests | tokens | gateway | unknown (headers first,
    then text); ``gateway``: a proxy's own "no deployments available"."""
    if _NO_DEPLOYMENTS.search(message):
        return "gateway"
    for kind in ("requests", "tokens"):
        if ratelimit.get(f"remaining-{kind}") == 0:
            return kind
    match = _LIMIT_IN_MESSAGE.search(message)
    return match[1].lower() if match else "unknown"


def is_quota_exhausted(code: str | None, message: str) -> bool:
    """True when a 429 says the account is out of quota or credit, not out of rate."""
    if code and _QUOTA_CODE.search(code):
        return True
    if not _QUOTA_MESSAGE.search(message):
        return False
    return not (_RATE_WINDOW.search(message) or message_wait(message) is not None)


def parse_duration(text: str) -> float | None:
    """Seconds of ``"20ms"``, ``"1s"``, ``"6m0s"``, ``"1h2m3.5s"`` (OpenAI's reset headers)
    or a bare number of seconds; None when it is neither."""
    text = text.strip().lower()
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        return None
    h, m, sec, ms = (float(g) if g else 0.0 for g in match.groups())
    return h * 3600 + m * 60 + sec + ms / 1000


def message_wait(message: str) -> float | None:
    """The wait an error message states ("Please try again in 1.5s", "Try again in 5
    seconds"), in seconds; None when it states none."""
    match = _WAIT_IN_MESSAGE.search(message)
    if match is None:
        return None
    amount, unit = match[1].rstrip("."), match[2]
    if unit:
        try:
            return max(0.0, float(amount) * _UNIT_SECONDS[unit.lower()])
        except ValueError:
            return None
    return parse_duration(amount)


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date),
    the provider's own or a gateway's ``llm_provider-`` copy; the longer when both say."""
    lowered = {k.lower(): v for k, v in headers.items()}
    waits = [w for prefix in ("", PROVIDER_PREFIX)
             if (w := _retry_after(lowered, prefix, now)) is not None]
    return max(waits) if waits else None


def _retry_after(lowered: Mapping[str, str], prefix: str, now: float | None) -> float | None:
    ms = lowered.get(f"{prefix}retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lowered.get(f"{prefix}retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def parse_reset(headers: Mapping[str, str], limit: str = "unknown") -> float | None:
    """Seconds until the exhausted limit resets: ``x-ratelimit-reset-requests`` /
    ``-tokens`` (or their ``llm_provider-`` copies) in OpenAI's duration form. For an
    unknown limit, the sooner of the two (the call may fit then; a 429 says if not)."""
    resets = parse_ratelimit_reset(headers)
    kinds = (limit,) if limit in ("requests", "tokens") else ("requests", "tokens")
    waits = [resets[kind] for kind in kinds if kind in resets]
    return min(waits) if waits else None


def retry_hint(headers: Mapping[str, str], message: str, limit: str = "unknown", *,
               now: float | None = None) -> float | None:
    """How long a 429 asks to wait, wherever it says so: Retry-After (any form), then a
    wait stated in the message, then the reset header of the exhausted limit; a gateway's
    "no deployments available" without any of them waits ``GATEWAY_RETRY_SECONDS``."""
    for wait in (parse_retry_after(headers, now=now), message_wait(message),
                 parse_reset(headers, limit)):
        if wait is not None:
            return wait
    return GATEWAY_RETRY_SECONDS if limit == "gateway" else None


# --- offline ---------------------------------------------------------------------

_KNOWN_INSTRUCTIONS = 16  # system texts whose counts the rules backend keeps


class RulesBackend:
    """The embedded default: the deterministic rules analyzer, no network.

    It reads the same prompt a model would (``extract_payload``) so the whole
    gateway path (buckets, limiter, validation, cache) runs unchanged offline.
    It answers in one piece and ignores ``max_tokens``: nothing is generated token
    by token, so there is nothing to cut.
    """

    __slots__ = ("_counter", "_instructions", "_pieces")

    def __init__(self, *, counter: _Counter) -> None:
        self._counter = counter
        # token counts of system messages: the same instructions open every prompt, and
        # at several thousand characters they are past the counter's own cache
        self._instructions: dict[str, int] = {}
        # the same counts from the remembered counts of their pieces, where the encoding
        # allows it: prompts and answers repeat the words of their log lines and rules
        self._pieces = _piece_counter(counter)

    def __repr__(self) -> str:
        return "RulesBackend()"

    async def chat(
        self, *, model: str, messages: list[dict[str, Any]], max_tokens: int, timeout: float
    ) -> ChatResult:
        try:
            payload = extract_payload(messages)
        except MalformedOutput as exc:
            raise PermanentModelError(
                f"the rules backend found no batch in the prompt: {exc}", reason="bad_prompt"
            ) from exc
        content = json.dumps(analyze(payload), ensure_ascii=False)
        prompts = [(str(m.get("content") or ""), m.get("role") == "system") for m in messages]
        if self._pieces is not None:  # most pieces are known: little is left to encode
            prompt_tokens, completion_tokens = self._usage(prompts, content)
        else:
            # the usage a provider reports, counted on a thread: tiktoken lets go of the
            # GIL, so a long prompt's count runs beside the worker's stages, as a remote
            # model's would
            prompt_tokens, completion_tokens = await asyncio.to_thread(
                self._usage, prompts, content)
        return ChatResult(
            content=content,
            finish_reason="stop",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    def _usage(self, prompts: list[tuple[str, bool]], content: str) -> tuple[int, int]:
        """(prompt tokens, answer tokens); ``prompts``: each message's text and whether it
        is a system message, whose count is remembered."""
        total = 0
        known = self._instructions
        count = self._counter.count if self._pieces is None else self._pieces.count
        for text, system in prompts:
            tokens = known.get(text) if system else None
            if tokens is None:
                tokens = count(text)
                if system:
                    if len(known) >= _KNOWN_INSTRUCTIONS:
                        known.clear()
                    known[text] = tokens
            total += tokens
        return total, count(content)

    async def close(self) -> None:
        return None


# --- in memory ---------------------------------------------------------------------


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion request, as a backend is given it."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    timeout: float


ChatHandler = Callable[[ChatRequest], "ChatResult | Awaitable[ChatResult]"]


class HandlerBackend:
    """A provider in memory: each request is answered by ``handler(request)``, a plain or
    a coroutine function that returns a ``ChatResult`` or raises what a real backend
    raises (a ``streams.errors.ModelError``), as httpx's ``MockTransport`` answers with
    a function. ``requests`` holds every request it was given. For tests and benches:
    the gateway runs against it unchanged."""

    def __init__(self, handler: ChatHandler) -> None:
        self.handler = handler
        self.requests: list[ChatRequest] = []

    def __repr__(self) -> str:
        return f"HandlerBackend({getattr(self.handler, '__name__', self.handler)!r})"

    async def chat(
        self, *, model: str, messages: list[dict[str, Any]], max_tokens: int, timeout: float
    ) -> ChatResult:
        request = ChatRequest(model, messages, max_tokens, timeout)
        self.requests.append(request)
        answer = self.handler(request)
        return await answer if inspect.isawaitable(answer) else answer

    async def close(self) -> None:
        return None


def _piece_counter(counter: object) -> PieceCounter | None:
    """The piece counts of ``counter`` (a ``TokenCounter`` of an encoding whose counts add
    up by pieces keeps its own, shared here), else None."""
    pieces = getattr(counter, "pieces", None)
    return pieces if isinstance(pieces, PieceCounter) else None


def build_backend(model_settings: ModelSettings, counter: _Counter) -> ChatBackend:
    """The OpenAI client when a base URL (or backend=openai) is configured, else rules."""
    if model_settings.effective_backend == "openai":
        if not model_settings.base_url:
            raise ConfigError(
                "RETRO_MODEL__BACKEND=openai needs RETRO_MODEL__BASE_URL "
                "(e.g. http://127.0.0.1:8000/v1)"
            )
        return OpenAIBackend(base_url=model_settings.base_url, api_key=model_settings.api_key,
                             proxy_num_retries=model_settings.proxy_num_retries)
    return RulesBackend(counter=counter)
