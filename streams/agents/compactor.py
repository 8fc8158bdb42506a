"""The compactor agent: fragments merged into reports held in a changelogged table.

Fragments are keyed by report id, so a report's fragments share one partition and
the faust table (partitioned like the fragments topic) is local to the worker that
owns it. After every change the report is published to the compacted
``retro.reports`` topic, which is what every reader uses.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from streams.agents.common import send
from streams.compactor import Report, merge
from streams.errors import RetroError
from streams.metrics import Metrics
from streams.records import Fragment, Review
from streams.settings import Settings

logger = logging.getLogger(__name__)


class ParsedReports:
    """Parsed reports kept next to the table, so a busy day's report is not re-parsed
    from JSON for every fragment. An entry is used only while the table still holds
    the very string it was parsed from (a rebalance or recovery replaces it)."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._items: dict[str, tuple[str, Report]] = {}

    def get(self, report_id: str, stored: str | None) -> Report | None:
        if not stored:
            return None
        hit = self._items.get(report_id)
        if hit is not None and hit[0] is stored:
            return hit[1]
        report = Report.from_json(stored)
        self.put(report_id, stored, report)
        return report

    def put(self, report_id: str, stored: str, report: Report) -> None:
        self._items.pop(report_id, None)
        self._items[report_id] = (stored, report)
        while len(self._items) > self.size:
            self._items.pop(next(iter(self._items)))


def wire_compactor(app: Any, settings: Settings, metrics: Metrics,
                   topics: dict[str, Any]) -> Any:
    # values are the report JSON text; faust json-encodes the string in the changelog
    table = app.Table("retro-reports", default=None, partitions=settings.topics.partitions,
                      key_type=str, value_type=str, extra_topic_configs={
                          "max.message.bytes": str(settings.kafka.max_message_bytes)})
    reports = topics["reports"]
    parsed = ParsedReports()

    @app.agent(topics["fragments"], name="compactor", concurrency=1)
    async def compactor_agent(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            try:
                fragment = Fragment.model_validate_json(event.value)
            except ValidationError as exc:
                logger.error("unreadable fragment at %s[%s]@%s skipped: %s", message.topic,
                             message.partition, message.offset, exc)
                metrics.report_updates.labels("invalid").inc()
                continue
            report_id = (message.key or b"").decode() or "undated/all"
            stored = table.get(report_id)
            current = parsed.get(report_id, stored)
            try:
                updated, result = merge(current, fragment, report_id=report_id,
                                        now=datetime.now(UTC).isoformat().replace("+00:00", "Z"))
            except (RetroError, ValueError) as exc:
                # its records must still be accounted for: a person looks at it
                logger.error("fragment %s cannot be merged into %s: %s", fragment.id, report_id,
                             exc)
                metrics.report_updates.labels("invalid").inc()
                review = Review(id=f"r-{fragment.id}", lane=fragment.lane, reason="bad_fragment",
                                detail=f"could not merge into report {report_id}: {exc}",
                                covered=fragment.covered, record_ids=[], model=fragment.model,
                                prompt_version=fragment.prompt_version, output=None)
                await (await send(topics["review"], key=review.id.encode(),
                                  value=review.model_dump_json().encode()))
                continue
            metrics.report_updates.labels(result).inc()
            if result == "duplicate":
                continue
            body = updated.to_json()
            table[report_id] = body
            parsed.put(report_id, body, updated)
            delivered = await send(reports, key=report_id.encode(), value=body.encode())
            await delivered  # acked after this iteration, i.e. after delivery

    return table
