"""Structured records: JSON lines, Docker json-file wrappers and logfmt.

They share one field vocabulary (``ts``/``time``/``@timestamp``, ``level``/``severity``,
``msg``/``message``, ``service``/``app``); whatever is not one of those
stays in ``attributes`` untouched.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Protocol

from streams.clean.jsontext import loads
from streams.clean.levels import normalize_level
from streams.clean.parsed import Parsed
from streams.clean.timestamps import TimeResolver, exact_instant, from_number, match_leading
from streams.records import LogFormat

_TS_KEYS = ("@timestamp", "timestamp", "ts", "time", "datetime", "date", "asctime", "@t", "t")
_LEVEL_KEYS = (
    "level",
    "severity",
    "lvl",
    "loglevel",
    "log.level",
    "levelname",
    "@l",
    "severity_text",
)
_MSG_KEYS = ("message", "msg", "@m", "@mt", "event", "text", "log")
_SERVICE_KEYS = (
    "service",
    "service.name",
    "service_name",
    "app",
    "application",
    "app_name",
    "component",
)
_LOGFMT_PAIR = re.compile(r"([A-Za-z_][\w.\-/@]*)=(?:\"((?:[^\"\\]|\\.)*)\"|(\S*))")
_LOGFMT_ESCAPE = re.compile(r"\\(.)")
_DOCKER_KEYS = frozenset(("log", "stream", "time", "attrs"))


def _dotted(keys: tuple[str, ...]) -> tuple[tuple[str, ...] | None, ...]:
    """Each key's (outer, inner) when it has a dot, None otherwise: split once, not per record."""
    return tuple(tuple(key.split(".", 1)) if "." in key else None for key in keys)


_TS_DOTTED, _LEVEL_DOTTED, _SERVICE_DOTTED = (
    _dotted(_TS_KEYS), _dotted(_LEVEL_KEYS), _dotted(_SERVICE_KEYS))

# (key to read, inner key or None) of a field's keys that an object of some keys holds
_Candidates = tuple[tuple[str, str | None], ...]
MAX_SHAPES = 1024  # key sets remembered with their candidates; records of a source share one


def _candidates(present: dict[str, Any], keys: tuple[str, ...],
                dotted: tuple[tuple[str, ...] | None, ...]) -> _Candidates:
    """Which of ``keys`` an object with the keys ``present`` may hold, in order: the key
    itself, or for "log.level" without it the outer "log" (read as a dict at the time)."""
    out: list[tuple[str, str | None]] = []
    for key, split in zip(keys, dotted, strict=True):
        if key in present:
            out.append((key, None))
        elif split is not None and split[0] in present:
            out.append((split[0], split[1]))
    return tuple(out)


_SHAPES: dict[tuple[str, ...], tuple[_Candidates, _Candidates, _Candidates]] = {}


def _shape(obj: dict[str, Any]) -> tuple[_Candidates, _Candidates, _Candidates]:
    """The time, level and service candidates of ``obj``'s keys: the keys of a source's
    records repeat, so each set of them is looked at once rather than on every record."""
    keys = tuple(obj)
    hit = _SHAPES.get(keys)
    if hit is None:
        if len(_SHAPES) >= MAX_SHAPES:
            _SHAPES.clear()
        hit = _SHAPES[keys] = (_candidates(obj, _TS_KEYS, _TS_DOTTED),
                               _candidates(obj, _LEVEL_KEYS, _LEVEL_DOTTED),
                               _candidates(obj, _SERVICE_KEYS, _SERVICE_DOTTED))
    return hit


def _present(obj: dict[str, Any], candidates: _Candidates) -> Iterator[tuple[Any, str | None]]:
    """(value, top-level key to drop) of each of a field's keys that ``obj`` holds, in
    order: "log.level" also reads obj["log"]["level"]."""
    for key, inner in candidates:
        if inner is None:
            yield obj[key], key
        else:
            nested = obj[key]
            if isinstance(nested, dict) and inner in nested:
                yield nested[inner], None


class TextParser(Protocol):
    """The line-format parser that text inside JSON goes back to (``FormatParser``)."""

    @property
    def times(self) -> TimeResolver: ...

    def parse(self, text: str) -> Parsed: ...


class StructuredParser:
    """JSON, Docker and logfmt parsing; text inside them goes back to the format parser."""

    def __init__(self, formats: TextParser) -> None:
        self._formats = formats

    def json_or_docker(self, text: str, obj: Any = None) -> Parsed | None:
        """A JSON record (``obj``: its object, when decoded already) or a Docker one."""
        if obj is None:
            try:
                obj = loads(text)
            except ValueError:
                return None
        if not isinstance(obj, dict):
            return None
        log = obj.get("log")
        if (
            isinstance(log, str)
            and ("stream" in obj or "time" in obj)
            and obj.keys() <= _DOCKER_KEYS
        ):
            return self._docker(obj, log)
        return self.fields("json", obj, text)

    def logfmt(self, line: str) -> Parsed | None:
        pairs: dict[str, Any] = {}
        pos = 0
        for m in _LOGFMT_PAIR.finditer(line):
            if line[pos : m.start()].strip():  # prose between pairs: not logfmt
                break
            quoted = m[2]
            if quoted is None:
                pairs[m[1]] = m[3]
            else:  # most quoted values hold no escape: no substitution to run
                pairs[m[1]] = _LOGFMT_ESCAPE.sub(r"\1", quoted) if "\\" in quoted else quoted
            pos = m.end()
        if len(pairs) < 2 or not line.startswith(next(iter(pairs))):
            return None
        parsed = self.fields("logfmt", pairs, line)
        rest = line[pos:].strip()
        if rest:
            parsed.attributes["_rest"] = rest
        return parsed

    def fields(self, fmt: LogFormat, obj: dict[str, Any], text: str) -> Parsed:
        """Map a flat key/value record (JSON object or logfmt pairs) to a Parsed."""
        attrs = dict(obj)
        parsed = Parsed(fmt, "")
        times, levels, services = _shape(obj)
        for value, drop in _present(obj, times):
            if self._set_time(parsed, value):
                if drop:
                    attrs.pop(drop, None)
                break
        for value, drop in _present(obj, levels):
            level = normalize_level(value)
            if level is not None:
                parsed.level = level
                if drop:
                    attrs.pop(drop, None)
                break
        for value, drop in _present(obj, services):
            if isinstance(value, str) and value:
                parsed.service = value
                if drop:
                    attrs.pop(drop, None)
                break
            if isinstance(value, dict) and isinstance(value.get("name"), str):
                parsed.service = value["name"]  # ECS: {"service": {"name": ...}}
                if len(value) == 1 and drop:
                    attrs.pop(drop, None)
                break
        for key in _MSG_KEYS:
            value = obj.get(key)
            if isinstance(value, str):
                parsed.message = value
                attrs.pop(key, None)
                break
        else:
            parsed.message = text  # no message field: the record itself is the message
        parsed.attributes = attrs
        return parsed

    def _set_time(self, parsed: Parsed, value: Any) -> bool:
        if isinstance(value, bool):
            return False
        if isinstance(value, int | float):
            parsed.timestamp = from_number(float(value))
            return parsed.timestamp is not None
        if not isinstance(value, str) or not value:
            return False
        if value.isdigit():
            parsed.timestamp = from_number(float(value))
            return parsed.timestamp is not None
        exact = exact_instant(value)
        if exact is not None:
            parsed.stamp, parsed.timestamp = exact
            return True
        stamp = match_leading(value.strip())
        if stamp is None:
            return False
        parsed.stamp = stamp
        parsed.timestamp, parsed.timestamp_rule = self._formats.times.resolve(stamp)
        return parsed.timestamp is not None

    def _outer_time(self, time_value: Any) -> datetime | None:
        """Docker's ``time`` as an exact UTC time; None if it is not one."""
        if not isinstance(time_value, str):
            return None
        exact = exact_instant(time_value)
        if exact is not None:
            return exact[1]
        stamp = match_leading(time_value)
        if stamp is not None and stamp.offset is not None:
            return self._formats.times.resolve(stamp)[0]
        return None

    def _docker(self, obj: dict[str, Any], log: str) -> Parsed:
        """Docker json-file: the inner ``log`` is parsed as any record; ``time`` is exact UTC."""
        inner_text = log.rstrip("\r\n")
        inner = self._formats.parse(inner_text)
        # the wrapper's time is read only when the line's own time is missing or completed
        needs_outer = inner.timestamp is None or bool(inner.timestamp_rule)
        outer = self._outer_time(obj.get("time")) if needs_outer else None
        inner_format = inner.format
        parsed = inner
        parsed.format = "docker"
        stamp = inner.stamp
        if outer is not None:
            if stamp is not None:
                ts, rule = self._formats.times.on_wrapper_date(stamp, outer)
                if inner.timestamp is None or abs(ts - outer).total_seconds() < 86400:
                    parsed.timestamp, parsed.timestamp_rule = ts, rule
                    parsed.attributes.pop("time_of_day", None)
            else:
                parsed.timestamp, parsed.timestamp_rule = outer, None
        attributes: dict[str, Any] = {"inner_format": inner_format}
        if "stream" in obj:
            attributes["stream"] = obj["stream"]
        if "attrs" in obj:
            attributes["docker_attrs"] = obj["attrs"]
        attributes.update(parsed.attributes)
        parsed.attributes = attributes
        return parsed
