"""The fake provider as an aiohttp app: ``make_app``, ``serve`` (CLI), ``FakeLLMServer`` (tests)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from streams.clock import Clock, Sleep
from streams.dev.fakellm.config import FakeLLMConfig, FakeLLMStats
from streams.dev.fakellm.provider import FakeProvider
from streams.tokens import TokenCounter

logger = logging.getLogger(__name__)

PROVIDER_KEY = web.AppKey("fake_llm_provider", FakeProvider)


def make_app(
    config: FakeLLMConfig,
    *,
    clock: Clock | None = None,
    sleep: Sleep | None = None,
    counter: TokenCounter | None = None,
) -> web.Application:
    """The aiohttp app; its provider (state, stats, records) is ``app[PROVIDER_KEY]``."""
    provider = FakeProvider(config, clock=clock, sleep=sleep, counter=counter)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[PROVIDER_KEY] = provider
    app.router.add_post("/v1/chat/completions", provider.chat)
    app.router.add_get("/v1/models", provider.models)
    app.router.add_get("/v1/models/{model}", provider.models)
    app.router.add_get("/_fake/stats", provider.get_stats)
    app.router.add_get("/_fake/requests", provider.get_requests)
    app.router.add_post("/_fake/config", provider.post_config)
    app.router.add_post("/_fake/reset", provider.post_reset)

    async def on_shutdown(_: web.Application) -> None:
        provider.close()

    app.on_shutdown.append(on_shutdown)
    return app


async def serve(config: FakeLLMConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve until cancelled (Ctrl-C in ``retro fake-llm``)."""
    runner = web.AppRunner(make_app(config), handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        logger.info("fake LLM %s listening on http://%s:%s/v1", config.model, host, port)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


class FakeLLMServer:
    """``async with FakeLLMServer(config) as server:`` on 127.0.0.1 and a free port.

    ``server.config`` is the live config: change its fields (or assign a new one)
    while the server runs, e.g. to switch faults on and off.
    """

    def __init__(
        self,
        config: FakeLLMConfig | None = None,
        *,
        clock: Clock | None = None,
        sleep: Sleep | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._config = config or FakeLLMConfig()
        self._clock, self._sleep = clock, sleep
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None
        self._provider: FakeProvider | None = None

    def __repr__(self) -> str:
        return f"FakeLLMServer(base_url={self.base_url!r}, model={self._config.model!r})"

    async def __aenter__(self) -> FakeLLMServer:
        app = make_app(self._config, clock=self._clock, sleep=self._sleep)
        self._provider = app[PROVIDER_KEY]
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=5.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._provider is not None:
            self._provider.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def config(self) -> FakeLLMConfig:
        return self._config

    @config.setter
    def config(self, config: FakeLLMConfig) -> None:
        self._config = config
        if self._provider is not None:
            self._provider.config = config

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def provider(self) -> FakeProvider:
        if self._provider is None:
            raise RuntimeError("the fake LLM server is not running; use `async with`")
        return self._provider

    @property
    def requests(self) -> list[dict[str, Any]]:
        """What the server received, oldest first (bounded by ``config.max_recorded``)."""
        return list(self.provider.records)

    @property
    def stats(self) -> FakeLLMStats:
        return self.provider.stats
