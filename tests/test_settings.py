"""Settings: one object from RETRO_* variables and CLI flags."""

from __future__ import annotations

import pytest

from streams.cli import build_settings, make_parser
from streams.errors import ConfigError
from streams.settings import Settings, load_settings


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


# ------------------------------------------------------------ refused before anything starts
@pytest.mark.parametrize("env, value, allowed", [
    ("RETRO_WEB_PORT", "0", "a port from 1 to 65535"),
    ("RETRO_WEB_PORT", "65536", "a port from 1 to 65535"),
    ("RETRO_FAST__MAX_RECORDS", "0", "greater than or equal to 1"),
    ("RETRO_SLOW__TIMEOUT_SECONDS", "0", "greater than 0"),
    ("RETRO_FAST__MAX_WAIT_SECONDS", "-1", "greater than 0"),
    ("RETRO_MODEL__RPM", "0", "greater than or equal to 1"),
    ("RETRO_MODEL__CACHE_SIZE", "0", "greater than or equal to 1"),
    ("RETRO_MODEL__AIMD_DECREASE_FACTOR", "1", "less than 1"),
    ("RETRO_MODEL__BASE_URL", "localhost:8000/v1", "http://127.0.0.1:8000/v1"),
    ("RETRO_MODEL__BASE_URL", "http://host:port/v1", "http or https"),
    ("RETRO_MODEL__REDIS_URL", "127.0.0.1:6379", "redis://127.0.0.1:6379/0"),
    ("RETRO_KAFKA__MAX_MESSAGE_BYTES", "0", "greater than or equal to 1"),
    ("RETRO_KAFKA__COMPRESSION", "brotli", "'none', 'gzip', 'snappy', 'lz4' or 'zstd'"),
    ("RETRO_TOPICS__RETENTION_MS", "0", "-1 to keep records forever"),
    ("RETRO_TOPICS__REPORTS", "my reports", "Kafka topic name"),
    ("RETRO_CLEAN__DEFAULT_TIMEZONE", "Mars/Olympus", "Europe/Paris"),
    ("RETRO_CLEAN__MAX_RECORD_BYTES", "0", "greater than or equal to 1"),
    ("RETRO_LOG_LEVEL", "LOUD", "DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ("RETRO_NOTIFY__MIN_SEVERITY", "urgent", "'info', 'low', 'medium', 'high' or 'critical'"),
    ("RETRO_NOTIFY__REFRESH_SECONDS", "0", "greater than 0"),
    ("RETRO_NOTIFY__EXTERNAL_URL", "retro.example.com", "https://retro.example.com"),
    ("RETRO_TOPICS__NOTIFICATIONS", "my notes", "Kafka topic name"),
])
def test_a_bad_value_is_one_line_naming_the_variable_the_value_and_what_is_allowed(
        monkeypatch: pytest.MonkeyPatch, env: str, value: str, allowed: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(f"{env}={value!r}: "), line
    assert allowed in line
    dotted = env.removeprefix("RETRO_").lower().replace("__", ".")
    assert f"--set {dotted}=" in line


def test_the_edges_of_what_is_allowed_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in [("RETRO_WEB_PORT", "65535"), ("RETRO_TOPICS__RETENTION_MS", "-1"),
                        ("RETRO_MODEL__BASE_URL", ""), ("RETRO_LOG_LEVEL", "debug"),
                        ("RETRO_MODEL__REDIS_URL", "unix:///run/redis.sock"),
                        ("RETRO_CLEAN__DEFAULT_TIMEZONE", "Europe/Paris"),
                        ("RETRO_MODEL__AIMD_INCREASE", "0"), ("RETRO_STALL_SECONDS", "0")]:
        monkeypatch.setenv(name, value)
    s = load_settings()
    assert s.web_port == 65535 and s.topics.retention_ms == -1
    assert s.model.base_url is None and s.model.effective_backend == "rules"
    assert s.log_level == "DEBUG"
    assert load_settings(web_port=1).web_port == 1
    assert load_settings(model={"redis_url": "rediss://cache:6380/1"}).model.redis_url


def test_a_refused_value_never_shows_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRO_MODEL__REDIS_URL", "redis://:hunter2@cache:port/0")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "hunter2" not in str(caught.value) and "redis://:***@cache" in str(caught.value)
    monkeypatch.delenv("RETRO_MODEL__REDIS_URL")
    with pytest.raises(ConfigError) as caught:
        load_settings(kafka={"sasl_password": ["s3cret"]})
    assert "s3cret" not in str(caught.value) and "RETRO_KAFKA__SASL_PASSWORD" in str(caught.value)


def test_several_bad_values_name_the_first_and_count_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRO_WEB_PORT", "0")
    monkeypatch.setenv("RETRO_FAST__MAX_RECORDS", "0")
    with pytest.raises(ConfigError, match=r"^RETRO_FAST__MAX_RECORDS='0': .*; and 1 more "
                                          r"setting is wrong$"):
        load_settings()
