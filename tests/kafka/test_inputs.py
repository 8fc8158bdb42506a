"""Input topics as users have them: a list, a pattern, never the pipeline's own."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from streams.kafka.inputs import input_pattern, matching
from streams.settings import Settings

CLUSTER = ["otlp_logs", "app-logs", "logs.web", "logs.db", "weblogs.x", "retro.logs.raw",
           "retro.records.fast", "retro.fragments", "retro.traces",
           "retro-stream-reports-changelog", "__consumer_offsets"]


def test_a_comma_separated_list_is_the_inputs_and_the_first_is_produced_to() -> None:
    s = Settings(topics={"raw": " otlp_logs , app-logs"})
    assert s.topics.raw_topics == ["otlp_logs", "app-logs"]
    assert s.topics.produce_topic == "otlp_logs"
    assert matching(s, CLUSTER) == ["app-logs", "otlp_logs"]
    assert Settings().topics.raw_topics == ["retro.logs.raw"]


def test_a_pattern_adds_the_topics_it_matches_never_our_own() -> None:
    s = Settings(topics={"raw": "app-logs", "raw_pattern": r"^logs\..*"})
    assert matching(s, CLUSTER) == ["app-logs", "logs.db", "logs.web"]
    broad = Settings(topics={"raw_pattern": ".*"})
    assert matching(broad, CLUSTER) == ["app-logs", "logs.db", "logs.web", "otlp_logs",
                                        "retro.logs.raw", "weblogs.x"]
    # aiokafka applies the same regex with re.match
    assert re.compile(input_pattern(s)).match("logs.web")
    assert not re.compile(input_pattern(s)).match("retro.records.fast")


@pytest.mark.parametrize("topics", [{"raw": "a b"}, {"raw": ","}, {"raw_pattern": "("}])
def test_bad_topic_settings_are_refused(topics: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        Settings(topics=topics)


def test_envelope_overrides_per_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRO_CLEAN__ENVELOPE", "otlp_logs=otlp_proto, app-logs=plain")
    assert Settings().clean.envelope_overrides == {"otlp_logs": "otlp_proto",
                                                   "app-logs": "plain"}
    with pytest.raises(ValidationError, match="otlp_xml"):
        Settings(clean={"envelope": "otlp_logs=otlp_xml"})
