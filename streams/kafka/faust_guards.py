"""Guards around faust's offset handling, which can lose records; installed by ``build_app``.

The promise they keep: **a partition's committed offset only moves past records an
agent has acked**, and our agents ack a record only once its outputs are delivered
(``streams/kafka/acks.py``). faust-streaming 0.15.3 (pinned in pyproject.toml; each hazard is
shown in tests/kafka/test_faust_guards.py) breaks that promise in three places, seen losing
records in tests/integration/test_pipeline.py when a worker joins or leaves the group
mid-stream:

1. **Skipped messages are acked.** During a rebalance the stream iterator skips
   messages taken off an agent's queue while flow control is suspended, or fetched
   under the previous consumer generation, and acks them while skipping. The guard
   drops those acks: a message counts only if faust handed it to an agent
   (``message.tracked``) in the current generation.
2. **A gap of one is committed past.** faust commits the first run of consecutive
   acked offsets and only checks that it starts near the committed offset: with
   offset 8 committed (next to read) and 9, 10 acked, it commits 11 and skips 8.
   The guard commits a run only if it starts exactly at the committed offset.
3. **Re-read records are dropped, and skipped ones count as done.** The fetch loop
   drops a record whose offset is below the last one it read, and treats a jump in
   offsets as a gap that is already done. When a fetch started before the seek to
   the committed offset lands after it, the last-read offset jumps ahead: the
   records in between are marked done and their re-read copies are dropped, so they
   are never processed. The guard turns that bookkeeping off: every fetched record
   reaches the agent. A record may be seen twice after a rebalance, which the
   pipeline is built for (fragment ids and report coverage make re-runs no-ops).

With these, a record that never reached an agent holds its partition's commit back
instead of being lost. Such holes still happen (a fetch in flight across a rebalance
can swallow a record inside aiokafka or faust), so the worker watches for a
partition whose commit has not moved for a while although it has lag and nothing in
flight (``commit_progress`` fed to a ``StallDetector``), and the worker seeks it
back to its committed offset: the record is read again. A restart would re-read it
too (``/healthz`` reports a stalled lag).

faust's Cython stream iterator inlines its own ack path, so the guards also switch
streams to the pure-Python iterator, which acks through ``Consumer.ack``.
"""

from __future__ import annotations

import bisect
import logging
from collections import defaultdict
from typing import Any

from streams.errors import ConfigError

logger = logging.getLogger(__name__)

_INSTALLED = False
# faust's own methods, kept for the tests that show each hazard
_faust: dict[str, Any] = {}


def install() -> None:
    """Idempotent; call before the worker starts."""
    global _INSTALLED
    if _INSTALLED:
        return
    import faust
    import faust.streams
    from faust.transport.consumer import Consumer, ensure_TP
    from faust.types.tuples import ack_lock

    missing = [name for name in ("ack", "_new_offset", "perform_seek", "_acked",
                                 "_committed_offset", "_read_offset", "_unacked_messages")
               if not hasattr(Consumer, name) and name not in Consumer.__annotations__]
    if missing or not hasattr(faust.streams, "_CStreamIterator"):
        raise ConfigError(f"faust-streaming {faust.__version__} does not have the internals "
                          f"streams/kafka/faust_guards.py guards ({missing}); install the version "
                          "pinned in pyproject.toml")
    faust.streams._CStreamIterator = None  # use _py_aiter, which acks via Consumer.ack
    for name in ("ack", "_new_offset", "__init__", "perform_seek"):
        _faust[name] = getattr(Consumer, name)

    def ack(self: Any, message: Any) -> bool:
        if skipped(message, self.app.consumer_generation_id):
            with ack_lock:
                message.acked = True
                self._unacked_messages.discard(message)
            logger.info("not acking %s[%s]@%s: skipped by faust during a rebalance "
                        "(generation %s, now %s); it is read again after the rebalance",
                        message.topic, message.partition, message.offset,
                        message.generation_id, self.app.consumer_generation_id)
            return False
        return _faust["ack"](self, message)

    def new_offset(self: Any, tp: Any) -> int | None:
        acked, committed = self._acked[tp], self._committed_offset[tp]
        self._acked_index[tp].difference_update(drop_below(acked, committed))
        # a partition the group never committed (added at run time) keeps faust's rule
        never = committed is None and tp in getattr(self, "_retro_never_committed", ())
        if not never and not may_commit(acked, committed):
            return None
        return _faust["_new_offset"](self, tp)

    async def perform_seek(self: Any) -> None:
        """faust's, except that a committed offset of 0 is kept as 0 (faust stores
        it as None, "no commit yet"), and partitions without a commit are noted."""
        committed = {ensure_TP(tp): offset
                     for tp, offset in (await self.seek_to_committed()).items()}
        self._read_offset.update({tp: offset if offset is not None and offset >= 0 else None
                                  for tp, offset in committed.items()})
        self._committed_offset.update({tp: offset for tp, offset in committed.items()
                                       if offset is not None and offset >= 0})
        self._retro_never_committed = {tp for tp, offset in committed.items()
                                       if offset is None or offset < 0}

    def consumer_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _faust["__init__"](self, *args, **kwargs)
        self._read_offset = NoReadOffsets()

    Consumer.ack = ack  # type: ignore[method-assign]
    Consumer._new_offset = new_offset  # type: ignore[method-assign]
    Consumer.perform_seek = perform_seek  # type: ignore[method-assign]
    Consumer.__init__ = consumer_init  # type: ignore[method-assign]
    _INSTALLED = True


def faust_original(name: str) -> Any:
    """faust's own ``Consumer.<name>``, whether or not the guards are installed."""
    from faust.transport.consumer import Consumer

    return _faust.get(name) or getattr(Consumer, name)


def skipped(message: Any, current_generation: int) -> bool:
    """A message faust skipped: never handed to an agent, or from an older generation."""
    if not getattr(message, "tracked", True):
        return True
    generation = getattr(message, "generation_id", None)
    return generation is not None and generation != current_generation


def drop_below(acked: list[int], committed: int | None) -> list[int]:
    """Remove (and return) acked offsets below the committed one: a seek moved the
    commit past them, so they no longer matter. ``acked`` is sorted in place."""
    acked.sort()
    n = 0 if committed is None else bisect.bisect_left(acked, committed)
    behind = acked[:n]
    del acked[:n]
    return behind


def may_commit(acked: list[int], committed: int | None) -> bool:
    """True when the next record to commit (``committed``, the next offset to read)
    is acked. None means not known yet (between an assignment and faust's seek to
    the committed offsets), so nothing is committed. ``ensure_group_offsets`` gives
    every input partition a commit; for one that still has none (partitions added
    while workers run) the guard falls back to faust's own rule."""
    return committed is not None and bool(acked) and min(acked) == committed


def commit_progress(consumer: Any) -> tuple[dict[Any, int], dict[Any, int]]:
    """Committed offsets and held-back lag of the acking partitions the consumer owns,
    for a ``StallDetector``: a partition with a record in flight (handed to an agent,
    not yet acked) or no known commit counts as lag 0, since it is not stuck."""
    acking = consumer.app.topics.acks_enabled_for
    in_flight = {m.tp for m in list(consumer._unacked_messages) if not m.acked}
    committed: dict[Any, int] = {}
    lag: dict[Any, int] = {}
    for tp in consumer.assignment():
        if not acking(tp.topic):
            continue
        offset, highwater = consumer._committed_offset.get(tp), consumer.highwater(tp)
        if offset is None or highwater is None or tp in in_flight:
            lag[tp] = 0
        else:
            committed[tp], lag[tp] = offset, max(0, highwater - offset)
    return committed, lag


class NoReadOffsets(defaultdict):
    """faust's last-read offsets, which its fetch loop reads back as "unknown".

    Writes are kept (seeks and the monitor still set them); reads return None, which
    makes the loop deliver every record and never book an offset jump as done.
    """

    def __init__(self) -> None:
        super().__init__(lambda: None)

    def __getitem__(self, key: Any) -> None:
        return None
