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

**Days with several faults** (``write_day``, for ``bench/rca_bench.py``): a few hours of
seven or eight services, as one Fluent Bit stream of a Kubernetes cluster (odd seeds) or
one file per service (even seeds), each service in its own format (log4j-like, JSON
lines, Python ``logging``, Go logfmt), with four or five
faults at known times, each in another service, each over within a quarter of an hour:

* ``crash``: as above, the service throws and its callers log its failures;
* ``silent``: as above, the service logs nothing until a restart, callers time out;
* ``vanishing``: the service keeps logging, but a line it writes right after another
  one, one for one, thins out (an early return, a swallowed exception); nothing at
  WARN or above, from anyone;
* ``slow``: the service's own lines thin out, nothing at WARN or above of its own, and
  the requests it still answers wait seconds, as do its own calls out (its callees
  look slow with it); its callers log timeouts that name it by URL or host
  (``http://svc:8080/...``, ``No instances available for svc``).

A request from one service to another carries one trace id, as instrumented services
print it (logback's MDC, OpenTelemetry's logging fields, JSON, logfmt): the caller's
line as it sends, the callee's as it answers, the caller's as the answer comes back.

Every day also has **chronic** noise: one or two callers that fail to find a callee
(retired, or running but never discovered) in every minute of the day, fault or not,
and each service's own steady warnings. ``write_day(..., quiet=True)`` writes the
same without faults: routine and chronic only. The truth (``DayCase.truth``) is the
list of ``(service, time, kind)``.
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
Format = Literal["log4j", "json", "syslog", "python", "logfmt"]

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
# a caller's line as it sends a request, and the callee's as it answers (one trace id)
_CALL_SENT = ("sending {op} to {dst}", "-> {dst} /v1/{res}/{id}", "calling {dst} for {res}")
_CALL_SERVED = ("served /v1/{res} in {ms} ms", "{res} lookup answered", "request handled: {res}")
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
    trace_id: str | None = None  # written by the formats that carry one (JSON, logfmt)
    step: str = ""  # which line of a flow (``0a``, ``0b``: flow 0's first and second)


@dataclass(slots=True)
class _Service:
    name: str
    fmt: Format
    host: str
    pid: int
    loggers: tuple[str, ...]
    lines: list[_Line] = field(default_factory=list)
    # (logger, first line, the line written right after it), one for one
    flows: tuple[tuple[str, str, str], ...] = ()


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
             end: datetime, options: tuple[str, ...] | None = None, *,
             sends: bool = False) -> None:
    """A caller notices some seconds after the fault, and logs it on most calls until it
    ends; ``sends``: it still sends its requests (to a slow callee), none comes back."""
    # no call to it succeeds meanwhile
    svc.lines = [x for x in svc.lines
                 if not (begin <= x.time < end and x.level != "ERROR" and dst in x.message
                         and not (sends and x.step == "call"))]
    if options is None:
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


# ------------------------------------------------------------------ days with several faults

DayKind = Literal["crash", "silent", "vanishing", "slow"]
Layout = Literal["fluentbit", "files"]

DAY_FAULTS: tuple[DayKind, ...] = ("crash", "silent", "vanishing", "slow")
DAY_FORMATS: tuple[Format, ...] = ("log4j", "json", "python", "logfmt")
DAY_SPAN = timedelta(hours=4)
DAY_WARMUP = timedelta(minutes=75)  # no fault before: the stream's own past to compare with
DAY_SPACING = timedelta(minutes=30)  # at least this from one fault's start to the next
DAY_TAIL = timedelta(minutes=25)  # the last fault starts at least this long before the end
FAULT_MINUTES = (5.0, 15.0)  # how long a fault lasts: each is over before the next begins

_DAY_SERVICES = (*SERVICES, "inventory", "notifier", "coupons", "ratings")
# callees that callers still look for all day and never find: retired, never deployed here
_RETIRED = ("recommender", "geocoder", "antifraud")
_OPS = ("queryOrders", "getQuote", "reserveSeat", "applyCoupon", "checkStock", "settleInvoice",
        "loadProfile", "planRoute", "listTrips", "priceCart")
# a unit of work a service logs twice, one line right after the other
_FLOWS: tuple[tuple[str, str], ...] = (
    ("[{op}][start] {res} id: {id}", "[{op}][done] {res} id: {id}, {n} rows"),
    ("{op}: loading {res} {id}", "{op}: loaded {res} {id} ({n} items in {ms} ms)"),
    ("begin {op} for {res}/{id}", "{op} for {res}/{id} answered in {ms}ms"),
    ("{op} {res}={id} validated", "{op} {res}={id} saved, version {n}"),
)
_PY_MODULES = ("views", "db", "tasks", "client", "handlers")
_GO_FILES = ("handler", "store", "client", "server", "worker")
# chronic: a caller that never finds its callee, every minute of the day
_MISSING = (
    "No instances available for {dst}",
    "com.netflix.client.ClientException: Load balancer does not have available server for "
    "client: {dst}",
    'Get "http://{dst}:8080/v1/{res}": dial tcp: lookup {dst} on 10.96.0.10:53: no such host',
    "service discovery returned no healthy endpoints for {dst}",
)
# what the callers of a slow service log: timeouts, and its instances failing health checks
_CALLER_SLOW = (
    *_CALLER_TIMEOUT,
    "No instances available for {dst}",
    'I/O error on POST request for "http://{dst}:8080/v1/{res}": Read timed out',
)
# a crash in a Python or Go service: (message, traceback or error)
_CRASH_PY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Internal Server Error: /v1/{res}/{id}",
     ("Traceback (most recent call last):",
      '  File "/app/{svc}/views.py", line 88, in post',
      "    row = session.execute(query).one()",
      "sqlalchemy.exc.OperationalError: (psycopg2.OperationalError) server closed the "
      "connection unexpectedly")),
    ("Exception on /v1/{res} [POST]",
     ("Traceback (most recent call last):",
      '  File "/app/{svc}/handlers.py", line 141, in apply',
      "    total = entry['amount'] * rate",
      "TypeError: unsupported operand type(s) for *: 'NoneType' and 'float'")),
)
_CRASH_GO = (
    "pq: sorry, too many clients already",
    "runtime error: invalid memory address or nil pointer dereference",
    "rpc error: code = Internal desc = {svc} store is read-only",
)


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault of a day: the service, when it began, what it was."""

    service: str
    time: datetime  # UTC, the fault's first moment
    kind: DayKind
    end: datetime  # when it was over
    callers: tuple[str, ...] = ()  # services that call it (they log its failures, not vanishing)
    line: str = ""  # vanishing: the line that thins out (its template, ``{..}`` for values)
    follows: str = ""  # vanishing: the line it is written right after, which goes on


@dataclass(frozen=True, slots=True)
class DayCase:
    """A generated day: its files, the services that log, the faults and the chronic noise."""

    name: str
    files: tuple[Path, ...]
    faults: tuple[Fault, ...]  # by time; empty on a quiet day
    services: tuple[str, ...]  # the services that log (their records' service field)
    chronic: tuple[tuple[str, str], ...]  # (caller, callee it never finds), every minute
    layout: Layout  # one Fluent Bit stream of the cluster, or one file per service
    start: datetime
    end: datetime

    @property
    def truth(self) -> list[tuple[str, datetime, DayKind]]:
        """``[(service, time, kind)]``, by time."""
        return [(f.service, f.time, f.kind) for f in self.faults]


def write_day(folder: Path, seed: int, *, quiet: bool = False) -> DayCase:
    """Write the day for ``seed`` (faults, or ``quiet``: none) under ``folder``."""
    label = "quiet" if quiet else "multi"
    rng = random.Random(f"day-{label}-{seed}")
    folder.mkdir(parents=True, exist_ok=True)
    names = rng.sample(_DAY_SERVICES, rng.randint(7, 8))
    services = {n: _day_service(rng, n) for n in names}
    layout: Layout = "files" if seed % 2 == 0 else "fluentbit"  # both, whatever --seeds
    day = datetime(2025, 3, 3, tzinfo=UTC) + timedelta(days=rng.randrange(300))
    start = day + timedelta(hours=rng.randint(6, 14), minutes=rng.randrange(60))
    end = start + DAY_SPAN

    count = 0 if quiet else rng.randint(4, 5)
    kinds = list(DAY_FAULTS)
    rng.shuffle(kinds)
    kinds = (kinds + [rng.choice(DAY_FAULTS) for _ in range(count - len(kinds))])[:count]
    faulty, others = names[:count], names[count:]
    lo, hi = start + DAY_WARMUP, end - DAY_TAIL
    slack = ((hi - lo) - (count - 1) * DAY_SPACING).total_seconds() if count else 0.0
    offsets = sorted(rng.uniform(0, slack) for _ in range(count))
    times = [lo + timedelta(seconds=o) + i * DAY_SPACING for i, o in enumerate(offsets)]
    order = rng.sample(range(count), count)  # which fault comes when
    plan = [(faulty[i], kinds[i], times[k]) for k, i in enumerate(order)]
    ends = [t + timedelta(minutes=rng.uniform(*FAULT_MINUTES)) for _, _, t in plan]
    silenced = {s for s, k, _ in plan if k == "silent"}

    chronic: list[tuple[str, str]] = []
    for _ in range(rng.randint(1, 2)):
        callee = rng.choice(_RETIRED) if rng.random() < 0.5 or not others else rng.choice(others)
        caller = rng.choice([n for n in names if n != callee and n not in silenced])
        if all(c != callee for _, c in chronic):
            chronic.append((caller, callee))

    # who calls whom: everyone calls one or two others; a failing service has callers
    calls = {n: rng.sample([m for m in names if m != n], rng.randint(1, 2)) for n in names}
    for svc, kind, _ in plan:
        if kind == "vanishing":
            continue
        have = [n for n in names if svc in calls[n]]
        more = [n for n in names if n != svc and n not in have]
        for n in rng.sample(more, max(0, rng.randint(2, 3) - len(have))):
            calls[n].append(svc)
    for caller, callee in chronic:  # no call to it ever succeeds
        calls[caller] = [c for c in calls[caller] if c != callee]

    served: list[tuple[str, datetime, str]] = []
    for svc in services.values():
        _day_routine(rng, svc, start, end, rng.uniform(5.0, 10.0), calls[svc.name], served)
        _chronic(rng, svc, start, end)
    for dst, at, trace in served:
        callee = services[dst]
        callee.lines.append(_Line(at, "INFO", callee.loggers[0], _fill(
            rng, rng.choice(_CALL_SERVED)), trace_id=trace, step="served"))
    for caller, callee in chronic:
        _missing(rng, services[caller], callee, start, end)

    faults = []
    for (name, kind, at), until in zip(plan, ends, strict=True):
        svc = services[name]
        callers = tuple(n for n in names if name in calls[n])
        line = follows = ""
        if kind == "crash":
            _thin(rng, svc, at, until, keep=0.2)
            _day_crash(rng, svc, at, until)
        elif kind == "silent":
            svc.lines = [x for x in svc.lines if not at <= x.time < until]
            svc.lines.append(_Line(until, "INFO", svc.loggers[0], _RESTART.format(
                cls=f"{name.title()}Application", sec=f"{rng.uniform(8, 30):.3f}",
                sec2=f"{rng.uniform(31, 40):.3f}")))
        elif kind == "slow":  # and the requests it still answers wait seconds
            _thin(rng, svc, at, until, keep=rng.uniform(0.3, 0.5))
            for x in svc.lines:
                if x.step == "served" and at <= x.time < until:
                    x.time += timedelta(seconds=rng.uniform(0.5, 3.0))
            _delay_calls_out(random.Random(f"{name}-{at}"), svc, services, at, until)
        else:  # vanishing: the line after the first of its busiest flow, mostly gone
            drop = rng.uniform(0.7, 0.9)
            svc.lines = [x for x in svc.lines if not (
                at <= x.time < until and x.step == "0b" and rng.random() < drop)]
            follows, line = svc.flows[0][1:]
        if kind in ("crash", "silent", "slow"):
            options = _CALLER_SLOW if kind == "slow" else None
            for caller in callers:
                _callers(rng, services[caller], name, "crash" if kind == "crash" else "silent",
                         at, until, options, sends=kind == "slow")
        faults.append(Fault(name, at, kind, until, callers, line, follows))
    faults.sort(key=lambda f: f.time)

    if layout == "fluentbit":
        files: tuple[Path, ...] = (_write_fluentbit(folder, list(services.values())),)
    else:
        files = tuple(_write(folder, svc) for svc in services.values())
    return DayCase(f"day-{label}-{seed}", files, tuple(faults), tuple(names), tuple(chronic),
                   layout, start, end)


def _delay_calls_out(rng: random.Random, svc: _Service, services: dict[str, _Service],
                     begin: datetime, end: datetime) -> None:
    """A slow service (a starved CPU, a delayed network) is slow to send its own calls
    too: each reaches its callee, and its answer comes back, up to seconds later."""
    lag = {x.trace_id: timedelta(seconds=rng.uniform(0.5, 3.0)) for x in svc.lines
           if x.step == "call" and begin <= x.time < end and x.trace_id}
    for other in services.values():
        for x in other.lines:
            if x.trace_id in lag and (x.step == "served" or (
                    other is svc and x.step == "" and x.level == "INFO")):
                x.time += lag[x.trace_id]


def _day_service(rng: random.Random, name: str) -> _Service:
    fmt = rng.choice(DAY_FORMATS)
    if fmt == "python":
        loggers = tuple(f"{name}.{m}" for m in rng.sample(_PY_MODULES, 3))
    elif fmt == "logfmt":
        loggers = tuple(f"{f}.go:{rng.randint(20, 400)}" for f in rng.sample(_GO_FILES, 3))
    else:
        loggers = tuple(f"com.example.{name}.{c}" for c in rng.sample(_CLASSES, 3))
    pod = f"{name}-{rng.randrange(16**10):010x}-{rng.randrange(16**5):05x}"
    svc = _Service(name, fmt, pod, rng.randint(100, 30000), loggers)
    flows = []
    for op in rng.sample(_OPS, 2):
        first, second = rng.choice(_FLOWS)
        logger = (f"com.example.{name}.{name.title()}ServiceImpl" if fmt in ("log4j", "json")
                  else rng.choice(loggers))
        flows.append((logger, first.replace("{op}", op), second.replace("{op}", op)))
    svc.flows = tuple(flows)
    return svc


def _day_routine(rng: random.Random, svc: _Service, start: datetime, end: datetime,
                 gap: float, calls: list[str], served: list[tuple[str, datetime, str]]
                 ) -> None:
    """Units of work (two lines, one right after the other), calls and other routine;
    each call's answer goes to ``served`` as (callee, when, trace id)."""
    for t in _poisson(rng, start, end, gap):
        r = rng.random()
        trace = f"{rng.getrandbits(128):032x}"
        if r < 0.5:
            n = 0 if len(svc.flows) == 1 or rng.random() < 0.7 else 1
            logger, first, second = svc.flows[n]
            known = {"res": rng.choice(_RESOURCES), "id": str(rng.randint(1000, 99999))}
            svc.lines.append(_Line(t, "INFO", logger, _fill(rng, first, **known),
                                   trace_id=trace, step=f"{n}a"))
            then = t + timedelta(milliseconds=rng.randint(2, 60))
            svc.lines.append(_Line(then, "INFO", logger, _fill(rng, second, **known),
                                   trace_id=trace, step=f"{n}b"))
        elif calls and r < 0.75:  # a request to another service, one trace id through it
            dst, logger = rng.choice(calls), rng.choice(svc.loggers)
            svc.lines.append(_Line(t, "INFO", logger, _fill(
                rng, rng.choice(_CALL_SENT), dst=dst, op=rng.choice(_OPS)),
                trace_id=trace, step="call"))
            took = timedelta(milliseconds=rng.uniform(3, 40))
            served.append((dst, t + took, trace))
            text = _fill(rng, rng.choice(_CALL_OK), dst=dst)
            svc.lines.append(_Line(t + took + timedelta(milliseconds=rng.randint(1, 5)),
                                   "INFO", logger, text, trace_id=trace))
        else:
            level: Level = "DEBUG" if rng.random() < 0.05 else "INFO"
            svc.lines.append(_Line(t, level, rng.choice(svc.loggers),
                                   _fill(rng, rng.choice(_ROUTINE)), trace_id=trace))


def _missing(rng: random.Random, svc: _Service, dst: str, start: datetime, end: datetime
             ) -> None:
    """The caller looks for ``dst`` and does not find it, one to four times every minute."""
    template = rng.choice(_MISSING)
    level: Level = "ERROR" if rng.random() < 0.7 else "WARN"
    logger = rng.choice(svc.loggers)
    minute = start.replace(second=0, microsecond=0)
    while minute < end:
        for _ in range(rng.randint(1, 4)):
            t = minute + timedelta(seconds=rng.uniform(0, 60))
            if start <= t < end:
                svc.lines.append(_Line(t, level, logger, _fill(rng, template, dst=dst)))
        minute += timedelta(minutes=1)


def _thin(rng: random.Random, svc: _Service, begin: datetime, end: datetime, keep: float
          ) -> None:
    """Keep about ``keep`` of the routine (below WARN) between ``begin`` and ``end``; the two
    lines of a unit of work stay or go together."""
    kept: dict[str, bool] = {}
    out = []
    for x in svc.lines:
        if begin <= x.time < end and x.level in ("DEBUG", "INFO"):
            key = x.trace_id or str(id(x))
            if key not in kept:
                kept[key] = rng.random() < keep
            if not kept[key]:
                continue
        out.append(x)
    svc.lines = out


def _day_crash(rng: random.Random, svc: _Service, begin: datetime, end: datetime) -> None:
    """The service fails most requests from ``begin``, in its own language's words."""
    if svc.fmt in ("log4j", "json"):
        _crash(rng, svc, begin, end)
        return
    logger = svc.loggers[0]
    if svc.fmt == "python":
        head, trace = rng.choice(_CRASH_PY)
        trace = tuple(x.format(svc=svc.name) for x in trace)
    else:
        head, trace = "POST /v1/{res} failed (request {uuid})", (
            rng.choice(_CRASH_GO).format(svc=svc.name),)
    for t in [begin, *_poisson(rng, begin, end, rng.uniform(2.0, 6.0))]:
        svc.lines.append(_Line(t, "ERROR", logger, _fill(rng, head), trace))


def _write_fluentbit(folder: Path, services: list[_Service]) -> Path:
    """One stream of the whole cluster, as Fluent Bit's Kubernetes filter writes it: each
    physical line of a container (a traceback's too) is a record of its own."""
    rows: list[tuple[datetime, _Service, str]] = []
    for svc in services:
        svc.lines.sort(key=lambda x: x.time)
        writer = _WRITERS[svc.fmt]
        rows += [(line.time, svc, part) for line in svc.lines
                 for part in writer(svc, line).split("\n")]
    rows.sort(key=lambda r: r[0])  # stable: a line's continuation stays right after it
    path = folder / "cluster.fluentbit.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for t, svc, text in rows:
            obj = {
                "date": f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond:06d}000Z",
                "log": text + "\n",
                "stream": "stdout",
                "kubernetes": {"pod_name": svc.host, "container_name": svc.name,
                               "host": f"10.0.{svc.pid % 7}.{svc.pid % 250 + 2}",
                               "namespace_name": "default", "labels": {"app": svc.name}},
            }
            fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return path


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
    # logback's MDC of an instrumented service, as TraceID: <hex> SpanID: <hex>
    ids = f"TraceID: {line.trace_id} SpanID: {line.trace_id[-16:]} " if line.trace_id else ""
    text = f"{stamp} {line.level:<5} [{thread}] {line.logger} - {ids}{line.message}"
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
    if line.trace_id:
        obj["trace_id"] = line.trace_id
    return json.dumps(obj, separators=(",", ":"))


_SYSLOG_SEVERITY = {"DEBUG": 7, "INFO": 6, "WARN": 4, "ERROR": 3}


def _syslog(svc: _Service, line: _Line) -> str:
    t = line.time
    pri = 16 * 8 + _SYSLOG_SEVERITY[line.level]  # facility local0
    stamp = f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"
    message = line.message + (f" at {line.trace[0]}" if line.trace else "")
    return f"<{pri}>1 {stamp} {svc.host} {svc.name} {svc.pid} - - {message}"


_PY_LEVEL = {"DEBUG": "DEBUG", "INFO": "INFO", "WARN": "WARNING", "ERROR": "ERROR"}


def _python(svc: _Service, line: _Line) -> str:
    # logging.basicConfig(format="%(asctime)s %(levelname)-8s %(name)s: %(message)s");
    # a traceback follows on its own lines, as logger.exception writes it
    t = line.time
    stamp = f"{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}"
    # OpenTelemetry's logging instrumentation adds the span's ids to the format
    ids = (f"[trace_id={line.trace_id} span_id={line.trace_id[-16:]}] " if line.trace_id
           else "")
    text = f"{stamp} {_PY_LEVEL[line.level]:<8} {line.logger}: {ids}{line.message}"
    return "\n".join([text, *line.trace])


_LOGFMT_LEVEL = {"DEBUG": "debug", "INFO": "info", "WARN": "warning", "ERROR": "error"}


def _logfmt(svc: _Service, line: _Line) -> str:
    # logrus' TextFormatter with full timestamps; the logger is the caller's file:line
    t = line.time
    stamp = f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"
    message = json.dumps(line.message, ensure_ascii=False)
    text = (f'time="{stamp}" level={_LOGFMT_LEVEL[line.level]} msg={message} '
            f'caller="{line.logger}"')
    if line.trace:
        text += f" error={json.dumps(line.trace[-1], ensure_ascii=False)}"
    if line.trace_id:
        text += f" trace_id={line.trace_id}"
    return text


_WRITERS: dict[Format, Callable[[_Service, _Line], str]] = {
    "log4j": _log4j, "json": _json, "syslog": _syslog, "python": _python, "logfmt": _logfmt,
}
