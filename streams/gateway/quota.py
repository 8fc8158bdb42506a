"""The provider's quota shared across pods by consumer-group membership.

``RETRO_MODEL__RPM`` and ``RETRO_MODEL__TPM`` are the provider account's quota, not
a pod's. Each batch worker takes the share of it that its lane partitions are of
all lane partitions (``fast`` plus ``slow``), recomputed on every rebalance:

    share = assigned lane partitions / all lane partitions
    rpm   = RETRO_MODEL__RPM x share,  tpm = RETRO_MODEL__TPM x share

The group assigns every partition to exactly one member, so the shares of all
members add up to at most 1 whatever the replica count: adding pods never exceeds
the quota, and a lone pod (all partitions) uses all of it. No shared store needed:
the group coordinator already is one. During a rebalance two pods may briefly both
count a partition (the old owner until revoke, the new one after assign); the
overshoot is bounded by one rebalance's worth of a partition's share.

A pod with no lane partitions keeps the smallest share a partition would give it
(1 / all partitions): it sends nothing from batches, and a bucket rate cannot be 0.

The quota that is shared is the lower of the configured one and what the provider (or a
proxy in front of it) advertises in ``x-ratelimit-limit-requests`` / ``-tokens``: a
worker configured for 600 rpm behind a 30 rpm key divides 30, not 600, among its pods.
The advertised value is the account's (every pod sees the same), so dividing it by the
share keeps the sum at or under it. It can only lower the configured quota, never raise
it, and the latest advertised value counts (a raised plan is followed back up).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Literal

from streams.gateway.buckets import TokenBucket
from streams.metrics import Metrics

logger = logging.getLogger(__name__)

Kind = Literal["requests", "tokens"]
SETTING = {"requests": "RETRO_MODEL__RPM", "tokens": "RETRO_MODEL__TPM"}


def assignment_share(assigned: Iterable[tuple[str, int]], partitions: Mapping[str, int]) -> float:
    """This member's share of the lane partitions: assigned ones / all of ``partitions``.

    ``assigned`` holds (topic, partition) pairs (aiokafka's TopicPartition is one);
    partitions of topics not in ``partitions`` (not a lane topic) do not count.
    """
    total = sum(partitions.values())
    if total <= 0:
        raise ValueError(f"the lane topics have no partitions: {dict(partitions)}")
    mine = {(t, p) for t, p in assigned if t in partitions and 0 <= p < partitions[t]}
    return len(mine) / total


class QuotaShare:
    """Sets the shared RPM/TPM buckets to this pod's share of the provider quota.

    ``min_tokens``: the TPM capacity never drops below one full-sized request (the
    largest lane's context window), or a small share would reject every batch.
    """

    def __init__(
        self,
        *,
        rpm: TokenBucket,
        tpm: TokenBucket,
        rpm_quota: float,
        tpm_quota: float,
        min_tokens: float,
        metrics: Metrics | None = None,
    ) -> None:
        if rpm_quota <= 0 or tpm_quota <= 0:
            raise ValueError(f"quotas must be positive, got rpm={rpm_quota} tpm={tpm_quota}")
        self.rpm = rpm
        self.tpm = tpm
        self.rpm_quota = float(rpm_quota)
        self.tpm_quota = float(tpm_quota)
        self.min_tokens = float(min(min_tokens, tpm_quota))
        self.metrics = metrics
        self.fraction = 1.0
        self.advertised: dict[Kind, float] = {}  # the provider's latest x-ratelimit-limit-*
        self._publish()

    def effective(self, kind: Kind) -> tuple[float, str]:
        """(the account's quota per minute, "configured" or "advertised") for ``kind``."""
        configured = self.rpm_quota if kind == "requests" else self.tpm_quota
        advertised = self.advertised.get(kind)
        if advertised is not None and advertised < configured:
            return advertised, "advertised"
        return configured, "configured"

    def set(self, fraction: float, *, floor: float = 0.0) -> None:
        """Take ``fraction`` (0..1] of the quota; 0 means ``floor`` (no partitions)."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"a quota share is between 0 and 1, got {fraction}")
        effective = fraction if fraction > 0 else floor
        if effective <= 0:
            raise ValueError("a share of 0 needs a positive floor (1 / all lane partitions)")
        self.fraction = effective
        self._apply()

    def advertise(self, ratelimit: Mapping[str, int]) -> None:
        """Follow the ``limit-requests`` / ``limit-tokens`` a provider answer advertised
        (``backends.parse_ratelimit``); re-sets the buckets only when the quota changes."""
        changed = False
        for kind in ("requests", "tokens"):
            value = ratelimit.get(f"limit-{kind}")
            if value is None or value <= 0 or self.advertised.get(kind) == value:
                continue
            before = self.effective(kind)
            self.advertised[kind] = float(value)
            after = self.effective(kind)
            if after != before:
                changed = True
                configured = self.rpm_quota if kind == "requests" else self.tpm_quota
                logger.info(
                    "the provider advertises %g %s a minute (x-ratelimit-limit-%s) where "
                    "%s=%g: the quota shared by the pods is now %g (%s)", value, kind, kind,
                    SETTING[kind], configured, after[0], after[1])
        if changed:
            self._apply()

    def _apply(self) -> None:
        rpm = self.effective("requests")[0] * self.fraction
        tpm = self.effective("tokens")[0] * self.fraction
        self.rpm.set_rate(rpm, capacity=max(rpm, 1.0))
        self.tpm.set_rate(tpm, capacity=max(tpm, self.min_tokens))
        logger.info("model quota share %.3f: %.1f requests/min, %.0f tokens/min",
                    self.fraction, rpm, tpm)
        self._publish()

    def _publish(self) -> None:
        if self.metrics is None:
            return
        self.metrics.quota_share.set(self.fraction)
        self.metrics.quota_limit.labels("requests").set(self.rpm.rate_per_minute)
        self.metrics.quota_limit.labels("tokens").set(self.tpm.rate_per_minute)
        for kind in ("requests", "tokens"):
            value, source = self.effective(kind)
            self.metrics.rate_limit.labels(kind, source).set(value)
            other = "configured" if source == "advertised" else "advertised"
            self.metrics.rate_limit.remove(kind, other)  # one series per kind: the one in force
