"""The provider quota follows the group's assignment: shares add up to at most 1."""

from __future__ import annotations

import pytest

from streams.gateway.buckets import TokenBucket
from streams.gateway.factory import build_gateways
from streams.gateway.quota import QuotaShare, assignment_share
from streams.metrics import Metrics
from streams.settings import Settings

from helpers import FakeClock

LANES = {"retro.records.fast": 4, "retro.records.slow": 4}


def _split(members: int) -> list[list[tuple[str, int]]]:
    """Round-robin assignment of every lane partition over ``members`` (as a group does)."""
    tps = [(t, p) for t, n in LANES.items() for p in range(n)]
    return [tps[i::members] for i in range(members)]


@pytest.mark.parametrize("members", [1, 2, 3, 5, 8, 12])
def test_shares_of_all_members_add_up_to_the_whole_quota_at_most(members: int) -> None:
    shares = [assignment_share(a, LANES) for a in _split(members)]
    assert sum(shares) == pytest.approx(1.0)  # every partition has exactly one owner
    assert all(0 <= s <= 1 for s in shares)
    if members == 1:
        assert shares == [1.0]  # one replica uses all of the quota
    if members > 8:
        assert shares.count(0.0) == members - 8  # idle members take nothing


def test_other_topics_and_unknown_partitions_do_not_count() -> None:
    assigned = [("retro.records.fast", 0), ("retro.logs.raw", 1), ("retro.records.slow", 9)]
    assert assignment_share(assigned, LANES) == 1 / 8
    with pytest.raises(ValueError, match="no partitions"):
        assignment_share(assigned, {})


def _share(t: FakeClock, metrics: Metrics | None = None) -> QuotaShare:
    rpm = TokenBucket(rate_per_minute=600, clock=t, sleep=t.sleep)
    tpm = TokenBucket(rate_per_minute=100_000, clock=t, sleep=t.sleep)
    return QuotaShare(rpm=rpm, tpm=tpm, rpm_quota=600, tpm_quota=100_000, min_tokens=8192,
                      metrics=metrics)


def test_a_share_sets_rates_and_keeps_one_full_request_possible() -> None:
    t = FakeClock()
    q = _share(t)
    q.set(0.25)
    assert q.rpm.rate_per_minute == 150 and q.rpm.capacity == 150
    assert q.tpm.rate_per_minute == 25_000
    q.set(1 / 64)
    assert q.tpm.rate_per_minute == pytest.approx(100_000 / 64)
    assert q.tpm.capacity == 8192  # a batch of a full context still fits the bucket
    assert q.rpm.capacity == pytest.approx(600 / 64)


def test_a_shrinking_share_drops_the_tokens_above_the_new_capacity() -> None:
    t = FakeClock()
    q = _share(t)
    assert q.rpm.available == 600
    q.set(0.5)
    assert q.rpm.available == 300  # not one last full-quota burst
    t.now += 60
    assert q.rpm.available == 300


async def test_the_bucket_refills_at_the_new_rate_after_a_change() -> None:
    t = FakeClock()
    q = _share(t)
    assert q.rpm.try_acquire(600)
    t.now += 6  # 60 requests accrued at 600/min
    q.set(0.1)  # 60/min from now on, capacity 60
    assert q.rpm.available == pytest.approx(60)
    assert q.rpm.try_acquire(60)
    t.now += 10
    assert q.rpm.available == pytest.approx(10)


def test_no_partitions_takes_the_floor_and_bad_shares_are_refused() -> None:
    q = _share(FakeClock())
    q.set(0.0, floor=1 / 8)
    assert q.fraction == 1 / 8
    with pytest.raises(ValueError, match="between 0 and 1"):
        q.set(1.5)
    with pytest.raises(ValueError, match="floor"):
        q.set(0.0)


def test_gateway_set_follows_the_assignment_and_publishes_the_limits() -> None:
    metrics = Metrics()
    settings = Settings(model={"rpm": 1200, "tpm": 2_000_000,
                               "base_url": "http://127.0.0.1:9/v1"})  # a provider
    gateways = build_gateways(settings, metrics=metrics)
    assert gateways.fast.rpm is gateways.slow.rpm  # one account, one bucket per pod
    share = gateways.follow_assignment(_split(4)[0], LANES)
    assert share == 0.25
    assert gateways.fast.rpm.rate_per_minute == 300
    assert gateways.slow.tpm.rate_per_minute == 500_000
    assert metrics.quota_share._value.get() == 0.25
    assert metrics.quota_limit.labels("requests")._value.get() == 300
    assert metrics.quota_limit.labels("tokens")._value.get() == 500_000
    gateways.follow_assignment([], LANES)  # revoked everything
    assert gateways.fast.rpm.rate_per_minute == 1200 / 8


def test_the_offline_rules_backend_is_not_held_to_a_providers_quota() -> None:
    """RPM/TPM describe a provider's quota; the rules backend runs on this process's
    CPU, so it is not throttled (the provider's limits apply to the openai backend)."""
    from streams.gateway.factory import OFFLINE_QUOTA, build_gateways
    from streams.settings import ModelSettings, Settings

    rules = build_gateways(Settings(model=ModelSettings(rpm=60, tpm=1000)))
    assert rules.quota.rpm_quota == rules.quota.tpm_quota == OFFLINE_QUOTA
    remote = build_gateways(Settings(model=ModelSettings(
        rpm=60, tpm=1000, base_url="http://127.0.0.1:9/v1")))
    assert (remote.quota.rpm_quota, remote.quota.tpm_quota) == (60, 1000)
