"""Posting to Alertmanager and chat webhooks, with retries and backoff.

A sink posts a JSON payload to its URLs through a ``Transport`` (aiohttp in a worker;
in tests a ``HandlerTransport``, whose answers a function gives). Timeouts, connection
errors, 408, 425, 429 and 5xx answers are retried with exponential backoff and jitter
(a ``Retry-After`` in seconds wins); any other 4xx is a refusal that the same payload
will not cure, so it is counted and given up. Every attempt lands in
``retro_notifications_total{sink, outcome}``. URLs are never logged: a webhook's URL is
its credential.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp
from pydantic import SecretStr

from streams.errors import ConfigError
from streams.metrics import NOTIFY_OUTCOMES, Metrics
from streams.settings import Settings, sink_urls

logger = logging.getLogger(__name__)

Outcome = Literal["sent", "rejected", "failed", "stopped"]
MAX_WAIT = 60.0  # seconds between two attempts, whatever Retry-After asks
_TRANSIENT = frozenset({408, 425, 429})
ALERTS_PATH = "/api/v2/alerts"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)


class Transport(Protocol):
    async def post(self, url: str, payload: Any, *, timeout: float) -> Reply: ...

    async def close(self) -> None: ...


class HttpTransport:
    """aiohttp, one session per transport, opened at first use on the running loop."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def post(self, url: str, payload: Any, *, timeout: float) -> Reply:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        async with self._session.post(url, json=payload,
                                      timeout=aiohttp.ClientTimeout(total=timeout)) as reply:
            await reply.read()
            return Reply(reply.status, dict(reply.headers))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


PostHandler = Callable[[str, Any], "Reply | Awaitable[Reply]"]


class HandlerTransport:
    """Posts answered in memory by ``handler(url, payload)``, a plain or a coroutine
    function that returns a Reply or raises what aiohttp raises (a ``ClientError``,
    ``TimeoutError``), as httpx's ``MockTransport`` answers with a function. ``posts``
    holds every (url, payload) posted. For tests: a sink runs against it unchanged."""

    def __init__(self, handler: PostHandler) -> None:
        self.handler = handler
        self.posts: list[tuple[str, Any]] = []

    async def post(self, url: str, payload: Any, *, timeout: float) -> Reply:
        self.posts.append((url, payload))
        reply = self.handler(url, payload)
        return await reply if inspect.isawaitable(reply) else reply

    async def close(self) -> None:
        return None


class Sink:
    """One notification target: its URLs, how it retries, what it counts."""

    def __init__(self, name: str, urls: list[str], metrics: Metrics, *,
                 transport: Transport | None = None, attempts: int = 5,
                 backoff_seconds: float = 1.0, timeout_seconds: float = 10.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 jitter: Callable[[], float] = random.random) -> None:
        if not urls:
            raise ValueError(f"sink {name} needs at least one URL")
        self.name = name
        self.urls = urls
        self.transport = transport or HttpTransport()
        self.attempts = attempts
        self.backoff = backoff_seconds
        self.timeout = timeout_seconds
        self.sleep = sleep
        self.jitter = jitter
        self.counts = {o: metrics.notifications.labels(name, o) for o in NOTIFY_OUTCOMES}

    async def send(self, payload: Any, *, stop: Callable[[], bool] = lambda: False) -> Outcome:
        """Post ``payload`` to every URL; sent when one of them took it (Alertmanager
        replicas share what they get), else rejected if one refused it for good."""
        outcomes = [await self._post(url, payload, stop) for url in self.urls]
        for outcome in ("sent", "stopped", "rejected"):
            if outcome in outcomes:
                return outcome  # type: ignore[return-value]
        return "failed"

    def dropped(self) -> None:
        self.counts["dropped"].inc()

    async def _post(self, url: str, payload: Any, stop: Callable[[], bool]) -> Outcome:
        why = ""
        for attempt in range(self.attempts):
            if stop():
                return "stopped"
            reply: Reply | None = None
            try:
                reply = await self.transport.post(url, payload, timeout=self.timeout)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                why = type(exc).__name__
            if reply is not None and 200 <= reply.status < 300:
                self.counts["sent"].inc()
                return "sent"
            if reply is not None and not _transient(reply.status):
                self.counts["rejected"].inc()
                logger.warning("notify: %s refused a notification with HTTP %d; not sent "
                               "again", self.name, reply.status)
                return "rejected"
            if reply is not None:
                why = f"HTTP {reply.status}"
            if attempt + 1 == self.attempts:
                break
            self.counts["retried"].inc()
            await self.sleep(self._wait(attempt, reply))
        self.counts["failed"].inc()
        logger.warning("notify: %s did not take a notification after %d attempts (%s); "
                       "it is sent again in the next round", self.name, self.attempts, why)
        return "failed"

    def _wait(self, attempt: int, reply: Reply | None) -> float:
        asked = _retry_after(reply.headers) if reply is not None else None
        if asked is not None:
            return min(asked, MAX_WAIT)
        return min(self.backoff * 2 ** attempt * (0.8 + 0.4 * self.jitter()), MAX_WAIT)

    async def close(self) -> None:
        await self.transport.close()


def _transient(status: int) -> bool:
    return status in _TRANSIENT or status >= 500


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff will do


def alertmanager_endpoint(url: str) -> str:
    """Alertmanager's base URL, or its alerts endpoint given in full."""
    url = url.rstrip("/")
    return url if url.endswith(ALERTS_PATH) else url + ALERTS_PATH


def configured_urls(settings: Settings) -> dict[str, list[str]]:
    """Each configured sink's URLs, read from its file when one is named (a mounted
    Secret). Raises ConfigError for a file that cannot be read or holds no URL."""
    n = settings.notify
    out: dict[str, list[str]] = {}
    for name, value, path in (("alertmanager", n.alertmanager_url, n.alertmanager_url_file),
                              ("webhook", n.webhook_url, n.webhook_url_file)):
        text = _read(name, path) if path is not None else _plain(value)
        if text:
            many = name == "alertmanager"
            try:
                urls = sink_urls(text, many=many)
            except ValueError as exc:
                raise ConfigError(f"RETRO_NOTIFY__{name.upper()}_URL_FILE={path}: {exc}") from None
            out[name] = [alertmanager_endpoint(u) for u in urls] if many else urls
    return out


def _plain(value: SecretStr | None) -> str:
    return value.get_secret_value() if value is not None else ""


def _read(name: str, path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"RETRO_NOTIFY__{name.upper()}_URL_FILE={path}: cannot read it "
                          f"({exc.strerror or exc})") from None
    if not text:
        raise ConfigError(f"RETRO_NOTIFY__{name.upper()}_URL_FILE={path}: the file is empty")
    return text


def build_sinks(settings: Settings, metrics: Metrics, *,
                transport: Transport | None = None) -> list[Sink]:
    n = settings.notify
    return [Sink(name, urls, metrics, transport=transport, attempts=n.max_attempts,
                 backoff_seconds=n.backoff_base_seconds, timeout_seconds=n.timeout_seconds)
            for name, urls in configured_urls(settings).items()]
