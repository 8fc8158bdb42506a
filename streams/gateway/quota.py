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
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from streams.gateway.buckets import TokenBucket
from streams.metrics import Metrics

logger = logging.getLogger(__name__)


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
        self._publish()

    def set(self, fraction: float, *, floor: float = 0.0) -> None:
        """Take ``fraction`` (0..1] of the quota; 0 means ``floor`` (no partitions)."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"a quota share is between 0 and 1, got {fraction}")
        effective = fraction if fraction > 0 else floor
        if effective <= 0:
            raise ValueError("a share of 0 needs a positive floor (1 / all lane partitions)")
        self.fraction = effective
        rpm = self.rpm_quota * effective
        tpm = self.tpm_quota * effective
        self.rpm.set_rate(rpm, capacity=max(rpm, 1.0))
        self.tpm.set_rate(tpm, capacity=max(tpm, self.min_tokens))
        logger.info("model quota share %.3f: %.1f requests/min, %.0f tokens/min",
                    effective, rpm, tpm)
        self._publish()

    def _publish(self) -> None:
        if self.metrics is None:
            return
        self.metrics.quota_share.set(self.fraction)
        self.metrics.quota_limit.labels("requests").set(self.rpm.rate_per_minute)
        self.metrics.quota_limit.labels("tokens").set(self.tpm.rate_per_minute)
