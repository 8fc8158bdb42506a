"""The composition root: one worker built from one Settings object.

``build_app(settings, roles=...)`` builds the pure stages from settings and runs each
stage loop as a task of a faust app. faust is only the host (web server, timers,
lifecycle, signals): it starts no Kafka client of its own; every stage consumes and
produces with aiokafka in a consumer group of its own. ``retro worker`` calls it;
tests call it too. Roles let clean, batch and compactor scale as separate
deployments: each role set names its groups (``retro-stream`` for all roles,
``retro-stream-batch``...).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import faust
from faust.app import BootStrategy

from streams.gateway.factory import GatewaySet, build_gateways
from streams.kafka.connect import bootstrap_addresses, resolve_bootstrap
from streams.kafka.lag import LagMonitor
from streams.kafka.probe import BrokerProbe
from streams.kafka.stall import StallDetector
from streams.metrics import Metrics
from streams.report.store import ReportFollower
from streams.runtime.loop import StageLoop
from streams.settings import Settings
from streams.worker.notify import notify_loop
from streams.worker.stages import (
    clean_group,
    clean_loop,
    compact_loop,
    fragments_group,
    lanes_group,
    lanes_loop,
    redrive_loop,
    trace_loop,
    traces_group,
)
from streams.worker.web import wire_web
from streams.worker.web_auth import web_token

logger = logging.getLogger(__name__)

ROLES = ("clean", "batch", "compactor")


class HostOnly(BootStrategy):
    """faust's services without its Kafka clients: no consumer (so no group, no
    subscription, no tables) and no producer; the stage loops bring their own."""

    enable_kafka = False


class HostApp(faust.App):
    BootStrategy = HostOnly


@dataclass
class Worker:
    """The faust app plus the objects tests and the CLI want to reach."""

    app: Any
    settings: Settings
    metrics: Metrics
    roles: tuple[str, ...]
    gateways: GatewaySet | None = None
    loops: list[StageLoop] = field(default_factory=list)  # in flow order
    follower: ReportFollower | None = None

    def loop(self, name: str) -> StageLoop | None:
        """The stage loop called ``name`` ("clean loop", "batch loop", ...), if any."""
        return next((loop for loop in self.loops if loop.name == name), None)


def group_id(settings: Settings, roles: tuple[str, ...]) -> str:
    if set(roles) == set(ROLES):
        return settings.app_id
    return f"{settings.app_id}-{'-'.join(r for r in ROLES if r in roles)}"


def consumer_groups(settings: Settings, roles: tuple[str, ...]) -> dict[str, list[str]]:
    """Every consumer group a worker with these roles runs, with the topics it reads."""
    gid = group_id(settings, roles)
    t = settings.topics
    groups: dict[str, list[str]] = {}
    if "clean" in roles:
        # the listed inputs; topics matching RETRO_TOPICS__RAW_PATTERN are added where
        # offsets are measured (consumer_offsets(..., inputs=True))
        groups[clean_group(gid)] = t.raw_topics
    if "batch" in roles:
        groups[lanes_group(gid)] = [t.fast, t.slow]
    if "compactor" in roles:
        groups[traces_group(gid)] = [t.traces]
        groups[fragments_group(gid)] = [t.fragments]
    return {g: topics for g, topics in groups.items() if topics}


def build_app(settings: Settings, *, roles: tuple[str, ...] = ROLES,
              metrics: Metrics | None = None, web: bool = True) -> Worker:
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}; choose from {ROLES}")
    metrics = metrics or Metrics()
    gid = group_id(settings, roles)
    datadir = (settings.state_dir / "worker" / gid).resolve()
    datadir.mkdir(parents=True, exist_ok=True)
    app = HostApp(
        gid,
        datadir=str(datadir),
        web_enabled=web,
        web_port=settings.web_port,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        autodiscover=False,
    )
    worker = Worker(app=app, settings=settings, metrics=metrics, roles=tuple(roles))
    for role in roles:  # RetroStreamRoleAbsent asks which roles run, whatever the pods' labels
        metrics.worker_roles.labels(role).set(1)
    if "clean" in roles:
        worker.loops.append(clean_loop(settings, metrics, gid))
    if "batch" in roles:
        gateways = worker.gateways = build_gateways(settings, metrics=metrics)
        worker.loops.append(lanes_loop(
            settings, metrics, gid, {"fast": gateways.fast, "slow": gateways.slow},
            gateways.window_counter(settings.model.name),
            on_assignment=gateways.follow_assignment))
        if settings.review.redrive:
            worker.loops.append(redrive_loop(settings, metrics, gid, gateways))
    if "compactor" in roles:
        rollup = None
        if settings.report.rollup_seconds > 0:
            worker.gateways = worker.gateways or build_gateways(settings, metrics=metrics)
            rollup = worker.gateways.fast
        # the notifier and the roll-ups read the reports the views read: the roll-ups
        # for the window before, the baseline of a window's first hours
        follower = worker.follower = (ReportFollower(settings) if settings.notify.configured
                                      or rollup is not None else None)
        worker.loops.append(trace_loop(settings, metrics, gid))
        worker.loops.append(compact_loop(
            settings, metrics, gid, gateway=rollup,
            window_before=follower.reports.share_before if follower is not None else None))
        if follower is not None and settings.notify.configured:
            worker.loops.append(notify_loop(settings, metrics, gid, follower))
    for loop in worker.loops:
        _run_as_task(app, loop)
    health = StallDetector(stall_seconds=settings.stall_seconds)
    if web:
        worker.follower = worker.follower or ReportFollower(settings)
        wire_web(app, metrics, worker.follower, health, broker=BrokerProbe(
            bootstrap_addresses(resolve_bootstrap(settings))), token=web_token(settings))
    elif worker.follower is not None:
        app.task(worker.follower.run)
    watched = [loop for loop in worker.loops if loop.name in ("batch loop", "compactor loop")]
    _wire_lag(app, settings, metrics, roles, health, watched)
    return worker


def _run_as_task(app: Any, loop: StageLoop) -> None:
    """A stage loop runs as a task of the faust app (started and cancelled with it)."""

    async def run() -> None:
        await loop.run()

    run.__name__ = run.__qualname__ = loop.name.replace(" ", "_").replace("-", "_")
    app.task(run)


def _wire_lag(app: Any, settings: Settings, metrics: Metrics, roles: tuple[str, ...],
              health: StallDetector, watched: list[StageLoop]) -> None:
    """Publish consumer lag and the oldest uncommitted record's age per input topic,
    and feed the stall detector with the partitions this worker's batch and compactor
    loops own (one long-lived LagMonitor; see ``streams/kafka/lag.py``)."""
    groups = consumer_groups(settings, roles)
    monitor = LagMonitor(settings)
    # re-reads start at 0, not "No data"
    for topic in sorted({t for topics in groups.values() for t in topics}):
        metrics.offset_rereads.labels(topic)

    @app.timer(interval=settings.kafka.lag_seconds)
    async def measure_lag() -> None:
        try:
            offsets = await monitor.publish(
                await with_pattern_inputs(groups, monitor, settings, roles), metrics)
        except Exception as exc:  # metrics must never take the worker down
            logger.warning("measuring consumer lag failed: %r", exc)
            await monitor.close()  # reconnect from scratch next time
            return
        owned: set[tuple[str, int]] = set()
        for loop in watched:
            owned |= {(tp.topic, tp.partition) for tp in loop.assignment()}
        mine = {k: v for k, v in offsets.items() if k in owned}
        health.observe({k: c for k, (c, _) in mine.items()},
                       {k: lag for k, (_, lag) in mine.items()})
        metrics.partitions_stalled.set(len(health.stalled()))

    @app.on_before_shutdown.connect
    async def _close_lag_monitor(app: object, **kwargs: object) -> None:
        await monitor.close()


async def with_pattern_inputs(groups: dict[str, list[str]], monitor: LagMonitor,
                              settings: Settings, roles: tuple[str, ...]
                              ) -> dict[str, list[str]]:
    """``groups`` with the topics matching RETRO_TOPICS__RAW_PATTERN now added to the
    clean loop's group (topics matching it may appear at any time)."""
    clean = clean_group(group_id(settings, roles))
    if clean not in groups or not settings.topics.raw_pattern:
        return groups
    return {**groups, clean: sorted(set(groups[clean]) | set(await monitor.input_topics()))}


async def consumer_offsets(
    settings: Settings, gid: str, topics: list[str], *, inputs: bool = False
) -> dict[tuple[str, int], tuple[int, int]]:
    """(committed offset, lag) for each partition of ``topics`` (with ``inputs``: of
    every input topic the cluster has, the pattern's matches included)."""
    monitor = LagMonitor(settings)
    try:
        if inputs:
            topics = sorted(set(topics) | set(await monitor.input_topics()))
        lags = await monitor.lag(gid, topics)
    finally:
        await monitor.close()
    return {(tp.topic, tp.partition): (pl.committed, pl.lag) for tp, pl in lags.items()}
