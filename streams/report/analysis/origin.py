"""Which service failed first, and which only suffered from it (pure: no I/O, no clock).

When a service fails, its callers log the failure too, often more loudly than the
service itself: "no instances available for X", "connection refused to X", "X
returned 503". Those records are **impact**; X is the **suspected origin**. The rule:

1. every failure names the services it calls, from its title's subjects and from its
   texts (the phrasings below: service discovery, refused or timed-out connections,
   5xx answers, failed calls);
2. a named service is matched to a service that logged, by the words of their names
   (``ts-basic-service`` and ``f.m.s.BasicServiceImpl`` share ``basic``; words such
   as ``service``, ``impl`` or ``controller`` and one-letter package parts say
   nothing);
3. the origin is a named service that has failures of its own, else the one named
   by the most failing records of *other* services; with none named, the trace rule
   below, and without trace links the service of the earliest error;
4. its first anomaly time is its own earliest failure, or, when it logged none (it
   crashed silently), the first caller record that named it.

Trace ids (``find_origin(..., traces=...)``: per cause, the trace ids of its failing
records, a sample of each template's smallest) link failures without names. Two
failing causes of different services that share a trace id failed in the same
request, so one called the other, directly or not:

5. with no service named, the origin among trace-linked causes is the service whose
   failures share the most distinct trace ids with other services' failures. A
   dependency is in the failed requests of every caller that calls it, each caller
   only in its own: two callers of one database each share their traces with it, the
   database shares both sets. Ties go to the earliest failure (within a request the
   called service fails before its caller logs the answer), then the most records;
6. the services trace-linked to the origin are among its callers, whichever rule
   chose it. Names still come first (rule 3): a name says which service was called,
   a shared trace only that two services took part in one request.

Limits: a link has no direction, so with one caller and one dependency the earlier
failure decides, and a caller that fans out to two failing dependencies shares more
traces than either and is chosen (span parents would tell, but are not kept). The
samples keep each template's smallest ids, so a shared id proves a link and a missing
one proves nothing. Linked causes must not share a service; a cause whose template
two services logged lends its traces to both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from streams.batch.callees import named_services, same_service


class CauseLike(Protocol):
    """The parts of a post-mortem cause this module reads."""

    title: str
    services: list[str]
    subjects: list[str]
    count: int
    first_seen: str | None
    severity: str


@dataclass(frozen=True, slots=True)
class Origin:
    """The suspected origin of an episode and the callers that suffered from it."""

    service: str
    first_seen: str | None
    callers: tuple[str, ...] = ()  # services whose failures named it
    reason: str = ""
    logged: bool = True  # the origin has failures of its own in the logs


@dataclass(slots=True)
class _Named:
    records: int = 0
    callers: set[str] = field(default_factory=set)
    first_seen: str | None = None


def find_origin(causes: Sequence[CauseLike], texts: dict[int, list[str]],
                is_failure: dict[int, bool], *,
                traces: Mapping[int, Collection[str]] | None = None) -> Origin | None:
    """The suspected origin among ``causes`` (indexes into ``texts``: each cause's title,
    subjects, templates and examples; ``is_failure``: an error, not a warning;
    ``traces``: each cause's trace ids, the union of its evidence's ``traces``)."""
    failing = [i for i, _ in enumerate(causes) if is_failure.get(i)]
    if not failing:
        return None
    linked = _trace_links(causes, failing, traces or {})
    named: dict[str, _Named] = {}
    for i in failing:
        cause = causes[i]
        for name in dict.fromkeys([*cause.subjects, *named_services(texts.get(i, []))]):
            if any(same_service(name, s) for s in cause.services):
                continue  # a service naming itself is no caller
            entry = named.setdefault(name, _Named())
            entry.records += cause.count
            entry.callers.update(cause.services)
            if cause.first_seen and (entry.first_seen is None
                                     or cause.first_seen < entry.first_seen):
                entry.first_seen = cause.first_seen
    if named:
        merged = _merge_names(named)

        def own_of(name: str) -> list[CauseLike]:
            return [causes[i] for i in failing
                    if any(same_service(name, s) for s in causes[i].services)]

        # a named service that failed itself is the strongest lead; then the most
        # complaints, then the earliest
        name, entry = min(merged.items(), key=lambda kv: (
            not own_of(kv[0]), -kv[1].records, kv[1].first_seen or "~", kv[0]))
        own = own_of(name)
        named_by = tuple(sorted(entry.callers))
        if own:
            service = _most_records(own, name)
            first = min((c.first_seen for c in own if c.first_seen), default=entry.first_seen)
            callers = _with_linked(named_by, name, linked)
            reason = f"named by failures in {len(named_by)} calling service(s)"
            if len(callers) > len(named_by):
                reason += f"; failed requests shared with {len(callers)} service(s)"
            return Origin(service, first, callers, reason, True)
        return Origin(name, entry.first_seen, named_by,
                      f"named by failures in {len(named_by)} calling service(s); it logged "
                      "no failure of its own", False)
    if linked:
        return _by_traces(causes, failing, linked)
    earliest = min((causes[i] for i in failing),
                   key=lambda c: (c.first_seen is None, c.first_seen or "", -c.count))
    service = _most_records([earliest], None)
    return Origin(service, earliest.first_seen, (), "the earliest error", True)


@dataclass(slots=True)
class _Linked:
    """What a failing service shares with other services' failures."""

    traces: set[str] = field(default_factory=set)  # its trace ids that another one has
    services: set[str] = field(default_factory=set)  # the services it shares them with
    causes: list[int] = field(default_factory=list)  # its failing causes with a link


def _alike(a: str, b: str) -> bool:
    return a == b or same_service(a, b)


def _trace_links(causes: Sequence[CauseLike], failing: list[int],
                 traces: Mapping[int, Collection[str]]) -> dict[str, _Linked]:
    """Per service: the trace ids its failures share with failures of other services."""
    ids = {i: set(traces.get(i, ())) for i in failing}
    out: dict[str, _Linked] = {}
    for i in failing:
        if not ids[i]:
            continue
        for j in failing:
            shared = ids[i] & ids[j]
            if j == i or not shared or any(_alike(a, b) for a in causes[i].services
                                           for b in causes[j].services):
                continue
            for service in causes[i].services:
                entry = out.setdefault(service, _Linked())
                entry.traces |= shared
                entry.services.update(causes[j].services)
                if i not in entry.causes:
                    entry.causes.append(i)
    return out


def _with_linked(callers: tuple[str, ...], origin: str,
                 linked: dict[str, _Linked]) -> tuple[str, ...]:
    """``callers`` and the services trace-linked to ``origin``'s failures."""
    more = {s for service, entry in linked.items() if _alike(service, origin)
            for s in entry.services if not _alike(s, origin)}
    return tuple(sorted({*callers, *more}))


def _by_traces(causes: Sequence[CauseLike], failing: list[int],
               linked: dict[str, _Linked]) -> Origin:
    """Rule 5: the service whose failures share the most trace ids with other services'."""

    def first_of(service: str) -> str:
        return min((causes[i].first_seen or "~" for i in linked[service].causes), default="~")

    def records_of(service: str) -> int:
        return sum(causes[i].count for i in linked[service].causes)

    service = min(linked, key=lambda s: (-len(linked[s].traces), first_of(s), -records_of(s), s))
    own = [causes[i] for i in failing if any(_alike(service, s) for s in causes[i].services)]
    first = min((c.first_seen for c in own if c.first_seen), default=None)
    callers = _with_linked((), service, linked)
    return Origin(service, first, callers,
                  f"in {len(linked[service].traces)} failed request(s) (shared trace ids) of "
                  f"{len(callers)} calling service(s)", True)


def _merge_names(named: dict[str, _Named]) -> dict[str, _Named]:
    """Spellings of one service (``ts-basic-service``, ``basic``) counted together."""
    merged: dict[str, _Named] = {}
    for name in sorted(named, key=lambda n: (-named[n].records, n)):
        home = next((m for m in merged if same_service(m, name)), None)
        entry = named[name]
        if home is None:
            merged[name] = _Named(entry.records, set(entry.callers), entry.first_seen)
            continue
        held = merged[home]
        held.records += entry.records
        held.callers |= entry.callers
        if entry.first_seen and (held.first_seen is None or entry.first_seen < held.first_seen):
            held.first_seen = entry.first_seen
    return merged


def _most_records(causes: Sequence[CauseLike], like: str | None) -> str:
    """The service of ``causes`` with the most records (matching ``like`` if given)."""
    records = Counter[str]()
    for c in causes:
        for s in c.services:
            if like is None or same_service(like, s):
                records[s] += c.count
    return min(records, key=lambda s: (-records[s], s))
