"""The report follower keeps the latest bytes per report and decodes on request."""

from __future__ import annotations

from streams.report.state.model import Report
from streams.report.store import LatestReports


def _bytes(rid: str, version: int) -> bytes:
    return Report(id=rid, version=version).to_json().encode()


def test_only_the_latest_version_is_kept_and_decoded_lazily(monkeypatch) -> None:
    decoded: list[int] = []
    original = Report.from_json

    def counting(data):  # type: ignore[no-untyped-def]
        report = original(data)
        decoded.append(report.version)
        return report

    monkeypatch.setattr(Report, "from_json", staticmethod(counting))
    latest = LatestReports()
    for version in range(1, 50):
        assert latest.put(b"2026-11-29/all", _bytes("2026-11-29/all", version))
    latest.put(b"2026-11-30/all", _bytes("2026-11-30/all", 3))
    assert decoded == [] and len(latest) == 2
    assert latest.get("2026-11-29/all").version == 49
    assert latest.get("2026-11-29/all").version == 49  # cached: decoded once
    assert decoded == [49]
    assert sorted(r.version for r in latest.values()) == [3, 49]
    latest.put(b"2026-11-30/all", _bytes("2026-11-30/all", 4))  # a newer version replaces
    assert latest.get("2026-11-30/all").version == 4


def test_tombstones_keyless_and_unreadable_messages_are_skipped() -> None:
    latest = LatestReports()
    assert not latest.put(None, b"{}")
    assert not latest.put(b"x/all", None)
    assert latest.put(b"x/all", b"not json")
    assert latest.get("x/all") is None and latest.values() == []
    assert latest.get("missing/all") is None


def test_readers_see_a_report_composed_from_its_shares() -> None:
    from streams.records import Evidence, Fragment, TimeWindow
    from streams.report.state.merge import merge

    def share(n: int) -> bytes:
        key = f"2026-11-29/all#{n}"
        fragment = Fragment(
            id=f"f-{n}", lane="fast", window=TimeWindow(), service="api", event="Timeouts",
            cause="Slow db", suggestion="Add an index", severity="high",
            evidence=[Evidence(template="timeout <*>", count=n + 1)],
            covered={f"raw/{n}": [[0, n]]}, record_count=n + 1, model="m", prompt_version="v1")
        report, _ = merge(None, fragment, report_id=key, now="t")
        return report.to_json().encode()

    latest = LatestReports()
    for n in range(3):
        latest.put(f"2026-11-29/all#{n}".encode(), share(n))
    (report,) = latest.values()
    assert report.id == "2026-11-29/all" and report.record_count == 6
    assert report.incidents[0].count == 6 and len(latest.shards()) == 3
    assert latest.get("2026-11-29/all").record_count == 6


def test_a_report_knows_the_report_of_its_window_before() -> None:
    latest = LatestReports()
    for rid in ("2026-11-28/all", "2026-11-29/all", "2026-11-29/other", "undated/all"):
        latest.put(rid.encode(), _bytes(rid, 1))
    assert latest.get("2026-11-29/all").previous.id == "2026-11-28/all"
    assert latest.get("2026-11-28/all").previous is None
    assert latest.get("2026-11-29/other").previous is None  # another group's days
    assert latest.get("undated/all").previous is None


def test_a_share_continues_the_same_share_of_the_window_before() -> None:
    latest = LatestReports()
    for key in ("2026-11-28/all#1", "2026-11-29/all#0", "2026-11-29/all#1", "2026-11-28/db"):
        latest.put(key.encode(), _bytes(key, 1))
    assert latest.share_before("2026-11-29/all#1").id == "2026-11-28/all#1"
    assert latest.share_before("2026-11-29/all#0") is None  # yesterday had no share 0
    assert latest.share_before("2026-11-28/all#1") is None
    latest.put(b"2026-11-29/db", _bytes("2026-11-29/db", 1))
    assert latest.share_before("2026-11-29/db").id == "2026-11-28/db"


def test_a_sharded_report_is_composed_again_only_when_a_share_changed() -> None:
    latest = LatestReports()
    latest.put(b"2026-11-29/all#0", _bytes("2026-11-29/all#0", 1))
    latest.put(b"2026-11-29/all#1", _bytes("2026-11-29/all#1", 1))
    first = latest.get("2026-11-29/all")
    assert first is not None and first.id == "2026-11-29/all"
    assert latest.get("2026-11-29/all") is first  # nothing new: the same composition
    latest.put(b"2026-11-29/all#1", _bytes("2026-11-29/all#1", 2))
    assert latest.get("2026-11-29/all") is not first
