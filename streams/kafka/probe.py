"""Readiness: can this worker reach Kafka at all?

faust and aiokafka retry a lost broker forever without telling anyone; a worker that
cannot reach Kafka still answered ``/healthz`` 200. :class:`BrokerProbe` opens a TCP
connection to the bootstrap servers every few seconds; once none has answered for
``grace_seconds`` readiness fails with the reason, while liveness stays ok (a restart
would not bring the broker back). It logs once when the broker goes and once when it
returns, instead of the clients' stream of connection errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable

from streams.clock import Clock

logger = logging.getLogger(__name__)

Connect = Callable[[str, int, float], Awaitable[None]]


async def tcp_connect(host: str, port: int, timeout: float) -> None:
    """Open and close a TCP connection; raises OSError or TimeoutError."""
    _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


class BrokerProbe:
    """Whether any bootstrap server has accepted a connection in the last ``grace_seconds``."""

    def __init__(self, addresses: list[tuple[str, int]], *, grace_seconds: float = 5.0,
                 timeout: float = 3.0, connect: Connect = tcp_connect,
                 clock: Clock = time.monotonic) -> None:
        if not addresses:
            raise ValueError("BrokerProbe needs at least one bootstrap address")
        self.addresses = addresses
        self.grace_seconds = grace_seconds
        self.timeout = timeout
        self.connect = connect
        self.clock = clock
        self.down_since: float | None = None
        self.reason: str | None = None

    @property
    def where(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.addresses)

    async def check(self) -> bool:
        """Probe once; True when a bootstrap server accepted the connection."""
        errors = []
        for host, port in self.addresses:
            try:
                await self.connect(host, port, self.timeout)
            except (OSError, TimeoutError) as exc:
                errors.append(f"{host}:{port} {_why(exc)}")
                continue
            if self.down_since is not None:
                logger.warning("Kafka at %s is reachable again after %.0fs", self.where,
                               self.clock() - self.down_since)
            self.down_since, self.reason = None, None
            return True
        if self.down_since is None:
            self.down_since = self.clock()
            logger.error("Kafka at %s is unreachable (%s); the clients keep retrying and "
                         "readiness fails until it answers again", self.where,
                         "; ".join(errors))
        self.reason = "; ".join(errors)
        return False

    def unreachable(self) -> str | None:
        """Why Kafka counts as unreachable now, or None."""
        if self.down_since is None or self.clock() - self.down_since < self.grace_seconds:
            return None
        return (f"Kafka at {self.where} unreachable for {self.clock() - self.down_since:.0f}s "
                f"({self.reason})")


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return getattr(exc, "strerror", None) or type(exc).__name__


def can_connect(host: str, port: int, timeout: float = 1.0) -> bool:
    """A blocking TCP connect, for a thread that must not depend on the event loop."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


EXIT_KAFKA_GONE = 1


class ExitWhenUnreachable:
    """After SIGTERM, leave at once if Kafka stays unreachable.

    An orderly stop commits offsets, leaves the group and flushes the producer: with
    the broker gone each step waits for its own timeout (faust's consumer thread
    alone waited 60 s), so a pod would be killed at the end of its grace period. With
    no broker nothing can be committed or handed back anyway: records not committed
    are read again by the partitions' next owner. A thread, not a task: the event loop
    may be the thing that is stuck.
    """

    def __init__(self, addresses: list[tuple[str, int]], *, after_seconds: float = 3.0,
                 interval: float = 1.0, connect: Callable[[str, int], bool] = can_connect,
                 exit: Callable[[int], object] = os._exit,
                 clock: Clock = time.monotonic) -> None:
        self.addresses = addresses
        self.after_seconds = after_seconds
        self.interval = interval
        self.connect = connect
        self.exit = exit
        self.clock = clock
        self.started = clock()
        self.failures = 0
        self._stop = threading.Event()

    def check(self) -> bool:
        """Probe once; True (after exiting) when Kafka has been unreachable long enough."""
        if any(self.connect(host, port) for host, port in self.addresses):
            self.failures = 0
            return False
        self.failures += 1
        if self.failures < 2 or self.clock() - self.started < self.after_seconds:
            return False
        logger.error("shutting down with Kafka unreachable at %s: exiting without "
                     "committing; records not committed are read again by the next owner",
                     ",".join(f"{h}:{p}" for h, p in self.addresses))
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        self.exit(EXIT_KAFKA_GONE)
        return True

    def start(self) -> None:
        threading.Thread(target=self._run, name="exit-when-kafka-unreachable",
                         daemon=True).start()

    def cancel(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.check():
                return
            self._stop.wait(self.interval)
