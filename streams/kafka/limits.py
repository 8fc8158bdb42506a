"""How large a message a topic takes: its ``max.message.bytes``, asked of the broker.

A topic made by someone else (Strimzi, an operator, another team) may take less than
the settings assume; a producer that asks knows which records cannot be sent at all.
"""

from __future__ import annotations

import contextlib
import logging

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streams.kafka.connect import aiokafka_kwargs
from streams.settings import Settings

logger = logging.getLogger(__name__)

KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588  # the broker's message.max.bytes default
# bytes of a one-record batch besides key, value and headers: the batch header (61)
# plus the record's varints, with room to spare
RECORD_OVERHEAD_BYTES = 512


async def topic_max_message_bytes(settings: Settings, topic: str) -> int:
    """The topic's ``max.message.bytes``; the Kafka default when the broker does not say."""
    admin = AIOKafkaAdminClient(**aiokafka_kwargs(settings))
    try:
        await admin.start()
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, configs={"max.message.bytes": None})])
        for response in responses:
            for _code, _msg, _type, _name, entries in response.resources:
                for entry in entries:
                    if entry[0] == "max.message.bytes" and entry[1]:
                        return int(entry[1])
    except Exception as exc:  # an ACL may forbid describing configs: assume the default
        logger.warning("could not read max.message.bytes of %s (%r); assuming Kafka's "
                       "default of %s bytes", topic, exc, KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    return KAFKA_DEFAULT_MAX_MESSAGE_BYTES


def value_limit(max_message_bytes: int, *, key: bytes, headers: list[tuple[str, bytes]]) -> int:
    """The largest value that fits one message of ``max_message_bytes`` with this key and
    these headers (uncompressed: what compression saves is not counted on)."""
    extra = len(key) + sum(len(name) + len(value) + 8 for name, value in headers)
    return max(0, max_message_bytes - RECORD_OVERHEAD_BYTES - extra)
