"""route(): one Routed per log record of a message, each under its own coordinate."""

from __future__ import annotations

import json

from streams.agents.clean import route
from streams.clean.cleaner import Cleaner
from streams.settings import Settings

from helpers import otlp_logs


def test_an_otlp_message_routes_every_record_and_a_line_routes_one() -> None:
    cleaner = Cleaner.from_settings(Settings())
    raw = otlp_logs([{"body": f"2017-12-01 06:33:0{i} ERROR boom {i}"} for i in range(3)],
                    resource={"service.name": "checkout"})
    routed = route(cleaner, value=raw, key=None, topic="otlp", partition=2, offset=5,
                   timestamp_ms=1_700_000_000_000)
    assert [r.lane for r in routed] == ["fast"] * 3
    docs = [json.loads(r.value) for r in routed]
    assert [d["id"] for d in docs] == ["otlp/2/5/0", "otlp/2/5/1", "otlp/2/5/2"]
    assert {r.key for r in routed} == {b"checkout"}  # no Kafka key: the envelope's stream
    (line,) = route(cleaner, value=b"2017-12-01 06:33:04 INFO ok", key=b"app.log",
                    topic="raw", partition=0, offset=9, timestamp_ms=None)
    assert json.loads(line.value)["raw"] == {"topic": "raw", "partition": 0, "offset": 9}
    assert line.key == b"app.log"


class _AgentRecorder:
    """Records the topics a faust agent is declared on (wire_clean's only use of the app)."""

    def __init__(self) -> None:
        self.topics: list[object] = []

    def agent(self, topic: object, **_: object):
        self.topics.append(topic)
        return lambda fn: fn


def test_the_faust_engine_says_in_one_line_that_it_ignores_the_pattern(caplog) -> None:
    from streams.agents.clean import wire_clean
    from streams.metrics import Metrics

    settings = Settings(clean={"engine": "faust"},
                        topics={"raw": "a,b", "raw_pattern": r"^logs\..*"})
    app = _AgentRecorder()
    with caplog.at_level("WARNING", logger="streams.agents.clean"):
        wire_clean(app, settings, Metrics(), {"raw": "raw-topics", "fast": 1, "slow": 2,
                                              "deadletter": 3})
    assert app.topics == ["raw-topics"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "RETRO_TOPICS__RAW_PATTERN" in lines[0], lines
