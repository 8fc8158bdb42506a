"""HTTP views served by the worker: reports (JSON and a live page), metrics, health."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from streams.errors import PortInUse
from streams.kafka.probe import BrokerProbe
from streams.kafka.stall import StallDetector
from streams.metrics import Metrics
from streams.ports import port_free
from streams.report.store import ReportFollower
from streams.report.views.view import render_html, render_index_html, top_incident
from streams.worker.web_auth import COOKIE, authorized

Handler = Callable[..., Awaitable[Any]]
PROBE_SECONDS = 2.0  # between readiness probes of the bootstrap servers


def check_web_port(host: str, port: int) -> None:
    """Fail before starting, naming the setting, when the HTTP port is taken.

    faust would otherwise log a traceback and exit after joining the group.
    """
    if not port_free(host, port):
        raise PortInUse(f"port {port} on {host} is in use (another worker?); set "
                        "RETRO_WEB_PORT to a free port (and RETRO_WEB_HOST to listen elsewhere)")


Titles = dict[str, tuple[tuple[Any, ...], str]]  # report id -> (its revision, top incident)


def summary(report: Any, titles: Titles | None = None) -> dict[str, Any]:
    """A report's line in /reports and on the index page; its ``top_incident`` is the
    post-mortem's title, as its page shows it (``streams.report.views.view.top_incident``)."""
    return {
        "id": report.id, "version": report.version, "updated_at": report.updated_at,
        "first_seen": report.first_seen, "last_seen": report.last_seen,
        "record_count": report.record_count, "incidents": len(report.incidents),
        "top_incident": _top_incident(report, titles),
        "services": report.services,
        "url": f"/view/{report.id}", "json": f"/reports/{report.id}",
    }


def _top_incident(report: Any, titles: Titles | None) -> str:
    """Derived once per revision: a post-mortem reads every incident, and the index asks
    for every report's each time it is loaded."""
    if titles is None:
        return top_incident(report)
    revision = (report.version, report.updated_at, report.record_count)
    held = titles.get(report.id)
    if held is None or held[0] != revision:
        held = titles[report.id] = (revision, top_incident(report))
    return held[1]


def newest_first(reports: Any) -> list[Any]:
    """Latest window first; "undated" reports after every dated one."""
    return sorted(reports, key=lambda r: (not r.id.startswith("undated"), r.id), reverse=True)


def guarded(token: str | None) -> Callable[[Handler], Handler]:
    """A page decorator: with a token, answer 401 to requests that do not carry it
    (``streams/worker/web_auth.py``); a token given as ``?token=`` becomes a cookie."""

    def wrap(handler: Handler) -> Handler:
        if token is None:
            return handler

        @functools.wraps(handler)
        async def page(web: Any, request: Any, **kwargs: Any) -> Any:
            if not authorized(token, headers=request.headers, query=request.query,
                              cookies=request.cookies):
                return web.json(
                    {"error": "this page needs the web token: send `Authorization: Bearer "
                              "<token>`, or open it once with ?token=<token>"},
                    status=401, headers={"WWW-Authenticate": 'Bearer realm="retro"'})
            response = await handler(web, request, **kwargs)
            if request.query.get("token"):
                response.set_cookie(COOKIE, token, httponly=True, samesite="Strict",
                                    path="/")
            return response

        return page

    return wrap


def wire_web(app: Any, metrics: Metrics, follower: ReportFollower,
             health: StallDetector, *, broker: BrokerProbe | None = None,
             token: str | None = None) -> None:
    """The HTTP views; with ``token`` every page but /livez, /healthz and /metrics
    requires it."""
    guard = guarded(token)
    titles: Titles = {}

    @app.page("/livez")
    async def livez(web: Any, request: Any) -> Any:
        """Liveness: the event loop answers. A stall is not a reason to restart a pod
        (throttling by the provider looks like one); it fails readiness and alerts."""
        return web.json({"status": "ok"})

    @app.page("/healthz")
    async def healthz(web: Any, request: Any) -> Any:
        """Readiness: Kafka is reachable, and no owned partition has lag with a commit
        stuck for RETRO_STALL_SECONDS (``retro_partitions_stalled`` counts them)."""
        unreachable = broker.unreachable() if broker is not None else None
        if unreachable:
            return web.json({"status": "broker_unreachable", "reason": unreachable},
                            status=503)
        stalled = health.stalled()
        if stalled:
            return web.json({"status": "stalled", "partitions": [
                f"{topic}/{partition}" for topic, partition in stalled]}, status=503)
        return web.json({"status": "ok"})

    @app.page("/metrics")
    async def prometheus(web: Any, request: Any) -> Any:
        return web.bytes(generate_latest(metrics.registry),
                         content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/reports")
    @guard
    async def list_reports(web: Any, request: Any) -> Any:
        items = newest_first(follower.reports.values())
        return web.json([summary(r, titles) for r in items])

    # report ids are "<window>/<group>", e.g. "2026-11-29/all"
    @app.page("/reports/{window}/{group}")
    @guard
    async def get_report(web: Any, request: Any, window: str, group: str) -> Any:
        report = follower.reports.get(f"{window}/{group}")
        if report is None:
            return web.json({"error": f"no report {window}/{group}"}, status=404)
        return web.json(report.model_dump(mode="json"))

    @app.page("/view/{window}/{group}")
    @guard
    async def view_report(web: Any, request: Any, window: str, group: str) -> Any:
        report = follower.reports.get(f"{window}/{group}")
        if report is None:
            return web.html(render_index_html(
                [summary(r, titles) for r in follower.reports.values()]), status=404)
        return web.html(render_html(report, refresh_url=f"/reports/{window}/{group}"))

    @app.page("/")
    @guard
    async def index(web: Any, request: Any) -> Any:
        items = newest_first(follower.reports.values())
        return web.html(render_index_html([summary(r, titles) for r in items]))

    if broker is not None:
        metrics.broker_reachable.set(1)

        @app.timer(interval=PROBE_SECONDS)
        async def probe_broker() -> None:
            await broker.check()
            metrics.broker_reachable.set(0 if broker.unreachable() else 1)

    @app.task
    async def follow_reports() -> None:
        await asyncio.shield(follower.run())
