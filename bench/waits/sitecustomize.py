"""Where a worker waits: loaded by ``e2e_bench.py --waits`` (PYTHONPATH=bench/waits).

While the event loop sits in ``select`` nothing of the worker runs, so every such
second is a second it waited; each is charged to what every task was suspended on at
that moment (a stage loop by its name and the call it waits in); idle seconds are also
kept per second of the monotonic clock, which every process shares, so the bench can
count the steady part of a run alone. Written as JSON to
``$BENCH_WAITS_OUT`` every few seconds and at exit. Bench-only: nothing in
``streams/`` imports it.
"""

import os

if os.environ.get("BENCH_WAITS_OUT"):
    import asyncio
    import atexit
    import json
    import selectors
    import time
    from collections import Counter

    _OUT = os.environ["BENCH_WAITS_OUT"]
    _select = selectors.EpollSelector.select
    _waits: Counter[str] = Counter()
    _by_second: Counter[int] = Counter()  # idle seconds per second of the monotonic clock
    _state = {"idle": 0.0, "start": time.monotonic(), "written": time.monotonic()}

    def _where(task: asyncio.Task) -> str | None:
        """'[stage loop] project call > library call' a task waits in, or None."""
        coro, mine, theirs, loop = task.get_coro(), [], [], None
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is None:
                break
            name = frame.f_code.co_qualname
            if "/streams/" in frame.f_code.co_filename:
                mine.append(name)
                if name == "StageLoop._consume":
                    loop = getattr(frame.f_locals.get("self"), "name", None)
            else:
                theirs.append(name)
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if not mine:
            return None
        return f"[{loop or mine[0]}] {mine[-1]} > {theirs[-1] if theirs else '-'}"

    def _write() -> None:
        with open(_OUT, "w") as out:
            json.dump({"seconds": time.monotonic() - _state["start"],
                       "idle_seconds": _state["idle"], "waits": _waits.most_common(60),
                       "idle_by_second": sorted(_by_second.items())}, out)

    def _timed_select(self, timeout=None):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        events = _select(self, timeout)
        now = time.monotonic()
        _state["idle"] += now - started
        _by_second[int(now)] += now - started
        for task in asyncio.all_tasks():
            where = _where(task)
            if where:
                _waits[where] += now - started
        if now - _state["written"] > 5:
            _state["written"] = now
            _write()
        return events

    selectors.EpollSelector.select = _timed_select
    atexit.register(_write)
