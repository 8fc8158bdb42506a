"""`retro clean PATH...`: the clean stage on files, without Kafka.

Same reader and same Cleaner as the streaming path, so what you see offline is what
the worker does. Coordinates follow records.py: topic = the path as given,
partition 0, offset = the 0-based record number in that file.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from streams.clean.cleaner import Cleaner
from streams.ingest.reader import iter_records, open_source
from streams.records import DeadLetter, RawCoord

if TYPE_CHECKING:
    from streams.metrics import Metrics
    from streams.settings import Settings

logger = logging.getLogger(__name__)

_SOURCE_SUFFIXES = (".gz", ".log", ".json", ".txt")  # as the producer keys sources


@dataclass
class CleanSummary:
    """Counts of one offline run, for the summary table and for callers/tests."""

    records: int = 0
    deadletters: int = 0
    by_format: dict[str, int] = field(default_factory=dict)
    by_lane: dict[str, int] = field(default_factory=dict)
    by_reason: dict[str, int] = field(default_factory=dict)  # dead letters by reason
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        """Raw records (cleaned or dead-lettered) per second."""
        total = self.records + self.deadletters
        return total / self.seconds if self.seconds > 0 else 0.0

    def table(self) -> str:
        """A plain-text table: per format, per lane, dead letters by reason, totals."""
        rows: list[tuple[str, str, int]] = []
        rows += [("format", k, v) for k, v in sorted(self.by_format.items())]
        rows += [("lane", k, v) for k, v in sorted(self.by_lane.items())]
        rows += [("deadletter", k, v) for k, v in sorted(self.by_reason.items())]
        width = max([len(r[1]) for r in rows] + [10])
        lines = [f"{'group':<10}  {'name':<{width}}  {'count':>8}"]
        lines += [f"{g:<10}  {n:<{width}}  {c:>8}" for g, n, c in rows]
        lines.append(
            f"{self.records} records, {self.deadletters} dead letters in "
            f"{self.seconds:.2f}s ({self.rate:.0f} records/s)"
        )
        return "\n".join(lines) + "\n"


def source_name(path: str) -> str:
    """The source of a file: its name without .gz/.log/.json/.txt ("-" is "stdin")."""
    if path == "-":
        return "stdin"
    name = Path(path).name
    for suffix in _SOURCE_SUFFIXES:
        name = name.removesuffix(suffix)
    return name or "unknown"


def run_clean(
    paths: list[str],
    *,
    settings: Settings,
    out: TextIO,
    deadletter: TextIO | None,
    summary: TextIO,
    metrics: Metrics | None = None,
) -> CleanSummary:
    """Clean every record of ``paths``: records to ``out``, dead letters to ``deadletter``.

    One JSON document per line in both outputs; the summary table goes to ``summary``.
    """
    cleaner = Cleaner.from_settings(settings, metrics=metrics)
    result = CleanSummary()
    cap = settings.clean.max_record_bytes
    start = time.perf_counter()
    for path in paths:
        source = source_name(path)
        with open_source(path) as stream:
            for offset, (_line_no, raw) in enumerate(iter_records(stream, max_record_bytes=cap)):
                coord = RawCoord(topic=path, partition=0, offset=offset)
                for cleaned in cleaner.clean(raw, coord, source):  # an envelope holds many
                    if isinstance(cleaned, DeadLetter):
                        result.deadletters += 1
                        if metrics is not None:
                            metrics.deadletters.labels(stage="clean",
                                                       reason=cleaned.reason).inc()
                        _bump(result.by_reason, cleaned.reason)
                        if deadletter is not None:
                            deadletter.write(cleaned.model_dump_json() + "\n")
                        continue
                    result.records += 1
                    _bump(result.by_format, cleaned.format)
                    _bump(result.by_lane, cleaned.lane)
                    out.write(cleaned.model_dump_json() + "\n")
        logger.info("cleaned %s", path)
    result.seconds = time.perf_counter() - start
    summary.write(result.table())
    return result


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1
