"""The messages that travel between stages; each has a JSON Schema in ``schemas/``.

Every message carries the raw coordinates (topic, partition, offset) of the raw
records it stands for, so the audit can prove nothing was lost or counted twice.
Offline runs (``retro clean FILE``) use the file name as topic, partition 0 and
the record number as offset.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import heapq
import operator
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from streams.errors import BadLaneRecord

Lane = Literal["fast", "slow"]
Level = Literal["TRACE", "DEBUG", "INFO", "NOTICE", "WARN", "ERROR", "FATAL"]
Severity = Literal["info", "low", "medium", "high", "critical"]
LogFormat = Literal["json", "docker", "logfmt", "log4j", "syslog", "delimited", "text"]
# what a shipper wrapped around log lines (streams/clean/envelopes.py); plain: none
EnvelopeKind = Literal[
    "otlp_json", "otlp_proto", "fluentbit", "vector", "ecs", "rsyslog", "syslog_ng", "plain"
]


def _is_none(value: object) -> bool:
    return value is None


def _is_empty(value: list[str] | dict[str, int] | dict[str, str]) -> bool:
    return not value


def _is_none(value: object) -> bool:
    return value is None


class Coordinate(Protocol):
    """What a raw coordinate is made of, whichever class reads it off the wire."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def index(self) -> int | None: ...
    @property
    def count(self) -> int | None: ...


def coord_id(coord: Coordinate) -> str:
    """"topic/partition/offset", with "/index" for a record of a multi-record message."""
    base = f"{coord.topic}/{coord.partition}/{coord.offset}"
    return base if coord.index is None else f"{base}/{coord.index}"


def wire(coord: Coordinate) -> dict[str, Any]:
    """Its JSON fields as a plain dict: inside a dict, a model costs to_json twice as
    much as the dict it stands for. ``index`` and ``count`` only when set."""
    if coord.index is None:
        return {"topic": coord.topic, "partition": coord.partition, "offset": coord.offset}
    return {"topic": coord.topic, "partition": coord.partition, "offset": coord.offset,
            "index": coord.index, "count": coord.count}


def ledger_entry(coord: Coordinate) -> tuple[str, int]:
    """(coverage key, value) a record is counted as in every ledger: the raw offset
    under "topic/partition", or for a multi-record message its index under
    "topic/partition@offset:count" (see ``streams.intervals.message_key``)."""
    if coord.index is None or coord.count is None:
        return f"{coord.topic}/{coord.partition}", coord.offset
    return f"{coord.topic}/{coord.partition}@{coord.offset}:{coord.count}", coord.index


class RawCoord(BaseModel):
    """Where a raw record lives in an input topic (or file/record number offline).

    A message that carries one log record (the common case) is its own record:
    ``topic/partition/offset``. A message that carries ``count`` > 1 records (an OTLP
    batch) gives each record an ``index`` in 0..count-1; its id gets ``/index`` and
    its ledger entry lives under the message's own key (``ledger_entry``).
    """

    model_config = ConfigDict(frozen=True)

    topic: str
    partition: int
    offset: int
    # set together, for a record of a multi-record message; left off the wire otherwise,
    # so single-record coordinates stay exactly {topic, partition, offset}
    index: int | None = Field(default=None, exclude_if=_is_none)  # its place in the message
    count: int | None = Field(default=None, exclude_if=_is_none)  # records the message carries

    @property
    def id(self) -> str:
        return coord_id(self)

    def as_tuple(self) -> tuple[str, int, int]:
        return (self.topic, self.partition, self.offset)

    def ledger_entry(self) -> tuple[str, int]:
        """(coverage key, value) this record is counted as in every ledger."""
        return ledger_entry(self)

    def wire(self) -> dict[str, Any]:
        return wire(self)

    def as_raw(self) -> RawCoord:
        return self

    def in_message(self, index: int, count: int) -> RawCoord:
        """The coordinate of record ``index`` of ``count`` in this message."""
        if count <= 1:
            return self
        return RawCoord(topic=self.topic, partition=self.partition, offset=self.offset,
                        index=index, count=count)


class Coord(msgspec.Struct, frozen=True):
    """A ``RawCoord`` at a tenth of its cost to make: the clean step makes one for every
    raw message and :class:`LaneRecord` reads one with every lane message. Models that
    carry a coordinate (dead letters, records) take a ``RawCoord`` (``as_raw``)."""

    topic: str
    partition: int
    offset: int
    index: int | None = None
    count: int | None = None

    @property
    def id(self) -> str:
        return coord_id(self)

    def ledger_entry(self) -> tuple[str, int]:
        return ledger_entry(self)

    def wire(self) -> dict[str, Any]:
        return wire(self)

    def in_message(self, index: int, count: int) -> Coord:
        """The coordinate of record ``index`` of ``count`` in this message."""
        return self if count <= 1 else Coord(self.topic, self.partition, self.offset, index, count)

    def as_raw(self) -> RawCoord:
        return RawCoord(**wire(self))


class NormalizedRecord(BaseModel):
    """A cleaned log record: ``schemas/record.schema.json``."""

    id: str  # "topic/partition/offset[/index]" of the raw record; stable across re-runs
    raw: RawCoord
    source: str  # the raw message key: file or stream name
    format: LogFormat
    timestamp: str | None = None  # UTC ISO-8601, e.g. 2026-01-02T03:04:05.678Z
    timestamp_rule: str | None = None  # how a missing year/zone was filled, if it was
    level: Level | None = None
    service: str | None = None
    message: str
    attributes: dict[str, Any] = Field(default_factory=dict)
    template_id: str
    template: str
    tokens: int
    cost: float
    lane: Lane
    redactions: dict[str, int] = Field(default_factory=dict)


class LaneRecord(msgspec.Struct):
    """A ``NormalizedRecord`` as the batch stage reads it off a lane: the same names,
    types and defaults, unknown fields ignored by both.

    The batch stage reads every record once; with the pydantic model that read was
    about 7% of a worker's CPU, and msgspec's typed decoder checks the same in about a
    third of the time (bench/README.md). ``NormalizedRecord`` stays the one that
    writes the lanes and backs ``schemas/``; tests/test_lane_record.py holds the two
    to the same fields, values and refusals.
    """

    id: str
    raw: Coord
    source: str
    format: LogFormat
    message: str
    template_id: str
    template: str
    tokens: int
    cost: float
    lane: Lane
    timestamp: str | None = None
    timestamp_rule: str | None = None
    level: Level | None = None
    service: str | None = None
    attributes: dict[str, Any] = {}
    redactions: dict[str, int] = {}


_decode_lane_record = msgspec.json.Decoder(LaneRecord).decode


def read_lane_record(data: bytes) -> LaneRecord:
    """The record a lane message holds; :class:`BadLaneRecord` when it holds none."""
    try:
        return _decode_lane_record(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadLaneRecord(str(exc)) from None


AnyCoord = RawCoord | Coord
AnyRecord = NormalizedRecord | LaneRecord  # as clean builds it, or as a lane gives it back


def service_of(record: AnyRecord) -> str:
    """The service a record speaks for; the source (file or stream) when it names none."""
    return record.service or record.source


class DeadLetter(BaseModel):
    """A record no stage could use: the reason, a redacted sample, its size and hash.

    Build it with :meth:`of`: a dead letter must always fit the topic, or its record
    is never accounted for and its partition's commit stays stuck. Dead letters are
    redacted like every other output: ``sample`` is the record's first bytes as text
    with secrets replaced; the unredacted bytes are not copied anywhere. They stay in
    ``retro.logs.raw`` at ``raw`` (for its retention, readable only by the roles
    deploy/kafkausers.yaml lets read it), or for stage ``produce`` in the file at
    ``raw.topic``, line ``raw.offset``.
    """

    id: str
    raw: RawCoord
    source: str
    stage: Literal["produce", "clean", "batch"]
    reason: str  # stable code, e.g. "undecodable", "too_large"
    detail: str  # what to do about it, for a person
    raw_base64: str = ""  # unredacted bytes: only in letters written before redaction
    raw_size: int | None = None  # bytes of the whole raw message
    raw_sha256: str | None = None  # of the whole raw message, to find or compare it
    sample: str | None = None  # its first bytes as text (undecodable bytes as U+FFFD), redacted

    @classmethod
    def of(cls, data: bytes, /, *, sample_bytes: int,
           redact: Callable[[str], str] | None = None, **fields: Any) -> DeadLetter:
        """A dead letter with the whole message's size and hash and, given ``redact``,
        the redacted text of at most ``sample_bytes`` of it (without, no sample)."""
        sample = None
        if redact is not None:
            sample = redact(data[:sample_bytes].decode("utf-8", errors="replace"))
        return cls(raw_size=len(data), raw_sha256=hashlib.sha256(data).hexdigest(),
                   sample=sample, **fields)

    @property
    def raw_sampled(self) -> bool:
        """True when raw_base64 does not hold the whole raw message."""
        return self.raw_size is not None and len(base64.b64decode(self.raw_base64)) < self.raw_size


class Review(BaseModel):
    """A batch whose model answer could not be trusted; a person looks at it."""

    id: str
    lane: Lane
    reason: str
    detail: str
    covered: dict[str, list[list[int]]]  # "topic/partition" -> inclusive offset ranges
    record_ids: list[str]
    model: str
    prompt_version: str
    output: str | None = None  # the raw model answer, if there was one
    # where its records sit in the lane topics ("lane topic/partition" -> inclusive lane
    # offset ranges): a re-drive reads them back from there, already redacted, so it
    # never needs the raw topic; None in reviews written before it and in the
    # compactor's rejected fragments, whose records it cannot place in the lanes; left
    # off the wire then, so such a review reads as it did before the field
    lane_covered: dict[str, list[list[int]]] | None = Field(default=None, exclude_if=_is_none)


def iso_utc(dt: datetime) -> str:
    """Fixed-width UTC ISO-8601 with milliseconds, so strings sort like times."""
    if dt.tzinfo is not UTC:
        dt = dt.astimezone(UTC)
    # printf-style: twice as fast as the f-string or isoformat(timespec=...), and unlike
    # strftime's %Y it zero-pads years before 1000 on every platform
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (  # noqa: UP031
        dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second, dt.microsecond // 1000)


# a time as the clean stage writes it (fixed-width UTC, milliseconds), its minute captured
_UTC_MILLIS = re.compile(r"(\d{4}-\d\d-\d\dT(?:[01]\d|2[0-3]):[0-5]\d):[0-5]\d\.\d{3}Z",
                         re.ASCII)


def minute_of(timestamp: str | None) -> str | None:
    """The UTC minute a time falls in, as ``Evidence.minutes`` keys it ("2026-01-02T03:04"),
    or None without a usable time. A time as records carry it is looked up by its minute
    (neighbouring records share it; their whole times seldom repeat)."""
    if timestamp:
        match = _UTC_MILLIS.fullmatch(timestamp)
        if match is not None:
            return _minute(match.group(1))
    return _minute(timestamp)


@functools.lru_cache(maxsize=65536)
def _minute(timestamp: str | None) -> str | None:
    if not timestamp:
        return None
    try:
        parsed = datetime.fromisoformat(timestamp)
        # a time without a zone is UTC, as everywhere else in the pipeline
        t = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError):  # not a time, or out of range once in UTC
        return None
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}"


# ``_UTC_MILLIS`` for each line of a text of times, one a line
_UTC_MILLIS_LINES = re.compile(
    r"^(\d{4}-\d\d-\d\dT(?:[01]\d|2[0-3]):[0-5]\d):[0-5]\d\.\d{3}Z$", re.ASCII | re.MULTILINE)


def count_minutes(timestamps: Iterable[str | None]) -> dict[str, int]:
    """Records per UTC minute, oldest first; records without a time are not counted."""
    stamps = list(filter(None, timestamps))  # None and "" have no minute
    if not stamps:
        return {}
    # times as records carry them, matched in one regex pass over all of them (in C)
    # instead of one call per record; any other time takes the general path
    joined = "\n".join(stamps)
    found = (_UTC_MILLIS_LINES.findall(joined)
             if joined.count("\n") == len(stamps) - 1 else [])
    if len(found) == len(stamps):  # every line matched whole, so every time did
        counts = Counter[str | None]()
        for text, n in Counter(found).items():
            counts[_minute(text)] += n
    else:
        counts = Counter(map(minute_of, stamps))
    counts.pop(None, None)
    return dict(sorted(counts.items()))  # type: ignore[arg-type]


def first_in_minutes(records: Iterable[AnyRecord]) -> dict[str, str]:
    """The earliest time of the records at WARN or above in each UTC minute: where a
    failure began, to the second (routine lines are counted by minute only)."""
    firsts: dict[str, str] = {}
    for r in records:
        if r.level in FAILING_LEVELS and (minute := minute_of(r.timestamp)) is not None:
            held = firsts.get(minute)
            if held is None or r.timestamp < held:  # type: ignore[operator]
                firsts[minute] = r.timestamp  # type: ignore[assignment]
    return dict(sorted(firsts.items()))


MAX_TRACES = 8  # trace ids an evidence entry keeps: the smallest, see ``smallest_traces``
FAILING_LEVELS: frozenset[str] = frozenset(("WARN", "ERROR", "FATAL"))
# the levels a cleaned record carries, least severe first
LEVEL_RANK: dict[str, int] = {
    "TRACE": 0, "DEBUG": 1, "INFO": 2, "NOTICE": 2, "WARN": 3, "ERROR": 4, "FATAL": 5}
# attribute keys that hold a trace id, compared without case and separators: the clean
# stage's ``trace_id`` (streams/clean/trace.py) and a JSON body's own spellings (traceId,
# trace.id or {"trace": {"id"}}, dd.trace_id, X-B3-TraceId, otelTraceID)
_TRACE_KEYS = frozenset(("traceid", "ddtraceid", "xb3traceid", "oteltraceid"))
_KEY_SEPARATORS = str.maketrans("", "", "_.-")
_TRACE_ID = re.compile(r"[0-9a-z][0-9a-z._:-]{7,63}")  # 8 to 64 characters, id-shaped
_DASHED_HEX = re.compile(r"[0-9a-f]+(?:-[0-9a-f]+)+")  # a UUID-style id: compared as plain hex
_LEVEL = operator.attrgetter("level")


def trace_id_of(attributes: Mapping[str, Any]) -> str | None:
    """The trace id of a record from its attributes, lower-cased (a UUID-style one without
    its dashes, so the hex spellings of one id compare equal), or None. ``trace_id``
    first (the clean stage lifts it there; a JSON body's own field wins), then any key
    that spells a trace id, also one level down (``{"trace": {"id": ...}}``). An
    all-zero id (no span was active) or a value not shaped like an id is none."""
    value = attributes.get("trace_id")
    if value is None:
        for key, held in attributes.items():
            if isinstance(held, Mapping):
                inner = next((v for k, v in held.items()
                              if isinstance(k, str) and _trace_key(key + k)), None)
                if inner is not None:
                    value = inner
                    break
            elif isinstance(key, str) and _trace_key(key):
                value = held
                break
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value).strip().lower()
    if _DASHED_HEX.fullmatch(text):
        text = text.replace("-", "")
    if _TRACE_ID.fullmatch(text) is None or not text.strip("0-"):
        return None
    return text


@functools.lru_cache(maxsize=4096)
def _trace_key(key: str) -> bool:
    # remembered: the clean stage asks it of every attribute key of every record, and
    # a stream's records share their keys
    return key.lower().translate(_KEY_SEPARATORS) in _TRACE_KEYS


def smallest_traces(*samples: Iterable[str]) -> list[str]:
    """The MAX_TRACES smallest distinct ids of all ``samples``, in order.

    A bottom-k sample: the smallest ids of a union are the smallest of the smallest of
    its parts, so samples merge in any order, twice or in parts, to the same ids, and
    two templates' samples share an id only when it is among the smallest of both (a
    shared id proves a link; a missing one proves nothing)."""
    return heapq.nsmallest(MAX_TRACES, set().union(*samples))


def failing_traces(records: Iterable[NormalizedRecord]) -> list[str]:
    """``smallest_traces`` of the records at WARN or above that have a time: only
    failures link services, and a report's series count dated records only, so a sample
    that took an undated record's id would hold it or not by how batches were cut."""
    given = records if isinstance(records, list | tuple) else list(records)
    if FAILING_LEVELS.isdisjoint(map(_LEVEL, given)):  # most templates never fail: in C
        return []
    return smallest_traces(
        t for r in given
        if r.level in FAILING_LEVELS and (t := trace_id_of(r.attributes)) is not None
        and minute_of(r.timestamp) is not None)


class Evidence(BaseModel):
    """What a fragment saw: a log template, how often, and a few redacted examples."""

    template: str
    count: int
    examples: list[str] = Field(default_factory=list)
    covered: dict[str, list[list[int]]] = Field(default_factory=dict)  # records of this template
    # addresses, users, hosts, pods over all these records (errors and security events)
    entities: dict[str, int] = Field(default_factory=dict)
    # records per UTC minute of their event time ("YYYY-MM-DDTHH:MM"), counted from the
    # records themselves so a report can test rates; undated records are not in it
    minutes: dict[str, int] = Field(default_factory=dict)
    # trace ids of its records at WARN or above, the MAX_TRACES smallest (from the records'
    # attributes, never the model): failures of two services in one trace are one request;
    # left off the wire while empty, as most templates have none
    traces: list[str] = Field(default_factory=list, exclude_if=_is_empty)
    # the highest level among its records (None: none had one), so a report can tell a
    # new error line from a new routine one without the model's say
    level: str | None = Field(default=None, exclude_if=_is_none)
    # names its failing records give to a service they called ("no instances available
    # for X", a URL's host), with how many records gave each (``streams.batch.callees``)
    named: dict[str, int] = Field(default_factory=dict, exclude_if=_is_empty)
    # the time of its earliest record, and of its earliest failing record in each minute:
    # where an incident began, to the second
    first_seen: str | None = Field(default=None, exclude_if=_is_none)
    starts: dict[str, str] = Field(default_factory=dict, exclude_if=_is_empty)


def highest_level(records: Iterable[NormalizedRecord]) -> str | None:
    """The most severe level among ``records`` (None when none has a known one)."""
    return max((r.level for r in records if r.level in LEVEL_RANK),
               key=LEVEL_RANK.__getitem__, default=None)


class TimeWindow(BaseModel):
    start: str | None = None  # earliest record timestamp (UTC ISO-8601)
    end: str | None = None  # latest record timestamp


class Fragment(BaseModel):
    """One finding from one batch: ``schemas/fragment.schema.json``.

    ``id`` is derived from the covered coordinates, lane, model and prompt version,
    so re-running a batch after a crash yields the same id.
    """

    id: str
    lane: Lane
    window: TimeWindow
    service: str
    timestamp: str | None = None
    event: str
    cause: str
    suggestion: str
    severity: Severity
    evidence: list[Evidence]
    covered: dict[str, list[list[int]]]  # "topic/partition" -> inclusive offset ranges
    record_count: int
    model: str
    prompt_version: str
    # the report its records belong to, from each record's own time and fields; None
    # from producers before the place rule (the compactor then uses the message key)
    report_id: str | None = None


@dataclass
class BatchOutcome:
    """What became of one batch: its fragments and reviews together cover it exactly."""

    fragments: list[Fragment] = field(default_factory=list)
    reviews: list[Review] = field(default_factory=list)
    calls: int = 0  # backend calls made, retries and repairs included
    cache_hits: int = 0


class TraceMark(msgspec.Struct, frozen=True):
    """One dated record of a trace, as the trace stage needs it (``streams.traces``):
    ``schemas/trace-mark.schema.json``. Keyed by ``trace`` on the traces topic, so a
    request's lines from every service meet in one partition."""

    trace: str
    id: str  # the record's own id: a mark sent twice (a re-cleaned fetch) counts once
    service: str
    source: str
    timestamp: str  # UTC ISO-8601, as the record carries it
    raw: Coord
    # at WARN or above: a request failing here is linked to the service it called last
    # (absent from an older clean stage's marks)
    failing: bool = False
    # the head of the template the record was mined to (``template_head``): which of
    # its service's lines follows which in a request (empty from an older clean stage)
    template: str = ""


_decode_mark = msgspec.json.Decoder(TraceMark).decode


HEAD_WORDS = 16  # words of a template that name its line in a trace mark
HEAD_WORD_CHARS = 40  # characters of each: a payload without spaces is no name


def template_head(template: str) -> str:
    """A template's first words, each clipped: enough to tell its line from its
    service's others, at a small share of a long line's size. Word by word, so a
    template still covers another's head as it covers the other (``<*>`` a word)."""
    return " ".join(w[:HEAD_WORD_CHARS] for w in template.split()[:HEAD_WORDS])


def trace_mark(fields: Mapping[str, Any]) -> tuple[bytes, bytes] | None:
    """(key, value) of the mark of a cleaned record's fields (``Cleaner.clean_fields``)
    on the traces topic, or None when it has no trace id or no time."""
    timestamp = fields.get("timestamp")
    trace = trace_id_of(fields.get("attributes") or {}) if timestamp else None
    if trace is None:
        return None
    return trace.encode(), msgspec.json.encode({
        "trace": trace, "id": fields["id"], "service": fields.get("service") or fields["source"],
        "source": fields["source"], "timestamp": timestamp, "raw": fields["raw"],
        "failing": fields.get("level") in FAILING_LEVELS,
        "template": template_head(fields.get("template") or "")})


def mark_of(record: LaneRecord) -> TraceMark | None:
    """The mark ``trace_mark`` sends for a record, as the trace stage reads it back: for
    the in-memory pipeline, which has the record rather than its fields."""
    fields = {"id": record.id, "raw": record.raw, "source": record.source,
              "service": record.service, "timestamp": record.timestamp,
              "attributes": record.attributes, "level": record.level,
              "template": record.template}
    sent = trace_mark(fields)
    return None if sent is None else read_mark(sent[1])


def read_mark(value: bytes) -> TraceMark:
    """A mark off the traces topic; raises ``msgspec.ValidationError`` (a ValueError)."""
    return _decode_mark(value)


KIND_HEADER = "retro-kind"  # fragments topic messages that are not fragments say what they are
HOPS_KIND = "hops"


class TraceHops(BaseModel):
    """One trace's hops into the services of one report, with the marks they came from."""

    covered: dict[str, list[list[int]]]  # the marks: "topic/partition" -> offset ranges
    # (service, UTC minute, delay bin, caller: the service of the line just before), one
    # per hop; an update of an older trace stage has no caller
    hops: list[tuple[str, str, int, str] | tuple[str, str, int]]
    # (caller, callee, UTC minute of the caller's first failing line): a service that
    # failed in this request after calling another, that one the last it called
    failed: list[tuple[str, str, str]] = Field(default_factory=list)
    # (service, UTC minute, template, the template of the service's next line in the
    # trace or "" when none came, times): which line a service writes right after which
    next_lines: list[tuple[str, str, str, str, int]] = Field(default_factory=list)


class HopsUpdate(BaseModel):
    """Hops the trace stage sends a report on the fragments topic (``KIND_HEADER``
    "hops"); a trace whose marks the report already counted is skipped, so a replay
    adds nothing."""

    report_id: str
    traces: list[TraceHops]
