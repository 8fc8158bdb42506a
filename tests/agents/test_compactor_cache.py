"""The compactor loop's parsed-report cache trusts only the exact stored string."""

from __future__ import annotations

from streams.agents.compactor import ParsedReports
from streams.report.model import Report


def test_a_cached_report_is_reused_only_for_the_same_stored_string() -> None:
    cache = ParsedReports(size=2)
    stored = Report(id="d/all", version=3).to_json()
    first = cache.get("d/all", stored)
    assert first is not None and first.version == 3
    assert cache.get("d/all", stored) is first
    # the loop now holds another string (a reload, another worker): parse again
    replaced = Report(id="d/all", version=4).to_json()
    assert cache.get("d/all", replaced).version == 4
    assert cache.get("d/all", None) is None


def test_the_cache_is_bounded() -> None:
    cache = ParsedReports(size=2)
    texts = {rid: Report(id=rid).to_json() for rid in ("a/all", "b/all", "c/all")}
    reports = {rid: cache.get(rid, text) for rid, text in texts.items()}
    assert len(cache._items) == 2
    assert cache.get("a/all", texts["a/all"]) is not reports["a/all"]  # evicted, re-parsed
    assert cache.get("c/all", texts["c/all"]) is reports["c/all"]


def test_forgetting_a_partition_drops_its_unacked_records() -> None:
    from streams.kafka.acks import OrderedAcker

    acked: list[str] = []
    acker = OrderedAcker(acked.append)
    old = [acker.track("p1", f"old{i}") for i in range(3)]
    acker.done(old[1])
    acker.forget("p1")  # revoked: none of the old ones may be acked now
    for handle in old:
        acker.done(handle)
    assert acked == []
    new = acker.track("p1", "new0")  # the partition came back: a fresh queue
    acker.done(new)
    assert acked == ["new0"]
