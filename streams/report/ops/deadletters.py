"""`retro deadletter`: what was dead-lettered and why.

Bad input never stops the pipeline: it lands on ``retro.deadletter`` with a reason
code, a detail for a person and the raw bytes. This reads that topic back and sums
it up (counts per reason, the latest entries with their raw coordinates) so an
operator can see what to fix at the source without a Kafka console.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from streams.kafka.readers import read_values
from streams.records import DeadLetter
from streams.report.views.view import printable
from streams.settings import Settings


@dataclass(frozen=True)
class Entry:
    """One dead letter and when it was written (Kafka message time, ms since epoch)."""

    letter: DeadLetter
    timestamp_ms: int

    @property
    def when(self) -> str:
        at = datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)
        return at.strftime("%Y-%m-%dT%H:%M:%SZ")

    def to_json(self, *, raw: bool = False) -> dict[str, Any]:
        out = {
            "written_at": self.when,
            "raw": self.letter.raw.id,
            "source": self.letter.source,
            "stage": self.letter.stage,
            "reason": self.letter.reason,
            "detail": self.letter.detail,
            "raw_bytes": (self.letter.raw_size if self.letter.raw_size is not None
                          else len(base64.b64decode(self.letter.raw_base64))),
        }
        if self.letter.raw_sha256:
            out["raw_sha256"] = self.letter.raw_sha256
        if raw:
            out["sample"] = self.letter.sample  # redacted text
            out["raw_base64"] = self.letter.raw_base64
            out["raw_sampled"] = self.letter.raw_sampled
        return out


@dataclass
class DeadLetterSummary:
    topic: str
    total: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)  # most frequent first
    latest: list[Entry] = field(default_factory=list)  # newest first
    unreadable: int = 0  # messages on the topic that are not dead letters


def summarize(entries: list[Entry], *, topic: str, latest: int = 10,
              unreadable: int = 0) -> DeadLetterSummary:
    """Counts per reason and the ``latest`` newest entries.

    A dead letter re-sent after a crash (same id) is counted once, as the audit does.
    """
    unique: dict[str, Entry] = {}
    for entry in entries:
        unique.setdefault(entry.letter.id, entry)
    reasons = Counter(e.letter.reason for e in unique.values())
    newest = sorted(unique.values(), key=lambda e: (e.timestamp_ms, e.letter.raw.as_tuple()),
                    reverse=True)
    return DeadLetterSummary(
        topic=topic, total=len(unique),
        by_reason=dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        latest=newest[:max(0, latest)], unreadable=unreadable)


def render_text(summary: DeadLetterSummary) -> str:
    """For a terminal: counts per reason, then one line per recent entry."""
    if not summary.total:
        return f"no dead letters on {summary.topic}"
    lines = [f"{summary.total} dead letters on {summary.topic}", "", "by reason:"]
    width = max(len(str(n)) for n in summary.by_reason.values())
    lines += [f"  {n:>{width}}  {reason}" for reason, n in summary.by_reason.items()]
    if summary.unreadable:
        lines.append(f"  ({summary.unreadable} messages on the topic were not dead letters)")
    lines += ["", f"latest {len(summary.latest)} (newest first):"]
    for e in summary.latest:
        # ids, sources and reasons come from Kafka keys and file names: no raw controls
        lines.append(printable(f"  {e.when}  {e.letter.raw.id}  {e.letter.stage}/"
                               f"{e.letter.reason}  source={e.letter.source}"))
        lines.append(f"      {printable(_one_line(e.letter.detail))}")
    return "\n".join(lines)


def render_json(summary: DeadLetterSummary, *, raw: bool = False) -> str:
    return json.dumps({
        "topic": summary.topic, "total": summary.total, "by_reason": summary.by_reason,
        "unreadable": summary.unreadable,
        "latest": [e.to_json(raw=raw) for e in summary.latest],
    }, indent=2)


async def read_deadletters(settings: Settings, *, latest: int = 10) -> DeadLetterSummary:
    """Read the whole dead-letter topic (it is small: bad records only) and sum it up."""
    topic = settings.topics.deadletter
    letters, unreadable = await read_values(settings, topic, DeadLetter.model_validate_json)
    return summarize([Entry(letter, at) for letter, at in letters], topic=topic,
                     latest=latest, unreadable=unreadable)


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"
