"""Is a count unusual for its own source? Records per minute against a baseline (pure).

A report keeps, for each template of each incident, its records per UTC minute. The
test here is stated and small: a **one-sided Poisson tail**. For every window of
``BURST_MINUTES`` minutes, the records in it are compared with what the same series
does outside it (its own baseline, so one burst does not raise its own bar): the
window is a burst when at least ``MIN_BURST`` records fall in it and that many or more
would happen by chance with probability below ``BURST_P``. From the same counts:

* **new**: the series first appears well after the window began (a tenth of it, at
  least one burst window) and there is a baseline to be new against;
* **chronic**: no burst and present through the window (in at least
  ``CHRONIC_SHARE`` of its ``CHRONIC_SLOTS`` slots, hours of a day): steady
  background, reported below the incident;
* **sporadic**: no burst, a few records spread over the window;
* **unjudged**: the window is too short for a baseline (under ``MIN_BASELINE_MINUTES``)
  or the series has no times: the counts cannot say, other signals decide.

A service's volume is judged the same way, the other way round: a service that logged
steadily and then logs nothing for long enough that silence has a Poisson probability
below ``BURST_P`` **went silent**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

BURST_MINUTES = 5  # the window a burst is counted in
BURST_P = 1e-4  # chance of the burst's count, or more, under the baseline rate
MIN_BURST = 5  # records a burst needs, whatever the test says
MIN_BASELINE_MINUTES = 30  # a shorter window has no baseline to compare with
NEW_AFTER_SHARE = 0.1  # first seen after this share of the window: new
CHRONIC_SHARE = 0.5  # present in at least this share of the window's slots: chronic
CHRONIC_SLOTS = 24  # the window is cut in this many slots (at least BURST_MINUTES each)
MIN_SILENT_MINUTES = 5  # a gap shorter than this is never called silence

Kind = Literal["burst", "new", "chronic", "sporadic", "unjudged"]
_MINUTE = "%Y-%m-%dT%H:%M"


def minute_key(value: datetime) -> str:
    """The key of the UTC minute ``value`` falls in (``YYYY-MM-DDTHH:MM``)."""
    return value.astimezone(UTC).strftime(_MINUTE)


def minute_of(key: str) -> datetime | None:
    """The start of a minute key; None for a key that is not one."""
    try:
        return datetime.strptime(key, _MINUTE).replace(tzinfo=UTC)
    except ValueError:
        return None


def poisson_tail(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean), summed in log space (no overflow for big k)."""
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    if k <= mean:
        return 1.0  # at or below the mean: never unusual, the exact value does not matter
    log_term = -mean + k * math.log(mean) - math.lgamma(k + 1)
    total = 0.0
    i = k
    while True:
        term = math.exp(log_term)
        total += term
        if term < total * 1e-12 or i - k > 10_000:
            return min(total, 1.0)
        i += 1
        log_term += math.log(mean) - math.log(i)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the counts say about one series in one window."""

    kind: Kind
    count: int  # records of the series with a time
    start: datetime | None = None  # the burst (or, for new, the first record)
    end: datetime | None = None  # end of the burst's last minute
    burst_count: int = 0
    expected: float = 0.0  # records the baseline predicts in the burst window
    p: float = 1.0

    @property
    def significant(self) -> bool:
        return self.kind in ("burst", "new")

    def describe(self) -> str:
        """One clause for a reader: what was counted against what."""
        if self.kind == "burst":
            return (f"burst: {self.burst_count} records in {BURST_MINUTES} min where its "
                    f"own baseline predicts {self.expected:.1f} (Poisson p={self.p:.1g})")
        if self.kind == "new":
            return f"new: first seen {self.start:%H:%M}, none before in the window"
        if self.kind == "chronic":
            return "chronic: steady through the window, no burst"
        if self.kind == "sporadic":
            return f"sporadic: {self.count} records spread over the window, no burst"
        return "not judged by counts (window too short for a baseline)"


def judge(minutes: dict[str, int], start: datetime | None, end: datetime | None) -> Verdict:
    """The verdict on one series of records per minute inside the window [start, end]."""
    series = sorted((t, n) for t, n in ((minute_of(k), n) for k, n in minutes.items())
                    if t is not None and n > 0)
    count = sum(n for _, n in series)
    if not series or start is None or end is None:
        return Verdict("unjudged", count)
    span = max((end - start).total_seconds() / 60.0, 1.0)
    if span < MIN_BASELINE_MINUTES:
        return Verdict("unjudged", count)
    burst = _burst(series, count, span)
    if burst is not None:
        return burst
    first = series[0][0]
    offset = (first - start).total_seconds() / 60.0
    if offset >= max(NEW_AFTER_SHARE * span, BURST_MINUTES) and count >= MIN_BURST:
        return Verdict("new", count, first, series[-1][0] + timedelta(minutes=1))
    width = max(BURST_MINUTES, span / CHRONIC_SLOTS)  # a day: hourly slots
    slots = max(1, math.ceil(span / width))
    used = {int((t - start).total_seconds() / 60 // width) for t, _ in series}
    if len(used) >= CHRONIC_SHARE * slots:
        return Verdict("chronic", count)
    return Verdict("sporadic", count)


def _burst(series: list[tuple[datetime, int]], count: int, span: float) -> Verdict | None:
    """The most unlikely window of BURST_MINUTES minutes, if it is a burst."""
    best: Verdict | None = None
    width = timedelta(minutes=BURST_MINUTES)
    j = 0
    inside = 0
    for i, (t0, _) in enumerate(series):
        while j < len(series) and series[j][0] < t0 + width:
            inside += series[j][1]
            j += 1
        if inside >= MIN_BURST:
            outside_minutes = max(span - BURST_MINUTES, 1.0)
            # the baseline: the same series outside this window, at least half a record
            rate = max(count - inside, 0.5) / outside_minutes
            expected = rate * BURST_MINUTES
            p = poisson_tail(inside, expected)
            if p < BURST_P and (best is None or p < best.p):
                last = series[j - 1][0]
                best = Verdict("burst", count, t0, last + timedelta(minutes=1), inside,
                               expected, p)
        inside -= series[i][1]
    return best


def silent_since(minutes: dict[str, int], start: datetime | None,
                 end: datetime | None) -> datetime | None:
    """When a service that logged steadily went silent to the end of the window, if
    that silence is unlikely at its own earlier rate; else None."""
    series = sorted(t for t, n in ((minute_of(k), n) for k, n in minutes.items())
                    if t is not None and n > 0)
    if not series or start is None or end is None:
        return None
    last = series[-1] + timedelta(minutes=1)
    gap = (end - last).total_seconds() / 60.0
    active = (last - start).total_seconds() / 60.0
    if gap < MIN_SILENT_MINUTES or active < MIN_BASELINE_MINUTES:
        return None
    total = sum(n for k, n in minutes.items() if minute_of(k) is not None and n > 0)
    rate = total / active
    # P(no record in the gap) under the earlier rate; exp(-rate * gap)
    return last if math.exp(-rate * gap) < BURST_P else None
