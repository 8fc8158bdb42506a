"""The worker's /reports views, driven through their handlers (no faust, no Kafka)."""

from __future__ import annotations

import html
import re
from typing import Any

from streams.kafka.stall import StallDetector
from streams.metrics import Metrics
from streams.report.store import ReportFollower
from streams.report.views.view import top_incident
from streams.settings import Settings
from streams.worker.web import summary, wire_web

from helpers import pool_and_disk_report


class _App:
    """What wire_web asks of the faust App: pages, a timer, a task."""

    def __init__(self) -> None:
        self.pages: dict[str, Any] = {}

    def page(self, path: str) -> Any:
        def register(handler: Any) -> Any:
            self.pages[path] = handler
            return handler

        return register

    def timer(self, interval: float) -> Any:
        return lambda handler: handler

    def task(self, handler: Any) -> Any:
        return handler


class _Web:
    def json(self, data: Any, status: int = 200, **_: Any) -> tuple[int, Any]:
        return status, data

    def html(self, text: str, status: int = 200, **_: Any) -> tuple[int, str]:
        return status, text


async def test_reports_json_the_index_and_the_page_name_the_same_top_incident() -> None:
    report = pool_and_disk_report()
    assert max(report.incidents, key=lambda i: i.count).event == "Disk full"
    follower = ReportFollower(Settings())
    follower.reports.put(f"{report.id}#0".encode(), report.model_dump_json().encode())
    app = _App()
    wire_web(app, Metrics(), follower, StallDetector(stall_seconds=600))
    web = _Web()
    title = top_incident(follower.reports.get(report.id))
    assert title.startswith("Connection pool exhausted")

    status, listed = await app.pages["/reports"](web, None)
    assert status == 200 and [r["top_incident"] for r in listed] == [title]
    status, index = await app.pages["/"](web, None)
    assert re.findall(r"<td>(.*?)</td>", index)[-1] == html.escape(title)
    status, page = await app.pages["/view/{window}/{group}"](
        web, None, window="2026-11-29", group="all")
    assert f"<h1>Post-mortem: {html.escape(title)}</h1>" in page
    assert "Disk full" not in index and "Disk full" not in str(listed)


def test_a_summary_derives_the_title_once_per_revision() -> None:
    report = pool_and_disk_report()
    titles: dict[str, Any] = {}
    first = summary(report, titles)["top_incident"]
    titles[report.id] = (titles[report.id][0], "held")  # the same revision: not derived again
    assert summary(report, titles)["top_incident"] == "held"
    newer = report.model_copy(update={"version": report.version + 1})
    assert summary(newer, titles)["top_incident"] == first == top_incident(report)
