"""What the answer cache saves when a shipper re-sends an hour of logs it already sent.

An hour of generated logs (``streams/dev/sample.py``, ``write_sample``: seven
sources, an incident story) is cleaned and sent down the batch path as
``bench/batching_bench.py`` does it offline: Cleaner -> TokenWindow (fast and slow
lane, settings defaults) -> Gateway, built by ``build_gateways`` on an OpenAI backend
that talks to the simulated provider (FakeLLMServer, in-process, no rate limit).
Then the same records arrive again at new offsets (a shipper that lost its position
re-sends the hour), and the model calls of the first pass and of the replay are
counted (the provider's own request count; BatchOutcome.calls agrees).

Three caches:

* ``memory, same worker``: the replay reaches the worker that saw the first pass;
* ``memory, restarted``: the worker restarted in between (new gateways: an empty
  memory cache), as after a deploy or a crash, or a replay landing on another worker;
* ``redis, restarted``: the same restart with ``RETRO_MODEL__REDIS_URL`` on a real
  redis-server (Debian's, started here on a loopback port, no persistence).

Two replays:

* ``same records``: the records of the first pass, offsets moved past it; what a
  restarted clean stage makes of the same lines (it is deterministic);
* ``warm cleaner``: the same lines cleaned again by the Cleaner that cleaned the
  first pass, whose templates have meanwhile grown more general: a record's
  template, hence its batch's payload and cache key, may differ from the first time;
* ``from record N``: the same records, but the re-send starts ``--resend-from``
  records into the hour, so the token windows cut the batches elsewhere;
* ``first at log pace``: the first pass arrives as the hour was logged (records in
  time order, a clock following their timestamps, so a lane's window also closes
  after ``max_wait_seconds``, 2 s by default, as on a live stream), the replay
  arrives at once, as a re-send does (windows close on budget or count).

Every other first pass and replay is cut like ``batching_bench.py`` cuts: all at
once, by token budget and record count only.

Answers are cached per batch (the key is the batch's payload), so a replay is
saved where it is cut into the same batches as the first pass. The same worker's
token calibration, learned from the first pass, can move a cut; a restarted one
starts from the same calibration as the first pass did.

Coverage is checked on every pass: fragments and reviews cover each record once.

Run: ``.venv/bin/python bench/replay_bench.py [--records 3000] [--tag T]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import add_tag_argument, command_line, free_port, table, write_result
from batching_bench import MODEL, batch_all, check_coverage, drained, windows_for

from streams.batch.window import Batch, TokenWindow
from streams.clean.cleaner import Cleaner
from streams.dev.fakellm import FakeLLMConfig, FakeLLMServer
from streams.dev.sample import write_sample
from streams.gateway.backends import OpenAIBackend
from streams.gateway.factory import GatewaySet, build_gateways
from streams.ingest.reader import iter_records, open_source
from streams.metrics import Metrics
from streams.records import DeadLetter, NormalizedRecord, RawCoord
from streams.settings import Settings

CACHES = ("memory, same worker", "memory, restarted", "redis, restarted")


def clean(paths: list[Path], cleaner: Cleaner, first_offset: int, max_record_bytes: int
          ) -> list[NormalizedRecord]:
    """Cleaned records; coordinates: topic = file name, partition 0, offsets from
    ``first_offset`` (the replay's come after the first pass's)."""
    records: list[NormalizedRecord] = []
    for path in paths:
        with open_source(str(path)) as stream:
            chunks = iter_records(stream, max_record_bytes=max_record_bytes)
            for n, (_line, raw) in enumerate(chunks):
                coord = RawCoord(topic=path.name, partition=0, offset=first_offset + n)
                for out in cleaner.clean(raw, coord, path.name.removesuffix(".log")):
                    if not isinstance(out, DeadLetter):
                        records.append(out)
    return records


def moved(records: list[NormalizedRecord], by: int) -> list[NormalizedRecord]:
    """The same records at offsets ``by`` further on: same content, new coordinates."""
    out = []
    for r in records:
        raw = RawCoord(topic=r.raw.topic, partition=r.raw.partition, offset=r.raw.offset + by)
        suffix = r.id.removeprefix(r.raw.id)  # "/index" of a record split from one raw record
        out.append(r.model_copy(update={"raw": raw, "id": raw.id + suffix}))
    return out


def in_time_order(records: list[NormalizedRecord]) -> list[NormalizedRecord]:
    """Records as a live stream brings them: by timestamp (one without a timestamp
    keeps the time of the record before it in its file), the order within a file kept."""
    keyed = []
    last: dict[str, float] = {}
    for n, r in enumerate(records):
        at = last.get(r.raw.topic, 0.0)
        if r.timestamp:
            at = datetime.fromisoformat(r.timestamp).timestamp()
        last[r.raw.topic] = at
        keyed.append((at, n, r))
    return [r for _, _, r in sorted(keyed, key=lambda x: x[:2])]


class LogClock:
    """A clock that reads the time of the record being added."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def batch_at_log_pace(records: list[NormalizedRecord], windows: dict[str, TokenWindow],
                      clock: LogClock) -> list[Batch]:
    """Batches as the lanes cut them when records arrive at the pace they were logged."""
    batches: list[Batch] = []
    for record in records:
        if record.timestamp:
            clock.now = max(clock.now, datetime.fromisoformat(record.timestamp).timestamp())
        for window in windows.values():
            if window.due():
                batches.append(window.flush("wait"))  # type: ignore[arg-type]
        batches.extend(windows[record.lane].add(record))
    return batches + drained(windows)


@contextlib.contextmanager
def redis_server(binary: str) -> Iterator[str]:
    """A redis-server on a free loopback port, no persistence; yields its URL."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="replay-redis-"))
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder), "--logfile", str(folder / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


async def flush(url: str) -> None:
    import redis.asyncio as redis_asyncio

    client = redis_asyncio.from_url(url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


def settings_for(redis_url: str | None) -> Settings:
    return Settings(model={"backend": "openai", "name": MODEL, "redis_url": redis_url})


def gateways_for(settings: Settings, server: FakeLLMServer) -> GatewaySet:
    backend = OpenAIBackend(base_url=server.base_url, api_key=None)
    return build_gateways(settings, metrics=Metrics(), backend=backend)


async def one_pass(
    records: list[NormalizedRecord], settings: Settings, gateways: GatewaySet,
    server: FakeLLMServer, *, paced: bool = False,
) -> dict[str, Any]:
    before, tokens_before = server.stats.requests, server.stats.prompt_tokens
    started = time.perf_counter()
    if paced:
        clock = LogClock()
        batches = batch_at_log_pace(records, windows_for(settings, gateways, clock), clock)
    else:
        batches = batch_all(records, windows_for(settings, gateways))
    outcomes = await asyncio.gather(*(gateways.lane(b.lane).analyze(b) for b in batches))
    return {
        "records": len(records),
        "batches": len(batches),
        "batch_sizes": [b.record_count for b in batches],
        "model_calls": server.stats.requests - before,
        "prompt_tokens": server.stats.prompt_tokens - tokens_before,
        "calls_outcomes": sum(o.calls for o in outcomes),
        "cache_hits": sum(o.cache_hits for o in outcomes),
        "reviews": sum(len(o.reviews) for o in outcomes),
        "seconds": time.perf_counter() - started,
        "coverage": check_coverage(records, outcomes),
    }


async def scenario(
    cache: str, first: list[NormalizedRecord], replay: list[NormalizedRecord],
    server: FakeLLMServer, redis_url: str | None, *, paced: bool,
) -> dict[str, Any]:
    url = redis_url if cache.startswith("redis") else None
    if url:
        await flush(url)
    settings = settings_for(url)
    gateways = gateways_for(settings, server)
    try:
        before = await one_pass(first, settings, gateways, server, paced=paced)
        if cache != "memory, same worker":  # a restart: new gateways, empty memory level
            await gateways.close()
            gateways = gateways_for(settings, server)
        after = await one_pass(replay, settings, gateways, server)
    finally:
        await gateways.close()
    return {"cache": cache, "first": before, "replay": after}


async def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    paths = write_sample(tmp / "sample", records=args.records)
    settings = settings_for(None)
    cleaner = Cleaner.from_settings(settings)
    limit = settings.clean.max_record_bytes
    first = clean(paths, cleaner, 0, limit)
    shift = 1_000_000  # the replay's offsets come after the first pass's
    in_order = in_time_order(first)
    # name -> (first pass, replay, first pass at log pace)
    variants = {
        "same records": (first, moved(first, shift), False),
        "warm cleaner": (first, clean(paths, cleaner, shift, limit), False),
        f"from record {args.resend_from}": (first, moved(first[args.resend_from:], shift), False),
        "first at log pace": (in_order, moved(in_order, shift), True),
    }
    changed = sum(a.template != b.template
                  for a, b in zip(first, variants["warm cleaner"][1], strict=True))
    binary = shutil.which("redis-server")
    caches = CACHES if binary else [c for c in CACHES if not c.startswith("redis")]
    if binary is None:
        print("note: redis-server is absent (apt-get install redis-server); "
              "the redis rows are left out")
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(redis_server(binary)) if binary else None
        async with FakeLLMServer(FakeLLMConfig(model=MODEL, seed=args.seed)) as server:
            for name, (first_pass, replay, paced) in variants.items():
                for cache in caches:
                    runs.append({"variant": name, **await scenario(
                        cache, first_pass, replay, server, url, paced=paced)})
    return {
        "input": f"write_sample(records={args.records}): one hour, {len(paths)} files",
        "records": len(first),
        "warm_cleaner_templates_changed": changed,
        "redis_server": binary,
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=3000,
                        help="logical records of the generated hour (write_sample)")
    parser.add_argument("--seed", type=int, default=7, help="the simulated provider's seed")
    parser.add_argument("--resend-from", type=int, default=100,
                        help="where the third replay starts, in records of the first pass")
    add_tag_argument(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(bench(args, Path(tmp)))

    ok = all(r[p]["coverage"]["ok"] for r in result["runs"] for p in ("first", "replay"))
    print(f"command: {command_line()}")
    print(f"input: {result['input']}, {result['records']:,} cleaned records; "
          f"warm cleaner: {result['warm_cleaner_templates_changed']:,} records' template "
          f"changed on the second cleaning")
    rows = []
    for r in result["runs"]:
        first, replay = r["first"], r["replay"]
        r["replay_hit_share"] = replay["cache_hits"] / replay["batches"]
        rows.append((r["variant"], r["cache"], first["batches"], first["model_calls"],
                     replay["batches"], replay["model_calls"], replay["cache_hits"],
                     f"{r['replay_hit_share']:.0%}", first["prompt_tokens"],
                     replay["prompt_tokens"], replay["reviews"]))
    print(table(("replay", "cache", "batches, first", "calls, first", "batches, replay",
                 "calls, replay", "replay hits", "replay batches hit", "prompt tokens, first",
                 "prompt tokens, replay", "replay reviews"), rows))
    print(f"coverage: {'every record exactly once on every pass' if ok else 'BROKEN'}")
    path = write_result("replay_bench", result, args.tag)
    print(f"written: {path}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
