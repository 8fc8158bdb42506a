"""What was decided and delivered about each report's incidents, and deciding the next change.

The ledger of a report (``Notices``) is one message on the compacted notifications
topic, keyed by the report id: its incidents, each with the changes decided for it
(opened, escalated, ended, in order) and, per sink, how many of them that sink has
accepted. It is the notifier's state, as the reports topic is the compactor's: the
member owning the report's partition loads it, and a member that restarts, or takes
the partition over, knows what was said and what is still owed.

``Planner.plan`` compares a report version's incidents (``alerts_for``) with the ledger
and appends the changes they make. A change is a function of the ledger and the
version, so reading the same version again decides nothing new; each has a key
(``<report>/<incident>/<n>:<kind>``) that names it wherever it is sent.

**Which incident is which.** An entry is one paged incident. Its id, fixed when it
opens, is ``<origin>@<minute it started>`` (``-2``... should that be taken): with the
report id it names the incident in every alert and message. From version to version
an incident is recognised by its origin and the minutes it covers, never by the id
being derived again, because what a report says of an incident moves as it grows:

* late records can show that it began earlier (its start moves back), or a baseline
  that learned more can judge its first minute usual (its start moves on): either way
  it still shares minutes with the entry, which follows it under the id it opened with;
* a later version can split a run in two (a departure in the middle judged usual): both
  pieces share minutes with the entry, which follows both; nothing is paged again;
* a departure filling the gap between two runs of an origin merges them: the merged
  incident shares minutes with both entries; the one opened first follows it and the
  other ends as ``merged`` (its last message says which incident it goes on as);
* the origin can become clearer (a callee that callers' errors name turns out to be a
  service of the records): an open entry that no incident of its own origin matches
  follows one that overlaps it and counts its origin among the services that departed.

An entry's span (``first_seen``..``last_seen``) grows with what it follows and is kept
in the ledger, so a restarted member recognises the incident as well. An ended entry
still holds the minutes it covered: what it said is not said again; a run of its
origin that begins after them is a new incident, paged once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

from streams.notify.incidents import Alert
from streams.records import Severity
from streams.report.state.model import SEVERITY_WEIGHT

ChangeKind = Literal["opened", "escalated", "ended"]
EndReason = Literal["resolved", "gone", "window closed", "merged"]
MAX_ENTRIES = 100  # incidents a report's ledger keeps; the oldest ended ones go first


class Change(BaseModel):
    """One decided change of an incident, with what it said at the time."""

    kind: ChangeKind
    severity: Severity
    at: str  # wall-clock UTC time of the decision
    title: str
    summary: str
    origin: str | None = None  # the origin service the incident had then
    first_seen: str | None = None  # its first departure's minute
    last_seen: str | None = None  # the end of its last departure's minute
    callers: list[str] = Field(default_factory=list)  # every caller notified so far
    evidence: list[str] = Field(default_factory=list)
    why: EndReason | None = None  # of an end


class Entry(BaseModel):
    """One notified incident of a report."""

    id: str  # stable: "<origin>@<YYYY-MM-DDTHH:MM it started>", with "-2"... if taken
    report_id: str
    service: str  # its origin when it opened, so its alert's labels stay the same
    first_seen: str = ""  # the span of the incidents it followed, to recognise them
    last_seen: str = ""
    changes: list[Change] = Field(default_factory=list)
    delivered: dict[str, int] = Field(default_factory=dict)  # sink -> changes it accepted

    @property
    def open(self) -> bool:
        return bool(self.changes) and self.changes[-1].kind != "ended"

    @property
    def severity(self) -> Severity:
        """The highest severity notified: an alert never steps down while open."""
        return max((c.severity for c in self.changes), key=SEVERITY_WEIGHT.__getitem__,
                   default="info")

    @property
    def severities(self) -> list[Severity]:
        """Every severity it was notified at, in order (each one an alert's label set)."""
        return list(dict.fromkeys(c.severity for c in self.changes))

    @property
    def callers(self) -> set[str]:
        """Every caller notified so far."""
        return {s for c in self.changes for s in c.callers}

    def covers(self, alert: Alert) -> bool:
        """The alert is of this report and shares a minute with this entry's span."""
        return alert.report_id == self.report_id and alert.overlaps(self.first_seen,
                                                                    self.last_seen)

    def change_key(self, n: int) -> str:
        return f"{self.report_id}/{self.id}/{n}:{self.changes[n].kind}"

    def owed(self, sink: str) -> int:
        """Changes decided that ``sink`` has not accepted yet."""
        return len(self.changes) - self.delivered.get(sink, 0)


class Notices(BaseModel):
    """A report's ledger: the value of its message on the notifications topic."""

    report_id: str
    entries: list[Entry] = Field(default_factory=list)
    # the latest end of the ended incidents trimmed off: one that ended before is history
    forgotten_until: str = ""

    def entry(self, entry_id: str) -> Entry | None:
        return next((e for e in self.entries if e.id == entry_id), None)

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Notices:
        return cls.model_validate_json(data)


@dataclass
class Planner:
    """Decides changes; remembers (in memory) since when an open incident has looked
    ended, so a report that looks ended for a moment while a share catches up ends
    nothing, and since when an incident of fallen volume alone has been seen, so a
    service whose records are still on their way (one partition behind the others while
    a worker reads a backlog) is not paged as silent: it opens after ``silent_after``
    seconds. After a restart both waits start again: a change comes later, never twice."""

    min_severity: Severity = "high"
    end_after: float = 60.0
    silent_after: float = 120.0
    _ending: dict[tuple[str, str], float] = field(default_factory=dict)
    # (report, origin) -> since when an incident of fallen volume alone has been seen
    _silent: dict[tuple[str, str], float] = field(default_factory=dict)

    def plan(self, notices: Notices, alerts: Iterable[Alert], *, now: str,
             mono: float) -> bool:
        """Append to ``notices`` the changes ``alerts`` (one report version) make;
        True when it changed."""
        alerts = list(alerts)
        owners = recognised(notices.entries, alerts)
        led: dict[str, list[Alert]] = {}  # entry id -> the alerts it follows
        merged: dict[str, str] = {}  # entry id -> the entry following its alerts instead
        for alert, own in zip(alerts, owners, strict=True):
            if not own:
                continue
            leader = next((e for e in own if e.open), own[0])
            led.setdefault(leader.id, []).append(alert)
            for entry in own:
                if entry is not leader:
                    merged.setdefault(entry.id, leader.id)
        changed = False
        for entry in [e for e in notices.entries if e.open]:
            if entry.id in led:
                changed |= self._follow(notices.report_id, entry, _together(led[entry.id]),
                                        now=now, mono=mono)
            elif entry.id in merged:
                into = merged[entry.id]
                changed |= self._end(notices.report_id, entry, "merged", now=now, mono=mono,
                                     summary=f"It goes on as incident {into}.")
            else:
                changed |= self._end(notices.report_id, entry, "gone", now=now, mono=mono)
        silent = set()
        for alert, own in zip(alerts, owners, strict=True):
            # new: opened even if already over, unless its window is over or it is history
            if own or alert.closed or alert.severity not in _at_least(self.min_severity) \
                    or alert.last_seen <= notices.forgotten_until:
                continue
            if alert.silent:  # paged once the silence outlasted a backlog's catching up
                key = (notices.report_id, alert.service)
                silent.add(key)
                if mono - self._silent.setdefault(key, mono) < self.silent_after:
                    continue
            changed |= self._open(notices, alert, now)
        for key in [k for k in self._silent if k[0] == notices.report_id and k not in silent]:
            del self._silent[key]  # it went away (its records came) or it opened
        if changed:
            _trim(notices)
        return changed

    def _open(self, notices: Notices, alert: Alert, now: str) -> bool:
        entry = Entry(id=_new_id(notices, alert), report_id=notices.report_id,
                      service=alert.service, first_seen=alert.started,
                      last_seen=alert.last_seen)
        entry.changes.append(_change("opened", alert, now, severity=alert.severity,
                                     callers=set(alert.callers)))
        notices.entries.append(entry)
        return True

    def _follow(self, report_id: str, entry: Entry, alert: Alert, *, now: str,
                mono: float) -> bool:
        first = min(entry.first_seen or alert.started, alert.started)
        last = max(entry.last_seen, alert.last_seen)
        grown = (first, last) != (entry.first_seen, entry.last_seen)
        entry.first_seen, entry.last_seen = first, last  # kept: a restart still recognises it
        if alert.ended:
            ended = self._end(report_id, entry, "window closed" if alert.closed else "resolved",
                              now=now, mono=mono, alert=alert)
            return ended or grown
        self._ending.pop((report_id, entry.id), None)
        severity = max(entry.severity, alert.severity, key=SEVERITY_WEIGHT.__getitem__)
        callers = entry.callers | set(alert.callers)
        if severity != entry.severity or callers != entry.callers:
            entry.changes.append(_change("escalated", alert, now, severity=severity,
                                         callers=callers))
            return True
        return grown

    def _end(self, report_id: str, entry: Entry, why: EndReason, *, now: str, mono: float,
             alert: Alert | None = None, summary: str | None = None) -> bool:
        """End ``entry`` once it has looked ended for ``end_after``: with what ``alert``
        says last, else with what it said last itself."""
        key = (report_id, entry.id)
        since = self._ending.setdefault(key, mono)
        if mono - since < self.end_after:
            return False
        del self._ending[key]
        if alert is not None:
            end = _change("ended", alert, now, severity=entry.severity,
                          callers=entry.callers | set(alert.callers), why=why)
        else:
            end = entry.changes[-1].model_copy(update={"kind": "ended", "at": now, "why": why})
        if summary is not None:
            end.summary = summary
        end.first_seen, end.last_seen = entry.first_seen, entry.last_seen
        entry.changes.append(end)
        return True


def recognised(entries: list[Entry], alerts: list[Alert]) -> list[list[Entry]]:
    """Per alert, the entries it is (in ``entries``' order; none: a new incident): those
    of its origin that share a minute with it, else the open entries whose origin it
    counts among its services, sharing a minute with it, that no alert of their own
    origin matched (the origin became clearer). See the module's docstring."""
    own = [[e for e in entries if e.service == a.service and e.covers(a)] for a in alerts]
    matched = {id(e) for found in own for e in found}
    return [found or [e for e in entries if e.open and id(e) not in matched
                      and e.service in a.services and e.covers(a)]
            for a, found in zip(alerts, own, strict=True)]


def _together(alerts: list[Alert]) -> Alert:
    """The incidents one entry follows (the pieces of a split run) as one: the most
    severe one's words over their joint span, callers and services; ended once all are."""
    top = max(alerts, key=lambda a: (SEVERITY_WEIGHT[a.severity], a.last_seen))
    if len(alerts) == 1:
        return top
    return dataclasses.replace(
        top, started=min(a.started for a in alerts), last_seen=max(a.last_seen for a in alerts),
        callers=tuple(sorted({c for a in alerts for c in a.callers})),
        services=tuple(sorted({s for a in alerts for s in a.services})),
        ended=all(a.ended for a in alerts), closed=any(a.closed for a in alerts))


def _at_least(severity: Severity) -> set[str]:
    return {s for s, w in SEVERITY_WEIGHT.items() if w >= SEVERITY_WEIGHT[severity]}


def _new_id(notices: Notices, alert: Alert) -> str:
    base = f"{alert.service}@{alert.started[:16]}"
    taken = {e.id for e in notices.entries}
    n, candidate = 1, base
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _change(kind: ChangeKind, alert: Alert, now: str, *, severity: Severity,
            callers: set[str], why: EndReason | None = None) -> Change:
    return Change(kind=kind, severity=severity, at=now, title=alert.title,
                  summary=alert.summary, origin=alert.service, first_seen=alert.started,
                  last_seen=alert.last_seen, callers=sorted(callers),
                  evidence=list(alert.evidence), why=why)


def _trim(notices: Notices) -> None:
    """Keep the ledger bounded: drop the oldest ended incidents, remembering until
    when they ran, so none of them is taken for a new one."""
    extra = len(notices.entries) - MAX_ENTRIES
    if extra <= 0:
        return
    done = [e for e in notices.entries if not e.open][:extra]
    notices.forgotten_until = max([notices.forgotten_until, *(e.last_seen for e in done)])
    drop = {id(e) for e in done}
    notices.entries = [e for e in notices.entries if id(e) not in drop]
