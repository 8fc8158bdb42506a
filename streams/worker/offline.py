"""`retro postmortem FILE...`: the pipeline's steps in memory, for a log file at hand.

The same reader, Cleaner, token-budget windows, answer validation, report placement
and merge as the worker, with the offline rules analyzer as the model, and no broker:
a file gives the reports the worker would compact from it (their incidents come from
the records' series, never from how batches were cut), in seconds.
"""

from __future__ import annotations

import functools

from streams.batch.answers import place_fragments, validate_answer
from streams.batch.prompt import payload_of
from streams.batch.window import Batch, TokenWindow
from streams.clean.cleaner import Cleaner
from streams.clean.offline import source_name
from streams.gateway.rules.analyzer import analyze
from streams.ingest.reader import iter_records, open_source
from streams.records import Coord, DeadLetter, Fragment, mark_of
from streams.report.state.hops import apply_hops
from streams.report.state.keys import link_windows, record_place
from streams.report.state.merge import merge_all
from streams.report.state.model import Report
from streams.settings import Settings
from streams.tokens import TokenCounter
from streams.traces.table import TraceTable, hop_updates

RULES_MODEL = "rules"


def reports_of_files(paths: list[str], settings: Settings) -> tuple[list[Report], int]:
    """The reports of ``paths`` (in id order) and how many records were dead-lettered.

    Coordinates are those of ``retro clean``: topic = the path as given, partition 0,
    offset = the record's number in its file.
    """
    cleaner = Cleaner.from_settings(settings)
    # the clean stage's counter, so a message's pieces it just counted are remembered
    # when its window costs the message quoted (the same encoding, and counts are exact)
    counter = cleaner.tokens
    windows = {lane: _window(lane, settings, counter) for lane in ("fast", "slow")}
    place = functools.partial(record_place, window=settings.report.window,
                              group_by=settings.report.group_by)
    prompt_version = settings.model.prompt_version
    by_report: dict[str, list[Fragment]] = {}

    def analyzed(batch: Batch) -> None:
        answer = analyze(payload_of(batch))
        fragments = validate_answer(batch, answer, model=RULES_MODEL,
                                    prompt_version=prompt_version)
        for fragment in place_fragments(fragments, batch.by_coord(), place):
            by_report.setdefault(fragment.report_id or "undated/all", []).append(fragment)

    traces = TraceTable()  # the whole input is at hand: every trace closes at the end
    marks = dead = 0
    cap = settings.clean.max_record_bytes
    with cleaner.tallied():  # one tally for the run, not a context per record
        for path in paths:
            source = source_name(path)
            with open_source(path) as stream:
                for offset, (_line, raw) in enumerate(iter_records(stream, max_record_bytes=cap)):
                    # as the worker: a msgspec coordinate and the record as a lane gives it
                    coord = Coord(path, 0, offset)
                    for cleaned in cleaner.clean_lane_records(raw, coord, source):
                        if isinstance(cleaned, DeadLetter):
                            dead += 1
                            continue
                        if (mark := mark_of(cleaned)) is not None:
                            marks += 1
                            traces.add(mark, ("traces", 0, marks), None, 0.0)
                        for batch in windows[cleaned.lane].add(cleaned):
                            analyzed(batch)
    for window in windows.values():
        if (batch := window.flush("drain")) is not None:
            analyzed(batch)
    reports = {report_id: merge_all(None, fragments, report_id=report_id,
                                    now=_latest(fragments))[0]
               for report_id, fragments in sorted(by_report.items())}
    for update in hop_updates(traces.flush(), place):
        report = reports.get(update.report_id)
        if report is not None:  # hops of a report without records: nothing to judge by
            reports[update.report_id] = apply_hops(report, [update],
                                                   now=report.updated_at or "")[0]
    link_windows(reports)
    return list(reports.values()), dead


def _window(lane: str, settings: Settings, counter: TokenCounter) -> TokenWindow:
    s = settings.lane(lane)  # type: ignore[arg-type]
    return TokenWindow(lane=lane, input_budget=s.input_budget,  # type: ignore[arg-type]
                       context_window=s.context_window, output_reserve=s.output_reserve,
                       max_records=s.max_records, max_wait_seconds=s.max_wait_seconds,
                       counter=counter)


def _latest(fragments: list[Fragment]) -> str | None:
    """The report's ``updated_at``: its newest record's time, so a file gives one output."""
    return max((f.window.end for f in fragments if f.window.end), default=None)
