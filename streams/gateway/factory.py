"""Build both lanes' gateways from settings, sharing what one provider account shares.

The RPM/TPM buckets, retry budget, cache, backend and token calibration are shared
by the fast and slow lane (they are limits of one model account); each lane gets its
own AIMD limiter capped by its ``max_concurrency``, timeout and prompt detail.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streams.batch.prompt import instruction_texts
from streams.gateway.aimd import AIMDLimiter
from streams.gateway.backends import ChatBackend, build_backend
from streams.gateway.buckets import TokenBucket
from streams.gateway.cache import AnswerCache, build_cache
from streams.gateway.caller import ModelCaller
from streams.gateway.gateway import Gateway
from streams.gateway.probe import Probe, backend_probe
from streams.gateway.quota import QuotaShare, assignment_share
from streams.gateway.retry import RetryBudget
from streams.gateway.telemetry import LaneMetrics
from streams.metrics import Metrics
from streams.settings import Settings
from streams.tokens import TokenCalibration, TokenCounter

OFFLINE_QUOTA = 1e12  # requests or tokens a minute: no limit for the offline analyzer


class CalibratedCounter:
    """A token counter whose counts follow what the provider reports for this model."""

    def __init__(self, counter: TokenCounter, calibration: TokenCalibration, model: str) -> None:
        self.counter = counter
        self.calibration = calibration
        self.model = model
        # raw counts of the prompt's instructions: every window counts them when it opens
        self._instructions: dict[str, int | None] = dict.fromkeys(instruction_texts())

    def count(self, text: str) -> int:
        raw = self._instructions.get(text)
        if raw is None:
            raw = self.counter.count(text)
            if text in self._instructions:
                self._instructions[text] = raw
        return self.calibration.adjust(self.model, raw)

    def of_counted(self, tokens: int) -> int:
        """A count the clean stage made with the same encoding, calibrated: ``adjust``
        with its rounding up written out, as the window asks for every record."""
        scaled = tokens * self.calibration.factor(self.model)
        whole = int(scaled)
        return whole if whole == scaled else whole + 1

    def truncate(self, text: str, max_tokens: int) -> tuple[str, bool]:
        factor = self.calibration.factor(self.model)
        return self.counter.truncate(text, max(1, int(max_tokens / factor)))


@dataclass
class GatewaySet:
    fast: Gateway
    slow: Gateway
    backend: ChatBackend
    cache: AnswerCache
    calibration: TokenCalibration
    counter: TokenCounter
    quota: QuotaShare
    metrics: Metrics | None = None
    _probe: Probe | None = field(default=None, init=False, repr=False)

    def probe(self, *, timeout_seconds: float) -> Probe:
        """This worker's re-drive probe of the backend: through the shared RPM/TPM buckets,
        one in flight at a time (``streams.gateway.probe.backend_probe``)."""
        if self._probe is None:
            self._probe = backend_probe(
                self.backend, model=self.fast.model, timeout_seconds=timeout_seconds,
                rpm=self.quota.rpm, tpm=self.quota.tpm, metrics=self.metrics)
        return self._probe

    def set_quota_share(self, fraction: float, *, floor: float = 0.0) -> None:
        """Use ``fraction`` of RETRO_MODEL__RPM/TPM (the provider's quota), see quota.py."""
        self.quota.set(fraction, floor=floor)

    def follow_assignment(
        self, assigned: Iterable[tuple[str, int]], partitions: Mapping[str, int]
    ) -> float:
        """The batch stage calls this on every rebalance with its lane partitions
        (``partitions``: lane topic -> partition count); returns the share taken."""
        share = assignment_share(assigned, partitions)
        self.set_quota_share(share, floor=1 / sum(partitions.values()))
        return share

    def lane(self, name: str) -> Gateway:
        return self.fast if name == "fast" else self.slow

    def window_counter(self, model: str) -> CalibratedCounter:
        return CalibratedCounter(self.counter, self.calibration, model)

    async def close(self) -> None:
        await self.backend.close()
        await self.cache.close()


def build_gateways(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    counter: TokenCounter | None = None,
    backend: ChatBackend | None = None,
) -> GatewaySet:
    m = settings.model
    counter = counter or TokenCounter(settings.clean.encoding)
    backend = backend or build_backend(m, counter)
    calibration = TokenCalibration()
    cache = build_cache(
        redis_url=m.redis_url, ttl_seconds=m.cache_ttl_seconds, max_size=m.cache_size
    )
    # RETRO_MODEL__RPM/TPM are a provider's quota; the rules backend is this process's
    # own CPU, so it is not throttled by them (1M tokens a minute held the offline
    # pipeline at about 2,300 records/s in bench/e2e_bench.py)
    rpm_quota, tpm_quota = ((m.rpm, m.tpm) if m.effective_backend == "openai"
                            else (OFFLINE_QUOTA, OFFLINE_QUOTA))
    rpm = TokenBucket(rate_per_minute=rpm_quota, setting="RETRO_MODEL__RPM")
    tpm = TokenBucket(rate_per_minute=tpm_quota, setting="RETRO_MODEL__TPM")
    budget = RetryBudget(ratio=m.retry_budget_ratio, minimum=m.retry_budget_min)
    quota = QuotaShare(
        rpm=rpm, tpm=tpm, rpm_quota=rpm_quota, tpm_quota=tpm_quota, metrics=metrics,
        min_tokens=max(settings.fast.context_window, settings.slow.context_window),
    )

    follows = m.effective_backend == "openai" and m.advertised_limits

    def gateway(lane: str) -> Gateway:
        ls = settings.lane(lane)  # type: ignore[arg-type]
        maximum = max(1, min(m.aimd_max, ls.max_concurrency))
        limiter = AIMDLimiter(
            start=min(m.aimd_start, maximum),
            increase=m.aimd_increase,
            decrease_factor=m.aimd_decrease_factor,
            maximum=maximum,
            pause_seconds=m.aimd_pause_seconds,
        )
        caller = ModelCaller(
            backend=backend,
            model=m.name,
            timeout_seconds=ls.timeout_seconds,
            limiter=limiter,
            rpm=rpm,
            tpm=tpm,
            retry_budget=budget,
            max_attempts=m.max_attempts,
            backoff_base=m.backoff_base_seconds,
            calibration=calibration,
            telemetry=LaneMetrics(metrics, lane, model=m.name,  # type: ignore[arg-type]
                                  provider=m.effective_backend),
            sleep=asyncio.sleep,
            rng=random.Random(),
            # the quota the buckets divide follows what the provider advertises
            advertised=quota.advertise if follows else None,
            # and what it says is left caps them (one switch: a proxy balancing several
            # deployments forwards one deployment's counts)
            follow_remaining=follows,
        )
        return Gateway(
            caller,
            prompt_version=m.prompt_version,
            detail=ls.prompt_detail,
            context_window=ls.context_window,
            output_reserve=ls.output_reserve,
            cache=cache,
        )

    return GatewaySet(
        quota=quota,
        fast=gateway("fast"),
        slow=gateway("slow"),
        backend=backend,
        cache=cache,
        calibration=calibration,
        counter=counter,
        metrics=metrics,
    )
