"""Keep a broker outage from flooding the logs: repeated warnings are summarised.

While a broker is away, aiokafka and faust log the same connection error many times a
second (380-830 KB/s measured during a broker restart). :class:`RepeatLimiter` lets
the first few of each message through, then one line per interval that says how many
like it were held back. Messages are "the same" when logger, level and format string
match, whatever their arguments (a node id, an address). Every command's handlers get
one (:func:`limit_repeats`); the worker, whose logging faust sets up, gets it through
:func:`logging_config`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

REPEAT_BURST = 3  # of one message per interval, logged as they come
REPEAT_INTERVAL_SECONDS = 30.0
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # one line per record


class RepeatLimiter(logging.Filter):
    """A handler filter: at most ``burst`` of one message per ``interval`` at WARNING and up.

    The next one let through after a quiet spell carries the count of those held back.
    """

    def __init__(self, *, burst: int = REPEAT_BURST,
                 interval: float = REPEAT_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 1000) -> None:
        super().__init__()
        self.burst = burst
        self.interval = interval
        self.clock = clock
        self.max_keys = max_keys
        # key -> [window start, let through in the window, held back since last shown]
        self._seen: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        state = self._seen.get(key)
        if state is None or now - state[0] >= self.interval:
            held = int(state[2]) if state is not None else 0
            if state is None and len(self._seen) >= self.max_keys:
                self._seen.clear()  # bounded memory for messages with varying formats
            self._seen[key] = [now, 1, 0]
            if held:
                record.msg = f"{record.msg} [{held} more like this in the last " \
                             f"{self.interval:.0f}s were not logged]"
            return True
        if state[1] < self.burst:
            state[1] += 1
            return True
        state[2] += 1
        return False


def limit_repeats(handlers: Iterable[logging.Handler]) -> None:
    """Add one :class:`RepeatLimiter` to each handler that has none (idempotent)."""
    for handler in handlers:
        if not any(isinstance(f, RepeatLimiter) for f in handler.filters):
            handler.addFilter(RepeatLimiter())


def logging_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` configuration: the records of ``level`` and up,
    one :data:`LOG_FORMAT` line each on stderr, repeated warnings limited."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"repeats": {"()": RepeatLimiter}},
        "formatters": {"line": {"format": LOG_FORMAT}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                                "formatter": "line", "filters": ["repeats"]}},
        "root": {"level": level.upper(), "handlers": ["stderr"]},
    }
