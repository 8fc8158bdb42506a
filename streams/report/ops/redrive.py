"""Re-driving parked records: by the worker, and by hand (``retro review --redrive``).

When the worker re-drives: after a health probe, exponential backoff, a bounded rate;
pure asyncio with an injected sleep, so the policy is tested on a fake clock.
``RedriveStep`` is the re-drive stage on the stage runtime: it consumes the review
topic, and for a transient review reads its records again from the lane topics at the
review's lane coordinates (an ``OffsetReader``: ``streams.kafka.readers.Reader`` in a
worker) and sends those lane messages to their lanes as they are: they are the
cleaner's redacted output already, so the worker never reads the raw topic, whose
lines still hold secrets. The review is done once they are delivered, so a crash
re-drives it again rather than dropping it (the merge counts a record once).

:func:`redrive_parked` is the re-drive by hand: the same from the lanes, and for the
reviews that carry no lane coordinates (fragments the compactor rejected, reviews
written before reviews carried them) from the raw topic, cleaned again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import ValidationError

from streams.clean.cleaner import Cleaner
from streams.clean.step import route
from streams.clock import Clock, Sleep
from streams.errors import NotAuthorized
from streams.gateway.probe import Probe
from streams.gateway.reasons import is_transient
from streams.intervals import Coverage
from streams.kafka.connect import produce_all
from streams.kafka.readers import Reader
from streams.metrics import Metrics
from streams.records import NormalizedRecord, Review
from streams.runtime.step import Context, Fetch, Message, Out, Step
from streams.settings import Settings

logger = logging.getLogger(__name__)


class RedriveGate:
    """Opens when the probe succeeds; each failed probe waits longer (doubling, capped).

    At most one probe per backoff step: a failed probe waits out its backoff before the
    next, and a healthy answer is trusted for ``backoff_base`` seconds, so a fetch of
    many transient reviews costs one probe, not one per review.

    ``pace`` spaces re-driven records to at most ``records_per_second``, so a recovered
    provider is not met by every parked record at once.
    """

    def __init__(self, probe: Probe, *, backoff_base: float, backoff_max: float,
                 records_per_second: float, sleep: Sleep = asyncio.sleep,
                 clock: Clock | None = None) -> None:
        if backoff_base <= 0 or backoff_max < backoff_base:
            raise ValueError("need 0 < backoff_base <= backoff_max")
        if records_per_second <= 0:
            raise ValueError("records_per_second must be positive")
        self._probe = probe
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.records_per_second = records_per_second
        self._sleep = sleep
        self._clock = clock
        self.failures = 0  # consecutive failed probes
        self.probes = 0  # probes sent
        self._healthy_until = float("-inf")

    @property
    def next_backoff(self) -> float:
        return min(self.backoff_max, self.backoff_base * 2 ** self.failures)

    async def healthy(self) -> bool:
        """Probe once (unless a probe passed within ``backoff_base``); on failure wait the
        current backoff (then double it) and say False."""
        if self._now() < self._healthy_until:
            return True
        self.probes += 1
        if await self._probe():
            self.failures = 0
            self._healthy_until = self._now() + self.backoff_base
            return True
        self._healthy_until = float("-inf")
        delay = self.next_backoff
        self.failures += 1
        await self._sleep(delay)
        return False

    async def pace(self, records: int) -> None:
        """Wait as long as ``records`` re-driven records take at the bounded rate."""
        if records > 0:
            await self._sleep(records / self.records_per_second)

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()


class ReviewMessage(Protocol):
    """What a fetched review message needs to offer (aiokafka's ConsumerRecord does)."""

    offset: int
    value: bytes | None


Redrive = Callable[[Review], Awaitable[int]]  # sends a review's records; how many
# why a review without lane coordinates is not re-driven from the lanes
UNPLACED = ("written before reviews carried lane coordinates; run `retro review --redrive` "
            "as a user who may read the raw topic")


@dataclass
class FetchOutcome:
    """How far each partition of a fetch is done, and whether the probe stopped it."""

    done: dict[Hashable, int] = field(default_factory=dict)  # partition -> next offset
    blocked: bool = False
    redriven: int = 0  # records sent to the lanes
    skipped: int = 0  # messages that are not reviews


async def redrive_fetch(fetched: Mapping[Hashable, Sequence[ReviewMessage]], gate: RedriveGate,
                        redrive: Redrive) -> FetchOutcome:
    """Walk a fetch of review messages in offset order per partition.

    A transient review is re-driven once the gate's probe passes; a permanent one is
    passed over (it stays parked for ``retro review --redrive``). A failed probe stops
    the whole fetch after its backoff: ``done`` then ends before that review, so it is
    read again, and nothing after it is committed.
    """
    out = FetchOutcome()
    for tp, messages in fetched.items():
        for m in messages:
            if out.blocked:
                break
            try:
                review = Review.model_validate_json(m.value or b"")
            except ValidationError:
                out.skipped += 1
                logger.warning("review topic offset %s is not a review; skipped", m.offset)
                review = None
            if review is not None and is_transient(review.reason):
                if not await gate.healthy():
                    out.blocked = True
                    break
                sent = await redrive(review)
                out.redriven += sent
                await gate.pace(sent)
            out.done[tp] = m.offset + 1
    return out


class OffsetReader(Protocol):
    """Reads messages again by their coordinates ("topic/partition" -> offset ranges)."""

    async def at(self, covered: Coverage) -> list[Message]: ...

    async def close(self) -> None: ...


def to_lanes(cleaner: Cleaner, lanes: Mapping[str, str], messages: Sequence[Message], *,
             wanted: Coverage | None = None) -> list[Out]:
    """``messages`` cleaned again, as lane messages for the records in ``wanted`` (all
    when None).

    A record that now cleans into a dead letter is not sent: it was analysable once,
    and a dead letter beside its review would count it twice.
    """
    outs: list[Out] = []
    wanted_parts = wanted.parts() if wanted is not None else None
    for m in messages:
        for routed in route(cleaner, value=m.value, key=m.key, topic=m.topic,
                            partition=m.partition, offset=m.offset, timestamp_ms=m.timestamp):
            record = None
            if routed.lane in lanes:  # the clean step writes records unvalidated
                with contextlib.suppress(ValidationError):
                    record = NormalizedRecord.model_validate_json(routed.value)
            if record is None:
                logger.warning("%s[%s]@%s now cleans into a dead letter or an invalid "
                               "record; left in review", m.topic, m.partition, m.offset)
                continue
            if wanted_parts is not None:
                key, value = record.raw.ledger_entry()
                if value not in wanted_parts.get(key, ()):
                    continue  # another record of a message carrying many
            outs.append(Out(lanes[routed.lane], routed.key, routed.value))
    return outs


def lane_coverage(review: Review, lanes: Collection[str]) -> Coverage | None:
    """Where ``review``'s records sit in the lanes, or None for a review written before
    reviews carried it; partitions of other topics are left out, so a review can never
    make the re-drive read anything but the lanes."""
    if review.lane_covered is None:
        return None
    return Coverage.from_json({key: ranges for key, ranges in review.lane_covered.items()
                               if key.rpartition("/")[0] in lanes})


def from_lanes(messages: Sequence[Message], wanted: Coverage, lanes: Collection[str]
               ) -> tuple[list[Out], int]:
    """(the lane messages of the records in ``wanted``, once each, to send to the lane
    they were read from as they are; how many read messages were none of them).

    A lane offset is checked against the record it holds: only records ``wanted``
    covers go back, so what a re-drive sends is exactly what its review parked.
    """
    outs: list[Out] = []
    sent: set[tuple[str, int]] = set()
    parts = wanted.parts()
    foreign = 0
    for m in messages:
        try:
            entry = NormalizedRecord.model_validate_json(m.value or b"").raw.ledger_entry()
        except ValidationError:
            entry = None
        if m.topic not in lanes or entry is None or entry[1] not in parts.get(entry[0], ()):
            foreign += 1
            continue
        if entry not in sent:  # one record twice on the lanes is sent once
            sent.add(entry)
            outs.append(Out(m.topic, m.key, m.value))
    return outs, foreign


class RedriveStep(Step):
    """Re-drives the transient reviews of a fetch once the provider answers its probe.

    When the probe fails, the rest of each partition is read again after the backoff;
    a review is done once its records are on the lanes. A review without lane
    coordinates (written before reviews carried them) stays parked: its records are
    only on the raw topic, which this worker may not read.
    """

    name = "re-drive loop"

    def __init__(self, settings: Settings, metrics: Metrics, gate: RedriveGate,
                 reader: OffsetReader) -> None:
        self.metrics = metrics
        self.gate = gate
        self.reader = reader  # reads the lane topics by offset
        self.lanes = {"fast": settings.topics.fast, "slow": settings.topics.slow}

    async def take(self, fetch: Fetch, ctx: Context) -> None:
        deliveries = []

        async def redrive(review: Review) -> int:
            lanes = self.lanes.values()
            where = lane_coverage(review, lanes)
            if where is None:
                logger.warning("review %s (%s) stays parked: %s", review.id, review.reason,
                               UNPLACED)
                return 0
            wanted = Coverage.from_json(review.covered)
            outs, foreign = from_lanes(await self.reader.at(where), wanted, lanes)
            if foreign or len(outs) < len(wanted):
                logger.warning("review %s: %d of its %d records are no longer on the lanes "
                               "and stay parked; %d lane messages at its coordinates were "
                               "none of its records", review.id, len(wanted) - len(outs),
                               len(wanted), foreign)
            if outs:
                deliveries.append(await ctx.send(outs))
            self.metrics.redriven_records.labels(review.reason).inc(len(outs))
            logger.info("re-driving review %s (%s, %s lane): %d records back to the lanes",
                        review.id, review.reason, review.lane, len(outs))
            return len(outs)

        outcome = await redrive_fetch(fetch, self.gate, redrive)
        if outcome.blocked:
            self.metrics.redrive_probes_failed.inc()
        handles = []
        for part, messages in fetch.items():
            done = outcome.done.get(part)
            if done is not None:
                handles.append(ctx.track(part, done - 1))
            if done is None or done <= messages[-1].offset:  # not done: read again
                ctx.reread(part, messages[0].offset if done is None else done)
        delivered = await asyncio.gather(*deliveries, return_exceptions=True)
        if any(isinstance(d, BaseException) for d in delivered):
            logger.error("re-driven records were not delivered; their reviews are read again")
            return  # the runtime rejoins from the committed offsets
        for handle in handles:
            ctx.done(handle)

    async def drain(self, ctx: Context) -> None:
        await self.reader.close()


@dataclass
class Redriven:
    """What a re-drive by hand sent, and the refusal that kept it from sending more."""

    sent: int = 0
    refused: NotAuthorized | None = None


async def redrive_parked(settings: Settings, parked: Sequence[tuple[Review, Coverage]], *,
                         cleaner: Cleaner | None = None) -> Redriven:
    """``retro review --redrive``: the ``parked`` records of each review back to the lanes,
    delivered before this returns; a running worker analyses them.

    They are read back from the lanes where their review says they sit. Only the raw
    topic holds the records of a review that says nothing (a fragment the compactor
    rejected, a review written before reviews carried lane coordinates): those are read
    from it and cleaned again, which takes a user who may read it; a user who may not
    gets ``refused``, once the others are sent. A lane this user may not read raises
    NotAuthorized before anything is sent.
    """
    lanes = {"fast": settings.topics.fast, "slow": settings.topics.slow}
    where, wanted, unplaced = Coverage(), Coverage(), Coverage()
    for review, records in parked:
        at = lane_coverage(review, lanes.values())
        if at is None:
            unplaced = unplaced.union(records)
        else:
            where, wanted = where.union(at), wanted.union(records)
    done = Redriven()
    async with Reader(settings) as reader:
        if wanted:
            outs, foreign = from_lanes(await reader.at(where), wanted, lanes.values())
            if foreign or len(outs) < len(wanted):
                logger.warning("%d parked records are no longer on the lanes and stay "
                               "parked; %d lane messages at their coordinates were none of "
                               "them", len(wanted) - len(outs), foreign)
            done.sent += await produce_all(settings, outs)
        if unplaced:
            try:
                messages = await reader.at(unplaced)
            except NotAuthorized as exc:
                done.refused = NotAuthorized(
                    f"{len(unplaced)} parked records are in reviews without lane "
                    "coordinates (fragments the compactor rejected, or reviews written "
                    f"before reviews carried them), so only the raw topic holds them, and "
                    f"{exc}: re-drive them as a user who may read it")
                return done
            cleaner = cleaner or Cleaner.from_settings(settings)
            done.sent += await produce_all(
                settings, to_lanes(cleaner, lanes, messages, wanted=unplaced))
    return done
