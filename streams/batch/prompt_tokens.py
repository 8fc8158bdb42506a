"""What a batch's records cost in prompt tokens.

Kept out of ``streams.batch.window`` so the estimate (what the model will actually see:
JSON-escaped text plus a fixed allowance per group) reads apart from the window
that spends it.
"""

from __future__ import annotations

import json
import re
from typing import Protocol

from streams.records import AnyRecord
from streams.tokens import PieceCounter

GROUP_OVERHEAD_TOKENS = 96  # keys, ref, level, count, two timestamps, punctuation of a group
EXAMPLE_SEPARATOR_TOKENS = 1  # ", " between examples
MIN_CUT_TOKENS = 16  # the least of a template or example an oversize record keeps
_MARKER = " …[cut: {n} tokens]"
MARKER_RESERVE = 12  # tokens the marker itself may take


class TokenCounterLike(Protocol):
    """What batching needs of ``streams.tokens.TokenCounter``."""

    def count(self, text: str) -> int: ...

    def truncate(self, text: str, max_tokens: int) -> tuple[str, int | bool]: ...


# what json.dumps(..., ensure_ascii=False) escapes: a quote, a backslash, C0 controls
_JSON_ESCAPED = re.compile(r'[\x00-\x1f"\\]')


def json_tokens(counter: TokenCounterLike, text: str) -> int:
    """Tokens of ``text`` as it appears in the payload: JSON-escaped and quoted."""
    if _JSON_ESCAPED.search(text) is None:  # most log text: json.dumps only quotes it
        return counter.count(f'"{text}"')
    return counter.count(json.dumps(text, ensure_ascii=False))


def message_tokens(counter: TokenCounterLike, record: AnyRecord,
                   pieces: PieceCounter | None = None) -> int:
    """``json_tokens`` of a record's message, reusing the count the clean stage made.

    A message JSON leaves as it is, only quoted, costs at most its own tokens plus the
    two quotes, so the clean stage's count bounds it without encoding the text again.
    A counter that cannot take a count made elsewhere (``of_counted``), or a message
    with characters to escape, is counted: by ``pieces`` when given (the same count).
    """
    of_counted = getattr(counter, "of_counted", None)
    if of_counted is None:
        return json_tokens(counter, record.message)
    if _JSON_ESCAPED.search(record.message) is not None:
        if pieces is None:
            return json_tokens(counter, record.message)
        return int(of_counted(pieces.count(json.dumps(record.message, ensure_ascii=False))))
    return int(of_counted(record.tokens + 2))


# escaped by json.dumps as a backslash and one character; other control characters
# take six (\u00XX) and get no bound
_SHORT_ESCAPES = frozenset('"\\\n\r\t\b\f')


def message_tokens_bound(counter: TokenCounterLike, record: AnyRecord) -> int | None:
    """An upper bound of ``message_tokens`` found without encoding, or None when no bound
    is known; for a message with nothing to escape, ``message_tokens`` itself.

    Escaping puts a backslash before a quote or backslash, or spells a newline, tab,
    carriage return, backspace or form feed as a backslash and a letter: the
    pre-tokenizer cuts the text around that character into at most one more piece, and
    the backslash is at most one more token, so each such escape costs at most two
    tokens over the clean stage's count of the unescaped message (plus the two quotes).
    Checked against the encoder on every line of the loghub 2k samples, the Kafka broker
    and train-ticket logs and the generated sample (and 400k of those lines with escapes
    inserted at random): the bound was never under the count, and an escape took two
    tokens at most. The calibration scales both alike (``adjust`` only grows with its
    argument).
    """
    of_counted = getattr(counter, "of_counted", None)
    if of_counted is None:
        return None
    escaped = _JSON_ESCAPED.findall(record.message)
    if escaped and not _SHORT_ESCAPES.issuperset(escaped):
        return None
    return int(of_counted(record.tokens + 2 + 2 * len(escaped)))


def group_cost(counter: TokenCounterLike, service: str, template: str, example_costs: int) -> int:
    """Prompt tokens of one group entry: its fixed allowance, names and examples."""
    return group_cost_of(counter, service, json_tokens(counter, template), example_costs)


def group_cost_of(counter: TokenCounterLike, service: str, template_tokens: int,
                  example_costs: int) -> int:
    """``group_cost`` with the template's ``json_tokens`` known already."""
    return GROUP_OVERHEAD_TOKENS + json_tokens(counter, service) + template_tokens + example_costs


def cut_to_cap(counter: TokenCounterLike, text: str, cap: int) -> tuple[str, bool]:
    """Cut ``text`` so its payload cost stays within ``cap``, and say how much went."""
    kept, cut, _tokens = cut_to_cap_tokens(counter, text, cap)
    return kept, cut


def cut_to_cap_tokens(counter: TokenCounterLike, text: str, cap: int) -> tuple[str, bool, int]:
    """``cut_to_cap`` and the ``json_tokens`` of the text it gives, which it knows: a
    batch costs its templates and examples without counting them again."""
    tokens = json_tokens(counter, text)
    if tokens <= cap:
        return text, False, tokens
    total = counter.count(text)
    target = max(1, cap - MARKER_RESERVE)
    for _ in range(4):  # JSON escaping can cost more than the raw text; shrink until it fits
        kept, _flag = counter.truncate(text, target)
        cut_tokens = max(1, total - counter.count(kept))
        marked = kept + _MARKER.format(n=cut_tokens)
        tokens = json_tokens(counter, marked)
        over = tokens - cap
        if over <= 0 or target == 1:
            return marked, True, tokens
        target = max(1, target - over)
    return marked, True, tokens
