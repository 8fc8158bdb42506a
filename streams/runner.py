"""Run the worker for `retro worker` (topics first, then the stage loops under faust)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from streams.app import build_app, consumer_groups
from streams.kafka.connect import bootstrap_addresses, resolve_bootstrap
from streams.kafka.log_guard import logging_config
from streams.kafka.probe import ExitWhenUnreachable
from streams.kafka.topics import ensure_group_offsets, ensure_topics
from streams.settings import Settings

logger = logging.getLogger(__name__)

# young-generation threshold for the cyclic garbage collector (CPython's default: 700)
GC_GEN0_THRESHOLD = 20_000


def tune_gc(gen0: int = GC_GEN0_THRESHOLD) -> None:
    """Keep the cyclic garbage collector off what lives until exit.

    Objects created at start-up (modules, schemas, the app) are frozen out of the
    collector's reach, and a larger young generation lets a fetch's records die before
    they are ever scanned; garbage without reference cycles (records, messages) is
    still freed at once by reference counting.
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)


class Drains(Protocol):
    async def drain(self, timeout: float) -> None: ...


async def drain_within(loops: Sequence[Drains], seconds: float, *,
                       clock: Callable[[], float] = time.monotonic) -> None:
    """Drain the stage loops in flow order within ``seconds`` in all
    (RETRO_SHUTDOWN_SECONDS), so the pod's grace period bounds the whole shutdown: what
    a stage delivers while draining reaches the next before that one drains, and a loop
    left no time still commits what it finished and leaves its group."""
    deadline = clock() + seconds
    for loop in loops:
        await loop.drain(timeout=max(0.0, deadline - clock()))


def host_worker(app: Any, settings: Settings) -> Any:
    """faust's Worker hosting ``app``, as faust offers it: no method replaced.

    faust sets the logging up itself when it starts (it clears the root logger's
    handlers first); its ``logging_config`` option gives it the configuration to set
    up: one line per record on stderr, as every other command writes them, with
    repeated warnings limited (a broker outage is a few lines, not MB/s).
    """
    from faust import Worker

    return Worker(app, loglevel=settings.log_level.lower(), quiet=True,
                  redirect_stdouts=False, logging_config=logging_config(settings.log_level))


def run_worker(settings: Settings, *, roles: tuple[str, ...]) -> int:
    asyncio.run(ensure_topics(settings))
    try:
        for gid, topics in consumer_groups(settings, roles).items():
            asyncio.run(ensure_group_offsets(settings, gid, topics))
    except Exception as exc:  # a safety net, not a reason to refuse to start
        logger.warning("could not initialise consumer group offsets: %r", exc)
    worker = build_app(settings, roles=roles)
    # resolved now: `retro broker stop` removes the local broker's state file
    kafka_addresses = bootstrap_addresses(resolve_bootstrap(settings))
    faust_worker = host_worker(worker.app, settings)

    async def _close_gateways() -> None:
        # the batch loop's last fragments reach the compactor before it drains
        await drain_within(worker.loops, settings.shutdown_seconds)
        if worker.gateways is not None:
            await worker.gateways.close()

    @worker.app.on_before_shutdown.connect
    async def _on_shutdown(app: object, **kwargs: object) -> None:
        # with the broker gone the orderly stop would wait out every client timeout
        ExitWhenUnreachable(kafka_addresses).start()
        await _close_gateways()

    tune_gc()  # once the app is built: what exists now lives until exit
    faust_worker.execute_from_commandline()
    return 0
