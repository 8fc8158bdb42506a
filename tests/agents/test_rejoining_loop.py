"""A stage loop whose output was not delivered rejoins from its commits and counts the
re-read of its topics."""

from __future__ import annotations

import asyncio

import streams.agents.common as common
from streams.agents.common import RejoiningLoop
from streams.metrics import Metrics
from streams.settings import Settings


class Client:
    def __init__(self) -> None:
        self.started = self.stopped = 0

    async def start(self) -> None:
        self.started += 1

    async def stop(self) -> None:
        self.stopped += 1

    def subscription(self) -> set[str]:
        return {"lane-a", "lane-b"}


class FailsOnce(RejoiningLoop):
    name = "test loop"

    def __init__(self, metrics: Metrics) -> None:
        super().__init__(Settings(), "g-test", metrics)
        self.memberships = 0
        self.consumers: list[Client] = []

    def _new_consumer(self) -> Client:
        self.consumers.append(Client())
        return self.consumers[-1]

    async def _consume(self) -> bool:
        self.memberships += 1
        if self.memberships == 2:
            self._stopping = True  # the second membership runs until shutdown
        return self.memberships > 1  # the first one's output was not delivered


def test_a_failed_membership_rejoins_and_counts_its_topics_as_re_read(monkeypatch) -> None:
    monkeypatch.setattr(common, "RESTART_SECONDS", 0.0)
    monkeypatch.setattr(common, "stage_producer", lambda settings: Client())
    metrics = Metrics()
    loop = FailsOnce(metrics)
    asyncio.run(loop.run())
    assert loop.memberships == 2
    assert loop.consumers[0].stopped == 1  # left the group before joining again
    get = metrics.registry.get_sample_value
    assert get("retro_offset_rereads_total", {"topic": "lane-a"}) == 1
    assert get("retro_offset_rereads_total", {"topic": "lane-b"}) == 1
