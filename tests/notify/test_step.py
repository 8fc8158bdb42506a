"""The notifier step: a change is recorded before it is sent, sent once, and a member that
restarts or takes a partition over knows what was said."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from streams.metrics import Metrics
from streams.notify.ledger import Notices
from streams.notify.sinks import MAX_WAIT, HandlerTransport, Reply, Sink
from streams.notify.step import NotifyStep
from streams.report.state.model import Report
from streams.runtime.memory import MemoryRun, MemorySink, Part
from streams.runtime.step import Out
from streams.settings import Settings
from tests.helpers import FakeClock
from tests.notify.days import RID, day_report, minutes

SETTINGS = Settings(notify={"webhook_url": "http://hook.example/x",
                            "alertmanager_url": "http://am.example:9093",
                            "end_after_seconds": 0, "refresh_seconds": 60})
TOPIC = SETTINGS.topics.notifications
P0 = Part(TOPIC, 0)
REFUSED = "connection refused by <*>"


def incident_report() -> Report:
    """db failing since 10:40 and two callers failing on it: one critical incident."""
    return day_report(
        errors=[("db", REFUSED, minutes(40, 44))], until=46,
        callers=[("checkout", "payment failed calling db <*>", "db", minutes(41, 44, 8)),
                 ("api", "orders failed: db unreachable <*>", "db", minutes(41, 44, 8))])


class Reports:
    def __init__(self, *reports: Report) -> None:
        self.held = {r.id: r for r in reports}

    def ids(self) -> list[str]:
        return sorted(self.held)

    def get(self, report_id: str) -> Report | None:
        return self.held.get(report_id)


class Ledgers:
    def __init__(self, stored: dict[str, bytes] | None = None) -> None:
        self.stored = stored or {}

    async def read(self, partitions: set[int]) -> list[tuple[str, bytes | None, int]]:
        return [(rid, value, 0) for rid, value in self.stored.items() if 0 in partitions]


class Receiver(HandlerTransport):
    """What a sink's endpoint received; ``gate`` holds answers back while cleared."""

    def __init__(self, status: int | Exception = 200) -> None:
        super().__init__(self.answer)
        self.status = status
        self.got: list[Any] = []  # the payloads it took
        self.gate = asyncio.Event()
        self.gate.set()

    async def answer(self, url: str, payload: Any) -> Reply:
        await self.gate.wait()
        if isinstance(self.status, Exception):
            raise self.status
        self.got.append(payload)
        return Reply(self.status)


def make_step(reports: Reports, hook: Receiver, am: Receiver, *, stored: Ledgers | None = None,
              home: int = 0, settings: Settings = SETTINGS, clock: FakeClock | None = None,
              metrics: Metrics | None = None) -> NotifyStep:
    metrics = metrics or Metrics()
    clock = clock or FakeClock()
    sinks = [Sink("alertmanager", ["http://am.example:9093/api/v2/alerts"], metrics,
                  transport=am, attempts=1),
             Sink("webhook", ["http://hook.example/x"], metrics, transport=hook, attempts=1)]
    return NotifyStep(settings, metrics, reports=reports, source=stored or Ledgers(),
                      sinks=sinks, partition_of=lambda key, count: home,
                      mono=clock, sleep=clock.sleep,
                      wall=lambda: datetime(2026, 12, 1, 8, 0, tzinfo=UTC))


async def running(step: NotifyStep) -> tuple[MemoryRun, list[asyncio.Task[None]]]:
    run = MemoryRun(step)
    run.source.partitions[TOPIC] = 1
    await run.assign(P0)
    return run, [asyncio.create_task(c) for c in step.senders(run.ctx)]


def planning_task(step: NotifyStep, run: MemoryRun) -> asyncio.Task[None]:
    """The planning loop as the worker runs it (the senders run from ``running``)."""
    planning, *senders = step.background(run.ctx)
    for sender in senders:
        sender.close()
    return asyncio.create_task(planning)


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(1000):  # 10 s: a loaded machine is slow, a passing test is not
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def settled(step: NotifyStep) -> None:
    """Until every send queued so far is done and recorded: whatever was to be sent
    has been, so what has not been sent will not be."""
    await until(lambda: all(q.empty() for q in step._queues.values())
                and all(idle.is_set() for idle in step._idle.values()), "the queued sends")


def ledgers(run: MemoryRun) -> list[Notices]:
    return [Notices.from_bytes(o.value or b"") for o in run.sent_to(TOPIC)]


async def stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_an_incident_is_recorded_then_sent_once_to_each_sink() -> None:
    hook, am = Receiver(), Receiver()
    step = make_step(Reports(incident_report()), hook, am)
    run, tasks = await running(step)
    await step.plan(run.ctx)
    first = ledgers(run)[0]  # the decision is on the topic before anything is sent
    assert [(e.id, [c.kind for c in e.changes], e.delivered) for e in first.entries] == [
        (first.entries[0].id, ["opened"], {})]
    await until(lambda: len(hook.got) == 1 and len(am.got) == 1, "both sinks")
    await until(lambda: ledgers(run)[-1].entries[0].delivered == {"webhook": 1,
                                                                  "alertmanager": 1},
                "the deliveries recorded")
    assert hook.got[0]["text"].startswith("[retro] Incident opened (critical): db")
    [alert] = am.got[0]
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["report"] == RID
    for _ in range(3):  # the same version read again says nothing new
        await step.plan(run.ctx)
    await settled(step)
    assert len(hook.got) == 1 and len(am.got) == 1
    await stop(tasks)


async def test_rounds_over_minutes_send_the_webhook_once_and_refresh_alertmanager() -> None:
    """The planning loop as the worker runs it, a round a tick on the fake clock: five
    minutes of rounds post the open incident to Alertmanager once a minute (its alerts
    expire otherwise), and the chat hears of it once."""
    hook, am, clock = Receiver(), Receiver(), FakeClock(until=300)
    step = make_step(Reports(incident_report()), hook, am, clock=clock)
    run, tasks = await running(step)
    tasks.append(planning_task(step, run))
    await asyncio.wait_for(clock.reached.wait(), timeout=10)
    await settled(step)
    assert clock.slept == [step.tick_seconds] * 300  # a round a tick, the last at 300 s
    assert len(hook.got) == 1
    assert len(am.got) == 1 + 300 // SETTINGS.notify.refresh_seconds
    await stop(tasks)


async def test_a_report_that_keeps_changing_is_planned_a_fifth_of_a_tick_apart() -> None:
    """In the worker the store tells the loop of every new version: a page waits for the
    next round, which comes ``round_seconds`` after the last one began, not a tick."""
    clock = FakeClock(until=10)
    step = make_step(Reports(incident_report()), Receiver(), Receiver(), clock=clock)
    step.changed = AlwaysChanged()
    run, tasks = await running(step)
    tasks.append(planning_task(step, run))
    await asyncio.wait_for(clock.reached.wait(), timeout=10)
    assert step.round_seconds < step.tick_seconds
    assert clock.slept == pytest.approx([step.round_seconds] * round(10 / step.round_seconds))
    await stop(tasks)


class AlwaysChanged(asyncio.Event):
    """A store whose reports change between any two rounds."""

    def clear(self) -> None:
        self.set()


async def test_open_alerts_are_posted_again_every_refresh() -> None:
    hook, am, clock = Receiver(), Receiver(), FakeClock()
    step = make_step(Reports(incident_report()), hook, am, clock=clock)
    run, tasks = await running(step)
    await step.plan(run.ctx)
    await until(lambda: len(am.got) == 1, "the first post")
    # a refresh skips an entry whose post is still in flight (that post is the refresh):
    # the first post is recorded and off the queue before the clock moves
    await step._quiet()
    clock.now = 30.0
    await step.plan(run.ctx)
    await settled(step)
    assert len(am.got) == 1  # not yet
    clock.now = 61.0
    await step.plan(run.ctx)
    await settled(step)
    assert len(am.got) == 2 and am.got[0] == am.got[1] and len(hook.got) == 1
    await stop(tasks)


async def test_a_restarted_member_loads_the_ledger_and_sends_nothing_again() -> None:
    hook, am = Receiver(), Receiver()
    step = make_step(Reports(incident_report()), hook, am)
    run, tasks = await running(step)
    await step.plan(run.ctx)
    await until(lambda: ledgers(run)[-1].entries[0].delivered.get("webhook") == 1, "a delivery")
    await stop(tasks)
    stored = Ledgers({RID: run.sent_to(TOPIC)[-1].value or b""})
    hook2 = Receiver()
    again = make_step(Reports(incident_report()), hook2, Receiver(), stored=stored)
    run2, tasks2 = await running(again)
    await again.plan(run2.ctx)
    await settled(again)
    assert hook2.got == [] and run2.sent_to(TOPIC) == []
    await stop(tasks2)


async def test_a_change_decided_but_not_sent_is_sent_by_the_next_member() -> None:
    first = make_step(Reports(incident_report()), Receiver(), Receiver())
    run, _ = await running(first)
    await first.plan(run.ctx)  # decided and recorded; this member dies before sending
    stored = Ledgers({RID: run.sent_to(TOPIC)[0].value or b""})
    hook = Receiver()
    second = make_step(Reports(incident_report()), hook, Receiver(), stored=stored)
    run2, tasks = await running(second)
    await second.plan(run2.ctx)
    await settled(second)
    assert len(hook.got) == 1 and "opened" in hook.got[0]["text"]
    await stop(tasks)


async def test_reports_of_partitions_owned_elsewhere_are_left_alone() -> None:
    hook = Receiver()
    step = make_step(Reports(incident_report()), hook, Receiver(), home=1)
    run, tasks = await running(step)
    await step.plan(run.ctx)
    await settled(step)
    assert hook.got == [] and run.sent_to(TOPIC) == []
    await stop(tasks)


async def test_a_full_queue_drops_counts_and_the_next_round_sends_it() -> None:
    settings = SETTINGS.model_copy(update={"notify": SETTINGS.notify.model_copy(
        update={"queue_size": 1})})
    other = incident_report().model_copy(update={"id": "2026-11-29/payments"})
    metrics, hook = Metrics(), Receiver()
    step = make_step(Reports(incident_report(), other), hook, Receiver(),
                     settings=settings, metrics=metrics)
    run = MemoryRun(step)
    run.source.partitions[TOPIC] = 1
    await run.assign(P0)
    await step.plan(run.ctx)  # two incidents owed, one place in the queue, no sender yet
    dropped = metrics.registry.get_sample_value("retro_notifications_total",
                                                {"sink": "webhook", "outcome": "dropped"})
    assert dropped == 1
    tasks = [asyncio.create_task(c) for c in step.senders(run.ctx)]
    await until(lambda: len(hook.got) == 1, "the queued one")
    await step.plan(run.ctx)
    await until(lambda: len(hook.got) == 2, "the dropped one, queued again")
    await stop(tasks)


async def test_a_revoke_lets_the_send_in_flight_finish_and_records_it() -> None:
    hook = Receiver()
    hook.gate.clear()
    step = make_step(Reports(incident_report()), hook, Receiver())
    run, tasks = await running(step)
    await step.plan(run.ctx)
    await until(lambda: not step._idle["webhook"].is_set(), "the webhook's send")
    revoke = asyncio.create_task(step.revoked({P0}, run.ctx))
    await asyncio.sleep(0.05)
    assert not revoke.done()
    hook.gate.set()
    await asyncio.wait_for(revoke, timeout=2)
    assert ledgers(run)[-1].entries[0].delivered.get("webhook") == 1
    await step.plan(run.ctx)  # between owners: nothing is planned
    assert len(ledgers(run)) == len(run.sent_to(TOPIC))
    await stop(tasks)


async def test_a_failing_sink_does_not_hold_the_other_back() -> None:
    hook, am, clock = Receiver(aiohttp.ClientConnectionError("refused")), Receiver(), FakeClock()
    step = make_step(Reports(incident_report()), hook, am, clock=clock)
    run, tasks = await running(step)
    await step.plan(run.ctx)
    await until(lambda: ledgers(run)[-1].entries[0].delivered.get("alertmanager") == 1,
                "Alertmanager's delivery")
    await settled(step)
    assert "webhook" not in ledgers(run)[-1].entries[0].delivered  # still owed
    assert clock.slept == [MAX_WAIT]  # and the sink that failed is left alone a while
    hook.status = 200
    await step.plan(run.ctx)  # the next round sends what is owed
    await settled(step)
    assert len(hook.got) == 1 and ledgers(run)[-1].entries[0].delivered.get("webhook") == 1
    await stop(tasks)


async def test_a_window_is_over_once_a_later_one_began_and_it_stopped_growing() -> None:
    hook = Receiver()
    base = incident_report()
    stale = base.model_copy(update={"id": "2026-11-28/all", "updated_at": "2026-12-01T07:45:00Z"})
    fresh = base.model_copy(update={"id": "2026-11-27/all", "updated_at": "2026-12-01T07:59:00Z"})
    step = make_step(Reports(stale, fresh, base), hook, Receiver())
    run, tasks = await running(step)
    await step.plan(run.ctx)
    await settled(step)
    reports = sorted(m["text"].split("|Post-mortem ")[1].split(">")[0] for m in hook.got)
    assert reports == ["2026-11-27/all", RID]  # a replay's window that still grows is live
    await stop(tasks)


async def test_a_planning_error_ends_the_membership_instead_of_going_quiet() -> None:
    class Broken(Reports):
        def ids(self) -> list[str]:
            raise RuntimeError("a bug")

    step = make_step(Broken(), Receiver(), Receiver())
    run, tasks = await running(step)
    tasks.append(planning_task(step, run))
    await until(lambda: step.failure() is not None, "the failure")
    assert "planning failed" in str(step.failure()) and "a bug" in str(step.failure())
    await stop(tasks)


async def test_a_revoke_waits_for_the_planning_round_to_record_its_decisions() -> None:
    class HeldSink(MemorySink):
        gate = asyncio.Event()

        async def queue(self, outs: list[Out]) -> list[asyncio.Future[Any]]:
            await self.gate.wait()
            return await super().queue(outs)

    step = make_step(Reports(incident_report()), Receiver(), Receiver())
    run, tasks = await running(step)
    run.ctx.sink = held = HeldSink()
    planning = asyncio.create_task(step.plan(run.ctx))
    await asyncio.sleep(0.05)  # the round has decided and waits for its ledger write
    revoke = asyncio.create_task(step.revoked({P0}, run.ctx))
    await asyncio.sleep(0.05)
    assert not revoke.done() and held.sent == []
    held.gate.set()
    await asyncio.wait_for(revoke, timeout=2)
    assert [o.topic for o in held.sent] == [TOPIC]  # recorded before the partition moved
    await planning
    await stop(tasks)


def said(hook: Receiver) -> list[tuple[str, str]]:
    """Each chat message as (incident id, verb)."""
    return [(m["text"].split("(incident ")[1].split(",")[0], m["text"].split(" ")[2])
            for m in hook.got]


async def test_a_report_version_that_splits_the_run_pages_the_incident_once() -> None:
    """db fails from 10:40 to 10:56 without a pause; a later version judges 10:45-10:50
    otherwise and holds two incidents where the earlier held one; the versions then
    flip. The on-call hears of the incident once, and of its end once."""
    one = day_report(errors=[("db", REFUSED, minutes(40, 56))], until=57)
    two = day_report(errors=[("db", REFUSED, {**minutes(40, 44), **minutes(51, 56)})],
                     until=57)
    over = two.model_copy(update={"version": 99, "last_seen": "2026-11-29T11:10:00.000Z"})
    reports, hook = Reports(one), Receiver()
    step = make_step(reports, hook, Receiver())
    run, tasks = await running(step)
    for version in (one, two, one, two, over, two, over):
        reports.held[RID] = version
        await step.plan(run.ctx)
        await settled(step)
    assert said(hook) == [("db@2026-11-29T10:40", "opened"), ("db@2026-11-29T10:40", "ended")]
    await stop(tasks)


async def test_an_earlier_version_with_one_incident_and_a_later_with_two_pages_each_once(
        ) -> None:
    errors = [("db", REFUSED, {**minutes(40, 44), **minutes(70, 74)})]
    earlier, later = day_report(errors=errors, until=50), day_report(errors=errors, until=76)
    reports, hook = Reports(earlier), Receiver()
    step = make_step(reports, hook, Receiver())
    run, tasks = await running(step)
    for version in (earlier, later, earlier, later):
        reports.held[RID] = version
        await step.plan(run.ctx)
        await settled(step)
    opened = [incident for incident, verb in said(hook) if verb == "opened"]
    assert opened == ["db@2026-11-29T10:40", "db@2026-11-29T11:10"]
    assert ("db@2026-11-29T10:40", "ended") in said(hook)  # over by 10:50, as first seen
    assert len(said(hook)) == len(set(said(hook)))  # nothing said twice
    await stop(tasks)


def test_a_report_that_is_slow_to_derive_is_derived_again_only_after_a_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Deriving costs 2 s of the step's clock: a new version within DERIVE_BACKOFF times
    that keeps the incidents it had; after it, the new version is read."""
    clock = FakeClock()
    first = day_report(errors=[("db", REFUSED, minutes(40, 44))], until=41)
    step = make_step(Reports(first), Receiver(), Receiver(), clock=clock)
    calls = 0

    def slow(report: Report, **kwargs: Any) -> list[Any]:
        nonlocal calls
        calls += 1
        clock.advance(2.0)
        return [calls]

    monkeypatch.setattr("streams.notify.step.alerts_for", slow)
    assert step._alerts_of(first, closed=False) == [1]
    later = day_report(errors=[("db", REFUSED, minutes(40, 44))], until=44)
    later.version = first.version + 1
    clock.advance(1.0)
    assert step._alerts_of(later, closed=False) == [1]  # 3 s after a 2 s derivation
    clock.advance(6.0)
    assert step._alerts_of(later, closed=False) == [2]  # 9 s after: read again
    assert step._alerts_of(later, closed=False) == [2] and calls == 2


async def test_a_reports_walk_is_kept_while_owned_and_dropped_when_another_member_owns_it(
        ) -> None:
    home = {"partition": 0}
    step = make_step(Reports(incident_report()), Receiver(), Receiver())
    step.partition_of = lambda key, count: home["partition"]
    run, tasks = await running(step)
    await step.plan(run.ctx)
    kept = step._walks[RID]
    assert kept.judged > 0  # the first version walked the report
    await step.plan(run.ctx)
    assert step._walks[RID] is kept  # the same walk goes on with the next version
    home["partition"] = 1  # the report's ledger partition is another member's now
    await step.plan(run.ctx)
    assert RID not in step._walks
    await stop(tasks)
