"""Create the pipeline's topics with explicit partition counts and configs.

Run by ``retro worker`` and ``retro produce`` before they start, so a fresh cluster
needs no manual set-up; an existing topic is left as it is (partitions are only ever
raised by an operator, since that reshuffles keys).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.kafka import aiokafka_kwargs
from streams.settings import Settings

logger = logging.getLogger(__name__)

LONG_RETENTION_MS = 30 * 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(settings: Settings) -> list[TopicSpec]:
    t = settings.topics
    data = {"retention.ms": str(t.retention_ms)}
    keep = {"retention.ms": str(LONG_RETENTION_MS)}
    return [
        TopicSpec(t.raw, t.partitions, data),
        TopicSpec(t.fast, t.partitions, data),
        TopicSpec(t.slow, t.partitions, data),
        TopicSpec(t.deadletter, t.partitions, keep),
        TopicSpec(t.fragments, t.partitions, data),
        TopicSpec(t.review, t.partitions, keep),
        # latest report per key survives forever: the topic is the report store
        TopicSpec(t.reports, t.partitions, {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": "0.1",
            "segment.ms": str(3600 * 1000),
            "max.message.bytes": str(settings.kafka.max_message_bytes),
        }),
    ]


async def ensure_topics(settings: Settings) -> list[str]:
    """Create missing topics; returns the names created."""
    admin = AIOKafkaAdminClient(**aiokafka_kwargs(settings))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in topic_specs(settings) if s.name not in existing]
        if not missing:
            return []
        new = [NewTopic(s.name, s.partitions, settings.topics.replication, topic_configs=s.config)
               for s in missing]
        try:
            response = await admin.create_topics(new)
        except TopicAlreadyExistsError:
            return []
        for name, code, message in _errors(response):
            if code not in (0, 36):  # 36: already exists (a racing worker made it)
                logger.error("creating topic %s failed: %s (%s)", name, message, code)
        created = [s.name for s in missing]
        logger.info("created topics %s", ", ".join(created))
        return created
    finally:
        await admin.close()


def _errors(response: object) -> list[tuple[str, int, str | None]]:
    out = []
    for item in getattr(response, "topic_errors", []):
        name, code, *rest = item
        out.append((name, code, rest[0] if rest else None))
    return out
