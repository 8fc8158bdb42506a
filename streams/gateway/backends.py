"""Model transports: an OpenAI-compatible HTTP client and the offline rules analyzer.

The gateway talks to a ``ChatBackend`` and nothing else, so retries, splitting and
validation are tested offline with a scripted fake, and a real provider, the
simulated provider and the embedded analyzer are interchangeable.

HTTP outcomes map to the errors of ``streams.errors`` at this boundary::

    2xx                          ChatResult
    429                          RateLimited(retry_after)   (insufficient quota: Permanent)
    408, 409, 425, 5xx, timeout,
    connection errors            TransientModelError        (reason "timeout" for timeouts)
    400/413/422 "context length" ContextTooLong
    other 4xx                    PermanentModelError        (reason "model_rejected")
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
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

logger = logging.getLogger(__name__)

_CONTEXT_HINT = re.compile(
    r"context[ _-]?length|context[ _-]?window|maximum context|too many tokens|"
    r"prompt is too long|reduce the length|max_tokens is too large",
    re.IGNORECASE,
)
_TRANSIENT_STATUS = frozenset({408, 409, 425})
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

    __slots__ = ("_api_key", "_session", "_session_factory", "base_url")

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | SecretStr | None,
        session_factory: Callable[[], aiohttp.ClientSession] | None = None,
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
        headers = {"Accept": "application/json"}
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
                url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
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
        if 200 <= status < 300:
            result = self._result(text, url)
            result.ratelimit = parse_ratelimit(response_headers)
            return result
        raise self._error(status, response_headers, text, url)

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
            if code == "insufficient_quota" or "quota" in (code or ""):
                return PermanentModelError(
                    said + "; the account is out of quota, retrying will not help",
                    reason="quota_exhausted",
                )
            ratelimit = parse_ratelimit(headers)
            return RateLimited(said, retry_after=parse_retry_after(headers),
                               limit=exhausted_limit(ratelimit, message), ratelimit=ratelimit)
        if status >= 500 or status in _TRANSIENT_STATUS:
            return TransientModelError(said, reason="timeout" if status == 408 else "server_error")
        if status in (400, 413, 422) and _CONTEXT_HINT.search(f"{code} {message}"):
            return ContextTooLong(said + "; the batch will be split")
        hint = ""
        if status in (401, 403):
            hint = "; check RETRO_MODEL__API_KEY"
        elif status == 404:
            hint = "; check RETRO_MODEL__BASE_URL and RETRO_MODEL__NAME"
        return PermanentModelError(said + hint, reason="model_rejected")

    def _scrub(self, text: str) -> str:
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text[:_MAX_DETAIL_CHARS]


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


_RATELIMIT_HEADER = re.compile(r"x-ratelimit-(limit|remaining)-(requests|tokens)")
_LIMIT_IN_MESSAGE = re.compile(r"\b(requests|tokens) per (?:min|day)", re.IGNORECASE)


def parse_ratelimit(headers: Mapping[str, str]) -> dict[str, int]:
    """``{"remaining-tokens": 1200, "limit-requests": 500, ...}`` from OpenAI-style headers
    (also sent by vLLM gateways, Azure OpenAI and others); unparseable values are skipped."""
    out: dict[str, int] = {}
    for key, value in headers.items():
        match = _RATELIMIT_HEADER.fullmatch(key.lower())
        if match:
            try:
                out[f"{match[1]}-{match[2]}"] = int(float(value))
            except ValueError:
                continue
    return out


def exhausted_limit(ratelimit: Mapping[str, int], message: str) -> str:
    """Which quota a 429 is about: requests | tokens | unknown (headers first, then text)."""
    for kind in ("requests", "tokens"):
        if ratelimit.get(f"remaining-{kind}") == 0:
            return kind
    match = _LIMIT_IN_MESSAGE.search(message)
    return match[1].lower() if match else "unknown"


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
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


# --- offline ---------------------------------------------------------------------


class RulesBackend:
    """The embedded default: the deterministic rules analyzer, no network.

    It reads the same prompt a model would (``extract_payload``) so the whole
    gateway path (buckets, limiter, validation, cache) runs unchanged offline.
    It answers in one piece and ignores ``max_tokens``: nothing is generated token
    by token, so there is nothing to cut.
    """

    __slots__ = ("_counter",)

    def __init__(self, *, counter: _Counter) -> None:
        self._counter = counter

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
        # the usage a provider reports, counted on a thread: tiktoken lets go of the GIL,
        # so a long prompt's count (6% of a worker's CPU while its batches are new) runs
        # beside the worker's stages, as a remote model's would
        prompt_tokens, completion_tokens = await asyncio.to_thread(
            self._usage, [str(m.get("content") or "") for m in messages], content)
        return ChatResult(
            content=content,
            finish_reason="stop",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    def _usage(self, prompts: list[str], content: str) -> tuple[int, int]:
        return sum(self._counter.count(p) for p in prompts), self._counter.count(content)

    async def close(self) -> None:
        return None


def build_backend(model_settings: ModelSettings, counter: _Counter) -> ChatBackend:
    """The OpenAI client when a base URL (or backend=openai) is configured, else rules."""
    if model_settings.effective_backend == "openai":
        if not model_settings.base_url:
            raise ConfigError(
                "RETRO_MODEL__BACKEND=openai needs RETRO_MODEL__BASE_URL "
                "(e.g. http://127.0.0.1:8000/v1)"
            )
        return OpenAIBackend(base_url=model_settings.base_url, api_key=model_settings.api_key)
    return RulesBackend(counter=counter)
