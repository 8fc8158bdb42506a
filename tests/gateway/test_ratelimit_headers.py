"""The provider's x-ratelimit-* headers and which limit a 429 names."""

from __future__ import annotations

from streams.gateway.backends import exhausted_limit, parse_ratelimit


def test_openai_style_headers_are_read_case_insensitively() -> None:
    headers = {
        "X-RateLimit-Limit-Requests": "500",
        "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-limit-tokens": "30000",
        "x-ratelimit-remaining-tokens": "29000.0",
        "x-ratelimit-reset-tokens": "2ms",  # not a count: ignored
        "x-ratelimit-remaining-tokens-day": "5",  # not one of ours
        "Content-Type": "application/json",
    }
    assert parse_ratelimit(headers) == {
        "limit-requests": 500,
        "remaining-requests": 499,
        "limit-tokens": 30000,
        "remaining-tokens": 29000,
    }
    assert parse_ratelimit({"x-ratelimit-remaining-tokens": "lots"}) == {}


def test_the_exhausted_limit_comes_from_headers_then_from_the_message() -> None:
    assert exhausted_limit({"remaining-requests": 3, "remaining-tokens": 0}, "") == "tokens"
    assert exhausted_limit({"remaining-requests": 0}, "") == "requests"
    msg = "Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000, Used 29950"
    assert exhausted_limit({}, msg) == "tokens"
    assert exhausted_limit({}, "Rate limit reached on Requests per day") == "requests"
    assert exhausted_limit({}, "slow down") == "unknown"
