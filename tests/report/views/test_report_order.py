"""Several windows' reports: the most significant is read first, a quiet one is a line."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from itertools import count

from streams.cli import select_report
from streams.records import Evidence, Fragment, TimeWindow, count_minutes
from streams.report.state.merge import merge_all
from streams.report.state.model import Report
from streams.report.views.view import MAX_FULL_REPORTS, one_line, rank_reports, render_reports

from helpers import make_fragment

_offsets = count()


def at(day: int, minute: float) -> str:
    t = datetime(2026, 1, day, 9, 0, tzinfo=UTC) + timedelta(minutes=minute)
    return t.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def frag(day: int, event: str, *, minute: float, records: int, severity: str,
         service: str = "api") -> Fragment:
    first = next(_offsets) * 1_000_000
    return make_fragment(
        f"f{first}", {"raw/0": [[first, first + records - 1]]}, event=event,
        cause=f"{event.lower()} happened", service=service, severity=severity,
        timestamp=at(day, minute), window=TimeWindow(start=at(day, minute),
                                                     end=at(day, minute + 5)),
        record_count=records,
        evidence=[Evidence(template=event, count=records, examples=[event],
                           minutes=count_minutes([at(day, minute)] * records))])


def report(day: int, *incidents: tuple[str, int, str], routine: int = 500,
           rid: str | None = None) -> Report:
    """A window of ``routine`` routine records and the (event, records, severity) given."""
    frags = [frag(day, "Routine activity", minute=0, records=routine, severity="info")]
    frags += [frag(day, event, minute=10 + n, records=n_records, severity=sev,
                   service=f"svc{n}")
              for n, (event, n_records, sev) in enumerate(incidents)]
    got, _ = merge_all(None, frags, report_id=rid or f"2026-01-{day:02d}/all",
                       now="2026-02-01T00:00:00Z")
    return got


def test_the_heaviest_incident_comes_first_not_the_earliest_or_latest_day() -> None:
    small = report(2, ("Timeouts", 20, "medium"))
    big = report(1, ("Connection pool exhausted", 300, "critical"))
    quiet = report(3)
    ranked = rank_reports([small, quiet, big])
    assert [r.report.id for r in ranked] == ["2026-01-01/all", "2026-01-02/all",
                                             "2026-01-03/all"]
    assert [r.significant for r in ranked] == [True, True, False]
    assert ranked[0].weight > ranked[1].weight > ranked[2].weight == 0


def test_among_equals_the_latest_dated_window_comes_first() -> None:
    ranked = rank_reports([report(1), report(3), report(2), report(4, rid="undated/all")])
    assert [r.report.id for r in ranked] == ["2026-01-03/all", "2026-01-02/all",
                                             "2026-01-01/all", "undated/all"]


def test_a_quiet_window_is_one_line_with_its_record_count() -> None:
    quiet = rank_reports([report(29, routine=1234)])[0]
    assert one_line(quiet) == "2026-01-29/all: no incident (1,234 records)"
    loud = rank_reports([report(2, ("Timeouts", 20, "high"))])[0]
    assert re.fullmatch(r"2026-01-02/all: Timeouts in svc0 \(\w+, 20 records; .+\)", one_line(loud))


def test_several_windows_print_the_worst_in_full_first_and_quiet_ones_as_lines() -> None:
    reports = [report(1), report(2, ("Disk full", 40, "high")), report(3)]
    for plain in (False, True):
        text = render_reports(reports, plain=plain)
        assert text.startswith("# Post-mortem: Disk full")
        assert text.count("# Post-mortem:") == 1
        tail = text[text.index("# Other windows"):].splitlines()
        assert tail[2:] == ["- 2026-01-03/all: no incident (500 records)",
                            "- 2026-01-01/all: no incident (500 records)"]


def test_only_quiet_windows_are_lines_and_a_single_window_is_shown_in_full() -> None:
    text = render_reports([report(1), report(2)], plain=True)
    assert text.splitlines() == ["# No incident in 2 windows", "",
                                 "- 2026-01-02/all: no incident (500 records)",
                                 "- 2026-01-01/all: no incident (500 records)"]
    single = render_reports([report(1)], plain=True)
    assert single.startswith("# Post-mortem: No incident found") and "## Data coverage" in single


def test_at_most_a_few_post_mortems_in_full_the_rest_one_line_each() -> None:
    reports = [report(day, ("Timeouts", 10 * day, "high")) for day in range(1, 7)]
    text = render_reports(reports, plain=True)
    assert text.count("# Post-mortem:") == MAX_FULL_REPORTS
    lines = text[text.index("# Other windows"):].splitlines()[2:]
    assert [x.split(":")[0] for x in lines] == ["- 2026-01-03/all", "- 2026-01-02/all",
                                                "- 2026-01-01/all"]


def test_retro_report_in_one_document_picks_the_most_significant_window() -> None:
    reports = {r.id: r for r in (report(1, ("Disk full", 40, "high")), report(2))}
    assert select_report(reports, window=None, service=None).id == "2026-01-01/all"
    assert select_report(reports, window="2026-01-02", service=None).id == "2026-01-02/all"
