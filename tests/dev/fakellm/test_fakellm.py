"""The simulated OpenAI-compatible provider, exercised over real HTTP with aiohttp."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from streams.batch.prompt import embed_payload, stated_cause
from streams.dev.fakellm import FakeLLMConfig, FakeLLMServer, SlidingWindow
from streams.dev.fakellm.judge import answer as fake_answer

from helpers import FakeClock


class FakeSleep:
    """Records the latencies the server wanted to spend, without spending them."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        await asyncio.sleep(0)


def make_payload(n_groups: int = 3, example_words: int = 5) -> dict[str, Any]:
    templates = [
        ("ERROR", "Connection refused to <*>"),
        ("WARN", "Order not found <*>"),
        ("INFO", "Request served in <*> ms"),
        ("ERROR", "Error for partition <*>: NotLeaderForPartitionException"),
    ]
    groups = []
    for i in range(n_groups):
        level, template = templates[i % len(templates)]
        groups.append(
            {
                "ref": f"g{i + 1}",
                "service": "svc",
                "level": level,
                "template": template,
                "count": i + 1,
                "examples": [template.replace("<*>", " ".join(["word"] * example_words))],
            }
        )
    return {"lane": "fast", "detail": "brief", "groups": groups}


def chat_body(payload: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    content = embed_payload("Analyse the groups; answer JSON.", payload or make_payload())
    body = {
        "model": "fake-gpt",
        "messages": [
            {"role": "system", "content": "You write post-mortems."},
            {"role": "user", "content": content},
        ],
        "max_tokens": 1000,
        "temperature": 0,
        "response_format": {"type": "json_object"},
    }
    body.update(extra)
    return body


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1000.0)


@pytest.fixture
def sleep() -> FakeSleep:
    return FakeSleep()


@pytest.fixture
async def server(clock: FakeClock, sleep: FakeSleep) -> AsyncIterator[FakeLLMServer]:
    async with FakeLLMServer(FakeLLMConfig(seed=7), clock=clock, sleep=sleep) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(
    http: aiohttp.ClientSession, server: FakeLLMServer, body: Any
) -> tuple[int, CIMultiDict[str], Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(f"{server.base_url}/chat/completions", data=data) as response:
        return response.status, response.headers.copy(), await response.json()


def content_of(answer: dict[str, Any]) -> str:
    return answer["choices"][0]["message"]["content"]


# --- normal answers ---------------------------------------------------------------------


async def test_answer_is_a_chat_completion_with_the_real_analysis(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    payload = make_payload(4)
    status, headers, answer = await post(http, server, chat_body(payload))

    assert status == 200
    assert answer["object"] == "chat.completion"
    assert answer["id"].startswith("chatcmpl-")
    assert answer["model"] == "fake-gpt"
    assert isinstance(answer["created"], int)
    choice = answer["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    parsed = json.loads(choice["message"]["content"])
    assert parsed == fake_answer(payload)  # the rules analysis, in the shape the prompt asks
    assert all(stated_cause(fragment["cause"]) for fragment in parsed["fragments"])
    refs = sorted(r for fragment in parsed["fragments"] for r in fragment["refs"])
    assert refs == ["g1", "g2", "g3", "g4"]
    usage = answer["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert headers["x-request-id"]
    assert server.stats.ok == 1 and server.stats.requests == 1


async def test_plain_chat_without_payload_gets_an_empty_analysis(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    body = {"model": "whatever", "messages": [{"role": "user", "content": "hello"}]}
    status, _, answer = await post(http, server, body)
    assert status == 200
    assert json.loads(content_of(answer)) == {"fragments": []}
    assert answer["model"] == "whatever"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "parse the JSON"),
        ({"model": "fake-gpt"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "role"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "Streaming"),
    ],
)
async def test_bad_requests_get_400(
    server: FakeLLMServer, http: aiohttp.ClientSession, body: Any, needle: str
) -> None:
    status, _, answer = await post(http, server, body)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert needle in answer["error"]["message"]
    assert server.stats.bad_requests == 1


async def test_models_endpoint_lists_the_model(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{server.base_url}/models") as response:
        listing = await response.json()
    assert [m["id"] for m in listing["data"]] == ["fake-gpt"]
    async with http.get(f"{server.base_url}/models/fake-gpt") as response:
        assert response.status == 200
    async with http.get(f"{server.base_url}/models/other") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "model_not_found"


async def test_api_key_is_enforced_when_configured(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    server.config.api_key = "sk-test-123"
    assert (await post(http, server, chat_body()))[0] == 401
    url = f"{server.base_url}/chat/completions"
    headers = {"Authorization": "Bearer sk-test-123"}
    async with http.post(url, json=chat_body(), headers=headers) as response:
        assert response.status == 200


# --- limits ---------------------------------------------------------------------------------


async def test_rpm_limit_answers_429_with_retry_after(
    server: FakeLLMServer, http: aiohttp.ClientSession, clock: FakeClock
) -> None:
    server.config.rpm = 2
    first = await post(http, server, chat_body())
    clock.advance(20)
    second = await post(http, server, chat_body())
    clock.advance(10)
    status, headers, answer = await post(http, server, chat_body())

    assert (first[0], second[0]) == (200, 200)
    assert first[1]["x-ratelimit-remaining-requests"] == "1"
    assert second[1]["x-ratelimit-remaining-requests"] == "0"
    assert status == 429
    assert answer["error"]["code"] == "rate_limit_exceeded"
    assert answer["error"]["type"] == "requests"
    assert int(headers["Retry-After"]) == 30  # the first request leaves the window in 30 s
    assert int(headers["retry-after-ms"]) == 30_000
    clock.advance(30)
    assert (await post(http, server, chat_body()))[0] == 200
    assert server.stats.rate_limited == 1


async def test_tpm_limit_counts_prompt_and_max_tokens(
    server: FakeLLMServer, http: aiohttp.ClientSession, clock: FakeClock
) -> None:
    body = chat_body(max_tokens=100)
    cost = server.provider.prompt_tokens(body["messages"]) + 100
    server.config.tpm = cost + cost // 2
    assert (await post(http, server, body))[0] == 200
    clock.advance(5)
    status, headers, answer = await post(http, server, body)
    assert status == 429
    assert answer["error"]["type"] == "tokens"
    assert int(headers["Retry-After"]) == 55
    assert int(headers["x-ratelimit-remaining-tokens"]) == cost // 2


async def test_a_shorter_window_limits_per_window_and_says_so(
    server: FakeLLMServer, http: aiohttp.ClientSession, clock: FakeClock
) -> None:
    root = server.base_url.removesuffix("/v1")
    async with http.post(f"{root}/_fake/config",
                         json={"rpm": 1, "window_seconds": 10}) as response:
        assert response.status == 200
    assert (await post(http, server, chat_body()))[0] == 200
    clock.advance(4)
    status, headers, _ = await post(http, server, chat_body())
    assert status == 429
    assert int(headers["Retry-After"]) == 6  # the first request leaves the window in 6 s
    assert headers["x-ratelimit-reset-requests"] == "6s"
    assert "on requests per 10 s" in (await post(http, server, chat_body()))[2]["error"]["message"]
    clock.advance(6)
    assert (await post(http, server, chat_body()))[0] == 200
    assert FakeLLMConfig().window_seconds == 60.0  # a minute unless told


async def test_request_larger_than_tpm_is_refused(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    server.config.tpm = 10
    status, headers, answer = await post(http, server, chat_body())
    assert status == 429
    assert "Request too large" in answer["error"]["message"]
    assert int(headers["Retry-After"]) >= 1


async def test_context_overflow_is_a_400_context_length_exceeded(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    server.config.context = 300
    status, _, answer = await post(http, server, chat_body(make_payload(30), max_tokens=10))
    assert status == 400
    assert answer["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 300 tokens" in answer["error"]["message"]
    # a small prompt with too large a completion budget also overflows
    small = chat_body(make_payload(1), max_tokens=290)
    assert (await post(http, server, small))[0] == 400
    assert server.stats.context_errors == 2


async def test_small_max_tokens_truncates_with_finish_reason_length(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    payload = make_payload(4)
    status, _, answer = await post(http, server, chat_body(payload, max_completion_tokens=12))
    assert status == 200
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] <= 12
    content = content_of(answer)
    assert json.dumps(fake_answer(payload), ensure_ascii=False).startswith(content)
    with pytest.raises(json.JSONDecodeError):
        json.loads(content)
    assert server.stats.truncated == 1 and server.stats.ok == 0


# --- faults ---------------------------------------------------------------------------------


async def test_truncate_rate_cuts_long_answers_at_half_and_spares_short_ones(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    server.config.truncate_rate = 1.0
    server.config.truncate_min_tokens = 60
    payload = make_payload(4)
    full = json.dumps(fake_answer(payload), ensure_ascii=False)
    status, _, answer = await post(http, server, chat_body(payload))  # max_tokens 1000: fits
    assert status == 200 and answer["choices"][0]["finish_reason"] == "length"
    assert full.startswith(content_of(answer)) and len(content_of(answer)) < len(full)
    assert answer["usage"]["completion_tokens"] <= server.stats.completion_tokens
    server.config.truncate_min_tokens = 10_000  # every answer is below the floor: spared
    _, _, spared = await post(http, server, chat_body(payload))
    assert spared["choices"][0]["finish_reason"] == "stop" and content_of(spared) == full
    assert server.stats.truncated == 1 and server.stats.ok == 1


async def test_context_error_rate_refuses_requests_that_fit_above_the_floor(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    server.config.context_error_rate = 1.0
    server.config.context_error_min_tokens = 150
    status, _, answer = await post(http, server, chat_body(make_payload(12), max_tokens=50))
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 8192 tokens" in answer["error"]["message"]
    status, _, _ = await post(http, server, chat_body(make_payload(1), max_tokens=50))
    assert status == 200  # a prompt under the floor passes
    assert server.stats.context_errors == 1


async def test_error_rate_one_gives_5xx(server: FakeLLMServer, http: aiohttp.ClientSession) -> None:
    server.config.error_rate = 1.0
    for _ in range(5):
        status, _, answer = await post(http, server, chat_body())
        assert status in (500, 502, 503)
        assert answer["error"]["type"] == "server_error"
    assert server.stats.errors_5xx == 5


async def test_malformed_rate_one_gives_unparseable_content(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    server.config.malformed_rate = 1.0
    for _ in range(6):
        status, _, answer = await post(http, server, chat_body())
        assert status == 200
        assert answer["choices"][0]["finish_reason"] == "stop"
        with pytest.raises(json.JSONDecodeError):
            json.loads(content_of(answer))
    assert server.stats.malformed == 6


async def test_wrong_ids_rate_one_drops_or_invents_refs(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    server.config.wrong_ids_rate = 1.0
    expected = {"g1", "g2", "g3"}
    kinds = set()
    for _ in range(10):
        status, _, answer = await post(http, server, chat_body(make_payload(3)))
        assert status == 200
        refs = [r for f in json.loads(content_of(answer))["fragments"] for r in f["refs"]]
        assert set(refs) != expected
        if set(refs) - expected:
            kinds.add("unknown")
        if expected - set(refs):
            kinds.add("missing")
    assert kinds == {"unknown", "missing"}
    assert server.stats.wrong_ids == 10


async def test_timeouts_stall_past_the_client_timeout(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    server.config.timeout_rate = 1.0
    server.config.stall_seconds = 30.0
    started = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(
            f"{server.base_url}/chat/completions",
            json=chat_body(),
            timeout=aiohttp.ClientTimeout(total=0.2),
        ) as response:
            await response.read()
    assert time.monotonic() - started < 5
    assert server.stats.timeouts == 1
    server.config.stall_seconds = 0.01  # a patient client gets a gateway timeout
    assert (await post(http, server, chat_body()))[0] == 504


async def test_a_client_hanging_up_mid_answer_counts_as_cancelled(
    http: aiohttp.ClientSession,
) -> None:
    config = FakeLLMConfig(base_latency=5.0, per_input_token=0.0, per_output_token=0.0)
    async with FakeLLMServer(config) as server:
        with pytest.raises(asyncio.TimeoutError):
            async with http.post(
                f"{server.base_url}/chat/completions",
                json=chat_body(),
                timeout=aiohttp.ClientTimeout(total=0.2),
            ) as response:
                await response.read()
        for _ in range(100):  # the server notices the hang-up asynchronously
            if server.stats.cancelled:
                break
            await asyncio.sleep(0.02)
        assert server.stats.cancelled == 1
        assert server.stats.in_flight == 0 and server.stats.ok == 0
        assert server.requests[0]["outcome"] == "cancelled"


async def test_faults_are_reproducible_from_the_seed(
    clock: FakeClock, sleep: FakeSleep, http: aiohttp.ClientSession
) -> None:
    runs = []
    for _ in range(2):
        config = FakeLLMConfig(seed=3, error_rate=0.4, malformed_rate=0.3)
        async with FakeLLMServer(config, clock=clock, sleep=sleep) as server:
            runs.append(
                [
                    (status, answer.get("choices", [{}])[0].get("message", {}).get("content"))
                    for status, _, answer in [
                        await post(http, server, chat_body()) for _ in range(12)
                    ]
                ]
            )
    assert runs[0] == runs[1]
    assert len({status for status, _ in runs[0]}) > 1  # the rates did mix outcomes


# --- latency --------------------------------------------------------------------------------


async def test_latency_grows_with_input_tokens(
    server: FakeLLMServer, http: aiohttp.ClientSession, sleep: FakeSleep
) -> None:
    server.config.base_latency = 0.01
    server.config.per_input_token = 0.001
    server.config.per_output_token = 0.0
    small = await post(http, server, chat_body(make_payload(2, example_words=5)))
    large = await post(http, server, chat_body(make_payload(2, example_words=400)))
    ratio_tokens = large[2]["usage"]["prompt_tokens"] / small[2]["usage"]["prompt_tokens"]
    ratio_latency = sleep.calls[1] / sleep.calls[0]
    assert ratio_tokens > 3
    assert ratio_latency > 2
    assert [r["latency"] for r in server.requests] == sleep.calls


async def test_real_sleep_latency_is_spent(http: aiohttp.ClientSession) -> None:
    config = FakeLLMConfig(base_latency=0.05, per_input_token=0.0, per_output_token=0.0)
    async with FakeLLMServer(config) as server:
        started = time.monotonic()
        assert (await post(http, server, chat_body()))[0] == 200
        assert time.monotonic() - started >= 0.05


# --- control plane and records ----------------------------------------------------------------


async def test_control_plane_patches_config_at_run_time(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    root = server.base_url.removesuffix("/v1")
    async with http.post(f"{root}/_fake/config", json={"error_rate": 1.0}) as response:
        assert response.status == 200
        assert (await response.json())["error_rate"] == 1.0
    assert (await post(http, server, chat_body()))[0] >= 500
    async with http.post(f"{root}/_fake/config", json={"error_rate": 0}) as response:
        assert response.status == 200
    assert (await post(http, server, chat_body()))[0] == 200
    for bad in ({"error_rate": 2}, {"nope": 1}, {"rpm": "ten"}, [1]):
        async with http.post(f"{root}/_fake/config", json=bad) as response:
            assert response.status == 400
    assert server.config.error_rate == 0
    async with http.get(f"{root}/_fake/stats") as response:
        stats = await response.json()
    assert stats["requests"] == 2 and stats["errors_5xx"] == 1 and stats["ok"] == 1
    async with http.post(f"{root}/_fake/reset") as response:
        assert response.status == 200
    assert server.stats.requests == 0 and server.requests == []


async def test_requests_are_recorded_and_bounded(
    server: FakeLLMServer, http: aiohttp.ClientSession
) -> None:
    root = server.base_url.removesuffix("/v1")
    async with http.post(f"{root}/_fake/config", json={"max_recorded": 3}) as response:
        assert response.status == 200
    bodies = []
    for i in range(5):
        payload = make_payload(1)
        payload["groups"][0]["examples"] = [f"marker-{i} password=[REDACTED]"]
        bodies.append(chat_body(payload))
        await post(http, server, bodies[-1])
    recorded = server.requests
    assert [r["seq"] for r in recorded] == [3, 4, 5]
    assert [r["body"] for r in recorded] == bodies[2:]
    assert all(r["status"] == 200 and r["outcome"] == "ok" for r in recorded)
    async with http.get(f"{root}/_fake/requests", params={"since": "4"}) as response:
        remote = await response.json()
    assert [r["seq"] for r in remote] == [5]
    assert "marker-4" in remote[0]["body"]["messages"][1]["content"]


# --- pieces -----------------------------------------------------------------------------------


def test_config_rejects_impossible_values() -> None:
    for bad in ({"rpm": 0}, {"error_rate": 1.5}, {"context": 2.5}, {"base_latency": -1},
                {"window_seconds": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FakeLLMConfig(**bad)
    config = FakeLLMConfig()
    with pytest.raises(ValueError):
        config.patch({"tpm": 100, "malformed_rate": 9})
    assert config.tpm is None  # all or nothing


def test_sliding_window_says_when_capacity_returns() -> None:
    window = SlidingWindow(60)
    window.add(0.0, 40)
    window.add(10.0, 40)
    assert window.wait(20.0, 100, 20) == 0.0
    assert window.wait(20.0, 100, 30) == pytest.approx(40.0)  # the first entry expires at 60
    assert window.wait(20.0, 100, 70) == pytest.approx(50.0)  # both must expire
    assert window.wait(20.0, 50, 60) == 60.0  # never fits: a whole window
    assert window.used(60.0) == 40
