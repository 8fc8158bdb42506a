"""A long loop gives the worker's other stages a turn once per time quantum."""

from __future__ import annotations

import asyncio

from streams.runtime.turns import Turns
from tests.helpers import FakeClock


async def test_other_tasks_run_once_the_quantum_is_used() -> None:
    clock = FakeClock()
    turns = Turns(quantum=0.002, clock=clock)
    ran: list[float] = []

    async def other() -> None:
        ran.append(clock.now)

    task = asyncio.ensure_future(other())
    clock.now = 0.001
    await turns.give()  # half a quantum: keeps the loop
    assert ran == []
    clock.now = 0.0025
    await turns.give()  # a quantum used: the other stage runs
    assert ran == [0.0025]
    await task


async def test_the_quantum_restarts_after_a_turn() -> None:
    clock = FakeClock()
    turns = Turns(quantum=0.002, clock=clock)
    suspended = 0

    async def count_turns() -> None:
        nonlocal suspended
        while True:
            suspended += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(count_turns())
    await asyncio.sleep(0)
    start = suspended
    for step in range(1, 11):  # 10 records of 1 ms each: a turn every second record
        clock.now = step * 0.001
        await turns.give()
    task.cancel()
    assert suspended - start == 5
