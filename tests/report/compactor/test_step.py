"""The compactor step merges a buffer at once, publishes each report once, is done on
delivery, and keeps, loads or forgets report state as partitions move."""

from __future__ import annotations

import asyncio

import pytest

from streams.batch.prompt import extract_payload
from streams.metrics import Metrics
from streams.report.compactor.step import CompactStep, ParsedReports, rollup_pass
from streams.report.state.model import Incident, Report, Series, TemplateEvidence
from streams.runtime.memory import MemoryRun, Part, Record
from streams.settings import KafkaSettings, ReportSettings, Settings
from tests.helpers import FakeClock, make_fragment, pool_and_disk_report

SETTINGS = Settings()
FRAGMENTS = SETTINGS.topics.fragments
P0, P1 = Part(FRAGMENTS, 0), Part(FRAGMENTS, 1)


class Reports:
    """The compacted reports topic as the step reads it back."""

    def __init__(self, stored: dict[str, tuple[bytes | None, int]] | None = None,
                 fail: bool = False) -> None:
        self.stored = stored or {}
        self.fail = fail
        self.reads: list[set[int]] = []

    async def read(self, partitions: set[int]) -> list[tuple[str, bytes | None, int]]:
        self.reads.append(partitions)
        if self.fail:
            raise ConnectionError("the broker went away while loading")
        return [(k, v, p) for k, (v, p) in self.stored.items() if p in partitions]


def fragment(partition: int, offset: int, fid: str, report: str, raw_offset: int) -> Record:
    body = make_fragment(fid, {"raw/0": [[raw_offset, raw_offset]]}, report_id=report)
    return Record(FRAGMENTS, partition, offset, report.encode(), body.model_dump_json().encode())


def reports_sent(run: MemoryRun) -> list[tuple[str, Report]]:
    return [((o.key or b"").decode(), Report.from_json(o.value or b""))
            for o in run.sent_to(SETTINGS.topics.reports)]


async def started(step: CompactStep, *parts: Part) -> MemoryRun:
    run = MemoryRun(step)
    await run.assign(*parts)
    return run


def test_a_buffer_publishes_each_report_once_and_is_done_after_delivery() -> None:
    async def scenario() -> MemoryRun:
        run = await started(CompactStep(SETTINGS, Metrics(), Reports()), P0, P1)
        await run.fetch(fragment(0, 0, "a", "day/all#0", 1), fragment(0, 1, "b", "day/all#0", 2),
                        fragment(1, 0, "c", "day/all#1", 3))
        await run.drain()
        # the next buffer merges into the state it keeps, not into an empty report
        await run.fetch(fragment(0, 2, "d", "day/all#0", 4))
        await run.drain()
        return run

    run = asyncio.run(scenario())
    sent = reports_sent(run)
    assert [(key, r.record_count) for key, r in sent] == [
        ("day/all#0", 2), ("day/all#1", 1), ("day/all#0", 3)]
    assert run.committed == {P0: 3, P1: 1}


def test_a_fragment_names_its_report_and_one_naming_none_is_parked() -> None:
    orphan = make_fragment("o", {"raw/0": [[9, 9]]})

    async def scenario() -> MemoryRun:
        run = await started(CompactStep(SETTINGS, Metrics(), Reports()), P0)
        keyed_elsewhere = fragment(0, 0, "a", "day/all", 1)
        await run.fetch(Record(FRAGMENTS, 0, 0, b"other/key", keyed_elsewhere.value),
                        Record(FRAGMENTS, 0, 1, None, orphan.model_dump_json().encode()))
        await run.drain()
        return run

    run = asyncio.run(scenario())
    assert [key for key, _ in reports_sent(run)] == ["day/all"]  # the fragment's, not the key
    (review,) = run.sent_to(SETTINGS.topics.review)
    assert review.key == b"r-o" and b"names no report" in (review.value or b"")
    assert run.committed == {P0: 2}


def test_a_failed_write_commits_nothing_and_stops_the_membership() -> None:
    async def scenario() -> MemoryRun:
        run = await started(CompactStep(SETTINGS, Metrics(), Reports()), P0)
        run.sink.refuse = True
        await run.fetch(fragment(0, 0, "a", "day/all", 1))
        with pytest.raises(Exception, match="refused"):
            await run.drain()
        return run

    run = asyncio.run(scenario())
    assert run.committed == {} and run.ctx.failed is not None


def test_a_rebalance_keeps_kept_partitions_loads_new_ones_and_forgets_the_rest() -> None:
    stored = Report(id="day/all#1", version=7).to_json().encode()
    source = Reports({"day/all#1": (stored, 1)})

    async def scenario() -> CompactStep:
        step = CompactStep(SETTINGS, Metrics(), source)
        run = await started(step, P0)
        await run.fetch(fragment(0, 0, "a", "day/all#0", 1))
        await run.drain()
        await run.assign(P0, P1)  # partition 1 arrives: only it is read
        assert source.reads == [{0}, {1}]
        assert set(step.reports) == {"day/all#0", "day/all#1"}
        await run.assign(P1)  # partition 0 went to another worker
        return step

    step = asyncio.run(scenario())
    assert set(step.reports) == {"day/all#1"}


def test_partitions_whose_reports_did_not_load_are_not_merged() -> None:
    async def scenario() -> MemoryRun:
        step = CompactStep(SETTINGS, Metrics(), Reports(fail=True))
        run = MemoryRun(step)
        with pytest.raises(ConnectionError):  # the runtime then rejoins the group
            await run.assign(P0)
        await run.fetch(fragment(0, 0, "a", "day/all#0", 1))
        await run.drain()
        return run

    run = asyncio.run(scenario())
    # an empty state would have written the report without its past: read again instead
    assert run.sent == [] and run.committed == {}
    assert run.source.seeks == [(P0, 0)]


def test_nothing_is_written_between_a_revocation_and_the_next_assignment() -> None:
    async def scenario() -> MemoryRun:
        step = CompactStep(SETTINGS, Metrics(), Reports())
        run = await started(step, P0)
        await run.fetch(fragment(0, 0, "a", "day/all#0", 1))
        await step.revoked({P0}, run.ctx)  # publishes what is buffered first
        assert len(run.sent) == 1
        await run.fetch(fragment(0, 1, "b", "day/all#0", 2))  # left over from a fetch
        await step.flush(run.ctx)
        assert len(run.sent) == 1
        await run.assign(P0)  # kept
        await step.flush(run.ctx)
        return run

    run = asyncio.run(scenario())
    assert [r.record_count for _, r in reports_sent(run)] == [1, 2]


def test_a_partition_fetched_while_its_reports_load_is_read_again_once_loaded() -> None:
    async def scenario() -> MemoryRun:
        step = CompactStep(SETTINGS, Metrics(), Reports())
        run = await started(step, P0)
        run.source.assigned.add(P1)  # assigned; its reports are still loading
        await run.fetch(fragment(0, 0, "a", "day/all#0", 1), fragment(1, 7, "b", "day/all#1", 2))
        await run.drain()
        assert run.source.seeks == [(P1, 7)]  # fetched again, not dropped
        await run.assign(P0, P1)
        await run.fetch(fragment(1, 7, "b", "day/all#1", 2), fragment(1, 8, "c", "day/all#1", 3))
        await run.drain()
        return run

    run = asyncio.run(scenario())
    assert run.committed == {P0: 1, P1: 9}
    assert reports_sent(run)[-1][1].record_count == 2


def test_a_buffer_is_published_when_due_or_full() -> None:
    clock = FakeClock()
    settings = Settings(report=ReportSettings(publish_seconds=5, publish_max_fragments=3))

    async def scenario() -> MemoryRun:
        run = await started(CompactStep(settings, Metrics(), Reports(), clock=clock), P0)
        await run.fetch(fragment(0, 0, "a", "day/all", 1))
        assert run.sent == []
        clock.advance(5)
        await run.tick()
        assert len(run.sent) == 1
        await run.fetch(*(fragment(0, i, f"f{i}", "day/all", 10 + i) for i in (1, 2, 3)))
        return run

    run = asyncio.run(scenario())
    assert len(run.sent) == 2 and run.committed == {P0: 4}


def test_the_rollups_run_every_rollup_seconds_of_the_clock_given() -> None:
    """The roll-up timer waits with the step's sleep: three intervals of the fake clock
    are three passes, each asking one summary per incident that changed since its last
    and sending it to the fragments topic, to be merged like a fragment."""
    report = pool_and_disk_report()
    settings = Settings(report=ReportSettings(rollup_seconds=60))
    clock = FakeClock(until=180)
    asked: list[list[dict]] = []

    class Summaries:
        async def summarize(self, messages: list[dict], **_: object) -> tuple[str, None]:
            asked.append(messages)
            return "Disk filled up.", None

    async def scenario() -> MemoryRun:
        reports = Reports({report.id: (report.to_json().encode(), 0)})
        step = CompactStep(settings, Metrics(), reports, gateway=Summaries(),  # type: ignore[arg-type]
                           clock=clock, sleep=clock.sleep)
        run = await started(step, P0)
        [timer] = step.background(run.ctx)
        task = asyncio.create_task(timer)
        await asyncio.wait_for(clock.reached.wait(), timeout=10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await run.settle()
        return run

    run = asyncio.run(scenario())
    assert clock.slept == [60, 60, 60]
    assert len(report.incidents) > 0
    assert len(asked) == len(run.sent_to(FRAGMENTS)) == 3 * len(report.incidents)


def test_a_rollup_judges_a_days_first_minutes_against_the_day_before() -> None:
    """A line failing since yesterday evening is chronic at 00:03, not unknown: the pass
    reads the report of the window before, as the views do."""
    def day(rid: str, minutes: list[str]) -> Report:
        return Report(id=rid, series={"api": {
            "GET /orders done": Series(level="INFO", minutes=dict.fromkeys(minutes, 80)),
            "payment call failed": Series(level="ERROR", minutes=dict.fromkeys(minutes, 6))}})

    yesterday = day("2026-11-28/all", [f"2026-11-28T23:{m:02d}" for m in range(60)])
    today = day("2026-11-29/all", [f"2026-11-29T00:{m:02d}" for m in range(4)])
    today.incidents = [Incident(
        key="pay", event="Payment call failures", cause="payment calls fail", severity="high",
        services=["api"], first_seen="2026-11-29T00:00:00Z", last_seen="2026-11-29T00:03:59Z",
        count=24, evidence=[TemplateEvidence(template="payment call failed", count=24)])]

    def verdict(window_before: dict[str, Report] | None) -> str:
        asked: list[list[dict]] = []

        class Summaries:
            async def summarize(self, messages: list[dict], **_: object) -> tuple[str, None]:
                asked.append(messages)
                return "Payments fail.", None

        async def sent(report_id: str, value: bytes) -> None:
            pass

        asyncio.run(rollup_pass(
            [(today.id, today.to_json())], ParsedReports(), Summaries(),  # type: ignore[arg-type]
            SETTINGS, sent, None if window_before is None else window_before.get))
        [template] = extract_payload(asked[0])["incident"]["templates"]
        [said] = template["baseline"]
        return said["verdict"]

    assert verdict({today.id: yesterday}) == "chronic"
    assert verdict(None) == "unknown"  # without it the log only began at midnight
    assert verdict({}) == "unknown"  # nor while the day before is not read yet


def test_a_long_publish_interval_is_not_taken_for_a_held_fragment() -> None:
    def held_after(settings: Settings) -> float:
        return CompactStep(settings, Metrics(), Reports()).held_seconds

    assert held_after(SETTINGS) == SETTINGS.kafka.reread_held_seconds
    assert held_after(Settings(report=ReportSettings(publish_seconds=30))) == 120
    assert held_after(Settings(kafka=KafkaSettings(reread_held_seconds=0))) == 0


def test_a_cached_report_is_reused_only_for_the_same_stored_string() -> None:
    cache = ParsedReports(size=2)
    stored = Report(id="d/all", version=3).to_json()
    first = cache.get("d/all", stored)
    assert first is not None and first.version == 3
    assert cache.get("d/all", stored) is first
    # the step now holds another string (a reload, another worker): parse again
    assert cache.get("d/all", Report(id="d/all", version=4).to_json()).version == 4
    assert cache.get("d/all", None) is None


def test_the_cache_is_bounded() -> None:
    cache = ParsedReports(size=2)
    texts = {rid: Report(id=rid).to_json() for rid in ("a/all", "b/all", "c/all")}
    reports = {rid: cache.get(rid, text) for rid, text in texts.items()}
    assert len(cache._items) == 2
    assert cache.get("a/all", texts["a/all"]) is not reports["a/all"]  # evicted, re-parsed
    assert cache.get("c/all", texts["c/all"]) is reports["c/all"]
