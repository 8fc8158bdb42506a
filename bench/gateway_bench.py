"""Direct to the simulated provider vs through a real LiteLLM proxy, at a low upstream limit.

Runs tests/integration/test_litellm_proxy.py (one implementation of the run: the
same records, the same upstream limit, the proxy config docs/model-gateways.md
gives) with the two runs one after the other (``RETRO_LITELLM_SEQUENTIAL=1``), so
their wall times compare; each variant is one pytest run with its own broker.

    .venv/bin/python bench/gateway_bench.py [--records 6000] [--rpm 60]
        [--variant config] [--variant default] [--variant default:worker-1]

A variant is the proxy's retries (``config``: the documented ``num_retries: 0``;
``default``: the proxy's own default; a number) and, after ``:worker``, the
worker's RETRO_MODEL__PROXY_NUM_RETRIES (-1: it sends no x-litellm-num-retries, as
the worker did before). The figure to quote: the proxy run's wall as a multiple of
the direct run's, and its upstream requests, 429s, parked records and answers thrown
away beside the direct run's. Needs Java 17 + Maven (the broker) and litellm[proxy]
in its own venv (.ci-cache/litellm, or --litellm PATH; see docs/model-gateways.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO, add_tag_argument, table, write_result

TEST = "tests/integration/test_litellm_proxy.py"


def run_variant(variant: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    proxy_retries, _, worker = variant.partition(":worker")
    figures_path = workdir / f"{variant.replace(':', '_')}.json"
    env = {**os.environ, "RETRO_LITELLM_SEQUENTIAL": "1",
           "RETRO_LITELLM_RECORDS": str(args.records), "RETRO_LITELLM_RPM": str(args.rpm),
           "RETRO_LITELLM_BATCH_RECORDS": str(args.batch_records),
           "RETRO_LITELLM_PROXY_RETRIES": proxy_retries,
           "RETRO_LITELLM_SETTLE_SECONDS": str(args.settle),
           "RETRO_LITELLM_FIGURES": str(figures_path)}
    if worker:
        env["RETRO_MODEL__PROXY_NUM_RETRIES"] = worker
    if args.litellm:
        env["RETRO_TEST_LITELLM"] = args.litellm
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-s", TEST, "-o", f"timeout={int(2 * args.settle + 240)}"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    took = time.monotonic() - started
    if not figures_path.exists():
        sys.exit(f"{variant}: no figures (pytest exited {proc.returncode}):\n"
                 f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    figures = json.loads(figures_path.read_text())
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return {"variant": variant, "test_passed": proc.returncode == 0, "pytest": summary,
            "pytest_seconds": round(took, 1), **figures}


def rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for result in results:
        direct_wall = result["direct"]["wall_seconds"]
        for name in ("direct", "litellm"):
            f = result[name]
            wall = f["wall_seconds"]
            ratio = (wall / direct_wall if wall and direct_wall else None)
            label = "direct" if name == "direct" else f"litellm ({result['variant']})"
            share = f["upstream_429"] / f["upstream_requests"] if f["upstream_requests"] else 0
            thrown = (f["upstream_batch_answers"] - f["worker_answers_used"]
                      + f["bodies_answered_twice"])
            out.append([label, f["upstream_requests"], f["upstream_429"], f"{share:.1%}",
                        f["probes"], f["parked_seen"], f["parked_end"], thrown,
                        f["worker_timeouts"], "-" if wall is None else wall,
                        "-" if ratio is None else f"{ratio:.2f}x"])
    return out


HEADERS = ["run", "upstream req", "429", "429 share", "probes", "parked seen", "parked end",
           "answers thrown away", "lane timeouts", "wall s", "vs direct"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=6000, help="sample records per run")
    parser.add_argument("--rpm", type=int, default=60, help="the upstream's requests a minute")
    parser.add_argument("--batch-records", type=int, default=100,
                        help="RETRO_FAST__MAX_RECORDS: records per fast-lane call")
    parser.add_argument("--settle", type=float, default=300,
                        help="seconds a run may take to be fully analysed")
    parser.add_argument("--variant", action="append",
                        help="proxy retries: config | default | N, optionally :worker<N> "
                             "(default: config)")
    parser.add_argument("--litellm", help="the litellm executable (its own venv)")
    add_tag_argument(parser)
    args = parser.parse_args()
    variants = args.variant or ["config"]
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        results = [run_variant(v, args, Path(tmp)) for v in variants]
    print(table(HEADERS, rows(results)))
    for result in results:
        print(f"{result['variant']}: test {'passed' if result['test_passed'] else 'FAILED'} "
              f"({result['pytest']})")
    path = write_result("gateway_bench", {
        "settings": {"records": args.records, "rpm": args.rpm,
                     "batch_records": args.batch_records, "variants": variants},
        "table": {"headers": HEADERS, "rows": rows(results)},
        "runs": results,
    }, args.tag)
    print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
