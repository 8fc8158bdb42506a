"""Format detection and parsing of one logical record, with no configuration.

Detection is a cheap dispatch on the first character followed by precompiled,
anchored regexes; structured formats (JSON, Docker, logfmt) live in
:mod:`streams.clean.structured`. Every parser returns a :class:`Parsed`; text that
fits no layout is still a record (format ``text``), never an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from streams.clean.access import parse_access
from streams.clean.infer import SourceLearner
from streams.clean.levels import BARE_LEVEL_PATTERN, normalize_level, syslog_severity
from streams.clean.parsed import Parsed
from streams.clean.structured import StructuredParser
from streams.clean.timestamps import Stamp, TimeResolver, match_leading
from streams.records import Level, LogFormat

__all__ = ["FormatParser", "Parsed"]


_NEST = r"(?:[^\[\]]|\[[^\[\]]*\])*"  # bracket content with one level of nesting
_PRE_LEVEL = re.compile(
    r"\s*(?:-\s+)?"  # log4j "%d - %p": ` - LEVEL`
    r"(?:(?P<pid>\d+)\s+)?"  # `pid LEVEL` (oslo.log, Java "%d %pid %p")
    r"(?:(?P<logger0>[A-Za-z_][\w.$]*)\s+-\s+)?"  # Python "%(name)s - %(levelname)s - ..."
    r"(?:\[(?P<thread0>" + _NEST + r")\]\s+)?"  # logback/log4j "[%t] %p"
    r"(?:(?P<level>" + BARE_LEVEL_PATTERN + r")"
    r"|\[(?:(?P<module>[\w.-]+):)?(?P<blevel>[A-Za-z]+)\])"  # [notice], [core:error]
    r"(?=[\s:,]|$)"
)
_SPRING_PID = re.compile(r"(\d+) +--- +")
_THREAD = re.compile(r"\[(" + _NEST + r")\]")
_LOGGER = re.compile(
    r"(?P<name>[A-Za-z_$][\w$]*(?P<dots>(?:\.[\w$]+)+)?)"
    r"(?:[#@](?P<line>\d+))?"
    r"(?P<sep>\s*:(?:\s+|$)|\s+-\s+|\s+|$)"
)
_THREAD_CLASS = re.compile(r"^(?P<thread>.*):(?P<cls>[A-Za-z_$][\w$]*)@(?P<line>\d+)$")
_TRAILING_LOGGER = re.compile(r"\s+\((?P<name>[A-Za-z_$][\w$]*(?:\.[\w$]+)+)\)\s*$")
_SYSLOG_TAIL = re.compile(r"(?P<host>\S+) +(?:(?P<tag>[^\s:\[]+)(?:\[(?P<pid>\d+)\])?: ?)?")
# "host tag[pid]: msg" after a full timestamp (rsyslog's RFC 3339 file format): the tag
# must end in ":" so that "ERROR Foo: msg" or "[main] x: msg" never reads as one
_SYSLOG_HOST_TAG = re.compile(
    r"(?P<host>[A-Za-z0-9][\w.-]*) +(?P<tag>/?[A-Za-z_][\w./-]*)(?:\[(?P<pid>\d+)\])?: ")
# "error: ..." right after a syslog tag: sshd, postfix, the kernel and others put the
# severity there when the priority is not in the line
_TAG_LEVEL = re.compile(r"(?P<lvl>[A-Za-z]{3,9}): ")
_RFC5424 = re.compile(
    r"<(?P<pri>\d{1,3})>(?P<ver>\d{1,2}) (?P<ts>\S+) (?P<host>\S+) (?P<app>\S+) "
    r"(?P<procid>\S+) (?P<msgid>\S+) "
    r"(?P<sd>-|(?:\[(?:[^\]\\\"]|\\.|\"(?:[^\"\\]|\\.)*\")*\])+)(?: (?P<msg>.*))?$",
    re.DOTALL,
)
_PRI = re.compile(r"<(?P<pri>\d{1,3})>")
_GLOG = re.compile(
    r"(?P<lvl>[IWEF])(?P<mo>\d{2})(?P<d>\d{2}) (?P<H>\d{2}):(?P<M>\d{2}):(?P<S>\d{2})"
    r"\.(?P<frac>\d{6}) +(?P<pid>\d+) (?P<file>[^\s:]+):(?P<line>\d+)\] ?"
)
_SERVICE_FIELD = re.compile(r"[A-Za-z_][\w.\-$/:]{0,63}$")
_GLOG_LEVEL: dict[str, Level] = {"I": "INFO", "W": "WARN", "E": "ERROR", "F": "FATAL"}
_DELIMITERS = "|\t,"


class FormatParser:
    """Detects the format of one record and parses it.

    Given the record's ``source`` (Kafka key, file or stream name), what per-record
    detection leaves empty is completed from the structure learned on that source's
    earlier lines (:mod:`streams.clean.infer`); without a source, parsing is stateless.
    """

    def __init__(
        self,
        *,
        default_year: int | None,
        default_timezone: str,
        clock: Callable[[], datetime] | None = None,
        learner: SourceLearner | None = None,
    ) -> None:
        self.times = TimeResolver(
            default_year=default_year, default_timezone=default_timezone, clock=clock
        )
        self._structured = StructuredParser(self)
        self.learner = learner if learner is not None else SourceLearner(self.times)

    def parse(self, text: str, *, source: str | None = None,
              obj: dict[str, Any] | None = None) -> Parsed:
        """Parse a decoded record; the first line carries the header, the rest joins the
        message. ``obj``: the record's JSON object, when the caller decoded it already."""
        if not text:
            return Parsed("text", "")
        first = text[0]
        if first == "{":
            parsed = self._structured.json_or_docker(text, obj)
            if parsed is not None:
                return parsed
        elif first == "<":
            parsed = self._rfc5424(text)
            if parsed is not None:
                return parsed
        head, _, tail = text.partition("\n")
        head = head.rstrip("\r")
        parsed = self.parse_line(head)
        incomplete = parsed.timestamp is None or parsed.level is None
        if source is not None and incomplete and parsed.format != "logfmt":
            self.learner.complete(source, head, parsed, self._after_stamp)
        if tail:
            parsed.message = f"{parsed.message}\n{tail}" if parsed.message else tail
        return parsed

    def parse_line(self, line: str) -> Parsed:
        """One header line: dispatch on its first character."""
        parsed: Parsed | None = None
        first = line[:1]
        if first.isdigit():
            parsed = self._digit_first(line)
        elif first == "[":
            parsed = self._bracketed(line)
        elif first == "<":
            parsed = self._syslog_pri(line)
        elif first == "-" or first.isalpha():
            parsed = self._letter_first(line)
        if parsed is None:
            parsed = self._header(line, 0, None, "text")
        if parsed is None or parsed.timestamp is None:
            access = parse_access(line, self.times)  # the time is not at the start
            if access is not None:
                return access
        elif parsed.level is None and parsed.format == "text":
            # an access line behind a collector's time ("kubectl logs --timestamps"):
            # the line's own time and the status class win, the prefix stays an attribute
            access = parse_access(parsed.message, self.times)
            if access is not None:
                access.attributes["prefix"] = line[: len(line) - len(parsed.message)].strip()
                return access
        return parsed or Parsed("text", line)

    # --- layouts ------------------------------------------------------------------

    def _digit_first(self, line: str) -> Parsed | None:
        stamp = match_leading(line)
        if stamp is None:
            return None
        nxt = line[stamp.end : stamp.end + 1]
        if nxt and nxt in _DELIMITERS:
            parsed = self._delimited(line, stamp, nxt)
            if parsed is not None:
                return parsed
        return self._header(line, stamp.end, stamp, "text")

    def _bracketed(self, line: str) -> Parsed | None:
        stamp = match_leading(line, 1)
        if stamp is not None and line[stamp.end : stamp.end + 1] == "]":
            return self._header(line, stamp.end + 1, stamp, "text")
        return None

    def _letter_first(self, line: str) -> Parsed | None:
        stamp = match_leading(line)
        if stamp is not None:
            if stamp.year is None:  # RFC 3164 syslog: "Jun 14 15:16:01 host tag[pid]: msg"
                return self._syslog_3164(line, stamp, None)
            return self._header(line, stamp.end, stamp, "text")
        if line[0] in _GLOG_LEVEL:
            m = _GLOG.match(line)
            if m is not None:
                return self._glog(line, m)
        if "=" in line:
            parsed = self._structured.logfmt(line)
            if parsed is not None:
                return parsed
        return None

    def _after_stamp(self, line: str, pos: int, stamp: Stamp | None) -> Parsed | None:
        """The header grammar after a timestamp found elsewhere than at the start."""
        while line[pos : pos + 1] in ("]", ")", ">"):
            pos += 1
        return self._header(line, pos, stamp, "text")

    def _header(self, line: str, pos: int, stamp: Stamp | None, fmt: LogFormat) -> Parsed | None:
        """Timestamp done; read `[pid] [thread] LEVEL [thread] logger: msg` in its variants."""
        m = _PRE_LEVEL.match(line, pos)
        if stamp is None and pos == 0 and m is None:
            return None  # no timestamp and no level: not a header at all
        parsed = Parsed(fmt, "")
        attrs = parsed.attributes
        if stamp is not None:
            self._apply_stamp(parsed, stamp, line)
        if m is not None:
            level = normalize_level(m["level"] or m["blevel"])
            if level is None:
                m = None
            else:
                parsed.level = level
                if m["pid"]:
                    attrs["pid"] = int(m["pid"])
                if m["module"]:
                    parsed.service = m["module"]
                if m["level"] and stamp is not None and not m["pid"]:
                    parsed.format = "log4j"  # timestamp then a bare LEVEL word
                pos = m.end()
                if m["level"]:
                    pos = self._after_level(line, pos, parsed, m["thread0"], m["logger0"])
        message = line[pos:].lstrip()
        if m is None and stamp is not None and stamp.year is not None:
            tail = _SYSLOG_HOST_TAG.match(message)
            if tail is not None and normalize_level(tail["host"]) is None:
                parsed.format = "syslog"
                parsed.service = program_name(tail["tag"])
                attrs["host"] = tail["host"]
                if tail["pid"]:
                    attrs["pid"] = int(tail["pid"])
                parsed.message = message[tail.end():]
                _level_after_tag(parsed)
                return parsed
        if "logger" not in attrs and parsed.format == "log4j":
            t = _TRAILING_LOGGER.search(message)
            if t is not None:  # log4j "%m (%c)%n": the logger in parentheses at the end
                attrs["logger"] = t["name"]
                message = message[: t.start()]
        parsed.message = message
        return parsed

    def _after_level(
        self, line: str, pos: int, parsed: Parsed, thread: str | None, logger: str | None
    ) -> int:
        attrs = parsed.attributes
        n = len(line)
        while pos < n and line[pos] in " :":
            pos += 1
        if line.startswith("- ", pos):
            pos += 2
        s = _SPRING_PID.match(line, pos)
        if s is not None:  # Spring Boot: "INFO 1 --- [main] o.s.b.App : msg"
            attrs["pid"] = int(s[1])
            pos = s.end()
        if thread is None and line.startswith("[", pos):
            t = _THREAD.match(line, pos)
            if t is not None:
                after = t.end()
                if line.startswith(" - ", after):  # log4j "[%t:%C{1}@%L] - %m"
                    thread, pos = t[1], after + 3
                elif line.startswith(" ", after):  # log4j "[%t] %c: %m"
                    lm = _LOGGER.match(line, after + 1)
                    if lm is not None and self._is_logger(lm, with_thread=True):
                        thread, pos = t[1], after + 1
        if thread is not None:
            tc = _THREAD_CLASS.match(thread)
            if tc is not None:
                thread, logger = tc["thread"], tc["cls"]
                attrs["line"] = int(tc["line"])
            attrs["thread"] = thread.strip()
        if logger is None:
            lm = _LOGGER.match(line, pos)
            if lm is not None and self._is_logger(lm, with_thread=thread is not None):
                logger = lm["name"]
                if lm["line"]:
                    attrs["line"] = int(lm["line"])
                pos = lm.end()
                if lm["sep"].isspace() and line.startswith("[", pos):
                    c = _THREAD.match(line, pos)  # oslo.log "[request context] msg"
                    if c is not None and line.startswith(" ", c.end()):
                        attrs["context"] = c[1]
                        pos = c.end() + 1
        if logger is not None:
            # a logger (a class, a package) is evidence inside a service, not a service:
            # the record's service stays its envelope's, its source's or the stream's
            attrs["logger"] = logger
        return pos

    @staticmethod
    def _is_logger(m: re.Match[str], *, with_thread: bool) -> bool:
        if m["dots"] or "$" in m["name"] or m["line"]:
            return True
        # a plain word is a logger only in "[thread] name: msg", else it is the message
        return with_thread and ":" in m["sep"]

    def _apply_stamp(self, parsed: Parsed, stamp: Stamp, line: str) -> None:
        parsed.stamp = stamp
        parsed.timestamp, parsed.timestamp_rule = self.times.resolve(stamp)
        if parsed.timestamp is None and stamp.month is None:
            parsed.attributes["time_of_day"] = line[: stamp.end].strip("[ ")

    def _delimited(self, line: str, stamp: Stamp, delim: str) -> Parsed | None:
        fields = line.split(delim)
        if len(fields) < 3:
            return None
        parsed = Parsed("delimited", "")
        self._apply_stamp(parsed, stamp, line)
        attrs = parsed.attributes
        i = 1
        while i < len(fields) - 1:
            f = fields[i].strip()
            level = normalize_level(f) if parsed.level is None else None
            if level is not None:
                parsed.level = level
            elif f.isdigit() and "pid" not in attrs:
                attrs["pid"] = int(f)
            elif parsed.service is None and _SERVICE_FIELD.match(f):
                parsed.service = f
            else:
                break
            i += 1
        if i == 1:
            return None  # no field after the time: "2016-09-28 04:30:30, Info  CBS  msg"
        parsed.message = delim.join(fields[i:]).strip()
        return parsed

    def _syslog_3164(self, line: str, stamp: Stamp, pri: int | None) -> Parsed:
        parsed = Parsed("syslog", "")
        self._apply_stamp(parsed, stamp, line)
        pos = stamp.end
        while pos < len(line) and line[pos] == " ":
            pos += 1
        m = _SYSLOG_TAIL.match(line, pos)
        if m is not None:
            parsed.attributes["host"] = m["host"]
            if m["tag"]:
                parsed.service = program_name(m["tag"])
            if m["pid"]:
                parsed.attributes["pid"] = int(m["pid"])
            pos = m.end()
        parsed.message = line[pos:]
        if pri is not None:
            _apply_pri(parsed, pri)
        elif parsed.service is not None:
            _level_after_tag(parsed)
        return parsed

    def _syslog_pri(self, line: str) -> Parsed | None:
        m = _PRI.match(line)
        if m is None:
            return None
        stamp = match_leading(line, m.end())
        if stamp is None:
            return None
        return self._syslog_3164(line, stamp, int(m["pri"]))

    def _rfc5424(self, text: str) -> Parsed | None:
        m = _RFC5424.match(text)
        if m is None:
            return None
        parsed = Parsed("syslog", (m["msg"] or "").removeprefix("\ufeff"))
        if m["ts"] != "-":
            stamp = match_leading(m["ts"])
            if stamp is not None:
                self._apply_stamp(parsed, stamp, m["ts"])
        _apply_pri(parsed, int(m["pri"]))
        attrs = parsed.attributes
        for key in ("host", "procid", "msgid", "sd"):
            if m[key] != "-":
                attrs[key] = int(m[key]) if key == "procid" and m[key].isdigit() else m[key]
        if m["app"] != "-":
            parsed.service = m["app"]
        return parsed

    def _glog(self, line: str, m: re.Match[str]) -> Parsed:
        """glog/klog: "I0129 17:26:48.079123  1234 file.go:123] msg" (no year)."""
        parsed = Parsed("text", line[m.end() :], level=_GLOG_LEVEL[m["lvl"]])
        stamp = Stamp(
            None,
            int(m["mo"]),
            int(m["d"]),
            int(m["H"]),
            int(m["M"]),
            int(m["S"]),
            int(m["frac"]),
            None,
            m.end(),
        )
        self._apply_stamp(parsed, stamp, line)
        parsed.attributes.update(pid=int(m["pid"]), file=m["file"], line=int(m["line"]))
        return parsed


def program_name(tag: str) -> str:
    """A syslog program given as a path (``/usr/sbin/cron``) is named by its file name."""
    return tag.rpartition("/")[2] or tag if tag.startswith("/") else tag


def _level_after_tag(parsed: Parsed) -> None:
    """A severity word the program put first in its message (``error: ...``)."""
    m = _TAG_LEVEL.match(parsed.message)
    if m is not None and parsed.level is None:
        parsed.level = normalize_level(m["lvl"])


def _apply_pri(parsed: Parsed, pri: int) -> None:
    if pri <= 191:
        parsed.level = syslog_severity(pri % 8)
        parsed.attributes["facility"] = pri // 8
