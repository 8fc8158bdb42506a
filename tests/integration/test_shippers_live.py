"""Real shippers live into the test broker, a worker on their topics, then the audit.

rsyslog omkafka (a JSON template and ``%jsonmesg%``), syslog-ng ``format-json`` and
``kcat -P`` read the small logs of tests/fixtures/shippers/input/ into topics created
here, as a platform team would (any partition count), with the configs of
bench/shippers/. One worker consumes them all (``RETRO_TOPICS__RAW=a,b,...``); the
audit must count every log record, and each must carry its line's own event time,
level and the service the shipper was told. A shipper that is not installed is left
out (``.ci/test`` installs them when it can); with none, the test skips.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
import warnings
from pathlib import Path

import pytest

from streams.dev import shippers
from streams.kafka.readers import read_topic
from streams.records import NormalizedRecord

from helpers import (
    REPO,
    SHIPPER_FIXTURES,
    shipper_field_errors,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CONFIGS = REPO / "bench" / "shippers"
SYSLOG_NG_ROOTS = [REPO / ".ci-cache" / "syslog-ng" / "root"]
INPUT_LINES = sum(len(p.read_text().splitlines()) for p in (SHIPPER_FIXTURES / "input").iterdir())


def _available() -> tuple[list[str], list[str]]:
    have = {"rsyslog": shippers.rsyslogd() is not None,
            "syslog-ng": shippers.syslog_ng_root(SYSLOG_NG_ROOTS) is not None,
            "kcat": shippers.kcat() is not None}
    return [n for n, ok in have.items() if ok], [n for n, ok in have.items() if not ok]


def _ship(name: str, bootstrap: str, work: Path, prefix: str) -> dict[str, str]:
    """Run one shipper into fresh topics; its captures by topic name."""
    work.mkdir()
    inputs = work / "input"
    shutil.copytree(SHIPPER_FIXTURES / "input", inputs)
    if name == "rsyslog":
        topics = {"TOPIC_TEMPLATE": f"{prefix}.rsyslog-template",
                  "TOPIC_JSONMESG": f"{prefix}.rsyslog-jsonmesg"}
        asyncio.run(shippers.create_topics(bootstrap, list(topics.values()), partitions=1))
        shippers.ship_rsyslog(CONFIGS / "rsyslog.conf", work, bootstrap=bootstrap,
                              input_dir=inputs, topics=topics, lines=INPUT_LINES)
    elif name == "syslog-ng":
        topics = {"TOPIC_JSON": f"{prefix}.syslog-ng-json"}
        asyncio.run(shippers.create_topics(bootstrap, list(topics.values()), partitions=2))
        root = shippers.syslog_ng_root(SYSLOG_NG_ROOTS)
        assert root is not None
        shippers.ship_syslog_ng(root, CONFIGS / "syslog-ng.conf", work, bootstrap=bootstrap,
                                input_dir=inputs, topics=topics, lines=INPUT_LINES)
    else:
        topics = {"kcat": f"{prefix}.kcat"}
        asyncio.run(shippers.create_topics(bootstrap, list(topics.values()), partitions=3))
        services = json.loads((SHIPPER_FIXTURES / "services.json").read_text())
        for file, service in services.items():
            shippers.run_kcat(bootstrap, topics["kcat"], inputs / file, key=service)
    return {topic: topic.rsplit(".", 1)[1] for topic in topics.values()}


async def _records(settings) -> list[NormalizedRecord]:
    out = []
    for lane in (settings.topics.fast, settings.topics.slow):
        async for _key, value in read_topic(settings, lane):
            out.append(NormalizedRecord.model_validate_json(value))
    return out


def test_real_shippers_into_a_worker_every_record_normalized_and_audited(
        pipeline_factory, kafka_bootstrap: str, tmp_path: Path) -> None:
    names, missing = _available()
    if not names:
        pytest.skip("no shipper installed (apt-get install rsyslog-kafka kcat; syslog-ng "
                    "unpacked into .ci-cache/syslog-ng/root by .ci/test)")
    if missing:
        warnings.warn(f"shippers not installed, left out: {missing}", stacklevel=1)
    prefix = f"s{uuid.uuid4().hex[:8]}"
    kinds: dict[str, str] = {}
    for name in names:
        kinds |= _ship(name, kafka_bootstrap, tmp_path / name, prefix)
    p = pipeline_factory(RETRO_TOPICS__RAW=",".join(sorted(kinds)))
    p.start_worker()
    proc = p.retro("audit", "--wait", "240", check=False, timeout=400)
    result = json.loads(proc.stdout.decode() or "{}")
    assert result.get("ok"), (proc.stdout.decode()[-2000:], proc.stderr.decode()[-2000:],
                              p.worker_logs())
    assert result["raw_records"] == INPUT_LINES * len(kinds)

    records = asyncio.run(_records(p.settings()))
    wrong: list[str] = []
    for topic, kind in sorted(kinds.items()):
        mine = [r for r in records if r.raw.topic == topic]
        wrong += [f"{kind}: {error}"
                  for error in shipper_field_errors(mine, service_from_source=kind == "kcat")]
    assert not wrong, f"{len(wrong)} wrong fields:\n" + "\n".join(wrong)
