"""One raw message in, its NormalizedRecords or DeadLetters out: the clean stage's core.

A message is one log record, or a shipper's envelope around one or many
(``streams.clean.envelopes``): each record of an envelope is parsed again like any
line and gets its own coordinate (``in_message``). Order matters and is
fixed: size, decode, parse, then redact message and attributes *before* templating,
token counting and cost see them, so no secret reaches a template, a cache key or a
prompt. Nothing in here raises on bad input: every failure becomes a dead letter
with a stable reason and a sentence saying what to do.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from streams.clean.envelopes import Entry, EnvelopeError, EnvelopeKind, read_message
from streams.clean.formats import FormatParser, Parsed
from streams.clean.lanes import choose_lane, cost_score
from streams.clean.mining import TemplateMiner
from streams.clean.timestamps import from_number, match_leading
from streams.clean.trace import lift_trace
from streams.errors import DecodeError, RecordError, RecordTooLarge
from streams.metrics import Series
from streams.records import AnyCoord, DeadLetter, LaneRecord, NormalizedRecord, iso_utc
from streams.redact import Redactor
from streams.tokens import TokenCounter

if TYPE_CHECKING:
    from streams.metrics import Metrics
    from streams.settings import Settings

logger = logging.getLogger(__name__)

MAX_REPLACED_SHARE = 0.01  # repair invalid UTF-8 only when at most 1% of characters are hit
MAX_NUL_SHARE = 0.01  # more NUL bytes than this: binary, not text
MAX_CONTROL_SHARE = 0.10  # more C0 control bytes than this: binary
MAX_CACHED_NAMES = 4096  # source and service names remembered with their redaction
# C0 controls except tab, LF, VT, FF, CR and ESC (ANSI colours are text)
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13, 27)) + b"\x7f"
_REPLACEMENT_UTF8 = "\ufffd".encode()
# NormalizedRecord(**fields) less its keyword packing and __init__: the same validation
_new_record = NormalizedRecord.__pydantic_validator__.validate_python
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # an envelope is bounded by the Kafka message limit
RecordFields = dict[str, Any]  # a NormalizedRecord's fields in its order, not validated
Built = TypeVar("Built", NormalizedRecord, LaneRecord, RecordFields)


def _as_fields(fields: RecordFields) -> RecordFields:
    return fields


def _new_lane_record(fields: RecordFields) -> LaneRecord:
    # msgspec checks the same types as NormalizedRecord (tests/test_lane_record.py) in
    # about a third of pydantic's time
    return msgspec.convert(fields, LaneRecord)


def _readable(key: str) -> bool:
    return key.isprintable() and "\ufffd" not in key


class Cleaner:
    """Turns raw record bytes into a routed NormalizedRecord, or a DeadLetter.

    Holds a template miner, which learns as it goes: use one Cleaner per worker
    (or partition), not one per record.
    """

    def __init__(
        self,
        *,
        max_record_bytes: int,
        slow_cost_threshold: float,
        encoding: str,
        default_year: int | None,
        default_timezone: str,
        redactor: Redactor | None = None,
        token_counter: TokenCounter | None = None,
        template_miner: TemplateMiner | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] | None = None,
        deadletter_sample_bytes: int = 16 * 1024,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        envelopes: dict[str, EnvelopeKind] | None = None,
    ) -> None:
        if max_record_bytes < 1:
            raise ValueError(f"max_record_bytes must be >= 1, got {max_record_bytes}")
        self.max_record_bytes = max_record_bytes
        # a message carrying many records is bounded by this; each record by the above
        self.max_message_bytes = max(max_message_bytes, max_record_bytes)
        self.envelopes = dict(envelopes or {})  # topic -> forced envelope kind
        self.deadletter_sample_bytes = deadletter_sample_bytes
        self.slow_cost_threshold = slow_cost_threshold
        self.parser = FormatParser(
            default_year=default_year, default_timezone=default_timezone, clock=clock
        )
        self.redactor = redactor or Redactor()
        self.tokens = token_counter or TokenCounter(encoding)
        self.templates = template_miner or TemplateMiner()
        self._names: dict[str, tuple[str, dict[str, int]]] = {}
        self.metrics = metrics
        self._by_format = Series(metrics.records_by_format) if metrics else None
        self._by_envelope = Series(metrics.records_by_envelope) if metrics else None
        self._redactions = Series(metrics.redactions) if metrics else None
        self._lane_keys: dict[bytes, bytes] = {}
        # records per format and redactions per kind, counted until tallied() flushes them
        self._formats: dict[str, int] = {}
        self._kinds: dict[str, int] = {}
        self._tallying = False

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics | None = None) -> Cleaner:
        """The one convenience constructor: settings.clean mapped onto keyword arguments."""
        c = settings.clean
        return cls(
            max_record_bytes=c.max_record_bytes,
            slow_cost_threshold=c.slow_cost_threshold,
            encoding=c.encoding,
            default_year=c.default_year,
            default_timezone=c.default_timezone,
            metrics=metrics,
            deadletter_sample_bytes=c.deadletter_sample_bytes,
            max_message_bytes=settings.kafka.max_message_bytes,
            envelopes=c.envelope_overrides,
            redactor=Redactor.from_settings(settings),
        )

    def clean(
        self, raw: bytes, coord: AnyCoord, source: str, *, received_at: datetime | None = None
    ) -> list[NormalizedRecord | DeadLetter]:
        """Clean one message into one result per log record it carries; never raises on
        bad input.

        ``received_at`` (the Kafka record's timestamp) dates a record that carries no
        time of its own, such as a line of user feedback; the rule says so.
        """
        return self._tallied_clean(raw, coord, source, received_at, _new_record)

    def clean_fields(
        self, raw: bytes, coord: AnyCoord, source: str, *, received_at: datetime | None = None
    ) -> list[RecordFields | DeadLetter]:
        """``clean`` with each record's fields left unvalidated: written as JSON they are
        the bytes ``clean`` would give, and the lanes validate every record they read,
        so the clean step need not build each record first."""
        return self._tallied_clean(raw, coord, source, received_at, _as_fields)

    def clean_lane_records(
        self, raw: bytes, coord: AnyCoord, source: str, *, received_at: datetime | None = None
    ) -> list[LaneRecord | DeadLetter]:
        """``clean`` with each record built as the batch stage reads it off a lane: for
        the in-memory pipeline (``retro postmortem``), which then batches what the
        worker's batch stage would, without pydantic's cost of a NormalizedRecord."""
        return self._tallied_clean(raw, coord, source, received_at, _new_lane_record)

    def _tallied_clean(self, raw: bytes, coord: AnyCoord, source: str,
                       received_at: datetime | None, build: Callable[[RecordFields], Built]
                       ) -> list[Built | DeadLetter]:
        if self._tallying:  # the clean step's fetch counts them
            return self._clean(raw, coord, source, received_at, build)
        with self.tallied():
            return self._clean(raw, coord, source, received_at, build)

    def _clean(self, raw: bytes, coord: AnyCoord, source: str, received_at: datetime | None,
               build: Callable[[RecordFields], Built]) -> list[Built | DeadLetter]:
        if len(raw) > self.max_message_bytes:
            return [self._dead(raw, coord, source, "too_large", (
                f"message is over the {self.max_message_bytes}-byte limit ({len(raw)} bytes; "
                "the dead letter keeps its first part, size and SHA-256); split such "
                "batches at the shipper"))]
        kind = self.envelopes.get(coord.topic)
        obj = None
        try:
            envelope, obj = read_message(raw, kind=kind)
        except EnvelopeError as exc:
            return [self._dead(raw, coord, source, "bad_envelope", (
                f"{exc}; RETRO_CLEAN__ENVELOPE forces {kind} on topic {coord.topic}: fix or "
                "remove that override"))]
        except Exception as exc:  # a decoder bug must not stop the stream
            logger.warning("unwrapping failed on %s: %s", coord.id, exc, exc_info=True)
            envelope = None
        if envelope is None:
            return [self._clean_line(raw, coord, source, received_at, obj, build)]
        if not envelope.entries:
            return [self._dead(raw, coord, source, "empty_envelope", (
                f"the {envelope.kind} message holds no log record; nothing to clean "
                "(the shipper sent an empty batch)"))]
        count = len(envelope.entries)
        return [self._clean_entry(entry, coord.in_message(i, count), source, received_at,
                                  envelope.kind, build)
                for i, entry in enumerate(envelope.entries)]

    def clean_line(
        self, raw: bytes, coord: AnyCoord, source: str, *, received_at: datetime | None = None,
        obj: dict[str, Any] | None = None,
    ) -> NormalizedRecord | DeadLetter:
        """Clean one message that is one log record (no envelope); ``obj``: its JSON
        object when the envelope check already decoded it."""
        if self._tallying:
            return self._clean_line(raw, coord, source, received_at, obj, _new_record)
        with self.tallied():
            return self._clean_line(raw, coord, source, received_at, obj, _new_record)

    def _clean_line(self, raw: bytes, coord: AnyCoord, source: str,
                    received_at: datetime | None, obj: dict[str, Any] | None,
                    build: Callable[[RecordFields], Built]) -> Built | DeadLetter:
        try:
            text, repaired = self.decode(raw)
        except RecordError as exc:
            return self._dead(raw, coord, source, exc.reason, str(exc))
        try:
            parsed = self.parser.parse(text, source=source, obj=obj)
        except Exception as exc:  # a parser bug must not stop the stream
            # redacted, without the traceback's locals: the message may quote the record
            logger.warning("parser failed on %s: %s: %s", coord.id, type(exc).__name__,
                           self.redact_text(str(exc)))
            detail = (
                f"the {type(exc).__name__} parser error was: {exc}. This is a parser bug: "
                "report the record (at its raw coordinate) so its format can be supported"
            )
            return self._dead(raw, coord, source, "parse_error", detail)
        if repaired:
            parsed.attributes["utf8_replaced"] = repaired
        try:
            if parsed.timestamp is None and received_at is not None:
                parsed.timestamp = received_at.astimezone(UTC)
                parsed.timestamp_rule = "ingest-time"
            return build(self._fields(parsed, text, coord, source))
        except Exception as exc:  # redactor, miner or model validation: same rule
            logger.warning("cleaning failed on %s: %s: %s", coord.id, type(exc).__name__,
                           self.redact_text(str(exc)))
            detail = (
                f"cleaning failed after parsing ({type(exc).__name__}: {exc}); this is a "
                "bug in the clean stage: report the record (at its raw coordinate)"
            )
            return self._dead(raw, coord, source, "clean_error", detail)

    def _clean_entry(self, entry: Entry, coord: AnyCoord, source: str,
                     received_at: datetime | None, kind: str,
                     build: Callable[[RecordFields], Built]) -> Built | DeadLetter:
        """One record out of an envelope: its line parsed again, the envelope's metadata
        filling what the line does not say (its time only as a fallback)."""
        if entry.stream and (source == "unknown" or not _readable(source)):
            # no key (the collector's default) or a binary one (its hash of the resource,
            # partition_logs_by_resource_attributes): the envelope names the stream
            source = entry.stream
        text = entry.text
        size = len(text.encode("utf-8", "replace"))
        if size > self.max_record_bytes:
            return self._dead(text.encode("utf-8", "replace"), coord, source, "too_large", (
                f"log record {coord.index} of the message is over the {self.max_record_bytes}-"
                f"byte limit ({size} bytes); raise RETRO_CLEAN__MAX_RECORD_BYTES or split such "
                "records at the source"))
        try:
            parsed = self.parser.parse(text, source=entry.stream or source)
            self._apply_envelope(parsed, entry, received_at)
            parsed.attributes = {"envelope": kind, **entry.attributes, **parsed.attributes}
            record = build(self._fields(parsed, text, coord, source))
            if self._by_envelope is not None:
                self._by_envelope(kind).inc()
            return record
        except Exception as exc:  # same rule as for a line: a bug must not stop the stream
            logger.warning("cleaning failed on %s: %s", coord.id, exc, exc_info=True)
            return self._dead(text.encode("utf-8", "replace"), coord, source, "clean_error", (
                f"cleaning a {kind} record failed ({type(exc).__name__}: {exc}); this is a "
                "bug in the clean stage: report the record (raw_base64)"))

    def _apply_envelope(self, parsed: Parsed, entry: Entry,
                        received_at: datetime | None) -> None:
        """The line's own time wins; the shipper's completes or replaces it; the rule
        used travels with the record ("line", "envelope:<field>", "ingest-time")."""
        shipped, shipped_rule = self._envelope_time(entry)
        field = f"envelope:{entry.time_field}"
        stamp = parsed.stamp
        completed = None
        if stamp is not None and stamp.offset is None and shipped is not None and (
                shipped_rule is None):
            # a line without a date or a zone: the shipper's exact time gives the date,
            # and the zone when both clocks differ by a whole offset (not a read delay)
            completed = self.parser.times.on_envelope(stamp, shipped)
        if completed is not None:
            parsed.timestamp = completed[0]
            parsed.timestamp_rule = ",".join(["line", *(f"{p}:{field}" for p in completed[1])])
            parsed.attributes.pop("time_of_day", None)
        elif parsed.timestamp is not None:
            line_rule = parsed.timestamp_rule
            parsed.timestamp_rule = f"line,{line_rule}" if line_rule else "line"
        if parsed.timestamp is None and shipped is not None:
            parsed.timestamp = shipped
            parsed.timestamp_rule = f"{field},{shipped_rule}" if shipped_rule else field
        elif parsed.timestamp is None and received_at is not None:
            parsed.timestamp, parsed.timestamp_rule = received_at.astimezone(UTC), "ingest-time"
        if parsed.level is None:
            parsed.level = entry.level
        if entry.service:
            parsed.service = entry.service  # the envelope's metadata names the service

    def _envelope_time(self, entry: Entry) -> tuple[datetime | None, str | None]:
        """The shipper's time as UTC, and how it was completed (None: it was exact)."""
        if isinstance(entry.time, datetime):
            return entry.time, None
        if not entry.time:
            return None, None
        text = entry.time.strip()
        # epoch seconds/ms/ns written as text; float() never reads a colon, so an ISO
        # time (most shippers') skips the raised and caught ValueError
        if ":" not in text:
            with contextlib.suppress(ValueError):
                number = float(text)
                if number >= 1e8:  # from 1973 on; a bare "2017" is no epoch
                    return from_number(number), None
        stamp = match_leading(text)
        if stamp is None:
            return None, None
        return self.parser.times.resolve(stamp)

    def decode(self, raw: bytes) -> tuple[str, int]:
        """UTF-8 text and the number of replaced characters (0 unless repaired).

        Raises RecordTooLarge, or DecodeError with reason ``binary`` or ``undecodable``.
        """
        size = len(raw)
        if size > self.max_record_bytes:
            raise RecordTooLarge(
                f"record is over the {self.max_record_bytes}-byte limit ({size} bytes; the "
                "dead letter keeps its first part, size and SHA-256); raise "
                "RETRO_CLEAN__MAX_RECORD_BYTES or split such records at the source"
            )
        nul = raw.count(0)
        control = size - len(raw.translate(None, _CONTROL))
        if nul > size * MAX_NUL_SHARE or control > size * MAX_CONTROL_SHARE:
            raise DecodeError(
                f"record looks binary ({nul} NUL and {control} control bytes in {size}); "
                "send text logs only (UTF-16 or compressed data must be converted first)",
                reason="binary",
            )
        try:
            return raw.decode("utf-8").removeprefix("\ufeff"), 0
        except UnicodeDecodeError:
            pass
        text = raw.decode("utf-8", errors="replace").removeprefix("\ufeff")
        replaced = text.count("\ufffd") - raw.count(_REPLACEMENT_UTF8)
        if replaced > len(text) * MAX_REPLACED_SHARE:
            raise DecodeError(
                f"{replaced} of {len(text)} characters are not valid UTF-8 (the limit is "
                f"{MAX_REPLACED_SHARE:.0%}); re-encode the source as UTF-8, e.g. "
                "`iconv -f latin1 -t utf-8`",
                reason="undecodable",
            )
        return text, replaced

    def _redact_name(self, name: str) -> tuple[str, dict[str, int]]:
        """A source or service name redacted, and its counts (shared: read them only);
        names repeat, so each is redacted once."""
        hit = self._names.get(name)
        if hit is None:
            if len(self._names) >= MAX_CACHED_NAMES:
                self._names.clear()
            hit = self._names[name] = self.redactor.redact(name)
        return hit

    def _fields(self, parsed: Parsed, text: str, coord: AnyCoord, source: str) -> RecordFields:
        # trace and span ids move to attributes: in the text they are new on every line,
        # so they cost prompt tokens and make many events mine to one template
        message, trace = lift_trace(parsed.message)
        if trace:
            parsed.message = message
            for key, value in trace.items():
                parsed.attributes.setdefault(key, value)  # a JSON body's own ids win
        message, counts = self.redactor.redact(parsed.message)
        attributes, attr_counts = self.redactor.redact_mapping(parsed.attributes)
        # the Kafka key / --source and a service name travel to the model and the report
        # as much as the message does (e.g. a DSN with a password used as a stream name)
        source, source_counts = self._redact_name(source)
        service, service_counts = self._redact_name(parsed.service or source)
        if attr_counts or source_counts or service_counts:  # seldom: most records hold none
            for found in (attr_counts, source_counts, service_counts):
                for kind, n in found.items():
                    counts[kind] = counts.get(kind, 0) + n
        template_id, template = self.templates.match(message.partition("\n")[0])
        # the score is a number that never leaves the stage, so it is taken on the raw
        # text rather than paying to redact the whole line a second time
        score = cost_score(text)
        fields = {
            "id": coord.id,
            "raw": coord.wire(),
            "source": source,
            "format": parsed.format,
            "timestamp": iso_utc(parsed.timestamp) if parsed.timestamp else None,
            "timestamp_rule": parsed.timestamp_rule if parsed.timestamp else None,
            "level": parsed.level,
            "service": service,
            "message": message,
            "attributes": attributes,
            "template_id": template_id,
            "template": template,
            "tokens": self.tokens.count(message),
            "cost": round(score, 4),
            "lane": choose_lane(score, self.slow_cost_threshold),
            "redactions": counts,
        }
        formats = self._formats
        formats[parsed.format] = formats.get(parsed.format, 0) + 1
        if counts:
            kinds = self._kinds
            for kind, n in counts.items():
                kinds[kind] = kinds.get(kind, 0) + n
        return fields

    @contextlib.contextmanager
    def tallied(self) -> Iterator[None]:
        """Count records per format and redactions per kind once for everything cleaned
        inside (a fetch), not once per record: a metric increment takes a lock. ``clean``
        and ``clean_line`` open one of their own when no outer block is open."""
        if self._tallying:
            yield  # an outer block counts
            return
        self._tallying = True
        try:
            yield
        finally:
            self._tallying = False
            if self._by_format is not None and self._redactions is not None:
                for fmt, n in self._formats.items():
                    self._by_format(fmt).inc(n)
                for kind, n in self._kinds.items():
                    self._redactions(kind).inc(n)
            self._formats.clear()
            self._kinds.clear()

    def _dead(
        self, raw: bytes, coord: AnyCoord, source: str, reason: str, detail: str
    ) -> DeadLetter:
        # retro_deadletter_total is counted where the letter is delivered, not here: a
        # record cleaned again after a failed delivery would be counted twice
        source, _ = self.redactor.redact(source)
        detail, _ = self.redactor.redact(detail)  # parser messages may quote the record
        logger.info("dead letter %s from %s: %s", coord.id, source, reason)
        return DeadLetter.of(
            raw,
            sample_bytes=self.deadletter_sample_bytes,
            redact=self.redact_text,
            id=coord.id,
            raw=coord.as_raw(),
            source=source,
            stage="clean",
            reason=reason,
            detail=detail,
        )

    def lane_key(self, key: bytes) -> bytes:
        """The raw message key with secrets replaced, for the lane topics: one source
        still maps to one key (``--spread`` suffix kept), without a DSN's password."""
        cached = self._lane_keys.get(key)
        if cached is None:
            if len(self._lane_keys) >= 4096:  # keys are few (sources); bound them anyway
                self._lane_keys.clear()
            cached = self.redact_text(key.decode("utf-8", errors="replace")).encode()
            self._lane_keys[key] = cached
        return cached

    def redact_text(self, text: str) -> str:
        """``text`` with secrets replaced (the counts are not needed here)."""
        return self.redactor.redact(text)[0]
