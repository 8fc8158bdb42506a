"""Shipper envelopes: what log shippers wrap around a line on its way to Kafka.

Detected per message from its shape, with no configuration (an override per topic
forces one: ``RETRO_CLEAN__ENVELOPE``): the OpenTelemetry Collector's kafka exporter
(``otlp_json``, ``otlp_proto``: many records per message), Fluent Bit (with or
without its kubernetes filter), Vector's kafka sink, Filebeat / Elastic Agent (ECS),
rsyslog omkafka (``%jsonmesg%`` and JSON templates), syslog-ng ``format-json``.
Docker json-file and plain lines are not envelopes here: the format parser reads
them as it always did (``unwrap`` returns None).

Each record becomes an :class:`Entry`: the payload line, to be parsed again like any
line, plus what the envelope knows about it (stream identity, service, the
shipper's time and the field it came from, a level, Kubernetes/host metadata).
Pure: no Kafka, no settings; field layouts follow ../shared/notes/shippers.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from streams.clean.jsontext import loads_utf8
from streams.clean.levels import normalize_level, syslog_severity
from streams.records import EnvelopeKind, Level

__all__ = ["Entry", "Envelope", "EnvelopeError", "EnvelopeKind", "detect_json", "read_message",
           "unwrap"]

_DOCKER_KEYS = frozenset(("log", "stream", "time", "attrs"))
_SYSLOG_NG_KEYS = frozenset(
    ("PROGRAM", "HOST", "DATE", "ISODATE", "PRIORITY", "LEVEL", "FILE_NAME", "FACILITY",
     "SOURCE", "PID", "LEGACY_MSGHDR"))
_RSYSLOG_KEYS = frozenset(
    ("syslogtag", "programname", "timereported", "timegenerated", "rawmsg", "app-name",
     "syslogseverity", "syslogseverity-text", "syslogfacility", "fromhost-ip", "procid"))
_ECS_KEYS = frozenset(("ecs", "agent", "input", "data_stream", "event"))
# an omkafka/imfile JSON template with Logstash-style names ("@timestamp", "message",
# "program", "syslog-tag", "severity", "facility"): two of these mark a syslog record
_SYSLOG_JSON_KEYS = frozenset(("program", "syslog-tag", "syslogtag", "programname",
                               "facility", "severity", "sysloghost"))
# OTel SeverityNumber ranges (1-4 TRACE ... 21-24 FATAL)
_OTEL_SEVERITY: tuple[Level, ...] = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL")
_APP_LABELS = ("app.kubernetes.io/name", "app_kubernetes_io/name", "app")  # dedotted too


class EnvelopeError(ValueError):
    """A message that does not fit the envelope an override forces on its topic."""


@dataclass(slots=True)
class Entry:
    """One log record out of an envelope."""

    text: str  # the payload line; parsed again like any line
    stream: str | None = None  # stream identity: service, container, program or file
    service: str | None = None  # from the envelope's metadata, when it has one
    time: datetime | str | None = None  # the shipper's time: exact, or text to resolve
    time_field: str | None = None  # the envelope field ``time`` came from
    level: Level | None = None  # the envelope's severity, a fallback for the line's
    attributes: dict[str, Any] = field(default_factory=dict)  # pod, namespace, host...


@dataclass(slots=True)
class Envelope:
    kind: EnvelopeKind
    entries: list[Entry]


def unwrap(raw: bytes, *, kind: EnvelopeKind | None = None) -> Envelope | None:
    """The envelope of one Kafka message, or None for a plain line (or Docker json-file).

    Without ``kind`` the envelope is detected from the message; a message that fits
    none is plain. With ``kind`` (a per-topic override) a misfit raises EnvelopeError.
    """
    return read_message(raw, kind=kind)[0]


def read_message(raw: bytes, *, kind: EnvelopeKind | None = None
                 ) -> tuple[Envelope | None, dict[str, Any] | None]:
    """``unwrap``, plus the JSON object of a plain JSON line (an app's own JSON, Docker
    json-file), so the line's parser does not decode it a second time."""
    if kind == "plain":
        return None, None
    if kind == "otlp_proto" or (kind is None and raw[:1] == b"\n"):
        envelope = _otlp_proto(raw)
        if envelope is not None or kind is None:
            return envelope, None
        raise EnvelopeError("the message is not OTLP protobuf (LogsData)")
    obj = _json_object(raw)
    if obj is None:
        if kind is None:
            return None, None
        raise EnvelopeError(f"the message is not a JSON object, which {kind} writes")
    found = kind or detect_json(obj)
    if found is None:
        return None, obj
    try:
        return Envelope(found, _JSON_READERS[found](obj)), None
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        if kind is None:
            return None, None  # looked like an envelope but is not one: a plain JSON line
        raise EnvelopeError(f"the message does not fit {kind}: {exc}") from exc


def detect_json(obj: dict[str, Any]) -> EnvelopeKind | None:
    """The shipper that writes objects shaped like ``obj``; None for an app's JSON line."""
    keys = obj.keys()
    if isinstance(obj.get("resourceLogs"), list):
        return "otlp_json"
    if isinstance(obj.get("MESSAGE"), str) and keys & _SYSLOG_NG_KEYS:
        return "syslog_ng"
    if (isinstance(obj.get("msg"), str) or isinstance(obj.get("rawmsg"), str)) and (
            keys & _RSYSLOG_KEYS):
        return "rsyslog"
    if isinstance(obj.get("message"), str) and len(keys & _SYSLOG_JSON_KEYS) >= 2 and (
            keys & {"program", "syslog-tag", "syslogtag", "programname"}):
        return "rsyslog"
    log = obj.get("log")
    if isinstance(log, str) and not keys <= _DOCKER_KEYS and (
            isinstance(obj.get("kubernetes"), dict) or "date" in obj or "@timestamp" in obj):
        return "fluentbit"
    message = obj.get("message")
    if isinstance(message, str) and "source_type" in obj:
        return "vector"
    if isinstance(message, str) and "@timestamp" in obj and (
            keys & _ECS_KEYS or isinstance(log, dict)):
        return "ecs"
    return None


# --- JSON envelopes ------------------------------------------------------------------


def _json_object(raw: bytes) -> dict[str, Any] | None:
    if raw[:1] != b"{" and raw[:64].lstrip()[:1] != b"{":
        return None
    try:
        # opening with "{" or a blank and no NUL next, the bytes are what json.loads
        # reads as UTF-8: decoded as it would, without its encoding detection
        obj = loads_utf8(raw) if raw[1:2] != b"\0" else json.loads(raw)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _fluentbit(obj: dict[str, Any]) -> list[Entry]:
    k8s = _dict(obj.get("kubernetes"))
    labels = _dict(k8s.get("labels"))
    container = _str(k8s.get("container_name"))
    service = _label_app(labels) or container
    attrs = _rest(obj, ("log", "date", "@timestamp", "time", "kubernetes"))
    _put(attrs, pod=k8s.get("pod_name"), namespace=k8s.get("namespace_name"),
         container=container, host=k8s.get("host"), image=k8s.get("container_image"))
    time_field = next((f for f in ("time", "date", "@timestamp") if f in obj), None)
    return [Entry(_line(obj["log"]), stream=service or _str(attrs.get("file")),
                  service=service, time=_time_value(obj.get(time_field)) if time_field else None,
                  time_field=time_field, attributes=attrs)]


def _vector(obj: dict[str, Any]) -> list[Entry]:
    k8s = _dict(obj.get("kubernetes"))
    labels = _dict(k8s.get("pod_labels"))
    container = _str(k8s.get("container_name"))
    service = _str(obj.get("service")) or _label_app(labels) or container
    attrs = _rest(obj, ("message", "timestamp", "kubernetes", "service"))
    _put(attrs, pod=k8s.get("pod_name"), namespace=k8s.get("pod_namespace"),
         container=container, node=k8s.get("pod_node_name"))
    return [Entry(_line(obj["message"]), stream=service or _str(obj.get("file")),
                  service=service, time=_time_value(obj.get("timestamp")),
                  time_field="timestamp" if "timestamp" in obj else None, attributes=attrs)]


def _ecs(obj: dict[str, Any]) -> list[Entry]:
    k8s = _dict(obj.get("kubernetes"))
    container = _str(_dict(obj.get("container")).get("name")) or _str(
        _dict(k8s.get("container")).get("name"))
    service = (_str(_dict(obj.get("service")).get("name")) or _str(obj.get("service.name"))
               or _label_app(_dict(k8s.get("labels"))) or container)
    log = _dict(obj.get("log"))
    level = normalize_level(log.get("level", obj.get("log.level")))
    path = _str(_dict(log.get("file")).get("path"))
    host = _dict(obj.get("host"))
    attrs = _rest(obj, ("message", "@timestamp", "log", "service", "kubernetes", "container",
                        "host", "agent", "ecs", "input", "data_stream", "event", "log.level",
                        "service.name"))
    _put(attrs, pod=_dict(k8s.get("pod")).get("name"), namespace=_namespace(k8s),
         container=container, host=host.get("name") or host.get("hostname"), file=path,
         node=_dict(k8s.get("node")).get("name"))
    return [Entry(_line(obj["message"]), stream=service or path, service=service,
                  time=_time_value(obj["@timestamp"]), time_field="@timestamp",
                  level=level, attributes=attrs)]


def _rsyslog(obj: dict[str, Any]) -> list[Entry]:
    text = obj.get("msg")
    if not isinstance(text, str) or not text.strip():
        text = obj.get("rawmsg", obj.get("message", ""))
    text = text[1:] if text.startswith(" ") else text  # rsyslog keeps the space after the tag
    program = (_str(obj.get("programname")) or _str(obj.get("app-name"))
               or _str(obj.get("program")))
    tag = obj.get("syslogtag", obj.get("syslog-tag"))
    if program is None and isinstance(tag, str):
        program = tag.split("[", 1)[0].rstrip(":") or None
    level = None
    severity = obj.get("syslogseverity")
    if isinstance(severity, int) or (isinstance(severity, str) and severity.isdigit()):
        level = syslog_severity(int(severity))
    elif isinstance(obj.get("syslogseverity-text", obj.get("severity")), str):
        level = normalize_level(obj.get("syslogseverity-text", obj.get("severity")))
    meta = _dict(obj.get("$!"))
    path = _str(meta.get("filename")) or _str(_dict(meta.get("metadata")).get("filename"))
    attrs = _rest(obj, ("msg", "rawmsg", "message", "timereported", "timegenerated",
                        "programname", "program", "app-name", "syslogseverity",
                        "syslogseverity-text", "severity", "hostname", "host", "$!", "pri",
                        "syslogtag", "syslog-tag", "@timestamp", "timestamp"))
    _put(attrs, host=obj.get("hostname", obj.get("host")), file=path)
    time_field = next((f for f in ("timereported", "timegenerated", "@timestamp", "timestamp")
                       if obj.get(f)), None)
    return [Entry(_line(text), stream=program or path, service=program,
                  time=_time_value(obj[time_field]) if time_field else None,
                  time_field=time_field, level=level, attributes=attrs)]


def _syslog_ng(obj: dict[str, Any]) -> list[Entry]:
    program = _str(obj.get("PROGRAM"))
    level = normalize_level(obj.get("PRIORITY", obj.get("LEVEL")))
    attrs = _rest(obj, ("MESSAGE", "PROGRAM", "PRIORITY", "LEVEL", "DATE", "ISODATE", "HOST",
                        "FILE_NAME", "LEGACY_MSGHDR"))
    _put(attrs, host=obj.get("HOST"), file=obj.get("FILE_NAME"))
    # ISODATE is complete; DATE ("Dec  1 06:33:04") has neither year nor zone
    time_field = next((f for f in ("ISODATE", "DATE") if obj.get(f)), None)
    return [Entry(_line(obj["MESSAGE"]), stream=program or _str(obj.get("FILE_NAME")),
                  service=program, time=_time_value(obj[time_field]) if time_field else None,
                  time_field=time_field, level=level, attributes=attrs)]


def _otlp_json(obj: dict[str, Any]) -> list[Entry]:
    entries = []
    for resource_logs in obj["resourceLogs"]:
        resource = _json_attrs(_dict(resource_logs.get("resource")).get("attributes"))
        for scope_logs in resource_logs.get("scopeLogs") or resource_logs.get("scope_logs") or []:
            for rec in scope_logs.get("logRecords") or []:
                entries.append(_otlp_entry(
                    resource, body=_json_any(rec.get("body")),
                    attributes=_json_attrs(rec.get("attributes")),
                    time_ns=int(rec.get("timeUnixNano") or 0),
                    observed_ns=int(rec.get("observedTimeUnixNano") or 0),
                    severity_text=rec.get("severityText") or "",
                    severity_number=_json_severity(rec.get("severityNumber"))))
    return entries


def _json_severity(value: Any) -> int:
    """severityNumber: an integer (the collector), or the enum's name (protobuf's JSON)."""
    if isinstance(value, str) and value.startswith("SEVERITY_NUMBER_"):
        word = value.removeprefix("SEVERITY_NUMBER_").rstrip("234")
        index = _OTEL_SEVERITY.index(word) if word in _OTEL_SEVERITY else -1
        return index * 4 + 1 if index >= 0 else 0
    return int(value or 0)


def _json_attrs(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        return {}
    return {kv["key"]: _json_any(kv.get("value")) for kv in items if isinstance(kv, dict)}


def _json_any(value: Any) -> Any:
    """An OTLP JSON AnyValue ({"stringValue": ...}, {"kvlistValue": ...}) as Python."""
    if not isinstance(value, dict) or not value:
        return None
    name, inner = next(iter(value.items()))
    if name == "kvlistValue":
        return _json_attrs(_dict(inner).get("values"))
    if name == "arrayValue":
        return [_json_any(v) for v in _dict(inner).get("values") or []]
    if name == "intValue":
        return int(inner)
    return inner


# --- OTLP ------------------------------------------------------------------------------


def _otlp_proto(raw: bytes) -> Envelope | None:
    """OTLP protobuf (``LogsData``, the collector's default ``otlp_proto``), else None."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.logs.v1.logs_pb2 import LogsData

    try:
        data = LogsData.FromString(raw)
    except (DecodeError, ValueError):
        return None
    entries = []
    for resource_logs in data.resource_logs:
        resource = _proto_attrs(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            for rec in scope_logs.log_records:
                entries.append(_otlp_entry(
                    resource, body=_proto_any(rec.body), attributes=_proto_attrs(rec.attributes),
                    time_ns=rec.time_unix_nano, observed_ns=rec.observed_time_unix_nano,
                    severity_text=rec.severity_text, severity_number=rec.severity_number))
    if not entries and not data.resource_logs:
        return None  # bytes that merely parse as an empty message: not OTLP
    return Envelope("otlp_proto", entries)


def _proto_attrs(items: Any) -> dict[str, Any]:
    return {kv.key: _proto_any(kv.value) for kv in items}


def _proto_any(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "kvlist_value":
        return _proto_attrs(value.kvlist_value.values)
    if which == "array_value":
        return [_proto_any(v) for v in value.array_value.values]
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def _otlp_entry(resource: dict[str, Any], *, body: Any, attributes: dict[str, Any],
                time_ns: int, observed_ns: int, severity_text: str,
                severity_number: int) -> Entry:
    service = _str(resource.get("service.name"))
    if service and service.startswith("unknown_service"):
        service = None  # the SDK's placeholder, not a name
    container = _str(resource.get("k8s.container.name"))
    service = (service or _str(resource.get("k8s.pod.labels.app.kubernetes.io/name"))
               or _str(resource.get("k8s.pod.labels.app")) or container
               or _str(resource.get("k8s.deployment.name")))
    level = normalize_level(severity_text) if severity_text else None
    if level is None and 1 <= severity_number <= 24:
        level = _OTEL_SEVERITY[(severity_number - 1) // 4]
    attrs = {k: v for k, v in resource.items() if k != "service.name"}
    attrs.update(attributes)
    time_field, nanos = ("timeUnixNano", time_ns) if time_ns else (
        "observedTimeUnixNano", observed_ns)
    when = datetime.fromtimestamp(nanos / 1e9, UTC) if nanos else None
    if body is None or isinstance(body, str):
        text = body or ""
    else:  # a structured body (kvlist, array, number) reads as a JSON line
        text = json.dumps(body, default=str, sort_keys=True)
    return Entry(_line(text), stream=service or _str(attributes.get("log.file.name")),
                 service=service, time=when, time_field=time_field if when else None,
                 level=level, attributes=attrs)


_JSON_READERS = {
    "otlp_json": _otlp_json, "fluentbit": _fluentbit, "vector": _vector, "ecs": _ecs,
    "rsyslog": _rsyslog, "syslog_ng": _syslog_ng,
}


# --- small helpers -----------------------------------------------------------------------


def _line(text: str) -> str:
    return text.rstrip("\r\n")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value and value != "-" else None


def _label_app(labels: dict[str, Any]) -> str | None:
    for name in _APP_LABELS:
        found = _str(labels.get(name))
        if found:
            return found
    return None


def _namespace(k8s: dict[str, Any]) -> Any:
    value = k8s.get("namespace")
    return _dict(value).get("name") if isinstance(value, dict) else value


def _time_value(value: Any) -> datetime | str | None:
    """A shipper's time: epoch seconds (Fluent Bit ``date``) as UTC, text as it is."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(float(value), UTC) if value > 0 else None
        except (OverflowError, OSError, ValueError):
            return None
    return value if isinstance(value, str) and value.strip() else None


def _rest(obj: dict[str, Any], taken: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in taken}


def _put(attrs: dict[str, Any], **values: Any) -> None:
    for key, value in values.items():
        if value not in (None, "", {}):
            attrs[key] = value
