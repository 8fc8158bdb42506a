"""Whether a line asserts what a keyword names: negation, outcomes and whole words.

A keyword is half of a meaning. "No configuration change required" names a change
that did not happen; "reconnect succeeded after Connection refused" ends well;
``connectTimeoutMs`` and ``auth.failure.count`` are settings, not events. The rule
analyzer and the report's change detection ask :func:`affirmed` for a match the line
really asserts, read in one of three senses:

* ``failure``: cancelled by a negation in front ("no errors", "has not failed"), a
  zero or false value ("errors=0", "error: none") or a good outcome anywhere in the
  line ("succeeded", "recovered", "closed by user", "logged out").
* ``change``: cancelled by a negation in front, a false value ("restart: false") or a
  verdict after it ("restart required", "deploy skipped"): something wanted or
  refused has not happened.
* ``state``: a plain report of a state (a link came up); only a negation cancels it.

Pure functions over one line; English only, like the rule table.
"""

from __future__ import annotations

import re
from typing import Literal

Sense = Literal["failure", "change", "state"]

# a clause ends at punctuation or a dash between spaces; a negation does not cross it
_CLAUSE_END = re.compile(r"[.;:!?,()\[\]{}|\n]|\s-+\s")
_NEGATORS = frozenset({"no", "not", "never", "without", "nor", "nothing", "neither"})
NEGATION_REACH = 3  # words before a match a negator may stand: "has not yet been restarted"
# "0 errors", "3 passed, 0 failed"; not "job 0 failed", where 0 names the job
_ZERO_BEFORE = re.compile(r"(?P<lead>^|[,;:(\[]\s*|\s)(?:0+|zero)\s+$", re.IGNORECASE)
# a keyword that is a key holding a no: "errors=0", "restart: false", "success=false";
# the value ends its field ("error: no such file" is an error)
_NO_VALUE = re.compile(
    r"\w*\s*[=:]\s*[\"']?(?:0+|false|no|none|null)[\"']?(?=\s*(?:[,;)\]}]|$)|\s+\w+[=:])",
    re.IGNORECASE,
)

# an outcome that ends a failure well; an outcome negated ("not recovered") does not count
_GOOD_OUTCOME = re.compile(
    r"\b(?:succeeded|successful(?:ly)?|success(?!\s*(?:rate|ratio|count|%))"
    r"|recovered|restored|re-?established|reconnected|back to normal"
    # "issue resolved", not "resolved host db to 10.0.0.5": that is name resolution
    r"|(?:is|are|was|were|been|now|got|self-?|auto(?:matically)?-?)\s?resolved"
    r"|resolved(?=\s*(?:[.,;)\]]|$))"
    r"|(?:is|are) (?:back )?up|(?:is|are) (?:back )?online"
    r"|completed (?:successfully|normally|without errors?)"
    # a session its user ended is routine, however the line words the close
    r"|(?:closed|disconnected|ended|terminated) (?:by|on|at) (?:the )?user(?:'s)?(?: request)?"
    r"|due to user request|closed (?:normally|cleanly|gracefully)"
    r"|log(?:ged|ging)?[ -]?(?:out|off)|sign(?:ed|ing)?[ -]?(?:out|off))\b",
    re.IGNORECASE,
)
# "2 of 3 replicas failed; 1 succeeded": a counted failure is not undone by the rest
_COUNTED = re.compile(r"\b[1-9]\d*(?:\s+of\s+\d+)?(?:\s+[a-z]+)?\s+$", re.IGNORECASE)
# "status: SUCCESS" is one field of a record (an ack, a sub-request), not how the line ends
_FIELD_KEY = re.compile(r"\b[A-Za-z_][\w.-]*[=:]\s*[\"']?$")
# what a change line says after the change when it did not happen (or not yet)
_VERDICT = re.compile(
    r"\w*(?:\s+[\w.-]+){0,3}?\s*(?:(?:is|was|were|are|be|been|has been|have been)\s+)?"
    r"(?:not\b|never\b|required\b|needed\b|necessary\b|recommended\b|skipped\b|unnecessary\b)",
    re.IGNORECASE,
)
_IDENT = re.compile(r"[A-Za-z0-9_]")
_IDENT_TAIL = re.compile(r"[A-Za-z0-9_$]*")
_THROWN = re.compile(r"(?:Exception|Error|Throwable)$")
_KEY_VALUE = re.compile(r"[=:]\s*\w")
_CODE_TAIL = re.compile(r"[A-Z0-9_]+\b")
_IDENT_HEAD = re.compile(r"[\w$.]*$")
# a command-line option is a setting: -XX:+HeapDumpOnOutOfMemoryError, --reconnect
_OPTION = re.compile(r"(?:^|[\s\"'=])--?(?:XX:[+-]?)?$")
_ID_TAIL = re.compile(r"_-?\d")


def affirmed(pattern: re.Pattern[str], text: str, sense: Sense) -> re.Match[str] | None:
    """The first match of ``pattern`` in ``text`` that the line asserts in ``sense``."""
    ended_well: bool | None = None  # computed once, and only when a match needs it
    for match in pattern.finditer(text):
        start, end = match.span()
        if start == end or inside_identifier(text, start, end) or negated(text, start, end):
            continue
        if sense == "change" and _VERDICT.match(text, end):
            continue
        if sense == "failure" and not _COUNTED.search(text, 0, start):
            if ended_well is None:
                ended_well = good_outcome(text)
            if ended_well:
                return None
        return match
    return None


def negated(text: str, start: int, end: int | None = None) -> bool:
    """A negator a few words before ``start`` in its clause; with ``end``, also a zero
    count of the match or a no it holds as a key ("restart: false").

    The reach stops at a verb of its own ("not received timed out" negates the
    receiving, not the timeout); a zero counts a plural ("0 errors") or heads a clause
    ("3 passed, 0 failed"), never names a thing ("job 0 failed").
    """
    if end is not None:
        zero = _ZERO_BEFORE.search(text, 0, start)
        if zero and (zero.group("lead").strip() or zero.start() == 0
                     or text[start:end].lower().endswith("s")):
            return True
        if _NO_VALUE.match(text, end):
            return True
    clause = _CLAUSE_END.split(text[:start])[-1]
    for word in reversed(clause.lower().split()[-NEGATION_REACH:]):
        if word in _NEGATORS or word.endswith("n't"):
            return True
        if word.endswith("ed"):
            return False
    return False


def good_outcome(text: str) -> bool:
    """The line reports a good end: success, recovery, or a close its user asked for."""
    for match in _GOOD_OUTCOME.finditer(text):
        start, end = match.span()
        field = " " not in match.group(0) and _FIELD_KEY.search(text, 0, start)
        if field or _NO_VALUE.match(text, end) or negated(text, start) \
                or inside_identifier(text, start, end):
            continue
        return True
    return False


def inside_identifier(text: str, start: int, end: int) -> bool:
    """``text[start:end]`` is part of a longer identifier, so the line names no event.

    camelCase, snake_case and dotted names are one token: ``connectTimeoutMs``,
    ``EventServiceDisconnectedCallback``, ``reconnect_delay`` and ``auth.failure.count``
    hold a keyword but report nothing. What stays an event: an exception or error class
    (``java.net.SocketTimeoutException``: the class is what was thrown, its package
    only qualifies it), an upper-case code that goes on (``NOT_LEADER_FOR_PARTITION``),
    an inflection (``purg`` -> ``purged``) and a key read for its value (``status=503``).
    """
    token = text[start:end]
    plain = token[1:] == token[1:].lower()  # one word as written in prose, not CamelCase
    if token[0].isalnum() and start > 0 and not _KEY_VALUE.search(token):
        before = text[start - 1]
        if _IDENT.match(before):
            return plain or in_option(text, start) or not _thrown(token, text, end)
        qualified = before in ".$" and start > 1 and _IDENT.match(text[start - 2])
        if qualified and plain and not _thrown(token, text, end):
            return True  # "auth.failure.count"; "Import.Error:1331" names an error type
    if not token[-1].isalnum() or end >= len(text):
        return False
    after = text[end]
    if after.islower() and token[-1].islower():
        return False  # an inflection of the same word: "deploy" -> "deployment"
    if after == "." and end + 1 < len(text) and text[end + 1].isalpha():
        return True  # "failure.count"; "core.2275" is a file name, its number no name
    if after == "=" or (after == " " and text.startswith(" = ", end)):
        return not plain and not _thrown(token, text, end)  # a setting's key: socketTimeout=
    if not _IDENT.match(after):
        return False
    if token.isupper() and _CODE_TAIL.match(text, end):
        return False  # an error code goes on: NOT_LEADER_FOR_PARTITION
    if _ID_TAIL.match(text, end):
        return False  # an id names the thing the keyword is about: blk_-3544, job_2015
    return not _thrown(token, text, end)


def in_option(text: str, start: int) -> bool:
    """The identifier around ``start`` is a command-line option (``-XX:+Name``, ``--name``):
    a setting the process was started with, whatever it is named after."""
    head = _IDENT_HEAD.search(text, 0, start)
    return head is not None and bool(_OPTION.search(text, 0, head.start()))


def _thrown(token: str, text: str, end: int) -> bool:
    """The identifier that ``token`` starts and ``text[end:]`` goes on names a throwable."""
    tail = _IDENT_TAIL.match(text, end)
    return bool(_THROWN.search(token + (tail.group(0) if tail else "")))
