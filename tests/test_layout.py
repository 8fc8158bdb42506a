"""The package layout shows the data flow: imports point one way, with no cycles.

cli -> app -> worker (Kafka wiring) -> stages (ingest, clean, traces and batch,
gateway, report, notify, in flow order) -> the stage runtime -> Kafka plumbing -> shared
vocabulary. Development tools (``streams.dev``)
may use anything; only the command line may use them.

Inside ``streams.report`` the same holds one floor down: the report's state (model,
keys, merge) < its analysis < the compactor step < the views < the operator tools.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "streams"

# Lower numbers sit lower in the house; an import may only point to the same or lower.
LEVELS: dict[str, int] = {
    "errors": 0, "intervals": 0, "records": 0, "schemas": 0, "settings": 0, "metrics": 0,
    "clock": 0, "tokens": 0, "redact": 0, "ports": 0,
    "kafka": 1, "runtime": 2,
    "ingest": 2, "clean": 3, "traces": 4, "batch": 4, "gateway": 5, "report": 6, "notify": 7,
    "worker": 8, "app": 9, "runner": 10,
    "cli": 11, "__main__": 12,
    "dev": 11,
}
MAY_IMPORT_DEV = {"cli", "__main__", "dev"}

# The floors inside streams.report, lower first. store (reads reports from Kafka) uses
# only the state.
REPORT_LEVELS: dict[str, int] = {
    "state": 0, "store": 0, "analysis": 1, "compactor": 2, "views": 3, "ops": 4,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every streams module imported anywhere in the file (TYPE_CHECKING and lazy too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith("streams.") and name in modules:
                out.add(name)
    return out


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_every_room_has_a_level(graph: dict[str, set[str]]) -> None:
    rooms = {_room(m) for m in graph} - {"__init__"}
    assert rooms <= set(LEVELS), f"give these a level: {sorted(rooms - set(LEVELS))}"


def test_imports_point_down_the_flow(graph: dict[str, set[str]]) -> None:
    upward = []
    for module, targets in graph.items():
        src = _room(module)
        if src == "__init__":
            continue
        for target in targets:
            dst = _room(target)
            if dst == "dev" and src not in MAY_IMPORT_DEV:
                upward.append(f"{module} -> {target} (production code uses a dev tool)")
            elif src != dst and LEVELS[dst] > LEVELS[src] and src != "dev":
                upward.append(f"{module} -> {target}")
    assert not upward, "imports against the flow:\n" + "\n".join(sorted(upward))


def _report_floor(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "report" else None


def test_every_report_floor_has_a_level(graph: dict[str, set[str]]) -> None:
    floors = {f for m in graph if (f := _report_floor(m))}
    assert floors <= set(REPORT_LEVELS), \
        f"give these a level: {sorted(floors - set(REPORT_LEVELS))}"


def test_report_imports_point_down_its_floors(graph: dict[str, set[str]]) -> None:
    upward = []
    for module, targets in graph.items():
        src = _report_floor(module)
        if src is None:
            continue
        for target in targets:
            dst = _report_floor(target)
            if dst is not None and REPORT_LEVELS[dst] > REPORT_LEVELS[src]:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports up the report's floors:\n" + "\n".join(sorted(upward))


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    # packages import their own modules from __init__; a package -> module edge is not a cycle
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The graph reader itself: a stage importing a later stage is found."""
    (tmp_path / "streams" / "clean").mkdir(parents=True)
    bad = tmp_path / "streams" / "clean" / "x.py"
    bad.write_text("from streams.report.state.merge import merge\n")
    assert _imports(bad, {"streams.report.state.merge": bad}) == {"streams.report.state.merge"}


def test_the_checker_sees_an_import_up_the_report_floors() -> None:
    graph = {"streams.report.state.merge": {"streams.report.views.view"}}
    with pytest.raises(AssertionError, match=r"state\.merge -> streams\.report\.views\.view"):
        test_report_imports_point_down_its_floors(graph)


# the rooms that may hold a Kafka client: kafka/ (connections, readers, lag, topics), the
# stage runtime's loop, `retro produce`, the development tools and the command line
KAFKA_CLIENT_ROOMS = {"kafka", "runtime", "ingest", "dev", "cli"}


def _kafka_client_importers() -> list[str]:
    found: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if _room(module) in KAFKA_CLIENT_ROOMS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "aiokafka" or n.startswith("aiokafka.") for n in names):
                found.add(module)
    return sorted(found)


def test_kafka_is_read_in_kafka_and_nowhere_above_it() -> None:
    """The stages, the report (its store, audit, dead letters, reviews, re-drive), the
    notifier and the worker's wiring read Kafka through streams/kafka/readers.py; none
    of them holds a consumer of its own."""
    assert _kafka_client_importers() == []
