"""Kafka connection details shared by every command: bootstrap, SASL and TLS.

``RETRO_KAFKA__BOOTSTRAP`` names a cluster; without it every command uses the local
broker that ``retro broker start`` launched (its state file says where it listens).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from streams.errors import ConfigError
from streams.kafka.local import local_broker_state
from streams.settings import Settings


def resolve_bootstrap(settings: Settings) -> str:
    """The bootstrap servers to use, or a ConfigError that says how to get one."""
    if settings.kafka.bootstrap:
        return settings.kafka.bootstrap
    state = local_broker_state(settings.state_dir)
    if state is None:
        raise ConfigError(
            "no Kafka broker: set RETRO_KAFKA__BOOTSTRAP=host:port, or run "
            f"`retro broker start` (state dir {settings.state_dir.resolve()})"
        )
    return state.bootstrap


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    k = settings.kafka
    if k.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    context = ssl.create_default_context(cafile=str(k.ssl_cafile) if k.ssl_cafile else None)
    if k.ssl_certfile:
        context.load_cert_chain(str(k.ssl_certfile), str(k.ssl_keyfile) if k.ssl_keyfile else None)
    return context


def aiokafka_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for AIOKafkaProducer / Consumer / AdminClient."""
    k = settings.kafka
    kwargs: dict[str, Any] = {
        "bootstrap_servers": resolve_bootstrap(settings),
        "security_protocol": k.security_protocol,
    }
    if k.security_protocol.startswith("SASL"):
        if not (k.sasl_mechanism and k.sasl_username and k.sasl_password):
            raise ConfigError(
                "SASL needs RETRO_KAFKA__SASL_MECHANISM, RETRO_KAFKA__SASL_USERNAME and "
                "RETRO_KAFKA__SASL_PASSWORD"
            )
        kwargs.update(
            sasl_mechanism=k.sasl_mechanism,
            sasl_plain_username=k.sasl_username,
            sasl_plain_password=k.sasl_password.get_secret_value(),
        )
    context = ssl_context(settings)
    if context is not None:
        kwargs["ssl_context"] = context
    return kwargs


def faust_credentials(settings: Settings) -> Any:
    """faust's broker_credentials object for SASL/TLS, or None for PLAINTEXT."""
    import faust

    k = settings.kafka
    context = ssl_context(settings)
    if k.security_protocol.startswith("SASL"):
        kwargs = aiokafka_kwargs(settings)
        return faust.SASLCredentials(
            username=kwargs["sasl_plain_username"],
            password=kwargs["sasl_plain_password"],
            mechanism=k.sasl_mechanism,
            ssl_context=context,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


async def stop_consumer(consumer: Any) -> None:
    """Stop an aiokafka consumer, absorbing the CancelledError its internal
    committed-offsets task can leak when a consumer is stopped soon after start
    (only when our own task is not being cancelled)."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


async def partitions_of(consumer: Any, topic: str) -> list[int]:
    """Partition ids of ``topic``, fetching fresh metadata when the client has none."""
    known = consumer.partitions_for_topic(topic)
    if not known:
        cluster = await consumer._client.fetch_all_metadata()
        known = cluster.partitions_for_topic(topic)
    return sorted(known or [])
