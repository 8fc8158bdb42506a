"""Ordered acks, and the faust behaviour that makes them necessary."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

from streams.kafka.acks import OrderedAcker


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


def _faust_new_offset(acked: list[int], committed: int | None) -> int | None:
    """faust's own commit decision for one partition (its Consumer._new_offset,
    without the guard from streams/kafka/faust_guards.py)."""
    from intervaltree import IntervalTree

    from streams.kafka.faust_guards import faust_original

    fake = SimpleNamespace(
        _acked=defaultdict(list, {"tp": list(acked)}),
        _acked_index=defaultdict(set, {"tp": set(acked)}),
        _gap=defaultdict(IntervalTree),
        _committed_offset=defaultdict(lambda: None, {"tp": committed}),
    )
    return faust_original("_new_offset")(fake, "tp")


def test_faust_commits_past_an_unacked_record_when_acks_arrive_out_of_order() -> None:
    """Why OrderedAcker exists: offsets 1 and 2 acked while 0 is still in flight.

    With no commit yet, faust would commit offset 3, so a crash loses record 0; with
    a commit at 8 and acks 9, 10 it commits 11 and skips 8. If this test starts to
    fail, faust fixed it upstream and OrderedAcker becomes belt and braces.
    """
    assert _faust_new_offset([1, 2], committed=None) == 3
    assert _faust_new_offset([9, 10], committed=8) == 11


def test_in_order_acks_never_let_faust_skip_a_record() -> None:
    finished_order = [3, 1, 4, 0, 2, 5]
    released: list[int] = []
    acker = OrderedAcker(released.append)
    handles = [acker.track("tp", i) for i in range(6)]
    for i in finished_order:
        acker.done(handles[i])
        if released:
            # whatever faust commits is never past the first unfinished record
            commit = _faust_new_offset(released, committed=None)
            unfinished = [j for j in range(6) if not handles[j].done]
            assert commit is None or not unfinished or commit <= min(unfinished)


def test_a_record_holding_a_commit_back_is_reported_once_it_is_held_long_enough() -> None:
    from streams.kafka.acks import Commits
    from streams.kafka.stall import StallDetector
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
