"""Split a byte stream into logical records: one log event each, multi-line joined.

A line *starts* a record when it opens with something a log event opens with: a
timestamp (bare or in brackets), a syslog header, a JSON object, a level word, a
``key=`` pair. Other lines continue the record before them: Java stack traces
(``\\tat ...``, ``Caused by: ...``, ``... 12 more``), indented lines, exception
messages. Bytes stay bytes: decoding (and dead-lettering what does not decode) is
the cleaner's job, so nothing is lost here.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from streams.errors import InputError

logger = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
READ_CHUNK = 1 << 20  # read very long lines in 1 MiB pieces

_MON = rb"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_LEVEL = (
    rb"(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|SEVERE|FATAL|CRITICAL|CRIT|ALERT"
    rb"|EMERG|PANIC|FINE|FINER|FINEST)"
)
_STAMP = (
    b"(?:"
    + b"|".join(
        (
            rb"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}",  # 2015-10-18, 2005.06.03, 2017/05/16
            rb"\d{8}(?:[-T ]\d{1,2}:\d{1,2}|T?\d{4})",  # 20171223-22:15, 20171223T2215
            rb"\d{6} \d{6}(?!\d)",  # 081109 203615 (HDFS)
            rb"\d{1,2}:\d{2}:\d{2}",  # 17:26:48.079 (time of day)
            rb"\d{1,2}[/ -]" + _MON + rb"[/ -]\d{4}",  # 04/Dec/2005
            rb"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun),? (?:\d{1,2} )?" + _MON,  # Sun Dec 04, Sun, 04 Dec
            _MON + rb" +\d{1,2} (?:\d{4} )?\d{2}:\d{2}:\d{2}",  # Jun 14 15:16:01 (syslog)
        )
    )
    + b")"
)
_START = re.compile(
    rb"(?:"
    + _STAMP
    + rb"|\["
    + _STAMP  # [2016-12-19 20:39:48,918], [Sun Dec 04 ...]
    + rb"|<\d{1,3}>"  # syslog PRI
    + rb"|\{"  # JSON object
    + rb"|\[?"
    + _LEVEL
    + rb"\b"  # INFO ..., [ERROR] ...
    + rb"|[IWEF]\d{4} \d{2}:"  # glog
    + rb"|[A-Za-z_][\w.\-]*=\S"  # logfmt key=value
    # one token (a host, a "-" label), then a date or an epoch-seconds column
    + rb"|\S{1,200} (?:\d{4}[-/.]\d{2}[-/.]\d{2}[ T]\d{2}:|1\d{9}(?:[.,]\d+)? )"
    + rb")"
)
# Lines that continue a record even where a generic line would not (stack traces).
_STRONG_CONTINUATION = re.compile(rb"(?:[ \t]|Caused by:|Suppressed:|\.\.\. \d+ (?:more|common))")
# Generic (non-start, non-trace) lines join the record before them while they stay a
# minority: at most this many per start line seen, plus a small allowance. Past that
# the source looks like bare text and every line is its own record.
WEAK_PER_START = 4
WEAK_ALLOWANCE = 8


def check_inputs(paths: Iterable[str]) -> None:
    """Fail before any work starts, naming the first path that is not a readable file.

    A run that dies on its third file has already sent the first two; "-" is stdin.
    """
    for path in paths:
        if path == "-":
            continue
        p = Path(path)
        if not p.exists():
            raise InputError(f"{path}: no such file")
        if p.is_dir():
            raise InputError(f"{path}: is a folder; name the log files in it "
                             f"(e.g. {path.rstrip('/')}/*.log)")
        if not os.access(p, os.R_OK):
            raise InputError(f"{path}: not readable (permission denied)")


def open_source(path: str) -> BinaryIO:
    """Open a file ("-" = stdin) for binary reading; gzip is detected by its magic bytes."""
    if path == "-":
        try:
            stream: BinaryIO = open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115
        except (AttributeError, OSError, io.UnsupportedOperation):
            stream = sys.stdin.buffer
    else:
        stream = open(path, "rb")  # noqa: SIM115
    peek = getattr(stream, "peek", None)
    head = peek(2)[:2] if peek is not None else b""
    if head == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]
    return stream


def is_record_start(line: bytes) -> bool:
    """Whether a (non-empty, unindented) line opens a new log event."""
    return _START.match(line) is not None


@dataclass(frozen=True)
class RawRecord:
    """One logical record as read: its first line, bytes, whole size and (when cut) hash.

    ``data`` is the whole record unless ``size`` is larger: then it holds the first
    ``max_record_bytes + 1`` bytes and ``sha256`` is the hash of the whole record, so
    an oversized record can be reported (size, hash, first bytes) without holding it.
    """

    line: int
    data: bytes
    size: int
    sha256: str | None = None

    @property
    def cut(self) -> bool:
        return self.size > len(self.data)


class _Accumulator:
    """The bytes of one record: all of them up to ``cap + 1``, past that size and hash."""

    __slots__ = ("hasher", "keep", "kept", "parts", "size")

    def __init__(self, cap: int | None) -> None:
        self.keep = None if cap is None else cap + 1
        self.parts: list[bytes] = []
        self.kept = 0
        self.size = 0
        self.hasher: Any = None

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.hasher is None and (self.keep is None or self.size <= self.keep):
            self.parts.append(data)
            self.kept += len(data)
            return
        if self.hasher is None:  # everything so far was kept: hash it, then go on
            self.hasher = hashlib.sha256(b"".join(self.parts))
        self.hasher.update(data)
        room = (self.keep or 0) - self.kept
        if room > 0:
            self.parts.append(data[:room])
            self.kept += min(room, len(data))

    def record(self, line: int) -> RawRecord:
        return RawRecord(line=line, data=b"".join(self.parts), size=self.size,
                         sha256=self.hasher.hexdigest() if self.hasher is not None else None)


def _lines(stream: BinaryIO) -> Iterator[tuple[int, bytes, bool]]:
    """(1-based line number, line or its first READ_CHUNK bytes, whether more follows).

    When more follows, the caller reads the rest with :func:`_rest_of_line` before it
    asks for the next line; a line is never held whole in memory here.
    """
    line_no = 0
    while True:
        piece = stream.readline(READ_CHUNK)
        if not piece:
            return
        line_no += 1
        if line_no == 1 and piece.startswith(UTF8_BOM):
            piece = piece[len(UTF8_BOM):]  # an encoding mark, not part of the first record
        if piece.endswith(b"\n"):
            yield line_no, piece.rstrip(b"\r\n"), False
        else:
            yield line_no, piece, True


def _rest_of_line(stream: BinaryIO, add: Callable[[bytes], None]) -> None:
    """Feed the rest of a long line (without its end of line) to ``add``, piece by piece."""
    while True:
        more = stream.readline(READ_CHUNK)
        if not more:
            return
        if more.endswith(b"\n"):
            add(more.rstrip(b"\r\n"))
            return
        add(more)


def iter_records(
    stream: BinaryIO, *, max_record_bytes: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(first line number, record bytes)`` for each logical record.

    Empty lines are skipped; CRLF and a missing final newline are fine. With
    ``max_record_bytes``, a record keeps at most that many bytes plus one: enough for
    the cleaner to dead-letter it as too large without holding gigabytes in memory.
    """
    for first_line, record in _grouped(stream, max_record_bytes):
        yield first_line, b"".join(record.parts)  # no RawRecord: its size is not asked


def iter_raw_records(
    stream: BinaryIO, *, max_record_bytes: int | None = None
) -> Iterator[RawRecord]:
    """:func:`iter_records` with each record's whole size and, when cut, its SHA-256."""
    for first_line, record in _grouped(stream, max_record_bytes):
        yield record.record(first_line)


def _grouped(stream: BinaryIO, max_record_bytes: int | None) -> Iterator[
        tuple[int, _Accumulator]]:
    """Each logical record's first line number and its bytes as they were gathered."""
    starts = 0
    weak_joined = 0
    current: _Accumulator | None = None
    first_line = 0
    for line_no, line, more in _lines(stream):
        if not more and not line.strip():
            continue
        joins = False
        start = None  # whether the line opens a record, once asked (one match a line)
        if current is not None and starts:
            if _STRONG_CONTINUATION.match(line):
                joins = True
            else:
                start = _START.match(line) is not None
                if not start and weak_joined < WEAK_ALLOWANCE + WEAK_PER_START * starts:
                    joins = True
                    weak_joined += 1
        if joins and current is not None:
            current.add(b"\n")
        else:
            if current is not None:
                yield first_line, current
            if start if start is not None else _START.match(line) is not None:
                starts += 1
            current, first_line = _Accumulator(max_record_bytes), line_no
        current.add(line)
        if more:
            _rest_of_line(stream, current.add)
    if current is not None:
        yield first_line, current
