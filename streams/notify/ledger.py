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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

from streams.notify.incidents import Alert
from streams.records import Severity
from streams.report.state.model import SEVERITY_WEIGHT

ChangeKind = Literal["opened", "escalated", "ended"]
MAX_KEYS = 50  # report incident keys an incident remembers, to recognise it
MAX_ENTRIES = 100  # incidents a report's ledger keeps; the oldest ended ones go first


class Change(BaseModel):
    """One decided change of an incident, with what it said at the time."""

    kind: ChangeKind
    severity: Severity
    at: str  # wall-clock UTC time of the decision
    title: str
    summary: str
    origin: str | None = None
    first_seen: str | None = None
    last_seen: str | None = None
    why: str | None = None  # of an end: "resolved", "gone" or "window closed"


class Entry(BaseModel):
    """One notified incident of a report."""

    id: str  # stable: the incident label, "<root cause key>" (with "-2"... on a recurrence)
    report_id: str
    service: str  # fixed when it opened, so its alert's labels stay the same
    keys: list[str] = Field(default_factory=list)
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

    def change_key(self, n: int) -> str:
        return f"{self.report_id}/{self.id}/{n}:{self.changes[n].kind}"

    def owed(self, sink: str) -> int:
        """Changes decided that ``sink`` has not accepted yet."""
        return len(self.changes) - self.delivered.get(sink, 0)


class Notices(BaseModel):
    """A report's ledger: the value of its message on the notifications topic."""

    report_id: str
    entries: list[Entry] = Field(default_factory=list)

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
    nothing. After a restart that wait starts again: an end comes later, never twice."""

    min_severity: Severity = "high"
    end_after: float = 60.0
    _ending: dict[tuple[str, str], float] = field(default_factory=dict)

    def plan(self, notices: Notices, alerts: Iterable[Alert], *, now: str,
             mono: float) -> bool:
        """Append to ``notices`` the changes ``alerts`` (one report version) make;
        True when it changed."""
        alerts = list(alerts)
        changed = False
        open_entries = [e for e in notices.entries if e.open]
        matched, rest = _match(open_entries, alerts)
        for entry in open_entries:
            alert = matched.get(entry.id)
            changed |= self._follow(notices.report_id, entry, alert, now=now, mono=mono)
        ended = [e for e in notices.entries if not e.open]
        recurred, rest = _match(ended, rest)
        for alert in rest:  # new: opened even if already over, unless from a closed window
            if alert.closed or alert.severity not in _at_least(self.min_severity):
                continue
            changed |= self._open(notices, alert, now)
        for alert in recurred.values():  # an ended incident failing again is a new one
            if not alert.ended and alert.severity in _at_least(self.min_severity):
                changed |= self._open(notices, alert, now)
        if changed:
            _trim(notices)
        return changed

    def _open(self, notices: Notices, alert: Alert, now: str) -> bool:
        entry = Entry(id=_new_id(notices, alert), report_id=notices.report_id,
                      service=alert.service, keys=list(alert.keys[:MAX_KEYS]))
        entry.changes.append(_change("opened", alert, now))
        notices.entries.append(entry)
        return True

    def _follow(self, report_id: str, entry: Entry, alert: Alert | None, *, now: str,
                mono: float) -> bool:
        key = (report_id, entry.id)
        if alert is None or alert.ended:
            since = self._ending.setdefault(key, mono)
            if mono - since < self.end_after:
                return False
            del self._ending[key]
            why = "gone" if alert is None else "window closed" if alert.closed else "resolved"
            base = alert or _as_alert(entry, entry.changes[-1])
            entry.changes.append(_change("ended", base, now, why=why))
            return True
        self._ending.pop(key, None)
        keys = list(dict.fromkeys([*entry.keys, *alert.keys]))[:MAX_KEYS]
        grown = keys != entry.keys  # kept, so a restarted member still recognises it
        entry.keys = keys
        if SEVERITY_WEIGHT[alert.severity] > SEVERITY_WEIGHT[entry.severity]:
            entry.changes.append(_change("escalated", alert, now))
            return True
        return grown


def _at_least(severity: Severity) -> set[str]:
    return {s for s, w in SEVERITY_WEIGHT.items() if w >= SEVERITY_WEIGHT[severity]}


def _match(entries: list[Entry], alerts: list[Alert]) -> tuple[dict[str, Alert], list[Alert]]:
    """Pair entries with the alerts sharing the most incident keys with them (each at
    most once); returns entry id -> alert, and the alerts left over."""
    pairs = sorted(((len(set(e.keys) & set(a.keys)), -i, -j) for i, e in enumerate(entries)
                    for j, a in enumerate(alerts)), reverse=True)
    matched: dict[str, Alert] = {}
    used: set[int] = set()
    for shared, ni, nj in pairs:
        if shared == 0:
            break
        entry, j = entries[-ni], -nj
        if entry.id in matched or j in used:
            continue
        matched[entry.id] = alerts[j]
        used.add(j)
    return matched, [a for j, a in enumerate(alerts) if j not in used]


def _new_id(notices: Notices, alert: Alert) -> str:
    base = alert.keys[0] if alert.keys else "incident"
    taken = {e.id for e in notices.entries}
    n, candidate = 1, base
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _change(kind: ChangeKind, alert: Alert, now: str, *, why: str | None = None) -> Change:
    return Change(kind=kind, severity=alert.severity, at=now, title=alert.title,
                  summary=alert.summary, origin=alert.origin, first_seen=alert.first_seen,
                  last_seen=alert.last_seen, why=why)


def _as_alert(entry: Entry, last: Change) -> Alert:
    """What an incident that is no longer in the report last said of itself."""
    return Alert(report_id=entry.report_id, keys=tuple(entry.keys), service=entry.service,
                 severity=entry.severity, title=last.title, summary=last.summary,
                 origin=last.origin, first_seen=last.first_seen, last_seen=last.last_seen,
                 ended=True)


def _trim(notices: Notices) -> None:
    """Keep the ledger bounded: drop the oldest ended incidents."""
    extra = len(notices.entries) - MAX_ENTRIES
    if extra <= 0:
        return
    done = [e for e in notices.entries if not e.open][:extra]
    drop = {id(e) for e in done}
    notices.entries = [e for e in notices.entries if id(e) not in drop]
