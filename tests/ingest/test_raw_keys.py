"""Raw message keys: the source, optionally spread over several partitions."""

from __future__ import annotations

from streams.ingest.raw_keys import raw_key, source_of_key


def test_plain_keys_are_the_source() -> None:
    assert raw_key("nginx", 41) == b"nginx"
    assert source_of_key(b"nginx") == "nginx"


def test_spread_keys_cycle_and_strip_back_to_the_source() -> None:
    keys = {raw_key("api", i, spread=4) for i in range(12)}
    assert keys == {b"api~0", b"api~1", b"api~2", b"api~3"}
    assert {source_of_key(k) for k in keys} == {"api"}


def test_a_tilde_in_a_real_source_name_survives() -> None:
    assert source_of_key(b"host~a") == "host~a"
    assert source_of_key(b"~3") == "~3"
    assert source_of_key(None) == "unknown"
