"""Report rendering: post-mortem Markdown, JSON, and an XSS-safe self-refreshing page."""

from __future__ import annotations

import base64
import hashlib
import html
import re

import pytest

from streams.records import Evidence, Fragment, TimeWindow
from streams.report.state.merge import merge
from streams.report.state.model import Report
from streams.report.views.view import (
    POSTMORTEM_SECTIONS,
    SECTIONS,
    render_html,
    render_index_html,
    render_json,
    render_markdown,
    top_incident,
)

from helpers import make_fragment, pool_and_disk_report, shared_file

XSS = "<script>alert('x')</script>"


def _frag(fid: str, covered: dict, **kw) -> Fragment:
    return make_fragment(fid, covered, **({"event": "Disk full on datanode",
                                          "cause": "No space left on /data",
                                          "model": "retro-rules-v1"} | kw))


def _report() -> Report:
    """Three versions: a disk incident, its growth, then a hostile low-evidence one."""
    report, _ = merge(None, _frag("a", {"raw/0": [[0, 9]]}), report_id="2026-11-29/all", now="t1")
    report, _ = merge(report, _frag("b", {"raw/0": [[5, 14]]}), report_id="2026-11-29/all")
    hostile = _frag(
        "c",
        {"raw/1": [[3, 3], [7, 7]]},
        event=f"Injected {XSS}",
        cause="unknown",
        service=f"svc{XSS}",
        suggestion=f"Do {XSS}",
        severity="critical",
        timestamp="2026-11-29T09:00:00Z",
        window=TimeWindow(start="2026-11-29T09:00:00Z", end="2026-11-29T09:00:00Z"),
        evidence=[Evidence(template=f"tpl {XSS}", count=2, examples=[f"log {XSS} ```x```"])],
    )
    report, _ = merge(report, hostile, report_id="2026-11-29/all", now="2026-11-29T12:00:00Z")
    return report


def test_markdown_reads_like_a_post_mortem_in_order() -> None:
    report = _report()
    md = render_markdown(report, review_count=3, deadletter_count=2)
    assert md.startswith("# Post-mortem: ")
    assert "Report 2026-11-29/all" in md and "version 3, updated at" in md
    assert "first version" not in md  # version 3 is not a first version
    headings = re.findall(r"^## (.+)$", md, flags=re.M)
    assert headings == [h for h in POSTMORTEM_SECTIONS if h in headings]
    assert {"Summary", "Impact", "Root cause chain", "Action items"} <= set(headings)
    section = dict(zip(headings, re.split(r"^## .+$", md, flags=re.M)[1:], strict=True))
    assert "Disk full on datanode" in section["Summary"]
    coverage = section["Data coverage"]
    assert "Records analysed: 17" in coverage
    assert "Dead letters (unreadable records): 2" in coverage
    assert "Parked in review, not analysed above: 3" in coverage
    # Log text cannot become markup
    assert "\\<script\\>" in md


def test_the_html_view_keeps_every_detail_behind_expanders() -> None:
    page = render_html(_report(), review_count=3, deadletter_count=2)
    assert "<code>raw/0</code>: offsets 0-14 (15 records)" in page
    assert "<code>raw/1</code>: offsets 3, 7 (2 records)" in page
    assert "Total: 17 records in 2 partition(s)" in page
    assert "3 batch(es) went to human review" in page
    assert "New: <strong>Injected" in page and "Records: 15 -> 17" in page
    assert "version 3, updated at 2026-11-29T12:00:00Z" in page
    assert page.index("Root cause chain") < page.index("<details")


def test_markdown_growth_is_in_the_html_and_the_empty_report_says_so() -> None:
    r1, _ = merge(None, _frag("a", {"raw/0": [[0, 9]]}), report_id="r")
    r2, _ = merge(r1, _frag("b", {"raw/0": [[5, 14]]}), report_id="r")
    assert "Growing: <strong>Disk full on datanode</strong>: 10 -> 15 records" in render_html(r2)
    assert "first version" in render_markdown(r1)
    assert "version 2, what changed" not in render_markdown(r2).lower()
    assert "No records have been analysed" in render_markdown(Report(id="empty"))


def test_html_escapes_log_text_and_has_no_script_without_refresh() -> None:
    page = render_html(_report())
    assert "<script" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "version 3, updated at 2026-11-29T12:00:00Z" in page
    for title in SECTIONS:
        assert f"<summary>{title}" in page
    assert "http://" not in page.replace("http-equiv", "") and "https://" not in page


def test_refresh_script_polls_the_json_url_and_is_pinned_by_csp() -> None:
    page = render_html(_report(), refresh_url="/reports/2026-11-29%2Fall.json")
    scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    assert len(scripts) == 1
    script = scripts[0]
    assert '"/reports/2026-11-29%2Fall.json"' in script
    assert "setTimeout(poll, 2000)" in script and "var current = 3;" in script
    assert "location.reload()" in script
    csp = html.unescape(re.search(r'Content-Security-Policy" content="([^"]+)"', page)[1])
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp
    style = re.search(r"<style>(.*?)</style>", page, flags=re.S)[1]
    style_digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert f"style-src 'sha256-{style_digest}'" in csp


def test_hostile_refresh_url_cannot_break_out_of_the_script() -> None:
    page = render_html(_report(), refresh_url='x"</script><script>alert(1)</script>')
    assert page.count("<script") == 1 and page.count("</script>") == 1


def test_json_round_trips() -> None:
    report = _report()
    assert Report.from_json(render_json(report)) == report


def test_index_lists_reports_and_refuses_script_links() -> None:
    report = _report()
    page = render_index_html(
        [
            report.model_dump(mode="json") | {"url": "/reports/2026-11-29/all"},
            {"id": f"evil{XSS}", "url": "javascript:alert(1)", "version": 1},
        ]
    )
    assert '<a href="/reports/2026-11-29/all">2026-11-29/all</a>' in page
    assert "javascript:" not in page and "<script" not in page
    assert "evil&lt;script&gt;" in page
    assert "<td>17</td>" in page  # record count
    assert "No reports yet" in render_index_html([])


def test_real_stack_trace_example_renders_verbatim() -> None:
    path = shared_file("kafka-broker-incident", "kafka0-server.log")
    trace = "\n".join(path.read_text(encoding="utf-8").splitlines()[1:5])  # within the cut
    assert "\tat " in trace
    frag = _frag(
        "k",
        {"kafka0-server.log/0": [[1, 5]]},
        service="kafka",
        event="Replica fetcher disconnected",
        evidence=[Evidence(template="java.io.IOException: <*>", count=5, examples=[trace])],
    )
    report, _ = merge(None, frag, report_id="r")
    # the post-mortem quotes a trace's first line; the HTML details keep it verbatim
    assert trace.splitlines()[0] in render_markdown(report)
    assert f"<pre><code>{html.escape(trace)}</code></pre>" in render_html(report)


def _summarized(report: Report, event_prefix: str, summary: str, count: int) -> Report:
    incidents = [
        i.model_copy(update={"summary": summary, "summary_count": count})
        if i.event.startswith(event_prefix)
        else i
        for i in report.incidents
    ]
    return report.model_copy(update={"incidents": incidents})


def test_incident_summaries_are_rendered_when_present() -> None:
    report = _summarized(_report(), "Disk", f"Disks filled up {XSS}. Free space.", 15)
    md = render_markdown(report)
    headings = re.findall(r"^## (.+)$", md, flags=re.M)
    section = dict(zip(headings, re.split(r"^## .+$", md, flags=re.M)[1:], strict=True))
    # the chain keeps the short cause; the model's summary is in the HTML details
    assert "No space left on /data" in section["Root cause chain"]
    assert "Disks filled up" not in md
    page = render_html(report)
    assert "Summary: Disks filled up &lt;script&gt;" in page and "<script" not in page


def test_a_stale_summary_says_how_many_records_it_covered() -> None:
    report = _summarized(_report(), "Disk", "Disks filled up.", 10)
    assert "Summary: Disks filled up. (written at 10 records)" in render_html(report)
    assert "written at" not in render_html(_summarized(_report(), "Disk", "Disks.", 15))


def test_terminal_control_sequences_in_log_text_never_reach_the_reader() -> None:
    """A log line with ESC[10A (cursor up) or a bell must not act on the terminal that
    shows `retro report`, nor hide in the HTML page."""
    nasty = "disk \x1b[10A\x1b[31mred\x07 full\x9b"
    report, _ = merge(None, _frag("a", {"raw/0": [[0, 2]]}, event=nasty, service=f"svc{nasty}",
                                  evidence=[Evidence(template=f"tpl {nasty}", count=3,
                                                     examples=[f"line {nasty}"])]),
                      report_id="2026-11-29/all", now="t1")
    for text in (render_markdown(report), render_html(report)):
        assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", text)
        assert "[10A" in text  # the visible rest of the line is kept


def test_data_coverage_states_analysed_and_parked_records() -> None:
    report = _report()
    md = render_markdown(report, parked_count=40)
    coverage = md.split("## Data coverage", 1)[1].split("\n## ", 1)[0]
    assert "Records analysed: 17" in coverage
    assert "Parked in review, not analysed above: 40 (`retro review`" in coverage
    # unknown: not claimed as zero
    assert "not analysed above: not known here" in render_markdown(report)
    assert "Parked: 40 record(s)" in render_html(report, parked_count=40)


def test_coverage_folds_messages_of_many_records_into_their_partition() -> None:
    report, _ = merge(None, _frag("a", {"otlp/0": [[0, 4]], "otlp/0@5:500": [[0, 499]],
                                        "otlp/0@9:300": [[0, 299]], "otlp/2@1:3": [[0, 2]]}),
                      report_id="2026-11-29/all", now="t1")
    page = render_html(report, review_count=0, deadletter_count=0)  # the details
    assert ("<code>otlp/0</code>: offsets 0-4 (5 records); 800 records from 2 message(s) "
            "carrying many" in page)
    assert "<code>otlp/2</code>: 3 records from 1 message(s) carrying many" in page
    assert "Total: 808 records in 2 partition(s)" in page
    assert "Records analysed: 808" in render_markdown(report, review_count=0)


def test_json_output_escapes_the_controls_json_would_leave_raw() -> None:
    """`retro report --format json` prints to a terminal too: DEL and C1 controls
    (0x9b is an 8-bit CSI) are written as \\u escapes; the parsed text is unchanged."""
    import json

    nasty = "disk \x1b[10A full\x7f\x9b31m"
    report, _ = merge(None, _frag("a", {"raw/0": [[0, 2]]}, event=nasty),
                      report_id="2026-11-29/all", now="t1")
    text = render_json(report)
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", text)
    assert json.loads(text)["incidents"][0]["event"] == nasty


def test_the_index_and_the_page_name_the_same_top_incident() -> None:
    report = pool_and_disk_report()
    most_records = max(report.incidents, key=lambda i: i.count)
    assert report.incidents[0].event == most_records.event == "Disk full"
    title = top_incident(report)
    assert title.startswith("Connection pool exhausted")
    page = render_html(report)
    assert f"<h1>Post-mortem: {html.escape(title)}</h1>" in page
    assert render_markdown(report).startswith(f"# Post-mortem: {title}\n")
    # the index, given the report's JSON or a summary carrying top_incident
    for item in (report.model_dump(mode="json"),
                 {"id": report.id, "version": report.version, "top_incident": title}):
        index = render_index_html([item | {"url": "/view/2026-11-29/all"}])
        cells = re.findall(r"<td>(.*?)</td>", index)
        assert cells[-1] == html.escape(title), cells
        assert "Disk full" not in index


@pytest.mark.parametrize("version, says, never", [
    (0, "no version yet", ("first version", "version 0")),
    (1, "first version, updated at", ("version 1,",)),
    (41, "version 41, updated at", ("first version",)),
])
def test_the_header_names_the_version_once_and_consistently(
        version: int, says: str, never: tuple[str, ...]) -> None:
    report = pool_and_disk_report().model_copy(update={"version": version})
    page = render_html(report)
    header = re.search(r'<p class="meta" id="report-version"[^>]*>(.*?)</p>', page)[1]
    md_header = render_markdown(report).splitlines()[2]
    for text in (header, md_header, html.unescape(header)):
        assert says in text and text.count("version") == 1, text
        assert not any(word in text for word in never), text
    assert ("first version of the report" in page) == (version == 1)
