"""The sections of a post-mortem (``streams.report.analysis.postmortem``) in reading order.

Format-free: ``view.py`` passes a ``Markup`` that writes Markdown, plain text or HTML
and escapes log text for that context. Every list here is capped, so the page's
length follows the incident's significance, not the input's size.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from streams.report.analysis.causes import Cause
from streams.report.analysis.departures import ALL_CALLS, ALL_LINES
from streams.report.analysis.incidents import DayIncident
from streams.report.analysis.postmortem import MAX_CHAIN, Episode, PostMortem
from streams.report.state.minutes import minute_time
from streams.report.state.wording import between, clip, name_list

MAX_OTHER_EPISODES = 4
MAX_INCIDENTS = 30  # incidents listed a window: a busy day stays under 200 lines
MAX_EXTRA_CAUSES = 3  # dated causes outside episodes and undated ones, listed after them
MAX_USER_QUOTES = 3
MAX_LEAD_LINE = 80  # characters of an incident's line in the list of incidents


class Markup(Protocol):
    def text(self, value: object) -> str: ...
    def strong(self, value: object) -> str: ...
    def code(self, value: object) -> str: ...
    def para(self, *parts: str) -> list[str]: ...
    def bullets(self, items: Iterable[str], *, ordered: bool = False) -> list[str]: ...


def sections(pm: PostMortem, f: Markup) -> list[tuple[str, list[str]]]:
    """(title, lines) in the order of the Google SRE post-mortem template."""
    out = [("Summary", f.para(f.text(" ".join(pm.summary))))]
    if pm.incidents:
        out.append(("Incidents", _incidents(pm, f)))
    if pm.lead is not None:
        out += _told_by_departures(pm, pm.lead, f)
    elif pm.episodes:
        ep = pm.episodes[0]
        out += [
            ("Impact", _impact(pm, ep, f)),
            ("Trigger", _trigger(pm, ep, f)),
            ("Detection", _detection(pm, ep, f)),
            ("Root cause chain", _chain(pm, ep, f)),
            ("Mitigation and resolution", _mitigation(pm, ep, f)),
        ]
    out.append(("Timeline", f.bullets(f"{f.code(pm.when(t)) if t else 'undated'} "
                                      f"{f.text(what)}" for t, what in pm.timeline)
                if pm.timeline else f.para("Nothing significant.")))
    if pm.actions:
        out.append(("Action items", f.bullets(
            (f"{f.strong(f'{a.priority} {a.type}')}: {f.text(a.text)}" for a in pm.actions),
            ordered=True)))
    if pm.went_well or pm.went_badly:
        items = [f"Went well: {f.text(x)}" for x in pm.went_well]
        items += [f"Went badly: {f.text(x)}" for x in pm.went_badly]
        out.append(("What went well and badly", f.bullets(items)))
    others = _others(pm, f)
    if others:
        out.append(("Other incidents", others))
    if pm.chronic or pm.silent:
        out.append(("Chronic and quiet signals", _chronic(pm, f)))
    out.append(("Routine and unclassified", _folded(pm, f)))
    out.append(("Data coverage", _coverage(pm, f)))
    return out


def _incidents(pm: PostMortem, f: Markup) -> list[str]:
    """Every incident of the window, newest first, one line each (at most MAX_INCIDENTS),
    with the line that departed most where one did: "a new error" alone does not say
    which."""
    newest = sorted(pm.incidents, key=lambda i: i.started, reverse=True)
    rows = [f"{f.code(pm.when(i.started))}-{f.code(pm.when(i.ended))} "
            f"{f.strong(i.severity)} {f.text(i.title)}{_lead_line(i, f)}"
            + (f" (callers: {f.text(name_list(i.callers, 3))})" if i.callers else "")
            for i in newest[:MAX_INCIDENTS]]
    if len(newest) > MAX_INCIDENTS:
        rows.append(f"and {len(newest) - MAX_INCIDENTS} older incident(s)")
    return f.bullets(rows)


def _lead_line(incident: DayIncident, f: Markup) -> str:
    """': `template`' of the incident's strongest departure, if it is one line's."""
    if not incident.evidence or incident.evidence[0].template in (ALL_LINES, ALL_CALLS):
        return ""
    return f": {f.code(clip(incident.evidence[0].template, MAX_LEAD_LINE))}"


def _told_by_departures(pm: PostMortem, top: DayIncident, f: Markup
                        ) -> list[tuple[str, list[str]]]:
    """Impact to resolution of an incident no error tells of, from its departures."""
    services = [top.origin, *(s for s in top.services if s != top.origin)]
    impact = [
        *_services_and_duration(pm, services, top.started, top.ended, f),
        f"Departures from the baseline (a line's or a service's minute): {top.departures}",
        *_callers(top, f),
    ]
    trigger = (f.para(f"A change in {f.code(top.trigger.service)} at "
                      f"{f.text(pm.when(top.trigger.time))}: {f.code(top.trigger.text)}, "
                      f"{f.text(between(top.trigger.time, top.started))} before it began.")
               if top.trigger is not None else
               f.para("No deploy, config change or restart before it in the logs."))
    lead = top.evidence[0]
    detection = f.para(f"No alert in the logs; it began at {f.text(pm.when(top.started))}, "
                       f"its strongest sign {f.text(lead.describe())} in "
                       f"{f.code(lead.service)} at "
                       f"{f.text(pm.when(minute_time(lead.minute)))}.")
    chain = [f"{f.code(pm.when(minute_time(d.minute)))} {f.code(d.service)}: "
             + ("" if d.template in (ALL_LINES, ALL_CALLS) else f"{f.strong(d.template)}: ")
             + f.text(d.describe())
             for d in sorted(top.evidence, key=lambda d: (d.minute, d.service))[:MAX_CHAIN]]
    return [("Impact", f.bullets(impact)), ("Trigger", trigger), ("Detection", detection),
            ("Root cause chain", f.bullets(chain, ordered=True)),
            ("Mitigation and resolution", f.bullets([f"Resolution: {f.text(pm.status)}"]))]


def _services_and_duration(pm: PostMortem, services: list[str], first: str | None,
                           last: str | None, f: Markup) -> list[str]:
    return ["Services: " + ", ".join(f.code(s) for s in services[:8])
            + (f" and {len(services) - 8} more" if len(services) > 8 else ""),
            f"Duration: {f.text(between(first, last))} "
            f"({f.text(pm.when(first))} to {f.text(pm.when(last))})"]


def _callers(incident: DayIncident | None, f: Markup) -> list[str]:
    """Those that failed calling it, and those that only went quiet."""
    if incident is None or not incident.callers:
        return []
    return [f"Callers: {f.text(incident.suffered('failed calling it'))}"]


def _impact(pm: PostMortem, ep: Episode, f: Markup) -> list[str]:
    items = [
        *_services_and_duration(pm, ep.services, ep.first_seen, ep.last_seen, f),
        f"Records of this incident: {ep.records:,} in {len(ep.causes)} cause(s)",
        *_callers(ep.incident, f),
    ]
    by_service: dict[str, list[Cause]] = {}
    for cause in ep.causes:
        for svc in cause.services:
            by_service.setdefault(svc, []).append(cause)
    ranked = sorted(by_service.items(), key=lambda kv: (-sum(c.count for c in kv[1]), kv[0]))
    for svc, causes in ranked[:5]:
        first = min((c.first_seen for c in causes if c.first_seen), default=None)
        last = max((c.last_seen for c in causes if c.last_seen), default=None)
        titles = ", ".join(dict.fromkeys(c.title for c in causes))
        items.append(f"Errors in {f.code(svc)} from {f.text(pm.when(first))} to "
                     f"{f.text(pm.when(last))}: {f.text(titles)}")
    for users in pm.users[:1]:
        quotes = [x for ev in users.evidence for x in ev.examples][:MAX_USER_QUOTES]
        items.append(f"Users: {users.count:,} report(s), e.g. "
                     + "; ".join(f.code(q) for q in quotes))
    return f.bullets(items)


def _trigger(pm: PostMortem, ep: Episode, f: Markup) -> list[str]:
    if ep.trigger is None:
        return f.para("No deploy, config change or restart before the first failure in the logs.")
    t = ep.trigger
    return f.para(f"{f.strong(t.title)} at {f.text(pm.when(t.time))} in "
                  f"{', '.join(f.code(s) for s in t.services)}: {f.code(t.detail)}, "
                  f"{f.text(between(t.time, ep.first_seen))} before the first anomaly.")


def _detection(pm: PostMortem, ep: Episode, f: Markup) -> list[str]:
    first = ep.causes[0]
    if ep.detection is None:
        return f.para(f"No alert in the logs; the first sign was {f.strong(first.title)} at "
                      f"{f.text(pm.when(first.first_seen))}.")
    d = ep.detection
    return f.para(f"{f.strong(d.title)} at {f.text(pm.when(d.time))} ({f.code(d.detail)}), "
                  f"{f.text(between(first.first_seen, d.time))} after the first anomaly.")


def _chain(pm: PostMortem, ep: Episode, f: Markup) -> list[str]:
    items = []
    for n, c in enumerate(ep.causes[:MAX_CHAIN]):
        head = (f"{f.code(pm.when(c.first_seen))} {f.strong(c.title)} ({c.severity}, "
                f"{_records(c.count)}, {', '.join(f.code(s) for s in c.services[:3])})")
        why = (c.anomaly or c.cause).rstrip(".")  # the model's roll-up is in the HTML details
        line = f"{'' if n == 0 else 'then '}{head}: {f.text(why)}"
        if c.subjects:
            line += f"; names {', '.join(f.code(s) for s in c.subjects[:3])}"
        if c.entities:
            line += ("; top entities: " if c.entities_counted
                     else "; top entities in evidence: ") + ", ".join(
                f"{f.code(e)} x{k}" for e, k in c.entities)
        example = next((x for ev in c.evidence for x in ev.examples), None)
        if example:
            line += f"; e.g. {f.code(example)}"
        items.append(line)
    hidden = len(ep.causes) - MAX_CHAIN
    if hidden > 0:
        items.append(f"and {hidden} more cause(s) in this incident (HTML view, JSON)")
    return f.bullets(items, ordered=True)


def _mitigation(pm: PostMortem, ep: Episode, f: Markup) -> list[str]:
    items = [f"{f.code(pm.when(m.time))} {f.strong(m.title)}: {f.code(m.detail)}"
             for m in ep.mitigations[:4]]
    items.append(f"Resolution: {f.text(pm.status)}")
    return f.bullets(items)


def _others(pm: PostMortem, f: Markup) -> list[str]:
    items = []
    told = 0 if pm.lead is not None else 1  # the first episode is the story, unless the lead is
    for ep in pm.episodes[told:told + MAX_OTHER_EPISODES]:
        top = ep.top
        # an episode cut to an incident is headed by it, as the list of incidents names it
        head = "" if ep.incident is None else \
            f"{f.strong(ep.incident.title)} ({ep.incident.severity}): "
        items.append(
            f"{f.code(pm.when(ep.first_seen))}-{f.code(pm.when(ep.last_seen))} {head}"
            f"{f.strong(top.title) if not head else f.text(top.title)} "
            f"({top.severity}, {_records(ep.records)}) in "
            f"{f.text(name_list(ep.services, 3))}"
            + (f"; began with {f.text(ep.causes[0].title)}" if ep.causes[0] is not top else "")
            + (f"; mitigation: {f.text(ep.mitigations[0].title)} at "
               f"{f.text(pm.when(ep.mitigations[0].time))}" if ep.mitigations else ""))
    hidden = len(pm.episodes) - told - MAX_OTHER_EPISODES
    if hidden > 0:
        items.append(f"and {hidden} more incident(s) (HTML view, JSON)")
    if not pm.episodes:
        for users in pm.users[:1]:
            quotes = [x for ev in users.evidence for x in ev.examples][:MAX_USER_QUOTES]
            items.append(f"{f.strong(users.title)} ({_records(users.count)}): "
                         + "; ".join(f.code(q) for q in quotes))
    in_episodes = {k for ep in pm.episodes for c in ep.causes for k in c.keys}
    loose = [c for c in pm.causes if c.keys[0] not in in_episodes and c.severity != "low"]
    for c in loose[:MAX_EXTRA_CAUSES]:
        when = f.code(pm.when(c.first_seen)) if c.first_seen else "undated"
        items.append(f"{when} {f.strong(c.title)} ({c.severity}, {_records(c.count)}) in "
                     f"{f.text(name_list(c.services, 3))}")
    return f.bullets(items) if items else []


def _chronic(pm: PostMortem, f: Markup) -> list[str]:
    """Steady errors and services gone silent: context below the incident, not its cause."""
    items = [f"{f.strong(c.title)} ({_records(c.count)}) in {f.text(name_list(c.services, 3))}: "
             f"{f.text(c.anomaly or 'steady')}" for c in pm.chronic[:MAX_EXTRA_CAUSES]]
    if len(pm.chronic) > MAX_EXTRA_CAUSES:
        rest = pm.chronic[MAX_EXTRA_CAUSES:]
        items.append(f"and {len(rest)} more chronic cause(s) "
                     f"({sum(c.count for c in rest):,} records)")
    items += [f"{f.code(service)} went silent at {f.text(pm.when(since))}: no record since, "
              f"where its own earlier rate makes that silence unlikely"
              for service, since in pm.silent[:MAX_EXTRA_CAUSES]]
    return f.bullets(items)


def _folded(pm: PostMortem, f: Markup) -> list[str]:
    top = ", ".join(f"{f.code(_short(t))} x{n:,}" for t, n in pm.routine_templates)
    templates, records = pm.folded_unclassified
    low = [c for c in pm.causes if c.severity == "low"
           and not any(c in ep.causes for ep in pm.episodes)]
    items = [f"Routine activity: {pm.routine_records:,} records in {pm.routine_services} "
             f"service(s), no action needed" + (f" (most: {top})" if top else ""),
             f"Unclassified but steady (no new template, no rate jump): {templates} "
             f"template(s), {records:,} records"]
    if low:
        items.append(f"Low-severity signals outside incidents: {len(low)} "
                     f"({sum(c.count for c in low):,} records)")
    if pm.changes:
        kinds = ", ".join(sorted({c.title for c in pm.changes}))
        items.append(f"Change events seen: {len(pm.changes)} ({f.text(kinds)})")
    return f.bullets(items)


def _coverage(pm: PostMortem, f: Markup) -> list[str]:
    items = [f"Records analysed: {pm.records:,}"]
    items.append("Dead letters (unreadable records): "
                 + (f"{pm.deadletters:,}" if pm.deadletters is not None else "not known here")
                 + (f" ({f.code('retro deadletter')} lists them)" if pm.deadletters else ""))
    items.append("Parked in review, not analysed above: "
                 + (f"{pm.review:,}" if pm.review is not None else "not known here")
                 + (f" ({f.code('retro review')} lists them and re-drives them)"
                    if pm.review else ""))
    return f.bullets(items)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _records(n: int) -> str:
    return f"{n:,} record" + ("" if n == 1 else "s")
