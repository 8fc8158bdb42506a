"""Token-budget batching against one-call-per-record, on a simulated rate-limited provider.

One run, in-process: the loghub HDFS 2k sample (or the generated sample when that
is absent) goes through Cleaner -> TokenWindow (a fast and a slow lane, settings
defaults) -> Gateway, built by ``build_gateways`` on an OpenAI backend that talks
to a FakeLLMServer with a provider-side RPM/TPM limit and latency of ``base +
per input token + per output token``. All batches are analyzed concurrently, as
the lane processor runs them, so AIMD, the buckets and Retry-After all take part.

The naive design is measured on the same records and the same server:

* tokens: every record built into a one-record batch and its prompt counted the
  way the provider counts (exact, for all records, no calls);
* wall time: ``--naive-sample`` records sent one call per record, in series (after
  the server's counters and rate windows are reset), extrapolated to all records
  as ``max(N x mean seconds per call, N / rpm minutes)``.

Coverage is checked: fragments and reviews together cover every record exactly once.

Run: ``.venv/bin/python bench/batching_bench.py [--rpm 60] [--naive-sample 100]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import SHARED_DATA, add_tag_argument, peak_rss_mib, table, write_result

from streams.batch.prompt import build_messages
from streams.batch.window import Batch, TokenWindow, build_batch
from streams.clean.cleaner import Cleaner
from streams.dev.fakellm import FakeLLMConfig, FakeLLMServer
from streams.dev.sample import write_sample
from streams.gateway.backends import OpenAIBackend
from streams.gateway.factory import GatewaySet, build_gateways
from streams.ingest.reader import iter_records, open_source
from streams.intervals import Coverage
from streams.metrics import Metrics
from streams.records import BatchOutcome, DeadLetter, NormalizedRecord, RawCoord
from streams.settings import Settings
from streams.tokens import TokenCounter

HDFS = Path("loghub") / "HDFS" / "HDFS_2k.log"
MODEL = "fake-gpt"


def load_input(args: argparse.Namespace, tmp: Path) -> tuple[list[Path], str]:
    n = args.sample_records
    if args.input == "sample":
        return write_sample(tmp / "sample", records=n), f"write_sample({n})"
    path = args.data / HDFS
    if path.exists():
        return [path], str(HDFS)
    print(f"note: {path} is absent; using write_sample({n}) instead", file=sys.stderr)
    return write_sample(tmp / "sample", records=n), f"write_sample({n}) (HDFS sample absent)"


def clean_all(paths: list[Path], settings: Settings) -> tuple[list[NormalizedRecord], int]:
    """Cleaned records (coordinates: topic = file name, partition 0, offset = record number)."""
    cleaner = Cleaner.from_settings(settings)
    records: list[NormalizedRecord] = []
    dead = 0
    for path in paths:
        with open_source(str(path)) as stream:
            chunks = iter_records(stream, max_record_bytes=settings.clean.max_record_bytes)
            for offset, (_line, raw) in enumerate(chunks):
                coord = RawCoord(topic=path.name, partition=0, offset=offset)
                for out in cleaner.clean(raw, coord, path.name.removesuffix(".log")):
                    if isinstance(out, DeadLetter):
                        dead += 1
                    else:
                        records.append(out)
    return records, dead


def make_settings(args: argparse.Namespace) -> Settings:
    model: dict[str, Any] = {
        "backend": "openai",
        "name": MODEL,
        "rpm": args.client_rpm or args.rpm,
        "tpm": args.client_tpm or args.tpm,
    }
    lanes: dict[str, Any] = {}
    if args.call_timeout:
        lanes = {"timeout_seconds": args.call_timeout}
    return Settings(model=model, fast=lanes, slow=lanes)


def windows_for(settings: Settings, gateways: GatewaySet,
                clock: Callable[[], float] | None = None) -> dict[str, TokenWindow]:
    """One token window per lane, as the batch stage builds them (``clock`` dates
    ``max_wait_seconds``; the monotonic clock by default)."""
    counter = gateways.window_counter(settings.model.name)
    out = {}
    for lane in ("fast", "slow"):
        ls = settings.lane(lane)  # type: ignore[arg-type]
        out[lane] = TokenWindow(
            lane=lane,  # type: ignore[arg-type]
            input_budget=ls.input_budget,
            context_window=ls.context_window,
            output_reserve=ls.output_reserve,
            max_records=ls.max_records,
            max_wait_seconds=ls.max_wait_seconds,
            counter=counter,
            clock=clock or time.monotonic,
        )
    return out


def batch_all(records: list[NormalizedRecord], windows: dict[str, TokenWindow]) -> list[Batch]:
    batches: list[Batch] = []
    for record in records:
        batches.extend(windows[record.lane].add(record))
    return batches + drained(windows)


def drained(windows: dict[str, TokenWindow]) -> list[Batch]:
    """What the windows still hold, flushed as at shutdown."""
    return [b for w in windows.values() if (b := w.flush("drain")) is not None]


def naive_prompt_tokens(
    records: list[NormalizedRecord], settings: Settings, server: FakeLLMServer, counter: Any
) -> list[int]:
    """Prompt tokens of one call per record, counted as the provider counts them."""
    out = []
    for record in records:
        batch = build_batch(
            [record], lane=record.lane, counter=counter, max_example_tokens=None, trigger="count"
        )
        detail = settings.lane(record.lane).prompt_detail
        messages = build_messages(
            batch, detail=detail, prompt_version=settings.model.prompt_version
        )
        out.append(server.provider.prompt_tokens(messages))
    return out


def metric_total(metrics: Metrics, name: str) -> int:
    """A counter summed over its labels (counters here only ever count whole events)."""
    return round(
        sum(s.value for m in metrics.registry.collect() for s in m.samples if s.name == name)
    )


def check_coverage(records: list[NormalizedRecord], outcomes: list[BatchOutcome]) -> dict[str, Any]:
    """Fragments and reviews must cover exactly the records, none twice."""
    expected = Coverage.from_coords(r.raw.as_tuple() for r in records)
    parts = [Coverage.from_json(f.covered) for o in outcomes for f in o.fragments]
    parts += [Coverage.from_json(r.covered) for o in outcomes for r in o.reviews]
    union = Coverage()
    for part in parts:
        union = union.union(part)
    claimed = sum(len(p) for p in parts)
    return {
        "records": len(expected),
        "covered": len(union),
        "claimed": claimed,  # > covered means some record is in two places
        "missing": len(expected.difference(union)),
        "extra": len(union.difference(expected)),
        "ok": union == expected and claimed == len(expected),
    }


async def run_batched(
    records: list[NormalizedRecord], settings: Settings, server: FakeLLMServer
) -> dict[str, Any]:
    metrics = Metrics()
    backend = OpenAIBackend(base_url=server.base_url, api_key=None)
    gateways = build_gateways(settings, metrics=metrics, backend=backend)
    try:
        started = time.perf_counter()
        batches = batch_all(records, windows_for(settings, gateways))
        windowed = time.perf_counter()
        outcomes = await asyncio.gather(*(gateways.lane(b.lane).analyze(b) for b in batches))
        done = time.perf_counter()
    finally:
        await gateways.close()
    stats = server.stats
    latencies = [r["latency"] for r in server.requests if "latency" in r]
    by_lane: dict[str, dict[str, int]] = {}
    for b in batches:
        lane = by_lane.setdefault(b.lane, {"batches": 0, "records": 0})
        lane["batches"] += 1
        lane["records"] += b.record_count
    triggers: dict[str, int] = {}
    for b in batches:
        triggers[b.trigger] = triggers.get(b.trigger, 0) + 1
    return {
        "batches": len(batches),
        "by_lane": by_lane,
        "triggers": triggers,
        "groups": sum(len(b.groups) for b in batches),
        "estimated_input_tokens": sum(b.estimated_input_tokens for b in batches),
        "window_seconds": windowed - started,
        "analyze_seconds": done - windowed,
        "calls_outcomes": sum(o.calls for o in outcomes),
        "cache_hits": sum(o.cache_hits for o in outcomes),
        "server": dict(vars(stats)),
        "mean_call_latency": sum(latencies) / len(latencies) if latencies else None,
        "retries": metric_total(metrics, "retro_model_retries_total"),
        "rate_limited_client": metric_total(metrics, "retro_model_rate_limited_total"),
        "splits": metric_total(metrics, "retro_batch_splits_total"),
        "fragments": sum(len(o.fragments) for o in outcomes),
        "reviews": sum(len(o.reviews) for o in outcomes),
        "review_reasons": sorted({r.reason for o in outcomes for r in o.reviews}),
        "coverage": check_coverage(records, outcomes),
    }


async def run_naive_sample(
    records: list[NormalizedRecord], settings: Settings, server: FakeLLMServer, n: int
) -> dict[str, Any]:
    """One call per record, in series, for ``n`` records spread over the input."""
    server.provider.reset()  # fresh counters and rate windows: the batched calls do not count
    step = max(1, len(records) // n)
    chosen = records[::step][:n]
    metrics = Metrics()
    backend = OpenAIBackend(base_url=server.base_url, api_key=None)
    gateways = build_gateways(settings, metrics=metrics, backend=backend)  # fresh buckets, cache
    counter = gateways.window_counter(settings.model.name)
    outcomes = []
    per_call: list[float] = []
    try:
        started = time.perf_counter()
        for record in chosen:
            batch = build_batch(
                [record],
                lane=record.lane,
                counter=counter,
                max_example_tokens=None,
                trigger="count",
            )
            t = time.perf_counter()
            outcomes.append(await gateways.lane(record.lane).analyze(batch))
            per_call.append(time.perf_counter() - t)
        wall = time.perf_counter() - started
    finally:
        await gateways.close()
    latencies = [r["latency"] for r in server.requests if "latency" in r]
    return {
        "records": len(chosen),
        "indices_step": step,
        "mean_call_latency": sum(latencies) / len(latencies) if latencies else None,
        "wall_seconds": wall,
        "seconds_per_record": wall / len(chosen),
        "per_call_seconds": per_call,
        "calls_outcomes": sum(o.calls for o in outcomes),
        "cache_hits": sum(o.cache_hits for o in outcomes),
        "server": dict(vars(server.stats)),
        "retries": metric_total(metrics, "retro_model_retries_total"),
        "reviews": sum(len(o.reviews) for o in outcomes),
    }


async def bench(args: argparse.Namespace, records: list[NormalizedRecord]) -> dict[str, Any]:
    settings = make_settings(args)
    config = FakeLLMConfig(
        model=MODEL,
        rpm=args.rpm,
        tpm=args.tpm,
        base_latency=args.base_latency,
        per_input_token=args.per_input_token,
        per_output_token=args.per_output_token,
        error_rate=args.error_rate,
        timeout_rate=args.timeout_rate,
        malformed_rate=args.malformed_rate,
        wrong_ids_rate=args.wrong_ids_rate,
        seed=args.seed,
    )
    async with FakeLLMServer(config) as server:
        counter = TokenCounter(settings.clean.encoding)
        naive_tokens = naive_prompt_tokens(records, settings, server, counter)
        batched = await run_batched(records, settings, server)
        naive = None
        if args.naive_sample > 0:
            naive = await run_naive_sample(records, settings, server, args.naive_sample)
    return {
        "batched": batched,
        "naive": naive,
        "naive_prompt_tokens": naive_tokens,
    }


def report(
    args: argparse.Namespace,
    label: str,
    records: list[NormalizedRecord],
    dead: int,
    clean_s: float,
    out: dict[str, Any],
) -> dict[str, Any]:
    n = len(records)
    b, naive = out["batched"], out["naive"]
    server = b["server"]
    naive_tokens = sum(out["naive_prompt_tokens"])
    sent = server["prompt_tokens"]
    batched_wall = b["window_seconds"] + b["analyze_seconds"]
    print(
        f"input: {label}: {n:,} records ({dead} dead letters), cleaned in {clean_s:.2f}s; "
        f"provider rpm={args.rpm} tpm={args.tpm}, latency {args.base_latency}s "
        f"+ {args.per_input_token}s/input token + {args.per_output_token}s/output token"
    )
    lanes = ", ".join(
        f"{k}: {v['batches']} batches / {v['records']} records"
        for k, v in sorted(b["by_lane"].items())
    )
    print(f"batches: {b['batches']} ({lanes}); triggers {b['triggers']}; {b['groups']} groups")
    print()
    rows: list[tuple[Any, ...]] = [
        ("model calls (server requests)", server["requests"], n, f"{server['requests'] / n:.3f}"),
        ("model calls (BatchOutcome.calls)", b["calls_outcomes"], n, ""),
        ("prompt tokens sent", sent, naive_tokens, f"{sent / naive_tokens:.3f}"),
        ("prompt tokens per record", sent / n, naive_tokens / n, f"{sent / naive_tokens:.3f}"),
        ("completion tokens", server["completion_tokens"], "-", ""),
    ]
    if naive and b["mean_call_latency"] and naive["mean_call_latency"]:
        rows.append(
            (
                "mean provider latency per call s",
                b["mean_call_latency"],
                naive["mean_call_latency"],
                f"{b['mean_call_latency'] / naive['mean_call_latency']:.1f}",
            )
        )
    extrapolated = None
    if naive:
        per_record = naive["seconds_per_record"]
        latency_bound = n * per_record
        rate_bound = n / args.rpm * 60 if args.rpm else 0.0
        extrapolated = max(latency_bound, rate_bound)
        bound = "latency" if latency_bound >= rate_bound else f"{args.rpm} rpm"
        rows.append(
            (
                "model wall time s",
                b["analyze_seconds"],
                extrapolated,
                f"{b['analyze_seconds'] / extrapolated:.4f}",
            )
        )
        e2e_batched, e2e_naive = clean_s + batched_wall, clean_s + extrapolated
        rows.append(
            (
                "end-to-end wall s (clean + batch + model)",
                e2e_batched,
                e2e_naive,
                f"{e2e_batched / e2e_naive:.4f}",
            )
        )
    print(table(("figure", "batched", "one call per record", "batched / naive"), rows))
    print()
    print(
        table(
            ("batched run", "value"),
            [
                ("429s (server rate_limited)", server["rate_limited"]),
                ("429s seen by the client", b["rate_limited_client"]),
                ("retries (retro_model_retries_total)", b["retries"]),
                ("splits", b["splits"]),
                ("fragments", b["fragments"]),
                ("reviews", f"{b['reviews']} {b['review_reasons'] or ''}".strip()),
                ("server max in flight", server["max_in_flight"]),
                (
                    "5xx / timeouts / malformed / wrong ids",
                    f"{server['errors_5xx']} / {server['timeouts']}"
                    f" / {server['malformed']} / {server['wrong_ids']}",
                ),
                ("windowing s", b["window_seconds"]),
                ("model phase wall s", b["analyze_seconds"]),
            ],
        )
    )
    if naive:
        print()
        print(
            f"naive sample: {naive['records']} records one call each in series: "
            f"{naive['wall_seconds']:.1f}s, {naive['seconds_per_record']:.2f}s per record, "
            f"{naive['server']['requests']} requests, {naive['server']['rate_limited']} 429s, "
            f"{naive['retries']} retries; extrapolated to {n:,} records: "
            f"{extrapolated:,.0f}s ({extrapolated / 60:.1f} min, {bound} bound)"
        )
        print(
            f"model wall time: {extrapolated / 60:.1f} min one call per record in series -> "
            f"{b['analyze_seconds']:.1f} s batched"
        )
        counted = out["naive_prompt_tokens"][:: naive["indices_step"]][: naive["records"]]
        print(
            f"naive sample prompt tokens: {naive['server']['prompt_tokens']:,} served by the "
            f"server, {sum(counted):,} counted offline for the same records"
        )
    summary = f"naive / batched: model calls {n / server['requests']:.0f}x, prompt tokens "
    summary += f"{naive_tokens / sent:.0f}x"
    if extrapolated:
        summary += f", model wall time {extrapolated / b['analyze_seconds']:.0f}x"
    print(f"\n{summary}")
    cov = b["coverage"]
    print(
        f"coverage: {cov['covered']:,} of {cov['records']:,} records covered, "
        f"{cov['claimed']:,} claims, {cov['missing']} missing, {cov['extra']} extra: "
        f"{'OK' if cov['ok'] else 'FAIL'}"
    )
    return {
        "params": {k: v for k, v in vars(args).items()},
        "input": label,
        "records": n,
        "deadletters": dead,
        "clean_seconds": clean_s,
        "batched": b,
        "naive": naive,
        "naive_prompt_tokens_total": naive_tokens,
        "ratios": {
            "calls_per_record": server["requests"] / n,
            "prompt_tokens_batched_over_naive": sent / naive_tokens,
            "model_wall_naive_over_batched": (extrapolated / b["analyze_seconds"])
            if extrapolated
            else None,
        },
        "naive_extrapolated_seconds": extrapolated,
        "coverage_ok": cov["ok"],
        "peak_rss_mib": peak_rss_mib(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="shared data folder")
    parser.add_argument(
        "--input",
        choices=["hdfs", "sample"],
        default="hdfs",
        help="loghub HDFS 2k (default) or the generated multi-source sample",
    )
    parser.add_argument(
        "--sample-records",
        type=int,
        default=2000,
        help="size of the generated sample (--input sample, or no HDFS)",
    )
    parser.add_argument("--rpm", type=int, default=60, help="provider requests per minute")
    parser.add_argument("--tpm", type=int, default=200_000, help="provider tokens per minute")
    parser.add_argument("--client-rpm", type=int, help="client RPM bucket (default: --rpm)")
    parser.add_argument("--client-tpm", type=int, help="client TPM bucket (default: --tpm)")
    parser.add_argument("--base-latency", type=float, default=0.3, help="seconds per call")
    parser.add_argument("--per-input-token", type=float, default=0.0001, help="s per prompt token")
    parser.add_argument(
        "--per-output-token",
        type=float,
        default=0.01,
        help="s per completion token (0.01 = 100 tokens/s)",
    )
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of 5xx answers")
    parser.add_argument("--timeout-rate", type=float, default=0.0, help="share of stalled calls")
    parser.add_argument("--malformed-rate", type=float, default=0.0, help="share not JSON")
    parser.add_argument("--wrong-ids-rate", type=float, default=0.0, help="share with bad refs")
    parser.add_argument("--call-timeout", type=float, help="both lanes' timeout_seconds")
    parser.add_argument("--seed", type=int, default=7, help="fault generator seed")
    parser.add_argument(
        "--naive-sample",
        type=int,
        default=100,
        help="records sent one call each, in series (0: skip)",
    )
    parser.add_argument(
        "--log-level", default="ERROR", help="gateway logs (WARNING shows every review and split)"
    )
    add_tag_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")

    settings = make_settings(args)
    with tempfile.TemporaryDirectory(prefix="batching-bench-") as tmp:
        paths, label = load_input(args, Path(tmp))
        started = time.perf_counter()
        records, dead = clean_all(paths, settings)
        clean_s = time.perf_counter() - started
    out = asyncio.run(bench(args, records))
    doc = report(args, label, records, dead, clean_s, out)
    print(f"wrote {write_result('batching_bench', doc, args.tag)}")
    return 0 if doc["coverage_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
