"""Is a count unusual for its own source? Records per minute against a baseline (pure).

A report keeps, for each template of each incident, its records per UTC minute. The
test here is stated and small: a **one-sided Poisson tail**. For every window of
``BURST_MINUTES`` minutes, the records in it are compared with what the same series
does outside it (its own baseline, so one burst does not raise its own bar): the
window is a burst when at least ``MIN_BURST`` records fall in it and that many or more
would happen by chance with probability below ``BURST_P``. From the same counts:

* **new**: nothing before its first record, where its own rate since then predicts
  some: the chance of that silence, exp(-rate x minutes before), is below ``BURST_P``;
* **chronic**: no burst and present through the window (in at least
  ``CHRONIC_SHARE`` of its ``CHRONIC_SLOTS`` slots, hours of a day): steady
  background, reported below the incident;
* **sporadic**: no burst, records spread thinly over at least half the window;
* **few**: a short cluster too small to call a burst: the counts do not decide;
* **unjudged**: the window is too short for a baseline (under ``MIN_BASELINE_MINUTES``)
  or the series has no times: the counts cannot say, other signals decide.

A service's volume is judged the same way, the other way round: a service that logged
steadily and then logs nothing for long enough that silence has a Poisson probability
below ``BURST_P`` **went silent**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from streams.report.state.minutes import parse_minute

BURST_MINUTES = 5  # the window a burst is counted in
BURST_P = 1e-4  # chance of the burst's count, or more, under the baseline rate
MIN_BURST = 5  # records a burst needs, whatever the test says
MIN_BASELINE_MINUTES = 30  # a shorter window has no baseline to compare with
SPORADIC_SPREAD = 0.5  # records from first to last over this share of the window
CHRONIC_SHARE = 0.5  # present in at least this share of the window's slots: chronic
CHRONIC_SLOTS = 24  # the window is cut in this many slots (at least BURST_MINUTES each)
EXTEND_FACTOR = 3.0  # a minute next to a burst belongs to it above this many times the baseline
_GAP = timedelta(minutes=2)  # an empty minute between two still joins them
MIN_SILENT_MINUTES = 5  # a gap shorter than this is never called silence

Kind = Literal["burst", "new", "chronic", "sporadic", "few", "unjudged"]


def minute_of(key: str) -> datetime | None:
    """The start of a minute key; None for a key that is not one."""
    try:
        return parse_minute(key)
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
            minutes = max(round((self.end - self.start).total_seconds() / 60), 1) \
                if self.start and self.end else BURST_MINUTES
            return (f"burst: {self.burst_count} records in {minutes} min from "
                    f"{self.start:%H:%M}; its own baseline predicts "
                    f"{self.expected:.1f} per {BURST_MINUTES} min (Poisson p={self.p:.1g})")
        if self.kind == "new":
            burst = f"; {self.burst_count} records in its peak" if self.burst_count else ""
            return f"new: first seen {self.start:%H:%M}, none before in the window{burst}"
        if self.kind == "chronic":
            return "chronic: steady through the window, no burst"
        if self.kind == "sporadic":
            return f"sporadic: {self.count} records spread over the window, no burst"
        if self.kind == "few":
            return f"{self.count} records close together, too few to call a burst"
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
    first, last = series[0][0], series[-1][0] + timedelta(minutes=1)
    offset = (first - start).total_seconds() / 60.0
    rate = count / max((end - first).total_seconds() / 60.0, 1.0)
    if count >= MIN_BURST and offset >= BURST_MINUTES and math.exp(-rate * offset) < BURST_P:
        if burst is not None:
            return Verdict("new", count, first, last, burst.burst_count, burst.expected, burst.p)
        return Verdict("new", count, first, last)
    if burst is not None:
        return burst
    width = max(BURST_MINUTES, span / CHRONIC_SLOTS)  # a day: hourly slots
    slots = max(1, math.ceil(span / width))
    used = {int((t - start).total_seconds() / 60 // width) for t, _ in series}
    if len(used) >= CHRONIC_SHARE * slots:
        return Verdict("chronic", count)
    if (last - first).total_seconds() / 60.0 >= SPORADIC_SPREAD * span:
        return Verdict("sporadic", count)
    return Verdict("few", count)


def _burst(series: list[tuple[datetime, int]], count: int, span: float) -> Verdict | None:
    """The most unlikely window of BURST_MINUTES minutes, if it is a burst, widened to
    the minutes next to it that stay well above the baseline (the burst's whole span)."""
    best: Verdict | None = None
    best_at = (0, 0)
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
                best_at = (i, j - 1)
        inside -= series[i][1]
    if best is None:
        return None
    # neighbours of the peak whose minute counts are well above the baseline rate
    floor = EXTEND_FACTOR * best.expected / BURST_MINUTES
    lo, hi = best_at
    while lo < hi and series[lo][1] <= floor:  # the window's edges may be plain baseline
        lo += 1
    while hi > lo and series[hi][1] <= floor:
        hi -= 1
    while lo > 0 and series[lo - 1][1] > floor and series[lo][0] - series[lo - 1][0] <= _GAP:
        lo -= 1
    while (hi + 1 < len(series) and series[hi + 1][1] > floor
           and series[hi + 1][0] - series[hi][0] <= _GAP):
        hi += 1
    records = sum(n for _, n in series[lo : hi + 1])
    return Verdict("burst", count, series[lo][0], series[hi][0] + timedelta(minutes=1),
                   records, best.expected, best.p)


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
    if gap < MIN_SILENT_MINUTES or active < 2 * MIN_SILENT_MINUTES:
        return None  # the Poisson test below decides; these only keep it off tiny series
    total = sum(n for k, n in minutes.items() if minute_of(k) is not None and n > 0)
    rate = total / active
    # P(no record in the gap) under the earlier rate; exp(-rate * gap)
    return last if math.exp(-rate * gap) < BURST_P else None
