"""Retry timing and a global retry budget.

Backoff alone does not stop a retry storm: when a provider fails every request,
each caller still retries ``max_attempts`` times and the failing provider sees a
multiple of the normal load. The budget caps retries to a share of fresh traffic,
shared by every batch, so a fault degrades to reviews instead of amplifying.
"""

from __future__ import annotations

import random


def backoff_delay(
    attempt: int, *, base: float = 1.0, cap: float = 30.0, rng: random.Random
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based).

    The nominal delay doubles per attempt (1, 2, 4 s with ``base=1``) up to ``cap``;
    "equal jitter" then draws uniformly from ``[nominal / 2, nominal]`` so callers
    that failed together do not retry together, yet each still waits a while.
    """
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    if base < 0 or cap < 0:
        raise ValueError(f"base and cap must not be negative, got base={base}, cap={cap}")
    nominal = min(cap, base * 2.0 ** (attempt - 1))
    half = nominal / 2.0
    return half + rng.uniform(0.0, half)


class RetryBudget:
    """Retries earned by fresh requests: ``ratio`` of a retry per request.

    The balance starts at ``minimum`` (so a quiet service can still retry a few
    times) and never holds more than ``capacity`` (default: ``minimum``), so a long
    healthy stretch does not bank thousands of retries for the next outage.
    """

    __slots__ = ("_balance", "capacity", "minimum", "ratio")

    ratio: float  #: Retry tokens earned per fresh request.
    minimum: int  #: Retries available from the start.
    capacity: float  #: The most retry tokens the budget holds.

    def __init__(
        self, *, ratio: float = 0.2, minimum: int = 10, capacity: float | None = None
    ) -> None:
        if ratio < 0:
            raise ValueError(f"retry budget ratio must not be negative, got {ratio}")
        if minimum < 0:
            raise ValueError(f"retry budget minimum must not be negative, got {minimum}")
        capacity = float(minimum) if capacity is None else capacity
        if capacity < minimum:
            raise ValueError(f"retry budget capacity {capacity} is below minimum {minimum}")
        self.ratio = ratio
        self.minimum = minimum
        self.capacity = max(capacity, 1.0)
        self._balance = float(minimum)

    @property
    def balance(self) -> float:
        """Retry tokens left (a retry needs a whole one)."""
        return self._balance

    def __repr__(self) -> str:
        return f"RetryBudget(balance={self._balance:.2f}, ratio={self.ratio})"

    def on_request(self) -> None:
        """A fresh (non-retry) request was made: earn ``ratio`` of a retry."""
        self._balance = min(self.capacity, self._balance + self.ratio)

    def try_spend(self) -> bool:
        """Take one retry if the budget has it; ``False`` means do not retry."""
        if self._balance >= 1.0:
            self._balance -= 1.0
            return True
        return False
