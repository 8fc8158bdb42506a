"""The readers' boundary: a broker's refusal is NotAuthorized, one line, whatever the
consumer call that met it (the readers themselves run on the real broker in
tests/integration/test_redrive_by_hand.py and test_secured_pipeline.py)."""

from __future__ import annotations

import logging

import pytest
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from streams.errors import NotAuthorized
from streams.kafka.readers import partition_of, refusals_raised


@pytest.mark.parametrize("refusal", [TopicAuthorizationFailedError("retro.review"),
                                     GroupAuthorizationFailedError("retro-stream-review")])
def test_a_refused_fetch_or_offset_call_is_not_authorized(refusal: Exception) -> None:
    with pytest.raises(NotAuthorized) as caught, refusals_raised("retro.review"):
        raise refusal
    assert "not authorized to read retro.review" in str(caught.value)
    assert caught.value.__cause__ is refusal and caught.value.exit_code == 77


def test_the_clients_warning_on_every_refused_fetch_is_held_back_while_reading(
        caplog: pytest.LogCaptureFixture) -> None:
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    with caplog.at_level(logging.WARNING), refusals_raised("retro.review"):
        fetcher.warning("Not authorized to read from topic %s.", "retro.review")
        fetcher.warning("Not authorized to read from topic %s.", "retro.reports")
    fetcher.warning("Not authorized to read from topic %s.", "retro.review")
    # a repeat limiter another test left on a root handler may note held-back repeats
    assert [r.getMessage().split(" [", 1)[0] for r in caplog.records] == [
        "Not authorized to read from topic retro.reports.",
        "Not authorized to read from topic retro.review."]  # once reading is over


def test_a_key_has_the_partition_the_producer_gives_it() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    for key in (b"2026-11-29/all", b"2026-11-30/api#3", b"x"):
        assert partition_of(key, 6) == DefaultPartitioner()(key, list(range(6)), list(range(6)))
