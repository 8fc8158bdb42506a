"""The Cleaner: routing, dead letters, redaction order, never raising on input."""

from __future__ import annotations

import hashlib
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from streams.clean.cleaner import Cleaner
from streams.clean.mining import TemplateMiner
from streams.clean.offline import run_clean, source_name
from streams.metrics import Metrics
from streams.records import DeadLetter, NormalizedRecord, RawCoord
from streams.settings import CleanSettings, Settings
from streams.tokens import TokenCounter

from helpers import make_cleaner

COORD = RawCoord(topic="retro.logs.raw", partition=2, offset=41)


def make(**overrides: object) -> Cleaner:
    return make_cleaner(datetime(2026, 6, 1, tzinfo=UTC), **overrides)


@pytest.fixture(scope="module")
def cleaner() -> Cleaner:
    return make()


def test_a_normal_record(cleaner: Cleaner) -> None:
    out = cleaner.clean_line(
        b"2015-10-18 18:01:47,978 WARN [main] org.acme.Fetcher: retry 3 of 5", COORD, "hadoop"
    )
    assert isinstance(out, NormalizedRecord)
    assert out.id == "retro.logs.raw/2/41"
    assert out.raw == COORD
    assert (out.source, out.format, out.level) == ("hadoop", "log4j", "WARN")
    assert (out.timestamp, out.timestamp_rule) == ("2015-10-18T18:01:47.978Z", "zone-assumed:UTC")
    assert out.service == "hadoop"  # the source: the logger is evidence, not a service
    assert out.attributes["logger"] == "org.acme.Fetcher"
    assert out.message == "retry 3 of 5"
    assert out.tokens > 0
    assert out.template_id and "retry" in out.template
    assert out.lane == "fast"


def test_a_leading_byte_order_mark_is_dropped(cleaner: Cleaner) -> None:
    out = cleaner.clean_line(b'\xef\xbb\xbf{"level": "info", "msg": "hi"}', COORD, "s")
    assert isinstance(out, NormalizedRecord)
    assert (out.format, out.message) == ("json", "hi")


def test_service_falls_back_to_the_source(cleaner: Cleaner) -> None:
    out = cleaner.clean_line(b"plain words and nothing else", COORD, "my-source")
    assert isinstance(out, NormalizedRecord)
    assert out.service == "my-source"
    assert out.timestamp is None


def test_a_secret_in_the_source_or_service_name_is_redacted(cleaner: Cleaner) -> None:
    """The Kafka key (``--source``) and a service field reach the model and the report
    like the message does: a DSN with a password used as a stream name once did."""
    dsn = "postgres://svc:Hunter2Secret@db.internal:5432/orders"
    out = cleaner.clean_line(b"connection pool exhausted", COORD, dsn)
    assert isinstance(out, NormalizedRecord)
    assert "Hunter2Secret" not in out.source and "Hunter2Secret" not in (out.service or "")
    assert "db.internal" in out.source  # the rest still names the stream
    named = cleaner.clean_line(json.dumps({"msg": "hi", "service": dsn}).encode(), COORD, "k")
    assert isinstance(named, NormalizedRecord)
    assert "Hunter2Secret" not in (named.service or "") and named.redactions


def test_routing_by_cost_threshold() -> None:
    nested = json.dumps({"msg": "deep", "a": [[{"b": [{"c": [1]}]}]] * 3}).encode()
    low = make(slow_cost_threshold=5.0).clean_line(b"INFO short and cheap", COORD, "s")
    high = make(slow_cost_threshold=5.0).clean_line(nested, COORD, "s")
    assert isinstance(low, NormalizedRecord) and isinstance(high, NormalizedRecord)
    assert low.cost < 5.0 <= high.cost
    assert (low.lane, high.lane) == ("fast", "slow")
    # the same record moves lanes with the threshold, nothing else
    lowered = make(slow_cost_threshold=low.cost).clean_line(b"INFO short and cheap", COORD, "s")
    assert isinstance(lowered, NormalizedRecord) and lowered.lane == "slow"


def test_too_large_is_a_dead_letter_with_a_text_sample_size_and_hash() -> None:
    raw = b"INFO " + b"x" * 200
    out = make(max_record_bytes=100).clean_line(raw, COORD, "s")
    assert isinstance(out, DeadLetter)
    assert (out.reason, out.stage, out.id) == ("too_large", "clean", "retro.logs.raw/2/41")
    assert "MAX_RECORD_BYTES" in out.detail and "100" in out.detail
    assert out.sample == raw.decode()  # small enough to keep whole
    assert out.raw_size == len(raw) and out.raw_sha256 == hashlib.sha256(raw).hexdigest()


def test_a_dead_letter_is_redacted_like_everything_else() -> None:
    """Dead letters kept the raw bytes, secrets included, under every reader's access."""
    secret = "Zk3vQ9xLm2Pq8Rt5Wy7Bn4Cd6Fg1Hj0KsTu2Ve/"
    raw = (f"INFO login password=hunter2hunter2 key {secret} " + "x" * 200).encode()
    [out] = make(max_record_bytes=100).clean(raw, COORD, "postgres://svc:PW1x@db/app")
    assert isinstance(out, DeadLetter)
    text = out.model_dump_json()
    for value in ("hunter2hunter2", secret, "PW1x"):
        assert value not in text
    assert out.raw_base64 == "" and "[REDACTED:password]" in (out.sample or "")


def test_a_huge_record_leaves_a_dead_letter_that_fits_any_topic() -> None:
    """A 900 KB line once gave a 1.2 MB dead letter that a 1 MB topic refused: the
    record was never accounted for and its partition's commit stuck."""
    raw = b"INFO " + bytes(range(32, 127)) * 9_500  # about 900 KB of text
    out = make(max_record_bytes=64 * 1024).clean_line(raw, COORD, "s")
    assert isinstance(out, DeadLetter) and out.reason == "too_large"
    assert len(out.model_dump_json()) < 32 * 1024
    assert out.raw_sampled and out.raw_size == len(raw)
    assert out.sample == raw[: 16 * 1024].decode()
    assert out.raw_sha256 == hashlib.sha256(raw).hexdigest()


def test_invalid_utf8_is_undecodable(cleaner: Cleaner) -> None:
    raw = "2024-01-01 10:00:00 INFO café crème brûlée".encode("latin-1")
    out = cleaner.clean_line(raw, COORD, "s")
    assert isinstance(out, DeadLetter)
    assert out.reason == "undecodable"
    assert "UTF-8" in out.detail and "iconv" in out.detail
    assert out.sample == raw.decode("utf-8", errors="replace")


def test_a_rare_bad_byte_in_long_text_is_repaired_and_noted(cleaner: Cleaner) -> None:
    raw = b"2024-01-01 10:00:00 INFO " + b"all fine here " * 20 + b"\xff end"
    out = cleaner.clean_line(raw, COORD, "s")
    assert isinstance(out, NormalizedRecord)
    assert "\ufffd" in out.message
    assert out.attributes["utf8_replaced"] == 1


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\x01\x02\x03PK\x03\x04" * 20,  # binary blob
        "2024-01-01 INFO hello".encode("utf-16-le"),  # NUL every other byte
        b"\x1f\x8b\x08\x00" + bytes(range(1, 32)) * 3,  # compressed / control bytes
    ],
)
def test_binary_is_its_own_reason(cleaner: Cleaner, raw: bytes) -> None:
    out = cleaner.clean_line(raw, COORD, "s")
    assert isinstance(out, DeadLetter)
    assert out.reason == "binary"
    assert "binary" in out.detail


class SpyMiner:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self.inner = TemplateMiner()

    def match(self, message: str) -> tuple[str, str]:
        self.seen.append(message)
        return self.inner.match(message)


class SpyCounter:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self.inner = TokenCounter()

    def count(self, text: str) -> int:
        self.seen.append(text)
        return self.inner.count(text)


def test_redaction_happens_before_templates_and_tokens() -> None:
    miner, counter = SpyMiner(), SpyCounter()
    c = make(template_miner=miner, token_counter=counter)
    raw = (
        b'{"level": "error", "msg": "login failed for alice@example.com password=hunter2",'
        b' "user": "bob@example.org", "api_password": "s3cret"}'
    )
    out = c.clean_line(raw, COORD, "auth")
    assert isinstance(out, NormalizedRecord)
    secrets = ("alice@example.com", "hunter2", "bob@example.org", "s3cret")
    for secret in secrets:
        assert secret not in out.model_dump_json()
        assert all(secret not in s for s in miner.seen + counter.seen)
    assert miner.seen and counter.seen
    assert out.redactions.get("email") == 2
    assert out.redactions.get("password", 0) >= 2


def test_a_parser_exception_becomes_a_dead_letter(monkeypatch: pytest.MonkeyPatch) -> None:
    c = make()

    def explode(text: str, *, source: str | None = None, obj: object = None) -> None:
        raise RuntimeError("parser exploded on purpose")

    monkeypatch.setattr(c.parser, "parse", explode)
    out = c.clean_line(b"2024-01-01 10:00:00 INFO ok", COORD, "s")
    assert isinstance(out, DeadLetter)
    assert out.reason == "parse_error"
    assert "parser exploded on purpose" in out.detail


class BrokenMiner:
    def match(self, message: str) -> tuple[str, str]:
        raise ValueError("miner broke")


def test_a_failure_after_parsing_is_also_a_dead_letter() -> None:
    out = make(template_miner=BrokenMiner()).clean_line(b"INFO ok", COORD, "s")
    assert isinstance(out, DeadLetter)
    assert out.reason == "clean_error" and "miner broke" in out.detail


@pytest.mark.parametrize(
    "raw",
    [
        b"{" * 500,
        b'{"log": 5, "time": []}',
        b'{"ts": 1e308, "level": {}, "msg": ["x"]}',
        b"9999-12-31 23:59:59 -1400 INFO edge of time",
        b"0001-01-01 00:00:00 +1400 INFO start of time",
        b"<999>1 - - - - - -",
        b"\xef\xbb\xbf",
        b"[" * 100 + b"]" * 100,
        b"2024-01-01 10:00:00,123|||",
    ],
)
def test_odd_input_never_raises(cleaner: Cleaner, raw: bytes) -> None:
    out = cleaner.clean_line(raw, COORD, "s")
    assert isinstance(out, NormalizedRecord | DeadLetter)


def test_metrics_are_recorded() -> None:
    metrics = Metrics()
    c = make(metrics=metrics, max_record_bytes=64)
    c.clean_line(b"INFO mail alice@example.com", COORD, "s")
    c.clean_line(b"x" * 100, COORD, "s")

    def value(name: str, labels: dict[str, str]) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("retro_records_format_total", {"format": "text"}) == 1
    assert value("retro_redactions_total", {"kind": "email"}) == 1
    # dead letters are counted where they are delivered (streams/clean/step.py): the
    # series is there from the start, at 0
    assert value("retro_deadletter_total", {"stage": "clean", "reason": "too_large"}) == 0


def test_from_settings_maps_the_clean_group() -> None:
    settings = Settings(clean=CleanSettings(max_record_bytes=10, slow_cost_threshold=1.5))
    c = Cleaner.from_settings(settings)
    assert (c.max_record_bytes, c.slow_cost_threshold) == (10, 1.5)
    assert isinstance(c.clean_line(b"x" * 11, COORD, "s"), DeadLetter)


def test_run_clean_offline(tmp_path: Path) -> None:
    log = tmp_path / "HDFS_2k.log"
    log.write_bytes(
        b"081109 203615 148 INFO dfs.DataNode: one\n"
        b"081109 203616 148 WARN dfs.DataNode: two\n"
        b"081109 203617 148 INFO dfs.DataNode: caf\xe9\n"
    )
    out, dead, summary = io.StringIO(), io.StringIO(), io.StringIO()
    result = run_clean([str(log)], settings=Settings(), out=out, deadletter=dead, summary=summary)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    letters = [json.loads(line) for line in dead.getvalue().splitlines()]
    assert [r["raw"]["offset"] for r in records] == [0, 1]
    assert records[0]["raw"]["topic"] == str(log)
    assert {r["source"] for r in records} == {"HDFS_2k"}
    assert [d["raw"]["offset"] for d in letters] == [2]
    assert (result.records, result.deadletters) == (2, 1)
    assert result.by_format == {"text": 2}
    assert result.by_lane == {"fast": 2}
    assert result.by_reason == {"undecodable": 1}
    table = summary.getvalue()
    assert "text" in table and "undecodable" in table and "2 records, 1 dead letters" in table


def test_source_names() -> None:
    assert source_name("/x/HDFS_2k.log") == "HDFS_2k"
    assert source_name("a/app.log.gz") == "app"
    assert source_name("-") == "stdin"


def test_a_record_without_time_is_dated_by_its_arrival(cleaner: Cleaner) -> None:
    from datetime import UTC, datetime

    coord = RawCoord(topic="raw", partition=0, offset=9)
    arrived = datetime(2026, 11, 29, 8, 30, tzinfo=UTC)
    out = cleaner.clean_line(b"checkout page keeps spinning", coord, "feedback",
                             received_at=arrived)
    assert isinstance(out, NormalizedRecord)
    assert out.timestamp == "2026-11-29T08:30:00.000Z" and out.timestamp_rule == "ingest-time"
    own = cleaner.clean_line(b"2026-01-02T03:04:05Z INFO started", coord, "app",
                             received_at=arrived)
    assert isinstance(own, NormalizedRecord)
    assert own.timestamp.startswith("2026-01-02T03:04:05") and own.timestamp_rule != "ingest-time"


def test_lane_keys_keep_the_source_and_spread_but_not_its_secrets() -> None:
    c = make()
    key = b"postgres://svc:Pw0rd1x@db/app~2"
    lane = c.lane_key(key)
    assert b"Pw0rd1x" not in lane and lane.endswith(b"@db/app~2")
    assert c.lane_key(key) is lane  # cached: one redaction per source
    assert c.lane_key(b"app.log") == b"app.log"
