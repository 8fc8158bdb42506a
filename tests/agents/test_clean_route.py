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
