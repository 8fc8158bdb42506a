"""Connection settings: bootstrap resolution, SASL and TLS for every client."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from streams.errors import ConfigError, KafkaUnreachable
from streams.kafka.connect import (
    FETCH_WAIT_MS,
    aiokafka_kwargs,
    bootstrap_addresses,
    check_reachable,
    resolve_bootstrap,
    stage_consumer,
)
from streams.settings import Settings

from helpers import closed_port


def test_named_bootstrap_wins(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path, kafka={"bootstrap": "kafka-0:9092,kafka-1:9092"})
    assert resolve_bootstrap(s) == "kafka-0:9092,kafka-1:9092"


def test_no_bootstrap_and_no_local_broker_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="retro broker start"):
        resolve_bootstrap(Settings(state_dir=tmp_path))


def test_sasl_scram_reaches_aiokafka() -> None:
    s = Settings(kafka={"bootstrap": "k:9093", "security_protocol": "SASL_PLAINTEXT",
                        "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "retro",
                        "sasl_password": "pw"})
    kwargs = aiokafka_kwargs(s)
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("retro", "pw")
    assert "pw" not in repr(s)


def test_sasl_without_credentials_is_a_config_error() -> None:
    s = Settings(kafka={"bootstrap": "k:9093", "security_protocol": "SASL_SSL"})
    with pytest.raises(ConfigError, match="RETRO_KAFKA__SASL_USERNAME"):
        aiokafka_kwargs(s)


def test_plaintext_has_no_tls_context() -> None:
    s = Settings(kafka={"bootstrap": "k:9092"})
    assert "ssl_context" not in aiokafka_kwargs(s)


def test_ssl_builds_a_verifying_context() -> None:
    s = Settings(kafka={"bootstrap": "k:9093", "security_protocol": "SSL"})
    context = aiokafka_kwargs(s)["ssl_context"]
    import ssl

    assert context.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize("bootstrap, addresses", [
    ("kafka-0:9092,kafka-1:9093", [("kafka-0", 9092), ("kafka-1", 9093)]),
    ("kafka", [("kafka", 9092)]),  # aiokafka's default port
    ("PLAINTEXT://127.0.0.1:29092, ", [("127.0.0.1", 29092)]),
    ("[::1]:9092", [("::1", 9092)]),
])
def test_bootstrap_addresses(bootstrap: str, addresses: list[tuple[str, int]]) -> None:
    assert bootstrap_addresses(bootstrap) == addresses


@pytest.mark.parametrize("bootstrap", ["kafka:x", "kafka:0", "kafka:70000", ":9092", " , "])
def test_a_malformed_bootstrap_names_the_entry(bootstrap: str) -> None:
    with pytest.raises(ConfigError, match="bootstrap"):
        bootstrap_addresses(bootstrap)


def test_an_unreachable_bootstrap_fails_fast_naming_the_address(tmp_path: Path) -> None:
    with closed_port() as refused:
        s = Settings(state_dir=tmp_path,
                     kafka={"bootstrap": f"127.0.0.1:{refused},no-such-host.invalid:9092"})
        began = time.monotonic()
        with pytest.raises(KafkaUnreachable) as caught:
            check_reachable(s, timeout=2.0)
    assert time.monotonic() - began < 10
    message = str(caught.value)
    assert f"127.0.0.1:{refused} (connection refused)" in message
    assert "no-such-host.invalid:9092 (" in message
    assert "RETRO_KAFKA__BOOTSTRAP" in message and "\n" not in message


def test_members_hear_of_a_rebalance_within_a_second_and_well_inside_the_session() -> None:
    from streams.kafka.connect import heartbeat_seconds
    from streams.settings import KafkaSettings, Settings

    for session in (6.0, 10.0, 30.0, 300.0):
        beat = heartbeat_seconds(Settings(kafka=KafkaSettings(session_timeout_seconds=session)))
        assert beat <= 1.0 and beat <= session / 3


def test_stage_consumers_long_poll_briefly_unless_a_loop_says_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One fetch is in flight per broker, so a long poll on a caught-up partition delays
    the next fetch of every busy partition on it by up to ``fetch_max_wait_ms``."""
    import aiokafka

    made: list[dict[str, object]] = []
    monkeypatch.setattr(aiokafka, "AIOKafkaConsumer", lambda *topics, **kw: made.append(kw))
    s = Settings(kafka={"bootstrap": "k:9092"})
    stage_consumer(s, "g")
    stage_consumer(s, "g", fetch_max_wait_ms=400)
    assert [kw["fetch_max_wait_ms"] for kw in made] == [FETCH_WAIT_MS, 400]


def test_the_clean_loop_fetches_seconds_of_work_per_raw_partition() -> None:
    from streams.metrics import Metrics
    from streams.worker.stages import RAW_FETCH_BYTES, clean_loop

    s = Settings(kafka={"bootstrap": "k:9092"})
    options = clean_loop(s, Metrics(), "g").subscription.options
    assert options["max_partition_fetch_bytes"] == RAW_FETCH_BYTES >= 4 * 1024 * 1024
    big = Settings(kafka={"bootstrap": "k:9092"}, clean={"max_record_bytes": 2 * 1024 * 1024})
    assert clean_loop(big, Metrics(), "g").subscription.options[
        "max_partition_fetch_bytes"] == 8 * 1024 * 1024  # four of the largest records


def test_loops_over_quiet_topics_poll_less_often_than_the_busy_ones() -> None:
    """An idle long poll is a request on the worker and the broker: the loops whose topics
    seldom carry anything (fragments, reviews, notifications) wait longer per poll; the
    clean and lanes loops keep the short wait their throughput needs."""
    from types import SimpleNamespace

    from streams.kafka.connect import QUIET_FETCH_WAIT_MS
    from streams.metrics import Metrics
    from streams.worker.notify import notify_loop
    from streams.worker.stages import clean_loop, compact_loop, redrive_loop

    s = Settings(kafka={"bootstrap": "k:9092"})
    gateways = SimpleNamespace(probe=lambda **_: None)
    follower = SimpleNamespace(reports={}, changed=None, caught_up=None)
    quiet = [compact_loop(s, Metrics(), "g"), redrive_loop(s, Metrics(), "g", gateways),
             notify_loop(s, Metrics(), "g", follower, sinks=[])]
    for loop in quiet:
        assert loop.subscription.options["fetch_max_wait_ms"] == QUIET_FETCH_WAIT_MS, loop.name
    assert "fetch_max_wait_ms" not in clean_loop(s, Metrics(), "g").subscription.options
    assert FETCH_WAIT_MS < QUIET_FETCH_WAIT_MS
