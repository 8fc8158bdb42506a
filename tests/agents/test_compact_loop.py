"""The compactor loop merges a buffer at once, publishes each report once, commits on
delivery, and keeps or forgets report state as partitions move."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError

from streams.agents.compactor import CompactLoop, fragments_group
from streams.metrics import Metrics
from streams.report.model import Report
from streams.settings import Settings
from tests.helpers import make_fragment

SETTINGS = Settings()
FRAGMENTS = SETTINGS.topics.fragments


class Record:
    """What aiokafka's getmany yields, as far as the loop reads it."""

    def __init__(self, partition: int, offset: int, key: str, value: bytes) -> None:
        self.topic, self.partition, self.offset = FRAGMENTS, partition, offset
        self.key, self.value, self.headers = key.encode(), value, ()


class Consumer:
    def __init__(self, partitions: set[int]) -> None:
        self.partitions = partitions
        self.commits: list[dict[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(FRAGMENTS, p) for p in self.partitions}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(offsets)


class Producer:
    def __init__(self, *, failing: bool = False) -> None:
        self.sent: list[tuple[str, str, bytes]] = []
        self.failing = failing

    async def send(self, topic: str, value: bytes, *, key: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if self.failing:
            fut.set_exception(KafkaTimeoutError())
        else:
            self.sent.append((topic, key.decode(), value))
            fut.set_result(None)
        return fut


def loop_with(consumer: Consumer, producer: Producer) -> CompactLoop:
    loop = CompactLoop(SETTINGS, Metrics(), group=fragments_group("g"))
    loop._consumer, loop._producer = consumer, producer  # type: ignore[assignment]
    loop._owned = set(consumer.partitions)  # as if their reports had loaded
    return loop


def receive(loop: CompactLoop, *records: Record) -> None:
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        loop._buffer.add(r, r.value, loop._commits.acker.track(tp, (tp, r.offset)), loop.metrics)


def fragment(fid: str, offset: int) -> bytes:
    return make_fragment(fid, {"raw/0": [[offset, offset]]}).model_dump_json().encode()


def test_a_buffer_publishes_each_report_once_and_commits_after_delivery() -> None:
    consumer, producer = Consumer({0, 1}), Producer()
    loop = loop_with(consumer, producer)
    receive(loop, Record(0, 0, "day/all#0", fragment("a", 1)),
            Record(0, 1, "day/all#0", fragment("b", 2)),
            Record(1, 0, "day/all#1", fragment("c", 3)))
    asyncio.run(loop.flush())
    reports = [(key, Report.from_json(value)) for topic, key, value in producer.sent
               if topic == SETTINGS.topics.reports]
    assert sorted(key for key, _ in reports) == ["day/all#0", "day/all#1"]
    assert {key: r.record_count for key, r in reports} == {"day/all#0": 2, "day/all#1": 1}
    assert consumer.commits == [{TopicPartition(FRAGMENTS, 0): 2,
                                 TopicPartition(FRAGMENTS, 1): 1}]
    # the next buffer merges into the state it keeps, not into an empty report
    receive(loop, Record(0, 2, "day/all#0", fragment("d", 4)))
    asyncio.run(loop.flush())
    assert Report.from_json(producer.sent[-1][2]).record_count == 3


def test_fragments_of_a_partition_that_moved_are_neither_merged_nor_committed() -> None:
    consumer, producer = Consumer({0}), Producer()
    loop = loop_with(consumer, producer)
    receive(loop, Record(0, 0, "day/all#0", fragment("a", 1)),
            Record(1, 5, "day/all#1", fragment("b", 2)))
    asyncio.run(loop.flush())
    assert [key for _, key, _ in producer.sent] == ["day/all#0"]
    assert consumer.commits == [{TopicPartition(FRAGMENTS, 0): 1}]


def test_a_failed_write_commits_nothing() -> None:
    consumer = Consumer({0})
    loop = loop_with(consumer, Producer(failing=True))
    receive(loop, Record(0, 0, "day/all#0", fragment("a", 1)))
    with pytest.raises(KafkaTimeoutError):
        asyncio.run(loop.flush())
    assert consumer.commits == []


def test_a_rebalance_keeps_the_state_of_kept_partitions_and_forgets_the_others() -> None:
    consumer, producer = Consumer({0, 1}), Producer()
    loop = loop_with(consumer, producer)
    receive(loop, Record(0, 0, "day/all#0", fragment("a", 1)),
            Record(1, 0, "day/all#1", fragment("b", 2)))
    asyncio.run(loop.flush())
    asyncio.run(loop.load({0}))  # partition 1 went to another worker; nothing to read
    assert set(loop.reports) == {"day/all#0"}
    assert loop._owned == {0}


def test_partitions_whose_reports_did_not_load_are_not_merged_and_the_loop_rejoins() -> None:
    class Unreachable(Producer):
        async def partitions_for(self, topic: str) -> set[int]:
            raise KafkaTimeoutError()  # the broker went away while loading

    consumer, producer = Consumer({0, 1}), Unreachable()
    loop = loop_with(consumer, producer)
    loop._owned = {0}
    asyncio.run(loop.load({0, 1}))
    assert loop._load_failed and loop._owned == {0}
    receive(loop, Record(0, 0, "day/all#0", fragment("a", 1)),
            Record(1, 0, "day/all#1", fragment("b", 2)))
    asyncio.run(loop.flush())
    # an empty state for partition 1 would have written its report without its past
    assert [key for _, key, _ in producer.sent] == ["day/all#0"]
    assert consumer.commits == [{TopicPartition(FRAGMENTS, 0): 1}]


def test_nothing_is_written_between_a_revocation_and_the_next_assignment() -> None:
    from streams.agents.compactor import _Handover

    consumer, producer = Consumer({0}), Producer()
    loop = loop_with(consumer, producer)
    handover = _Handover(loop)
    asyncio.run(handover.on_partitions_revoked({TopicPartition(FRAGMENTS, 0)}))
    receive(loop, Record(0, 0, "day/all#0", fragment("a", 1)))  # left over from a fetch
    asyncio.run(loop.flush())
    assert producer.sent == [] and consumer.commits == []
    asyncio.run(handover.on_partitions_assigned({TopicPartition(FRAGMENTS, 0)}))  # kept
    asyncio.run(loop.flush())
    assert [key for _, key, _ in producer.sent] == ["day/all#0"]


def test_a_partition_fetched_while_its_reports_load_is_read_again_once_loaded() -> None:
    class Seeking(Consumer):
        def __init__(self, partitions: set[int]) -> None:
            super().__init__(partitions)
            self.seeks: list[tuple[TopicPartition, int]] = []

        def seek(self, tp: TopicPartition, offset: int) -> None:
            self.seeks.append((tp, offset))

    consumer, producer = Seeking({0, 1}), Producer()
    loop = loop_with(consumer, producer)
    loop._owned = {0}  # partition 1 is assigned; its reports are still loading
    tp0, tp1 = TopicPartition(FRAGMENTS, 0), TopicPartition(FRAGMENTS, 1)
    fetched = {tp0: [Record(0, 0, "day/all#0", fragment("a", 1))],
               tp1: [Record(1, 7, "day/all#1", fragment("b", 2)),
                     Record(1, 8, "day/all#1", fragment("c", 3))]}
    asyncio.run(loop._take(consumer, fetched))  # type: ignore[arg-type]
    asyncio.run(loop.flush())
    assert consumer.seeks == [(tp1, 7)]  # its fragments are fetched again, not dropped
    assert consumer.commits == [{tp0: 1}]
    loop._owned = {0, 1}  # loaded
    asyncio.run(loop._take(consumer, {tp1: fetched[tp1]}))  # type: ignore[arg-type]
    asyncio.run(loop.flush())
    assert consumer.commits[-1] == {tp1: 9}
    assert Report.from_json(producer.sent[-1][2]).record_count == 2


def test_a_fragment_that_holds_its_commit_back_too_long_makes_the_loop_read_it_again() -> None:
    from streams.kafka.stall import StallDetector
    from tests.helpers import FakeClock

    consumer, producer = Consumer({0}), Producer()
    loop = loop_with(consumer, producer)
    clock = FakeClock()
    loop._held = StallDetector(SETTINGS.kafka.reread_held_seconds, clock=clock)
    tp = TopicPartition(FRAGMENTS, 0)
    loop._commits.acker.track(tp, (tp, 3))  # fetched, then lost on the way to the buffer
    receive(loop, Record(0, 4, "day/all#0", fragment("a", 1)))
    asyncio.run(loop.flush())
    assert consumer.commits == []  # offset 3 holds the commit back
    assert not loop._held_too_long()
    clock.advance(SETTINGS.kafka.reread_held_seconds)
    assert loop._held_too_long()  # so _consume returns False and the loop rejoins
    loop.between_owners = True  # no verdict while partitions are between owners
    assert not loop._held_too_long()


def test_a_long_publish_interval_is_not_taken_for_a_held_fragment() -> None:
    from streams.settings import KafkaSettings, ReportSettings

    def held_after(settings: Settings) -> float | None:
        loop = CompactLoop(settings, Metrics(), group=fragments_group("g"))
        loop._begin()
        return loop._held.stall_seconds if loop._held is not None else None

    assert held_after(SETTINGS) == SETTINGS.kafka.reread_held_seconds
    assert held_after(Settings(report=ReportSettings(publish_seconds=30))) == 120
    assert held_after(Settings(kafka=KafkaSettings(reread_held_seconds=0))) is None
