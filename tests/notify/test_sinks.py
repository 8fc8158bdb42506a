"""Posting with retries and backoff, counted per sink and outcome; URLs from settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from streams.errors import ConfigError
from streams.metrics import Metrics
from streams.notify.sinks import HandlerTransport, HttpTransport, Reply, Sink, configured_urls
from streams.settings import Settings
from tests.helpers import FakeClock, playing, serve_post


def replies(*answers: int | Reply | Exception) -> HandlerTransport:
    """A transport answering each post with the next of ``answers`` (a status, a Reply
    or an exception), the last again once they run out."""
    play = playing(*answers)

    def answer(url: str, payload: Any) -> Reply:
        reply = play()
        return reply if isinstance(reply, Reply) else Reply(reply)

    return HandlerTransport(answer)


def sink(transport: HandlerTransport, clock: FakeClock, *,
         urls: tuple[str, ...] = ("http://w/1",),
         attempts: int = 4) -> tuple[Sink, Callable[[str], float]]:
    metrics = Metrics()
    s = Sink("webhook", list(urls), metrics, transport=transport, attempts=attempts,
             backoff_seconds=1.0, sleep=clock.sleep, jitter=lambda: 0.5)

    def count(outcome: str) -> float:
        value = metrics.registry.get_sample_value(
            "retro_notifications_total", {"sink": "webhook", "outcome": outcome})
        return value or 0.0

    return s, count


async def test_server_errors_are_retried_with_exponential_backoff() -> None:
    clock, transport = FakeClock(), replies(503, 502, 200)
    s, count = sink(transport, clock)
    assert await s.send({"text": "hi"}) == "sent"
    assert clock.slept == [1.0, 2.0]  # 1 s, then 2 s (jitter 0.5 keeps the factor at 1)
    assert (count("retried"), count("sent"), count("failed")) == (2, 1, 0)


async def test_a_retry_after_is_waited_and_429_is_retried() -> None:
    clock = FakeClock()
    s, _ = sink(replies(Reply(429, {"Retry-After": "7"}), 200), clock)
    assert await s.send({}) == "sent"
    assert clock.slept == [7.0]


async def test_a_refusal_is_not_retried() -> None:
    clock, transport = FakeClock(), replies(400)
    s, count = sink(transport, clock)
    assert await s.send({}) == "rejected"
    assert len(transport.posts) == 1 and clock.slept == []
    assert count("rejected") == 1


async def test_connection_errors_give_up_after_the_attempts_and_count_it() -> None:
    clock, transport = FakeClock(), replies(aiohttp.ClientConnectionError("refused"))
    s, count = sink(transport, clock, attempts=3)
    assert await s.send({}) == "failed"
    assert len(transport.posts) == 3 and clock.slept == [1.0, 2.0]
    assert (count("retried"), count("failed")) == (2, 1)


async def test_a_stop_between_attempts_ends_the_send() -> None:
    clock = FakeClock()
    s, _ = sink(replies(503), clock)
    calls = iter([False, True])
    assert await s.send({}, stop=lambda: next(calls)) == "stopped"


async def test_one_alertmanager_replica_taking_it_is_enough() -> None:
    clock = FakeClock()
    transport = replies(aiohttp.ClientConnectionError("down"), aiohttp.ClientConnectionError(
        "down"), 200)
    s, _ = sink(transport, clock, urls=("http://a", "http://b"), attempts=2)
    assert await s.send([]) == "sent"
    assert [u for u, _ in transport.posts] == ["http://a", "http://a", "http://b"]


async def test_the_http_transport_posts_json() -> None:
    got: list[Any] = []

    async def receive(request: web.Request) -> web.Response:
        got.append(await request.json())
        return web.Response(status=202, headers={"Retry-After": "1"})

    async with serve_post("/hook", receive) as address:
        transport = HttpTransport()
        try:
            reply = await transport.post(f"{address}/hook", {"text": "é"}, timeout=5)
        finally:
            await transport.close()
    assert reply.status == 202 and reply.headers["Retry-After"] == "1"
    assert got == [{"text": "é"}]


def test_urls_come_from_settings_or_from_files(tmp_path: Path) -> None:
    assert configured_urls(Settings()) == {}
    hook = tmp_path / "hook"
    hook.write_text("https://hooks.example.com/services/T0/B0/s3cr3t\n")
    settings = Settings(notify={"alertmanager_url": "http://am-0:9093,http://am-1:9093/",
                                "webhook_url_file": str(hook)})
    assert settings.notify.configured
    assert configured_urls(settings) == {
        "alertmanager": ["http://am-0:9093/api/v2/alerts", "http://am-1:9093/api/v2/alerts"],
        "webhook": ["https://hooks.example.com/services/T0/B0/s3cr3t"]}
    assert "s3cr3t" not in repr(settings)


@pytest.mark.parametrize("content, said", [(None, "cannot read it"), ("", "the file is empty"),
                                           ("hooks.example.com/x", "use a URL such as")])
def test_a_bad_url_file_is_refused_naming_the_setting(tmp_path: Path, content: str | None,
                                                     said: str) -> None:
    path = tmp_path / "hook"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as refused:
        configured_urls(Settings(notify={"webhook_url_file": str(path)}))
    assert "RETRO_NOTIFY__WEBHOOK_URL_FILE" in str(refused.value) and said in str(refused.value)


def test_a_bad_url_setting_is_refused_without_showing_it(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from streams.settings import load_settings

    monkeypatch.setenv("RETRO_NOTIFY__WEBHOOK_URL", "hooks.example.com/services/s3cr3t")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert "RETRO_NOTIFY__WEBHOOK_URL=(hidden)" in str(refused.value)
    assert "s3cr3t" not in str(refused.value)
