"""The lane a record takes: a cheap cost score at cleaning time, slow at or above a threshold.

The expensive few records (long, bracket-heavy, full of punctuation) go to a slow
lane so they stop holding up the batches of cheap ones. The score is this formula::

    def estimate_cost(record):
        length_score = len(record) / 1000
        depth_score = record.count('{') + record.count('[')
        special_score = len(re.findall(r'[^\\w\\s]', record)) / 100
        return length_score + depth_score * 0.5 + special_score * 0.3

    FAST_THRESHOLD = 5.0
    fast = cost <  FAST_THRESHOLD;  slow = cost >= FAST_THRESHOLD

Followed exactly, including two details a paraphrase loses:

* "special characters" are those matched by ``[^\\w\\s]`` in Python's Unicode
  ``re``: not a word character and not whitespace. The underscore is a word
  character, so ``_`` is NOT special; letters and digits of any script are not
  special either.
* ``depth_score`` counts opening brackets, it does not measure nesting depth, and
  ``len`` counts characters (code points), not bytes.
"""

from __future__ import annotations

import re
from typing import Literal

from streams.records import Lane

DEFAULT_SLOW_THRESHOLD = 5.0  # FAST_THRESHOLD of the formula above

_SPECIAL = re.compile(r"[^\w\s]")
# the ASCII word and whitespace characters, deleted by bytes.translate to count the rest
_ASCII_WORD_OR_SPACE = bytes(c for c in range(128) if re.match(r"[\w\s]", chr(c)))


def special_chars(text: str) -> int:
    """Characters that are neither word characters (letters, digits, ``_``) nor whitespace.

    ASCII text (most log lines) is counted by deleting the others byte-wise, ten times
    the regex's speed; other text by the regex, whose ``\\w`` knows every script."""
    if text.isascii():
        return len(text.encode().translate(None, _ASCII_WORD_OR_SPACE))
    return len(_SPECIAL.findall(text))


def cost_score(text: str) -> float:
    """``len/1000 + (count('{') + count('['))*0.5 + special_chars/100*0.3``."""
    length_score = len(text) / 1000
    depth_score = text.count("{") + text.count("[")
    special_score = special_chars(text) / 100
    return length_score + depth_score * 0.5 + special_score * 0.3


def choose_lane(score: float, threshold: float = DEFAULT_SLOW_THRESHOLD) -> Literal["fast", "slow"]:
    """``slow`` when the score reaches the threshold (``>=``), as the formula's lane rule."""
    lane: Lane = "slow" if score >= threshold else "fast"
    return lane
