"""The same incidents however batches are cut: one worker, two workers, in memory.

Incidents come from the baseline the report keeps (``Report.series``: every
template's records per minute per service), so they depend on every record being
counted once under a template its service's lines fold to, whichever worker mined it,
whichever batch carried it and whichever report shard compacted it. One file goes
through the real broker over four partitions, once with one worker and once with two
in one consumer group (each mines templates and cuts batches on its own, and the
reports are compacted in shards), and through ``retro postmortem``'s steps in memory:
each must give the same incidents (origin, start, end, severity), hops into services,
the call graph they show and the calls after which callers failed (``Report.hops``,
``Report.calls``, ``Report.failed_calls``, from the trace stage) included.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import pytest

from streams.report.analysis.postmortem import derive
from streams.report.state.model import Report
from streams.worker.offline import reports_of_files

from helpers import commits_catch_up, free_port, shared_file, write_requests

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PARTITIONS = 4
Incidents = list[tuple[str, str, str, str]]


def incidents_of(reports: list[Report]) -> Incidents:
    """Each report's incidents as (origin, started, ended, severity), in one order."""
    return sorted((i.origin, i.started, i.ended, i.severity)
                  for r in reports for i in derive(r).incidents)


def _cleaned(port: int) -> float:
    """Records a worker's clean stage consumed (its miner saw them), from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('retro_records_consumed_total{stage="clean"}'))


def _stable_members(p, groups: list[str]) -> bool:
    """Whether each of ``groups`` is stable with two members (each then holds partitions)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.protocol.admin import DescribeGroupsRequest_v2
    from aiokafka.protocol.api import Request

    from streams.kafka.connect import aiokafka_kwargs

    class Describe(Request[DescribeGroupsRequest_v2]):
        """DescribeGroups v2: aiokafka 0.14 decodes a v3 answer with the v2 schema and
        fails on every group that has members."""

        API_KEY = 15

        def __init__(self, group: str) -> None:
            self.group = group

        def build(self, request_struct_class: type[DescribeGroupsRequest_v2]
                  ) -> DescribeGroupsRequest_v2:
            return request_struct_class([self.group])

    async def described() -> list[tuple[str, int]]:
        admin = AIOKafkaAdminClient(**aiokafka_kwargs(p.settings()))
        await admin.start()
        try:
            out = []
            for group in groups:
                node = await admin.find_coordinator(group)
                response = await admin._send_request(Describe(group), node)
                out += [(g[2], len(g[5])) for g in response.groups]
            return out
        finally:
            await admin.close()

    found = asyncio.run(described())
    return len(found) == len(groups) and all(s == "Stable" and n == 2 for s, n in found)


def through_workers(p, paths: list[str], workers: int, wait_until
                    ) -> tuple[list[Report], int]:
    """The reports of ``paths`` produced over PARTITIONS partitions and compacted by
    ``workers`` workers of one group, once the audit is exact; and the dead letters."""
    from streams.app import ROLES, consumer_groups
    from streams.report.store import read_reports

    p.retro("topics")
    ports = [p.web_port] + [free_port() for _ in range(workers - 1)]
    for i, port in enumerate(ports):
        p.start_worker(RETRO_WEB_PORT=str(port), RETRO_STATE_DIR=str(p.state_dir / f"w{i}"))
    if workers > 1:  # every stage's partitions shared out before the first record
        groups = list(consumer_groups(p.settings(), ROLES))
        wait_until(lambda: _stable_members(p, groups), timeout=120, interval=1,
                   what=f"{workers} workers in each of {groups}")
    produced = p.retro("produce", "--quiet", "--spread", str(PARTITIONS), *paths)
    total = int(produced.stderr.decode().split("produced ")[1].split(" ")[0])
    audit = p.retro("audit", "--wait", "300", check=False, timeout=420)
    assert audit.stdout.strip(), audit.stderr.decode()[-3000:]
    result = json.loads(audit.stdout.decode())
    assert result["ok"] and result["raw_records"] == total, (result, p.worker_logs())
    cleaned = [_cleaned(port) for port in ports]
    assert all(cleaned), f"a worker cleaned nothing: {cleaned}"
    commits_catch_up(p)  # the traces' hops are in the reports too
    reports = asyncio.run(read_reports(p.settings()))
    return [reports[rid] for rid in sorted(reports)], result["dead_lettered"]


def _hop_diff(got: list[Report], want: list[Report]) -> list[tuple[str, str, str, int, int]]:
    out = []
    for g, w in zip(got, want, strict=True):
        for service in sorted(set(g.hops) | set(w.hops)):
            a, b = g.hops.get(service, {}), w.hops.get(service, {})
            for minute in sorted(set(a) | set(b)):
                for k in sorted(set(a.get(minute, {})) | set(b.get(minute, {}))):
                    x, y = a.get(minute, {}).get(k, 0), b.get(minute, {}).get(k, 0)
                    if x != y:
                        out.append((service, minute, k, x, y))
    return out[:40]


def _same_incidents(pipeline_factory, wait_until, paths: list[str], name: str) -> Incidents:
    pipelines = [pipeline_factory(RETRO_TOPICS__PARTITIONS=str(PARTITIONS)) for _ in (1, 2)]
    started = time.monotonic()
    memory, dead = reports_of_files(paths, pipelines[0].settings())
    expected = incidents_of(memory)
    assert expected, f"{name}: the in-memory run found no incident"
    assert any(r.hops for r in memory) and any(r.calls for r in memory), name
    took = {"memory": time.monotonic() - started}
    for workers, p in zip((1, 2), pipelines, strict=True):
        began = time.monotonic()
        reports, dead_lettered = through_workers(p, paths, workers, wait_until)
        took[f"{workers} worker(s)"] = time.monotonic() - began
        assert dead_lettered == dead
        assert [r.id for r in reports] == [r.id for r in memory]
        assert [r.record_count for r in reports] == [r.record_count for r in memory]
        assert incidents_of(reports) == expected, (
            f"{name}: {workers} worker(s) differ from the in-memory run")
        assert [r.hops for r in reports] == [r.hops for r in memory], (name, _hop_diff(
            reports, memory))
        assert [r.calls for r in reports] == [r.calls for r in memory], name
        assert [r.failed_calls for r in reports] == [r.failed_calls for r in memory], name
    print(f"{name}: {len(expected)} incidents alike in memory, 1 and 2 workers; "
          + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))
    return expected


def test_a_shared_fault_window_gives_the_same_incidents_on_one_and_two_workers(
        pipeline_factory, wait_until) -> None:
    path = shared_file("nezha-rca-dev",
                       "2023-01-29_0903_return_ts-basic-service.fluentbit.jsonl.gz")
    found = _same_incidents(pipeline_factory, wait_until, [str(path)], path.name)
    assert "ts-basic-service" in {origin for origin, *_ in found}


def test_a_generated_fault_gives_the_same_incidents_on_one_and_two_workers(
        pipeline_factory, wait_until, tmp_path: Path) -> None:
    """Runs without ../shared: a generated hour of five services, one of them crashing,
    and ten minutes of traced requests into a service that slows, its caller warning
    of the late answers (hops, the call graph and the failed calls come from the trace
    stage)."""
    from streams.batch.callees import same_service
    from streams.dev.faults import write_case

    case = write_case(tmp_path / "case", "crash", 3)
    requests = tmp_path / "requests.jsonl"
    write_requests(requests, geo_slower=150, late_warns=True)
    found = _same_incidents(pipeline_factory, wait_until,
                            [*(str(f) for f in case.files), str(requests)],
                            f"generated {case.truth.kind} and traced requests")
    assert any(same_service(origin, case.truth.service) for origin, *_ in found), found
    assert ("geo", "2026-11-29T10:04:00Z") in {(origin, started) for origin, started, *_ in found}
    # web's warnings are geo's, linked by the failed calls: no incident of web's own
    assert "web" not in {origin for origin, *_ in found}, found
