"""Does the post-mortem name the service where each incident began, when it began?

Three sets of cases, each scored beside a naive baseline computed from the raw lines:

* **windows** (``../shared/data/nezha-rca-dev``, skipped when absent): each of the 18
  labelled TrainTicket fault windows alone, one post-mortem each.
  ``title@1``: the title names the injected service (its name as the records' service
  field has it, a whole word: ``ts-basic-service``; a logger such as
  ``f.m.s.BasicServiceImpl`` does not count). ``named@3``: the injected service is among
  the first three names a reader meets in the incidents (most severe first, each
  incident's origin, then its services). ``onset``: an incident opens within
  [-60 s, +180 s] of the injection and its origin is the injected service; ``min``: the
  minutes from the injection to that incident's start.
* **days**: each day's windows replayed as one stream, in time order, a line kept once
  where windows overlap (same date, log and pod); one post-mortem a day. Each injection
  of the day is scored ``onset`` as above (targets: 80% of code faults, 40% of slow
  ones); the day's incidents and the lines of its Markdown post-mortem (<= 200).
* **trimmed** (opt in: ``--only trimmed``): each window cut as another shipper or
  another labeller might have cut it, its first 30 or 60 seconds dropped or its last 30,
  scored as the windows are. The fault windows kept back for evaluation are cut their
  own way; a score that holds only for these cuts is fitted to them.
* **silenced** (opt in: ``--only silenced``): each code-fault window with the injected
  service's own failure lines dropped (a line of it with a WARN or ERROR level word, or
  with "fail", "error" or "exception" in it): a fault that logs nothing itself, an early
  return whose service says nothing, which leaves its callers' errors and its thinned
  lines to tell. Scored alone, as the windows are, and as a day replay of those windows
  with the day's other windows as they are. The grep has nothing of the service to count.
* **generated** (``streams.dev.faults.write_day``; runs everywhere): days of seven or
  eight services with four or five faults at known times (crash, silent, vanishing
  line, slow callee) and chronic noise; ``onset`` per fault (target 90%); quiet days
  (routine and chronic only): no high or critical incident. Each fault is also cut out
  of its day alone, as the windows are (from ``GEN_WINDOW`` seconds before it to after
  it), and scored ``title@1``, ``named@3`` and ``onset`` beside the grep: what a user
  with a log file cut around an incident gets, on logs that are not TrainTicket's.

Naive baseline ("the service with the most ERROR/Exception lines", from the raw lines:
a line with ``ERROR`` or ``Exception``, or a JSON/logfmt level of error): ``naive@1``
its top service, ``naive@3`` its top three, ``naive onset`` its top service over the
lines within [-60 s, +180 s] of the injection (it is given the injection's time, the
post-mortem is not). ``not a service``: incident origins that are not a service seen in
the records' service field (a Fluent Bit record's app label or container, a generated
file's service); must be 0. Fault types: ``code`` = exception + return, ``slow`` =
network_delay + cpu_contention.

Post-mortems come from one function, ``postmortem_json(paths)``: ``retro postmortem
FILE... --format json`` when the command exists; with ``--before`` (or without the
command) today's offline path as ``bench/eval_bench.py`` runs a case (Cleaner ->
TokenWindow -> rules analyzer -> validated fragments -> merge -> ``derive``), its
episodes taken as the incidents. Nothing here is tuned to the data: it only measures.

``--ref REV`` runs the post-mortems with that commit's ``streams`` package and benches
(``git archive``, no worktree), in child processes: the tree other people are editing
is not measured by accident. The generated days and the scoring are this tree's.

Run: ``.venv/bin/python bench/rca_bench.py [--before] [--ref REV] [--data ../shared/data]
[--seeds 2] [--jobs 2] [--only windows,days,generated,trimmed,silenced]``
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from io import BytesIO
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _common import BENCH_DIR, REPO, SHARED_DATA, add_tag_argument, table, write_result

if TYPE_CHECKING:  # imported where used: a --ref tree's streams has no write_day
    from streams.dev.faults import DayCase

NEZHA = "nezha-rca-dev"
ONSET = (timedelta(seconds=-60), timedelta(seconds=180))  # around the injection
GROUPS = {"exception": "code", "return": "code", "network_delay": "slow",
          "cpu_contention": "slow"}
TARGETS = {"code": 0.8, "slow": 0.4}  # day replay, incidents at onset naming the service
SEVERITIES = ("info", "low", "medium", "high", "critical")
HIGH = {"high", "critical"}
MAX_MD_LINES = 200

# ------------------------------------------------------------------ post-mortems


def extract(ref: str, into: Path) -> Path:
    """``streams``, ``schemas`` and ``bench`` of ``ref`` under ``into`` (no worktree is
    registered)."""
    blob = subprocess.run(["git", "archive", "--format=tar", ref, "streams", "schemas", "bench"],
                          cwd=REPO, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def _env(root: Path | None) -> dict[str, str]:
    env = {**os.environ, "RETRO_LOG_LEVEL": "WARNING"}
    if root is not None:
        env["PYTHONPATH"] = str(root)
    return env


def postmortem_supported(root: Path | None) -> bool:
    """Does the CLI (this tree's, or ``root``'s) have ``retro postmortem``?"""
    done = subprocess.run([sys.executable, "-m", "streams.cli", "postmortem", "--help"],
                          cwd=root or REPO, env=_env(root), capture_output=True, check=False)
    return done.returncode == 0


MODE = "before"  # or "command"; set by main(); worker processes inherit it at fork
ROOT: Path | None = None  # the --ref tree the post-mortems run with; None: this tree


def postmortem_json(paths: list[Path]) -> dict[str, Any]:
    """The post-mortem of ``paths`` as ``retro postmortem --format json`` prints it."""
    return _postmortem(paths, markdown=False)[0]


def _postmortem(paths: list[Path], markdown: bool) -> tuple[dict[str, Any], str | None]:
    if MODE == "command":
        return _command(paths, markdown)
    return _before(paths, markdown)


def _command(paths: list[Path], markdown: bool) -> tuple[dict[str, Any], str | None]:
    def run(fmt: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "streams.cli", "postmortem", *map(str, paths),
             "--format", fmt], cwd=ROOT or REPO, env=_env(ROOT), capture_output=True,
            text=True, check=False)
        if done.returncode not in (0, 1):  # 1: nothing found, still a post-mortem
            raise RuntimeError(f"retro postmortem --format {fmt} exited {done.returncode}: "
                               f"{done.stderr[-2000:]}")
        return done.stdout

    text = run("json")
    doc = json.loads(text) if text.strip() else {}  # exit 1: no record, no post-mortem
    return doc, run("md") if markdown else None


def _before(paths: list[Path], markdown: bool) -> tuple[dict[str, Any], str | None]:
    """Today's offline path, as bench/eval_bench.py runs a case; episodes as incidents."""
    import eval_bench as eb  # its imports follow the report package wherever it moves

    from streams.settings import Settings

    run = eb.run_pipeline(paths, Settings())
    pm = eb.derive(run.report, deadletters=run.dead)
    origin_title = getattr(sys.modules[eb.derive.__module__], "origin_title", None)
    incidents = []
    for ep in pm.episodes:
        origin = ep.origin
        incidents.append({
            "title": (origin_title(ep, origin) if origin is not None and origin_title
                      else ep.top.title),
            "origin": origin.service if origin is not None else None,
            "started": ep.first_seen,
            "ended": ep.last_seen,
            "severity": max((c.severity for c in ep.causes), key=_severity_rank),
            "services": list(ep.services),
            "callers": list(origin.callers) if origin is not None else [],
        })
    doc = {
        "report": {"records": run.report.record_count, "first_seen": run.report.first_seen,
                   "last_seen": run.report.last_seen},
        "postmortem": {"title": pm.title, "summary": " ".join(pm.summary),
                       "incidents": incidents,
                       "chronic": [{"title": c.title, "services": list(c.services)}
                                   for c in pm.chronic]},
    }
    md = eb.render_markdown(run.report, deadletter_count=run.dead) if markdown else None
    return doc, md


def _severity_rank(severity: str | None) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else 0


@dataclass
class Got:
    """One post-mortem: its JSON, its Markdown when asked for, and what it cost."""

    doc: dict[str, Any]
    md: str | None
    seconds: float
    error: str | None = None
    cpu: float = 0.0  # CPU seconds of this process and the commands it ran

    @property
    def pm(self) -> dict[str, Any]:
        return self.doc.get("postmortem") or {}

    @property
    def incidents(self) -> list[dict[str, Any]]:
        """Most severe first; in the order the post-mortem gives within a severity."""
        got = list(self.pm.get("incidents") or [])
        return sorted(got, key=lambda i: -_severity_rank(i.get("severity")))

    @property
    def md_lines(self) -> int | None:
        return None if self.md is None else self.md.count("\n")


def _cpu() -> float:
    """CPU seconds of this process and of the children it waited for."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def _task(job: tuple[str, list[Path], bool]) -> tuple[str, Got]:
    """One post-mortem, in this process (one job at a time: the CPU it counts is its own)."""
    key, paths, markdown = job
    start, cpu = time.perf_counter(), _cpu()
    try:
        doc, md = _postmortem(paths, markdown)
    except Exception as exc:  # one broken case must not hide the others' scores
        return key, Got({}, None, time.perf_counter() - start, f"{type(exc).__name__}: {exc}",
                        _cpu() - cpu)
    return key, Got(doc, md, time.perf_counter() - start, None, _cpu() - cpu)


def run_all(jobs: list[tuple[str, list[Path], bool]], workers: int) -> dict[str, Got]:
    """Every job's post-mortem, ``workers`` at a time (the biggest inputs first)."""
    order = sorted(jobs, key=lambda j: -sum(p.stat().st_size for p in j[1]))
    if MODE == "before" and ROOT is not None:  # children that import the --ref tree
        shares = [order[i::workers] for i in range(max(1, workers))]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return {k: g for part in pool.map(_children, shares) for k, g in part.items()}
    if workers <= 1 or len(jobs) <= 1:
        return dict(map(_task, order))
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as pool:
        return dict(pool.map(_task, order))


def _children(jobs: list[tuple[str, list[Path], bool]]) -> dict[str, Got]:
    """Run ``jobs`` in one child process whose ``streams`` and benches are ROOT's."""
    if not jobs:
        return {}
    env = _env(ROOT) | {"RCA_BENCH_REF": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(BENCH_DIR / "rca_bench.py"), "--child"],
        input=json.dumps([[k, [str(p) for p in ps], md] for k, ps, md in jobs]),
        cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    out: dict[str, Got] = {}
    for line in done.stdout.splitlines():
        item = json.loads(line)
        out[item["key"]] = Got(item["doc"], item["md"], item["seconds"], item["error"],
                               item["cpu"])
    for key, _, _ in jobs:
        out.setdefault(key, Got({}, None, 0.0, f"child exited {done.returncode}: "
                                               f"{done.stderr[-2000:]}"))
    return out


def child() -> int:
    """``--child``: run the jobs on stdin with this process's ``streams`` (ROOT's, through
    PYTHONPATH) and ROOT's eval_bench; one JSON line a job on stdout."""
    ref = os.environ.get("RCA_BENCH_REF")
    if ref:
        sys.path.insert(0, str(Path(ref) / "bench"))
    for key, paths, markdown in json.loads(sys.stdin.read()):
        _, got = _task((key, [Path(p) for p in paths], markdown))
        print(json.dumps({"key": key, "doc": got.doc, "md": got.md, "seconds": got.seconds,
                          "error": got.error, "cpu": got.cpu}, default=str), flush=True)
    return 0


# ------------------------------------------------------------------ raw lines, the naive baseline

_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,6}))?")
_NAIVE_ERROR = re.compile(r'\bERROR\b|Exception|\blevel=(?:error|fatal)\b'
                          r'|"(?:level|severity)"\s*:\s*"(?:error|fatal)"', re.IGNORECASE)


@dataclass(slots=True)
class Line:
    time: datetime | None
    service: str | None
    error: bool


def read_text_lines(path: Path) -> list[str]:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:  # type: ignore[operator]
        return [x.rstrip("\n") for x in fh if x.strip()]


def _at(text: str) -> datetime | None:
    m = _STAMP.search(text[:120])
    if not m:
        return None
    frac = (m[3] or "0").ljust(6, "0")
    return datetime.fromisoformat(f"{m[1]}T{m[2]}.{frac}+00:00")


def parse_lines(texts: Iterable[str], file_service: str | None) -> list[Line]:
    """Service, time and "is an error line" of each raw line, without the clean stage.
    A Fluent Bit record names its service (app label, else container); a plain file is
    its own service; a line without a time (a trace) takes the line above's."""
    out: list[Line] = []
    last: datetime | None = None
    for text in texts:
        service, body, when = file_service, text, None
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("kubernetes"), dict):
                k8s = obj["kubernetes"]
                service = (k8s.get("labels") or {}).get("app") or k8s.get("container_name")
                body = str(obj.get("log", ""))
                when = _at(str(obj.get("date", "")))
            elif isinstance(obj, dict) and isinstance(obj.get("service"), str):
                service = obj["service"]
        when = when or _at(body) or last
        last = when
        out.append(Line(when, service, bool(_NAIVE_ERROR.search(body))))
    return out


def naive_top(lines: Sequence[Line], n: int, around: datetime | None = None) -> list[str]:
    """The ``n`` services with the most error lines (near ``around``: its onset window)."""
    counts = Counter[str]()
    for x in lines:
        if not x.error or x.service is None:
            continue
        if around is not None and (x.time is None or not (
                ONSET[0] <= x.time - around <= ONSET[1])):
            continue
        counts[x.service] += 1
    return [s for s, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


# ------------------------------------------------------------------ scores


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def names(text: str, service: str) -> bool:
    """``text`` names ``service`` as a whole word (``ts-food-service``, not
    ``ts-train-food-service``)."""
    return re.search(rf"(?<![\w.-]){re.escape(service)}(?![\w-])", text) is not None


def first_named(got: Got, n: int) -> list[str]:
    """The first ``n`` names a reader meets: each incident's origin, then its services."""
    out: list[str] = []
    for inc in got.incidents:
        for name in [inc.get("origin"), *(inc.get("services") or [])]:
            if name and name not in out:
                out.append(name)
    return out[:n]


def _at_onset_of(inc: dict[str, Any], service: str, at: datetime) -> bool:
    """``inc`` opens within the onset window of a fault at ``at`` and blames ``service``."""
    start = _time(inc.get("started"))
    return inc.get("origin") == service and start is not None \
        and ONSET[0] <= start - at <= ONSET[1]


def at_onset(got: Got, service: str, at: datetime) -> dict[str, Any] | None:
    """The earliest incident that opens within the onset window and blames ``service``."""
    hits = [inc for inc in got.incidents if _at_onset_of(inc, service, at)]
    return min(hits, key=lambda inc: _time(inc.get("started"))) if hits else None


def elsewhere(got: Got, faults: Sequence[tuple[str, datetime]]) -> int:
    """Incidents that open at no fault's onset blaming its service: a fault's callers,
    cascades and background taken for incidents (what a reader wades through)."""
    return sum(1 for inc in got.incidents
               if not any(_at_onset_of(inc, service, at) for service, at in faults))


def minutes_to(inc: dict[str, Any] | None, at: datetime) -> float | None:
    start = _time(inc.get("started")) if inc else None
    return None if start is None else round((start - at).total_seconds() / 60, 2)


def not_services(got: Got, known: set[str]) -> tuple[int, list[str]]:
    """Origins that are not a known service, and the other names incidents list as
    services that are not one (loggers, words)."""
    bad = [i["origin"] for i in got.incidents if i.get("origin") and i["origin"] not in known]
    listed = sorted({s for i in got.incidents for s in i.get("services") or []} - known)
    return len(bad), listed


def score_fault(got: Got, lines: Sequence[Line], service: str, at: datetime) -> dict[str, Any]:
    inc = at_onset(got, service, at)
    naive = naive_top(lines, 1, around=at)
    return {"onset": inc is not None, "minutes": minutes_to(inc, at),
            "incident": inc.get("title") if inc else None,
            "naive_onset": naive[:1] == [service], "naive_onset_top": naive[:1]}


def _frac(hits: Sequence[bool]) -> str:
    return f"{sum(hits)}/{len(hits)}" if hits else "-"


def _pct(hits: Sequence[bool]) -> float | None:
    return round(sum(hits) / len(hits), 3) if hits else None


def _yn(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _dash(value: Any) -> Any:
    return "-" if value is None else value


def _min(value: float | None) -> str:
    return "" if value is None else f"{value + 0.0:+.1f}"


# ------------------------------------------------------------------ the shared data


@dataclass
class Window:
    key: str
    path: Path
    service: str
    type: str
    at: datetime
    texts: list[str] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)

    @property
    def group(self) -> str:
        return GROUPS.get(self.type, self.type)

    @property
    def day(self) -> str:
        return self.key[:10]


def load_windows(folder: Path) -> list[Window]:
    labels = json.loads((folder / "labels.json").read_text())
    out = []
    for key, label in sorted(labels.items()):
        path = folder / f"{key}.fluentbit.jsonl.gz"
        if not path.exists():
            continue
        at = datetime.fromisoformat(label["inject_time"]).replace(tzinfo=UTC)
        w = Window(key, path, label["service"], label["type"], at)
        w.texts = read_text_lines(path)
        w.lines = parse_lines(w.texts, None)
        out.append(w)
    return out


def write_days(windows: list[Window], folder: Path) -> dict[str, tuple[Path, list[Line]]]:
    """Each day's windows as one stream, in time order, each line once (a line two
    overlapping windows both hold has the same date, log and pod)."""
    days: dict[str, list[Window]] = {}
    for w in sorted(windows, key=lambda w: w.at):
        days.setdefault(w.day, []).append(w)
    out = {}
    for day, ws in days.items():
        seen: set[tuple[str, str, str]] = set()
        kept: list[str] = []
        for w in ws:
            for text in w.texts:
                obj = json.loads(text)
                key = (obj.get("date", ""), obj.get("log", ""),
                       (obj.get("kubernetes") or {}).get("pod_name", ""))
                if key not in seen:
                    seen.add(key)
                    kept.append(text)
        path = folder / f"nezha-{day}.fluentbit.jsonl"
        path.write_text("\n".join(kept) + "\n", encoding="utf-8")
        out[day] = (path, parse_lines(kept, None))
    return out


TRIMS = {"from +30 s": (30, 0), "from +60 s": (60, 0), "to -30 s": (0, 30)}


def write_trimmed(windows: list[Window], folder: Path) -> dict[str, list[Window]]:
    """Per cut of ``TRIMS`` (seconds dropped at the head, at the tail), each window so
    cut, written to ``folder``; a line without a time goes with the one above it."""
    out: dict[str, list[Window]] = {}
    for name, (head, tail) in TRIMS.items():
        for w in windows:
            times = [x.time for x in w.lines if x.time is not None]
            if not times:
                continue
            first, last = min(times), max(times)
            kept = [(text, x) for text, x in zip(w.texts, w.lines, strict=True)
                    if x.time is None or ((x.time - first).total_seconds() >= head
                                          and (last - x.time).total_seconds() >= tail)]
            path = folder / f"{w.key}.{head}-{tail}.fluentbit.jsonl"
            path.write_text("\n".join(t for t, _ in kept) + "\n", encoding="utf-8")
            out.setdefault(name, []).append(Window(
                w.key, path, w.service, w.type, w.at, [t for t, _ in kept],
                [x for _, x in kept]))
    return out


SILENCED = "silenced"
_FAILURE_WORDS = re.compile(r"\b(?:WARN(?:ING)?|ERROR|FATAL)\b|fail|error|exception",
                            re.IGNORECASE)


def write_silenced(windows: list[Window], folder: Path) -> list[Window]:
    """Each window, its injected service's failure lines dropped when the fault is in
    its code (``SILENCED`` in the module's docstring), written to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for w in windows:
        kept = [(text, x) for text, x in zip(w.texts, w.lines, strict=True)
                if w.group != "code" or x.service != w.service
                or not _FAILURE_WORDS.search(text)]
        path = folder / f"{w.key}.fluentbit.jsonl"
        path.write_text("\n".join(t for t, _ in kept) + "\n", encoding="utf-8")
        out.append(Window(w.key, path, w.service, w.type, w.at, [t for t, _ in kept],
                          [x for _, x in kept]))
    return out


def trim_key(name: str, w: Window) -> str:
    return f"trim/{name}/{w.key}"


def known_services(lines: Iterable[Line]) -> set[str]:
    return {x.service for x in lines if x.service}


def score_windows(windows: list[Window], got: dict[str, Got], trim: str | None = None
                  ) -> list[dict[str, Any]]:
    import eval_bench as eb

    rows = []
    for w in windows:
        g = got[f"window/{w.key}" if trim is None else trim_key(trim, w)]
        title = str(g.pm.get("title", ""))
        top3 = first_named(g, 3)
        naive3 = naive_top(w.lines, 3)
        bad, listed = not_services(g, known_services(w.lines))
        rows.append({
            "window": w.key, "type": w.type, "group": w.group, "service": w.service,
            "inject_time": w.at.isoformat(), "lines": len(w.texts),
            "title": title, "title_at_1": names(title, w.service),
            # the looser reading: a word of the title contains the service's key
            "title_loose": eb._in_text(title, eb._service_key(w.service)),
            "named": top3, "named_at_3": w.service in top3,
            "naive_top3": naive3, "naive_at_1": naive3[:1] == [w.service],
            "naive_at_3": w.service in naive3,
            **score_fault(g, w.lines, w.service, w.at),
            "incidents": len(g.incidents), "origins_not_services": bad,
            "listed_not_services": listed, "md_lines": g.md_lines,
            "incident_list": [{k: i.get(k) for k in ("origin", "started", "ended", "severity",
                                                     "title")} for i in g.incidents],
            "seconds": round(g.seconds, 2), "cpu_seconds": round(g.cpu, 2), "error": g.error,
        })
    return rows


def window_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for group in ("code", "slow", "all"):
        mine = [r for r in rows if group in ("all", r["group"])]
        if not mine:
            continue
        minutes = [r["minutes"] for r in mine if r["minutes"] is not None]
        out.append({
            "group": group, "n": len(mine),
            "title_at_1": _frac([r["title_at_1"] for r in mine]),
            "naive_at_1": _frac([r["naive_at_1"] for r in mine]),
            "named_at_3": _frac([r["named_at_3"] for r in mine]),
            "naive_at_3": _frac([r["naive_at_3"] for r in mine]),
            "onset": _frac([r["onset"] for r in mine]),
            "naive_onset": _frac([r["naive_onset"] for r in mine]),
            "median_minutes": statistics.median(minutes) if minutes else None,
            "origins_not_services": sum(r["origins_not_services"] for r in mine),
        })
    return out


def score_days(windows: list[Window], days: dict[str, tuple[Path, list[Line]]],
               got: dict[str, Got], key: str = "day"
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    injections, summary = [], []
    for day, (_, lines) in days.items():
        g = got[f"{key}/{day}"]
        mine = [w for w in windows if w.day == day]
        rows = []
        for w in mine:
            rows.append({"day": day, "window": w.key, "type": w.type, "group": w.group,
                         "service": w.service, "inject_time": w.at.isoformat(),
                         **score_fault(g, lines, w.service, w.at)})
        injections += rows
        bad, listed = not_services(g, known_services(lines))
        by_group = {grp: [r["onset"] for r in rows if r["group"] == grp]
                    for grp in ("code", "slow")}
        naive_by_group = {grp: [r["naive_onset"] for r in rows if r["group"] == grp]
                          for grp in ("code", "slow")}
        summary.append({
            "day": day, "lines": len(lines),
            "duplicates_dropped": sum(len(w.texts) for w in mine) - len(lines),
            "injections": len(rows),
            "code_onset": _frac(by_group["code"]), "code_naive": _frac(naive_by_group["code"]),
            "slow_onset": _frac(by_group["slow"]), "slow_naive": _frac(naive_by_group["slow"]),
            "incidents": len(g.incidents),
            "incidents_elsewhere": elsewhere(g, [(w.service, w.at) for w in mine]),
            "origins_not_services": bad,
            "listed_not_services": listed, "md_lines": g.md_lines,
            "title": g.pm.get("title", ""), "seconds": round(g.seconds, 2),
            "cpu_seconds": round(g.cpu, 2), "error": g.error,
            "postmortem": g.pm, "markdown": g.md,
        })
    return injections, summary


# ------------------------------------------------------------------ generated days


def generated_cases(folder: Path, seeds: int) -> list[tuple[DayCase, list[Line]]]:
    from streams.dev.faults import write_day

    out = []
    for seed in range(1, seeds + 1):
        for quiet in (False, True):
            case = write_day(folder / f"{'quiet' if quiet else 'multi'}-{seed}", seed,
                             quiet=quiet)
            lines: list[Line] = []
            for path in case.files:
                lines += parse_lines(read_text_lines(path),
                                     None if case.layout == "fluentbit" else path.stem)
            out.append((case, lines))
    return out


GEN_WINDOW = (100, 180)  # seconds kept before and after a fault: a window as Nezha's


@dataclass
class GenWindow:
    key: str
    kind: str
    service: str
    at: datetime
    files: list[Path]
    lines: list[Line]
    services: tuple[str, ...]


def write_gen_windows(cases: list[tuple[DayCase, list[Line]]], folder: Path) -> list[GenWindow]:
    """Each fault of each generated day cut out alone, every file of the day cut to the
    same span (same names: a file's name is its service); a line without a time goes
    with the one above it."""
    out = []
    for case, _ in cases:
        for n, fault in enumerate(case.faults):
            start = fault.time - timedelta(seconds=GEN_WINDOW[0])
            end = fault.time + timedelta(seconds=GEN_WINDOW[1])
            into = folder / f"{case.name}-{n}"
            into.mkdir(parents=True)
            files, lines = [], []
            for path in case.files:
                service = None if case.layout == "fluentbit" else path.stem
                texts = read_text_lines(path)
                kept = [(t, x) for t, x in zip(texts, parse_lines(texts, service), strict=True)
                        if x.time is not None and start <= x.time <= end]
                if kept:
                    files.append(into / path.name)
                    files[-1].write_text("\n".join(t for t, _ in kept) + "\n",
                                         encoding="utf-8")
                    lines += [x for _, x in kept]
            out.append(GenWindow(f"{case.name}-{n}", fault.kind, fault.service, fault.time,
                                 files, lines, case.services))
    return out


def score_gen_windows(windows: list[GenWindow], got: dict[str, Got]) -> list[dict[str, Any]]:
    rows = []
    for w in windows:
        g = got[f"genwin/{w.key}"]
        title = str(g.pm.get("title", ""))
        naive3 = naive_top(w.lines, 3)
        rows.append({
            "window": w.key, "kind": w.kind, "service": w.service, "at": w.at.isoformat(),
            "lines": len(w.lines), "title": title, "title_at_1": names(title, w.service),
            "named_at_3": w.service in first_named(g, 3), "naive_at_1": naive3[:1] == [w.service],
            "naive_at_3": w.service in naive3, **score_fault(g, w.lines, w.service, w.at),
            "origins_not_services": not_services(g, set(w.services))[0],
            "seconds": round(g.seconds, 2), "cpu_seconds": round(g.cpu, 2), "error": g.error,
        })
    return rows


def score_generated(cases: list[tuple[DayCase, list[Line]]], got: dict[str, Got]
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, faults = [], []
    for case, lines in cases:
        g = got[f"gen/{case.name}"]
        mine = []
        for f in case.faults:
            mine.append({"case": case.name, "kind": f.kind, "service": f.service,
                         "time": f.time.isoformat(), **score_fault(g, lines, f.service, f.time)})
        faults += mine
        bad, listed = not_services(g, set(case.services))
        highs = sum(i.get("severity") in HIGH for i in g.incidents)
        rows.append({
            "case": case.name, "layout": case.layout, "lines": len(lines),
            "faults": len(case.faults), "onset": _frac([m["onset"] for m in mine]),
            "naive_onset": _frac([m["naive_onset"] for m in mine]),
            "high_incidents": highs,
            "quiet_ok": (highs == 0 and not g.error) if not case.faults else None,
            "incidents": len(g.incidents),
            "incidents_elsewhere": elsewhere(g, [(f.service, f.time) for f in case.faults]),
            "origins_not_services": bad,
            "listed_not_services": listed, "md_lines": g.md_lines,
            "title": g.pm.get("title", ""), "seconds": round(g.seconds, 2),
            "cpu_seconds": round(g.cpu, 2), "error": g.error,
            "truth": [(s, t.isoformat(), k) for s, t, k in case.truth],
            "chronic": case.chronic,
        })
    return rows, faults


# ------------------------------------------------------------------ main


def main() -> int:
    global MODE, ROOT
    if sys.argv[1:] == ["--child"]:
        return child()
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=SHARED_DATA,
                        help=f"folder holding {NEZHA}/ (default ../shared/data)")
    parser.add_argument("--before", action="store_true",
                        help="today's offline path (eval_bench's), even where `retro "
                             "postmortem` exists")
    parser.add_argument("--ref", help="run the post-mortems with this commit's streams and "
                                      "benches (e.g. HEAD), not the working tree")
    parser.add_argument("--seeds", type=int, default=2,
                        help="generated days: seeds 1..N, each a multi-fault and a quiet day")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="post-mortems computed at the same time (processes)")
    parser.add_argument("--only", default="windows,days,generated",
                        help="comma list of windows, days, generated, trimmed, silenced")
    add_tag_argument(parser)
    args = parser.parse_args()
    parts = {p.strip() for p in args.only.split(",") if p.strip()}

    with tempfile.TemporaryDirectory(prefix="rca-bench-") as tmp:
        if args.ref:
            ROOT = extract(args.ref, Path(tmp) / "ref")
        if args.before:
            MODE = "before"
        elif postmortem_supported(ROOT):
            MODE = "command"
        else:
            MODE = "before"
            print("note: this code has no `retro postmortem`; measuring today's path "
                  "(as with --before)", file=sys.stderr)
        code = _git(args.ref or "HEAD") + ("" if args.ref else _dirty())
        result: dict[str, Any] = {"mode": MODE, "code": code, "ref": args.ref,
                                  "onset_window_s": [-60, 180]}
        wall = time.perf_counter()
        folder = args.data / NEZHA
        windows: list[Window] = []
        days: dict[str, tuple[Path, list[Line]]] = {}
        trimmed: dict[str, list[Window]] = {}
        silenced: list[Window] = []
        silenced_days: dict[str, tuple[Path, list[Line]]] = {}
        if parts & {"windows", "days", "trimmed", SILENCED}:
            if (folder / "labels.json").exists():
                windows = load_windows(folder)
                if "days" in parts:
                    days = write_days(windows, Path(tmp))
                if "trimmed" in parts:
                    trimmed = write_trimmed(windows, Path(tmp))
                if SILENCED in parts:  # the days with a code fault, and those windows
                    coded = {w.day for w in windows if w.group == "code"}
                    silenced = write_silenced([w for w in windows if w.day in coded],
                                              Path(tmp) / SILENCED)
                    silenced_days = write_days(silenced, Path(tmp) / SILENCED)
            else:
                print(f"note: {folder} is absent; its windows and days are skipped",
                      file=sys.stderr)
        cases = generated_cases(Path(tmp) / "gen", args.seeds) if "generated" in parts else []
        gen_windows = write_gen_windows(cases, Path(tmp) / "genwin")

        jobs: list[tuple[str, list[Path], bool]] = []
        if "windows" in parts:  # the command prints Markdown in a second run: days only
            jobs += [(f"window/{w.key}", [w.path], MODE == "before") for w in windows]
        jobs += [(f"day/{d}", [p], True) for d, (p, _) in days.items()]
        jobs += [(trim_key(n, w), [w.path], False) for n, ws in trimmed.items() for w in ws]
        jobs += [(trim_key(SILENCED, w), [w.path], False) for w in silenced
                 if w.group == "code"]
        jobs += [(f"{SILENCED}-day/{d}", [p], False) for d, (p, _) in silenced_days.items()]
        jobs += [(f"gen/{c.name}", list(c.files), True) for c, _ in cases]
        jobs += [(f"genwin/{w.key}", w.files, False) for w in gen_windows]
        lines_of = {f"window/{w.key}": len(w.texts) for w in windows}
        lines_of |= {f"day/{d}": len(x) for d, (_, x) in days.items()}
        lines_of |= {f"gen/{c.name}": len(x) for c, x in cases}
        lines_of |= {f"genwin/{w.key}": len(w.lines) for w in gen_windows}
        lines_of |= {trim_key(n, w): len(w.texts) for n, ws in trimmed.items() for w in ws}
        lines_of |= {trim_key(SILENCED, w): len(w.texts) for w in silenced if w.group == "code"}
        lines_of |= {f"{SILENCED}-day/{d}": len(x) for d, (_, x) in silenced_days.items()}
        got = run_all(jobs, args.jobs)

        errors = {k: g.error for k, g in got.items() if g.error}
        for key, error in errors.items():
            print(f"error: {key}: {error}", file=sys.stderr)
        if "windows" in parts and windows:
            rows = score_windows(windows, got)
            result["windows"] = rows
            result["windows_summary"] = window_summary(rows)
            print(table(
                ["window", "service", "title@1", "naive@1", "named@3", "naive@3", "onset",
                 "min", "naive onset", "incidents", "not a service", "md lines", "cpu s",
                 "post-mortem title"],
                [[f"{r['window'][:15]} {r['type']}", r["service"], _yn(r["title_at_1"]),
                  _yn(r["naive_at_1"]), _yn(r["named_at_3"]), _yn(r["naive_at_3"]),
                  _yn(r["onset"]), _min(r["minutes"]), _yn(r["naive_onset"]), r["incidents"],
                  r["origins_not_services"], _dash(r["md_lines"]), r["cpu_seconds"],
                  r["title"][:60]]
                 for r in rows]))
            print()
            print(table(["windows", "n", "title@1", "naive@1", "named@3", "naive@3", "onset",
                         "naive onset", "median min", "not a service"],
                        [[s["group"], s["n"], s["title_at_1"], s["naive_at_1"],
                          s["named_at_3"], s["naive_at_3"], s["onset"], s["naive_onset"],
                          _min(s["median_minutes"]), s["origins_not_services"]]
                         for s in result["windows_summary"]]))
            print()
        if trimmed:
            cut_rows = {name: score_windows(ws, got, trim=name) for name, ws in trimmed.items()}
            result["trimmed_windows"] = cut_rows
            cuts = {name: window_summary(rows) for name, rows in cut_rows.items()}
            if "windows" in parts and windows:
                cuts = {"as labelled": result["windows_summary"], **cuts}
            result["trimmed"] = cuts
            print(table(["cut", "faults", "n", "title@1", "naive@1", "named@3", "naive@3",
                         "onset", "naive onset"],
                        [[name, s["group"], s["n"], s["title_at_1"], s["naive_at_1"],
                          s["named_at_3"], s["naive_at_3"], s["onset"], s["naive_onset"]]
                         for name, summary in cuts.items() for s in summary]))
            print()
        if silenced:
            rows = score_windows([w for w in silenced if w.group == "code"], got,
                                 trim=SILENCED)
            injections, summary = score_days(silenced, silenced_days, got,
                                             key=f"{SILENCED}-day")
            result["silenced_windows"] = rows
            result["silenced"] = window_summary(rows)
            result["silenced_day_injections"] = injections
            result["silenced_days"] = [{k: v for k, v in s.items()
                                        if k not in ("postmortem", "markdown")}
                                       for s in summary]
            print(table(["silenced", "n", "title@1", "naive@1", "named@3", "naive@3",
                         "onset", "naive onset"],
                        [[f"{s['group']}, each alone", s["n"], s["title_at_1"],
                          s["naive_at_1"], s["named_at_3"], s["naive_at_3"], s["onset"],
                          s["naive_onset"]] for s in result["silenced"]]
                        + [[f"{s['day']} replayed", s["injections"], "", "", "", "",
                            s["code_onset"], s["code_naive"]] for s in summary]))
            print()
        if days:
            injections, summary = score_days(windows, days, got)
            result["day_injections"] = injections
            result["days"] = summary
            print(table(["day replay", "type", "service", "onset", "min", "naive onset"],
                        [[r["window"][:15], r["type"], r["service"], _yn(r["onset"]),
                          _min(r["minutes"]), _yn(r["naive_onset"])] for r in injections]))
            print()
            print(table(["day", "lines", "code onset", "naive", "slow onset", "naive",
                         "incidents", "elsewhere", "not a service", "md lines", "cpu s",
                         "post-mortem title"],
                        [[s["day"], s["lines"], s["code_onset"], s["code_naive"],
                          s["slow_onset"], s["slow_naive"], s["incidents"],
                          s["incidents_elsewhere"], s["origins_not_services"],
                          _dash(s["md_lines"]), s["cpu_seconds"],
                          s["title"][:60]] for s in summary]))
            for group, target in TARGETS.items():
                hits = [r["onset"] for r in injections if r["group"] == group]
                naive = [r["naive_onset"] for r in injections if r["group"] == group]
                if hits:
                    print(f"day replay, {group} faults at onset: {_frac(hits)} "
                          f"({100 * (_pct(hits) or 0):.0f}%, target >= {100 * target:.0f}%); "
                          f"naive {_frac(naive)}")
            print()
        if cases:
            rows, faults = score_generated(cases, got)
            result["generated"] = rows
            result["generated_faults"] = faults
            print(table(["generated", "layout", "lines", "faults", "onset", "naive onset",
                         "high/crit", "incidents", "elsewhere", "not a service", "md lines",
                         "cpu s", "post-mortem title"],
                        [[r["case"], r["layout"], r["lines"], r["faults"], r["onset"],
                          r["naive_onset"], r["high_incidents"], r["incidents"],
                          r["incidents_elsewhere"], r["origins_not_services"],
                          _dash(r["md_lines"]), r["cpu_seconds"],
                          r["title"][:60]] for r in rows]))
            kinds = sorted({f["kind"] for f in faults})
            print(table(["generated faults", "n", "onset", "naive onset", "median min"],
                        [[k, len(fs), _frac([f["onset"] for f in fs]),
                          _frac([f["naive_onset"] for f in fs]),
                          _min(statistics.median(m) if (m := [f["minutes"] for f in fs
                                                              if f["minutes"] is not None])
                               else None)]
                         for k in [*kinds, "all"]
                         for fs in [[f for f in faults if k in ("all", f["kind"])]]]))
            quiet = [r["quiet_ok"] for r in rows if r["quiet_ok"] is not None]
            print(f"generated faults at onset: {_frac([f['onset'] for f in faults])} "
                  f"(target >= 90%); quiet days without high/critical: {_frac(quiet)}")
            print()
        if gen_windows:
            rows = score_gen_windows(gen_windows, got)
            result["generated_windows"] = rows
            print(table(["generated window", "kind", "service", "title@1", "naive@1",
                         "named@3", "naive@3", "onset", "naive onset", "post-mortem title"],
                        [[r["window"], r["kind"], r["service"], _yn(r["title_at_1"]),
                          _yn(r["naive_at_1"]), _yn(r["named_at_3"]), _yn(r["naive_at_3"]),
                          _yn(r["onset"]), _yn(r["naive_onset"]), r["title"][:50]]
                         for r in rows]))
            print(f"generated faults alone: title {_frac([r['title_at_1'] for r in rows])} "
                  f"(naive {_frac([r['naive_at_1'] for r in rows])}), named@3 "
                  f"{_frac([r['named_at_3'] for r in rows])} "
                  f"(naive {_frac([r['naive_at_3'] for r in rows])}), onset "
                  f"{_frac([r['onset'] for r in rows])} "
                  f"(naive {_frac([r['naive_onset'] for r in rows])}); not a service: "
                  f"{sum(r['origins_not_services'] for r in rows)}")
            print()
        seconds = {k: round(g.seconds, 2) for k, g in got.items()}
        result["seconds"] = seconds
        result["cpu_seconds"] = {k: round(g.cpu, 2) for k, g in got.items()}
        result["wall_seconds"] = round(time.perf_counter() - wall, 1)
        ok = [k for k, g in got.items() if not g.error]
        done = sum(lines_of.get(k, 0) for k in ok)
        busy = sum(got[k].seconds for k in ok)
        cpu = sum(got[k].cpu for k in ok)
        result["lines_per_second"] = round(done / busy) if busy else None
        result["lines_per_cpu_second"] = round(done / cpu) if cpu else None
        result["errors"] = errors
    tag = args.tag
    for s in result.get("days", []):  # the day's post-mortem, to read
        if s.get("markdown"):
            out = REPO / "bench" / "out" / f"rca_bench{'-' + tag if tag else ''}-{s['day']}.md"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(s["markdown"])
    print(f"mode: {MODE}, code {code}; {len(seconds)} post-mortems of {done:,} lines in "
          f"{result['wall_seconds']} s wall with --jobs {args.jobs}; a post-mortem reads "
          f"{result['lines_per_second']} lines/s of wall time, "
          f"{result['lines_per_cpu_second']} lines per CPU second"
          + (" (with its Markdown: the command runs twice)" if MODE == "command" else ""))
    print(f"result: {write_result('rca_bench', result, tag)}")
    return 1 if errors else 0


def _git(rev: str) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO,
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or rev


def _dirty() -> str:
    """`` + changes`` when the working tree's streams/ differs from HEAD."""
    done = subprocess.run(["git", "status", "--porcelain", "--", "streams"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    return " + uncommitted changes" if done.stdout.strip() else ""


if __name__ == "__main__":
    raise SystemExit(main())
