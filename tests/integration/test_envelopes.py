"""Shipper topics on the real broker: OTLP json and proto batches of 500 records, Fluent
Bit and rsyslog JSON, on two topics the user created (one listed with 3 partitions,
one found by the pattern with 1) -> worker -> `retro audit` counts log records, and
the report shows the lines' own time and the envelopes' services.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from helpers import otlp_logs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

EVENT = datetime(2017, 12, 1, 6, 0, tzinfo=UTC)  # the lines' own time
READ = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # when the shippers read them
LEVELS = ("INFO", "WARN", "ERROR", "INFO")


def _otlp(service: str, encoding: str) -> bytes:
    records = [{
        "body": f"{(EVENT + timedelta(seconds=i)).strftime('%Y-%m-%d %H:%M:%S')},000 "
                f"{LEVELS[i % 4]} [worker-{i % 3}] c.s.{service.title()} - "
                f"request {i} took {i % 50} ms on shard {i % 7}",
        "observed": READ} for i in range(500)]
    return otlp_logs(records, encoding=encoding, resource={
        "service.name": service, "k8s.pod.name": f"{service}-0", "k8s.namespace.name": "shop"})


def _fluent_bit(i: int) -> bytes:
    return json.dumps({
        "date": READ.timestamp(), "stream": "stderr",
        "time": (EVENT + timedelta(minutes=i)).isoformat().replace("+00:00", "Z"),
        "log": f"{(EVENT + timedelta(minutes=i)):%H:%M:%S}.440 ERROR o.a.c.c.C.[Tomcat] - "
               f"Servlet.service() threw exception {i}\n",
        "kubernetes": {"pod_name": "web-1", "namespace_name": "shop", "container_name": "web",
                       "labels": {"app.kubernetes.io/name": "storefront"}}}).encode()


def _rsyslog(i: int) -> bytes:
    line = f"{(EVENT + timedelta(minutes=i)):%Y-%m-%d %H:%M:%S},123 WARN cache miss ratio {i}"
    return json.dumps({
        "msg": line, "rawmsg": line, "timereported": READ.isoformat(), "hostname": "app-host",
        "syslogtag": "billing", "programname": "billing", "app-name": "billing",
        "syslogseverity": "5", "syslogfacility": "16", "pri": "133",
        "$!": {"metadata": {"filename": "/var/log/billing.log"}}}).encode()


async def _create_and_fill(bootstrap: str, listed: str, matched: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(listed, 3, 1), NewTopic(matched, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=1024 * 1024)
    await producer.start()
    try:  # no key, as the collector sends by default
        await producer.send_and_wait(listed, _otlp("checkout", "json"), partition=0)
        await producer.send_and_wait(listed, _otlp("payments", "proto"), partition=2)
        for i in range(5):
            await producer.send_and_wait(matched, _fluent_bit(i), partition=0)
            await producer.send_and_wait(matched, _rsyslog(i), partition=0)
    finally:
        await producer.stop()
    return 1000 + 10


def test_shipper_topics_are_audited_by_log_record(pipeline_factory) -> None:
    """The clean loop finds the second topic by the pattern."""
    p = pipeline_factory()
    listed, matched = f"{p.prefix}.otlp_logs", f"{p.prefix}.logs.app"
    p.env["RETRO_TOPICS__RAW"] = listed
    p.env["RETRO_TOPICS__RAW_PATTERN"] = rf"^{p.prefix}\.logs\..*"
    bootstrap = p.env["RETRO_KAFKA__BOOTSTRAP"]

    empty = p.retro("audit", check=False)  # nothing created yet: never "ok"
    assert empty.returncode == 2
    assert f"input topic {listed} does not exist" in empty.stderr.decode()

    expected = asyncio.run(_create_and_fill(bootstrap, listed, matched))
    p.start_worker()
    proc = p.retro("audit", "--wait", "300", check=False, timeout=420)
    result = json.loads(proc.stdout)
    assert result["ok"], (result, proc.stderr.decode()[-2000:], p.worker_logs()[-6000:])
    assert (result["raw_records"], result["raw_messages"]) == (expected, 12)
    assert sum(result["claimed"].values()) == expected
    assert not result["problems"]

    # lag is measured on the pattern's topics too
    from streams.app import consumer_offsets
    from streams.worker.stages import clean_group

    settings = p.settings()
    lag = asyncio.run(consumer_offsets(settings, clean_group(settings.app_id),
                                       settings.topics.raw_topics, inputs=True))
    assert set(lag) == {(listed, 0), (listed, 1), (listed, 2), (matched, 0)}

    report = json.loads(p.retro("report", "--format", "json").stdout)
    assert report["id"].startswith("2017-12-01"), report["id"]  # the lines' time, not 2026
    assert report["first_seen"].startswith("2017-12-01T06:00:00")
    assert report["record_count"] == expected
    assert {"checkout", "payments", "storefront", "billing"} <= set(report["services"]), (
        report["services"])
    assert {k.split("/")[0] for k in report["covered"]} == {listed, matched}
    assert {k for k in report["covered"] if "@" in k} == {f"{listed}/0@0:500",
                                                          f"{listed}/2@0:500"}
