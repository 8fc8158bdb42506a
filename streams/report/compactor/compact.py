"""What the compactor does with one buffer's share of one report, without Kafka.

The fragments are merged at once (one new version); a fragment that cannot be merged
does not hold back the others: it is named, so the compactor step can send its
records to review. Hops (``streams.traces``) and roll-up updates are applied after the
fragments.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from streams.errors import RetroError
from streams.records import Fragment, HopsUpdate
from streams.report.analysis.rollup import RollupUpdate, apply_rollup
from streams.report.state.hops import apply_hops
from streams.report.state.merge import merge, merge_all
from streams.report.state.model import Report

logger = logging.getLogger(__name__)


@dataclass
class Folded:
    report: Report | None  # the new version; None when nothing changed
    results: list[str] = field(default_factory=list)  # applied|partial|duplicate|invalid
    rejected: list[tuple[Fragment, str]] = field(default_factory=list)  # and why


def fold(current: Report | None, fragments: list[Fragment], rollups: list[RollupUpdate], *,
         report_id: str, now: str, hops: list[HopsUpdate] | None = None) -> Folded:
    """The report with these fragments, hops and roll-ups in it; hops may come before
    the report's first records (the trace stage is the quicker one)."""
    updated, changed = current, False
    out = Folded(report=None)
    if fragments:
        try:
            updated, results = merge_all(current, fragments, report_id=report_id, now=now)
            out.results = list(results)
        except (RetroError, ValueError) as exc:
            logger.error("fragments for %s cannot be merged at once (%s); one by one",
                         report_id, exc)
            updated = _one_by_one(current, fragments, report_id, now, out)
        changed = any(r in ("applied", "partial") for r in out.results)
    if hops:
        updated, timed = apply_hops(updated or Report(id=report_id), hops, now=now)
        changed |= timed
    for update in rollups:
        if updated is None:
            break
        updated, rolled = apply_rollup(updated, update, now=now)
        changed |= rolled
    out.report = updated if changed else None
    return out


def _one_by_one(current: Report | None, fragments: list[Fragment], report_id: str, now: str,
                out: Folded) -> Report | None:
    for fragment in fragments:
        try:
            current, result = merge(current, fragment, report_id=report_id, now=now)
        except (RetroError, ValueError) as exc:
            logger.error("fragment %s cannot be merged into %s: %s", fragment.id, report_id, exc)
            out.rejected.append((fragment, str(exc)))
            out.results.append("invalid")
            continue
        out.results.append(result)
    return current
