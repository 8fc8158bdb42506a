"""Read reports back from the compacted ``retro.reports`` topic.

The topic is the report store: the latest message per key is the current report.
`retro report`, `retro audit` and every worker's HTTP view read it this way, so any
worker can show every report no matter which worker's compactor owns it. The reading
is Kafka's (``streams.kafka.readers``); what is kept of it is the report's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from streams.kafka.readers import follow, latest_per_key
from streams.report.state.keys import SHARD_MARK, previous_window, report_of
from streams.report.state.merge import compose
from streams.report.state.model import Report
from streams.settings import Settings

logger = logging.getLogger(__name__)


class LatestReports:
    """The latest message per report id, decoded only when someone asks for it.

    A busy report is published many times, and decoding every version as it passes
    would cost far more than the few a view reads. Only the bytes are kept until a view asks.
    """

    def __init__(self) -> None:
        self._raw: dict[str, bytes] = {}  # by compaction key ("<report id>#<share>")
        self._decoded: dict[str, Report] = {}
        self._keys: dict[str, set[str]] = {}  # report id -> its compaction keys
        # report id -> the shares it was last composed of, and that composition
        self._composed_of: dict[str, tuple[list[Report], Report]] = {}

    def put(self, key: bytes | None, value: bytes | None) -> bool:
        """Keep a message as the latest of its id; False for tombstones and keyless ones."""
        if key is None or value is None:
            return False
        text = key.decode(errors="replace")
        self._raw[text] = value
        self._decoded.pop(text, None)
        self._keys.setdefault(report_of(text), set()).add(text)
        return True

    def _shard(self, key: str) -> Report | None:
        report = self._decoded.get(key)
        if report is not None:
            return report
        value = self._raw.get(key)
        if value is None:
            return None
        try:
            report = Report.from_json(value)
        except ValueError:
            logger.warning("skipping an unreadable report %r", key)
            return None
        self._decoded[key] = report
        return report

    def shards(self) -> dict[str, Report]:
        """Every stored report as it was published: one per compaction key."""
        return {key: r for key in list(self._raw) if (r := self._shard(key)) is not None}

    def get(self, report_id: str) -> Report | None:
        """The report composed from its shares (``streams.report.state.keys.report_of``),
        knowing the report of its window before (its baseline's first hours)."""
        report = self._composed(report_id)
        if report is not None:
            before = previous_window(report_id, self._keys)
            report.follows(self._composed(before) if before is not None else None)
        return report

    def share_before(self, key: str) -> Report | None:
        """The share of the window before that ``key`` (a compaction key) continues:
        the same share, as records keep their raw partition from one window to the next."""
        before = previous_window(key, self._keys)
        if before is None:
            return None
        _, mark, share = key.partition(SHARD_MARK)
        return self._shard(f"{before}{mark}{share}")

    def _composed(self, report_id: str) -> Report | None:
        """Composed again only when one of its shares has a newer version: the notifier
        asks for every report (and the one before it) each second."""
        parts = [r for key in sorted(self._keys.get(report_id, ()))
                 if (r := self._shard(key)) is not None]
        if not parts:
            return None
        held = self._composed_of.get(report_id)
        if held is not None and len(held[0]) == len(parts) \
                and all(a is b for a, b in zip(held[0], parts, strict=True)):
            return held[1]
        report = compose(report_id, parts)
        self._composed_of[report_id] = (parts, report)
        return report

    def ids(self) -> list[str]:
        """The ids of the reports held, sorted (nothing is decoded)."""
        return sorted(self._keys)

    def values(self) -> list[Report]:
        return [r for rid in sorted(self._keys) if (r := self.get(rid)) is not None]

    def as_dict(self) -> dict[str, Report]:
        return {r.id: r for r in self.values()}

    def __len__(self) -> int:
        return len(self._raw)


async def read_latest(settings: Settings) -> LatestReports:
    """The latest message per compaction key of the reports topic."""
    latest = LatestReports()
    for key, message in (await latest_per_key(settings, settings.topics.reports)).items():
        latest.put(key, message.value)
    return latest


async def read_reports(settings: Settings) -> dict[str, Report]:
    """Latest report per id, composed from its shares."""
    return (await read_latest(settings)).as_dict()


class ReportFollower:
    """Keeps the latest reports in memory by following the topic (for HTTP views)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.reports = LatestReports()
        self.changed = asyncio.Event()
        # set once every version there was at the start has been read: before, a report
        # may lack shares (the notifier waits for it)
        self.caught_up = asyncio.Event()

    async def run(self) -> None:
        await follow(self.settings, self.settings.topics.reports, self._take, self.caught_up)

    def _take(self, message: Any) -> None:
        if self.reports.put(message.key, message.value):
            self.changed.set()
