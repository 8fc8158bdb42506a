"""Render a report as a post-mortem: Markdown, plain text for terminals, JSON, and HTML.

Markdown and text show the post-mortem (``streams.report.analysis.postmortem``), bounded by
significance; the HTML page shows it too and keeps every incident, template and
coverage range of the report behind expanders.

Log text is hostile input: every value from a report is escaped for its context
(Markdown, HTML text, inline JS). The HTML page is self-contained (the machines
are offline) and, given a JSON URL, reloads itself when the report's version
changes; a Content-Security-Policy pins the only scripts and styles it may run.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from streams.intervals import Coverage, IntervalSet, split_message_key
from streams.report.analysis.postmortem import PostMortem, derive, leading
from streams.report.state.merge import normalize_text
from streams.report.state.model import SEVERITY_WEIGHT, Incident, Report
from streams.report.views.postmortem_view import sections as postmortem_sections

MAX_RANGES_SHOWN = 10  # per partition in "data coverage"
MAX_FULL_REPORTS = 3  # of several windows, this many post-mortems in full; the rest one line
LOW_EVIDENCE = 2  # incidents with at most this many records are worth a second look
POLL_MS = 2000
_UNCLASSIFIED = {"", "unknown", "unclassified", "undetermined", "n/a", "na", "none", "other"}
SECTIONS = (  # the detail sections: all of the report, in the HTML view's expanders
    "Summary",
    "Impact",
    "Timeline",
    "Causes",
    "Suggested actions",
    "Open questions",
    "Data coverage",
    "What changed",
)
POSTMORTEM_SECTIONS = (  # in this order when present; Summary, Timeline, the last two always
    "Summary",
    "Incidents",
    "Impact",
    "Trigger",
    "Detection",
    "Root cause chain",
    "Mitigation and resolution",
    "Timeline",
    "Action items",
    "What went well and badly",
    "Other incidents",
    "Chronic and quiet signals",
    "Routine and unclassified",
    "Data coverage",
)


def render_json(report: Report) -> str:
    """The report as JSON with its post-mortem's title, summary and incidents
    (``postmortem``, derived on read); controls JSON would pass raw (DEL, C1 such as the 8-bit CSI
    0x9b) are written as \\u escapes, so the text is the same and a terminal is safe."""
    pm = derive(report)
    doc = report.model_dump(mode="json")
    doc["postmortem"] = {"title": pm.title, "summary": pm.summary,
                         "incidents": [i.as_json() for i in pm.incidents],
                         "chronic": [{"service": s, "template": t}
                                     for s, t in pm.chronic_lines]}
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    return _C1.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def render_markdown(
    report: Report, *, review_count: int | None = None, deadletter_count: int | None = None,
    parked_count: int | None = None,
) -> str:
    """The post-mortem in Markdown: one screen of summary, bounded by significance.

    ``parked_count``: records the pipeline holds in review (covered by no report), named
    beside this report's analysed records in the data coverage section.
    """
    pm = derive(report, deadletters=deadletter_count, review=_parked(review_count, parked_count))
    return _render_postmortem(report, pm, Markup(True))


def render_text(
    report: Report, *, review_count: int | None = None, deadletter_count: int | None = None,
    parked_count: int | None = None,
) -> str:
    """The same post-mortem for a terminal: no Markdown escapes (``\\<NUM\\>``) to read past."""
    pm = derive(report, deadletters=deadletter_count, review=_parked(review_count, parked_count))
    return _render_postmortem(report, pm, Markup(True, plain=True))


@dataclass(frozen=True, slots=True)
class Ranked:
    """A report and its post-mortem, as several windows are weighed against each other."""

    report: Report
    pm: PostMortem

    @property
    def significant(self) -> bool:
        """It holds an incident: the post-mortem found an episode of medium or worse, or
        tells an incident that no error tells of (a slowed service)."""
        return bool(self.pm.episodes) or self.pm.lead is not None

    @property
    def severity(self) -> int:
        """The severity weight of what its title names: the incident that leads (medium
        or worse), else its main episode's worst cause; 0 when it holds neither."""
        lead = leading(self.pm.incidents)
        if lead is not None:
            return SEVERITY_WEIGHT[lead.severity]
        return SEVERITY_WEIGHT.get(self.pm.episodes[0].top.severity, 0) \
            if self.pm.episodes else 0

    @property
    def weight(self) -> int:
        """Its main episode's severity weight x records, the post-mortem's own measure."""
        return self.pm.episodes[0].weight if self.pm.episodes else 0


def rank_reports(
    reports: Iterable[Report], *, review_count: int | None = None,
    deadletter_count: int | None = None, parked_count: int | None = None,
) -> list[Ranked]:
    """Post-mortems of several windows, most significant first, since a reader starts at
    the top: a window with an incident before one without, the more severe title first
    (a slowed service that no error tells of may lead), then the heavier main episode;
    when nothing tells them apart, dated before undated and the latest window first."""
    review = _parked(review_count, parked_count)
    ranked = [Ranked(r, derive(r, deadletters=deadletter_count, review=review))
              for r in reports]
    ranked.sort(key=lambda x: x.report.id, reverse=True)
    ranked.sort(key=lambda x: (not x.significant, -x.severity, -x.weight,
                               x.report.id.startswith("undated")))
    return ranked


def top_incident(report: Report, pm: PostMortem | None = None) -> str:
    """A report's top incident, one definition for every view: its post-mortem's title,
    the page's heading (the most significant episode, led by its suspected origin), not
    the incident with the most records. ``pm``: the report's post-mortem, if derived."""
    return (pm if pm is not None else derive(report)).title


def one_line(item: Ranked) -> str:
    """A window in one line: ``2026-01-29/all: no incident (1,234 records)``."""
    report, pm = item.report, item.pm
    if not item.significant:
        return f"{report.id}: no incident ({pm.records:,} records)"
    if pm.lead is not None:
        return f"{report.id}: {top_incident(report, pm)} ({pm.lead.severity}; {pm.status})"
    ep = pm.episodes[0]
    return (f"{report.id}: {top_incident(report, pm)} ({ep.top.severity}, {ep.records:,} "
            f"records; {pm.status})")


def render_reports(
    reports: Iterable[Report], *, plain: bool = False, review_count: int | None = None,
    deadletter_count: int | None = None, parked_count: int | None = None,
) -> str:
    """Several windows for a reader: the most significant post-mortems in full, every other
    window in one line, so a quiet day costs a line and the worst one is read first. A
    single window is shown in full, incident or not: the reader asked for it."""
    ranked = rank_reports(reports, review_count=review_count,
                          deadletter_count=deadletter_count, parked_count=parked_count)
    f = Markup(True, plain=plain)
    if len(ranked) == 1:
        return _render_postmortem(ranked[0].report, ranked[0].pm, f)
    full = [x for x in ranked if x.significant][:MAX_FULL_REPORTS]
    rest = ranked[len(full):]
    out = [_render_postmortem(x.report, x.pm, f) for x in full]
    if rest:
        title = "Other windows" if full else f"No incident in {len(rest)} windows"
        out.append("\n".join([f"# {title}", "", *(f"- {f.text(one_line(x))}" for x in rest)])
                   + "\n")
    return "\n".join(out)


def _parked(review_count: int | None, parked_count: int | None) -> int | None:
    """Records in review that no report covers, when known; else the review count."""
    return parked_count if parked_count is not None else review_count


def _render_postmortem(report: Report, pm: PostMortem, f: Markup) -> str:
    out = [f"# Post-mortem: {f.text(top_incident(report, pm))}", "",
           f"{f.text(_status_line(report, pm))}", ""]
    for title, lines in postmortem_sections(pm, f):
        while lines and not lines[-1]:
            lines.pop()
        out += [f"## {title}", "", *lines, ""]
    return "\n".join(out).rstrip() + "\n"


def _status_line(report: Report, pm: PostMortem) -> str:
    """The header under the title, the one place a view names the report's revision: the
    post-mortem is a draft written from the logs for a person to confirm, at any version."""
    return (f"Report {report.id}, status: {pm.status}; {_version_line(report)}; a draft "
            "written from the logs. Details: the HTML view and the JSON.")


def render_html(
    report: Report,
    *,
    refresh_url: str | None = None,
    review_count: int | None = None,
    deadletter_count: int | None = None,
    parked_count: int | None = None,
) -> str:
    """A self-contained page; with ``refresh_url`` it polls that JSON every 2 s."""
    pm = derive(report, deadletters=deadletter_count, review=_parked(review_count, parked_count))
    body = [
        f"<h1>Post-mortem: {_h(top_incident(report, pm))}</h1>",
        f'<p class="meta" id="report-version" data-version="{report.version}">'
        f"{_h(_status_line(report, pm))}</p>",
    ]
    for title, lines in postmortem_sections(pm, Markup(False)):
        slug = "pm-" + re.sub(r"\W+", "-", title.lower())
        body.append(f'<section id="{slug}"><h2>{_h(title)}</h2>{"".join(lines)}</section>')
    body.append("<h2>Details</h2>")
    for title, lines in _sections(report, review_count, deadletter_count, md=False,
                                  parked=parked_count):
        slug = re.sub(r"\W+", "-", title.lower())
        body.append(f'<details id="{slug}"><summary>{_h(title)}</summary>'
                    f'{"".join(lines)}</details>')
    script = _refresh_script(refresh_url, report.version) if refresh_url else None
    if script:
        body.append('<p class="meta">Live: checking for a new version every 2 s.</p>')
    return _page(f"Post-mortem {report.id}", "\n".join(body), script, refresh_url)


def render_index_html(reports: list[dict[str, Any]]) -> str:
    """A list of reports; each dict is a report's JSON or a summary with an optional url.
    A summary's ``top_incident`` is ``top_incident(report)``; a report's is derived here."""
    rows = []
    for item in sorted(reports, key=lambda r: str(r.get("id", "")), reverse=True):
        rid = str(item.get("id", "?"))
        url = item.get("url") or item.get("href")
        name = f'<a href="{_h(url)}">{_h(rid)}</a>' if _safe_url(url) else _h(rid)
        incidents = item.get("incidents", item.get("incident_count", 0))
        count = len(incidents) if isinstance(incidents, list) else incidents
        top = item.get("top_incident")
        if top is None and isinstance(incidents, list):
            top = _top_of_json(item)
        cells = [
            name,
            _h(item.get("version", "")),
            _h(item.get("updated_at") or ""),
            _h(item.get("record_count", "")),
            _h(count),
            _h(top or ""),
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>"
        for h in ("Report", "Version", "Updated", "Records", "Incidents", "Top incident")
    )
    table = (
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else "<p>No reports yet.</p>"
    )
    return _page("Retro reports", f"<h1>Retro reports</h1>{table}", None, None)


# ---------------------------------------------------------------- sections


def _sections(
    report: Report, review: int | None, dead: int | None, *, md: bool,
    parked: int | None = None,
) -> list[tuple[str, list[str]]]:
    fmt = Markup(md)
    return [
        ("Summary", _summary(report, fmt)),
        ("Impact", _impact(report, fmt)),
        ("Timeline", _timeline(report, fmt)),
        ("Causes", _causes(report, fmt)),
        ("Suggested actions", _actions(report, fmt)),
        ("Open questions", _questions(report, fmt, review, dead)),
        ("Data coverage", _coverage(report, fmt, parked)),
        (_changed_title(report), _changes(report, fmt)),
    ]


class Markup:
    """The few constructs the sections need, in Markdown or HTML."""

    def __init__(self, md: bool, *, plain: bool = False) -> None:
        self.md = md
        self.plain = plain  # Markdown's layout without its escapes and emphasis: a terminal

    def text(self, value: object) -> str:
        if self.plain:
            return _one_line(str(value))
        return _md(str(value)) if self.md else _h(value)

    def strong(self, value: object) -> str:
        if self.plain:
            return _one_line(str(value))
        return f"**{_md(str(value))}**" if self.md else f"<strong>{_h(value)}</strong>"

    def code(self, value: object) -> str:
        if self.plain:
            return _one_line(str(value))
        return _code_span(str(value)) if self.md else f"<code>{_h(value)}</code>"

    def para(self, *parts: str) -> list[str]:
        return ["".join(parts), ""] if self.md else [f"<p>{''.join(parts)}</p>"]

    def bullets(self, items: Iterable[str], *, ordered: bool = False) -> list[str]:
        items = list(items)
        if self.md:
            return [*(f"{n}. {i}" if ordered else f"- {i}" for n, i in enumerate(items, 1)), ""]
        tag = "ol" if ordered else "ul"
        return [f"<{tag}>" + "".join(f"<li>{i}</li>" for i in items) + f"</{tag}>"]

    def heading(self, value: str) -> list[str]:
        return [f"### {value}", ""] if self.md else [f"<h3>{value}</h3>"]

    def block(self, value: str) -> list[str]:
        if self.md:
            value = _printable(value)
            fence = "`" * max(3, _longest_run(value, "`") + 1)
            return [fence, value, fence, ""]
        return [f"<pre><code>{_h(value)}</code></pre>"]


def _summary(report: Report, f: Markup) -> list[str]:
    if not report.incidents:
        return f.para("No records have been analysed for this window yet.")
    span = _span(report.first_seen, report.last_seen)
    span = f" {f.text(span.strip())}" if span else ""
    n = len(report.incidents)
    services = ", ".join(f.code(s) for s in report.services) or "no named service"
    lead = (
        f"{_num(report.record_count)} log records{span} were grouped into "
        f"{n} incident{'s' if n != 1 else ''} across {services}. "
    )
    top = report.incidents[:3]
    if not any(i.summary for i in top):
        brief = [
            f"{f.strong(i.event)} ({f.text(i.cause)}; {_num(i.count)} records, {i.severity})"
            for i in top
        ]
        return f.para(lead, "Most significant: ", "; ".join(brief), ".")
    # Model-written summaries (streams/report/analysis/rollup.py) say more than the cause text: one
    # bullet per incident, the summary where there is one, else the cause.
    items = [
        f"{f.strong(i.event)} ({_num(i.count)} records, {i.severity}): "
        f"{f.text(i.summary)}{_stale(i)}"
        if i.summary
        else f"{f.strong(i.event)} ({f.text(i.cause)}; {_num(i.count)} records, {i.severity})"
        for i in top
    ]
    return [*f.para(lead, "Most significant:"), *f.bullets(items)]


def _impact(report: Report, f: Markup) -> list[str]:
    """Services by their worst incident; records are counted per incident, not per
    service (an incident may span services), so no per-service record count is shown."""
    if not report.incidents:
        return f.para("None recorded.")
    rows = []
    for svc in report.services:
        linked = [i for i in report.incidents if svc in i.services]
        worst = max(linked, key=lambda i: SEVERITY_WEIGHT[i.severity])
        events = ", ".join(dict.fromkeys(i.event for i in linked if i.severity != "info"))
        rows.append((SEVERITY_WEIGHT[worst.severity], svc, worst.severity, len(linked), events))
    rows.sort(key=lambda r: (-r[0], r[1]))
    per_service = [
        f"{f.code(svc)}: worst {f.strong(sev)}, {n} incident(s)" + (f": {f.text(ev)}" if ev else "")
        for _, svc, sev, n, ev in rows
    ]
    per_severity = []
    for sev in sorted(SEVERITY_WEIGHT, key=SEVERITY_WEIGHT.__getitem__, reverse=True):
        linked = [i for i in report.incidents if i.severity == sev]
        if linked:
            per_severity.append(
                f"{f.strong(sev)}: {len(linked)} incident(s), {_num(_records(linked))} records"
            )
    return [
        *f.para("Services affected:"),
        *f.bullets(per_service),
        *f.para("Records by severity:"),
        *f.bullets(per_severity),
    ]


def _timeline(report: Report, f: Markup) -> list[str]:
    if not report.timeline:
        return f.para("Nothing yet.")
    items = []
    for e in report.timeline:
        when = f.code(e.time) if e.time else "undated"
        what = "first seen" if e.kind == "first_seen" else "last seen"
        services = ", ".join(f.code(s) for s in e.services)
        items.append(f"{when}: {what}: {f.strong(e.event)} ({e.severity}; {services})")
    return f.bullets(items)


def _causes(report: Report, f: Markup) -> list[str]:
    if not report.incidents:
        return f.para("No incidents.")
    out: list[str] = []
    for n, inc in enumerate(report.incidents, 1):
        out += f.heading(f"{n}. {f.text(inc.event)} ({inc.severity})")
        if inc.summary:
            out += f.para(f"Summary: {f.text(inc.summary)}{_stale(inc)}")
        facts = [
            f"Cause: {f.text(inc.cause)}",
            f"Records: {_num(inc.count)}",
            f"Seen: {f.text(_span(inc.first_seen, inc.last_seen).strip() or 'undated')}",
            "Services: " + ", ".join(f.code(s) for s in inc.services),
        ]
        out += f.bullets(facts)
        for ev in inc.evidence:
            out += f.para(f"Template {f.code(ev.template)} ({_num(ev.count)} records):")
            for example in ev.examples:
                out += f.block(example)
    return out


def _actions(report: Report, f: Markup) -> list[str]:
    if not report.suggestions:
        return f.para("None suggested yet.")
    items = [
        f"{f.strong(s.text)} ({s.severity}; {_num(s.records)} records in "
        f"{len(s.incidents)} incident(s))"
        for s in report.suggestions
    ]
    return f.bullets(items, ordered=True)


def _questions(report: Report, f: Markup, review: int | None, dead: int | None) -> list[str]:
    items = []
    for inc in report.incidents:
        if normalize_text(inc.cause) in _UNCLASSIFIED or "unknown" in normalize_text(inc.cause):
            items.append(f"What causes {f.strong(inc.event)}? The analysis left it unclassified.")
        elif inc.count <= LOW_EVIDENCE and inc.severity != "info":
            items.append(f"Is {f.strong(inc.event)} real? Only {inc.count} record(s) support it.")
        if inc.first_seen is None:
            items.append(f"When did {f.strong(inc.event)} happen? Its records carry no time.")
    if review:
        items.append(f"{_num(review)} batch(es) went to human review and are not counted here.")
    if dead:
        items.append(f"{_num(dead)} record(s) could not be read (dead letters; "
                     f"{f.code('retro deadletter')} lists them and why).")
    return f.bullets(items) if items else f.para("None so far.")


def _coverage(report: Report, f: Markup, parked: int | None = None) -> list[str]:
    parts = Coverage.from_json(report.covered).parts()
    batches: dict[str, tuple[IntervalSet, int]] = {}  # messages of many records, by partition
    for name in [n for n in parts if split_message_key(n)]:
        part, offset, _ = split_message_key(name)  # type: ignore[misc]
        offsets, records = batches.get(part, (IntervalSet(), 0))
        batches[part] = (offsets.union(IntervalSet([(offset, offset)])),
                         records + len(parts.pop(name)))
    items = []
    for name in sorted(set(parts) | set(batches)):
        said = []
        if name in parts:
            ranges = parts[name].ranges
            shown = ", ".join(str(a) if a == b else f"{a}-{b}"
                              for a, b in ranges[:MAX_RANGES_SHOWN])
            hidden = len(ranges) - MAX_RANGES_SHOWN
            more = f" and {hidden} more ranges" if hidden > 0 else ""
            said.append(f"offsets {shown}{more} ({_num(len(parts[name]))} records)")
        if name in batches:
            offsets, records = batches[name]
            said.append(f"{_num(records)} records from {_num(len(offsets))} message(s) "
                        "carrying many")
        items.append(f"{f.code(name)}: {'; '.join(said)}")
    models = ", ".join(f.code(m) for m in report.models) or "none"
    total = (
        f"Total: {_num(report.record_count)} records in {len(items)} partition(s), "
        f"from {_num(report.fragments_applied)} fragment(s); analysed by {models}."
    )
    if parked is not None:
        total = (f"Analysed: {_num(report.record_count)} records in this report. Parked: "
                 f"{_num(parked)} record(s) of the pipeline wait in review, counted in no "
                 f"report ({f.code('retro review')} lists them and why). {total}")
    return [*f.bullets(items), *f.para(total)] if items else f.para(total)


def _changed_title(report: Report) -> str:
    ch = report.changes
    return f"What changed since version {ch.from_version}" if ch.from_version else "What changed"


def _changes(report: Report, f: Markup) -> list[str]:
    ch = report.changes
    if report.version < 1:
        return f.para("Nothing yet: no version of the report has been written.")
    if report.version == 1:
        return f.para("This is the first version of the report.")
    items = [f"New: {f.strong(_event(report, c.key))} ({_num(c.after)} records)"
             for c in ch.new_incidents]
    items += [
        f"Growing: {f.strong(_event(report, c.key))}: {_num(c.before)} -> {_num(c.after)} records"
        for c in ch.growing
    ]
    items.append(f"Records: {_num(ch.records_before)} -> {_num(ch.records_after)}")
    return f.bullets(items)


# ---------------------------------------------------------------- helpers


def _event(report: Report, key: str) -> str:
    """A changed incident's event: changes name incidents by key only."""
    inc = report.incident(key)
    return inc.event if inc is not None else key


def _top_of_json(item: dict[str, Any]) -> str | None:
    """The top incident of a report given as its JSON (None if it is not one)."""
    try:
        report = Report.model_validate(item)
    except ValueError:
        return None
    return top_incident(report)


def _version_line(report: Report) -> str:
    """``first version`` only at version 1: a report at version 41 is not a first one."""
    which = ("no version yet" if report.version < 1 else "first version" if report.version == 1
             else f"version {report.version}")
    return f"{which}, updated at {report.updated_at or 'never'}"


def _stale(inc: Incident) -> str:
    """A note when records arrived after the summary was written (the next roll-up fixes it)."""
    if inc.summary_count >= inc.count:
        return ""
    return f" (written at {_num(inc.summary_count)} records)"


def _records(incidents: list[Incident]) -> int:
    return sum(inc.count for inc in incidents)  # a record belongs to one incident


def _span(first: str | None, last: str | None) -> str:
    if first is None:
        return ""
    return f" from {first}" if first == last or last is None else f" from {first} to {last}"


def _num(value: int) -> str:
    return f"{value:,}"


# C0/C1 controls (ESC starts terminal sequences such as ESC[10A) other than tab and
# newline: log lines must not move a reader's cursor or recolour their terminal
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    return _CONTROL.sub("\ufffd", text)


printable = _printable  # for the other terminal renderers (retro deadletter)
_C1 = re.compile(r"[\x7f-\x9f]")  # controls that json.dumps leaves unescaped


def _h(value: object) -> str:
    return html.escape(_printable(str(value)), quote=True)


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|])")


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", _printable(text)).strip()


def _md(text: str) -> str:
    """Inline Markdown text: one line, punctuation that could become markup escaped."""
    return _MD_SPECIAL.sub(r"\\\1", re.sub(r"\s+", " ", _printable(text)).strip())


def _code_span(text: str) -> str:
    text = re.sub(r"\s+", " ", _printable(text)).strip()
    ticks = "`" * (_longest_run(text, "`") + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _longest_run(text: str, char: str) -> int:
    return max((len(m) for m in re.findall(f"{re.escape(char)}+", text)), default=0)


def _safe_url(url: object) -> bool:
    if not isinstance(url, str) or not url:
        return False
    scheme = urlsplit(url).scheme.lower()
    return scheme in ("", "http", "https")


def _refresh_script(url: str, version: int) -> str:
    target = json.dumps(url).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return (
        "(function () {\n"
        f"  var url = {target};\n"
        f"  var current = {int(version)};\n"
        "  function poll() {\n"
        '    fetch(url, {cache: "no-store"})\n'
        "      .then(function (r) { return r.ok ? r.json() : null; })\n"
        "      .then(function (data) {\n"
        "        if (!data) { return; }\n"
        "        var v = data.version !== undefined ? data.version : (data.report || {}).version;\n"
        "        if (v !== undefined && v !== current) { window.location.reload(); }\n"
        "      })\n"
        "      .catch(function () {})\n"
        f"      .finally(function () {{ setTimeout(poll, {POLL_MS}); }});\n"
        "  }\n"
        f"  setTimeout(poll, {POLL_MS});\n"
        "})();\n"
    )


_STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 62rem; margin: 2rem auto;
       padding: 0 1rem; color: #1d1d1f; background: #fff; }
h1 { font-size: 1.6rem; } h2 { border-bottom: 1px solid #ddd; margin-top: 2rem; }
.meta { color: #555; font-size: 0.9rem; }
code, pre { font: 13px/1.4 ui-monospace, monospace; background: #f4f4f6; }
details { margin: 0.4rem 0; } summary { cursor: pointer; font-weight: 600; }
pre { padding: 0.6rem; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
table { border-collapse: collapse; width: 100%; }
td, th { border-bottom: 1px solid #ddd; padding: 0.3rem 0.6rem; text-align: left; }
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _page(title: str, body: str, script: str | None, refresh_url: str | None) -> str:
    connect = "'self'"
    if refresh_url:
        parts = urlsplit(refresh_url)
        if parts.scheme in ("http", "https") and parts.netloc:
            connect += f" {parts.scheme}://{parts.netloc}"
    scripts = _csp_hash(script) if script else "'none'"
    csp = (
        f"default-src 'none'; style-src {_csp_hash(_STYLE)}; "
        f"script-src {scripts}; connect-src {connect}"
    )
    tail = f"<script>{script}</script>" if script else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_h(csp)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_h(title)}</title><style>{_STYLE}</style></head>\n"
        f"<body>\n{body}\n{tail}</body></html>\n"
    )
