"""Is the model provider answering? A one-token request, before parked records are re-driven.

The re-drive (``streams.report.ops.redrive``) waits for this probe before it sends a
review's records back to the lanes.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable

from streams.errors import PermanentModelError, RateLimited, TransientModelError
from streams.gateway.backends import ChatBackend
from streams.gateway.buckets import TokenBucket
from streams.metrics import Metrics

logger = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[bool]]

PROBE_TOKENS = 16  # what a probe takes from the TPM bucket: a short prompt and one token
# the probes in flight, per backend object: a second caller waits for the first's answer
_IN_FLIGHT: dict[int, asyncio.Future[bool]] = {}


def backend_probe(backend: ChatBackend, *, model: str, timeout_seconds: float,
                  rpm: TokenBucket | None = None, tpm: TokenBucket | None = None,
                  metrics: Metrics | None = None) -> Probe:
    """A one-token request: healthy when the provider answers it at all.

    A 429, a 5xx, a timeout or a refused connection is unhealthy. A permanent refusal
    (say a 400 for the tiny prompt) still shows a provider that answers, so it counts
    as healthy: the re-driven batches meet their own errors in the gateway.

    A probe is a model call like any other: it takes a request from ``rpm`` and
    ``PROBE_TOKENS`` from ``tpm`` (the buckets the lanes share; waiting there is not
    counted in ``timeout_seconds``), and a 429 blocks those buckets for its Retry-After
    as a lane's would. At most one probe per backend is in flight in a process; a probe
    asked for meanwhile shares its answer. The prompt carries a nonce, so neither a
    gateway's answer cache nor an idempotency key can answer for a provider that is down.
    """

    async def probe() -> bool:
        running = _IN_FLIGHT.get(id(backend))
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        _IN_FLIGHT[id(backend)] = future
        try:
            healthy = await _probe_once()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a probe nobody shared must not warn
            raise
        finally:
            _IN_FLIGHT.pop(id(backend), None)
        future.set_result(healthy)
        if metrics is not None:
            metrics.redrive_probes.labels("healthy" if healthy else "unhealthy").inc()
        return healthy

    async def _probe_once() -> bool:
        if rpm is not None:
            await rpm.acquire(1)
        if tpm is not None:
            await tpm.acquire(min(PROBE_TOKENS, tpm.capacity))
        messages = [{"role": "user", "content": f"ping {secrets.token_hex(4)}"}]
        try:
            async with asyncio.timeout(timeout_seconds):
                await backend.chat(model=model, max_tokens=1, timeout=timeout_seconds,
                                   messages=messages)
        except RateLimited as exc:
            if exc.retry_after:
                for bucket in (rpm, tpm):
                    if bucket is not None:
                        bucket.penalize(exc.retry_after)
            logger.info("re-drive probe: the provider is not answering yet: %s", exc)
            return False
        except (TransientModelError, TimeoutError) as exc:
            logger.info("re-drive probe: the provider is not answering yet: %s", exc)
            return False
        except PermanentModelError as exc:
            logger.debug("re-drive probe answered with a refusal, counted healthy: %s", exc)
        return True

    return probe
