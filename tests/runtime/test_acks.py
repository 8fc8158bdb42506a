"""Ordered acks: what a stage loop commits never passes a record still in flight."""

from __future__ import annotations

from streams.runtime.acks import OrderedAcker


def test_acks_are_released_in_arrival_order_per_partition() -> None:
    acked: list[tuple[str, int]] = []
    acker = OrderedAcker(acked.append)
    a = [acker.track("p0", ("p0", i)) for i in range(4)]
    b = [acker.track("p1", ("p1", i)) for i in range(2)]
    acker.done(a[2])
    acker.done(a[1])
    acker.done(b[1])
    assert acked == []  # p0/0 and p1/0 still in flight
    acker.done(a[0])
    assert acked == [("p0", 0), ("p0", 1), ("p0", 2)]
    acker.done(b[0])
    acker.done(a[3])
    assert acked[3:] == [("p1", 0), ("p1", 1), ("p0", 3)]
    assert acker.waiting() == 0


def test_commits_never_pass_a_record_still_in_flight() -> None:
    """Batches finish out of order: the offset a loop is given to commit is never past
    the first record not done, so a crash re-reads it instead of losing it."""
    from streams.runtime.acks import Commits

    finished_order = [3, 1, 4, 0, 2, 5]
    commits = Commits()
    handles = [commits.acker.track("tp", ("tp", i)) for i in range(6)]
    offered: list[int] = []
    for i in finished_order:
        commits.acker.done(handles[i])
        unfinished = [j for j in range(6) if not handles[j].done]
        commit = commits.take({"tp"}).get("tp")
        if commit is not None:
            offered.append(commit)
            assert not unfinished or commit <= min(unfinished)
    assert offered == [2, 5, 6]
    assert commits.take({"tp"}) == {}


def test_a_record_holding_a_commit_back_is_reported_once_it_is_held_long_enough() -> None:
    from streams.kafka.stall import StallDetector
    from streams.runtime.acks import Commits
    from tests.helpers import FakeClock

    clock = FakeClock()
    commits, detector = Commits(), StallDetector(20.0, clock=clock)
    acker = commits.acker

    def held() -> list:  # as the compactor loop asks: a pending record is lag
        waiting = commits.oldest_pending()
        detector.observe(waiting, dict.fromkeys(waiting, 1))
        return detector.stalled()

    stuck = acker.track("p0", ("p0", 0))
    moving = acker.track("p1", ("p1", 0))
    assert held() == []
    clock.advance(15)
    acker.done(moving)  # p1's commit moves on: a new head, a new clock
    acker.track("p1", ("p1", 1))
    assert held() == []
    clock.advance(6)
    assert held() == ["p0"]  # the same record for 21 s
    acker.done(stuck)
    assert held() == []  # p0 has nothing pending; p1 only 6 s
    clock.advance(20)
    assert held() == ["p1"]


def test_commits_skip_partitions_no_longer_owned() -> None:
    from streams.runtime.acks import Commits

    commits = Commits()
    for tp in ("p0", "p1"):
        commits.acker.done(commits.acker.track(tp, (tp, 5)))
    assert commits.take({"p1"}) == {"p1": 6}


def test_forgetting_a_partition_drops_its_unacked_records() -> None:
    acked: list[str] = []
    acker = OrderedAcker(acked.append)
    old = [acker.track("p1", f"old{i}") for i in range(3)]
    acker.done(old[1])
    acker.forget("p1")  # revoked: none of the old ones may be acked now
    for handle in old:
        acker.done(handle)
    assert acked == []
    new = acker.track("p1", "new0")  # the partition came back: a fresh queue
    acker.done(new)
    assert acked == ["new0"]
