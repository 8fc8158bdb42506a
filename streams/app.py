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
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from streams.agents.batch import wire_batch
from streams.agents.clean import clean_group, wire_clean
from streams.agents.compactor import wire_compactor
from streams.agents.web import wire_web
from streams.agents.web_auth import web_token
from streams.batch.lane import LaneProcessor
from streams.gateway.factory import GatewaySet, build_gateways
from streams.kafka import faust_guards
from streams.kafka.connect import (
    aiokafka_kwargs,
    bootstrap_addresses,
    faust_credentials,
    partitions_of,
    resolve_bootstrap,
    stop_consumer,
)
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
    processors: dict[str, LaneProcessor] = field(default_factory=dict)
    follower: ReportFollower | None = None


def group_id(settings: Settings, roles: tuple[str, ...]) -> str:
    if set(roles) == set(ROLES):
        return settings.app_id
    return f"{settings.app_id}-{'-'.join(r for r in ROLES if r in roles)}"


def input_topics(settings: Settings, roles: tuple[str, ...]) -> list[str]:
    """The topics the faust app of a worker with these roles consumes as a group."""
    inputs = {"clean": ["raw"], "batch": ["fast", "slow"], "compactor": ["fragments"]}
    if settings.clean.engine == "aiokafka":
        inputs["clean"] = []  # the clean loop consumes raw in a group of its own
    return [getattr(settings.topics, n) for r in ROLES if r in roles for n in inputs[r]]


def consumer_groups(settings: Settings, roles: tuple[str, ...]) -> dict[str, list[str]]:
    """Every consumer group a worker with these roles runs, with the topics it reads."""
    gid = group_id(settings, roles)
    groups = {gid: input_topics(settings, roles)}
    if "clean" in roles and settings.clean.engine == "aiokafka":
        groups[clean_group(gid)] = [settings.topics.raw]
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
        broker_heartbeat_interval=max(1.0, settings.kafka.session_timeout_seconds / 10),
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
              for name in ("raw", "fast", "slow", "deadletter", "fragments", "review", "reports")}
    worker = Worker(app=app, settings=settings, metrics=metrics, roles=tuple(roles))
    if "clean" in roles:
        wire_clean(app, settings, metrics, topics)
    if "batch" in roles:
        worker.gateways = build_gateways(settings, metrics=metrics)
        worker.processors = wire_batch(
            app, settings, metrics, topics,
            {"fast": worker.gateways.fast, "slow": worker.gateways.slow},
            worker.gateways.window_counter(settings.model.name))
    if "compactor" in roles:
        rollup = None
        if settings.report.rollup_seconds > 0:
            worker.gateways = worker.gateways or build_gateways(settings, metrics=metrics)
            rollup = worker.gateways.fast
        wire_compactor(app, settings, metrics, topics, gateway=rollup)
    health = StallDetector(stall_seconds=settings.stall_seconds)
    if web:
        worker.follower = ReportFollower(settings)
        wire_web(app, metrics, worker.follower, health, broker=BrokerProbe(
            bootstrap_addresses(resolve_bootstrap(settings))), token=web_token(settings))
    _wire_lag(app, settings, metrics, roles, health)
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
              health: StallDetector) -> None:
    """Publish consumer lag per input topic/partition, and feed the stall detector
    with the partitions this worker's faust consumer owns."""
    groups = consumer_groups(settings, roles)

    @app.timer(interval=15.0)
    async def measure_lag() -> None:
        offsets: dict[tuple[str, int], tuple[int, int]] = {}
        try:
            for gid, names in groups.items():
                offsets.update(await consumer_offsets(settings, gid, names))
        except Exception as exc:  # metrics must never take the worker down
            logger.warning("measuring consumer lag failed: %r", exc)
            return
        for (topic, partition), (_, lag) in offsets.items():
            metrics.consumer_lag.labels(topic, str(partition)).set(lag)
        owned = {(tp.topic, tp.partition) for tp in app.consumer.assignment()}
        mine = {k: v for k, v in offsets.items() if k in owned}
        health.observe({k: c for k, (c, _) in mine.items()},
                       {k: lag for k, (_, lag) in mine.items()})
        metrics.partitions_stalled.set(len(health.stalled()))


async def consumer_offsets(
    settings: Settings, gid: str, topics: list[str]
) -> dict[tuple[str, int], tuple[int, int]]:
    """(committed offset, lag) for each partition of ``topics``."""
    from aiokafka import AIOKafkaConsumer

    admin = AIOKafkaAdminClient(**aiokafka_kwargs(settings))
    consumer = AIOKafkaConsumer(**aiokafka_kwargs(settings), group_id=None,
                                enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(gid)
        tps = [TopicPartition(topic, p) for topic in topics
               for p in await partitions_of(consumer, topic)]
        ends = await consumer.end_offsets(tps) if tps else {}
        out = {}
        for tp in tps:
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            out[(tp.topic, tp.partition)] = (done, max(0, ends[tp] - done))
        return out
    finally:
        await stop_consumer(consumer)
        await admin.close()
