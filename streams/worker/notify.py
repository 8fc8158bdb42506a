"""The notifier's step on the runtime: its group, its topic, its readers.

It runs beside the compactor (``retro worker --roles compactor``) when a sink is set
(``RETRO_NOTIFY__*``), as the consumer group ``<group>-notify`` on the notifications
topic; the composed reports come from the worker's follower of the reports topic.
"""

from __future__ import annotations

from streams.kafka.connect import QUIET_FETCH_WAIT_MS
from streams.kafka.readers import LatestPerKey, partition_of
from streams.metrics import Metrics
from streams.notify.sinks import Sink, build_sinks
from streams.notify.step import NotifyStep
from streams.report.store import ReportFollower
from streams.runtime.loop import StageLoop, Subscription
from streams.settings import Settings


def notify_group(worker_group: str) -> str:
    return f"{worker_group}-notify"


def notify_loop(settings: Settings, metrics: Metrics, worker_group: str,
                follower: ReportFollower, *, sinks: list[Sink] | None = None) -> StageLoop:
    """Report versions -> incidents opened, escalated, ended -> Alertmanager, webhook."""
    step = NotifyStep(settings, metrics, reports=follower.reports, changed=follower.changed,
                      ready=follower.caught_up,
                      # each report's latest ledger on the partitions the loop owns
                      source=LatestPerKey(settings, settings.topics.notifications),
                      sinks=sinks if sinks is not None else build_sinks(settings, metrics),
                      partition_of=partition_of)
    return StageLoop(step, settings, metrics, group=notify_group(worker_group),
                     subscription=Subscription(
                         topics=[settings.topics.notifications],
                         options={"fetch_max_wait_ms": QUIET_FETCH_WAIT_MS}))
