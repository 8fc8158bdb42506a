"""The image installs a locked dependency set: deploy/constraints.txt pins every
runtime dependency (the closure of pyproject's ``dependencies``) to the version this
venv runs the tests with. The image has no redis client: the [redis] extra (shared
answer cache) is not locked here.

Regenerate after changing dependencies: ``.venv/bin/python tests/test_deploy_lock.py
> deploy/constraints.txt``. .ci/test installs with the same constraints, so the
tests run on what the image ships.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "deploy" / "constraints.txt"
EXTRAS: tuple[str, ...] = ()
HEADER = """\
# Locked runtime dependencies of the retro-stream image (pip constraints, `-c`).
# Generated from the test venv: .venv/bin/python tests/test_deploy_lock.py > deploy/constraints.txt
# tests/test_deploy_lock.py fails when this is not the closure the venv runs.
"""


def _closure(root: str = "retro-stream", extras: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """Name -> installed version of everything ``root[extras]`` needs on this platform."""
    env = default_environment()
    todo = [(root, extras)]
    seen: dict[str, str] = {}
    while todo:
        name, wanted = todo.pop()
        dist = metadata.distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(
                req.marker.evaluate({**env, "extra": e}) for e in ("", *wanted)
            ):
                continue
            key = canonicalize_name(req.name)
            if key not in seen:
                seen[key] = metadata.version(req.name)
                todo.append((req.name, tuple(req.extras)))
    return dict(sorted(seen.items()))


def render() -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in _closure().items())


def _pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
            assert match, f"not an exact pin: {line!r}"
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def test_constraints_pin_the_runtime_closure_this_venv_tests() -> None:
    pins = _pins(LOCK.read_text("utf-8"))
    assert pins == _closure(), (
        "deploy/constraints.txt is stale; regenerate it:\n"
        "  .venv/bin/python tests/test_deploy_lock.py > deploy/constraints.txt")


def test_the_lock_knows_the_direct_dependencies() -> None:
    pins = _pins(LOCK.read_text("utf-8"))
    for name in ("aiokafka", "faust-streaming", "prometheus-client", "pydantic", "aiohttp"):
        assert name in pins, name


def test_the_dockerfile_and_ci_install_with_the_constraints() -> None:
    docker = (ROOT / "deploy" / "Dockerfile").read_text("utf-8")
    assert re.search(r"pip install .*-c .*constraints\.txt", docker)
    assert "-c deploy/constraints.txt" in (ROOT / ".ci" / "test").read_text("utf-8")


if __name__ == "__main__":
    print(render(), end="")
