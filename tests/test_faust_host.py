"""faust hosts the worker (web server, timers, tasks, lifecycle) and nothing more: the
worker it runs has no faust consumer, agent, topic or table, and no module of streams/
touches or replaces faust's private names."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

import streams
from streams.app import ROLES, build_app
from streams.settings import Settings

STREAMS = Path(streams.__file__).parent

# faust's Consumer and stream internals the removed guards replaced or read, and the
# faust API that would give the worker a consumer of faust's own
FORBIDDEN = re.compile(
    r"\b(_new_offset|perform_seek|_committed_offset|_unacked_messages|_read_offset"
    r"|_acked_index|_CStreamIterator|consumer_generation_id|flow_active)\b"
    r"|faust\.(transport|streams|tables|assignor)\b|faust_guards"
    r"|\bConsumer\.\w+\s*="
    r"|\bapp\.(consumer|agent|topic|stream|channel|Table|GlobalTable|SetTable)\b"
)


def _import_every_streams_module() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(streams.__path__, "streams.")
             if m.name != "streams.__main__"]  # runs the CLI
    for name in names:
        importlib.import_module(name)
    return names


def test_no_streams_module_touches_faust_private_names() -> None:
    names = _import_every_streams_module()
    assert {"streams.app", "streams.worker.stages", "streams.runtime.loop"} <= set(names)
    found = [f"{path.relative_to(STREAMS.parent)}:{n}: {line.strip()}"
             for path in sorted(STREAMS.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if FORBIDDEN.search(line)]
    assert found == []


def test_faust_is_left_as_installed_after_every_streams_module_is_imported() -> None:
    """No method or module attribute of faust comes from streams/ (a patch would)."""
    _import_every_streams_module()
    build_app(Settings(kafka={"bootstrap": "127.0.0.1:9"}), web=False)
    patched = []
    for name, module in list(sys.modules.items()):
        if not (name == "faust" or name.startswith("faust.")) or module is None:
            continue
        for attr, value in list(vars(module).items()):
            owners = [value]
            if inspect.isclass(value) and value.__module__.startswith("faust"):
                owners += list(vars(value).values())
            for obj in owners:
                obj = getattr(obj, "__func__", obj)
                origin = getattr(obj, "__module__", None) or ""
                if origin.startswith(("streams", "tests")):
                    patched.append(f"{name}.{attr}: {origin}")
    assert patched == []


def _own_functions(obj: object) -> list[str]:
    """The attributes of ``obj`` itself (not of its class) that are functions of
    streams/ or tests/: an instance patch puts one there."""
    found = []
    for attr, value in vars(obj).items():
        func = getattr(value, "__func__", value)
        if inspect.isfunction(func) and func.__module__.startswith(("streams", "tests")):
            found.append(f"{type(obj).__name__}.{attr}: {func.__module__}")
    return found


def test_the_faust_worker_and_app_are_used_as_faust_makes_them(tmp_path: Path) -> None:
    """The Worker `retro worker` runs is faust's own class, configured through its
    options, with no method replaced on the instance (the class checks above miss that)."""
    import faust

    from streams.runner import host_worker

    settings = Settings(state_dir=tmp_path, kafka={"bootstrap": "127.0.0.1:9"})
    app = build_app(settings, roles=ROLES).app
    host = host_worker(app, settings)
    assert type(host) is faust.Worker
    assert _own_functions(host) == []
    assert _own_functions(app) == []


def test_the_worker_app_has_no_faust_consumer(tmp_path: Path) -> None:
    """Built as `retro worker` builds it: the stages are loops of their own, and faust
    starts neither a consumer (no group, no subscription, no tables) nor a producer."""
    from faust.types import AgentManagerT, ConsumerT, ProducerT
    from faust.types.tables import TableManagerT
    from faust.types.transports import ConductorT

    settings = Settings(state_dir=tmp_path, kafka={"bootstrap": "127.0.0.1:9"})
    worker = build_app(settings, roles=ROLES)
    app = worker.app
    assert len(app.agents) == 0
    assert len(app.topics) == 0
    assert len(app.tables) == 0
    assert [loop.name for loop in worker.loops] == [
        "clean loop", "batch loop", "re-drive loop", "trace loop", "compactor loop"]
    tasks = [t.__name__ for t in app._app_tasks]
    assert [n for n in tasks if n.endswith("_loop")] == [  # tasks of the host
        "clean_loop", "batch_loop", "re_drive_loop", "trace_loop", "compactor_loop"]
    started = list(app.on_init_dependencies())
    kafka = [s for s in started
             if isinstance(s, ConsumerT | ProducerT | ConductorT | TableManagerT)]
    assert kafka == []
    assert app.web in started  # the host still serves /metrics, /healthz, the reports
    assert not any(isinstance(s, AgentManagerT) and len(s) for s in started)
