"""When to re-drive parked records: a health probe, exponential backoff, a bounded rate.

Pure asyncio with an injected sleep, so the policy is tested on a fake clock; the
Kafka side (reading reviews, fetching raw records, sending to the lanes) is
``streams/agents/redrive.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import ValidationError

from streams.clock import Sleep
from streams.errors import PermanentModelError, RateLimited, TransientModelError
from streams.gateway.backends import ChatBackend
from streams.gateway.reasons import is_transient
from streams.records import Review

logger = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[bool]]


def backend_probe(backend: ChatBackend, *, model: str, timeout_seconds: float) -> Probe:
    """A one-token request: healthy when the provider answers it at all.

    A 429, a 5xx, a timeout or a refused connection is unhealthy. A permanent refusal
    (say a 400 for the tiny prompt) still shows a provider that answers, so it counts
    as healthy: the re-driven batches meet their own errors in the gateway.
    """

    async def probe() -> bool:
        try:
            async with asyncio.timeout(timeout_seconds):
                await backend.chat(model=model, max_tokens=1, timeout=timeout_seconds,
                                   messages=[{"role": "user", "content": "ping"}])
        except (RateLimited, TransientModelError, TimeoutError) as exc:
            logger.info("re-drive probe: the provider is not answering yet: %s", exc)
            return False
        except PermanentModelError as exc:
            logger.debug("re-drive probe answered with a refusal, counted healthy: %s", exc)
        return True

    return probe


class RedriveGate:
    """Opens when the probe succeeds; each failed probe waits longer (doubling, capped).

    ``pace`` spaces re-driven records to at most ``records_per_second``, so a recovered
    provider is not met by every parked record at once.
    """

    def __init__(self, probe: Probe, *, backoff_base: float, backoff_max: float,
                 records_per_second: float, sleep: Sleep = asyncio.sleep) -> None:
        if backoff_base <= 0 or backoff_max < backoff_base:
            raise ValueError("need 0 < backoff_base <= backoff_max")
        if records_per_second <= 0:
            raise ValueError("records_per_second must be positive")
        self._probe = probe
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.records_per_second = records_per_second
        self._sleep = sleep
        self.failures = 0  # consecutive failed probes

    @property
    def next_backoff(self) -> float:
        return min(self.backoff_max, self.backoff_base * 2 ** self.failures)

    async def healthy(self) -> bool:
        """Probe once; on failure wait the current backoff (then double it) and say False."""
        if await self._probe():
            self.failures = 0
            return True
        delay = self.next_backoff
        self.failures += 1
        await self._sleep(delay)
        return False

    async def pace(self, records: int) -> None:
        """Wait as long as ``records`` re-driven records take at the bounded rate."""
        if records > 0:
            await self._sleep(records / self.records_per_second)


class ReviewMessage(Protocol):
    """What a fetched review message needs to offer (aiokafka's ConsumerRecord does)."""

    offset: int
    value: bytes | None


Redrive = Callable[[Review], Awaitable[int]]  # sends a review's records; how many


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
