"""Does the report find the fault? An evaluation over the labelled logs in ../shared/data.

Each case runs in-process, without a broker: Cleaner -> TokenWindow (settings defaults)
-> the offline rules analyzer -> validated fragments -> one merged report -> the
post-mortem and its Markdown. The labels come from the data, never from the rules:

* ``nezha``: the Nezha TrainTicket hour log and its ``fault_list.json``; the fault is
  the last injection before the log's first record. Hit when the top incident's
  services or title name the injected pod's service (``ts-basic-service-5dc8...`` ->
  ``basic``).
* ``bgl``: the BlueGene/L 2k sample; its first column labels every line with an alert
  category or ``-``. Hit when most records of the top incident are alert lines;
  ``category`` is the most common label among them.
* ``bgl-quiet``: the same file without its alert lines: every incident of severity
  high or critical is a false alarm.
* ``kafka``: the three-broker incident; unlabelled, so the faulty records are taken
  to be those at WARN or above. Hit when most of the top incident's records are.
* every other ``loghub/*/X_2k.log``: no labels; their high/critical count and report
  length are shown for context only.

Run: ``.venv/bin/python bench/eval_bench.py [--data ../shared/data]``
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import SHARED_DATA, add_tag_argument, table, write_result
from batching_bench import batch_all, clean_all

from streams.batch.answers import validate_answer
from streams.batch.prompt import payload_of
from streams.batch.window import TokenWindow
from streams.clean.tokens import TokenCounter
from streams.gateway.rules.analyzer import analyze
from streams.intervals import Coverage
from streams.records import Fragment, NormalizedRecord
from streams.report.merge import incident_key, merge_all
from streams.report.model import Report
from streams.report.view import render_markdown
from streams.settings import Settings

HIGH = {"high", "critical"}


@dataclass
class Run:
    """One case through the offline pipeline: records, fragments, the merged report."""

    records: list[NormalizedRecord]
    fragments: list[Fragment]
    report: Report
    dead: int
    coverage_by_incident: dict[str, Coverage] = field(default_factory=dict)


def run_pipeline(paths: list[Path], settings: Settings) -> Run:
    records, dead = clean_all(paths, settings)
    counter = TokenCounter()
    windows = {}
    for lane in ("fast", "slow"):
        ls = settings.lane(lane)  # type: ignore[arg-type]
        windows[lane] = TokenWindow(
            lane=lane,  # type: ignore[arg-type]
            input_budget=ls.input_budget, context_window=ls.context_window,
            output_reserve=ls.output_reserve, max_records=ls.max_records,
            max_wait_seconds=ls.max_wait_seconds, counter=counter,
        )
    batches = batch_all(records, windows)
    fragments: list[Fragment] = []
    for batch in batches:
        answer = analyze(payload_of(batch))
        fragments += validate_answer(batch, answer, model="rules", prompt_version="eval")
    report, _ = merge_all(None, fragments, report_id="eval/all", now="1970-01-01T00:00:00Z")
    by_incident: dict[str, Coverage] = {}
    for fragment in fragments:
        key = incident_key(fragment.event, fragment.cause)
        part = Coverage.from_json(fragment.covered)
        by_incident[key] = by_incident.get(key, Coverage()).union(part)
    return Run(records, fragments, report, dead, by_incident)


@dataclass(frozen=True)
class Top:
    """The report's top incident as a reader sees it: a title and the incidents under it."""

    title: str
    severity: str
    services: tuple[str, ...]
    keys: tuple[str, ...]


def top_of(report: Report, dead: int) -> tuple[Top | None, int, str]:
    """(top incident, high/critical incidents shown, Markdown)."""
    try:  # the post-mortem view, once it exists
        from streams.report.postmortem import derive
    except ImportError:
        derive = None  # type: ignore[assignment]
    md = render_markdown(report, deadletter_count=dead)
    if derive is None:  # before the post-mortem: the report's own first incident
        if not report.incidents:
            return None, 0, md
        first = report.incidents[0]
        top = Top(first.event, first.severity, tuple(first.services), (first.key,))
        return top, sum(i.severity in HIGH for i in report.incidents), md
    pm = derive(report, deadletters=dead)
    if not pm.causes:
        return None, 0, md
    c = pm.causes[0]
    named = f"{c.title} ({', '.join(c.subjects)})" if c.subjects else c.title
    top = Top(named, c.severity, tuple(c.services), tuple(c.keys))
    return top, sum(c.severity in HIGH for c in pm.causes), md


def _records_of(run: Run, top: Top) -> set[tuple[str, int, int]]:
    covered = Coverage()
    for key in top.keys:
        covered = covered.union(run.coverage_by_incident.get(key, Coverage()))
    out = set()
    for name, part in covered.parts().items():
        topic, partition = name.rsplit("/", 1)
        for a, b in part.ranges:
            out.update((topic, int(partition), o) for o in range(a, b + 1))
    return out


def _service_key(pod: str) -> str:
    """``ts-basic-service-5dc8d4f9fd-46997`` -> ``basic``: the name without prefix/suffixes."""
    name = re.sub(r"-[0-9a-z]{8,10}-[0-9a-z]{5}$", "", pod)
    name = re.sub(r"^ts-", "", name)
    return re.sub(r"-service$", "", name).replace("-", "")


def _service_matches(service: str, key: str) -> bool:
    last = service.lower().rsplit(".", 1)[-1]
    return key in last.replace("-", "").replace("_", "")


def case_nezha(data: Path, settings: Settings) -> dict[str, Any] | None:
    folder = data / "nezha-trainticket"
    logs = sorted(folder.glob("*.log"))
    faults = folder / "fault_list.json"
    if not logs or not faults.exists():
        return None
    run = run_pipeline(logs, settings)
    times = sorted(r.timestamp for r in run.records if r.timestamp)
    start = datetime.fromisoformat(times[0].replace("Z", "+00:00"))
    injections = [
        # inject_time is on the logs' clock (docker "time"); inject_timestamp is 8 h apart
        (datetime.fromisoformat(f["inject_time"]).replace(tzinfo=UTC), f["inject_pod"])
        for hour in json.loads(faults.read_text()).values() for f in hour
    ]
    before = [i for i in injections if i[0] <= start]
    if not before:
        return None
    pod = max(before)[1]
    key = _service_key(pod)
    top, highs, md = top_of(run.report, run.dead)
    named = [*top.services, *re.findall(r"[\w.-]+", top.title)] if top else []
    hit = any(_service_matches(s, key) for s in named)
    return _row("nezha", f"service {key}", top, hit, highs, md, run)


def _first_column_labels(path: Path) -> list[str]:
    with path.open(encoding="utf-8", errors="replace") as fh:
        return [line.split(" ", 1)[0] for line in fh if line.strip()]


def case_bgl(data: Path, settings: Settings) -> list[dict[str, Any]]:
    path = data / "loghub" / "BGL" / "BGL_2k.log"
    if not path.exists():
        return []
    labels = _first_column_labels(path)
    run = run_pipeline([path], settings)
    alerts = Counter(label for label in labels if label != "-")
    top, highs, md = top_of(run.report, run.dead)
    hit, category = False, "-"
    if top is not None:
        mine = Counter(labels[o] for _, _, o in _records_of(run, top) if o < len(labels))
        alert_share = sum(n for lab, n in mine.items() if lab != "-") / max(1, sum(mine.values()))
        hit = alert_share > 0.5
        category = max((lab for lab in mine if lab != "-"), key=mine.__getitem__, default="-")
    rows = [_row("bgl", f"alerts ({alerts.most_common(1)[0][0]} most)", top, hit, highs, md,
                 run, category=category)]
    with tempfile.TemporaryDirectory() as tmp:
        quiet = Path(tmp) / "BGL_quiet.log"
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        quiet.write_text("\n".join(x for x in lines if x.startswith("- ")) + "\n")
        qrun = run_pipeline([quiet], settings)
        qtop, qhighs, qmd = top_of(qrun.report, qrun.dead)
        rows.append(_row("bgl-quiet", "no alerts", qtop, qhighs == 0, qhighs, qmd, qrun))
    return rows


def case_kafka(data: Path, settings: Settings) -> dict[str, Any] | None:
    logs = sorted((data / "kafka-broker-incident").glob("*.log"))
    if not logs:
        return None
    run = run_pipeline(logs, settings)
    top, highs, md = top_of(run.report, run.dead)
    hit = False
    if top is not None:
        level = {r.raw.as_tuple(): (r.level or "INFO").upper() for r in run.records}
        mine = [level.get(c, "INFO") for c in _records_of(run, top)]
        hit = sum(lv in ("WARN", "WARNING", "ERROR", "FATAL") for lv in mine) > len(mine) / 2
    return _row("kafka", "WARN+ records", top, hit, highs, md, run)


def case_unlabelled(data: Path, settings: Settings) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((data / "loghub").glob("*/*_2k.log")):
        if path.parent.name == "BGL":
            continue
        run = run_pipeline([path], settings)
        top, highs, md = top_of(run.report, run.dead)
        rows.append(_row(path.parent.name, "(unlabelled)", top, None, highs, md, run))
    return rows


def _row(case: str, truth: str, top: Top | None, hit: bool | None, highs: int, md: str,
         run: Run, *, category: str = "") -> dict[str, Any]:
    return {
        "case": case,
        "truth": truth,
        "records": len(run.records),
        "top": f"{top.title} ({top.severity})"[:60] if top else "-",
        "top_services": ", ".join(top.services)[:40] if top else "-",
        "category": category,
        "hit": "-" if hit is None else ("yes" if hit else "NO"),
        "high_incidents": highs,
        "md_lines": md.count("\n"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=SHARED_DATA)
    add_tag_argument(parser)
    args = parser.parse_args()
    if not args.data.exists():
        print(f"note: {args.data} is absent; nothing to evaluate", file=sys.stderr)
        return 0
    settings = Settings()
    rows: list[dict[str, Any]] = []
    cases: list[Callable[[Path, Settings], Any]] = [case_nezha, case_bgl, case_kafka,
                                                   case_unlabelled]
    for case in cases:
        got = case(args.data, settings)
        rows += got if isinstance(got, list) else ([got] if got else [])
    headers = ["case", "truth", "records", "top incident", "services", "category", "hit",
               "high/crit", "md lines"]
    print(table(headers, [[r["case"], r["truth"], r["records"], r["top"], r["top_services"],
                           r["category"], r["hit"], r["high_incidents"], r["md_lines"]]
                          for r in rows]))
    print(f"result: {write_result('eval_bench', {'rows': rows}, args.tag)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
