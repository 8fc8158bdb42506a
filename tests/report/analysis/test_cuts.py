"""A cause cut to one incident's services and minutes, and what is left of it."""

from __future__ import annotations

from streams.report.analysis.causes import Cause
from streams.report.analysis.cuts import CauseRecords, Minutes, cut, dated_by
from streams.report.state.model import Incident, Series, TemplateEvidence

TEMPLATE = "deadlock detected on orders"
DB = {"2026-11-29T09:05": 6, "2026-11-29T09:30": 8, "2026-11-29T09:31": 8}
BATCH = {"2026-11-29T09:31": 5}


def deadlocks() -> tuple[Cause, dict[str, Incident]]:
    """One cause of db's and batch's deadlocks: 27 records from 09:05 to 09:31."""
    minutes = {m: DB.get(m, 0) + BATCH.get(m, 0) for m in sorted({*DB, *BATCH})}
    incident = Incident(key="k1", event="Deadlock detected", cause="deadlocks",
                        severity="high", services=["db", "batch"], count=27,
                        evidence=[TemplateEvidence(template=TEMPLATE, count=27,
                                                   minutes=minutes)])
    cause = Cause("Deadlock detected", "failure", "high", 27, ["db", "batch"], ["k1"],
                  "2026-11-29T09:05:10.000Z", "2026-11-29T09:31:40.000Z", "deadlocks",
                  anomaly="new: first seen 09:05")
    return cause, {"k1": incident}


def around_09_30(until: str | None = None) -> Minutes:
    return Minutes("2026-11-29T09:29", "2026-11-29T09:30", until, tail_s=300)


def test_a_cause_is_cut_to_the_services_and_minutes_asked_and_the_rest_is_kept() -> None:
    cause, by_key = deadlocks()
    series = {"db": {TEMPLATE: Series(level="ERROR", minutes=DB,
                                      starts={"2026-11-29T09:30": "2026-11-29T09:30:07Z"})},
              "batch": {TEMPLATE: Series(level="ERROR", minutes=BATCH)}}
    found = cut(cause, {"db"}, around_09_30(), CauseRecords(by_key, series))
    assert found is not None
    part, rest = found
    # 09:31 follows within the tail: a failure winding down is still this one
    assert (part.count, part.services, part.first_seen, part.last_seen) == (
        16, ["db"], "2026-11-29T09:30:07Z", "2026-11-29T09:31:40.000Z")
    assert part.anomaly == ("new: first seen 09:05; 16 of its 27 records fall in this "
                            "incident's minutes")
    assert rest is not None
    assert (rest.count, rest.services, rest.first_seen, rest.last_seen) == (
        11, ["db", "batch"], "2026-11-29T09:05:10.000Z", "2026-11-29T09:31:40.000Z")
    # the rest, cut again, is what was left: batch's five, not db's records of 09:30
    records = CauseRecords(by_key, series)
    _, rest = cut(cause, {"db"}, around_09_30(), records) or (None, None)
    assert rest is not None
    at_09_31 = Minutes("2026-11-29T09:30", "2026-11-29T09:31", None, tail_s=300)
    again = cut(rest, {"batch"}, at_09_31, records)
    assert again is not None and again[0].count == 5 and again[0].services == ["batch"]
    assert cut(rest, {"db"}, around_09_30(), records) is None  # told already
    # nothing of it there: no part
    assert cut(cause, {"api"}, around_09_30(), CauseRecords(by_key, series)) is None


def test_the_tail_stops_at_the_next_incident() -> None:
    cause, by_key = deadlocks()
    series = {"db": {TEMPLATE: Series(level="ERROR", minutes=DB)}}
    found = cut(cause, {"db"}, around_09_30(until="2026-11-29T09:31"),
                CauseRecords(by_key, series))
    assert found is not None and found[0].count == 8


def test_without_series_of_its_templates_a_cause_is_cut_by_time_alone() -> None:
    """A model that named its templates otherwise: the series cannot tell the cause's
    services apart, so the part keeps them all."""
    cause, by_key = deadlocks()
    found = cut(cause, {"db"}, around_09_30(), CauseRecords(by_key, {}))
    assert found is not None
    part, rest = found
    assert (part.count, part.services) == (21, ["db", "batch"])
    assert rest is not None and (rest.count, rest.first_seen) == (6, cause.first_seen)


def test_a_cause_all_inside_is_returned_whole() -> None:
    cause, by_key = deadlocks()
    series = {"db": {TEMPLATE: Series(level="ERROR", minutes=DB)},
              "batch": {TEMPLATE: Series(level="ERROR", minutes=BATCH)}}
    whole = Minutes("2026-11-29T09:00", "2026-11-29T09:59", None, tail_s=300)
    assert cut(cause, {"db", "batch"}, whole, CauseRecords(by_key, series)) == (cause, None)


def test_a_cause_dated_by_its_burst_keeps_its_records_and_services() -> None:
    cause, _ = deadlocks()
    per = {"db": DB, "batch": BATCH}
    starts = {"2026-11-29T09:30": "2026-11-29T09:30:07Z"}
    dated = dated_by(cause, per, starts, "2026-11-29T09:30", "2026-11-29T09:31")
    assert (dated.first_seen, dated.last_seen, dated.count, dated.services) == (
        "2026-11-29T09:30:07Z", "2026-11-29T09:31:40.000Z", 27, ["db", "batch"])
