"""Settings: one object from RETRO_* variables and CLI flags."""

from __future__ import annotations

import pytest

from streams.cli import build_settings, make_parser
from streams.settings import Settings


def test_nested_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRO_FAST__INPUT_BUDGET", "3000")
    monkeypatch.setenv("RETRO_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    s = Settings()
    assert s.fast.input_budget == 3000
    assert s.kafka.security_protocol == "SASL_SSL"


def test_one_slow_lane_variable_keeps_the_other_slow_lane_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RETRO_SLOW__TIMEOUT_SECONDS", "300")
    slow = Settings().slow
    assert slow.timeout_seconds == 300
    assert (slow.input_budget, slow.max_concurrency, slow.prompt_detail) == (1500, 3, "detailed")


def test_lanes_differ_by_settings_only() -> None:
    s = Settings()
    assert s.slow.input_budget < s.fast.input_budget
    assert s.slow.timeout_seconds > s.fast.timeout_seconds
    assert s.slow.max_concurrency < s.fast.max_concurrency


def test_base_url_selects_the_openai_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().model.effective_backend == "rules"
    monkeypatch.setenv("RETRO_MODEL__BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("RETRO_MODEL__API_KEY", "sk-test-secret")
    s = Settings()
    assert s.model.effective_backend == "openai"
    assert "sk-test-secret" not in repr(s)


def test_cli_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRO_KAFKA__BOOTSTRAP", "env:9092")
    monkeypatch.setenv("RETRO_KAFKA__SECURITY_PROTOCOL", "SSL")
    args = make_parser().parse_args(
        ["--bootstrap", "cli:9092", "--set", "fast.max_records=7", "--partitions", "3", "topics"])
    s = build_settings(args)
    assert s.kafka.bootstrap == "cli:9092"
    assert s.kafka.security_protocol == "SSL"  # the rest of the group still comes from env
    assert s.fast.max_records == 7
    assert s.topics.partitions == 3


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(ValueError):
        s.web_port = 1  # type: ignore[misc]
