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
from streams.errors import RetroError
from streams.gateway.gateway import Gateway
from streams.gateway.rollup_prompt import ROLLUP_KIND, rollup_messages
from streams.metrics import Metrics
from streams.records import Fragment, Review
from streams.report.merge import merge
from streams.report.model import Report
from streams.report.rollup import (
    RollupUpdate,
    apply_rollup,
    needs_rollup,
    rollup_payload,
)
from streams.settings import Settings

logger = logging.getLogger(__name__)

KIND_HEADER = "retro-kind"  # fragments topic messages that are not fragments say what they are


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
                   topics: dict[str, Any], gateway: Gateway | None = None) -> Any:
    # values are the report JSON text; faust json-encodes the string in the changelog
    table = app.Table("retro-reports", default=None, partitions=settings.topics.partitions,
                      key_type=str, value_type=str, extra_topic_configs={
                          "max.message.bytes": str(settings.kafka.max_message_bytes)})
    reports = topics["reports"]
    parsed = ParsedReports()

    async def publish(report_id: str, updated: Report) -> None:
        body = updated.to_json()
        table[report_id] = body
        parsed.put(report_id, body, updated)
        delivered = await send(reports, key=report_id.encode(), value=body.encode())
        await delivered  # acked after this iteration, i.e. after delivery

    @app.agent(topics["fragments"], name="compactor", concurrency=1)
    async def compactor_agent(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            if _kind(message) == ROLLUP_KIND:
                await _apply_rollup(event.value, table, parsed, publish)
                continue
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
            if result != "duplicate":
                await publish(report_id, updated)

    if gateway is not None and settings.report.rollup_seconds > 0:
        _wire_rollup(app, settings, table, parsed, gateway, topics["fragments"])
    return table


def _kind(message: Any) -> str | None:
    headers = message.headers or []
    items = headers.items() if isinstance(headers, dict) else headers
    for key, value in items:
        if key == KIND_HEADER:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


async def _apply_rollup(value: bytes, table: Any, parsed: ParsedReports, publish: Any) -> None:
    try:
        update = RollupUpdate.from_json(value)
    except ValueError as exc:
        logger.error("unreadable roll-up skipped: %s", exc)
        return
    current = parsed.get(update.report_id, table.get(update.report_id))
    if current is None:
        return
    updated, changed = apply_rollup(current, update,
                                    now=datetime.now(UTC).isoformat().replace("+00:00", "Z"))
    if changed:
        await publish(update.report_id, updated)


def _wire_rollup(app: Any, settings: Settings, table: Any, parsed: ParsedReports,
                 gateway: Gateway, fragments: Any) -> None:
    """On a timer, summarize incidents that grew; the summary goes back through the
    fragments topic (keyed by report) because faust tables are written in-stream only."""
    model = settings.model

    @app.timer(interval=settings.report.rollup_seconds)
    async def rollup_incidents() -> None:
        for report_id, stored in list(table.items()):
            report = parsed.get(report_id, stored)
            if report is None:
                continue
            for incident in report.incidents:
                if not needs_rollup(incident):
                    continue
                payload = rollup_payload(report_id, incident, report=report)
                messages = rollup_messages(payload, prompt_version=model.prompt_version)
                summary, reason = await gateway.summarize(messages)
                if summary is None:
                    logger.warning("no roll-up for incident %s of %s: %s", incident.key,
                                   report_id, reason)
                    continue
                update = RollupUpdate(report_id=report_id, incident_key=incident.key,
                                      summary=summary, based_on_count=incident.count,
                                      model=model.name, prompt_version=model.prompt_version)
                await send(fragments, key=report_id.encode(), value=update.to_json().encode(),
                           headers=[(KIND_HEADER, ROLLUP_KIND.encode())])
