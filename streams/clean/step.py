"""The clean stage as a step: raw messages in, normalized records (or dead letters) out.

``route`` is where each record of a raw message goes, and as what; the re-drive
routes the same way. A fetch's outputs are sent together and each partition's run
is done once they are delivered.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

# a record's fields as JSON: the bytes model_dump_json writes for the record they make,
# NaN and infinities (a JSON log may hold them) as null, as JSON has no such numbers
from pydantic_core import to_json

from streams.clean.cleaner import Cleaner
from streams.ingest.raw_keys import source_of_key
from streams.metrics import Metrics
from streams.records import Coord, DeadLetter, trace_mark
from streams.runtime.step import Context, Fetch, Out, Step
from streams.settings import Settings

MAX_CACHED_KEYS = 4096  # message keys remembered with their source (keys name sources)
_NO_KEY: tuple[str, bytes | None] = ("unknown", None)  # a message without a key: its source


@dataclass(frozen=True)
class Routed:
    lane: str  # fast | slow | deadletter
    key: bytes
    value: bytes
    reason: str | None = None  # a dead letter's reason code


def routed_records(cleaner: Cleaner, value: bytes | None, coord: Coord, source: str,
                   lane_key: bytes | None, received: datetime | None
                   ) -> Iterator[tuple[str, bytes, bytes, str | None, tuple[bytes, bytes] | None]]:
    """(lane, key, value, dead letter reason, trace mark) of each log record of one raw
    message (an envelope may carry many); never raises on bad input. The mark
    (``trace_mark``) is for the traces topic, keyed by its trace id.

    ``lane_key`` is the raw key redacted (``Cleaner.lane_key``): it keeps --spread
    partitioning in the lanes, and is read by every reader of the lanes (a DSN as
    --source carried its password); without one, a record is keyed by its source.
    """
    for out in cleaner.clean_fields(value or b"", coord, source, received_at=received):
        if isinstance(out, DeadLetter):
            yield "deadletter", out.id.encode(), out.model_dump_json().encode(), out.reason, None
        else:
            yield (out["lane"], out["source"].encode() if lane_key is None else lane_key,
                   to_json(out, inf_nan_mode="null"), None, trace_mark(out))


def route(cleaner: Cleaner, *, value: bytes | None, key: bytes | None, topic: str,
          partition: int, offset: int, timestamp_ms: int | None) -> list[Routed]:
    """Where the log records of one raw message go, and as what."""
    coord = Coord(topic, partition, offset)
    received = datetime.fromtimestamp(timestamp_ms / 1000, UTC) if timestamp_ms else None
    lane_key = cleaner.lane_key(key) if key else None
    return [Routed(*r[:4]) for r in routed_records(cleaner, value, coord, source_of_key(key),
                                                    lane_key, received)]


class RouteCounters:
    """Routed records and dead letters, counted once their message is on the broker.

    Counting when a record is cleaned counted every attempt: a fetch read again after
    a failed delivery showed more dead letters than the topic held.
    """

    def __init__(self, metrics: Metrics, lanes: Iterable[str]) -> None:
        self.records_out = {lane: metrics.records_out.labels(lane) for lane in lanes}
        self.deadletters = metrics.deadletters

    def delivered(self, lanes: dict[str, int], reasons: dict[str, int]) -> None:
        """A whole fetch delivered: records per lane, dead letters per reason."""
        for lane, n in lanes.items():
            self.records_out[lane].inc(n)
        for reason, n in reasons.items():
            self.deadletters.labels(stage="clean", reason=reason).inc(n)


class CleanStep(Step):
    """Cleans every message of a fetch and sends the results to their lane topics.

    Builds each output once (no ``Routed`` between) and counts lanes and reasons as it
    goes: per record, that is work worth saving.
    """

    name = "clean loop"

    def __init__(self, settings: Settings, cleaner: Cleaner, metrics: Metrics) -> None:
        self.cleaner = cleaner
        t = settings.topics
        self.targets = {"fast": t.fast, "slow": t.slow, "deadletter": t.deadletter}
        self.traces = t.traces
        self.records_in = metrics.records_in.labels("clean")
        self.counters = RouteCounters(metrics, self.targets)
        # message key -> its source and its redacted lane key; keys are few (sources)
        self._keys: dict[bytes, tuple[str, bytes | None]] = {}
        self._received: tuple[int | None, datetime | None] = (None, None)  # the last one

    def _key(self, key: bytes) -> tuple[str, bytes | None]:
        if len(self._keys) >= MAX_CACHED_KEYS:
            self._keys.clear()
        known = self._keys[key] = (source_of_key(key), self.cleaner.lane_key(key))
        return known

    def _received_at(self, timestamp_ms: int) -> datetime:
        """The Kafka timestamp as a time; a fetch's messages often share their millisecond."""
        last_ms, last = self._received
        if timestamp_ms != last_ms or last is None:
            last = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
            self._received = (timestamp_ms, last)
        return last

    async def take(self, fetch: Fetch, ctx: Context) -> None:
        outs: list[Out] = []
        lanes: dict[str, int] = {}
        reasons: dict[str, int] = {}
        handles = []
        cleaner = self.cleaner
        targets = self.targets
        keys = self._keys
        with cleaner.tallied():
            for part, messages in fetch.items():
                self.records_in.inc(len(messages))
                for m in messages:
                    key = m.key
                    source, lane_key = (keys.get(key) or self._key(key)) if key else _NO_KEY
                    stamp = m.timestamp
                    coord = Coord(m.topic, m.partition, m.offset)
                    for lane, out_key, value, reason, mark in routed_records(
                            cleaner, m.value, coord, source, lane_key,
                            self._received_at(stamp) if stamp else None):
                        outs.append(Out(targets[lane], out_key, value))
                        if mark is not None:
                            outs.append(Out(self.traces, mark[0], mark[1]))
                        lanes[lane] = lanes.get(lane, 0) + 1
                        if reason is not None:
                            reasons[reason] = reasons.get(reason, 0) + 1
                    await ctx.give()
                # one handle for the run: the fetch is done when all of it is delivered
                handles.append(ctx.track(part, messages[-1].offset))
        await ctx.send(outs, done=handles,
                       on_delivered=lambda: self.counters.delivered(lanes, reasons))
