"""Departures from a baseline learned from the stream itself (pure: no I/O, no clock).

The report keeps every template's records per minute, per service (``Report.series``).
Walking its minutes in time order, each minute is judged against the minutes before
it (at most ``BASELINE_HOURS`` back), and then joins them. The statistics, stated:

* **Expected count.** A template's share of the stream's routine records (below WARN)
  in its baseline minutes times this minute's routine records: a partial minute (a
  file's first or last) or a load change moves every template alike, so neither is a
  departure, and a surge of errors somewhere does not raise everyone's expectation.
* **new**: a line at WARN or above that its service never wrote in the baseline, at
  least ``MIN_NEW`` times in the minute, where its rate now would have shown in the
  baseline (its silence there had a Poisson chance under 5%: ``NEW_SILENCE``). Once
  new, the minutes right after it that still hold the line go on departing at any
  count by the same test: a failure that slows to one or two records a minute is
  still the incident, not the baseline's new normal.
* **burst**: a line at WARN or above, at least ``MIN_BURST`` records and
  ``BURST_FACTOR`` times the expected count, with a one-sided tail below ``TAIL_P``.
  Burst and quiet compare two Poisson counts, this minute's and the baseline's, by
  the exact conditional test: given both together, this minute's share is binomial
  with its share of the stream's records. A baseline of a few minutes is itself a
  noisy count, and a plain Poisson tail that took it for exact called such a
  baseline's chance dips and peaks departures; over hours the two tests agree.
* **thin**: a usual line that thins out or vanishes while the line it follows goes on
  (an early return, a swallowed exception). Its partner is a line of the same service
  that was at least as frequent and moved with it minute by minute in the baseline
  (within ``PAIR_SPREAD`` of a fixed ratio r, and within ``PAIR_CHANCE`` of the
  difference two independent Poisson lines of those rates would show); the line
  departs when, with its partner seen at least ``MIN_PARTNER`` times, it falls to
  ``THIN_FACTOR`` of r times that and the binomial tail P(X <= x | partner count, r)
  is below ``TAIL_P``, in this minute or summed over the last ``THIN_MINUTES`` when
  this one is thin itself, or below r times its partner with too few partner records
  to tell alone (a line written a few times a minute needs several to tell).
  Where lines carry trace ids, a line also thins out by request (``Report.next_lines``:
  which line of a service came right after which in a request): a routine line that
  came right after another in at least ``PAIR_MIN_RATIO`` of that one's requests in
  the baseline (k0 of n0) departs when it follows x of its n this minute (n at least
  ``MIN_PARTNER``, or summed over the ``THIN_MINUTES`` as above), x at most
  ``THIN_FACTOR`` times n k0 / n0, with Fisher's exact lower tail (the two shares given
  both counts) below ``TAIL_P``. A request shows in one minute the pairing that minute
  counts need many to show, so a log of a few minutes is judged too. A failure that
  stops following a line is a recovery, not a departure; a minute in which a line
  stopped following another stays out of the baseline of every line after that one
  (what came instead is the departure's).
* **quiet**: a service whose volume falls to a third of its expected count and of its
  own records a minute (a stream swollen by others' traffic shrinks every share), with
  a lower tail below ``TAIL_P`` (the test of burst), in this minute or summed with
  the ones before (``THIN_MINUTES``). Counted in requests: a service's lines come a
  request's worth at a time, so its records are divided by its records per record of
  its most frequent line, which a request writes about once; at least
  ``MIN_QUIET_EXPECTED`` requests expected.
* **slow**: calls into a service take far longer than they used to: of the minute's
  hops into it (``streams.traces``: from its caller's line to its own first line of
  a request), at least ``MIN_SLOW`` took 4x, 16x or 64x (``SLOW_STEPS``) its
  baseline's median hop or more, with a binomial upper tail below ``TAIL_P`` given the
  share of such hops in its baseline, times the three thresholds tried. That share
  borrows the one all services' baseline hops show, each against its own median, as
  ``POOL_HOPS`` hops' worth: a service few requests reach has too few hops to know its
  own tail, and a baseline without a slow hop is no proof that they never happen.
  Each step is judged once the baseline holds ``STEP_HOPS`` hops (20 at 4x, 5 at 16x,
  2 at 64x): near the median services' spreads differ, so its own hops must tell, and
  a median of a few hops may be off by more than 4x but not by 64x. Hops 64x its
  median or more in a minute that does not depart wait outside the baseline for up to
  ``THIN_MINUTES`` - 1 minutes, and join it when a minute comes without one: a
  service called a few times a minute slows a call or two at a time, and learned at
  once those calls would hide the minute that tells. A slowed service (a delayed
  network, a starved CPU) shows here while its own lines and its callers' may say
  nothing.
* **chronic**: a line at WARN or above present in at least ``CHRONIC_SHARE`` of at
  least ``CHRONIC_MIN_MINUTES`` baseline minutes: background, listed, judged only for
  a burst (a line always there may still flare up far past its usual rate).
* **standing**: a line at ERROR or above written in the report's opening minutes
  (those before the stream held ``MIN_BASELINE_RECORDS`` records, which nothing can be
  judged in), ``MIN_NEW`` times there or in the minute after them (a log cut
  mid-minute opens with a few seconds), and never found chronic: the log began
  while it was failing, so there is no past to judge it against. Not a departure (no
  statistic), it is kept apart (``Findings.standing``) and only titles a report that
  has no incident.
* **early**: a line at ERROR or above first written after the opening minutes, at
  least ``MIN_NEW`` times, that the new test never decided because the report's
  baseline was still too short for its silence there to mean anything. Like a
  standing line it has no statistic and is kept apart (``Findings.early``).

Nothing is judged before a template's baseline holds ``MIN_BASELINE_RECORDS`` records
of the whole stream. A departing line's minute stays out of its own baseline, so an
incident does not teach the baseline that it is normal, until it has departed
``ABSORB_MINUTES`` minutes running: then it is the new normal. So is a first
appearance the new test has waited on that long without deciding it. Templates are
folded per service to their canonical form first, so workers that mined a line
differently still count it as one.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Literal

from streams.batch.covering import canonical_templates
from streams.records import LEVEL_RANK, smallest_traces, template_head
from streams.report.state.hops import Calls, FailedCalls, Hops, NextLines, add_calls, add_hops
from streams.report.state.minutes import MINUTE_FORMAT, add_minutes, parse_minute
from streams.report.state.model import OTHER_TEMPLATES, Series
from streams.report.state.series import (
    add_counts,
    earliest,
    earliest_per_minute,
    higher_level,
)

TAIL_P = 1e-4  # a departure's count, or a more extreme one, has at most this chance
MAX_SURPRISE = 8.0  # -log10 of the tail, capped: one line cannot outweigh many
MIN_BASELINE_RECORDS = 100  # records of the stream in a baseline before it judges
BASELINE_HOURS = 3
MIN_NEW = 3
NEW_SILENCE = -math.log(0.05)  # its rate now predicts this many in the baseline: P(0) < 5%
MIN_BURST = 3
BURST_FACTOR = 3.0
MIN_PARTNER = 5
THIN_MINUTES = 3  # a thinning or quiet is judged on this minute, else summed with the ones before
THIN_FACTOR = 0.5
PAIR_MIN_RATIO = 0.5  # a partner writes at most twice as often as its line
PAIR_SPREAD = 0.25  # sum |line - r * partner| over the baseline, as a share of the line's
PARTNER_EVERY = 15  # minutes between two choices of partners (they change slowly)
PAIR_MINUTES = 30  # the recent baseline minutes a partner must have moved with its line
PARTNER_TRIES = 4  # candidates tried per line, nearest in count first
PAIR_CHANCE = 0.5  # ... and as a share of what two independent Poisson lines would show
_ABS_NORMAL = math.sqrt(2 / math.pi)  # E|Z| of a standard normal
MIN_PAIR_RECORDS = 5  # records of a line in its baseline before it has a partner
MIN_QUIET_EXPECTED = 10.0
QUIET_FACTOR = 1 / 3
CHRONIC_SHARE = 0.5
CHRONIC_MIN_MINUTES = 10
ABSORB_MINUTES = 30
SETTLE_MINUTES = 5  # the newest minutes a kept walk judges again: records still arrive
FAILING_RANK = LEVEL_RANK["WARN"]
ERROR_RANK = LEVEL_RANK["ERROR"]
ALL_LINES = "(all lines)"  # the template of a service's quiet departure
ALL_CALLS = "(calls into it)"  # the template of a service's slow departure
# half-octave hop bins (streams.traces.table.hop_bin) past the median: 4x, 16x, 64x
SLOW_STEPS = (4, 8, 12)
MIN_SLOW = 3
# hops into a service in its baseline before each step is judged: near the median
# services' spreads differ, so its own hops must tell; a median of two hops may be a few
# bins off, which a call 64x slower outruns, and calls that slow are rare everywhere
STEP_HOPS = (20, 5, 2)
POOL_HOPS = 20  # the weight, in hops, of all services' slow share in each one's own
PREFIX_SHARED_BY = 3  # services whose names begin with one word: a project's prefix
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")  # the separators of a name, lowercased
MIN_CALL_HOPS = 3  # hops from a caller to a callee before the trace graph has the call

Kind = Literal["new", "burst", "thin", "quiet", "slow", "standing", "early"]


@dataclass(frozen=True, slots=True)
class Departure:
    """One line (or one service's volume) departing from its baseline in one minute."""

    minute: str
    service: str
    template: str
    kind: Kind
    observed: int
    expected: float
    surprise: float  # -log10 of the tail probability, at most MAX_SURPRISE
    failing: bool  # the line is at WARN or above
    named: tuple[str, ...] = ()  # known services its failures name as called, most first
    traces: tuple[str, ...] = ()  # trace ids of the line's failing records, the smallest few
    first_seen: str | None = None  # its first failing record in this minute, else in the report
    error: bool = False  # the line is at ERROR or above: a failure, not a warning
    until: str | None = None  # a standing or early line's last minute
    times: int = 0  # a slow departure's calls took this many times the usual or longer
    # (callee, requests, failed requests traced): how many of its service's failed
    # requests called that callee last, when that links it there (``incidents``)
    failed_after: tuple[str, int, int] | None = None

    def describe(self) -> str:
        """A clause for a reader: what was counted against what, and the trace link."""
        if self.failed_after is None:
            return self._counted()
        callee, n, total = self.failed_after
        return f"{self._counted()}; {n} of its {total} failed requests called {callee} last"

    def _counted(self) -> str:
        if self.kind == "new":
            return f"new line, {self.observed} in its first minute"
        if self.kind == "burst":
            return f"{self.observed} a minute against {self.expected:.1f} expected"
        if self.kind == "standing":
            return f"{self.observed} records since the log began, no past to judge them by"
        if self.kind == "early":
            return f"{self.observed} records, begun too soon after the log to judge"
        if self.kind == "thin":
            return f"thinned out: {self.observed} a minute against {self.expected:.0f} usual"
        if self.kind == "slow":
            return (f"slow: {self.observed} calls into it took {self.times}x its usual or "
                    f"longer, {self.expected:.2g} expected")  # often far below one
        return f"volume fell: {self.observed} records a minute against {self.expected:.0f}"


@dataclass
class Findings:
    """What the walk over a report's minutes found."""

    departures: list[Departure] = field(default_factory=list)
    chronic: list[tuple[str, str]] = field(default_factory=list)  # (service, template)
    minutes: list[str] = field(default_factory=list)  # the minutes judged or learned from
    # caller -> the services its lines ever named as called, failing or not, and those
    # its requests reached next (at least ``MIN_CALL_HOPS`` hops): the call graph as the
    # logs tell it, so a caller that goes quiet with its callee is its impact
    calls: dict[str, set[str]] = field(default_factory=dict)
    # caller -> callee -> minute -> requests that failed in the caller after calling the
    # callee last (``Report.failed_calls``): a caller's failure linked to a callee by trace
    failed_calls: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    # failing when the report began and never chronic: most records first
    standing: list[Departure] = field(default_factory=list)
    # error lines begun after that but too soon for the baseline to judge them
    early: list[Departure] = field(default_factory=list)

    @property
    def unjudged(self) -> list[Departure]:
        """The standing lines, then the early ones: neither is a departure."""
        return [*self.standing, *self.early]


@dataclass(slots=True)
class _Line:
    """One (service, template) as the walk knows it."""

    service: str
    template: str
    failing: bool
    minutes: dict[str, int]
    named: tuple[str, ...]
    traces: tuple[str, ...]
    first_seen: str | None
    starts: dict[str, str]
    error: bool
    history: deque[tuple[datetime, int, int]] = field(default_factory=deque)  # (minute, x, T)
    count: int = 0  # in the baseline
    total: int = 0  # the stream's records in the minutes of its baseline
    seen: int = 0  # baseline minutes it was present in
    departed_run: int = 0
    # a first appearance not yet judged new: its records and the stream's since then
    unseen: tuple[int, int] = (0, 0)
    partner: _Line | None = None
    ratio: float = 0.0
    walked: int = 0  # its records in the minutes walked so far

    @property
    def key(self) -> tuple[str, str]:
        return self.service, self.template

    def copy(self) -> _Line:
        """A copy whose baseline moves on alone (the partner is set by the caller)."""
        return _Line(self.service, self.template, self.failing, self.minutes, self.named,
                     self.traces, self.first_seen, self.starts, self.error,
                     deque(self.history), self.count, self.total, self.seen,
                     self.departed_run, self.unseen, None, self.ratio, self.walked)

    def learn(self, when: datetime, x: int, total: int) -> None:
        self.history.append((when, x, total))
        self.count += x
        self.total += total
        self.seen += x > 0

    def forget_before(self, start: datetime) -> None:
        while self.history and self.history[0][0] < start:
            _, x, total = self.history.popleft()
            self.count -= x
            self.total -= total
            self.seen -= x > 0


@dataclass(slots=True)
class _Hops:
    """One service's hops in its baseline, by bin."""

    history: deque[tuple[datetime, dict[int, int]]] = field(default_factory=deque)
    bins: dict[int, int] = field(default_factory=dict)
    count: int = 0
    departed_run: int = 0
    # hops far past the median, too few to judge, kept out while they may begin a
    # slowdown: (minute, bins), at most ``THIN_MINUTES - 1`` minutes of them
    held: list[tuple[datetime, dict[int, int]]] = field(default_factory=list)

    def copy(self) -> _Hops:
        return _Hops(deque(self.history), dict(self.bins), self.count, self.departed_run,
                     list(self.held))

    def learn_minute(self, when: datetime, bins: dict[int, int], far: int | None) -> None:
        """Learn a minute that did not depart. Its hops at bin ``far`` or past it wait
        in ``held`` while fewer than ``THIN_MINUTES - 1`` minutes' do; a minute without
        any, or past that, learns them all: stray slow calls are the service's usual."""
        held = {b: n for b, n in bins.items() if far is not None and b >= far}
        if held and len(self.held) < THIN_MINUTES - 1:
            self.held.append((when, held))
            self.learn(when, {b: n for b, n in bins.items() if b not in held})
            return
        for at, kept in self.held:
            self.learn(at, kept)
        self.held.clear()
        self.learn(when, bins)

    def learn(self, when: datetime, bins: dict[int, int]) -> None:
        self.history.append((when, bins))
        for b, n in bins.items():
            self.bins[b] = self.bins.get(b, 0) + n
            self.count += n

    def forget_before(self, start: datetime) -> None:
        while self.history and self.history[0][0] < start:
            _, bins = self.history.popleft()
            for b, n in bins.items():
                self.bins[b] -= n
                self.count -= n

    def median(self) -> int:
        half, seen = self.count / 2, 0
        for b in sorted(self.bins):
            seen += self.bins[b]
            if seen >= half:
                return b
        return 0

    def tails(self) -> tuple[int, dict[int, int]]:
        """Its median bin, and per step of ``SLOW_STEPS`` its hops that many bins past it."""
        median = self.median()
        return median, {step: sum(n for b, n in self.bins.items() if b >= median + step)
                        for step in SLOW_STEPS}


@dataclass(slots=True)
class _Next:
    """How often one line of a service came right after another in a request, in the
    baseline: ``k`` of the ``n`` times the other was written."""

    history: deque[tuple[datetime, int, int]] = field(default_factory=deque)  # (minute, k, n)
    k: int = 0
    n: int = 0
    departed_run: int = 0

    def copy(self) -> _Next:
        return _Next(deque(self.history), self.k, self.n, self.departed_run)

    def learn(self, when: datetime, k: int, n: int) -> None:
        self.history.append((when, k, n))
        self.k += k
        self.n += n

    def forget_before(self, start: datetime) -> None:
        while self.history and self.history[0][0] < start:
            _, k, n = self.history.popleft()
            self.k -= k
            self.n -= n


# minute -> (service, template) -> the template of the next line ("": none) -> times
NextByMinute = dict[str, dict[tuple[str, str], dict[str, int]]]


def fold_series(series: Mapping[str, Mapping[str, Series]]) -> dict[str, dict[str, Series]]:
    """Each service's templates folded to their canonical form (counts summed)."""
    out: dict[str, dict[str, Series]] = {}
    for service, templates in series.items():
        plain = [t for t in templates if t != OTHER_TEMPLATES]
        groups: dict[str, list[Series]] = {}
        for template, root in canonical_templates(plain).items():
            groups.setdefault(root, []).append(templates[template])
        folded = {}
        for root, group in groups.items():
            if len(group) == 1 and all(group[0].minutes.values()):  # nothing to add up
                folded[root] = group[0]
                continue
            level = None
            for s in group:
                level = higher_level(level, s.level)
            folded[root] = Series(level=level, minutes=add_minutes(*(s.minutes for s in group)),
                                  named=add_counts(*(s.named for s in group)),
                                  traces=smallest_traces(*(s.traces for s in group)),
                                  first_seen=earliest(s.first_seen for s in group),
                                  starts=earliest_per_minute(s.starts for s in group))
        if OTHER_TEMPLATES in templates:
            folded[OTHER_TEMPLATES] = templates[OTHER_TEMPLATES]
        out[service] = folded
    return out


def known_callees(named: Mapping[str, int], service: str, services: list[str]) -> tuple[str, ...]:
    """The logging services a line names as called, most named first: a name counts
    only when it is a service of the records' service field (a host or URL may add a
    domain or port), never the line's own service, never a word of a message."""
    tally: dict[str, int] = {}
    for name, n in named.items():
        match = _service_named(name, services)
        if match is not None and match != service:
            tally[match] = tally.get(match, 0) + n
    return tuple(sorted(tally, key=lambda s: (-tally[s], s)))


def _service_named(name: str, services: list[str]) -> str | None:
    low = name.lower()
    for service in services:
        s = service.lower()
        if low == s or low.startswith(s + ".") or low.startswith(s + ":"):
            return service
    return _squashed(tuple(services)).get(_squash(low))


def _squash(name: str) -> str:
    return _NOT_ALNUM.sub("", name.lower())


@lru_cache(maxsize=8)
def _squashed(services: tuple[str, ...]) -> dict[str, str]:
    """Each service's name as a request path may spell it, when only it is spelt so:
    without separators (``seatservice``), and without a first word that several
    services share, a project's prefix (``ts-seat-service`` -> ``seatservice``)."""
    words = {s: _NOT_ALNUM.split(s.lower()) for s in services}
    firsts = Counter(w[0] for w in words.values() if len(w) > 2)
    spelt: dict[str, set[str]] = {}
    for service, w in words.items():
        spelt.setdefault("".join(w), set()).add(service)
        if len(w) > 2 and firsts[w[0]] >= PREFIX_SHARED_BY:
            spelt.setdefault("".join(w[1:]), set()).add(service)
    return {form: next(iter(owners)) for form, owners in spelt.items() if len(owners) == 1}


def find_departures(series: Mapping[str, Mapping[str, Series]], hops: Hops | None = None,
                    calls: Calls | None = None, failed_calls: FailedCalls | None = None,
                    next_lines: NextLines | None = None) -> Findings:
    """Walk the minutes of ``series`` in time order and judge each against its past."""
    return Walk().findings(series, hops=hops, calls=[calls] if calls else [],
                           failed_calls=failed_calls, next_lines=next_lines)


@dataclass
class _State:
    """Where a walk stands after the minutes it walked: every line's baseline, the
    stream's totals still in the horizon, what proved chronic and what departed."""

    lines: dict[tuple[str, str], _Line] = field(default_factory=dict)
    walked: list[str] = field(default_factory=list)
    learned: deque[tuple[datetime, int]] = field(default_factory=deque)  # (minute, T)
    chronic: set[tuple[str, str]] = field(default_factory=set)
    # each departure with its line (None: a service's quiet), rebuilt from the line's
    # latest evidence (callees, traces, first records) when findings are read
    found: list[tuple[tuple[str, str] | None, Departure]] = field(default_factory=list)
    hops: dict[str, _Hops] = field(default_factory=dict)  # per service
    hops_walked: int = 0  # the hops in the walked minutes
    # (service, template) -> the template of the next line in a request -> its baseline
    nexts: dict[tuple[str, str], dict[str, _Next]] = field(default_factory=dict)
    nexts_walked: int = 0  # the next-line counts in the walked minutes

    def copy(self) -> _State:
        lines = {key: line.copy() for key, line in self.lines.items()}
        for key, line in self.lines.items():
            if line.partner is not None:
                lines[key].partner = lines[line.partner.key]
        return _State(lines, list(self.walked), deque(self.learned), set(self.chronic),
                      list(self.found), {s: h.copy() for s, h in self.hops.items()},
                      self.hops_walked,
                      {lead: {t: n.copy() for t, n in after.items()}
                       for lead, after in self.nexts.items()},
                      self.nexts_walked)


class Walk:
    """The walk over one report kept from one version to the next, so a late version
    judges only its new minutes, not the whole day again.

    The result is always the walk from scratch's: a report only grows, so a line whose
    records in the walked minutes add up as they did is unchanged there, and anything
    else (a late record in an old minute, a line's level raised, templates folded
    anew) starts the walk over. The newest ``SETTLE_MINUTES`` are walked again each
    time, as their records are still coming in.

    ``before``: the series of the report of the window before (yesterday's, for a day):
    its last ``BASELINE_HOURS`` are walked first as baseline only, so the first hours of
    a window are judged against the hours before them, as every other hour is."""

    def __init__(self) -> None:
        self._kept: _State | None = None
        self._history: tuple[object, str, dict[tuple[str, str], Series]] | None = None
        self.judged = 0  # minutes the last call judged: all of them when it started over

    def findings(self, series: Mapping[str, Mapping[str, Series]],
                 before: Mapping[str, Mapping[str, Series]] | None = None,
                 hops: Hops | None = None, hops_before: Hops | None = None,
                 calls: Iterable[Calls] = (), failed_calls: FailedCalls | None = None,
                 next_lines: NextLines | None = None, next_lines_before: NextLines | None = None
                 ) -> Findings:
        """``hops``: the report's hops into services (``Report.hops``), judged with the
        lines; ``hops_before``: the window before's; ``calls``: call graphs the traces
        showed (``Report.calls``, the window before's too); ``failed_calls``: the
        report's (``Report.failed_calls``); ``next_lines``: which line followed which in
        a request (``Report.next_lines``), judged with the lines; ``next_lines_before``:
        the window before's."""
        folded = fold_series(series)
        services = sorted(folded)
        specs = {(service, template): s for service, templates in folded.items()
                 for template, s in templates.items()}
        first = min((min(s.minutes) for s in specs.values() if s.minutes), default=None)
        if before and first is not None:
            for key, old in self._before(before, first).items():
                new = specs.get(key)
                specs[key] = old if new is None else new.model_copy(
                    update={"minutes": {**old.minutes, **new.minutes}})
            services = sorted({service for service, _ in specs})
        failing = {key: LEVEL_RANK.get(s.level or "", 0) >= FAILING_RANK
                   for key, s in specs.items()}
        totals: dict[str, int] = {}
        routine: dict[str, int] = {}
        for key, s in specs.items():
            for minute, n in s.minutes.items():
                totals[minute] = totals.get(minute, 0) + n
                if not failing[key]:
                    routine[minute] = routine.get(minute, 0) + n
        minutes = sorted(totals)
        # a minute's stream total as expectations scale by: its routine records
        stream = {m: routine.get(m) or totals[m] for m in minutes}
        by_minute = _hops_by_minute(hops or {}, hops_before or {})
        nexts = _nexts_by_minute(next_lines or {}, next_lines_before or {}, specs)
        state, self._kept = self._resumed(specs, failing, minutes, by_minute, nexts), None
        lines = []
        for key, s in specs.items():
            line = state.lines.get(key)
            if line is None:  # a line new since the last version: nothing in the walked minutes
                line = state.lines[key] = _Line(
                    *key, failing[key], s.minutes, (), (), None, {}, False,
                    deque((when, 0, total) for when, total in state.learned),
                    total=sum(total for _, total in state.learned))
            line.minutes, line.first_seen, line.starts = s.minutes, s.first_seen, s.starts
            line.error = LEVEL_RANK.get(s.level or "", 0) >= ERROR_RANK
            line.named = known_callees(s.named, key[0], services)
            line.traces = tuple(s.traces)
            lines.append(line)
        by_service: dict[str, list[_Line]] = {}
        for line in lines:
            by_service.setdefault(line.service, []).append(line)
        cut = max(len(state.walked), len(minutes) - SETTLE_MINUTES)
        self.judged = len(minutes) - len(state.walked)
        for i in range(len(state.walked), len(minutes)):
            if i == cut:
                self._kept = state.copy()
            _step(state, lines, by_service, minutes, i, stream, nexts)
            _step_hops(state, minutes[i], by_minute.get(minutes[i], {}))
        if self._kept is None:
            self._kept = state.copy()
        findings = _findings(state, lines, minutes, first, _opening(minutes, stream))
        for caller, callees in add_calls(*calls).items():
            seen = {c for c, n in callees.items() if n >= MIN_CALL_HOPS and c != caller}
            if seen:
                findings.calls.setdefault(caller, set()).update(seen)
        findings.failed_calls = add_hops(failed_calls or {})
        return findings

    def _before(self, before: Mapping[str, Mapping[str, Series]], first: str
                ) -> dict[tuple[str, str], Series]:
        """``before``'s lines in the ``BASELINE_HOURS`` before ``first`` (kept while the
        same report and first minute come again)."""
        if self._history is not None and self._history[0] is before \
                and self._history[1] == first:
            return self._history[2]
        start = (parse_minute(first) - timedelta(hours=BASELINE_HOURS)).strftime(MINUTE_FORMAT)
        out = {}
        for service, templates in fold_series(before).items():
            for template, s in templates.items():
                kept = {m: n for m, n in s.minutes.items() if start <= m < first}
                if kept:
                    out[(service, template)] = s.model_copy(update={"minutes": kept})
        self._history = (before, first, out)
        return out

    def _resumed(self, specs: Mapping[tuple[str, str], Series],
                 failing: Mapping[tuple[str, str], bool], minutes: list[str],
                 hops: Mapping[str, Mapping[str, dict[int, int]]], nexts: NextByMinute
                 ) -> _State:
        """The kept walk if this version only added to what it walked, else a new one."""
        kept = self._kept
        if kept is None or minutes[:len(kept.walked)] != kept.walked:
            return _State()
        if kept.hops_walked != sum(sum(bins.values()) for m in kept.walked
                                   for bins in hops.get(m, {}).values()):
            return _State()
        if kept.nexts_walked != sum(sum(after.values()) for m in kept.walked
                                    for after in nexts.get(m, {}).values()):
            return _State()
        tail = minutes[len(kept.walked):]
        for key, s in specs.items():
            line = kept.lines.get(key)
            walked = sum(s.minutes.values()) - sum(s.minutes.get(m, 0) for m in tail)
            if walked != (0 if line is None else line.walked) or (
                    line is not None and line.failing != failing[key]):
                return _State()
        if any(key not in specs for key in kept.lines):
            return _State()
        return kept


def _hops_by_minute(hops: Hops, before: Hops) -> dict[str, dict[str, dict[int, int]]]:
    """minute -> service -> bin -> hops, the window before's first (a minute is one
    window's or the other's, never both)."""
    out: dict[str, dict[str, dict[int, int]]] = {}
    for table in (before, hops):
        for service, minutes in table.items():
            for minute, bins in minutes.items():
                out.setdefault(minute, {})[service] = {int(b): n for b, n in bins.items()}
    return out


def _nexts_by_minute(table: NextLines, before: NextLines,
                     specs: Mapping[tuple[str, str], Series]) -> NextByMinute:
    """minute -> (service, template) -> next template -> times, the window before's
    first. Next lines name templates by their heads (``template_head``): each goes to
    the series line whose head covers it or is it, the one with most records when
    several do; one no series holds keeps its head."""
    heads: dict[str, dict[str, tuple[int, str]]] = {}  # service -> head -> (records, line)
    for (service, template), s in specs.items():
        if template == OTHER_TEMPLATES:
            continue
        head, n = template_head(template), sum(s.minutes.values())
        held = heads.setdefault(service, {}).get(head)
        if held is None or (n, template) > held:
            heads[service][head] = (n, template)
    out: NextByMinute = {}
    for source in (before, table):
        for service, lines in source.items():
            own = heads.get(service, {})
            texts = {t for line, after in lines.items() for t in (line, *after)
                     if t and t != OTHER_TEMPLATES}
            roots = canonical_templates(texts | own.keys())
            by_root: dict[str, tuple[int, str]] = {}
            for head, held in own.items():
                root = roots[head]
                if root not in by_root or held > by_root[root]:
                    by_root[root] = held
            name = {t: by_root[roots[t]][1] if roots[t] in by_root else t for t in texts}
            for line, after in lines.items():
                lead = (service, name.get(line, line))
                for then, minutes in after.items():
                    then = name.get(then, then)
                    for minute, n in minutes.items():
                        counts = out.setdefault(minute, {}).setdefault(lead, {})
                        counts[then] = counts.get(then, 0) + n
    return out


def _step_hops(state: _State, minute: str, hops: Mapping[str, dict[int, int]]) -> None:
    """Judge each service's hops of ``minute`` against its baseline, then learn them
    (a slow minute is kept out of it, as a departing line's is)."""
    when = parse_minute(minute)
    start = when - timedelta(hours=BASELINE_HOURS)
    for base in state.hops.values():
        base.forget_before(start)
    tails = {service: base.tails() for service, base in state.hops.items() if base.count}
    pool = _slow_shares(state.hops, tails)
    for service in sorted(hops):
        bins = hops[service]
        base = state.hops.setdefault(service, _Hops())
        own = tails.get(service)
        found = _slow(service, base, own, minute, bins, pool)
        state.hops_walked += sum(bins.values())
        if found is not None:
            state.found.append((None, found))
            base.held.clear()  # the slowdown's first calls, not the service's usual
            if base.departed_run < ABSORB_MINUTES:
                base.departed_run += 1
                continue
        base.departed_run = 0
        far = own[0] + SLOW_STEPS[-1] if own is not None else None  # 64x its median
        base.learn_minute(when, bins, far)


def _slow_shares(bases: Mapping[str, _Hops],
                 tails: Mapping[str, tuple[int, dict[int, int]]]) -> dict[int, float]:
    """Per threshold of ``SLOW_STEPS``, the share of all services' baseline hops that
    took that many bins past their own service's median (``tails``; counted plus one,
    of those plus two)."""
    count = sum(bases[service].count for service in tails)
    return {step: (sum(own[step] for _, own in tails.values()) + 1) / (count + 2)
            for step in SLOW_STEPS}


def _slow(service: str, base: _Hops, tails: tuple[int, dict[int, int]] | None, minute: str,
          bins: Mapping[int, int], pool: Mapping[int, float]) -> Departure | None:
    """The most telling of the ``SLOW_STEPS`` thresholds (its tail times their number):
    a few calls a hundred times slower tell what many four times slower would.
    ``tails``: its baseline's (``_Hops.tails``)."""
    if tails is None:
        return None
    median, past = tails
    n = sum(bins.values())
    best: tuple[float, int, int, float] | None = None  # (p, step, x, q)
    for step, own in zip(SLOW_STEPS, STEP_HOPS, strict=True):
        if base.count < own:
            continue
        x = sum(k for b, k in bins.items() if b >= median + step)
        if x < MIN_SLOW:
            break
        q = (past[step] + POOL_HOPS * pool[step]) / (base.count + POOL_HOPS)
        p = min(1.0, _binomial_upper(x, n, q) * len(SLOW_STEPS))
        if best is None or p <= best[0]:  # a tie: the larger slowness says more
            best = (p, step, x, q)
    if best is None or best[0] >= TAIL_P:
        return None
    p, step, x, q = best
    return Departure(minute, service, ALL_CALLS, "slow", x, q * n, _surprise(p), False,
                     times=2 ** (step // 2))


def _opening(minutes: list[str], stream: Mapping[str, int]) -> list[str]:
    """The stream's first minutes, before it held the records anything is judged by."""
    opening: list[str] = []
    held = 0
    for minute in minutes:
        if held >= MIN_BASELINE_RECORDS:
            break
        opening.append(minute)
        held += stream[minute]
    return opening


def _step(state: _State, lines: list[_Line], by_service: Mapping[str, list[_Line]],
          minutes: list[str], i: int, stream: Mapping[str, int], nexts: NextByMinute
          ) -> None:
    """Judge minute ``i`` against each line's baseline, then learn it; ``stream``: each
    minute's total the expectations scale by; ``nexts``: which line followed which."""
    minute = minutes[i]
    total = stream[minute]
    when = parse_minute(minute)
    start = when - timedelta(hours=BASELINE_HOURS)
    for line in lines:
        line.forget_before(start)
    while state.learned and state.learned[0][0] < start:
        state.learned.popleft()
    if i % PARTNER_EVERY == 0:
        for own in by_service.values():
            _pick_partners(own)
    departed: set[int] = set()
    recent = minutes[max(0, i - THIN_MINUTES + 1):i + 1][::-1]
    for line in lines:
        if line.total < MIN_BASELINE_RECORDS:
            continue
        x = line.minutes.get(minute, 0)
        if line.failing and len(line.history) >= CHRONIC_MIN_MINUTES \
                and line.seen >= CHRONIC_SHARE * len(line.history):
            # background while it keeps its rate; a burst of it is a departure still
            state.chronic.add(line.key)
            found = _burst(line, minute, x, total) if line.template != OTHER_TEMPLATES else None
        else:
            found = _judge(line, minute, x, total, recent)
        if found is not None:
            state.found.append((line.key, found))
            departed.add(id(line))
        elif line.unseen[0]:  # too soon to call it new: kept out of the baseline
            departed.add(id(line))
    _step_nexts(state, nexts, recent, departed)
    for service, own in by_service.items():
        found = _quiet(service, own, recent, stream)
        if found is not None:
            state.found.append((None, found))
    for line in lines:
        x = line.minutes.get(minute, 0)
        line.walked += x
        if id(line) in departed and line.departed_run < ABSORB_MINUTES:
            line.departed_run += 1
            continue
        line.departed_run = 0
        line.unseen = (0, 0)  # a first appearance never proved new is the new normal too
        line.learn(when, x, total)
    state.learned.append((when, total))
    state.walked.append(minute)


def _step_nexts(state: _State, nexts: NextByMinute, recent: list[str], departed: set[int]
                ) -> None:
    """Judge which line followed which in this minute's requests (``recent[0]``), then
    learn it: a line its service writes right after another in most requests that
    stops following it departs as ``thin`` (``departed``: lines departed this minute,
    which it joins). A thinning shows here in a request's worth of records: no minute
    by minute history is needed to know that one line follows another."""
    minute = recent[0]
    when = parse_minute(minute)
    start = when - timedelta(hours=BASELINE_HOURS)
    now = nexts.get(minute, {})
    gone: set[tuple[str, str]] = set()  # leads a line stopped following
    for lead, after in state.nexts.items():
        for base in after.values():
            base.forget_before(start)
        this = now.get(lead)
        if not this:
            continue
        for then, base in after.items():
            line = state.lines.get((lead[0], then))
            # a failure that stops following a line is a recovery, not a thinning
            if line is None or line.failing or line.template == OTHER_TEMPLATES \
                    or id(line) in departed or line.total < MIN_BASELINE_RECORDS \
                    or not base.n or base.k < PAIR_MIN_RATIO * base.n:
                continue
            found = _next_thinned(line, minute, lead, then, base, nexts, recent)
            if found is not None:
                state.found.append((line.key, found))
                departed.add(id(line))
                gone.add(lead)
    for lead, this in now.items():
        after = state.nexts.setdefault(lead, {})
        n = sum(this.values())
        # a minute in which a line stopped following this one is kept out of all that
        # follow it: what came instead is the departure's, not the usual
        held = lead in gone
        for then in [*this, *(t for t in after if t not in this)]:
            base = after.setdefault(then, _Next())
            if held and base.departed_run < ABSORB_MINUTES:
                base.departed_run += 1
                continue
            base.departed_run = 0
            base.learn(when, this.get(then, 0), n)
        state.nexts_walked += n


def _next_thinned(line: _Line, minute: str, lead: tuple[str, str], then: str, base: _Next,
                  nexts: NextByMinute, recent: list[str]) -> Departure | None:
    """``then`` stopped following ``lead``: in this minute, or summed with the ones
    before it when this one is short of it too or holds too few requests to tell; by
    the exact conditional test of two shares (Fisher's), this minute's against the
    baseline's, so a baseline of one minute is weighed as the count it is."""
    share = base.k / base.n
    this = nexts[minute][lead]
    k, n = this.get(then, 0), sum(this.values())
    summed = k <= THIN_FACTOR * share * n or n < MIN_PARTNER
    for span in recent[:1], (recent if summed else ()):
        mine = seen = 0
        for m in span:
            counts = nexts.get(m, {}).get(lead, {})
            mine += counts.get(then, 0)
            seen += sum(counts.values())
        if seen >= MIN_PARTNER and mine <= THIN_FACTOR * share * seen:
            p = _fisher_lower(mine, seen, base.k, base.n)
            if p < TAIL_P:
                return _departure(line, minute, "thin", k, share * n, _surprise(p))
    return None


def _findings(state: _State, lines: list[_Line], minutes: list[str], first: str | None,
              opening: list[str]) -> Findings:
    """What the walk found from ``first`` on (the minutes before are another window's);
    ``opening``: the stream's first minutes, judged by nothing."""
    own = minutes if first is None else minutes[bisect_left(minutes, first):]
    findings = Findings(minutes=own, chronic=sorted(state.chronic))
    for key, dep in state.found:
        if first is not None and dep.minute < first:
            continue
        line = state.lines.get(key) if key is not None else None
        findings.departures.append(dep if line is None else _departure(
            line, dep.minute, dep.kind, dep.observed, dep.expected, dep.surprise))
    findings.departures.sort(key=lambda d: (d.minute, d.service, d.template))
    for line in lines:
        if line.named:
            findings.calls.setdefault(line.service, set()).update(line.named)
    if minutes and minutes[0] == first:  # the window began the stream: no past at all
        after = minutes[len(opening)] if len(minutes) > len(opening) else None
        findings.standing, findings.early = _unjudged(lines, opening, after, state.chronic)
    return findings


def _unjudged(lines: list[_Line], opening: list[str], after: str | None,
              chronic: set[tuple[str, str]]) -> tuple[list[Departure], list[Departure]]:
    """(standing, early) error lines that never proved chronic, most records first:
    standing ones were written in the opening minutes, ``MIN_NEW`` times there or in the
    minute ``after`` them (a log cut mid-minute opens with a few seconds), early ones
    began after them and the new test still waits on them when the walk ends. A log
    that starts mid-incident, or a minute before one, names its failing service even
    without a past."""
    standing, early = [], []
    for line in lines:
        if not line.error or line.template == OTHER_TEMPLATES \
                or (line.service, line.template) in chronic:
            continue
        opened = sum(line.minutes.get(m, 0) for m in opening)
        if opened >= MIN_NEW or (opened and line.minutes.get(after or "", 0) >= MIN_NEW):
            standing.append(_unjudged_line(line, opening[0], "standing"))
        elif not line.count and line.unseen[0] >= MIN_NEW:
            early.append(_unjudged_line(line, min(line.minutes), "early"))
    return sorted(standing, key=_most_records), sorted(early, key=_most_records)


def _unjudged_line(line: _Line, minute: str, kind: Kind) -> Departure:
    dep = _departure(line, minute, kind, sum(line.minutes.values()), 0.0, 0.0)
    return replace(dep, first_seen=line.first_seen, until=max(line.minutes))


def _most_records(dep: Departure) -> tuple[int, str, str]:
    return -dep.observed, dep.service, dep.template


def _judge(line: _Line, minute: str, x: int, total: int, recent: list[str]
           ) -> Departure | None:
    """``recent``: this minute and the ones before it a thinning is summed over."""
    expected = line.count / line.total * total
    if line.failing and line.template != OTHER_TEMPLATES:
        if line.count == 0 and (x >= MIN_NEW or line.unseen[0] or (x and line.departed_run)):
            # new: never in a baseline long enough that its rate since its first record
            # would have shown there (a sequential test: evidence grows minute by minute);
            # once it departed, a minute of fewer than MIN_NEW goes on with it rather than
            # teaching the baseline that the failure is usual
            seen, span = line.unseen[0] + x, line.unseen[1] + total
            if seen / span * line.total >= NEW_SILENCE:
                line.unseen = (0, 0)
                return _departure(line, minute, "new", x, expected, MAX_SURPRISE)
            line.unseen = (seen, span)
            return None
        if line.count and (found := _burst(line, minute, x, total)) is not None:
            return found
    partner = line.partner
    if partner is not None:
        # this minute alone, else (when it is thin too, or below its usual with too few
        # partner records to tell) with the minutes before it: a line written a few times
        # a minute thins out over several before one can tell
        alone = partner.minutes.get(minute, 0)
        this = line.ratio * alone
        summed = x <= THIN_FACTOR * this or (alone < MIN_PARTNER and x < this)
        for span in recent[:1], (recent if summed else ()):
            mine = sum(line.minutes.get(m, 0) for m in span)
            seen = sum(partner.minutes.get(m, 0) for m in span)
            usual = line.ratio * seen
            if seen >= MIN_PARTNER and mine <= THIN_FACTOR * usual:
                p = _binomial_lower(mine, seen, min(line.ratio, 0.999))
                if p < TAIL_P:
                    return _departure(line, minute, "thin", x, this, _surprise(p))
    return None


def _burst(line: _Line, minute: str, x: int, total: int) -> Departure | None:
    expected = line.count / line.total * total
    if x >= MIN_BURST and x >= BURST_FACTOR * expected:
        p = _binomial_upper(x, x + line.count, total / (total + line.total))
        if p < TAIL_P:
            return _departure(line, minute, "burst", x, expected, _surprise(p))
    return None


def _quiet(service: str, own: list[_Line], recent: list[str], stream: Mapping[str, int]
           ) -> Departure | None:
    """``recent``: this minute and the ones before it, summed over when this one is quiet
    too (a service a few requests a minute reach falls silent over several)."""
    base = sum(line.count for line in own)
    span = max((line.total for line in own), default=0)
    if span < MIN_BASELINE_RECORDS or not base:
        return None
    share = base / span
    minute = recent[0]
    x = sum(line.minutes.get(minute, 0) for line in own)
    this = share * stream[minute]
    if x > QUIET_FACTOR * this:  # most minutes: neither it nor a sum with it is quiet
        return None
    # its lines come a request's worth at a time: counted as requests, a minute that
    # served none of the two it usually serves is no departure
    top = max((line.count for line in own if line.template != OTHER_TEMPLATES), default=0)
    per_request = max(1.0, base / (top or base))
    # and it fell, not just its share: a stream swollen by others' traffic is no sign
    per_minute = base / max(len(line.history) for line in own)
    for minutes in recent[:1], recent:
        total = sum(stream[m] for m in minutes)
        mine = sum(line.minutes.get(m, 0) for line in own for m in minutes)
        expected = share * total
        if expected / per_request < MIN_QUIET_EXPECTED \
                or mine > QUIET_FACTOR * min(expected, per_minute * len(minutes)):
            continue
        p = _binomial_lower(round(mine / per_request), round((mine + base) / per_request),
                            total / (total + span))
        if p < TAIL_P:
            return Departure(minute, service, ALL_LINES, "quiet", x, this, _surprise(p),
                             False)
    return None


def _departure(line: _Line, minute: str, kind: Kind, x: int, expected: float,
               surprise: float) -> Departure:
    return Departure(minute, line.service, line.template, kind, x, expected, surprise,
                     line.failing, line.named, line.traces,
                     line.starts.get(minute) or line.first_seen, line.error)


def _pick_partners(own: list[_Line]) -> None:
    """Each line's partner: the line of its service it moved with over the last
    ``PAIR_MINUTES`` of its baseline, at the highest ratio."""
    recent = {id(line): [x for _, x, _ in list(line.history)[-PAIR_MINUTES:]] for line in own}
    for line in own:
        line.partner, line.ratio = None, 0.0
        if line.count < MIN_PAIR_RECORDS or line.template == OTHER_TEMPLATES:
            continue
        counts = recent[id(line)]
        mine = sum(counts)
        if not mine:
            continue
        candidates = sorted(
            (other for other in own
             if other is not line and other.count >= line.count
             and line.count >= PAIR_MIN_RATIO * other.count
             and other.template != OTHER_TEMPLATES
             and len(other.history) == len(line.history)),
            key=lambda other: (other.count, other.template))
        # the highest ratio first, the first that moved with it; a line whose nearest
        # few do not has no partner (the walk costs lines x PARTNER_TRIES, not lines^2)
        for other in candidates[:PARTNER_TRIES]:
            ratio = line.count / other.count
            pairs = list(zip(counts, recent[id(other)], strict=True))
            limit, spread = PAIR_SPREAD * mine, 0.0
            for x, y in pairs:  # stops as soon as it cannot be a partner
                spread += abs(x - ratio * y)
                if spread > limit:
                    break
            if spread > limit:
                continue
            # two independent lines differ by about sqrt(2/pi * variance) a minute: a
            # partner must move with the line far closer than chance would
            chance = sum(math.sqrt(x + ratio * ratio * y) for x, y in pairs) * _ABS_NORMAL
            if spread <= PAIR_CHANCE * chance:
                line.ratio, line.partner = ratio, other
                break


def _surprise(p: float) -> float:
    return min(MAX_SURPRISE, -math.log10(max(p, 1e-300)))


def _binomial_lower(k: int, n: int, q: float) -> float:
    """P(X <= k) for X ~ Binomial(n, q), for k at or below the mean."""
    return _binomial_tail(k, n, q, -1)


def _binomial_upper(k: int, n: int, q: float) -> float:
    """P(X >= k) for X ~ Binomial(n, q), for k at or above the mean."""
    return _binomial_tail(k, n, q, 1)


def _fisher_lower(k: int, n: int, k0: int, n0: int) -> float:
    """P(X <= k) for the ``k`` of ``n`` now against ``k0`` of ``n0`` before, given both
    together (X hypergeometric: ``n`` drawn from ``n + n0`` holding ``k + k0``)."""
    total, hits = n + n0, k + k0
    lowest = max(0, n - (total - hits))
    head = _log_choose(total, n)
    out = 0.0
    for i in range(k, lowest - 1, -1):  # below the mean the terms only shrink
        term = math.exp(_log_choose(hits, i) + _log_choose(total - hits, n - i) - head)
        out += term
        if term < out * 1e-12:
            break
    return min(1.0, out)


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _binomial_tail(k: int, n: int, q: float, step: int) -> float:
    """The terms from ``k`` away from the mean, summed until they stop counting (on a
    tail they only shrink), so a line with thousands of records costs a few terms."""
    if q <= 0:  # every draw is 0
        return 1.0 if step < 0 or k <= 0 else 0.0
    if q >= 1:  # every draw is n
        return 1.0 if step > 0 or k >= n else 0.0
    log_q, log_r = math.log(q), math.log1p(-q)
    head = math.lgamma(n + 1)
    total = 0.0
    i = k
    while 0 <= i <= n:
        term = math.exp(head - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                        + i * log_q + (n - i) * log_r)
        total += term
        if term < total * 1e-12:
            break
        i += step
    return min(1.0, total)
