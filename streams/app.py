"""The composition root: one faust app built from one Settings object.

``build_app(settings, roles=...)`` declares the topics, builds the pure stages from
settings and wires the agents. ``retro worker`` calls it; tests call it too.
Roles let clean, batch and compactor scale as separate deployments: each role set
is its own consumer group (``retro-stream`` for all roles, ``retro-stream-batch``...).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import faust

from streams.agents.batch import BatchLoop, lanes_group, wire_batch
from streams.agents.clean import clean_group, wire_clean
from streams.agents.compactor import CompactLoop, fragments_group, wire_compactor
from streams.agents.redrive import wire_redrive
from streams.agents.web import wire_web
from streams.agents.web_auth import web_token
from streams.batch.lane import LaneProcessor
from streams.gateway.factory import GatewaySet, build_gateways
from streams.kafka import faust_guards
from streams.kafka.connect import (
    bootstrap_addresses,
    faust_credentials,
    heartbeat_seconds,
    resolve_bootstrap,
)
from streams.kafka.lag import LagMonitor
from streams.kafka.probe import BrokerProbe
from streams.kafka.stall import StallDetector
from streams.metrics import Metrics
from streams.report.store import ReportFollower
from streams.settings import Settings

logger = logging.getLogger(__name__)

ROLES = ("clean", "batch", "compactor")


@dataclass
class Worker:
    """The faust app plus the objects tests and the CLI want to reach."""

    app: Any
    settings: Settings
    metrics: Metrics
    roles: tuple[str, ...]
    gateways: GatewaySet | None = None
    processors: dict[str, LaneProcessor] = field(default_factory=dict)  # faust engine
    batch_loop: BatchLoop | None = None  # aiokafka engine
    compact_loop: CompactLoop | None = None  # aiokafka engine
    follower: ReportFollower | None = None


def group_id(settings: Settings, roles: tuple[str, ...]) -> str:
    if set(roles) == set(ROLES):
        return settings.app_id
    return f"{settings.app_id}-{'-'.join(r for r in ROLES if r in roles)}"


def input_topics(settings: Settings, roles: tuple[str, ...]) -> list[str]:
    """The topics the faust app of a worker with these roles consumes as a group."""
    t = settings.topics
    inputs = {"clean": t.raw_topics, "batch": [t.fast, t.slow], "compactor": [t.fragments]}
    if settings.clean.engine == "aiokafka":
        inputs["clean"] = []  # the clean loop consumes raw in a group of its own
    if settings.batch.engine == "aiokafka":
        inputs["batch"] = []  # so does the batch loop, the lanes
    if settings.report.engine == "aiokafka":
        inputs["compactor"] = []  # and the compactor loop, the fragments
    return [name for r in ROLES if r in roles for name in inputs[r]]


def consumer_groups(settings: Settings, roles: tuple[str, ...]) -> dict[str, list[str]]:
    """Every consumer group a worker with these roles runs, with the topics it reads."""
    gid = group_id(settings, roles)
    groups = {gid: input_topics(settings, roles)}
    if "clean" in roles and settings.clean.engine == "aiokafka":
        # the listed inputs; topics matching RETRO_TOPICS__RAW_PATTERN are added where
        # offsets are measured (consumer_offsets(..., inputs=True))
        groups[clean_group(gid)] = settings.topics.raw_topics
    if "batch" in roles and settings.batch.engine == "aiokafka":
        groups[lanes_group(gid)] = [settings.topics.fast, settings.topics.slow]
    if "compactor" in roles and settings.report.engine == "aiokafka":
        groups[fragments_group(gid)] = [settings.topics.fragments]
    return {g: topics for g, topics in groups.items() if topics}


def build_app(settings: Settings, *, roles: tuple[str, ...] = ROLES,
              metrics: Metrics | None = None, web: bool = True) -> Worker:
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown agent roles {sorted(unknown)}; choose from {ROLES}")
    faust_guards.install()
    metrics = metrics or Metrics()
    gid = group_id(settings, roles)
    datadir = (settings.state_dir / "worker" / gid).resolve()
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        gid,
        broker=f"kafka://{resolve_bootstrap(settings)}",
        broker_credentials=faust_credentials(settings),
        store="memory://",  # tables are rebuilt from their changelog topics on start
        # keep faust's standby copy of the reports table (table_standby_replicas=1): it
        # costs a second worker up to 18% of its CPU reading the other's report versions,
        # but without it a partition moved by a rebalance was compacted on an empty table
        # (tried: a report written twice as version 1, 59 records lost in the audit)
        datadir=str(datadir),
        topic_partitions=settings.topics.partitions,
        topic_replication_factor=settings.topics.replication,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_max_request_size=settings.kafka.max_message_bytes,
        # batch sends: many small produce requests cost the worker more than the
        # 10 ms wait (socket writes were 13% of a loaded worker's time)
        producer_linger=0.01,
        producer_max_batch_size=256 * 1024,
        broker_session_timeout=settings.kafka.session_timeout_seconds,
        broker_heartbeat_interval=heartbeat_seconds(settings),
        broker_rebalance_timeout=max(30.0, settings.kafka.session_timeout_seconds * 2),
        broker_commit_interval=1.0,
        # Do not wait for unacked events on shutdown or rebalance: they are simply not
        # committed, so whoever owns the partition next reads them again (the merge is
        # idempotent). Waiting held a SIGTERMed worker until SIGKILL while the compactor
        # buffered fragments or a lane waited on the model.
        stream_wait_empty=False,
        web_enabled=web,
        web_port=settings.web_port,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        autodiscover=False,
    )
    t = settings.topics
    topics = {name: app.topic(getattr(t, name), key_serializer="raw", value_serializer="raw",
                              partitions=t.partitions)
              for name in ("fast", "slow", "deadletter", "fragments", "review", "reports")}
    # the users' input topics keep their own partition counts
    topics["raw"] = app.topic(*t.raw_topics, key_serializer="raw", value_serializer="raw")
    worker = Worker(app=app, settings=settings, metrics=metrics, roles=tuple(roles))
    if "clean" in roles:
        wire_clean(app, settings, metrics, topics)
    if "batch" in roles:
        worker.gateways = build_gateways(settings, metrics=metrics)
        wired = wire_batch(
            app, settings, metrics, topics,
            {"fast": worker.gateways.fast, "slow": worker.gateways.slow},
            worker.gateways.window_counter(settings.model.name),
            on_assignment=worker.gateways.follow_assignment)
        if isinstance(wired, BatchLoop):
            worker.batch_loop = wired
        else:
            worker.processors = wired
        wire_redrive(app, settings, metrics, worker.gateways)
    if "compactor" in roles:
        rollup = None
        if settings.report.rollup_seconds > 0:
            worker.gateways = worker.gateways or build_gateways(settings, metrics=metrics)
            rollup = worker.gateways.fast
        wired_compactor = wire_compactor(app, settings, metrics, topics, gateway=rollup)
        if isinstance(wired_compactor, CompactLoop):
            worker.compact_loop = wired_compactor
    health = StallDetector(stall_seconds=settings.stall_seconds)
    if web:
        worker.follower = ReportFollower(settings)
        wire_web(app, metrics, worker.follower, health, broker=BrokerProbe(
            bootstrap_addresses(resolve_bootstrap(settings))), token=web_token(settings))
    _wire_lag(app, settings, metrics, roles, health, worker.batch_loop, worker.compact_loop)
    _wire_reread(app, settings, metrics)
    return worker


def _wire_reread(app: Any, settings: Settings, metrics: Metrics) -> None:
    """Re-read a partition from its commit when a record never reached an agent and
    holds the commit back (see ``streams/kafka/faust_guards.py``)."""
    after = settings.kafka.reread_held_seconds
    if after <= 0:
        return
    held = StallDetector(stall_seconds=after)

    @app.timer(interval=max(1.0, min(5.0, after / 4)))
    async def reread_held() -> None:
        consumer = app.consumer
        if app.rebalancing or not consumer.flow_active:
            return
        try:
            committed, lag = faust_guards.commit_progress(consumer)
        except Exception as exc:  # a consumer between assignments; try again later
            logger.debug("partition states unavailable: %r", exc)
            return
        held.observe(committed, lag)
        for tp in held.stalled():
            logger.warning("%s[%s]: commit held at %s for %.0fs with lag and nothing in "
                           "flight; re-reading from there", tp.topic, tp.partition,
                           committed[tp], after)
            metrics.offset_rereads.labels(tp.topic).inc()
            held.restart(tp)
            await consumer.seek(tp, committed[tp])


def _wire_lag(app: Any, settings: Settings, metrics: Metrics, roles: tuple[str, ...],
              health: StallDetector, batch_loop: BatchLoop | None,
              compact_loop: CompactLoop | None) -> None:
    """Publish consumer lag and the oldest uncommitted record's age per input topic,
    and feed the stall detector with the partitions this worker's faust consumer and
    its batch and compactor loops own (one long-lived LagMonitor; see
    ``streams/kafka/lag.py``)."""
    groups = consumer_groups(settings, roles)
    monitor = LagMonitor(settings)
    # re-reads start at 0, not "No data": the faust agents' inputs and the loops'
    for topic in sorted({t for topics in groups.values() for t in topics}):
        metrics.offset_rereads.labels(topic)

    @app.timer(interval=15.0)
    async def measure_lag() -> None:
        try:
            offsets = await monitor.publish(
                await with_pattern_inputs(groups, monitor, settings, roles), metrics)
        except Exception as exc:  # metrics must never take the worker down
            logger.warning("measuring consumer lag failed: %r", exc)
            await monitor.close()  # reconnect from scratch next time
            return
        owned = {(tp.topic, tp.partition) for tp in app.consumer.assignment()}
        for loop in (batch_loop, compact_loop):
            if loop is not None:
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
