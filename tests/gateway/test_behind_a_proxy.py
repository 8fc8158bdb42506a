"""Behind a gateway (LiteLLM's proxy and the like): retry hints in every form, quota
exhaustion by message, the gateway's own 429, advertised limits, the probe limit, and
errors that name the right culprit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from aiohttp import web

from streams.errors import PermanentModelError, RateLimited, TransientModelError
from streams.gateway.backends import (
    GATEWAY_RETRY_SECONDS,
    ChatResult,
    OpenAIBackend,
    culprit_hint,
    exhausted_limit,
    is_quota_exhausted,
    message_wait,
    parse_duration,
    parse_ratelimit,
    parse_reset,
    parse_retry_after,
    retry_hint,
)
from streams.gateway.buckets import TokenBucket
from streams.gateway.factory import build_gateways
from streams.gateway.probe import PROBE_TOKENS, backend_probe
from streams.gateway.quota import QuotaShare
from streams.metrics import Metrics
from streams.report.ops.redrive import RedriveGate
from streams.settings import Settings

from helpers import FakeClock, answers, serve_chat

# --- 1. retry hints wherever gateways put them -------------------------------------


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"Retry-After": "3"}, 3.0),
    ({"retry-after-ms": "250"}, 0.25),
    ({"llm_provider-retry-after": "59"}, 59.0),  # LiteLLM passes the provider's on
    ({"llm_provider-retry-after-ms": "58500"}, 58.5),
    ({"LLM_PROVIDER-Retry-After": "7"}, 7.0),
    # the proxy's own and the provider's: the longer wait, each family ms first
    ({"retry-after": "1", "llm_provider-retry-after-ms": "59000",
      "llm_provider-retry-after": "60"}, 59.0),
    ({"llm_provider-retry-after": "soon"}, None),
    ({}, None),
])
def test_retry_after_in_every_form(headers: dict[str, str], seconds: float | None) -> None:
    assert parse_retry_after(headers) == seconds


def test_retry_after_as_an_http_date_in_the_provider_form() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=42), usegmt=True)
    assert parse_retry_after({"llm_provider-retry-after": later},
                             now=now.timestamp()) == pytest.approx(42)


@pytest.mark.parametrize(("text", "seconds"), [
    ("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("2m", 120.0),
    ("0.5", 0.5), ("12", 12.0), ("soon", None), ("", None), ("ms", None),
])
def test_openai_reset_durations(text: str, seconds: float | None) -> None:
    value = parse_duration(text)
    assert value == (pytest.approx(seconds) if seconds is not None else None)


def test_reset_headers_of_the_exhausted_limit_and_their_provider_form() -> None:
    headers = {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "20ms"}
    assert parse_reset(headers, "requests") == 360.0
    assert parse_reset(headers, "tokens") == pytest.approx(0.02)
    assert parse_reset(headers) == pytest.approx(0.02)  # unknown: the sooner
    assert parse_reset({"llm_provider-x-ratelimit-reset-tokens": "1.5s"}, "tokens") == 1.5
    assert parse_reset({"x-ratelimit-reset-tokens": "later"}, "tokens") is None
    assert parse_reset({}, "requests") is None


@pytest.mark.parametrize(("message", "seconds"), [
    ("Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000, Used 29950, "
     "Requested 100. Please try again in 1.234s. Visit https://platform.openai.com", 1.234),
    ("Please try again in 6m0s.", 360.0),
    ("Please try again in 20ms.", 0.02),
    ("No deployments available for selected model, Try again in 5 seconds. Passed "
     "model=gpt-4o. pre-call-checks=False, cooldown_list=[]", 5.0),
    ("...exceeded call rate limit of your current pricing tier. Please retry after 6 "
     "seconds.", 6.0),
    ("You exceeded your current quota ... Please retry in 41.2s.", 41.2),
    ("slow down", None),
])
def test_a_wait_stated_in_the_message(message: str, seconds: float | None) -> None:
    value = message_wait(message)
    assert value == (pytest.approx(seconds) if seconds is not None else None)


def test_the_hint_order_headers_then_message_then_reset_then_the_gateway_default() -> None:
    reset = {"x-ratelimit-reset-requests": "30s"}
    said = "Please try again in 2s."
    assert retry_hint({"llm_provider-retry-after": "59", **reset}, said, "requests") == 59
    assert retry_hint(reset, said, "requests") == 2.0
    assert retry_hint(reset, "slow down", "requests") == 30.0
    assert retry_hint({}, "No deployments available for selected model",
                      "gateway") == GATEWAY_RETRY_SECONDS
    assert retry_hint({}, "slow down", "unknown") is None


# --- quota exhaustion, gateway 429s ------------------------------------------------


@pytest.mark.parametrize(("code", "message", "quota"), [
    ("insufficient_quota", "You exceeded your current quota", True),
    ("billing_hard_limit_reached", "Billing hard limit has been reached", True),
    # a proxy replaced the code with the status: the message still says
    ("429", "litellm.RateLimitError: RateLimitError: OpenAIException - You exceeded your "
     "current quota, please check your plan and billing details.", True),
    (None, "Quota exceeded. Contact your administrator.", True),
    ("429", "Your credit balance is too low; go to Plans & Billing to purchase credits", True),
    # rate limits worded as a quota: a per-minute window, or a stated wait
    ("429", "Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_"
     "minute_per_project_per_base_model with base model: gemini", False),
    ("429", "You exceeded your current quota, please check your plan and billing details. "
     "Please retry in 41.2s.", False),
    ("rate_limit_exceeded", "Rate limit reached for gpt-4o on requests per min", False),
    ("429", "No deployments available for selected model", False),
])
def test_quota_exhaustion_by_code_or_by_message(code: str | None, message: str,
                                                quota: bool) -> None:
    assert is_quota_exhausted(code, message) is quota


def test_parse_ratelimit_reads_the_provider_form_and_keeps_the_tighter() -> None:
    headers = {"x-ratelimit-limit-requests": "100", "llm_provider-x-ratelimit-limit-requests":
               "30", "llm_provider-x-ratelimit-remaining-tokens": "900",
               "llm_provider-x-ratelimit-reset-tokens": "1s", "x-litellm-version": "1.108.7"}
    assert parse_ratelimit(headers) == {"limit-requests": 30, "remaining-tokens": 900}


def test_no_deployments_available_is_the_gateway_limit() -> None:
    message = "No deployments available for selected model, Try again in 5 seconds."
    assert exhausted_limit({}, message) == "gateway"
    assert exhausted_limit({"remaining-requests": 0}, "slow down") == "requests"


# --- culprits ------------------------------------------------------------------------


def test_culprit_hints_name_whose_key_and_which_setting() -> None:
    upstream = ("litellm.AuthenticationError: AuthenticationError: OpenAIException - "
                "Incorrect API key provided: sk-up***. You can find your API key at ...")
    hint = culprit_hint(401, "401", upstream)
    assert "gateway's own provider key" in hint and "litellm_params.api_key" in hint
    assert "check RETRO_MODEL__API_KEY" not in hint
    assert "gateway's own provider key" in culprit_hint(
        403, None, "PermissionDeniedError: AnthropicException - permission denied")
    ours = "Authentication Error, Invalid proxy server token passed. valid_token=None."
    assert culprit_hint(401, "401", ours) == "; check RETRO_MODEL__API_KEY"
    assert culprit_hint(401, "invalid_api_key", "Incorrect API key provided: ***") == (
        "; check RETRO_MODEL__API_KEY")
    for status, message in [
        (400, "/chat/completions: Invalid model name passed in model=gpt-x. Call `/v1/models` "
              "to view available models for your key."),
        (404, "The model `gpt-x` does not exist or you do not have access to it."),
        (401, "Authentication Error, key not allowed to access model. This key can only "
              "access models=['a']. Tried to access gpt-x"),
    ]:
        assert "RETRO_MODEL__NAME" in culprit_hint(status, "400", message), message
    assert "RETRO_MODEL__BASE_URL" in culprit_hint(404, None, "Not Found")
    assert culprit_hint(400, None, "temperature must be a number") == ""


# --- the HTTP client behind a LiteLLM-like proxy -------------------------------------

LITELLM = {"x-litellm-version": "1.108.7", "x-litellm-call-id": "c-1",
           "x-litellm-model-api-base": "http://127.0.0.1:9/v1"}


def completion() -> dict[str, Any]:
    return {"choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1}}


def proxy_error(message: str, status: int) -> web.Response:
    body = {"error": {"message": message, "type": "None", "param": "None", "code": str(status)}}
    return web.json_response(body, status=status, headers=LITELLM)


class Proxy:
    """Answers as a LiteLLM proxy would, by requested model name."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        model = body["model"]
        if model == "ok":
            return web.json_response(completion(), headers={
                **LITELLM, "x-litellm-attempted-retries": "0",
                "x-ratelimit-limit-requests": "20",
                "llm_provider-x-ratelimit-limit-requests": "30"})
        if model == "retried":
            return web.json_response(completion(), headers={
                **LITELLM, "x-litellm-attempted-retries": "2"})
        if model == "upstream-429":
            response = proxy_error(
                "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached "
                "for fake on requests per min: Limit 30, Used 30, Requested 1.", 429)
            response.headers["llm_provider-retry-after"] = "59"
            response.headers["llm_provider-retry-after-ms"] = "58321"
            return response
        if model == "no-deployments":
            return proxy_error("No deployments available for selected model, Try again in 12 "
                               "seconds. Passed model=no-deployments. pre-call-checks=False, "
                               "cooldown_list=[('d1', {'status_code': 429})]", 429)
        if model == "no-deployments-bare":
            return proxy_error("No deployments available for selected model", 429)
        if model == "quota":
            return proxy_error(
                "litellm.RateLimitError: RateLimitError: OpenAIException - You exceeded your "
                "current quota, please check your plan and billing details.", 429)
        if model == "upstream-401":
            return proxy_error(
                "litellm.AuthenticationError: AuthenticationError: OpenAIException - "
                "Incorrect API key provided: sk-up***ey.", 401)
        if model == "proxy-401":
            return proxy_error("Authentication Error, Invalid proxy server token passed.", 401)
        return proxy_error(f"/chat/completions: Invalid model name passed in model={model}. "
                           "Call `/v1/models` to view available models for your key.", 400)


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[Proxy, str]]:
    state = Proxy()
    async with serve_chat(state.handle) as url:
        yield state, url


async def chat(client: OpenAIBackend, model: str, content: str = "hi",
               timeout: float = 5.0) -> ChatResult:
    return await client.chat(model=model, messages=[{"role": "user", "content": content}],
                             max_tokens=10, timeout=timeout)


async def test_a_proxy_429_carries_the_providers_retry_after(
        proxy: tuple[Proxy, str]) -> None:
    client = OpenAIBackend(base_url=proxy[1], api_key="sk-ours")
    try:
        with pytest.raises(RateLimited) as caught:
            await chat(client, "upstream-429")
        assert caught.value.retry_after == pytest.approx(58.321)
        assert caught.value.limit == "requests"
        with pytest.raises(RateLimited) as caught:
            await chat(client, "no-deployments")
        assert (caught.value.limit, caught.value.retry_after) == ("gateway", 12.0)
        with pytest.raises(RateLimited) as caught:
            await chat(client, "no-deployments-bare")
        assert (caught.value.limit, caught.value.retry_after) == (
            "gateway", GATEWAY_RETRY_SECONDS)
        with pytest.raises(PermanentModelError) as quota:
            await chat(client, "quota")
        assert quota.value.reason == "quota_exhausted"
        assert not isinstance(quota.value, TransientModelError)
    finally:
        await client.close()


async def test_errors_through_a_proxy_name_the_right_culprit(proxy: tuple[Proxy, str]) -> None:
    client = OpenAIBackend(base_url=proxy[1], api_key="sk-ours")
    try:
        with pytest.raises(PermanentModelError) as upstream:
            await chat(client, "upstream-401")
        assert "gateway's own provider key" in str(upstream.value)
        assert "check RETRO_MODEL__API_KEY" not in str(upstream.value)
        with pytest.raises(PermanentModelError, match="check RETRO_MODEL__API_KEY"):
            await chat(client, "proxy-401")
        with pytest.raises(PermanentModelError, match="RETRO_MODEL__NAME") as model:
            await chat(client, "gpt-x")
        assert model.value.reason == "model_rejected"  # permanent: parked, not retried
    finally:
        await client.close()


async def test_each_call_asks_the_proxy_for_no_retries_and_an_earlier_timeout(
        proxy: tuple[Proxy, str]) -> None:
    client = OpenAIBackend(base_url=proxy[1], api_key=None)
    try:
        await chat(client, "ok", timeout=60.0)
        await chat(client, "ok", timeout=60.0)  # the same batch sent again
        await chat(client, "ok", content="another batch", timeout=5.0)
    finally:
        await client.close()
    first, again, other = (r["headers"] for r in proxy[0].requests)
    assert first["x-litellm-num-retries"] == "0"
    assert first["x-litellm-timeout"] == "58"  # gives up before the worker does
    assert other["x-litellm-timeout"] == "4.5"
    assert first["Idempotency-Key"] == again["Idempotency-Key"] != other["Idempotency-Key"]
    assert first["Idempotency-Key"].startswith("retro-")

    leave = OpenAIBackend(base_url=proxy[1], api_key=None, proxy_num_retries=-1)
    try:
        await chat(leave, "ok")
    finally:
        await leave.close()
    assert "x-litellm-num-retries" not in proxy[0].requests[-1]["headers"]


async def test_a_proxy_is_noticed_once_and_a_retrying_one_is_named(
        proxy: tuple[Proxy, str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streams.gateway.backends")
    client = OpenAIBackend(base_url=proxy[1], api_key=None)
    try:
        for _ in range(3):
            await chat(client, "ok")
        assert client.proxy == "litellm 1.108.7"
        noticed = [r for r in caplog.records if "go through a LiteLLM proxy" in r.message]
        assert len(noticed) == 1 and "num_retries: 0" in noticed[0].message
        assert "upstream http://127.0.0.1:9/v1" in noticed[0].message
        for _ in range(2):
            await chat(client, "retried")
    finally:
        await client.close()
    retried = [r for r in caplog.records if "retried a call 2 times" in r.message]
    assert len(retried) == 1 and retried[0].levelno == logging.WARNING
    assert "RETRO_FAST__TIMEOUT_SECONDS" in retried[0].message

    caplog.clear()
    leave = OpenAIBackend(base_url=proxy[1], api_key=None, proxy_num_retries=-1)
    try:
        await chat(leave, "ok")
    finally:
        await leave.close()
    (warned,) = [r for r in caplog.records if "go through a LiteLLM proxy" in r.message]
    assert warned.levelno == logging.WARNING and "paid twice" in warned.message


# --- 2. advertised limits lower the shared buckets -----------------------------------


def _share(metrics: Metrics | None = None) -> QuotaShare:
    t = FakeClock()
    rpm = TokenBucket(rate_per_minute=600, clock=t, sleep=t.sleep)
    tpm = TokenBucket(rate_per_minute=100_000, clock=t, sleep=t.sleep)
    return QuotaShare(rpm=rpm, tpm=tpm, rpm_quota=600, tpm_quota=100_000, min_tokens=8192,
                      metrics=metrics)


def _gauge(metrics: Metrics, kind: str, source: str) -> float | None:
    return metrics.registry.get_sample_value("retro_model_rate_limit_per_minute",
                                             {"kind": kind, "source": source})


def test_an_advertised_limit_below_the_configured_one_is_shared_instead() -> None:
    metrics = Metrics()
    q = _share(metrics)
    assert _gauge(metrics, "requests", "configured") == 600
    assert _gauge(metrics, "requests", "advertised") is None
    q.set(0.5)
    q.advertise({"limit-requests": 30, "remaining-requests": 29})
    assert q.rpm.rate_per_minute == 15  # half of the advertised 30: pods still add up to it
    assert q.rpm.capacity == 15
    assert q.tpm.rate_per_minute == 50_000  # tokens: nothing advertised, configured stands
    assert _gauge(metrics, "requests", "advertised") == 30
    assert _gauge(metrics, "requests", "configured") is None  # one series: the one in force
    assert metrics.registry.get_sample_value(
        "retro_model_quota_limit_per_minute", {"kind": "requests"}) == 15
    q.set(1.0)  # a rebalance keeps the advertised quota
    assert q.rpm.rate_per_minute == 30
    q.advertise({"limit-tokens": 40_000})
    assert q.tpm.rate_per_minute == 40_000
    assert q.tpm.capacity == 40_000 and _gauge(metrics, "tokens", "advertised") == 40_000


def test_an_advertised_limit_never_raises_the_configured_one_and_is_followed_back_up() -> None:
    q = _share()
    q.advertise({"limit-requests": 10_000})
    assert q.rpm.rate_per_minute == 600
    q.advertise({"limit-requests": 60})
    assert q.rpm.rate_per_minute == 60
    q.advertise({"limit-requests": 120})  # a raised plan
    assert q.rpm.rate_per_minute == 120
    q.advertise({"limit-requests": 0, "limit-tokens": -1})  # nonsense: ignored
    assert q.rpm.rate_per_minute == 120
    q.advertise({"limit-tokens": 1000})  # below a full request: the burst still holds one
    assert q.tpm.rate_per_minute == 1000 and q.tpm.capacity == 8192


async def test_the_caller_hands_advertised_limits_to_the_shared_quota(
        proxy: tuple[Proxy, str]) -> None:
    metrics = Metrics()
    settings = Settings(model={"base_url": proxy[1], "name": "ok", "rpm": 600})
    gateways = build_gateways(settings, metrics=metrics)
    try:
        result, _ = await gateways.fast.caller.request(
            [{"role": "user", "content": "hi"}], prompt_tokens=5, max_tokens=10, observe=None)
    finally:
        await gateways.close()
    assert isinstance(result, ChatResult)
    # the proxy's key limit (20) is below the provider's (30) and the configured 600
    assert gateways.quota.rpm.rate_per_minute == 20
    assert gateways.slow.rpm is gateways.fast.rpm  # one account, both lanes
    assert _gauge(metrics, "requests", "advertised") == 20

    keep = build_gateways(Settings(model={"base_url": proxy[1], "name": "ok", "rpm": 600,
                                          "advertised_limits": False}))
    try:
        await keep.fast.caller.request(
            [{"role": "user", "content": "hi"}], prompt_tokens=5, max_tokens=10, observe=None)
    finally:
        await keep.close()
    assert keep.quota.rpm.rate_per_minute == 600  # RETRO_MODEL__ADVERTISED_LIMITS=false


# --- 3. re-drive probes: counted by the buckets, one in flight, one per step ----------


async def test_a_probe_takes_a_request_and_its_tokens_from_the_buckets() -> None:
    t = FakeClock()
    rpm = TokenBucket(rate_per_minute=60, clock=t, sleep=t.sleep)
    tpm = TokenBucket(rate_per_minute=1000, clock=t, sleep=t.sleep)
    backend = answers()
    metrics = Metrics()
    probe = backend_probe(backend, model="m", timeout_seconds=5.0, rpm=rpm, tpm=tpm,
                          metrics=metrics)
    assert await probe() is True
    assert rpm.available == 59 and tpm.available == 1000 - PROBE_TOKENS
    assert await probe() is True
    first, second = (r.messages[0]["content"] for r in backend.requests)
    assert first != second  # a nonce: no cache answers for the provider
    assert metrics.registry.get_sample_value(
        "retro_review_redrive_probes_total", {"result": "healthy"}) == 2


async def test_an_empty_bucket_holds_the_probe_back() -> None:
    t = FakeClock()
    rpm = TokenBucket(rate_per_minute=1, clock=t, sleep=t.sleep)
    backend = answers()
    probe = backend_probe(backend, model="m", timeout_seconds=5.0, rpm=rpm)
    assert rpm.try_acquire(1)  # the lanes took the last request of this minute
    assert await probe() is True
    assert t.now == pytest.approx(60.0)  # the probe waited for the bucket, like a call


async def test_a_rate_limited_probe_blocks_the_buckets_for_its_retry_after() -> None:
    t = FakeClock()
    rpm = TokenBucket(rate_per_minute=60, clock=t, sleep=t.sleep)
    tpm = TokenBucket(rate_per_minute=1000, clock=t, sleep=t.sleep)
    backend = answers(RateLimited("429", retry_after=30.0))
    probe = backend_probe(backend, model="m", timeout_seconds=5.0, rpm=rpm, tpm=tpm)
    assert await probe() is False
    assert rpm.available == 0 and tpm.available == 0
    t.advance(31.0)
    assert rpm.available > 0


async def test_one_probe_in_flight_per_backend_shares_its_answer() -> None:
    release = asyncio.Event()
    backend = answers(release=release)
    first = backend_probe(backend, model="m", timeout_seconds=5.0)
    second = backend_probe(backend, model="m", timeout_seconds=5.0)  # another gate, same backend
    waiting = [asyncio.create_task(p()) for p in (first, first, second)]
    await asyncio.sleep(0.01)
    assert len(backend.requests) == 1
    release.set()
    assert await asyncio.gather(*waiting) == [True, True, True]
    assert len(backend.requests) == 1
    assert await backend_probe(answers(), model="m", timeout_seconds=5.0)() is True


async def test_never_more_probes_than_one_per_backoff_step() -> None:
    clock = FakeClock()
    backend = answers()
    gate = RedriveGate(backend_probe(backend, model="m", timeout_seconds=5.0),
                       backoff_base=5.0, backoff_max=60.0, records_per_second=1000.0,
                       sleep=clock.sleep, clock=clock)
    for _ in range(50):  # a fetch of 50 transient reviews, re-driven at once
        assert await gate.healthy()
        await gate.pace(10)  # 10 ms each
    assert len(backend.requests) == 1  # 0.5 s of re-drives: one step, one probe
    clock.advance(5.0)
    assert await gate.healthy()
    assert len(backend.requests) == 2


async def test_the_worker_probe_uses_the_lanes_buckets(proxy: tuple[Proxy, str]) -> None:
    settings = Settings(model={"base_url": proxy[1], "name": "ok", "rpm": 600})
    gateways = build_gateways(settings, metrics=Metrics())
    probe = gateways.probe(timeout_seconds=5.0)
    assert gateways.probe(timeout_seconds=5.0) is probe  # one per worker and backend
    try:
        before = gateways.fast.rpm.available
        assert await probe() is True
    finally:
        await gateways.close()
    assert gateways.fast.rpm.available < before
    sent = proxy[0].requests[-1]
    assert sent["body"]["max_tokens"] == 1
