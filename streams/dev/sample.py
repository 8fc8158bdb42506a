"""A deterministic, realistic multi-source log workload that ships with the project.

``retro demo``, integration tests and benchmarks need input on a fresh machine that
does to the pipeline what real logs do: seven formats to detect unconfigured,
multi-line Java traces, template-heavy routine traffic, a few costly records for the
slow lane, secrets and PII for the redactor, records that can only be dead-lettered.

The story (minutes after ``start``): checkout-api v1.42.0 ships at 10 with eager
retries; from 12 to 27 the payment-gateway Hikari pool is exhausted, checkout-api
times out upstream with 503s, the edge haproxy answers 503 and inventory crashes on
a null payment status; the deploy is rolled back at 24. From 35 to 45 the mailer's
spool disk is full. ``ops.psv`` and ``feedback.txt`` tell the same story;
:data:`INCIDENTS` lists what was injected so tests can check the report finds it.

Two realistic quirks are kept on purpose: each line of a Java trace in the Docker
file is its own Docker record (json-file splits on newlines), hence its own logical
record; and RFC 3164 syslog lines carry no year, which the clean stage completes by
its own rule (the current year, never in the future).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from streams.ingest.reader import iter_records, open_source
from streams.records import Severity, iso_utc

DEFAULT_START = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)  # fixed: reproducible output
SPAN = timedelta(hours=1)
MIN_RECORDS = 300  # below this the incident records would crowd out routine traffic
OVERSIZED_BYTES = 70_000  # over the default 64 KiB max_record_bytes

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJzdmMtY2hlY2tvdXQiLCJzY29wZSI6InBheW1lbnRz"
    "OndyaXRlIiwiaWF0IjoxNzk1NzcwMDAwfQ.LsGqloQAxV2bPUK5LWUPmxRl2w6Uxyiemo9f43N33Ns"
)
API_KEY = "sk-proj-R3tr0S4mpleK3yN0tRealAbCdEfGhIjKlMnOpQrStUv"
CARD = "4111 1111 1111 1111"
PG_URL = "postgres://app:s3cret@db:5432/shop"
EMAILS = ("alice.ng@example.com", "bob.k@example.org", "carol+shop@example.net", "dana@example.com")
SECRETS: tuple[str, ...] = (JWT, API_KEY, CARD, "hunter2", "s3cret", *EMAILS)
"""Every secret or PII value the sample writes; none may survive cleaning."""


@dataclass(frozen=True, slots=True)
class SampleIncident:
    """One injected incident: where it is, when (relative to the start) and how to spot it."""

    name: str
    source: str  # file name, also the record source of the clean stage
    service: str  # the service people would name; cleaned records may name a logger
    signature: str  # in the cleaned message of some of its records, and of no other there
    begin: timedelta  # offset from the sample's start
    end: timedelta
    severity: Severity

    def window(self, start: datetime | None = None) -> tuple[datetime, datetime]:
        """Absolute UTC window for a sample written with ``start``."""
        s = resolve_start(start)
        return s + self.begin, s + self.end


def _m(minutes: float) -> timedelta:
    return timedelta(minutes=minutes)


# fmt: off
INCIDENTS: tuple[SampleIncident, ...] = (
    SampleIncident("payment-gateway connection pool exhausted", "payment-gateway.log",
                   "payment-gateway", "Connection is not available", _m(12), _m(27), "critical"),
    SampleIncident("checkout-api upstream payment-gateway timeouts", "checkout-api.jsonl",
                   "checkout-api", "upstream payment-gateway timeout", _m(12), _m(27), "high"),
    SampleIncident("edge 503 responses", "edge.syslog", "haproxy", " 503 ", _m(12), _m(27), "high"),
    SampleIncident("inventory reservation NullPointerException", "inventory.log", "inventory",
                   "NullPointerException", _m(14), _m(26), "medium"),
    SampleIncident("mailer spool disk full", "worker.logfmt", "mailer",
                   "No space left on device", _m(35), _m(45), "high"),
)
# Per source: (kind, share of the file, minimum, from minute, to minute); "routine" fills the rest.
_PLANS: dict[str, tuple[tuple[str, float, int, float, float], ...]] = {
    "checkout": (("timeout", .08, 3, 12, 27), ("retry", .04, 0, 10, 24), ("order", .07, 2, 0, 60),
                 ("flags", 0, 1, 10.5, 10.6), ("declined", .015, 1, 0, 60), ("key", 0, 1, 0, .2)),
    "payment": (("trace", .012, 1, 12, 27), ("stats", .04, 0, 11, 27), ("starved", 0, 2, 13, 20),
                ("auth_timeout", .04, 2, 12, 27), ("risk", .06, 2, 0, 60),
                ("bearer", .02, 1, 0, 60)),
    "inventory": (("npe", .03, 2, 14, 26), ("startup", 0, 1, 0, .1), ("reconnect", .005, 1, 14, 26),
                  ("low", .05, 0, 0, 60)),
    "edge": (("503", .12, 3, 12, 27), ("down", 0, 1, 12.5, 13), ("up", 0, 1, 26.5, 27),
             ("health", .03, 2, 0, 60)),
    "worker": (("disk", .1, 3, 35, 45), ("usage", 0, 3, 30, 35), ("retry", .05, 0, 0, 60),
               ("auth", .02, 1, 0, 60)),
}
_POOL = "com.zaxxer.hikari.pool.HikariPool"
_SPRING = {  # kind: level, thread, logger, message ({...} filled per record)
    "stats": ("DEBUG", "HikariPool-1 housekeeper", _POOL,
              "HikariPool-1 - Pool stats (total=10, active=10, idle=0, waiting={waiting})"),
    "starved": ("WARN", "HikariPool-1 housekeeper", _POOL,
                "HikariPool-1 - Thread starvation or clock leap detected (delta=1m4s)."),
    "bearer": ("DEBUG", "{thread}", "c.s.payment.client.PspClient",
               "POST https://psp.example.net/v1/authorizations Authorization: Bearer " + JWT),
    "completed": ("INFO", "{thread}", "o.s.web.servlet.DispatcherServlet",
                  "Completed 200 OK in {ms}ms"),
    "trace": ("ERROR", "{thread}", "c.s.payment.AuthorizationService",
              "authorization failed for order {order}"),
}
_LOGFMT = {  # kind: level, service, the pairs after them
    "disk": ("error", "mailer", 'msg="spool write failed: [Errno 28] No space left on device" '
             "path=/var/spool/mailer/q/{id}.eml"),
    "usage": ("warn", "mailer", 'msg="disk usage high" mount=/var/spool used_pct={pct}'),
    "retry": ("warn", "mailer", 'msg="retrying send" attempt={attempt} msg_id={id} '
              'err="dial tcp 10.0.3.17:587: i/o timeout"'),
    "auth": ("debug", "mailer", 'msg="smtp auth" host=smtp.example.net user=mailer '
             "password=hunter2"),
    "sent": ("info", "mailer", 'msg="message sent" msg_id={id}{to} duration_ms={ms}'),
    "indexed": ("info", "search-indexer", 'msg="batch indexed" docs={docs} took_ms={ms}'),
}
_OPS = (  # minute, level, service, operation, detail, outcome, actor
    (10.0, "INFO", "checkout-api", "deploy", "v1.42.0", "started", EMAILS[3]),
    (10.8, "INFO", "checkout-api", "deploy", "v1.42.0", "completed", EMAILS[3]),
    (13.1, "WARN", "payment-gateway", "alert", "HikariPoolExhausted", "firing", "alertmanager"),
    (14.0, "WARN", "edge", "alert", "HTTP5xxRateHigh", "firing", "alertmanager"),
    (19.0, "INFO", "payment-gateway", "scale", "replicas 3 -> 6", "completed", "sam"),
    (24.0, "WARN", "checkout-api", "rollback", "v1.42.0 -> v1.41.3", "started", EMAILS[3]),
    (25.5, "INFO", "checkout-api", "rollback", "v1.42.0 -> v1.41.3", "completed", EMAILS[3]),
    (28.0, "INFO", "payment-gateway", "alert", "HikariPoolExhausted", "resolved", "alertmanager"),
    (36.0, "WARN", "mailer", "alert", "DiskFull /var/spool", "firing", "alertmanager"),
    (44.0, "INFO", "mailer", "disk-cleanup", "/var/spool/mailer purged 18 GiB", "completed", "sam"),
    (46.0, "INFO", "mailer", "alert", "DiskFull /var/spool", "resolved", "alertmanager"),
)
_FEEDBACK = (
    "checkout page keeps spinning", "payment failed twice, then I gave up",
    "got a 503 error when I clicked pay", "the site is slow today",
    "love the new product pages!", "my order shows reserved but no payment confirmation",
    "why was I charged twice? card {card}", "please contact me at {email} about my stuck order",
    "never received the order confirmation email", "search works great, checkout does not",
    "cart emptied itself after the error", "it works now, thanks",
    "delivery estimate looks wrong for my area", "app crashed on the payment step",
)
_HIKARI_FRAMES = (
    "com.zaxxer.hikari.pool.HikariPool.createTimeoutException(HikariPool.java:696)",
    "com.zaxxer.hikari.pool.HikariPool.getConnection(HikariPool.java:197)",
    "com.zaxxer.hikari.pool.HikariPool.getConnection(HikariPool.java:162)",
    "com.zaxxer.hikari.HikariDataSource.getConnection(HikariDataSource.java:128)",
    "org.springframework.jdbc.datasource.DataSourceUtils.fetchConnection(DataSourceUtils.java:160)",
    "org.springframework.jdbc.core.JdbcTemplate.execute(JdbcTemplate.java:376)",
    "com.shop.payment.LedgerRepository.insertAuthorization(LedgerRepository.java:88)",
    "com.shop.payment.AuthorizationService.authorize(AuthorizationService.java:141)",
    "com.shop.payment.PaymentController.authorize(PaymentController.java:57)",
    "java.base/java.lang.Thread.run(Thread.java:833)",
)
_HIKARI_EXC = ("java.sql.SQLTransientConnectionException: HikariPool-1 - Connection is not "
               "available, request timed out after 30000ms.")
_INVENTORY_FRAMES = (
    "com.shop.inventory.StockService.reserve(StockService.java:142)",
    "com.shop.inventory.ReservationListener.onOrderPlaced(ReservationListener.java:61)",
    "jdk.internal.reflect.GeneratedMethodAccessor88.invoke(Unknown Source)",
    "java.base/java.lang.reflect.Method.invoke(Method.java:568)",
    "org.springframework.kafka.listener.adapter.MessagingMessageListenerAdapter.invokeHandler("
    "MessagingMessageListenerAdapter.java:380)",
    "org.springframework.kafka.listener.KafkaMessageListenerContainer$ListenerConsumer"
    ".doInvokeOnMessage(KafkaMessageListenerContainer.java:2925)",
    "java.base/java.util.concurrent.ThreadPoolExecutor.runWorker(ThreadPoolExecutor.java:1136)",
    "java.base/java.util.concurrent.ThreadPoolExecutor$Worker.run(ThreadPoolExecutor.java:635)",
    "java.base/java.lang.Thread.run(Thread.java:833)",
)
_INVENTORY_INFO = ("reserved {qty} x {sku} for order {order}", "released reservation for order "
                   "{order}", "stock sync completed in {ms} ms")
_NPE = ('Caused by: java.lang.NullPointerException: Cannot invoke "com.shop.inventory.PaymentStatus'
        '.isSettled()" because "status" is null')
_HAPROXY = ("{head} edge-1 haproxy[2211]: {client} [{clf}] fe_https~ {backend} {timing} {status} "
            '{size} - - {term} {conns} "{request} HTTP/1.1"')
# fmt: on
_TRACE_LINES = 2 + len(_HIKARI_FRAMES)  # ERROR line, exception, frames: one Docker record each
_PATHS = ("/api/cart", "/api/products", "/api/session", "/api/quote", "/api/checkout")
_SKUS = ("sku-10423", "sku-20871", "sku-31150", "sku-44012", "sku-58309", "sku-60077")
_UA = ("Mozilla/5.0 (X11; Linux x86_64)", "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1)", "curl/8.5")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def resolve_start(start: datetime | None) -> datetime:
    """UTC start of the hour; naive means UTC; moved earlier if the hour would cross midnight."""
    if start is None:
        return DEFAULT_START
    s = (start.replace(tzinfo=UTC) if start.tzinfo is None else start).astimezone(UTC)
    midnight = s.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    return min(s, midnight - SPAN - timedelta(seconds=1))


def _iso(t: datetime) -> str:
    return iso_utc(t)


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class SampleWriter:
    """Renders each source; every method returns its logical records in time order."""

    def __init__(self, seed: int, start: datetime) -> None:
        self.rng = random.Random(seed)
        self.start = start

    def hexid(self, bits: int = 64) -> str:
        return f"{self.rng.getrandbits(bits):0{bits // 4}x}"

    def schedule(self, n: int, source: str, size: int = 1) -> list[tuple[datetime, str]]:
        """``n`` records of ``source`` in time order: its planned kinds, ``routine`` the rest.

        An event of kind ``trace`` stands for ``size`` records (one per Docker line).
        """
        events: list[tuple[datetime, str]] = []
        used = 0
        for kind, share, minimum, lo, hi in (*_PLANS[source], ("routine", -1, 0, 0.0, 60.0)):
            count = n - used if share < 0 else max(minimum, round(n * share))
            for _ in range(count):
                offset = round(self.rng.uniform(lo * 60, hi * 60), 6)
                events.append((self.start + timedelta(seconds=offset), kind))
            used += count * (size if kind == "trace" else 1)
        events.sort()
        return events

    def checkout(self, n: int) -> list[str]:
        rng, out = self.rng, list[str]()
        for t, kind in self.schedule(n, "checkout"):
            latency = int(rng.lognormvariate(3.2, 0.6))
            rec: dict[str, object] = {"ts": _iso(t), "level": "info", "service": "checkout-api"}
            if kind == "timeout":
                msg = "upstream payment-gateway timeout after 5000ms"
                rec.update(level="error", msg=msg, status=503, path="/api/checkout")
                latency += 5000
            elif kind == "retry":
                msg = "retrying payment-gateway authorize"
                rec.update(level="warn", msg=msg, attempt=rng.randint(2, 5), backoff_ms=0)
            elif kind == "order":  # deep nesting: the slow lane's share
                items = [
                    {
                        "sku": rng.choice(_SKUS),
                        "qty": rng.randint(1, 3),
                        "price": {"amount": rng.randint(499, 19999), "currency": "EUR"},
                        "tags": rng.sample(["gift", "fragile", "promo", "bulky"], 2),
                    }
                    for _ in range(rng.randint(3, 6))
                ]
                ship = {"method": "express", "address": {"country": "DE"}}
                rec.update(msg="order submitted", order={"items": items, "shipping": ship})
            elif kind == "flags":  # a big payload: slow by length alone
                flags = {f"checkout.exp_{i:03d}": i % 3 == 0 for i in range(300)}
                rec.update(msg="feature flags snapshot", version="v1.42.0", flags=flags)
            elif kind == "declined":
                email = rng.choice(EMAILS)
                msg = f"payment declined for card {CARD} ({email})"
                rec.update(level="warn", msg=msg, customer_email=email)
            elif kind == "key":
                rec.update(msg=f"fraud-score client initialised with key {API_KEY}")
            else:
                path = rng.choice(_PATHS)
                status = rng.choices((200, 201, 204, 304, 404), (80, 6, 4, 6, 4))[0]
                method = "POST" if path == "/api/checkout" else rng.choice(("GET", "GET", "PUT"))
                rec.update(msg=f"{method} {path} {status}", status=status)
            rec.update(trace_id=self.hexid(128), latency_ms=latency)
            out.append(_dumps(rec))
        return out

    def payment(self, n: int) -> list[str]:
        rng, out = self.rng, list[str]()

        def docker(t: datetime, inner: str, stream: str = "stdout") -> None:
            ns = f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond:06d}{rng.randrange(1000):03d}Z"
            out.append(_dumps({"log": inner + "\n", "stream": stream, "time": ns}))

        for t, kind in self.schedule(n, "payment", size=_TRACE_LINES):
            thread = f"http-nio-8080-exec-{rng.randint(1, 40)}"
            values = {"thread": thread, "order": rng.randint(80000, 99999)}
            values.update(waiting=rng.randint(20, 90), ms=rng.randint(8, 90))
            if kind == "routine" and rng.random() < 0.3:
                kind = "completed"
            if kind in _SPRING:  # Spring Boot's console layout, inside the Docker JSON
                level, thread, logger, msg = (s.format(**values) for s in _SPRING[kind])
                stamp = f"{t:%Y-%m-%d %H:%M:%S}.{t.microsecond // 1000:03d}"
                thread = thread[-15:].rjust(15)  # Spring's %15.15t keeps the last 15 characters
                docker(t, f"{stamp} {level:>5} 1 --- [{thread}] {logger:<40} : {msg}")
                if kind == "trace":  # then printStackTrace(): stderr, one Docker record a line
                    trace = (_HIKARI_EXC, *(f"\tat {frame}" for frame in _HIKARI_FRAMES))
                    for i, text in enumerate(trace, 1):
                        docker(t + timedelta(microseconds=i), text, "stderr")
                continue
            rec: dict[str, object] = {  # logstash-logback JSON inside the Docker JSON
                "@timestamp": _iso(t),
                "level": "INFO",
                "logger_name": "com.shop.payment.AuthorizationService",
                "thread_name": thread,
                "app": "payment-gateway",
                "message": "authorization approved",
                "order_id": values["order"],
                "amount_cents": rng.randint(499, 60000),
            }
            if kind == "auth_timeout":
                rec.update(level="ERROR", message="authorization timed out waiting for ledger")
            elif kind == "risk":  # nested JSON inside a JSON string: the slow lane's share
                checks = [
                    {"name": c, "ok": rng.random() < 0.9, "signals": [{"w": rng.randint(1, 9)}]}
                    for c in ("cvc", "avs", "velocity", "device", "3ds")
                ]
                risk = {"score": rng.randint(1, 99), "checks": checks}
                rec.update(message="psp risk assessment", risk=risk)
            docker(t, _dumps(rec))
        return out

    def inventory(self, n: int) -> list[str]:
        rng, out = self.rng, list[str]()
        svc = "com.shop.inventory.StockService"
        for t, kind in self.schedule(n, "inventory"):
            order, sku = rng.randint(80000, 99999), rng.choice(_SKUS)
            level, logger = "INFO", svc
            if kind == "npe":  # one logical record over many lines
                level, msg = "ERROR", f"failed to reserve stock for order {order}"
                msg += f"\ncom.shop.inventory.ReservationException: reservation failed for {sku}"
                msg += "".join(f"\n\tat {frame}" for frame in _INVENTORY_FRAMES)
                msg += f"\n{_NPE}\n\tat {svc}.checkPayment(StockService.java:211)"
                msg += f"\n\tat {svc}.reserve(StockService.java:138)"
                msg += f"\n\t... {len(_INVENTORY_FRAMES) - 1} more"
            elif kind == "startup":
                logger = "com.zaxxer.hikari.HikariDataSource"
                msg = f"HikariPool-1 - Starting... jdbcUrl={PG_URL}"
            elif kind == "reconnect":
                level, msg = "WARN", f"connection reset, reconnecting to {PG_URL}"
                logger = "com.shop.inventory.db.Ledger"
            elif kind == "low":
                level, msg = "WARN", f"stock low for {sku}: {rng.randint(0, 9)} left"
            else:
                msg = rng.choice(_INVENTORY_INFO).format(
                    qty=rng.randint(1, 4), sku=sku, order=order, ms=rng.randint(80, 900)
                )
            stamp = f"{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}"
            thread = "main" if kind == "startup" else f"pool-3-thread-{rng.randint(1, 12)}"
            out.append(f"{stamp} {level:<5} [{thread}] {logger}: {msg}")
        return out

    def edge(self, n: int) -> list[str]:
        rng, out = self.rng, list[str]()
        for t, kind in self.schedule(n, "edge"):
            mon = _MONTHS[t.month - 1]
            head = f"{mon} {t.day:>2} {t:%H:%M:%S}"
            clf = f"{t.day:02d}/{mon}/{t.year}:{t:%H:%M:%S}"
            ip = f"203.0.113.{rng.randint(1, 254)}"
            client, ms = f"{ip}:{rng.randint(30000, 65000)}", f"{t.microsecond // 1000:03d}"
            line = {"head": head, "client": client, "clf": f"{clf}.{ms}"}
            if kind in ("down", "up", "health"):  # RFC 5424 with structured data
                pri, app, msg = 134, "healthd", f"check passed in {rng.randint(2, 40)}ms"
                if kind != "health":
                    state = "DOWN, reason: Layer7 timeout" if kind == "down" else "UP"
                    pri, app = (129 if kind == "down" else 133), "haproxy"
                    msg = f"Server be_payment/payment-1 is {state}"
                sd = '[check@32473 backend="be_payment"]'
                out.append(f"<{pri}>1 {_iso(t)} edge-1 {app} 2211 - {sd} {msg}")
            elif kind == "503":  # queued until the queue timeout: no server had a free slot
                q = rng.randint(200, 480)
                line.update(backend="be_checkout/<NOSRV>", timing="0/5001/-1/-1/5001", status="503")
                line.update(size="217", term="sQ--", conns=f"{q}/{q}/{q}/0/0 0/{q}")
                out.append(_HAPROXY.format(**line, request="POST /api/checkout"))
            elif rng.random() < 0.6:
                status = rng.choices(("200", "201", "304", "404"), (85, 5, 6, 4))[0]
                line.update(backend=f"be_checkout/checkout-{rng.randint(1, 3)}", status=status)
                line.update(timing=f"0/0/1/{rng.randint(3, 80)}/{rng.randint(5, 90)}", term="----")
                line.update(size=str(rng.randint(600, 60000)), conns="12/12/3/1/0 0/0")
                out.append(_HAPROXY.format(**line, request=f"GET {rng.choice(_PATHS)}"))
            else:
                asset = rng.choice(("app.js", "app.css", "logo.svg", "fonts/inter.woff2"))
                request = f'"GET /static/{asset} HTTP/2.0" 200 {rng.randint(600, 90000)}'
                agent = rng.choice(_UA)
                out.append(f'{head} edge-2 nginx: {ip} - - [{clf} +0000] {request} "-" "{agent}"')
        return out

    def worker(self, n: int) -> list[str]:
        rng, out = self.rng, list[str]()
        for t, kind in self.schedule(n, "worker"):
            if kind == "routine":
                kind = "sent" if rng.random() < 0.7 else "indexed"
            to = f" to={rng.choice(EMAILS)}" if rng.random() < 0.08 else ""
            values = {"id": self.hexid(48), "to": to, "ms": rng.randint(20, 900)}
            values.update(pct=rng.randint(95, 99), attempt=rng.randint(2, 4))
            level, service, pairs = _LOGFMT[kind]
            values["docs"] = rng.randint(50, 600)
            out.append(f"time={_iso(t)} level={level} service={service} {pairs.format(**values)}")
        return out

    def ops(self) -> list[str]:
        return [f"{_iso(self.start + _m(minute))}|{'|'.join(row)}" for minute, *row in _OPS]

    def feedback(self, n: int) -> list[str]:
        lines = [self.rng.choice(_FEEDBACK) for _ in range(n)]
        return [s.format(card=CARD, email=self.rng.choice(EMAILS)) for s in lines]

    def garbage(self) -> list[bytes]:
        """NUL-filled bytes (a crash mid-write), Latin-1 text, and one line over 64 KiB."""
        t = self.start + _m(31)
        nul = bytes(self.rng.choice((0, 0, 0, 1, 2, 7, 0xFF, 0xFE)) for _ in range(256))
        latin = "Crème brûlée, café, señor, Ünïcödé: import désactivé à côté".encode("latin-1")
        head = f"{t:%Y-%m-%d %H:%M:%S},000 WARN  [import-1] com.shop.catalog.Importer: "
        blob = "0123456789abcdef" * (OVERSIZED_BYTES // 16)
        big = {"ts": _iso(t), "level": "debug", "msg": "cache dump", "blob": blob}
        return [nul, head.encode() + latin, _dumps(big).encode()]


def write_sample(
    directory: Path,
    *,
    records: int = 3000,
    seed: int = 7,
    start: datetime | None = None,
    include_bad: bool = True,
) -> list[Path]:
    """Write the sample into ``directory`` (created if needed) and return the file paths.

    ``records`` is the total number of logical records over all files (a joined
    stack trace is one); the same arguments always give the same bytes.
    ``include_bad`` adds ``garbage.bin.log``, whose three records can only be
    dead-lettered (binary, undecodable, too large).
    """
    if records < MIN_RECORDS:
        raise ValueError(f"records must be at least {MIN_RECORDS}, got {records}")
    gen = SampleWriter(seed, resolve_start(start))
    ops = gen.ops()
    bad = gen.garbage() if include_bad else []
    feedback_n = max(5, round(records * 0.02))
    rest = records - len(ops) - len(bad) - feedback_n
    sizes = [round(rest * share) for share in (0.36, 0.22, 0.16, 0.16)]
    texts = {
        "checkout-api.jsonl": gen.checkout(sizes[0]),
        "payment-gateway.log": gen.payment(sizes[1]),
        "inventory.log": gen.inventory(sizes[2]),
        "edge.syslog": gen.edge(sizes[3]),
        "worker.logfmt": gen.worker(rest - sum(sizes)),
        "ops.psv": ops,
        "feedback.txt": gen.feedback(feedback_n),
    }
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name, lines in texts.items():
        paths.append(directory / name)
        paths[-1].write_bytes(("\n".join(lines) + "\n").encode())
    if bad:
        paths.append(directory / "garbage.bin.log")
        paths[-1].write_bytes(b"\n".join(bad) + b"\n")
    return paths


def count_logical_records(paths: Iterable[Path | str]) -> int:
    """Logical records over all files, as the project's reader splits them."""
    total = 0
    for path in paths:
        with open_source(str(path)) as stream:
            total += sum(1 for _ in iter_records(stream))
    return total


_MULTIDAY_LINES = (
    ("INFO", "db-pool", "connection {n} checked out in {ms} ms"),
    ("WARN", "db-pool", "pool at {pct}% of max, {n} waiters"),
    ("ERROR", "db-pool", "connection to 10.0.{a}.{b}:5432 refused"),
    ("INFO", "kernel", "node{a} RAS KERNEL INFO instruction cache parity error corrected"),
    ("FATAL", "kernel", "node{a} data TLB error interrupt"),
    ("ERROR", "api", "request {n} failed: upstream timeout after {ms} ms"),
    ("INFO", "api", "GET /api/orders/{n} 200 {ms}ms"),
)


def write_multiday(directory: Path, *, records: int = 2000, days: int = 4,
                   seed: int = 11) -> list[Path]:
    """A plain-text log whose records are spread over ``days`` UTC days out of time
    order (as in a sampled or back-filled log, or one merged from several hosts), so
    nearly every batch holds records of several days' reports."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    start = DEFAULT_START.replace(hour=12, minute=0, second=0, microsecond=0)
    lines = []
    for _ in range(records):
        at = start + timedelta(seconds=rng.uniform(0, days * 86400))
        level, service, text = rng.choice(_MULTIDAY_LINES)
        message = text.format(n=rng.randint(1, 99999), ms=rng.randint(1, 9000),
                              pct=rng.randint(50, 100), a=rng.randint(0, 63),
                              b=rng.randint(1, 254))
        lines.append(f"{_iso(at)} {level} [{service}] {message}")
    path = directory / "multiday.log"
    path.write_text("\n".join(lines) + "\n")
    return [path]
