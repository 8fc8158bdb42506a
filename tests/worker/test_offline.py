"""`retro postmortem`: the steps in memory give the same incidents however batches are cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streams.batch.callees import same_service
from streams.cli import main
from streams.dev.faults import write_case
from streams.report.analysis.postmortem import derive
from streams.report.state.merge import compose
from streams.report.views.view import render_json
from streams.schemas import validator
from streams.settings import Settings
from streams.worker.offline import reports_of_files

from helpers import shared_file, write_requests

# the same records cut into batches of three and of hundreds, in both lanes
SMALL_BATCHES = Settings(fast={"max_records": 3}, slow={"max_records": 3})


def incidents_of(paths: list[str], settings: Settings) -> list[tuple[str, str, str, str]]:
    reports, _ = reports_of_files(paths, settings)
    return sorted((i.origin, i.started, i.ended, i.severity)
                  for r in reports for i in derive(r).incidents)


def test_batch_cuts_do_not_change_the_incidents(tmp_path: Path) -> None:
    case = write_case(tmp_path, "crash", 3)
    paths = [str(p) for p in case.files]
    default = incidents_of(paths, Settings())
    assert default, "the crash opens an incident"
    # these files name no service field: the cleaner takes the logger's name for one
    assert any(same_service(origin, case.truth.service) for origin, *_ in default)
    assert incidents_of(paths, SMALL_BATCHES) == default


def test_reports_split_in_shards_compose_to_the_same_incidents(tmp_path: Path) -> None:
    """Two workers each compact their share of a report; a reader composes the shares."""
    case = write_case(tmp_path, "crash", 4)
    halves = [[str(p) for p in case.files[::2]], [str(p) for p in case.files[1::2]]]
    whole, _ = reports_of_files([str(p) for p in case.files], Settings())
    shares = [reports_of_files(h, Settings())[0] for h in halves]
    by_id: dict[str, list] = {}
    for share in shares:
        for report in share:
            by_id.setdefault(report.id, []).append(report)
    composed = [compose(rid, parts) for rid, parts in sorted(by_id.items())]
    assert [[(i.origin, i.started) for i in derive(r).incidents] for r in composed] == [
        [(i.origin, i.started) for i in derive(r).incidents] for r in whole]


def test_postmortem_command_prints_incidents_whose_origins_are_services(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = write_case(tmp_path, "crash", 5)
    assert main(["postmortem", "--format", "json", *map(str, case.files)]) == 0
    doc = json.loads(capsys.readouterr().out)
    incidents = doc["postmortem"]["incidents"]
    assert incidents
    services = set(doc["series"])
    assert {i["origin"] for i in incidents} <= services
    assert doc["postmortem"]["title"]


def test_a_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["postmortem", str(tmp_path / "nope.log")])
    err = capsys.readouterr().err
    assert code == 66 and len(err.strip().splitlines()) == 1


def test_a_shared_fault_window_gives_the_same_incidents_in_any_batch_cut() -> None:
    path = shared_file("nezha-rca-dev",
                       "2023-01-29_0903_return_ts-basic-service.fluentbit.jsonl.gz")
    default = incidents_of([str(path)], Settings())
    assert default
    assert incidents_of([str(path)], SMALL_BATCHES) == default


def test_a_file_across_midnight_gives_each_day_the_day_before(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    log.write_text("".join(
        json.dumps({"time": f"2026-11-{day}T{hour}:{m:02d}:00Z", "level": "info",
                    "service": "api", "msg": "GET /orders done"}) + "\n"
        for day, hour in (("28", "23"), ("29", "00")) for m in range(0, 60, 20)))
    reports, _ = reports_of_files([str(log)], Settings())
    assert [r.id for r in reports] == ["2026-11-28/all", "2026-11-29/all"]
    assert reports[0].previous is None
    assert reports[1].previous is reports[0]


def test_a_seldom_called_service_slowed_a_hundredfold_is_named_from_its_traces_alone(
        tmp_path: Path) -> None:
    """No line says anything is wrong: geo's four calls a minute, each 150 times its
    usual, are judged against the tail all calls share, through the trace stage."""
    log = tmp_path / "requests.jsonl"
    write_requests(log, geo_slower=150)
    [report], _ = reports_of_files([str(log)], Settings())
    [incident] = derive(report).incidents
    assert (incident.origin, incident.title) == ("geo", "geo: calls into it slowed")
    assert incident.started == "2026-11-29T10:04:00Z"
    assert "took 64x its usual or longer" in incident.evidence[0].describe()
    # three times slower is no departure: the thresholds begin at 4x
    write_requests(log, geo_slower=3)
    [report], _ = reports_of_files([str(log)], Settings())
    assert derive(report).incidents == []


def test_a_callers_warning_is_linked_by_trace_to_the_slowed_service_it_called_last(
        tmp_path: Path) -> None:
    """web's warning names no service; the trace stage shows each warning request
    called geo last, so web is geo's caller, not an incident of its own."""
    log = tmp_path / "requests.jsonl"
    write_requests(log, geo_slower=150, late_warns=True)
    [report], _ = reports_of_files([str(log)], Settings())
    assert report.failed_calls == {"web": {"geo": {
        f"2026-11-29T10:{m:02d}": 4 for m in range(4, 10)}}}
    [incident] = derive(report).incidents
    assert (incident.origin, incident.callers) == ("geo", ["web"])
    assert incident.started == "2026-11-29T10:04:00Z"
    web = next(d for d in incident.evidence if d.service == "web")
    assert web.describe().endswith("; 8 of its 8 failed requests called geo last")
    # the JSON says so too, as the schema describes it
    doc = json.loads(render_json(report))
    validator("report").validate(doc)
    [told] = doc["postmortem"]["incidents"]
    assert [e.get("failed_after") for e in told["evidence"] if e["service"] == "web"] == [
        {"callee": "geo", "requests": 8, "traced": 8}]
    for ev in told["evidence"]:
        ev["failed_after"] = {"callee": "geo"}  # without its counts
    assert not validator("report").is_valid(doc)
