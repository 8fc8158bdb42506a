"""Guards around faust behaviour that can lose records; installed by ``build_app``.

During a rebalance faust skips messages fetched under the previous consumer
generation, and acks them while skipping. When the partition stays with the same
worker, the periodic commit can then move past records that no agent processed, so
they never come back (seen here in tests/integration: fragments fetched a moment
before a second worker joined were skipped, committed and never merged). The guard
drops acks of messages from an older generation instead: they stay uncommitted, and
faust's seek to the committed offset after the rebalance delivers them again, to be
processed (idempotently) by whichever worker now owns the partition.

faust's Cython stream iterator inlines its own ack path, so the guard also switches
streams to the pure-Python iterator, which acks through ``Consumer.ack``.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

_INSTALLED = False


def install() -> None:
    """Idempotent; call before the worker starts."""
    global _INSTALLED
    if _INSTALLED:
        return
    import faust.streams
    from faust.transport.consumer import Consumer
    from faust.types.tuples import ack_lock

    faust.streams._CStreamIterator = None  # use _py_aiter, which acks via Consumer.ack
    original = Consumer.ack

    def ack(self: Any, message: Any) -> bool:
        if is_stale(message, self.app.consumer_generation_id):
            with ack_lock:
                message.acked = True
                self._unacked_messages.discard(message)
            logger.debug("not acking %s[%s]@%s from generation %s", message.topic,
                         message.partition, message.offset, message.generation_id)
            return False
        return original(self, message)

    Consumer.ack = ack  # type: ignore[method-assign]
    _INSTALLED = True


def is_stale(message: Any, current_generation: int) -> bool:
    """A message fetched under an older consumer generation than the current one."""
    generation = getattr(message, "generation_id", None)
    return generation is not None and generation != current_generation
