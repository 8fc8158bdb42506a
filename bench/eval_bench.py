"""Does the post-mortem find the fault? Labelled logs in ../shared/data and generated cases.

Each case runs in-process, without a broker: Cleaner -> TokenWindow (settings defaults)
-> the offline rules analyzer -> validated fragments -> one merged report -> the
post-mortem and its Markdown. The labels come from the data, never from the rules:

* ``nezha``: the Nezha TrainTicket hour log and its ``fault_list.json``; the fault is
  the last injection before the log's first record, its time the truth's time. Hit
  when the post-mortem's title or first summary sentence names the injected pod's
  service (``ts-basic-service-5dc8...`` -> ``basic``).
* ``bgl``: the BlueGene/L 2k sample; its first column labels every line with an alert
  category or ``-``. Hit when most records of the top cause are alert lines;
  ``category`` is the most common label among them; the faulty service is the
  component most alert lines name, the truth's time the first alert line's.
* ``bgl-quiet``: the same file without its alert lines: every cause of severity high
  or critical is a false alarm.
* ``kafka``: the three-broker incident; unlabelled, so the faulty records are taken
  to be those at WARN or above. Hit when most of the top cause's records are.
* every other ``loghub/*/X_2k.log``: no labels; shown for context only.
* ``gen-<kind>-<seed>``: written by ``streams.dev.faults`` (runs without the data):
  ``crash`` and ``silent`` inject a faulty service at a known time (hit as for
  nezha), ``quiet`` is a day with only routine traffic and chronic noise (hit when
  no cause is high or critical).

Columns beside hit: ``rank`` is where a reader meets the faulty service (1: the
title; then the order the causes name services, subjects first; ``-``: never);
``origin-truth min`` is the signed minutes from the true start to the origin the
post-mortem names (its suspected origin's first anomaly, else its main episode's
start; positive: late); ``false high/day`` is, on a case whose records are all
normal, the high/critical causes per distinct UTC day of records.

Run: ``.venv/bin/python bench/eval_bench.py [--data ../shared/data] [--seeds 2]``
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
from streams.dev.faults import KINDS, write_case
from streams.gateway.rules.analyzer import analyze
from streams.intervals import Coverage
from streams.records import Fragment, NormalizedRecord
from streams.report.analysis.postmortem import PostMortem, derive
from streams.report.state.merge import incident_key, merge_all
from streams.report.state.model import Report
from streams.report.views.view import render_markdown
from streams.settings import Settings
from streams.tokens import TokenCounter

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
class Truth:
    """What a case says went wrong, from its data: the faulty service and when it began."""

    text: str  # as the table shows it
    service: str | None = None  # a key matched against names (``basic``, ``KERNEL``)
    time: datetime | None = None  # UTC
    quiet: bool = False  # every record is labelled normal: any high/critical is false


@dataclass(frozen=True)
class Seen:
    """What the reader of the post-mortem is told: title, summary, causes, origin."""

    pm: PostMortem
    md: str

    @property
    def highs(self) -> int:
        return sum(c.severity in HIGH for c in self.pm.causes)

    @property
    def origin(self) -> str | None:
        """The time the post-mortem names as where it began: its main episode's suspected
        origin's first anomaly when it names one, else the episode's earliest anomaly,
        else its top cause's first record."""
        if self.pm.episodes:
            ep = self.pm.episodes[0]
            named = getattr(ep, "origin", None)  # only when callers point at one service
            return (named.first_seen if named is not None and named.first_seen
                    else ep.first_seen)
        return self.pm.causes[0].first_seen if self.pm.causes else None

    def named(self) -> list[str]:
        """Services a reader meets after the title, in order: each cause's subjects and
        services, in the post-mortem's order of causes; those the title names are left out."""
        order: list[str] = []
        for c in self.pm.causes:
            for name in [*c.subjects, *c.services]:
                if name not in order and name not in self.pm.title:
                    order.append(name)
        return order


def seen_of(run: Run) -> Seen:
    return Seen(derive(run.report, deadletters=run.dead),
                render_markdown(run.report, deadletter_count=run.dead))


def _records_of(run: Run, keys: list[str]) -> set[tuple[str, int, int]]:
    covered = Coverage()
    for key in keys:
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


def _matches(name: str, key: str) -> bool:
    """A service name, logger or word names ``key``: ``com.example.ledger.Api`` names ledger."""
    return key.lower() in name.lower().replace("-", "").replace("_", "")


def _in_text(text: str, key: str) -> bool:
    return any(_matches(word, key) for word in re.findall(r"[\w.$-]+", text))


# a sentence ends at a full stop before a capital; dotted names ("c.e.ledger") do not end one
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def names_fault(seen: Seen, key: str) -> bool:
    """The post-mortem names the faulty service where a reader looks first: in its title
    or its first summary sentence (a subject deep in the causes does not count)."""
    first = _SENTENCE_END.split(seen.pm.summary[0], 1)[0] if seen.pm.summary else ""
    return _in_text(seen.pm.title, key) or _in_text(first, key)


def rank_of(seen: Seen, key: str) -> int | None:
    """1 when the title names the faulty service; else 1 + its place among the services
    the causes name after the title's; None when the post-mortem never names it."""
    if _in_text(seen.pm.title, key):
        return 1
    for n, name in enumerate(seen.named(), 2):
        if _matches(name, key):
            return n
    return None


def _minutes(origin: str | None, truth: datetime | None) -> float | None:
    """Signed minutes from the truth to the reported origin (positive: reported late)."""
    if origin is None or truth is None:
        return None
    at = datetime.fromisoformat(origin.replace("Z", "+00:00"))
    return (at - truth).total_seconds() / 60


def _days(run: Run) -> int:
    """Distinct UTC days the case's records fall on (at least one)."""
    return max(1, len({r.timestamp[:10] for r in run.records if r.timestamp}))


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
    at, pod = max(before)
    key = _service_key(pod)
    seen = seen_of(run)
    truth = Truth(f"service {key}", key, at)
    return _row("nezha", truth, seen, names_fault(seen, key), run)


def case_bgl(data: Path, settings: Settings) -> list[dict[str, Any]]:
    path = data / "loghub" / "BGL" / "BGL_2k.log"
    if not path.exists():
        return []
    lines = [x for x in path.read_text(encoding="utf-8", errors="replace").splitlines()
             if x.strip()]
    # label, epoch seconds, date, node, time, node, type, component, level, message
    cols = [x.split(" ", 8) for x in lines]
    labels = [c[0] for c in cols]
    alert_rows = [c for c in cols if c[0] != "-" and len(c) > 7]
    alerts = Counter(c[0] for c in alert_rows)
    component = Counter(c[7] for c in alert_rows).most_common(1)[0][0]
    first_alert = datetime.fromtimestamp(int(alert_rows[0][1]), UTC)
    run = run_pipeline([path], settings)
    seen = seen_of(run)
    hit, category = False, "-"
    if seen.pm.causes:
        top = seen.pm.causes[0]
        mine = Counter(labels[o] for _, _, o in _records_of(run, top.keys) if o < len(labels))
        alert_share = sum(n for lab, n in mine.items() if lab != "-") / max(1, sum(mine.values()))
        hit = alert_share > 0.5
        category = max((lab for lab in mine if lab != "-"), key=mine.__getitem__, default="-")
    truth = Truth(f"{component} alerts ({alerts.most_common(1)[0][0]} most)", component,
                  first_alert)
    rows = [_row("bgl", truth, seen, hit, run, category=category)]
    with tempfile.TemporaryDirectory() as tmp:
        quiet = Path(tmp) / "BGL_quiet.log"
        quiet.write_text("\n".join(x for x in lines if x.startswith("- ")) + "\n")
        qrun = run_pipeline([quiet], settings)
        qseen = seen_of(qrun)
        rows.append(_row("bgl-quiet", Truth("no alerts", quiet=True), qseen, qseen.highs == 0,
                         qrun))
    return rows


def case_kafka(data: Path, settings: Settings) -> dict[str, Any] | None:
    logs = sorted((data / "kafka-broker-incident").glob("*.log"))
    if not logs:
        return None
    run = run_pipeline(logs, settings)
    seen = seen_of(run)
    hit = False
    if seen.pm.causes:
        level = {r.raw.as_tuple(): (r.level or "INFO").upper() for r in run.records}
        mine = [level.get(c, "INFO") for c in _records_of(run, seen.pm.causes[0].keys)]
        hit = sum(lv in ("WARN", "WARNING", "ERROR", "FATAL") for lv in mine) > len(mine) / 2
    return _row("kafka", Truth("WARN+ records"), seen, hit, run)


def case_unlabelled(data: Path, settings: Settings) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((data / "loghub").glob("*/*_2k.log")):
        if path.parent.name == "BGL":
            continue
        run = run_pipeline([path], settings)
        rows.append(_row(path.parent.name, Truth("(unlabelled)"), seen_of(run), None, run))
    return rows


def case_generated(kind: str, seed: int, settings: Settings) -> dict[str, Any]:
    """A case written by streams.dev.faults: its truth is what the generator injected."""
    with tempfile.TemporaryDirectory() as tmp:
        case = write_case(Path(tmp), kind, seed)  # type: ignore[arg-type]
        run = run_pipeline(list(case.files), settings)
    seen = seen_of(run)
    t = case.truth
    if t.service is None:
        return _row(case.name, Truth("no incident", quiet=True), seen, seen.highs == 0, run)
    truth = Truth(f"{t.kind} {t.service}", t.service, t.time)
    return _row(case.name, truth, seen, names_fault(seen, t.service), run)


def _row(case: str, truth: Truth, seen: Seen, hit: bool | None, run: Run, *,
         category: str = "") -> dict[str, Any]:
    pm = seen.pm
    top = pm.causes[0] if pm.causes else None
    rank = rank_of(seen, truth.service) if truth.service else None
    minutes = _minutes(seen.origin, truth.time)
    return {
        "case": case,
        "truth": truth.text,
        "truth_time": truth.time.isoformat() if truth.time else None,
        "records": len(run.records),
        "title": f"{pm.title} ({top.severity})" if top else pm.title,
        "top": (f"{top.title} ({', '.join(top.subjects)})" if top.subjects else top.title)
        if top else None,
        "top_services": list(top.services) if top else [],
        "summary": pm.summary[0] if pm.summary else "",
        "category": category,
        "hit": None if hit is None else hit,
        "rank": "" if truth.service is None else ("-" if rank is None else rank),
        "origin": seen.origin,
        "origin_minutes": minutes,
        "high_incidents": seen.highs,
        "days": _days(run),
        "false_high_per_day": seen.highs / _days(run) if truth.quiet else None,
        "md_lines": seen.md.count("\n"),
    }


def _shown(row: dict[str, Any]) -> list[Any]:
    hit = "-" if row["hit"] is None else ("yes" if row["hit"] else "NO")
    minutes = row["origin_minutes"]
    late = "" if minutes is None else f"{round(minutes, 1) + 0.0:+,.1f}"  # no "-0.0"
    per_day = row["false_high_per_day"]
    return [row["case"], row["truth"], row["records"], row["title"][:60], row["category"], hit,
            row["rank"], late, row["high_incidents"],
            "" if per_day is None else f"{per_day:.2f}", row["md_lines"]]


HEADERS = ["case", "truth", "records", "post-mortem title (top severity)", "category", "hit",
           "rank", "origin-truth min", "high/crit", "false high/day", "md lines"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=SHARED_DATA)
    parser.add_argument("--seeds", type=int, default=2,
                        help="generated cases per kind (seeds 1..N; default 2)")
    add_tag_argument(parser)
    args = parser.parse_args()
    settings = Settings()
    rows: list[dict[str, Any]] = []
    if args.data.exists():
        cases: list[Callable[[Path, Settings], Any]] = [case_nezha, case_bgl, case_kafka,
                                                       case_unlabelled]
        for case in cases:
            got = case(args.data, settings)
            rows += got if isinstance(got, list) else ([got] if got else [])
    else:
        print(f"note: {args.data} is absent; only the generated cases run", file=sys.stderr)
    for kind in KINDS:
        for seed in range(1, args.seeds + 1):
            rows.append(case_generated(kind, seed, settings))
    print(table(HEADERS, [_shown(r) for r in rows]))
    print(f"result: {write_result('eval_bench', {'rows': rows}, args.tag)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
