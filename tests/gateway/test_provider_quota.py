"""Rate-limit telemetry against the simulated OpenAI-compatible provider over real HTTP:
the provider's remaining quota, which limit a 429 names, GenAI durations by outcome."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streams.dev.fakellm import FakeLLMConfig, FakeLLMServer
from streams.gateway.caller import CallFailure
from streams.gateway.factory import build_gateways
from streams.metrics import Metrics
from streams.settings import Settings

from helpers import FakeClock


async def _no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


@pytest.fixture
async def provider() -> AsyncIterator[FakeLLMServer]:
    config = FakeLLMConfig(seed=3, rpm=2)
    async with FakeLLMServer(config, clock=FakeClock(start=50.0), sleep=_no_sleep) as server:
        yield server


def samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return samples(metrics)[(name, frozenset(labels.items()))]


async def test_remaining_quota_and_the_limit_a_429_names(provider: FakeLLMServer) -> None:
    metrics = Metrics()
    # the third call must reach the provider to be refused: a worker following the
    # remaining count would hold it until the provider's window resets
    settings = Settings(model={"base_url": provider.base_url, "name": "fake-gpt",
                               "max_attempts": 1, "advertised_limits": False})
    gateways = build_gateways(settings, metrics=metrics)
    caller = gateways.fast.caller
    messages = [{"role": "user", "content": "hello"}]
    try:
        outcomes = [await caller.request(messages, prompt_tokens=10, max_tokens=50, observe=None)
                    for _ in range(3)]
    finally:
        await gateways.close()
    assert [type(result).__name__ for result, _ in outcomes][:2] == ["ChatResult"] * 2
    assert isinstance(outcomes[2][0], CallFailure)

    assert value(metrics, "retro_model_provider_limit", kind="requests") == 2
    assert value(metrics, "retro_model_provider_remaining", kind="requests") == 0
    assert value(metrics, "retro_model_rate_limited_total", lane="fast", limit="requests") == 1
    assert value(metrics, "retro_model_rate_limited_total", lane="fast", limit="tokens") == 0
    genai = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai",
             "gen_ai_request_model": "fake-gpt"}
    # 429s apart from successes: error_type is empty on success
    assert value(metrics, "gen_ai_client_operation_duration_seconds_count",
                 error_type="", **genai) == 2
    assert value(metrics, "gen_ai_client_operation_duration_seconds_count",
                 error_type="rate_limited", **genai) == 1
    assert value(metrics, "gen_ai_client_token_usage_count",
                 gen_ai_token_type="input", **genai) == 2
    assert value(metrics, "retro_model_bucket_available", kind="requests") < 600


def test_a_fresh_registry_starts_known_series_at_zero_and_says_what_runs() -> None:
    metrics = Metrics()
    seen = samples(metrics)
    assert value(metrics, "retro_model_cache_total", lane="slow", result="hit") == 0
    assert value(metrics, "retro_batch_splits_total", lane="fast", reason="context_length") == 0
    assert value(metrics, "retro_model_retry_budget_exhausted_total", lane="fast") == 0
    assert value(metrics, "retro_report_updates_total", result="duplicate") == 0
    names = {name for name, _ in seen}
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "python_info",
            "retro_build_info"} <= names
    (build,) = [labels for name, labels in seen if name == "retro_build_info"]
    assert dict(build)["version"] and dict(build)["python"]
    assert "retro_clean_duration_seconds_count" not in names  # never observed: gone
