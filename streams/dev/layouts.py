"""Generated log lines in documented layouts that ../shared/data does not contain.

Each layout is written from its format's documentation (Android logcat
``threadtime``, Apache ``LogFormat`` combined, nginx ``error_log``, Go's ``log``
flags, glog/klog's header, Python ``logging`` format strings, PostgreSQL
``log_line_prefix``, Redis's log line, MySQL 8 error log, journalctl ``-o
short-iso``, log4j2 ``%d{ISO8601_OFFSET_DATE_TIME_HHCMM}``, epoch columns, CSV), never
copied from a data set. Every line comes with its truth: the UTC time it states (to
the millisecond) and the level it states (``None`` when the layout has none), so
the bench and the tests can check what the clean stage understood.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from streams.records import Level

_MON = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MESSAGES = (
    "connection to {host} refused after {n} ms",
    "request {n} finished in {n} ms",
    "cache miss for key user:{n}",
    "worker {n} started",
    "retrying upload of chunk {n}",
    "queue depth is {n}",
    "checkpoint {n} written",
    "slow query took {n} ms",
)
_HOSTS = ("db-1", "api-2", "cache-3", "10.0.4.7")
_TAGS = ("WindowManager", "ActivityManager", "NetworkMonitor", "PackageManager")
_LOGGERS = ("com.example.billing.InvoiceService", "org.acme.http.Server", "io.app.Worker")
_PY_LOGGERS = ("app.db", "app.http", "root", "celery.worker")
_UNITS = ("sshd", "systemd", "kubelet", "cron")

# (level word as the layout writes it, truth) per layout family
_STD: tuple[tuple[str, Level], ...] = (
    ("DEBUG", "DEBUG"),
    ("INFO", "INFO"),
    ("INFO", "INFO"),
    ("WARN", "WARN"),
    ("ERROR", "ERROR"),
)


@dataclass(frozen=True, slots=True)
class Line:
    """A generated line and what it states."""

    text: str
    time: str  # UTC ISO-8601 with milliseconds, as the clean stage writes it
    level: Level | None


@dataclass(frozen=True, slots=True)
class Layout:
    """A documented layout: its name and a line maker (random source, UTC time) -> Line."""

    name: str
    make: Callable[[random.Random, datetime], Line]


def _iso_ms(t: datetime) -> str:
    t = t.astimezone(UTC)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"


def _msg(rng: random.Random) -> str:
    return rng.choice(_MESSAGES).format(host=rng.choice(_HOSTS), n=rng.randint(1, 9999))


def _ms(t: datetime) -> str:
    return f"{t.microsecond // 1000:03d}"


def _logcat(rng: random.Random, t: datetime) -> Line:
    letter, level = rng.choice(
        (("V", "DEBUG"), ("D", "DEBUG"), ("I", "INFO"), ("W", "WARN"), ("E", "ERROR"))
    )
    pid, tid = rng.randint(100, 32000), rng.randint(100, 32000)
    text = (
        f"{t:%m-%d %H:%M:%S}.{_ms(t)} {pid:>5} {tid:>5} {letter} {rng.choice(_TAGS)}: {_msg(rng)}"
    )
    return Line(text, _iso_ms(t), level)  # type: ignore[arg-type]


def _apache_combined(rng: random.Random, t: datetime) -> Line:
    status = rng.choice((200, 200, 200, 304, 404, 403, 500, 503))
    level: Level = "ERROR" if status >= 500 else "WARN" if status >= 400 else "INFO"
    local = t.astimezone(timezone(timedelta(hours=-7)))
    text = (
        f"192.0.2.{rng.randint(1, 254)} - {rng.choice(('-', 'frank'))} "
        f"[{local:%d}/{_MON[local.month - 1]}/{local:%Y:%H:%M:%S} -0700] "
        f'"GET /api/items/{rng.randint(1, 999)} HTTP/1.1" {status} {rng.randint(0, 99999)} '
        f'"https://example.com/start" "Mozilla/5.0 (X11; Linux x86_64)"'
    )
    return Line(text, _iso_ms(t.replace(microsecond=0)), level)


def _nginx_error(rng: random.Random, t: datetime) -> Line:
    word, level = rng.choice(
        (
            ("info", "INFO"),
            ("notice", "NOTICE"),
            ("warn", "WARN"),
            ("error", "ERROR"),
            ("crit", "FATAL"),
        )
    )
    pid = rng.randint(100, 9999)
    text = (
        f"{t:%Y/%m/%d %H:%M:%S} [{word}] {pid}#{pid}: *{rng.randint(1, 999)} {_msg(rng)}, "
        f'client: 192.0.2.9, server: example.com, request: "GET / HTTP/1.1"'
    )
    return Line(text, _iso_ms(t.replace(microsecond=0)), level)  # type: ignore[arg-type]


def _go_log(rng: random.Random, t: datetime) -> Line:
    # log.LstdFlags | log.Lmicroseconds | log.Lshortfile: no level in the standard logger
    text = f"{t:%Y/%m/%d %H:%M:%S}.{t.microsecond:06d} main.go:{rng.randint(10, 400)}: {_msg(rng)}"
    return Line(text, _iso_ms(t), None)


def _glog(rng: random.Random, t: datetime) -> Line:
    letter, level = rng.choice((("I", "INFO"), ("I", "INFO"), ("W", "WARN"), ("E", "ERROR")))
    text = (
        f"{letter}{t:%m%d %H:%M:%S}.{t.microsecond:06d} {rng.randint(1, 99999):>7} "
        f"controller.go:{rng.randint(10, 999)}] {_msg(rng)}"
    )
    return Line(text, _iso_ms(t), level)  # type: ignore[arg-type]


def _python(rng: random.Random, t: datetime) -> Line:
    # "%(asctime)s %(levelname)-8s %(name)s: %(message)s"
    word, level = rng.choice(
        (("DEBUG", "DEBUG"), ("INFO", "INFO"), ("WARNING", "WARN"), ("ERROR", "ERROR"))
    )
    text = f"{t:%Y-%m-%d %H:%M:%S},{_ms(t)} {word:<8} {rng.choice(_PY_LOGGERS)}: {_msg(rng)}"
    return Line(text, _iso_ms(t), level)  # type: ignore[arg-type]


def _postgres(rng: random.Random, t: datetime) -> Line:
    # log_line_prefix = '%m [%p] ': milliseconds and the zone name, then the pid
    word, level = rng.choice(
        (
            ("LOG", "INFO"),
            ("LOG", "INFO"),
            ("WARNING", "WARN"),
            ("ERROR", "ERROR"),
            ("FATAL", "FATAL"),
        )
    )
    text = f"{t:%Y-%m-%d %H:%M:%S}.{_ms(t)} UTC [{rng.randint(100, 99999)}] {word}:  {_msg(rng)}"
    return Line(text, _iso_ms(t), level)  # type: ignore[arg-type]


def _redis(rng: random.Random, t: datetime) -> Line:
    # pid:role day Mon year time.ms mark msg; the mark (. - * #) is a verbosity, not a level name
    role = rng.choice("MCSX")
    text = (
        f"{rng.randint(1, 9999)}:{role} {t:%d} {_MON[t.month - 1]} {t:%Y %H:%M:%S}.{_ms(t)} "
        f"{rng.choice('.-*#')} {_msg(rng)}"
    )
    return Line(text, _iso_ms(t), None)


def _mysql(rng: random.Random, t: datetime) -> Line:
    word, level = rng.choice((("Note", "INFO"), ("Warning", "WARN"), ("ERROR", "ERROR")))
    text = (
        f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond:06d}Z {rng.randint(0, 99)} [{word}] "
        f"[MY-0{rng.randint(10000, 13999)}] [Server] {_msg(rng)}"
    )
    return Line(text, _iso_ms(t), level)  # type: ignore[arg-type]


def _journald(rng: random.Random, t: datetime) -> Line:
    local = t.astimezone(timezone(timedelta(hours=1)))
    unit = rng.choice(_UNITS)
    text = f"{local:%Y-%m-%dT%H:%M:%S%z} node-7 {unit}[{rng.randint(2, 65000)}]: {_msg(rng)}"
    return Line(text, _iso_ms(t.replace(microsecond=0)), None)


def _log4j_iso_zone(rng: random.Random, t: datetime) -> Line:
    # %d{ISO8601_OFFSET_DATE_TIME_HHCMM} %-5p [%t] %c - %m
    word, level = rng.choice(_STD)
    local = t.astimezone(timezone(timedelta(hours=5, minutes=30)))
    zone = local.strftime("%z")
    thread = f"pool-{rng.randint(1, 9)}-thread-{rng.randint(1, 9)}"
    text = (
        f"{local:%Y-%m-%dT%H:%M:%S},{_ms(local)}{zone[:3]}:{zone[3:]} {word:<5} "
        f"[{thread}] {rng.choice(_LOGGERS)} - {_msg(rng)}"
    )
    return Line(text, _iso_ms(t), level)


def _epoch_seconds(rng: random.Random, t: datetime) -> Line:
    word, level = rng.choice(_STD)
    text = f"{int(t.timestamp())} {rng.choice(_HOSTS)} {word} {_msg(rng)}"
    return Line(text, _iso_ms(t.replace(microsecond=0)), level)


def _epoch_millis(rng: random.Random, t: datetime) -> Line:
    word, level = rng.choice(_STD)
    millis = int(t.timestamp()) * 1000 + t.microsecond // 1000
    text = f"req-{rng.randint(1000, 9999)} {millis} {word.lower()} {_msg(rng)}"
    return Line(text, _iso_ms(t), level)


def _csv(rng: random.Random, t: datetime) -> Line:
    word, level = rng.choice(_STD)
    text = (
        f"{rng.randint(1, 10**6)},{t:%Y-%m-%dT%H:%M:%S}.{_ms(t)}Z,{word},"
        f'{rng.choice(_UNITS)},"{_msg(rng)}"'
    )
    return Line(text, _iso_ms(t), level)


LAYOUTS: tuple[Layout, ...] = (
    Layout("logcat", _logcat),
    Layout("apache-combined", _apache_combined),
    Layout("nginx-error", _nginx_error),
    Layout("go-log", _go_log),
    Layout("glog", _glog),
    Layout("python-logging", _python),
    Layout("postgresql", _postgres),
    Layout("redis", _redis),
    Layout("mysql-error", _mysql),
    Layout("journald-short-iso", _journald),
    Layout("log4j-iso-zone", _log4j_iso_zone),
    Layout("epoch-seconds", _epoch_seconds),
    Layout("epoch-millis", _epoch_millis),
    Layout("csv-time-column", _csv),
)


def generate(layout: Layout, n: int, *, start: datetime, seed: int = 0) -> list[Line]:
    """``n`` lines of ``layout``, a few seconds apart from ``start`` (aware), reproducible."""
    rng = random.Random(f"{layout.name}:{seed}")
    t = start.astimezone(UTC)
    out: list[Line] = []
    for _ in range(n):
        t += timedelta(milliseconds=rng.randint(1, 5000))
        out.append(layout.make(rng, t))
    return out
