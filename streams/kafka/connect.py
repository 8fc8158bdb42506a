"""Kafka connection details shared by every command: bootstrap, SASL and TLS.

``RETRO_KAFKA__BOOTSTRAP`` names a cluster; without it every command uses the local
broker that ``retro broker start`` launched (its state file says where it listens).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterable
from typing import Any

from streams.errors import ConfigError, KafkaUnreachable
from streams.kafka.local import local_broker_state
from streams.settings import Settings

logger = logging.getLogger(__name__)


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


DEFAULT_KAFKA_PORT = 9092  # what aiokafka assumes for a bootstrap entry without a port
CONNECT_TIMEOUT_SECONDS = 5.0  # a TCP connect to a bootstrap server
ANSWER_TIMEOUT_SECONDS = 15.0  # its first metadata answer (a busy broker can be slow)


def bootstrap_addresses(bootstrap: str) -> list[tuple[str, int]]:
    """(host, port) of every ``host[:port]`` entry, or a ConfigError naming the bad one.

    Checked here because aiokafka reports a bad entry as a traceback from deep inside.
    """
    addresses = []
    for entry in (e.strip() for e in bootstrap.split(",")):
        if not entry:
            continue
        plain = entry.split("://", 1)[-1]  # PLAINTEXT://host:port is accepted too
        if plain.startswith("["):  # [::1]:9092
            host, _, rest = plain[1:].partition("]")
            port_text = rest.removeprefix(":")
        elif plain.count(":") == 1:
            host, _, port_text = plain.partition(":")
        else:
            host, port_text = plain, ""
        port = int(port_text) if port_text.isdigit() else None
        if not host or (port_text and (port is None or not 0 < port < 65536)):
            raise ConfigError(
                f"bootstrap server {entry!r} is not host:port (from --bootstrap or "
                "RETRO_KAFKA__BOOTSTRAP, e.g. kafka-0.kafka:9092,kafka-1.kafka:9092)")
        addresses.append((host, port or DEFAULT_KAFKA_PORT))
    if not addresses:
        raise ConfigError("the bootstrap server list is empty (--bootstrap or "
                          "RETRO_KAFKA__BOOTSTRAP, e.g. kafka:9092)")
    return addresses


def check_reachable(settings: Settings, *, timeout: float = CONNECT_TIMEOUT_SECONDS,
                    answer_timeout: float = ANSWER_TIMEOUT_SECONDS) -> str:
    """The bootstrap servers, once one accepts a connection and Kafka answers there.

    Clients would otherwise retry for their whole request timeout and then fail with a
    traceback that does not say which address to fix.
    """
    bootstrap = resolve_bootstrap(settings)
    source = ("--bootstrap / RETRO_KAFKA__BOOTSTRAP" if settings.kafka.bootstrap
              else f"the local broker's state in {settings.state_dir}")
    failures = []
    for host, port in bootstrap_addresses(bootstrap):
        try:
            with socket.create_connection((host, port), timeout=timeout):
                break
        except OSError as exc:
            failures.append(f"{host}:{port} ({_why(exc)})")
    else:
        raise KafkaUnreachable(
            f"cannot reach Kafka at {', '.join(failures)}: check the address in {source}, "
            "that the broker is running (`retro broker status` for the local one) and that "
            "nothing blocks the port")
    problem = asyncio.run(_kafka_problem(settings, answer_timeout))
    if problem:
        raise KafkaUnreachable(
            f"{bootstrap} accepts connections but Kafka does not answer ({problem}): check "
            f"the address in {source} and RETRO_KAFKA__SECURITY_PROTOCOL / SASL / SSL settings")
    return bootstrap


async def _kafka_problem(settings: Settings, timeout: float) -> str | None:
    """Why a metadata request to the cluster fails, or None when it succeeds."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaConnectionError

    admin = AIOKafkaAdminClient(**aiokafka_kwargs(settings), request_timeout_ms=int(
        timeout * 1000))
    client_log = logging.getLogger("aiokafka")
    level = client_log.level
    try:
        client_log.setLevel(logging.CRITICAL)  # its "Unable connect" line repeats ours
        await asyncio.wait_for(admin.start(), timeout)
    except TimeoutError:
        return f"no answer within {timeout:.0f}s"
    except KafkaConnectionError:
        return "the connection closed without a Kafka answer"
    except Exception as exc:  # any failure here is the answer we report
        return str(exc) or type(exc).__name__
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
        client_log.setLevel(level)
    return None


def _why(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer, timed out"
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return exc.strerror or type(exc).__name__


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


async def partition_leaders(admin: Any, topics: list[str]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> its leader's broker id (-1: none now) of every partition of
    ``topics``, from fresh metadata of all topics (the admin client's public describe:
    naming topics there would let a broker that auto-creates topics create them); a
    topic that does not exist has none."""
    wanted = set(topics)
    out: dict[tuple[str, int], int] = {}
    for topic in await admin.describe_topics() if wanted else ():
        if topic["topic"] in wanted:
            for partition in topic["partitions"]:
                out[(topic["topic"], partition["partition"])] = partition["leader"]
    return out


def stage_producer(settings: Settings) -> Any:
    """The producer of a stage loop: acks from all replicas, 10 ms linger and 256 KiB
    batches (many small produce requests cost a worker more than the wait)."""
    from aiokafka import AIOKafkaProducer

    return AIOKafkaProducer(**aiokafka_kwargs(settings), acks="all", linger_ms=10,
                            max_batch_size=256 * 1024,
                            max_request_size=settings.kafka.max_message_bytes,
                            compression_type=compression_type(settings))


async def produce_all(settings: Settings, outs: Iterable[Any]) -> int:
    """Send ``outs`` (each with its ``topic``, ``key`` and ``value``) with a stage's
    producer and wait until every one is on the broker; how many."""
    outs = list(outs)
    if not outs:
        return 0
    producer = stage_producer(settings)
    try:
        await producer.start()
        await asyncio.gather(*[await producer.send(o.topic, o.value, key=o.key) for o in outs])
        return len(outs)
    finally:
        await producer.stop()


def compression_type(settings: Settings) -> str | None:
    """aiokafka's name for ``RETRO_KAFKA__COMPRESSION``: None sends batches uncompressed."""
    codec = settings.kafka.compression
    return None if codec == "none" else codec


# aiokafka keeps one fetch in flight per broker: a long poll on a caught-up partition
# holds back the next fetch of every other partition on that broker for this long
FETCH_WAIT_MS = 100
# loops whose topics seldom carry anything (reviews, fragments, notifications) poll
# less often: each idle long poll is a request the worker and the broker both handle
QUIET_FETCH_WAIT_MS = 500


def stage_consumer(settings: Settings, group: str, *topics: str, **options: Any) -> Any:
    """The consumer of a stage loop in its own group: commits by hand, starts at the
    earliest offset, long-polls for at most ``FETCH_WAIT_MS``, and leaves the group as fast
    as ``RETRO_KAFKA__SESSION_TIMEOUT_SECONDS`` says; ``options`` are the loop's own (fetch
    sizes, poll interval)."""
    from aiokafka import AIOKafkaConsumer

    session = settings.kafka.session_timeout_seconds
    return AIOKafkaConsumer(
        *topics, **aiokafka_kwargs(settings), group_id=group,
        enable_auto_commit=False, auto_offset_reset="earliest",
        session_timeout_ms=int(session * 1000),
        heartbeat_interval_ms=int(heartbeat_seconds(settings) * 1000),
        **{"fetch_max_wait_ms": FETCH_WAIT_MS, **options})


def heartbeat_seconds(settings: Settings) -> float:
    """How often a member hears of a rebalance: a member learns of one from its next
    heartbeat, and the group waits for every member, so each worker joining stalled
    all loops for up to a heartbeat (3 s at session/10); a third of the session at most."""
    return min(1.0, settings.kafka.session_timeout_seconds / 3)


async def commit_owned(consumer: Any, offsets: dict[Any, int]) -> None:
    """Commit ``offsets`` of the partitions ``consumer`` still owns. A commit refused by a
    rebalance is logged, not raised: the partitions' new owner reads those records again."""
    from aiokafka.errors import CommitFailedError, IllegalStateError

    owned = consumer.assignment()
    offsets = {tp: offset for tp, offset in offsets.items() if tp in owned}
    if not offsets:
        return
    try:
        await consumer.commit(offsets)
    except (CommitFailedError, IllegalStateError) as exc:
        logger.warning("commit refused after a rebalance (%s); the partitions' new owner "
                       "reads those records again", exc)
