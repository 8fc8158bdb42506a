"""Shipper envelopes through the Cleaner: each record parsed again like a line, the
line's own time first, the envelope's service and metadata, one coordinate per record.

Field layouts follow what each shipper writes (../shared/notes/shippers.md); OTLP
messages are built with the official ``opentelemetry-proto`` bindings.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from streams.clean.cleaner import Cleaner
from streams.clean.envelopes import detect_json, unwrap
from streams.intervals import Coverage
from streams.records import DeadLetter, NormalizedRecord, RawCoord

from helpers import make_cleaner, otlp_logs

COORD = RawCoord(topic="otlp_logs", partition=1, offset=7)
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # when the shippers read the files
EVENT = datetime(2017, 12, 1, 6, 33, 4, 440000, tzinfo=UTC)  # when the lines happened
K8S = {"service.name": "checkout", "k8s.pod.name": "checkout-7d9f-x2", "k8s.namespace.name": "shop"}


def make(**overrides: object) -> Cleaner:
    return make_cleaner(NOW, **overrides)


def records(out: list[NormalizedRecord | DeadLetter]) -> list[NormalizedRecord]:
    assert all(isinstance(r, NormalizedRecord) for r in out), out
    return out  # type: ignore[return-value]


def one(raw: bytes | dict, topic: str = "app-logs", **kw: object) -> NormalizedRecord:
    data = json.dumps(raw).encode() if isinstance(raw, dict) else raw
    out = make(**kw).clean(data, RawCoord(topic=topic, partition=0, offset=3), "unknown")
    assert len(out) == 1 and isinstance(out[0], NormalizedRecord), out
    assert out[0].raw == RawCoord(topic=topic, partition=0, offset=3)  # today's coordinate
    return out[0]


# --- OTLP -------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["proto", "json"])
def test_otlp_message_yields_one_record_per_log_record(encoding: str) -> None:
    raw = otlp_logs([
        {"body": "2017-12-01 06:33:04,440 ERROR [pool-1] c.s.Db - connection refused",
         "observed": NOW},
        {"body": "cart emptied", "time": EVENT, "observed": NOW, "severity_text": "Warning"},
        {"body": '{"msg": "paid", "order": 42}', "observed": NOW, "severity_number": 17,
         "attributes": {"log.file.name": "checkout.log"}},
    ], resource=K8S, encoding=encoding)
    assert unwrap(raw) is not None and unwrap(raw).kind == f"otlp_{encoding}"  # type: ignore[union-attr]
    out = records(make().clean(raw, COORD, "unknown"))
    assert [r.raw for r in out] == [
        RawCoord(topic="otlp_logs", partition=1, offset=7, index=i, count=3) for i in range(3)]
    assert [r.id for r in out] == [f"otlp_logs/1/7/{i}" for i in range(3)]
    assert {r.service for r in out} == {"checkout"}
    line, sdk, structured = out
    # the line's own time wins over the collector's observed time
    assert (line.timestamp, line.timestamp_rule, line.level) == (
        "2017-12-01T06:33:04.440Z", "line,zone-assumed:UTC", "ERROR")
    # no time in the line: the record's timeUnixNano, then its level from severityText
    assert (sdk.timestamp, sdk.timestamp_rule, sdk.level) == (
        "2017-12-01T06:33:04.440Z", "envelope:timeUnixNano", "WARN")
    # JSON in the body is parsed as JSON; severityNumber 17 is ERROR; only observed time
    assert (structured.format, structured.message, structured.level) == ("json", "paid", "ERROR")
    assert structured.timestamp_rule == "envelope:observedTimeUnixNano"
    assert structured.attributes["order"] == 42
    assert structured.attributes["log.file.name"] == "checkout.log"
    assert line.attributes["k8s.pod.name"] == "checkout-7d9f-x2"
    assert line.attributes["envelope"] == f"otlp_{encoding}"


def test_a_400kb_otlp_message_of_500_records_is_not_too_large() -> None:
    bodies = [{"body": f"2017-12-01 06:33:{i % 60:02d} INFO request {i} " + "x" * 700}
              for i in range(500)]
    raw = otlp_logs(bodies, resource=K8S, encoding="json")
    assert len(raw) > 350_000
    out = records(make(max_record_bytes=65536).clean(raw, COORD, "unknown"))
    assert len(out) == 500
    # the ledger: one key for the message, one range over its indices
    ledger = Coverage.from_entries(r.raw.ledger_entry() for r in out)
    assert ledger.to_json() == {"otlp_logs/1@7:500": [[0, 499]]}
    assert len(ledger) == 500


def test_one_oversized_record_inside_is_one_dead_letter_with_its_coordinate() -> None:
    raw = otlp_logs([{"body": "ok one"}, {"body": "y" * 5000}, {"body": "ok three"}])
    out = make(max_record_bytes=4096).clean(raw, COORD, "unknown")
    assert [type(r).__name__ for r in out] == ["NormalizedRecord", "DeadLetter",
                                              "NormalizedRecord"]
    dead = out[1]
    assert isinstance(dead, DeadLetter) and dead.reason == "too_large"
    assert dead.raw == RawCoord(topic="otlp_logs", partition=1, offset=7, index=1, count=3)
    assert dead.id == "otlp_logs/1/7/1" and dead.raw_size == 5000


def test_a_message_over_the_kafka_limit_is_too_large() -> None:
    raw = otlp_logs([{"body": "z" * 3000} for _ in range(5)])
    out = make(max_message_bytes=10_000).clean(raw, COORD, "unknown")
    assert len(out) == 1 and isinstance(out[0], DeadLetter) and out[0].reason == "too_large"
    assert out[0].raw == COORD


def test_an_empty_otlp_batch_is_accounted_for_as_a_dead_letter() -> None:
    raw = json.dumps({"resourceLogs": [{"resource": {}, "scopeLogs": []}]}).encode()
    out = make().clean(raw, COORD, "unknown")
    assert len(out) == 1 and isinstance(out[0], DeadLetter)
    assert (out[0].reason, out[0].raw) == ("empty_envelope", COORD)


# --- single-record envelopes -------------------------------------------------------------


def test_fluent_bit_kubernetes_time_of_day_line_takes_the_date_and_service() -> None:
    rec = one({
        "date": NOW.timestamp(), "time": "2017-12-01T06:33:04.440123Z", "stream": "stderr",
        "log": "06:33:04.440 ERROR o.a.c.c.C.[Tomcat].[localhost] - Servlet failed\n",
        "kubernetes": {"pod_name": "web-5d8-abc", "namespace_name": "shop",
                       "container_name": "web", "host": "node-3",
                       "labels": {"app": "web", "app.kubernetes.io/name": "storefront"}}})
    assert rec.service == "storefront"  # not the topic, not the key
    assert rec.level == "ERROR"
    assert rec.timestamp == "2017-12-01T06:33:04.440Z"
    assert rec.timestamp_rule == "line,date-from:envelope:time"
    assert rec.message.startswith("o.a.c.c.C.[Tomcat]") or "Servlet failed" in rec.message
    assert {k: rec.attributes[k] for k in ("pod", "namespace", "container", "stream")} == {
        "pod": "web-5d8-abc", "namespace": "shop", "container": "web", "stream": "stderr"}
    assert rec.source == "storefront"  # no Kafka key: the envelope names the stream


def test_fluent_bit_json_inside_log_is_unwrapped() -> None:
    rec = one({"date": NOW.timestamp(), "log": json.dumps(
        {"ts": "2017-12-01T06:33:04.440Z", "level": "warn", "msg": "slow query", "ms": 812}),
        "kubernetes": {"container_name": "db-proxy", "labels": {}}})
    assert (rec.format, rec.level, rec.message) == ("json", "WARN", "slow query")
    assert (rec.timestamp, rec.timestamp_rule) == ("2017-12-01T06:33:04.440Z", "line")
    assert rec.service == "db-proxy" and rec.attributes["ms"] == 812


def test_fluent_bit_without_kubernetes_falls_back_to_its_date() -> None:
    rec = one({"date": 1512109984.44, "log": "connection reset by peer"})
    assert (rec.timestamp, rec.timestamp_rule) == ("2017-12-01T06:33:04.440Z", "envelope:date")
    assert rec.attributes["envelope"] == "fluentbit"


def test_vector_kubernetes_logs_logfmt_line() -> None:
    rec = one({
        "file": "/var/log/pods/prod_api-1_0/api/0.log", "source_type": "kubernetes_logs",
        "message": 'ts=2017-12-01T06:33:04.44Z level=error msg="upstream gone" route=/pay',
        "stream": "stderr", "timestamp": "2026-12-01T11:59:59.1Z",
        "kubernetes": {"container_name": "api", "pod_name": "api-1", "pod_namespace": "prod",
                       "pod_labels": {"app": "payments"}, "pod_node_name": "n1"}})
    assert (rec.format, rec.level, rec.message, rec.service) == (
        "logfmt", "ERROR", "upstream gone", "payments")
    assert (rec.timestamp, rec.timestamp_rule) == ("2017-12-01T06:33:04.440Z", "line")
    assert rec.attributes["namespace"] == "prod" and rec.attributes["route"] == "/pay"


def test_vector_file_source_without_time_in_line_uses_its_timestamp() -> None:
    rec = one({"file": "/var/log/app.log", "host": "h1", "message": "worker restarted",
               "source_type": "file", "timestamp": "2017-12-01T06:33:04.440Z"})
    assert (rec.timestamp, rec.timestamp_rule) == ("2017-12-01T06:33:04.440Z",
                                                   "envelope:timestamp")
    assert rec.attributes["host"] == "h1" and rec.source == "/var/log/app.log"


def test_filebeat_ecs_document() -> None:
    rec = one({
        "@timestamp": "2026-12-01T11:59:59.000Z",
        "message": "2017-12-01 06:33:04.440 WARN 1 --- [main] c.a.Billing : card declined",
        "log": {"file": {"path": "/var/log/containers/billing.log"}, "offset": 812},
        "kubernetes": {"pod": {"name": "billing-0"}, "namespace": "pay",
                       "container": {"name": "billing"},
                       "labels": {"app_kubernetes_io/name": "billing-api"}},
        "container": {"name": "billing", "id": "abc"}, "host": {"name": "node-1"},
        "agent": {"type": "filebeat", "version": "8.15.0"}, "ecs": {"version": "8.0.0"},
        "input": {"type": "filestream"}, "stream": "stdout"})
    assert rec.attributes["envelope"] == "ecs"
    assert (rec.timestamp, rec.timestamp_rule, rec.level) == (
        "2017-12-01T06:33:04.440Z", "line,zone-assumed:UTC", "WARN")
    assert rec.service == "billing-api"  # Kubernetes label, de-dotted as Filebeat writes it
    assert rec.attributes["pod"] == "billing-0" and rec.attributes["host"] == "node-1"


def test_elastic_agent_service_name_and_log_level() -> None:
    rec = one({"@timestamp": "2017-12-01T06:33:04.440Z", "message": "cache miss",
               "log": {"level": "debug"}, "service": {"name": "catalog"},
               "data_stream": {"dataset": "generic"}})
    assert (rec.service, rec.level, rec.timestamp_rule) == (
        "catalog", "DEBUG", "envelope:@timestamp")


def test_rsyslog_jsonmesg_keeps_the_lines_year_not_the_read_time() -> None:
    rec = one({
        "msg": "2017-12-01 06:33:04,440 ERROR Failed to connect to db",
        "rawmsg": "2017-12-01 06:33:04,440 ERROR Failed to connect to db",
        "timereported": "2026-12-01T11:59:59.123456+00:00", "hostname": "app-host",
        "syslogtag": "billing", "programname": "billing", "protocol-version": "0",
        "structured-data": "-", "app-name": "billing", "procid": "-", "msgid": "-",
        "inputname": "imfile", "fromhost": "", "fromhost-ip": "", "pri": "133",
        "syslogfacility": "16", "syslogseverity": "5", "timegenerated": "2026-12-01T12:00:00Z",
        "$!": {"metadata": {"filename": "/var/log/billing.log", "fileoffset": "0"}}})
    assert (rec.timestamp, rec.level, rec.service) == (
        "2017-12-01T06:33:04.440Z", "ERROR", "billing")
    assert rec.attributes["file"] == "/var/log/billing.log"
    assert rec.attributes["host"] == "app-host"


def test_rsyslog_line_without_time_uses_timereported_and_severity() -> None:
    rec = one({"msg": " disk almost full", "timereported": "2017-12-01T06:33:04.440+01:00",
               "programname": "kernel", "syslogseverity": 4, "hostname": "h"})
    assert (rec.message, rec.level, rec.service) == ("disk almost full", "WARN", "kernel")
    assert (rec.timestamp, rec.timestamp_rule) == ("2017-12-01T05:33:04.440Z",
                                                   "envelope:timereported")


def test_syslog_ng_format_json_bsd_date_without_year() -> None:
    rec = one({"PROGRAM": "nginx", "PRIORITY": "notice", "MESSAGE": "upstream timed out",
               "HOST": "web1", "FILE_NAME": "/var/log/nginx/error.log", "FACILITY": "user",
               "DATE": "Dec  1 06:33:04", "SOURCE": "s_files"})
    assert (rec.service, rec.level) == ("nginx", "NOTICE")
    assert rec.timestamp == "2026-12-01T06:33:04.000Z"
    assert rec.timestamp_rule == "envelope:DATE,year-assumed:2026,zone-assumed:UTC"
    assert rec.attributes["file"] == "/var/log/nginx/error.log"


def test_syslog_ng_line_time_wins_over_date() -> None:
    rec = one({"PROGRAM": "app", "MESSAGE": "2017-12-01T06:33:04.440Z ERROR boom",
               "DATE": "Dec  1 11:59:59", "HOST": "h"})
    assert (rec.timestamp, rec.timestamp_rule, rec.level) == (
        "2017-12-01T06:33:04.440Z", "line", "ERROR")


# --- not envelopes, and overrides ---------------------------------------------------------


def test_plain_lines_and_docker_json_file_are_read_as_before() -> None:
    plain = one(b"2017-12-01 06:33:04 INFO plain line from kcat")
    assert "envelope" not in plain.attributes and plain.timestamp_rule == "zone-assumed:UTC"
    docker = one({"log": "2017-12-01 06:33:04 INFO x\n", "stream": "stdout",
                  "time": "2017-12-01T06:33:04.5Z"})
    assert docker.format == "docker" and "envelope" not in docker.attributes


@pytest.mark.parametrize("line", [
    {"level": 30, "time": 1512109984440, "pid": 7, "hostname": "h", "msg": "pino line"},
    {"@timestamp": "2017-12-01T06:33:04Z", "log.level": "info", "message": "ecs-logging",
     "ecs.version": "1.6.0"},
    {"ts": "2017-12-01T06:33:04Z", "log": "a field named log", "user": "x"},
    {"message": "an app line", "host": "h", "timestamp": "2017-12-01T06:33:04Z"},
])
def test_an_applications_own_json_lines_are_not_envelopes(line: dict) -> None:
    assert detect_json(line) is None
    assert "envelope" not in one(line).attributes


def test_override_forces_plain_on_a_topic() -> None:
    msg = {"date": 1512109984.44, "log": "kept whole"}
    rec = one(msg, topic="app-logs", envelopes={"app-logs": "plain"})
    assert rec.format == "json" and "envelope" not in rec.attributes


def test_override_that_does_not_fit_is_a_dead_letter_naming_it() -> None:
    out = make(envelopes={"otlp_logs": "otlp_proto"}).clean(b'{"a": 1}', COORD, "k")
    assert len(out) == 1 and isinstance(out[0], DeadLetter)
    assert out[0].reason == "bad_envelope" and "RETRO_CLEAN__ENVELOPE" in out[0].detail


def test_envelope_metadata_is_redacted_like_the_rest() -> None:
    raw = otlp_logs([{"body": "call failed", "attributes": {
        "url.full": "https://app:hunter2secret@api.internal/pay"}}], resource=K8S)
    (rec,) = records(make().clean(raw, COORD, "unknown"))
    assert "hunter2secret" not in json.dumps(rec.attributes)
    assert rec.redactions


def test_a_binary_key_gives_way_to_the_envelopes_stream() -> None:
    raw = otlp_logs([{"body": "one"}, {"body": "two"}], resource=K8S)
    key = bytes.fromhex("9f3a0c11d2e4b5a6c7d8e9f00112a3b4").decode("utf-8", "replace")
    out = records(make().clean(raw, COORD, key))
    assert {r.source for r in out} == {"checkout"}


def test_envelope_records_are_counted_by_envelope() -> None:
    from streams.metrics import Metrics

    metrics = Metrics()
    cleaner = make(metrics=metrics)
    cleaner.clean(otlp_logs([{"body": "a"}, {"body": "b"}]), COORD, "k")
    cleaner.clean(b"a bare line", COORD, "k")
    value = metrics.registry.get_sample_value
    assert value("retro_records_envelope_total", {"envelope": "otlp_proto"}) == 2
    assert value("retro_records_envelope_total", {"envelope": "plain"}) is None


def test_a_dated_line_keeps_its_assumed_zone_whatever_the_read_time() -> None:
    """The collector read the file at 12:00 UTC; the line says 06:33 with no zone. The
    5.5 hours between them are the read delay, not the line's zone."""
    raw = otlp_logs([{"body": "2026-12-01 06:33:04,440 INFO started", "observed": NOW},
                     {"body": "2026-12-01 06:33:05,000 INFO ready", "observed": NOW}])
    out = records(make().clean(raw, COORD, "k"))
    assert [(r.timestamp, r.timestamp_rule) for r in out] == [
        ("2026-12-01T06:33:04.440Z", "line,zone-assumed:UTC"),
        ("2026-12-01T06:33:05.000Z", "line,zone-assumed:UTC")]


def test_a_shippers_epoch_written_as_text_is_a_time() -> None:
    rec = one({"@timestamp": "1512109984.44", "log": "no time in this line"})
    assert (rec.timestamp, rec.timestamp_rule) == ("2017-12-01T06:33:04.440Z",
                                                   "envelope:@timestamp")


@pytest.mark.parametrize("encoding", ["proto", "json"])
def test_a_structured_otlp_body_is_read_as_json(encoding: str) -> None:
    from google.protobuf import json_format
    from opentelemetry.proto.logs.v1.logs_pb2 import LogsData

    data = LogsData()
    rec = data.resource_logs.add().scope_logs.add().log_records.add()
    for key, value in (("level", "error"), ("msg", "payment declined")):
        rec.body.kvlist_value.values.add(key=key).value.string_value = value
    data.resource_logs[0].scope_logs[0].log_records.add()  # a record with no body at all
    raw = data.SerializeToString() if encoding == "proto" else json_format.MessageToJson(
        data).encode()
    structured, empty = records(make().clean(raw, COORD, "k"))
    assert (structured.format, structured.level, structured.message) == (
        "json", "ERROR", "payment declined")
    assert empty.message == ""
