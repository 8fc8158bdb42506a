"""Every dead letter a worker can count has its series at 0 from the start.

Prometheus's ``increase()`` needs a sample before the first increment: a series born
at 1 with the first dead letter reads as no increase at all. The reasons are read
from the code that writes the letters, so a new reason without its series fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from streams.clean.step import RouteCounters
from streams.metrics import DEADLETTER_REASONS, Metrics

STREAMS = Path(__file__).resolve().parents[1] / "streams"
WORKER_STAGES = ("clean", "batch")  # `retro produce` writes letters too, but serves no metrics


def _constant(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _record_error_reasons(tree: ast.Module) -> set[str]:
    """The ``reason`` of RecordError and its subclasses: the clean stage letters them."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    family = {"RecordError"}
    grew = True
    while grew:
        grew = False
        for name, cls in classes.items():
            bases = {b.id for b in cls.bases if isinstance(b, ast.Name)}
            if name not in family and bases & family:
                family.add(name)
                grew = True
    reasons = set()
    for name in family:
        for stmt in classes[name].body:
            if (isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "reason" for t in stmt.targets)):
                reasons.add(_constant(stmt.value) or "")
    return reasons - {""}


def reasons_in_code() -> set[tuple[str, str]]:
    """(stage, reason) of every dead letter streams/ can write, read from its source."""
    pairs: set[tuple[str, str]] = set()
    errors = ast.parse((STREAMS / "errors.py").read_text("utf-8"))
    for reason in _record_error_reasons(errors):
        pairs.add(("clean", reason))
    for path in STREAMS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            keywords = {k.arg: _constant(k.value) for k in node.keywords}
            if name == "_dead" and len(node.args) >= 4 and _constant(node.args[3]):
                pairs.add(("clean", _constant(node.args[3]) or ""))  # Cleaner._dead
            if name in ("DecodeError", "RecordTooLarge", "RecordError") and keywords.get(
                    "reason"):
                pairs.add(("clean", keywords["reason"] or ""))
            if keywords.get("stage") and keywords.get("reason"):
                pairs.add((keywords["stage"] or "", keywords["reason"] or ""))
    return {(stage, reason) for stage, reason in pairs if stage in WORKER_STAGES}


def test_the_code_scan_finds_the_known_reasons() -> None:
    found = reasons_in_code()
    assert {("clean", "undecodable"), ("clean", "too_large"), ("clean", "binary"),
            ("clean", "bad_envelope"), ("batch", "bad_record")} <= found


def test_every_deadletter_reason_starts_at_zero() -> None:
    get = Metrics().registry.get_sample_value
    expected = reasons_in_code()
    declared = {(stage, r) for stage, reasons in DEADLETTER_REASONS.items() for r in reasons}
    assert declared == expected
    for stage, reason in sorted(expected):
        assert get("retro_deadletter_total", {"stage": stage, "reason": reason}) == 0.0, (
            stage, reason)


def test_the_first_deadletter_increments_the_series_already_there() -> None:
    metrics = Metrics()
    get = metrics.registry.get_sample_value
    labels = {"stage": "clean", "reason": "undecodable"}
    before = get("retro_deadletter_total", labels)
    RouteCounters(metrics, ("fast", "slow", "deadletter")).delivered(
        {"deadletter": 1}, {"undecodable": 1})
    assert (before, get("retro_deadletter_total", labels)) == (0.0, 1.0)
