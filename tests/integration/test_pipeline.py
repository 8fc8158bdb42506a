"""End to end on the real broker: raw logs -> fragments -> reports, audited.

Covers the "nothing lost" promise with the embedded rules model, with the simulated
provider injecting faults (429s, 5xx, malformed and wrong answers, truncation),
through a worker killed with SIGKILL mid-stream and restarted, and through a second
worker joining and leaving the consumer group mid-stream.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import commits_catch_up, free_port
from helpers import start_fake_llm as _start_fake_llm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _sample(tmp_path: Path, records: int) -> list[str]:
    from streams.dev.sample import write_sample

    return [str(p) for p in write_sample(tmp_path / "sample", records=records, include_bad=True)]


def _produced(proc: subprocess.CompletedProcess[bytes]) -> int:
    return int(proc.stderr.decode().split("produced ")[1].split(" ")[0])


def _audit(p, wait: float = 240) -> dict:
    proc = p.retro("audit", "--wait", str(wait), check=False, timeout=wait + 120)
    out = proc.stdout.decode()
    assert out.strip(), proc.stderr.decode()[-3000:]
    result = json.loads(out)
    assert proc.returncode == (0 if result["ok"] else 2)
    return result


def _consumer_groups(p) -> set[str]:
    """The consumer groups the broker knows."""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    from streams.kafka.connect import aiokafka_kwargs

    async def listed() -> set[str]:
        admin = AIOKafkaAdminClient(**aiokafka_kwargs(p.settings()))
        await admin.start()
        try:
            return {group[0] for group in await admin.list_consumer_groups()}
        finally:
            await admin.close()

    return asyncio.run(listed())


def test_rules_model_end_to_end_report_and_views(pipeline_factory, tmp_path: Path,
                                                 wait_until) -> None:
    p = pipeline_factory(RETRO_REPORT__ROLLUP_SECONDS="1")
    paths = _sample(tmp_path, 2000)
    total = _produced(p.retro("produce", "--quiet", *paths))
    p.start_worker()
    result = _audit(p)
    assert result["ok"], (result, p.worker_logs())
    assert result["raw_records"] == total
    assert sum(result["claimed"].values()) == total
    assert result["claimed"]["deadletter"] >= 2  # the sample's garbage and oversized lines
    # faust only hosts the worker: the stages read in groups of their own, and no
    # consumer ever joined the app id's group (faust's own consumer would)
    app_id = p.settings().app_id
    groups = _consumer_groups(p)
    assert {f"{app_id}-raw", f"{app_id}-lanes", f"{app_id}-fragments"} <= groups, groups
    assert app_id not in groups, groups

    def summarized() -> dict | None:
        report = json.loads(p.retro("report", "--format", "json").stdout)
        done = all(i.get("summary") and i["summary_count"] == i["count"]
                   for i in report["incidents"])
        return report if done else None

    # the roll-up timer rewrote every incident's summary through the gateway
    report = wait_until(summarized, timeout=90, interval=2, what="incident roll-ups")
    top = report["incidents"][0]
    assert top["event"].split(" (")[0] in top["summary"] or str(top["count"]) in top["summary"]

    md = p.retro("report").stdout.decode()
    # the post-mortem's sections that every report has, incident or not
    for section in ("## Summary", "## Timeline", "## Routine and unclassified",
                    "## Data coverage"):
        assert section in md
    assert md.count("\n") <= 150
    assert "hunter2" not in md and "4111 1111 1111 1111" not in md
    # the sample's unreadable records are named in the report, with where to look
    assert "Dead letters (unreadable records): " in md and "`retro deadletter` lists them" in md

    def reports() -> list | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{p.web_port}/reports",
                                        timeout=5) as r:
                return json.loads(r.read()) or None
        except OSError:
            return None

    listed = wait_until(reports, timeout=60, what="reports over HTTP")
    first = listed[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{p.web_port}/reports/{first['id']}",
                                timeout=5) as r:
        body = json.loads(r.read())
    assert body["id"] == first["id"] and body["incidents"]
    with urllib.request.urlopen(f"http://127.0.0.1:{p.web_port}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert "retro_records_routed_total" in metrics
    assert "retro_partitions_stalled 0.0" in metrics  # a series from the start, not on first use
    for probe in ("livez", "healthz"):  # liveness answers; readiness: nothing stalled
        with urllib.request.urlopen(f"http://127.0.0.1:{p.web_port}/{probe}", timeout=5) as r:
            assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    assert "retro_batches_total" in metrics

    # the live page, in a real browser: it renders the report and follows new versions
    _page_follows_updates(p, first["id"], first["version"], tmp_path)


def _chrome():
    import shutil

    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("Debian's chromium and chromium-driver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,1600"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def _page_follows_updates(p, report_id: str, version: int, tmp_path: Path) -> None:
    import re

    from selenium.webdriver.support.ui import WebDriverWait

    def page_text(d) -> str:
        return d.execute_script("return document.body ? document.body.innerText : ''")

    driver = _chrome()
    try:
        driver.get(f"http://127.0.0.1:{p.web_port}/view/{report_id}")
        WebDriverWait(driver, 30).until(lambda d: "Summary" in page_text(d))
        body = page_text(driver)
        shown = int(re.search(r"version (\d+)", body).group(1))
        assert shown >= version, body[:500]
        version = shown
        assert "Suggested actions" in body and "Timeline" in body
        before = driver.get_screenshot_as_png()
        (tmp_path / "report-before.png").write_bytes(before)

        # more logs arrive in the same window: the page must show the new version
        from streams.dev.sample import write_sample

        more = write_sample(tmp_path / "more", records=400, seed=99, include_bad=False)
        p.retro("produce", "--quiet", *map(str, more))
        # the page reloads itself: an element read mid-reload is stale, so read the text
        # in one script call
        WebDriverWait(driver, 180, poll_frequency=1).until(
            lambda d: "Summary" in (text := page_text(d)) and f"version {version}," not in text)
        after = driver.get_screenshot_as_png()
        (tmp_path / "report-after.png").write_bytes(after)
        assert _png_size(after)[0] >= 1000
        assert after != before
        # a blank or error page compresses to a few kB; a rendered report does not
        assert len(after) > 40_000, len(after)
    finally:
        driver.quit()


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


class _Workers:
    """Workers of one pipeline, each with its own web port and state folder, and how
    many records each has consumed (0 while it is not up)."""

    def __init__(self, p, count: int = 2) -> None:
        self.p = p
        self.ports = [p.web_port] + [free_port() for _ in range(count - 1)]

    def start(self, i: int) -> subprocess.Popen[bytes]:
        return self.p.start_worker(RETRO_WEB_PORT=str(self.ports[i]),
                                   RETRO_STATE_DIR=str(self.p.state_dir / f"w{i}"))

    def consumed(self, i: int) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[i]}/metrics",
                                        timeout=5) as r:
                return _metric_sum(r.read().decode(), "retro_records_consumed_total")
        except OSError:
            return 0.0



def test_faulty_provider_loses_nothing(pipeline_factory, tmp_path: Path) -> None:
    """429s with Retry-After, 5xx, malformed JSON and wrong ids: every record still
    ends in exactly one report, review or dead letter, and no secret reaches the model."""
    port = free_port()
    # 5 requests a window: even the smallest run's batches (8 requests without ../shared)
    # overrun it; a 10 s window makes each 429's Retry-After cost seconds, not a minute
    fake = _start_fake_llm(tmp_path, port, "--rpm", "5", "--window-seconds", "10",
                           "--error-rate", "0.15", "--malformed-rate", "0.1",
                           "--wrong-ids-rate", "0.1", "--seed", "3")
    try:
        p = pipeline_factory(
            RETRO_MODEL__BASE_URL=f"http://127.0.0.1:{port}/v1",
            RETRO_MODEL__NAME="fake-gpt",
            RETRO_MODEL__BACKOFF_BASE_SECONDS="0.2",
            # the worker would keep under the fake's advertised remaining count, and this
            # test is about what happens when 429s do come
            RETRO_MODEL__ADVERTISED_LIMITS="false",
        )
        paths = _sample(tmp_path, 1500)
        hdfs = SHARED / "loghub" / "HDFS" / "HDFS_2k.log"
        if hdfs.exists():
            paths.append(str(hdfs))
        total = _produced(p.retro("produce", "--quiet", *paths))
        p.start_worker()
        result = _audit(p, wait=300)
        assert result["ok"], (result, p.worker_logs())
        assert result["raw_records"] == total

        stats = _fake_stats(port)
        assert stats["rate_limited"] > 0, stats
        assert stats["errors_5xx"] > 0 and stats["malformed"] + stats["wrong_ids"] > 0, stats
        with urllib.request.urlopen(f"http://127.0.0.1:{p.web_port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert _metric_sum(metrics, "retro_model_rate_limited_total") > 0
        assert _metric_sum(metrics, "retro_model_retries_total") > 0

        from streams.dev.sample import SECRETS

        prompts = json.dumps(_fake_requests(port), ensure_ascii=False)
        assert "[REDACTED:" in prompts  # the sample's secrets were there, as placeholders
        for secret in SECRETS:
            assert secret not in prompts, f"{secret!r} reached the model"
    finally:
        fake.kill()


def test_sigterm_with_batches_in_flight_drains_within_the_grace_and_loses_nothing(
        pipeline_factory, tmp_path: Path, wait_until) -> None:
    """SIGTERM while batches wait on a slow model (4 s a call): the batch loop stops
    fetching, gives its batches RETRO_SHUTDOWN_SECONDS, commits what is done and
    leaves, so the worker exits well inside a pod's grace period (60 s in deploy/);
    the next worker reads the rest again and the audit is exact."""
    port = free_port()
    fake = _start_fake_llm(tmp_path, port, "--base-latency", "4", "--seed", "5")
    try:
        p = pipeline_factory(RETRO_MODEL__BASE_URL=f"http://127.0.0.1:{port}/v1",
                             RETRO_MODEL__NAME="fake-gpt", RETRO_SHUTDOWN_SECONDS="6")
        total = _produced(p.retro("produce", "--quiet", *_sample(tmp_path, 1500)))
        worker = p.start_worker()
        wait_until(lambda: _fake_stats(port)["requests"] >= 2, timeout=120,
                   what="batches in flight at the model")
        asked = time.monotonic()
        os.killpg(worker.pid, signal.SIGTERM)
        code = worker.wait(timeout=60)
        took = time.monotonic() - asked
        assert took < 6 + 20, (took, p.worker_logs())  # the drain plus the host's stop
        assert code == 0, (code, p.worker_logs())
        p.start_worker()
        result = _audit(p, wait=300)
        assert result["ok"], (result, p.worker_logs())
        assert result["raw_records"] == total
        commits_catch_up(p)
    finally:
        fake.kill()


def _metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _fake_stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_fake/stats", timeout=5) as r:
        return json.loads(r.read())


def _fake_requests(port: int) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_fake/requests", timeout=10) as r:
        return json.loads(r.read())


def test_crash_and_restart_counts_every_record_once(pipeline_factory, tmp_path: Path,
                                                    wait_until) -> None:
    """SIGKILL twice mid-stream: every record is still counted once."""
    # a SIGKILLed worker's partitions move once its session ends: the broker's minimum
    p = pipeline_factory(RETRO_KAFKA__SESSION_TIMEOUT_SECONDS="6")
    paths = _sample(tmp_path, 3000)
    worker = p.start_worker()
    time.sleep(3)
    total = _produced(p.retro("produce", "--quiet", "--rate", "1500", *paths))
    # let the pipeline get going, then kill it hard in the middle of the work, twice
    for pause in (2, 4):
        time.sleep(pause)
        p.kill(worker, signal.SIGKILL)
        worker = p.start_worker()
    result = _audit(p)
    assert result["ok"], (result, p.worker_logs())
    assert result["raw_records"] == total
    commits_catch_up(p)


def test_workers_joining_and_leaving_mid_stream_lose_nothing(pipeline_factory, tmp_path: Path,
                                                            wait_until) -> None:
    """Scale out and in the Kafka way, as KEDA does: while records flow, a second
    worker joins the consumer group (partitions move to it), then leaves with
    SIGTERM (they move back). Every rebalance happens mid-stream, and the audit must
    still be exact."""
    from concurrent.futures import ThreadPoolExecutor

    p = pipeline_factory()
    workers = _Workers(p)
    worker, consumed = workers.start, workers.consumed

    worker(0)
    paths = _sample(tmp_path, 1500)
    # about 30 s of records, spread over 4 partitions: the join and the leave take about
    # 10 s, so records still flow through both on a loaded machine
    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(p.retro, "produce", "--quiet", "--spread", "4", "--rate", "50",
                                *paths)
        wait_until(lambda: consumed(0) > 0, timeout=120, interval=0.5,
                   what="the first worker consuming")
        second = worker(1)
        wait_until(lambda: consumed(1) > 0, timeout=120, interval=0.5,
                   what="the second worker consuming")
        assert not producing.done(), "records stopped flowing before the second worker joined"
        time.sleep(3)
        p.kill(second, signal.SIGTERM)  # scale in: its partitions go back to the first
        assert not producing.done(), "records stopped flowing before the second worker left"
        total = _produced(producing.result())
    result = _audit(p)
    assert result["ok"], (result, p.worker_logs())
    assert result["raw_records"] == total
    commits_catch_up(p)


def test_multi_day_logs_through_crashes_and_a_rebalance_land_once(pipeline_factory,
                                                                 tmp_path: Path,
                                                                 wait_until) -> None:
    """Records of several days, produced over 4 keys while the worker is SIGKILLed
    twice and a second worker joins and leaves: re-batched records must land in the
    report of their own day, so none is counted in two reports."""
    from concurrent.futures import ThreadPoolExecutor

    from streams.dev.sample import write_multiday

    # a SIGKILLed worker's partitions move once its session ends: the broker's minimum
    p = pipeline_factory(RETRO_KAFKA__SESSION_TIMEOUT_SECONDS="6")
    workers = _Workers(p)
    worker, consumed = workers.start, workers.consumed
    paths = [str(x) for x in write_multiday(tmp_path / "multiday", records=3000, days=4)]
    bgl = SHARED / "loghub" / "BGL" / "BGL_2k.log"
    if bgl.exists():
        paths.append(str(bgl))
    # about 55 s of records, with or without BGL: the crashes and the second worker's
    # stay take about 30 s, so records still flow through all of them on a loaded machine
    rate = sum(_lines(path) for path in paths) / 55

    first = worker(0)
    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(p.retro, "produce", "--quiet", "--spread", "4", "--rate",
                                f"{rate:.0f}", *paths)
        for _ in range(2):
            wait_until(lambda: consumed(0) > 0, timeout=120, interval=0.5,
                       what="the worker consuming")
            time.sleep(4)
            p.kill(first, signal.SIGKILL)
            first = worker(0)
        wait_until(lambda: consumed(0) > 0, timeout=120, interval=0.5,
                   what="the restarted worker")
        second = worker(1)
        wait_until(lambda: consumed(1) > 0, timeout=120, interval=0.5,
                   what="the second worker consuming")
        time.sleep(3)
        p.kill(second, signal.SIGTERM)
        assert not producing.done(), "records stopped flowing before the second worker left"
        total = _produced(producing.result())
    result = _audit(p, wait=300)
    assert result["ok"], (result, p.worker_logs())
    assert result["raw_records"] == total
    days = {rid.split("/")[0] for rid in _report_ids(p)}
    assert {"2026-11-28", "2026-11-29", "2026-11-30", "2026-12-01"} <= days, days
    commits_catch_up(p)


def _lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _report_ids(p) -> list[str]:
    import asyncio

    from streams.report.store import read_reports

    return sorted(asyncio.run(read_reports(p.settings())))


def test_huge_raw_messages_are_dead_lettered_without_holding_their_partition(
        pipeline_factory, tmp_path: Path) -> None:
    """Three 900 KB messages among 100 small ones on one key, on topics that take 1 MiB
    (the Kafka default): each must end as a dead letter that fits, and the partition's
    commit must reach its end."""
    import asyncio

    from aiokafka import AIOKafkaProducer

    from streams.kafka.connect import aiokafka_kwargs

    p = pipeline_factory(RETRO_KAFKA__MAX_MESSAGE_BYTES=str(1024 * 1024))
    p.retro("topics")
    settings = p.settings()
    huge = b"2026-11-28T10:00:00Z ERROR " + bytes(range(32, 127)) * 9_500  # ~900 KB

    async def send_all() -> None:
        producer = AIOKafkaProducer(**aiokafka_kwargs(settings), max_request_size=1024 * 1024)
        await producer.start()
        try:
            for i in range(103):
                value = huge if i in (20, 50, 80) else (
                    f"2026-11-28T10:00:{i % 60:02d}Z INFO request {i} served".encode())
                await producer.send_and_wait(settings.topics.raw, value, key=b"big.log")
        finally:
            await producer.stop()

    asyncio.run(send_all())
    p.start_worker()
    result = _audit(p)
    assert result["ok"], (result, p.worker_logs())
    assert result["raw_records"] == 103 and result["claimed"]["deadletter"] == 3
    commits_catch_up(p)
    letters = json.loads(p.retro("deadletter", "--format", "json").stdout)
    assert letters["total"] == 3 and letters["by_reason"] == {"too_large": 3}
