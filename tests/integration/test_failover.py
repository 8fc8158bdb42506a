"""The 3-broker failover drill, at a size CI's two cores take in about a minute and a half.

``bench/failover_drill.py`` starts three KRaft nodes (replication 3,
``min.insync.replicas=2``), one worker, and SIGKILLs the node leading the most
pipeline partitions while records are still flowing, produces more while it is down
and starts it again. This test runs that drill as a user would and reads its JSON
result: the figures, not only its verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]


def test_killing_the_busiest_leader_loses_and_doubles_nothing(tmp_path: Path) -> None:
    from streams.dev.broker.launcher import LocalBroker
    from streams.errors import BrokerError

    try:
        LocalBroker(tmp_path / "jars-check").ensure_jars()
    except BrokerError as exc:
        pytest.skip(f"no Kafka distribution: {exc}")
    out = tmp_path / "drill.json"
    done = subprocess.run(
        [sys.executable, "bench/failover_drill.py", "--records", "6000", "--down", "5",
         "--kill-at", "0.2", "--timeout", "300", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=400)
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text("utf-8"))
    audit = r["audit"]
    assert audit["ok"] and audit["missing"] == 0 and audit["double_counted"] == 0, audit
    assert audit["raw_records"] == r["records"] == 9000, audit  # 6,000 before, 3,000 during
    assert r["produce_during_outage_exit"] == 0
    assert r["partitions_it_led"] > 0 and r["leaders_elected_s"] is not None
    assert r["final_lag"] == 0 and r["worker_lag_metric"] == 0
    assert r["partitions_stalled"] == 0
    assert r["leader_changes"] > 0  # the worker's own metric saw the new leaders
    assert r["all_replicas_in_sync_s"] is not None
    assert r["problems"] == [] and done.returncode == 0, done.stdout[-3000:]
