"""The notifier's step on the runtime: its group, its topic, its readers.

It runs beside the compactor (``retro worker --roles compactor``) when a sink is set
(``RETRO_NOTIFY__*``), as the consumer group ``<group>-notify`` on the notifications
topic; the composed reports come from the worker's follower of the reports topic.
"""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from streams.kafka.connect import QUIET_FETCH_WAIT_MS
from streams.metrics import Metrics
from streams.notify.sinks import Sink, build_sinks
from streams.notify.step import NotifyStep
from streams.report.store import ReportFollower, read_messages
from streams.runtime.loop import StageLoop, Subscription
from streams.settings import Settings

_PARTITIONER = DefaultPartitioner()


def notify_group(worker_group: str) -> str:
    return f"{worker_group}-notify"


def partition_of(key: bytes, count: int) -> int:
    """The partition the producer writes ``key`` to: its ledger's home."""
    partitions = list(range(count))
    return int(_PARTITIONER(key, partitions, partitions))


class LedgerReader:
    """The latest ledger per report on given partitions of the notifications topic."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def read(self, partitions: set[int]) -> list[tuple[str, bytes | None, int]]:
        latest: dict[str, tuple[bytes | None, int]] = {}
        topic = self.settings.topics.notifications
        async for m in read_messages(self.settings, topic, partitions):
            if m.key is not None:
                latest[m.key.decode()] = (m.value, m.partition)
        return [(rid, value, home) for rid, (value, home) in latest.items()]


def notify_loop(settings: Settings, metrics: Metrics, worker_group: str,
                follower: ReportFollower, *, sinks: list[Sink] | None = None) -> StageLoop:
    """Report versions -> incidents opened, escalated, ended -> Alertmanager, webhook."""
    step = NotifyStep(settings, metrics, reports=follower.reports, changed=follower.changed,
                      ready=follower.caught_up,
                      source=LedgerReader(settings),
                      sinks=sinks if sinks is not None else build_sinks(settings, metrics),
                      partition_of=partition_of)
    return StageLoop(step, settings, metrics, group=notify_group(worker_group),
                     subscription=Subscription(
                         topics=[settings.topics.notifications],
                         options={"fetch_max_wait_ms": QUIET_FETCH_WAIT_MS}))
