"""Each stage's step on the stage runtime: its consumer group, its topics, its readers.

Every loop is a consumer group of its own (``<group>-raw``, ``-lanes``, ``-review``,
``-traces``, ``-fragments``), so each stage scales by partitions and workers in that group. This
is the only place that knows which Kafka reader a step is given.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from streams.batch.step import LaneStep, OnAssignment
from streams.clean.cleaner import Cleaner
from streams.clean.step import CleanStep
from streams.gateway.gateway import Gateway
from streams.kafka.connect import QUIET_FETCH_WAIT_MS
from streams.kafka.inputs import input_pattern
from streams.kafka.readers import LatestPerKey, Reader
from streams.metrics import Metrics
from streams.report.compactor.step import CompactStep, WindowBefore
from streams.report.ops.redrive import RedriveGate, RedriveStep
from streams.report.state.keys import record_place
from streams.runtime.loop import StageLoop, Subscription
from streams.settings import Settings
from streams.tokens import TokenCounter
from streams.traces.step import TraceStep

logger = logging.getLogger(__name__)

FETCH_REVIEWS = 50  # reviews per getmany: one commit per fetch


def clean_group(worker_group: str) -> str:
    return f"{worker_group}-raw"


def lanes_group(worker_group: str) -> str:
    return f"{worker_group}-lanes"


def review_group(worker_group: str) -> str:
    return f"{worker_group}-review"


def traces_group(worker_group: str) -> str:
    return f"{worker_group}-traces"


def fragments_group(worker_group: str) -> str:
    return f"{worker_group}-fragments"


RAW_FETCH_BYTES = 4 * 1024 * 1024  # per raw partition: ~13k records of 300 bytes


def clean_loop(settings: Settings, metrics: Metrics, worker_group: str) -> StageLoop:
    """Raw input topics -> clean -> the lanes or the dead letter."""
    s = settings
    step = CleanStep(s, Cleaner.from_settings(s, metrics=metrics), metrics)
    # aiokafka fetches a partition again only once its buffer is empty: a fetch that holds
    # seconds of work keeps a worker left with one partition from waiting on each one
    options = {"max_partition_fetch_bytes": max(RAW_FETCH_BYTES, s.clean.max_record_bytes * 4),
               # a topic created later that matches the pattern joins within this long
               "metadata_max_age_ms": 30_000 if s.topics.raw_pattern else 300_000}
    if s.topics.raw_pattern:
        subscription = Subscription(pattern=input_pattern(s), options=options)
    else:
        subscription = Subscription(topics=s.topics.raw_topics, options=options)
    return StageLoop(step, s, metrics, group=clean_group(worker_group),
                     subscription=subscription)


def lanes_loop(settings: Settings, metrics: Metrics, worker_group: str,
               gateways: dict[str, Gateway], counter: TokenCounter, *,
               on_assignment: OnAssignment | None = None) -> StageLoop:
    """Both lanes -> token-budget batches -> the model -> fragments | review."""
    s = settings
    place = functools.partial(record_place, window=s.report.window,
                              group_by=s.report.group_by, shards=s.report.shards)
    step = LaneStep(s, metrics, gateways, counter, place, on_assignment=on_assignment)
    # records wait in windows and on the model between fetches
    options = {"max_poll_interval_ms": int(max(300.0, 4 * s.slow.timeout_seconds) * 1000)}
    return StageLoop(step, s, metrics, group=lanes_group(worker_group),
                     subscription=Subscription(topics=[s.topics.fast, s.topics.slow],
                                               options=options))


def redrive_loop(settings: Settings, metrics: Metrics, worker_group: str,
                 gateways: Any) -> StageLoop:
    """Transient reviews -> their lane messages again, by offset -> the lanes."""
    s = settings
    r = s.review
    gate = RedriveGate(
        gateways.probe(timeout_seconds=s.fast.timeout_seconds),
        backoff_base=r.backoff_base_seconds, backoff_max=r.backoff_max_seconds,
        records_per_second=r.records_per_second)
    # the lanes hold the cleaner's redacted output: reading them needs no access to raw
    step = RedriveStep(s, metrics, gate, Reader(s))
    # a backoff wait happens between two getmany calls: keep the group membership
    poll_ms = int((r.backoff_max_seconds + 120) * 1000)
    return StageLoop(step, s, metrics, group=review_group(worker_group),
                     subscription=Subscription(
                         topics=[s.topics.review], fetch_records=FETCH_REVIEWS, poll_ms=1000,
                         options={"max_poll_interval_ms": max(300_000, poll_ms),
                                  "fetch_max_wait_ms": QUIET_FETCH_WAIT_MS}))


def trace_loop(settings: Settings, metrics: Metrics, worker_group: str) -> StageLoop:
    """Trace marks -> complete traces -> hops into services, to the reports."""
    s = settings
    place = functools.partial(record_place, window=s.report.window,
                              group_by=s.report.group_by, shards=s.report.shards)
    step = TraceStep(s, metrics, place)
    return StageLoop(step, s, metrics, group=traces_group(worker_group),
                     subscription=Subscription(topics=[s.topics.traces]))


def compact_loop(settings: Settings, metrics: Metrics, worker_group: str, *,
                 gateway: Gateway | None = None,
                 window_before: WindowBefore | None = None) -> StageLoop:
    """Fragments -> merged into the reports loaded from the compacted topic -> reports;
    ``gateway`` writes the incidents' roll-ups when RETRO_REPORT__ROLLUP_SECONDS is set,
    judging a window's first hours against ``window_before``'s report."""
    s = settings
    # the reports of the fragments partitions the loop owns, by their keys' partition there
    reports = LatestPerKey(s, s.topics.reports, homes=s.topics.fragments)
    step = CompactStep(s, metrics, reports, gateway=gateway, window_before=window_before)
    options = {"max_partition_fetch_bytes": max(1024 * 1024, s.kafka.max_message_bytes),
               "fetch_max_wait_ms": QUIET_FETCH_WAIT_MS}
    return StageLoop(step, s, metrics, group=fragments_group(worker_group),
                     subscription=Subscription(topics=[s.topics.fragments], options=options))
