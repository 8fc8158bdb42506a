"""Failover drill: SIGKILL the busiest leader of a 3-broker cluster under load, restart it.

Steps (every process it starts is stopped on exit, Ctrl-C and errors included):

1. a ``LocalCluster`` of ``--brokers`` KRaft nodes (replication 3,
   ``min.insync.replicas=2``) and the pipeline's topics with replication 3;
2. ``--records`` generated log records produced, then one ``retro worker``;
3. once the clean stage has consumed ``--kill-at`` of them, SIGKILL the node that
   leads the most partitions of the pipeline's topics, produce a second batch of
   ``--records // 2`` while it is down, and start it again after ``--down`` seconds;
4. wait until the group's lag is 0 on every input partition and ``retro audit``
   passes (nothing lost, nothing counted twice), then until every partition has all
   its replicas in sync again.

Figures: seconds from the kill until every partition had a new leader and until the
worker moved on, records re-read (``retro_offset_rereads_total``, the audit's double
count), the worker's ``retro_partition_leader_changes_total``, and the audit.

Run: ``.venv/bin/python bench/failover_drill.py [--records 40000] [--down 20]``.
``tests/integration/test_failover.py`` runs it at a small size in the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import OUT_DIR, REPO, add_tag_argument, command_line, free_port, machine, table
from aiokafka import AIOKafkaConsumer, TopicPartition
from e2e_bench import (
    PIPELINE_TOPICS,
    PROCS,
    Observer,
    base_env,
    check_interrupted,
    code_version,
    log,
    make_data,
    on_signal,
    retro,
    stopped_at_exit,
    timed_audit,
)

from streams.dev.broker.cluster import LocalCluster, busiest_leader
from streams.kafka.connect import stop_consumer

METRIC = re.compile(r'^(retro_[a-z_]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$', re.M)


def metric_sums(text: str | None) -> dict[str, float]:
    """Every retro_* series summed over its labels."""
    out: dict[str, float] = {}
    for name, value in METRIC.findall(text or ""):
        out[name] = out.get(name, 0.0) + float(value)
    return out


async def partition_view(bootstrap: str, topics: list[str]
                         ) -> dict[TopicPartition, tuple[int, int]]:
    """(leader, in-sync replicas) of every partition of ``topics``; leader -1 when none."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                request_timeout_ms=5000)
    await consumer.start()
    try:
        cluster = await consumer._client.fetch_all_metadata()
        out = {}
        for topic in topics:
            for part, meta in (cluster._partitions.get(topic) or {}).items():
                out[TopicPartition(topic, part)] = (meta.leader, len(meta.isr))
        return out
    finally:
        await stop_consumer(consumer)


async def created_view(bootstrap: str, topics: list[str], timeout: float = 60.0
                       ) -> dict[TopicPartition, tuple[int, int]]:
    """The partition view once every topic has a leader for each partition: a broker
    other than the controller may answer metadata without a topic just created."""
    deadline = time.monotonic() + timeout
    while True:
        view = await partition_view(bootstrap, topics)
        named = {tp.topic for tp in view}
        if named == set(topics) and all(leader >= 0 for leader, _ in view.values()):
            return view
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics without leaders after {timeout:.0f} s: "
                               f"{sorted(set(topics) - named)}")
        await asyncio.sleep(0.5)


async def drill(args: argparse.Namespace, tmp: Path, cluster: LocalCluster,
                bootstrap: str) -> dict[str, Any]:
    loop, main_task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, main_task)
    prefix = f"fo-{uuid.uuid4().hex[:6]}"
    state = tmp / prefix
    state.mkdir()
    topics = {n: f"{prefix}.{n}" for n in ("raw", *PIPELINE_TOPICS, "notifications")}
    env = base_env(bootstrap, state)
    env.update({"RETRO_APP_ID": prefix, "RETRO_TOPICS__PARTITIONS": str(args.partitions),
                "RETRO_TOPICS__REPLICATION": str(args.brokers),
                "RETRO_KAFKA__SESSION_TIMEOUT_SECONDS": "10",
                # measured often enough to see leaders that move back after the restart
                "RETRO_KAFKA__LAG_SECONDS": "2"})
    env.update({f"RETRO_TOPICS__{n.upper()}": t for n, t in topics.items()})
    code, out, err = await retro(env, "topics", timeout=120)
    if code:
        raise RuntimeError(f"`retro topics` failed ({code}): {out}{err}")
    view = await created_view(bootstrap, list(topics.values()))
    replicas = min(isr for _, isr in view.values())
    first, _ = make_data("sample", args.records, tmp / "data1")
    second, _ = make_data("sample", max(300, args.records // 2), tmp / "data2")
    code, out, err = await retro(env, "produce", "--quiet", *first, timeout=600)
    if code:
        raise RuntimeError(f"`retro produce` failed ({code}):\n{err[-3000:]}")
    port = free_port()
    worker = PROCS.start([sys.executable, "-m", "streams", "worker"],
                         env={**env, "RETRO_WEB_PORT": str(port)}, log_path=state / "worker.log")
    result: dict[str, Any] = {"brokers": args.brokers, "partitions": args.partitions,
                              "replicas_in_sync_at_start": replicas}
    killed = None
    t_kill = t_elected = t_moved_on = t_restart = t_done = t_in_sync = None
    produce_task: asyncio.Task | None = None
    async with Observer(bootstrap, prefix, topics, args.partitions, [port]) as obs:
        launched = time.monotonic()
        at_kill = 0.0
        try:
            while True:
                s = await obs.sample(launched)
                now = s.t
                done_by_clean = s.stages.get("clean", 0)
                # the worker's first lag measurement is its view of the leaders
                measured = killed is not None or "retro_consumer_lag_messages" in metric_sums(
                    await obs.get(port, "/metrics"))
                if (killed is None and measured
                        and done_by_clean >= args.kill_at * args.records):
                    view = await partition_view(bootstrap, list(topics.values()))
                    killed = busiest_leader(leader for leader, _ in view.values())
                    led = sum(1 for leader, _ in view.values() if leader == killed)
                    cluster.kill_node(killed)
                    t_kill, at_kill = time.monotonic() - launched, sum(s.stages.values())
                    result.update(killed_node=killed, partitions_it_led=led,
                                  total_partitions=len(view), killed_at_clean=done_by_clean)
                    log(f"{now:.0f}s: SIGKILL node {killed} (leader of {led}/{len(view)} "
                        f"partitions) at {int(done_by_clean):,} records cleaned")
                    produce_task = asyncio.create_task(
                        retro(env, "produce", "--quiet", *second, timeout=600))
                elif killed is not None:
                    since = time.monotonic() - launched - t_kill
                    if t_elected is None:
                        try:
                            view = await partition_view(bootstrap, list(topics.values()))
                        except Exception:  # the client met the dead node: ask again
                            view = {}
                        if view and all(leader not in (killed, -1)
                                        for leader, _ in view.values()):
                            t_elected = since
                            log(f"every partition has a new leader {since:.1f}s after the kill")
                    if t_moved_on is None and sum(s.stages.values()) > at_kill:
                        t_moved_on = since
                        log(f"the worker moved on {since:.1f}s after the kill")
                    if t_restart is None and since >= args.down:
                        await asyncio.to_thread(cluster.start_node, killed)
                        t_restart = since
                        log(f"node {killed} restarted {since:.0f}s after the kill")
                if produce_task is not None and produce_task.done():
                    code, _, err = produce_task.result()
                    result["produce_during_outage_exit"] = code
                    if code:
                        log(f"producing during the outage failed ({code}): {err[-500:]}")
                    produce_task = None
                if int(now) % 15 == 0:
                    log(f"{now:.0f}s: stages {({k: int(v) for k, v in s.stages.items()})}, "
                        f"lag {s.lag:,}")
                finished_producing = killed is not None and "produce_during_outage_exit" in result
                if (t_restart is not None and finished_producing and s.lag == 0
                        and s.raw_committed >= args.records):
                    audit = await timed_audit(env)
                    if audit.get("ok") or audit.get("double_counted"):
                        result["audit"] = audit
                        t_done = time.monotonic() - launched - t_kill
                        break
                if worker.poll() is not None:
                    tail = (state / "worker.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"the worker exited ({worker.poll()}):\n{tail}")
                if now > args.timeout:
                    result["timed_out"] = True
                    log(f"timeout after {now:.0f}s: lag {s.lag:,} "
                        f"{({k: v for k, v in s.lag_by_topic.items() if v})}")
                    break
                await asyncio.sleep(1.0)
                check_interrupted()
            deadline = time.monotonic() + 120
            while t_restart is not None and time.monotonic() < deadline:
                view = await partition_view(bootstrap, list(topics.values()))
                if all(isr >= args.brokers for _, isr in view.values()):
                    t_in_sync = time.monotonic() - launched - t_kill
                    break
                await asyncio.sleep(1.0)
            deadline = time.monotonic() + 35  # more lag measurements in the worker
            while True:
                metrics = metric_sums(await obs.get(port, "/metrics"))
                if ((metrics.get("retro_partition_leader_changes_total")
                        and metrics.get("retro_consumer_lag_messages") == 0)
                        or time.monotonic() > deadline):
                    break
                await asyncio.sleep(1.0)
            final = await obs.sample(launched)
        finally:
            PROCS.stop(worker)
    if "audit" not in result:
        result["audit"] = await timed_audit(env)
    result.update(
        leaders_elected_s=t_elected, worker_moved_on_s=t_moved_on, restarted_s=t_restart,
        caught_up_and_audited_s=t_done, all_replicas_in_sync_s=t_in_sync,
        final_lag=final.lag, records=final.raw_committed,
        leader_changes=metrics.get("retro_partition_leader_changes_total"),
        offset_rereads=metrics.get("retro_offset_rereads_total"),
        partitions_stalled=metrics.get("retro_partitions_stalled"),
        broker_reachable=metrics.get("retro_broker_reachable"),
        worker_lag_metric=metrics.get("retro_consumer_lag_messages"))
    return result


def verdict(r: dict[str, Any]) -> list[str]:
    """What failed; empty when the drill passed."""
    audit = r.get("audit") or {}
    problems = []
    if not audit.get("ok"):
        problems.append(f"audit: {audit.get('summary')}")
    if audit.get("double_counted"):
        problems.append(f"{audit['double_counted']} record(s) counted twice")
    if r.get("timed_out") or r.get("final_lag"):
        problems.append(f"lag left: {r.get('final_lag')}")
    if r.get("worker_lag_metric"):
        problems.append(f"the worker's retro_consumer_lag_messages: {r['worker_lag_metric']}")
    if r.get("partitions_stalled"):
        problems.append(f"{r['partitions_stalled']:.0f} partition(s) stalled")
    if not r.get("leader_changes"):
        problems.append("the worker's metrics show no leader change")
    if r.get("all_replicas_in_sync_s") is None:
        problems.append("replicas not all back in sync")
    if r.get("produce_during_outage_exit"):
        problems.append("producing during the outage failed")
    return problems


def fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", type=int, default=3, help="nodes (default 3)")
    parser.add_argument("--records", type=int, default=40_000,
                        help="records before the kill; half as many more during it")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of every topic")
    parser.add_argument("--kill-at", type=float, default=0.3,
                        help="kill once the clean stage consumed this share (default 0.3)")
    parser.add_argument("--down", type=float, default=20.0,
                        help="seconds the killed node stays down (default 20)")
    parser.add_argument("--timeout", type=float, default=420.0,
                        help="seconds for the whole run before it gives up (default 420)")
    parser.add_argument("--out", type=Path, help="JSON result (default bench/out/failover_drill"
                                                 "[-TAG].json)")
    add_tag_argument(parser)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args(argv)
    if args.brokers < 3:
        parser.error("--brokers: 3 or more (min.insync.replicas 2 must survive a kill)")
    import logging

    # the drill's own clients meet the dead node on purpose
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    args.out = (args.out or OUT_DIR / f"failover_drill{'-' + args.tag if args.tag else ''}.json"
                ).resolve()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="failover-drill-"))
    cluster = LocalCluster(tmp / "broker-state", brokers=args.brokers)
    result: dict[str, Any] | None = None
    with stopped_at_exit(tmp, cluster, keep=args.keep):
        started = time.monotonic()
        bootstrap = cluster.start()
        start_s = time.monotonic() - started
        log(f"{args.brokers} nodes up in {start_s:.1f}s at {bootstrap}")
        result = asyncio.run(drill(args, tmp, cluster, bootstrap))
        result["cluster_start_s"] = start_s
    if result is None:  # interrupted
        return 130
    problems = verdict(result)
    audit = result["audit"]
    rows = [
        ("node killed (partitions it led)",
         f"{result.get('killed_node')} ({result.get('partitions_it_led')}/"
         f"{result.get('total_partitions')})"),
        ("every partition re-led after (s)", fmt(result["leaders_elected_s"])),
        ("worker moved on after (s)", fmt(result["worker_moved_on_s"])),
        ("node restarted after (s)", fmt(result["restarted_s"])),
        ("lag 0 and audit passed after (s)", fmt(result["caught_up_and_audited_s"])),
        ("all replicas in sync after (s)", fmt(result["all_replicas_in_sync_s"])),
        ("raw records", fmt(result["records"])),
        ("retro_partition_leader_changes_total", fmt(result["leader_changes"], ".0f")),
        ("retro_offset_rereads_total", fmt(result["offset_rereads"], ".0f")),
        ("audit: missing / double counted", f"{audit.get('missing')} / "
                                            f"{audit.get('double_counted')}"),
        ("final lag: Kafka / worker's metric", f"{result['final_lag']} / "
                                               f"{fmt(result['worker_lag_metric'], '.0f')}"),
        ("retro_partitions_stalled", fmt(result["partitions_stalled"], ".0f")),
        ("drill", "PASS" if not problems else "FAIL: " + "; ".join(problems)),
    ]
    print(table(("failover drill", ""), rows))
    doc = {"bench": "failover_drill", "command": command_line(),
           "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": machine(), "code": code_version(), **result, "problems": problems}
    args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out}")
    return 0 if not problems else 1


if __name__ == "__main__":
    import os

    os.chdir(REPO)
    sys.exit(main())
