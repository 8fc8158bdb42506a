"""The trace stage's step in memory: marks in, hops out once a trace is complete, and
its marks committed only once those are delivered."""

from __future__ import annotations

from streams.metrics import Metrics
from streams.records import HOPS_KIND, KIND_HEADER, Coord, HopsUpdate, TraceMark
from streams.runtime.memory import MemoryRun, Part, Record
from streams.settings import Settings
from streams.traces.step import TraceStep
from streams.traces.table import hop_bin
from tests.helpers import FakeClock

P0 = Part("retro.traces", 0)


def mark(trace: str, service: str, ms: int, offset: int, *, failing: bool = False) -> bytes:
    from msgspec.json import encode

    return encode(TraceMark(trace, f"logs/0/{offset}", service, f"{service}.log",
                            f"2026-11-29T10:00:{ms // 1000:02d}.{ms % 1000:03d}Z",
                            Coord("logs", 0, offset), failing))


def at(offset: int, value: bytes) -> Record:
    return Record(P0.topic, P0.partition, offset, key=b"t", value=value)


def run_with_clock(metrics: Metrics | None = None) -> tuple[MemoryRun, FakeClock]:
    clock = FakeClock(100.0)
    step = TraceStep(Settings(), metrics or Metrics(), lambda m: "2026-11-29/all", clock=clock)
    return MemoryRun(step, [P0]), clock


async def test_a_complete_trace_goes_to_its_report_and_then_its_marks_commit() -> None:
    metrics = Metrics()
    run, clock = run_with_clock(metrics)
    await run.fetch(at(0, mark("t1", "gateway", 0, 1)), at(1, mark("t1", "orders", 9, 2)),
                    at(2, b"not a mark"))
    assert run.sent == [] and P0 not in run.committed  # t1 may get more lines
    clock.now += 6  # no line of it for longer than the hold; the input is idle too
    clock.now += 30
    await run.tick()
    [out] = run.sent_to("retro.fragments")
    assert out.key == b"2026-11-29/all" and out.headers == ((KIND_HEADER, HOPS_KIND.encode()),)
    update = HopsUpdate.model_validate_json(out.value)
    assert [t.hops for t in update.traces] == [[("orders", "2026-11-29T10:00", hop_bin(9),
                                                 "gateway")]]
    assert update.traces[0].covered == {"retro.traces/0": [[0, 1]]}
    assert run.committed[P0] == 3  # the bad mark is skipped, never holding the partition
    await run.fetch(at(3, mark("t1", "stock", 30, 3)))  # t1 was sent: a line too late
    assert run.committed[P0] == 4 and len(run.sent) == 1
    marks = {o: metrics.registry.get_sample_value("retro_trace_marks_total", {"outcome": o})
             for o in ("timed", "late", "unreadable")}
    assert marks == {"timed": 2, "late": 1, "unreadable": 1}


async def test_an_open_trace_holds_the_commit_and_is_read_again_after_a_rebalance() -> None:
    run, clock = run_with_clock()
    await run.fetch(at(0, mark("t1", "gateway", 0, 1)), at(1, mark("t2", "gateway", 50, 2)),
                    at(2, mark("t2", "orders", 70, 3)))
    clock.now += 40
    # t1 goes on (it stays open) and the input has moved 45 s on: t2 is complete
    await run.fetch(at(3, mark("t1", "orders", 20, 4)), at(4, mark("t3", "gateway", 45_000, 5)))
    [out] = run.sent
    assert [t.hops[0][0] for t in HopsUpdate.model_validate_json(out.value).traces] == ["orders"]
    assert P0 not in run.committed  # t2 was sent, but t1's first mark is still open
    # a rebalance lets t1 go: the partition is read again from its commit (offset 0)
    await run.step.revoked({P0}, run.ctx)
    await run.assign(P0)
    assert run.step.tables == {}
    await run.fetch(*(at(i, v) for i, v in enumerate([
        mark("t1", "gateway", 0, 1), mark("t2", "gateway", 50, 2), mark("t2", "orders", 70, 3),
        mark("t1", "orders", 20, 4), mark("t3", "gateway", 45_000, 5)])))
    clock.now += 40
    await run.tick()
    assert run.committed[P0] == 5  # t2 is sent again (its report skips it), t1 and t3 now
    sent = [HopsUpdate.model_validate_json(o.value).traces for o in run.sent]
    assert sorted(str(t.covered) for update in sent for t in update) == [
        "{'retro.traces/0': [[0, 0], [3, 3]]}", "{'retro.traces/0': [[1, 2]]}",
        "{'retro.traces/0': [[1, 2]]}"]


async def test_a_failed_call_goes_out_with_the_hops_and_a_bad_failing_flag_is_unreadable(
) -> None:
    metrics = Metrics()
    run, clock = run_with_clock(metrics)
    hostile = mark("t1", "gateway", 60, 4).replace(b'"failing":false', b'"failing":"yes"')
    await run.fetch(at(0, mark("t1", "gateway", 0, 1)), at(1, mark("t1", "orders", 9, 2)),
                    at(2, mark("t1", "gateway", 50, 3, failing=True)), at(3, hostile))
    clock.now += 36
    await run.tick()
    [out] = run.sent_to("retro.fragments")
    [trace] = HopsUpdate.model_validate_json(out.value).traces
    assert trace.failed == [("gateway", "orders", "2026-11-29T10:00")]
    assert run.committed[P0] == 4  # the hostile mark is skipped, never holding the partition
    assert metrics.registry.get_sample_value("retro_trace_marks_total",
                                             {"outcome": "unreadable"}) == 1

