"""Coverage keys of multi-record messages and the coordinates that name them."""

from __future__ import annotations

import json

from streams.intervals import Coverage, message_key, split_message_key
from streams.records import RawCoord


def test_message_key_round_trips() -> None:
    key = message_key("otlp.logs-v1", 3, 1205, 500)
    assert key == "otlp.logs-v1/3@1205:500"
    assert split_message_key(key) == ("otlp.logs-v1/3", 1205, 500)
    assert split_message_key("otlp.logs-v1/3") is None


def test_single_record_coordinates_keep_todays_shape() -> None:
    coord = RawCoord(topic="retro.logs.raw", partition=2, offset=41)
    assert json.loads(coord.model_dump_json()) == {
        "topic": "retro.logs.raw", "partition": 2, "offset": 41}
    assert coord.id == "retro.logs.raw/2/41"
    assert coord.ledger_entry() == ("retro.logs.raw/2", 41)
    assert coord.in_message(0, 1) is coord


def test_records_of_one_message_share_one_key_and_one_range() -> None:
    base = RawCoord(topic="otlp", partition=0, offset=9)
    coords = [base.in_message(i, 4) for i in range(4)]
    assert coords[2].id == "otlp/0/9/2"
    assert json.loads(coords[2].model_dump_json())["index"] == 2
    assert RawCoord.model_validate_json(coords[2].model_dump_json()) == coords[2]
    cov = Coverage.from_entries(c.ledger_entry() for c in coords)
    assert cov.to_json() == {"otlp/0@9:4": [[0, 3]]}
    plain = Coverage.from_entries(
        RawCoord(topic="otlp", partition=0, offset=o).ledger_entry() for o in (10, 11, 12))
    assert cov.union(plain).to_json() == {"otlp/0": [[10, 12]], "otlp/0@9:4": [[0, 3]]}
