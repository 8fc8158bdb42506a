"""When one log template covers another: the relation that names an event's lines.

A template covers another of the same token count when at each token they are equal,
or it has ``<*>`` there, or it has a mask (``<IP>``, ``<NUM>``, ...) where the other
has a literal. A mask does not cover ``<*>`` or another mask: ``<*>`` is the wider
of the two, and this keeps covering a partial order, so "the most general" has one
answer. The batch stage uses it to name a group whose records carry texts from
before and after their cluster generalised; the report stage to fold one event's
texts from several workers into one (``streams.report.state.evidence``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

WILDCARD = "<*>"
_MASK = re.compile(r"<[A-Z]+>")
# sets of templates whose canonical mapping is remembered: a report folds an incident's
# evidence after every fragment, and an incident's templates are mostly the same set
# (9 calls in 10 on a TrainTicket day), so most folds look their answer up
CACHED_SETS = 1024


def _covers_token(general: str, specific: str) -> bool:
    if general in (specific, WILDCARD):
        return True
    # a mask stands for a value of its kind: a literal, never a wider placeholder
    return (_MASK.fullmatch(general) is not None and specific != WILDCARD
            and _MASK.fullmatch(specific) is None)


def covers(general: str, specific: str) -> bool:
    """True when every line ``specific`` matches, ``general`` matches too (token by token)."""
    wide, narrow = general.split(), specific.split()
    return len(wide) == len(narrow) and all(map(_covers_token, wide, narrow))


def _rank(template: str) -> tuple[int, int, str]:
    """Most general first: a strict cover always has more wildcard weight than what it
    covers, so this order lists every template after all that cover it."""
    weight = 0
    for token in template.split():
        if token == WILDCARD:
            weight += 2
        elif _MASK.fullmatch(token):
            weight += 1
    return (-weight, len(template), template)


def canonical_templates(templates: Iterable[str]) -> dict[str, str]:
    """Each template's canonical one: itself, or the most general template covering it
    that no other template covers. A function of the set, not of the order."""
    return dict(_canonical(frozenset(templates)))


@functools.lru_cache(maxsize=CACHED_SETS)
def _canonical(templates: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """``canonical_templates`` of a set, as (template, root) pairs in ``_rank`` order;
    a pure function of the set, so it is remembered. Each text is split once."""
    roots: list[tuple[str, list[str]]] = []
    out: list[tuple[str, str]] = []
    for template in sorted(templates, key=_rank):
        narrow = template.split()
        root = next((r for r, wide in roots if len(wide) == len(narrow)
                     and all(map(_covers_token, wide, narrow))), None)
        if root is None:
            roots.append((template, narrow))
            root = template
        out.append((template, root))
    return tuple(out)


def most_general(templates: Iterable[str]) -> str | None:
    """The template that covers all the others, or None when none does."""
    roots = set(canonical_templates(templates).values())
    return roots.pop() if len(roots) == 1 else None
