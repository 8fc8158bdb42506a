"""Backends: the OpenAI client against a tiny local server, the rules backend offline."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from streams.batch.prompt import embed_payload
from streams.errors import (
    ConfigError,
    ContextTooLong,
    PermanentModelError,
    RateLimited,
    TransientModelError,
)
from streams.gateway.backends import (
    ChatRequest,
    ChatResult,
    HandlerBackend,
    OpenAIBackend,
    RulesBackend,
    build_backend,
    parse_retry_after,
)
from streams.settings import ModelSettings

from helpers import serve_chat

KEY = "sk-test-0123456789abcdef-SECRET"
ANSWER = {
    "fragments": [
        {
            "refs": ["g1"],
            "service": "hdfs",
            "event": "connection refused",
            "cause": "datanode down",
            "suggestion": "restart it",
            "severity": "high",
        }
    ]
}
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {
        "role": "user",
        "content": embed_payload(
            "Summarise.",
            {
                "lane": "fast",
                "detail": "brief",
                "groups": [
                    {
                        "ref": "g1",
                        "service": "hdfs",
                        "level": "ERROR",
                        "template": "Connection to <*> refused",
                        "count": 3,
                        "first_seen": None,
                        "last_seen": None,
                        "examples": ["Connection to 10.0.0.1 refused"],
                        "truncated": False,
                    }
                ],
            },
        ),
    },
]


def completion(content: str, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 321, "completion_tokens": 45, "total_tokens": 366},
    }


def error_body(message: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


class Provider:
    """Answers according to the requested model name; remembers every request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        model = body["model"]
        if model == "ok":
            return web.json_response(completion(json.dumps(ANSWER)))
        if model == "cut":
            return web.json_response(completion('{"fragments": [', finish="length"))
        if model == "429":
            return web.json_response(
                error_body("Rate limit reached", "rate_limit_exceeded"),
                status=429,
                headers={"Retry-After": "7"},
            )
        if model == "429ms":
            return web.json_response(
                error_body("slow down"), status=429, headers={"retry-after-ms": "1500"}
            )
        if model == "quota":
            return web.json_response(
                error_body("You exceeded your current quota", "insufficient_quota"), status=429
            )
        if model == "500":
            return web.Response(status=500, text="<html>Internal Server Error</html>")
        if model == "503":
            return web.json_response(error_body("overloaded"), status=503)
        if model == "context":
            return web.json_response(
                error_body(
                    "This model's maximum context length is 8192 tokens. However, your "
                    "messages resulted in 9000 tokens.",
                    "context_length_exceeded",
                ),
                status=400,
            )
        if model == "401":
            return web.json_response(
                error_body(f"Incorrect API key provided: {KEY}.", "invalid_api_key"), status=401
            )
        if model == "400":
            return web.json_response(error_body("temperature must be a number"), status=400)
        if model == "garbage":
            return web.Response(status=200, text="not json at all")
        if model == "unknown-model":
            return web.json_response(
                error_body("The model `unknown-model` does not exist", "model_not_found"),
                status=404)
        return web.Response(status=404, text="404: Not Found")


@pytest.fixture
async def provider() -> AsyncIterator[tuple[Provider, str]]:
    state = Provider()
    async with serve_chat(state.handle) as url:
        yield state, url


@pytest.fixture
async def backend(provider: tuple[Provider, str]) -> AsyncIterator[OpenAIBackend]:
    client = OpenAIBackend(base_url=provider[1] + "/", api_key=KEY)
    try:
        yield client
    finally:
        await client.close()


async def call(client: OpenAIBackend, model: str) -> Any:
    return await client.chat(model=model, messages=MESSAGES, max_tokens=300, timeout=5)


async def test_a_200_is_parsed_and_the_request_is_json_mode(
    provider: tuple[Provider, str], backend: OpenAIBackend
) -> None:
    result = await call(backend, "ok")
    assert json.loads(result.content) == ANSWER
    assert (result.finish_reason, result.prompt_tokens, result.completion_tokens) == (
        "stop",
        321,
        45,
    )
    sent = provider[0].requests[-1]
    assert sent["headers"]["Authorization"] == f"Bearer {KEY}"
    assert sent["body"]["response_format"] == {"type": "json_object"}
    assert sent["body"]["temperature"] == 0
    assert sent["body"]["max_tokens"] == 300
    assert sent["body"]["messages"] == MESSAGES


async def test_the_session_is_reused_and_reopened_after_close(backend: OpenAIBackend) -> None:
    await call(backend, "ok")
    first = backend._session
    await call(backend, "ok")
    assert backend._session is first
    await backend.close()
    assert first is not None and first.closed
    await call(backend, "ok")  # a new session after close
    assert backend._session is not first


async def test_finish_reason_length_is_reported(backend: OpenAIBackend) -> None:
    result = await call(backend, "cut")
    assert result.finish_reason == "length"


async def test_429_carries_retry_after(backend: OpenAIBackend) -> None:
    with pytest.raises(RateLimited) as caught:
        await call(backend, "429")
    assert caught.value.retry_after == 7.0
    assert caught.value.reason == "rate_limited"
    with pytest.raises(RateLimited) as caught:
        await call(backend, "429ms")
    assert caught.value.retry_after == 1.5


async def test_429_for_an_exhausted_quota_is_permanent(backend: OpenAIBackend) -> None:
    with pytest.raises(PermanentModelError) as caught:
        await call(backend, "quota")
    assert not isinstance(caught.value, RateLimited)
    assert caught.value.reason == "quota_exhausted"


@pytest.mark.parametrize("model", ["500", "503", "garbage"])
async def test_server_errors_are_transient(backend: OpenAIBackend, model: str) -> None:
    with pytest.raises(TransientModelError) as caught:
        await call(backend, model)
    assert not isinstance(caught.value, RateLimited)


async def test_400_context_length_is_context_too_long(backend: OpenAIBackend) -> None:
    with pytest.raises(ContextTooLong, match="maximum context length"):
        await call(backend, "context")


async def test_other_4xx_are_permanent_with_a_hint(backend: OpenAIBackend) -> None:
    with pytest.raises(PermanentModelError) as caught:
        await call(backend, "400")
    assert not isinstance(caught.value, ContextTooLong)
    assert caught.value.reason == "model_rejected"
    with pytest.raises(PermanentModelError, match="RETRO_MODEL__BASE_URL"):
        await call(backend, "missing")
    with pytest.raises(PermanentModelError, match="RETRO_MODEL__NAME against its model list"):
        await call(backend, "unknown-model")
    with pytest.raises(PermanentModelError, match="RETRO_MODEL__API_KEY"):
        await call(backend, "401")


async def test_connection_refused_is_transient_and_mapped_from_aiohttp() -> None:
    # a port nobody listens on: bind, learn the port, close
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = OpenAIBackend(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    try:
        with pytest.raises(TransientModelError) as caught:
            await call(client, "ok")
    finally:
        await client.close()
    assert caught.value.reason == "connection"
    assert isinstance(caught.value.__cause__, aiohttp.ClientError)


async def test_a_slow_provider_times_out_as_transient() -> None:
    import asyncio

    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response(completion("{}"))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    client = OpenAIBackend(base_url=f"http://{host}:{port}/v1", api_key=None)
    try:
        with pytest.raises(TransientModelError) as caught:
            await client.chat(model="m", messages=MESSAGES, max_tokens=10, timeout=0.2)
    finally:
        release.set()
        await client.close()
        await runner.cleanup()
    assert caught.value.reason == "timeout"
    assert isinstance(caught.value.__cause__, TimeoutError)


async def test_the_key_never_shows_in_repr_logs_or_errors(
    backend: OpenAIBackend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert KEY not in repr(backend)
    assert KEY not in str(backend)
    errors = []
    for model in ["ok", "429", "500", "context", "400", "401", "garbage"]:
        try:
            await call(backend, model)
        except Exception as exc:
            errors.append(exc)
    assert len(errors) == 6
    assert caplog.records, "the backend should log its requests at debug level"
    assert KEY not in caplog.text
    for exc in errors:
        assert KEY not in str(exc)
        assert KEY not in repr(exc)
    # the provider echoed the key in its 401 body; the error keeps the message, scrubbed
    assert any("Incorrect API key provided: ***" in str(exc) for exc in errors)


def test_a_secretstr_key_is_unwrapped_and_still_hidden() -> None:
    settings = ModelSettings(base_url="http://127.0.0.1:9/v1", api_key=KEY)
    client = build_backend(settings, counter=None)  # type: ignore[arg-type]
    assert isinstance(client, OpenAIBackend)
    assert KEY not in repr(client)
    assert client._api_key == KEY


def test_build_backend_picks_rules_without_a_base_url() -> None:
    assert isinstance(build_backend(ModelSettings(), counter=_Chars()), RulesBackend)
    with pytest.raises(ConfigError, match="RETRO_MODEL__BASE_URL"):
        build_backend(ModelSettings(backend="openai"), counter=_Chars())


def test_retry_after_forms() -> None:
    assert parse_retry_after({"Retry-After": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "2.5"}) == 2.5
    assert parse_retry_after({"retry-after-ms": "250", "Retry-After": "9"}) == 0.25
    assert parse_retry_after({}) is None
    assert parse_retry_after({"Retry-After": "soon"}) is None
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"Retry-After": later}, now=now.timestamp()) == pytest.approx(30)
    past = format_datetime(now - timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"Retry-After": past}, now=now.timestamp()) == 0.0


class _Chars:
    """A stand-in counter: one token per four characters."""

    def count(self, text: str) -> int:
        return (len(text) + 3) // 4


async def test_rules_backend_answers_the_payload_offline() -> None:
    backend = RulesBackend(counter=_Chars())
    result = await backend.chat(model="retro-rules-v1", messages=MESSAGES, max_tokens=50, timeout=1)
    answer = json.loads(result.content)
    refs = [ref for item in answer["fragments"] for ref in item["refs"]]
    assert refs == ["g1"]
    assert result.finish_reason == "stop"
    expected_prompt = sum(_Chars().count(m["content"]) for m in MESSAGES)
    assert result.prompt_tokens == expected_prompt
    assert result.completion_tokens == _Chars().count(result.content)


async def test_rules_backend_counts_usage_by_pieces_as_the_encoder_counts_it() -> None:
    from streams.batch.prompt import build_messages
    from streams.batch.window import build_batch
    from streams.records import NormalizedRecord, RawCoord
    from streams.tokens import TokenCounter

    counter = TokenCounter()
    messages = ["Connection to 10.0.0.7:5432 refused", 'bad "quoted" value\tand\nlines',
                "  two  spaces , and  trailing ", "user=alice login failed from 10.1.2.3"]
    records = [NormalizedRecord(
        id=f"raw/0/{i}", raw=RawCoord(topic="raw", partition=0, offset=i), source="app.log",
        format="text", timestamp=f"2026-01-02T03:04:{i:02d}.000Z", level="ERROR",
        service="api", message=m, template_id=f"t{i % 2}", template=m, tokens=counter.count(m),
        cost=0.0, lane="fast") for i, m in enumerate(messages * 3)]
    batch = build_batch(records, lane="fast", counter=counter, max_example_tokens=None,
                        trigger="count")
    prompt = build_messages(batch, detail="detailed", prompt_version="v1")
    backend = RulesBackend(counter=counter)
    for _ in range(2):  # the second time from remembered pieces
        result = await backend.chat(model="m", messages=prompt, max_tokens=500, timeout=1)
        # count_many encodes each text whole: the reference the pieces must equal
        assert result.prompt_tokens == sum(counter.count_many(m["content"] for m in prompt))
        assert result.completion_tokens == counter.count_many([result.content])[0]


async def test_rules_backend_without_a_payload_is_a_permanent_error() -> None:
    backend = RulesBackend(counter=_Chars())
    with pytest.raises(PermanentModelError) as caught:
        await backend.chat(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5, timeout=1
        )
    assert caught.value.reason == "bad_prompt"


# --- in memory ----------------------------------------------------------------------------


async def test_a_handler_backend_answers_with_its_function_and_keeps_every_request() -> None:
    def plain(request: ChatRequest) -> ChatResult:
        return ChatResult(f"{request.model} {request.max_tokens}", "stop", 1, 1)

    async def refusing(request: ChatRequest) -> ChatResult:
        raise RateLimited("429", retry_after=2.0)

    hi = [{"role": "user", "content": "hi"}]
    backend = HandlerBackend(plain)
    result = await backend.chat(model="m", messages=hi, max_tokens=7, timeout=3.0)
    assert result.content == "m 7"
    assert backend.requests == [ChatRequest("m", hi, 7, 3.0)]
    with pytest.raises(RateLimited):
        await HandlerBackend(refusing).chat(model="m", messages=hi, max_tokens=1, timeout=1)
