"""Generated multi-service logs with one known injected fault, for the evaluation.

The labelled logs in ../shared/data are few and not on every machine; these cases are
written on the spot from a seed, so the evaluation (``bench/eval_bench.py``) runs
everywhere. Each case is a handful of generic services, one file per service in a
format chosen per service (log4j-like with Java traces, JSON lines, RFC 5424 syslog),
routine traffic, calls between services, and chronic warnings and errors at a constant
low rate, as real systems have. The injected fault and its truth:

* ``crash``: a downstream service starts throwing exceptions at T; its callers log
  "no instances available", "connection refused" and HTTP 5xx from it some seconds
  later, usually more lines than the service itself. Truth: that service, T.
* ``quiet``: one UTC day of routine traffic and chronic noise only. Truth: no high or
  critical incident.
* ``silent``: a service stops logging at T (its process hangs); its callers time out
  calling it. Truth: that service, T.

Names, formats, rates, messages, delays and whether the fault ends are drawn from the
seed, so several seeds give several cases; the same seed gives the same files.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

Kind = Literal["crash", "quiet", "silent"]
Level = Literal["DEBUG", "INFO", "WARN", "ERROR"]
Format = Literal["log4j", "json", "syslog"]

KINDS: tuple[Kind, ...] = ("crash", "quiet", "silent")
# no name is part of another or a common word of log titles, so a name found in a title
# blames one service
SERVICES = ("ledger", "catalog", "billing", "pricing", "shipping", "profile", "wallet",
            "loyalty", "booking", "payouts", "checkout", "fulfilment")
FORMATS: tuple[Format, ...] = ("log4j", "json", "syslog")
FAULT_SPAN = timedelta(hours=1)
QUIET_SPAN = timedelta(days=1)

_RESOURCES = ("items", "accounts", "entries", "carts", "invoices", "users", "quotes", "jobs")
_CLASSES = ("ApiController", "RequestHandler", "Scheduler", "Repository", "EventListener")
_ROUTINE = (
    "GET /v1/{res}/{id} 200 {ms}ms",
    "POST /v1/{res} 201 {ms}ms",
    "Completed request {uuid} in {ms} ms",
    "processed message {uuid} from topic {res}-events",
    "cache refresh finished: {n} entries in {ms} ms",
    "health check passed ({ms} ms)",
    "scheduled job {res}-compaction finished, {n} rows",
)
_CALL_OK = (
    "POST http://{dst}:8080/v1/{res} -> 200 ({ms} ms)",
    "call to {dst} succeeded in {ms}ms",
    "GET http://{dst}:8080/v1/{res}/{id} 200 OK in {ms}ms",
)
# chronic: steady all day, the background every on-call engineer learns to ignore
_CHRONIC: tuple[tuple[Level, str], ...] = (
    ("WARN", "Slow query took {big} ms: SELECT * FROM {res} WHERE id = ?"),
    ("WARN", "Deprecated property '{res}.batch-size' is used; use '{res}.batch.size' instead"),
    ("ERROR", "Invalid request payload: missing field 'customer_id' (request {uuid})"),
    ("WARN", "GC pause of {big} ms exceeded the 200 ms target"),
    ("ERROR", "Token refresh for client '{res}-sync' failed: 401 Unauthorized, retrying in 60s"),
    ("WARN", "Retrying delivery of message {uuid} (attempt 2 of 5)"),
    ("ERROR", "Failed to parse header X-Request-Start: '{uuid}'"),
    ("ERROR", "Read timed out after {tmo} ms fetching exchange rates from rates.example.net"),
    ("WARN", "Connection reset by peer (redis-{net}:6379), reconnecting"),
    ("ERROR", "Unhandled exception in job {res}-sync: java.lang.IllegalArgumentException: "
              "page size must be positive"),
)
# the downstream service's own failure: (exception line, frames or detail)
_CRASHES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("java.sql.SQLTransientConnectionException: HikariPool-1 - Connection is not available, "
     "request timed out after 30000ms.",
     ("com.zaxxer.hikari.pool.HikariPool.createTimeoutException(HikariPool.java:696)",
      "com.zaxxer.hikari.pool.HikariPool.getConnection(HikariPool.java:197)",
      "com.example.{svc}.Repository.find(Repository.java:88)")),
    ('java.lang.NullPointerException: Cannot invoke "com.example.{svc}.Entry.getId()" because '
     '"entry" is null',
     ("com.example.{svc}.EntryService.apply(EntryService.java:141)",
      "com.example.{svc}.ApiController.post(ApiController.java:57)")),
    ("java.lang.IllegalStateException: {svc} store is read-only after failover",
     ("com.example.{svc}.Store.write(Store.java:203)",
      "com.example.{svc}.EntryService.apply(EntryService.java:118)")),
    ("java.lang.OutOfMemoryError: Java heap space",
     ("java.base/java.util.Arrays.copyOf(Arrays.java:3537)",
      "com.example.{svc}.ReportBuilder.append(ReportBuilder.java:64)")),
)
# what a caller logs when the callee fails or is gone
_CALLER_CRASH = (
    "No instances available for {dst}",
    "Connection refused: {dst}/10.0.{net}.{host}:8080",
    "dial tcp 10.0.{net}.{host}:8080: connect: connection refused ({dst})",
    "500 Internal Server Error from POST http://{dst}:8080/v1/{res}",
    "HTTP 503 Service Unavailable from {dst} on GET /v1/{res}/{id}",
    "upstream {dst} returned 502 Bad Gateway",
)
_CALLER_TIMEOUT = (
    "java.net.SocketTimeoutException: Read timed out calling http://{dst}:8080/v1/{res}",
    'Post "http://{dst}:8080/v1/{res}": context deadline exceeded (Client.Timeout exceeded '
    "while awaiting headers)",
    "timeout after {tmo} ms waiting for {dst}",
    "request to {dst} timed out after {tmo}ms, giving up",
)
_CALLER_SELF = "Request {uuid} failed: 500 Internal Server Error ({ms} ms)"
_RESTART = "Started {cls} in {sec} seconds (process running for {sec2})"


@dataclass(frozen=True, slots=True)
class Truth:
    """What was injected, from the generator, never from the pipeline's rules."""

    kind: Kind
    service: str | None  # the faulty service; None on a quiet day
    time: datetime | None  # UTC, when the fault began
    callers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Case:
    """One generated case: its files (one per service) and its truth."""

    name: str
    files: tuple[Path, ...]
    truth: Truth
    start: datetime
    end: datetime


@dataclass(slots=True)
class _Line:
    time: datetime
    level: Level
    logger: str
    message: str
    trace: tuple[str, ...] = ()  # exception frames, written as the format writes them


@dataclass(slots=True)
class _Service:
    name: str
    fmt: Format
    host: str
    pid: int
    loggers: tuple[str, ...]
    lines: list[_Line] = field(default_factory=list)


def write_case(folder: Path, kind: Kind, seed: int) -> Case:
    """Write the case ``kind`` for ``seed`` under ``folder`` and return it with its truth."""
    rng = random.Random(f"{kind}-{seed}")
    folder.mkdir(parents=True, exist_ok=True)
    names = rng.sample(SERVICES, rng.randint(4, 6))
    services = {n: _service(rng, n) for n in names}
    if kind == "quiet":
        day = datetime(2025, 3, 3, tzinfo=UTC) + timedelta(days=rng.randrange(300))
        start, end = day, day + QUIET_SPAN - timedelta(seconds=1)
    else:
        start = (datetime(2025, 3, 3, 6, tzinfo=UTC)
                 + timedelta(days=rng.randrange(300), minutes=rng.randrange(600)))
        end = start + FAULT_SPAN
    faulty = names[0] if kind != "quiet" else None
    callers = tuple(names[1:rng.randint(3, len(names) - 1)]) if faulty else ()
    # everyone calls someone: the faulty service's callers call it, the others each other
    calls = {n: ([faulty] if faulty and n in callers
                 else [m for m in names if m not in (n, faulty)][:2]) for n in names}
    fault_at: datetime | None = None
    fault_end: datetime | None = None
    if faulty is not None:
        fault_at = start + timedelta(seconds=rng.uniform(0.25, 0.6) * FAULT_SPAN.total_seconds())
        if rng.random() < 0.5:  # recovers within the hour, else still failing at the end
            fault_end = fault_at + timedelta(minutes=rng.uniform(8, 20))
    # a quiet day is sparse per minute; the hour around a fault is busy
    gap = 150.0 if kind == "quiet" else rng.uniform(5.0, 9.0)
    for svc in services.values():
        down = (fault_at, fault_end) if svc.name == faulty else None
        _routine(rng, svc, start, end, gap, calls[svc.name], down, kind)
        _chronic(rng, svc, start, end)
    if faulty is not None and fault_at is not None:
        if kind == "crash":
            _crash(rng, services[faulty], fault_at, fault_end or end)
        else:
            services[faulty].lines = [x for x in services[faulty].lines
                                      if x.time < fault_at or (fault_end and x.time >= fault_end)]
            if fault_end is not None:  # someone restarted it
                services[faulty].lines.append(_Line(
                    fault_end, "INFO", services[faulty].loggers[0],
                    _RESTART.format(cls=f"{faulty.title()}Application",
                                    sec=f"{rng.uniform(8, 30):.3f}",
                                    sec2=f"{rng.uniform(31, 40):.3f}")))
        for name in callers:
            _callers(rng, services[name], faulty, kind, fault_at, fault_end or end)
    files = tuple(_write(folder, svc) for svc in services.values())
    truth = Truth(kind, faulty, fault_at, callers)
    return Case(f"gen-{kind}-{seed}", files, truth, start, end)


def _service(rng: random.Random, name: str) -> _Service:
    fmt = rng.choice(FORMATS)
    short = rng.random() < 0.5  # log4j's %logger{36} abbreviates the package
    pkg = f"c.e.{name}" if short else f"com.example.{name}"
    loggers = tuple(f"{pkg}.{c}" for c in rng.sample(_CLASSES, 3))
    return _Service(name, fmt, f"{name}-{rng.randrange(16**5):05x}", rng.randint(100, 30000),
                    loggers)


def _fill(rng: random.Random, template: str, **known: str) -> str:
    values = {
        "res": rng.choice(_RESOURCES), "id": str(rng.randint(1000, 99999)),
        "ms": str(rng.randint(2, 180)), "big": str(rng.randint(600, 4000)),
        "n": str(rng.randint(1, 5000)), "uuid": str(uuid.UUID(int=rng.getrandbits(128))),
        "net": str(rng.randint(0, 9)), "host": str(rng.randint(2, 250)),
        "tmo": str(rng.choice((2000, 3000, 5000, 10000))),
    }
    return template.format(**(values | known))


def _poisson(rng: random.Random, start: datetime, end: datetime, mean_gap: float
             ) -> list[datetime]:
    """Times of a Poisson process of mean gap ``mean_gap`` seconds between ``start`` and ``end``."""
    out, t = [], start
    while True:
        t += timedelta(seconds=rng.expovariate(1.0 / mean_gap))
        if t >= end:
            return out
        out.append(t)


def _routine(rng: random.Random, svc: _Service, start: datetime, end: datetime, gap: float,
             calls: list[str], down: tuple[datetime | None, datetime | None] | None,
             kind: Kind) -> None:
    """Routine traffic; a crashing service answers few requests while it fails."""
    for t in _poisson(rng, start, end, gap):
        if down is not None and down[0] is not None and t >= down[0] and (
                down[1] is None or t < down[1]) and kind == "crash" and rng.random() < 0.8:
            continue
        dst = rng.choice(calls) if calls and rng.random() < 0.3 else None
        if dst is not None:
            text = _fill(rng, rng.choice(_CALL_OK), dst=dst)
        else:
            text = _fill(rng, rng.choice(_ROUTINE))
        level: Level = "DEBUG" if rng.random() < 0.05 else "INFO"
        svc.lines.append(_Line(t, level, rng.choice(svc.loggers), text))


def _chronic(rng: random.Random, svc: _Service, start: datetime, end: datetime) -> None:
    """One or two chronic issues at a constant rate: noise, not an incident."""
    for level, template in rng.sample(_CHRONIC, rng.randint(1, 2)):
        mean_gap = rng.uniform(240, 1200)  # a few an hour, all day long
        logger = rng.choice(svc.loggers)
        for t in _poisson(rng, start, end, mean_gap):
            svc.lines.append(_Line(t, level, logger, _fill(rng, template)))


def _crash(rng: random.Random, svc: _Service, begin: datetime, end: datetime) -> None:
    """The downstream service throws on most requests from ``begin``; the first at ``begin``."""
    exception, frames = rng.choice(_CRASHES)
    exception = exception.format(svc=svc.name)
    frames = tuple(f.format(svc=svc.name) for f in frames)
    logger = svc.loggers[0]
    for t in [begin, *_poisson(rng, begin, end, rng.uniform(2.0, 6.0))]:
        head = _fill(rng, "Request processing failed for POST /v1/{res} (request {uuid})")
        svc.lines.append(_Line(t, "ERROR", logger, f"{head}: {exception}", frames))


def _callers(rng: random.Random, svc: _Service, dst: str, kind: Kind, begin: datetime,
             end: datetime) -> None:
    """A caller notices some seconds after the fault, and logs it on most calls until it ends."""
    # no call to it succeeds meanwhile
    svc.lines = [x for x in svc.lines
                 if not (begin <= x.time < end and x.level != "ERROR" and dst in x.message)]
    options = _CALLER_CRASH if kind == "crash" else _CALLER_TIMEOUT
    mine = rng.sample(options, rng.randint(2, 3))  # one client library, a few phrasings
    delay = rng.uniform(3, 30)
    logger = rng.choice(svc.loggers)
    for t in _poisson(rng, begin + timedelta(seconds=delay), end, rng.uniform(1.5, 6.0)):
        svc.lines.append(_Line(t, "ERROR" if rng.random() < 0.8 else "WARN", logger,
                               _fill(rng, rng.choice(mine), dst=dst)))
        if rng.random() < 0.3:  # and fails its own request
            svc.lines.append(_Line(t + timedelta(milliseconds=rng.randint(1, 40)), "ERROR",
                                   svc.loggers[0], _fill(rng, _CALLER_SELF)))


# ------------------------------------------------------------------ formats


def _write(folder: Path, svc: _Service) -> Path:
    path = folder / f"{svc.name}.log"
    writer = _WRITERS[svc.fmt]
    svc.lines.sort(key=lambda x: x.time)
    with path.open("w", encoding="utf-8") as fh:
        for line in svc.lines:
            fh.write(writer(svc, line) + "\n")
    return path


def _log4j(svc: _Service, line: _Line) -> str:
    t = line.time
    stamp = f"{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}"
    thread = f"http-nio-8080-exec-{t.microsecond % 10 + 1}"
    text = f"{stamp} {line.level:<5} [{thread}] {line.logger} - {line.message}"
    return "\n".join([text, *(f"\tat {f}" for f in line.trace)])


def _json(svc: _Service, line: _Line) -> str:
    t = line.time
    obj: dict[str, object] = {
        "timestamp": f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z",
        "level": line.level.lower() if svc.pid % 2 else line.level,
        "service": svc.name, "logger": line.logger, "message": line.message,
    }
    if line.trace:
        obj["stack_trace"] = "\n".join(f"\tat {f}" for f in line.trace)
    return json.dumps(obj, separators=(",", ":"))


_SYSLOG_SEVERITY = {"DEBUG": 7, "INFO": 6, "WARN": 4, "ERROR": 3}


def _syslog(svc: _Service, line: _Line) -> str:
    t = line.time
    pri = 16 * 8 + _SYSLOG_SEVERITY[line.level]  # facility local0
    stamp = f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"
    message = line.message + (f" at {line.trace[0]}" if line.trace else "")
    return f"<{pri}>1 {stamp} {svc.host} {svc.name} {svc.pid} - - {message}"


_WRITERS: dict[Format, Callable[[_Service, _Line], str]] = {
    "log4j": _log4j, "json": _json, "syslog": _syslog,
}
