"""Typed redaction of secrets and personal data before a record leaves the clean stage.

Why typed placeholders (``[REDACTED:email]``): the model and the person reading a
fragment still see *what* stood there without its value, and the counts per kind
go into ``NormalizedRecord.redactions`` for the audit.

Tokens with no key name before them ("new secret Zk3v...") are found by their shape
(:func:`looks_random`): 20+ characters of the base64/base64url alphabet, upper and
lower case mixed, near-random entropy and case changes, not word-like. Hex strings
(hashes, git SHAs, trace ids), UUIDs and paths are ids, not secrets: they stay, like
anything matching a regex of ``RETRO_CLEAN__REDACT_ALLOW``. Hex secrets with no key
name (some vendors' API keys) are therefore NOT caught.

Deliberately NOT redacted: IPv4 addresses, UUIDs, HDFS block ids, timestamps and
other long numbers. They are the evidence a post-mortem needs, so card numbers are
only redacted when they pass Luhn *and* start with a card issuer prefix (Luhn alone
lets one random number in ten through).

Speed matters (thousands of records per second per core): every pattern is
compiled once per process and only runs when a cheap substring check says it could
match at all.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from streams.settings import Settings

RedactionKind = Literal[
    "private_key",
    "jwt",
    "bearer_token",
    "api_key",
    "password",
    "secret",
    "email",
    "card_number",
    "opaque_token",
]

_PREFIX = "[REDACTED:"


def placeholder(kind: RedactionKind) -> str:
    """The text that replaces a value of ``kind``."""
    return f"{_PREFIX}{kind}]"


# PEM private keys, multi-line; an unterminated block (a cut log line) runs to the end.
_PEM = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?)-----(?:.*?-----END \1-----|.*\Z)",
    re.S,
)
# JSON Web Tokens: base64url header that starts with '{"' (eyJ), payload, signature.
_JWT = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
# "Bearer <token>": the scheme as clients write it, or any case before a long token.
_BEARER = re.compile(
    r"\b((?:Bearer|BEARER)[ \t]+|(?i:bearer)[ \t]+(?=[A-Za-z0-9._~+/-]{20}))"
    r"(?!\[REDACTED:)[A-Za-z0-9._~+/-]+=*"
)
# scheme://user:password@host -> keep scheme, user and host.
_URL_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@\[\]\"']*:)"
    r"(?!\[REDACTED:)[^\s/?#@\"']+(?=@)"
)
# Well-known key formats: OpenAI/Anthropic, AWS key ids, GitHub, Slack, Google, GitLab.
_API_KEY = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    r"sk-(?:proj-|svcacct-|admin-|ant-)?[A-Za-z0-9_-]{20,}"
    r"|(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{36,}"
    r"|github_pat_[A-Za-z0-9_]{22,}"
    r"|xox[baprs]-[A-Za-z0-9-]{10,}"
    r"|AIza[A-Za-z0-9_-]{35}"
    r"|glpat-[A-Za-z0-9_-]{20,}"
    r")(?![A-Za-z0-9_-])"
)
_API_KEY_HINT = re.compile(  # one C-level scan instead of a dozen substring checks
    r"sk-|A(?:KIA|SIA|GPA|IDA|ROA|IPA|NPA|NVA|Iza)|gh[pousr]_|github_pat_|xox[baprs]-|glpat-"
)

# key=value, key: value, "key": "value", \"key\":\"value\" for sensitive key names.
_SENSITIVE_WORD = (
    r"(?i:pass(?:word|wd|phrase)?|pwd|secret|token|api[_-]?key|access[_-]?key"
    r"|private[_-]?key|authorization|credentials?)"
)
_KV = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<q>\\?[\"']?)"
    # A plain run before the word, not (word sep)* groups: those backtrack
    # exponentially on "aB1.aB1.…". _kind_for_key then insists on a boundary.
    r"(?P<key>[A-Za-z0-9_.-]*" + _SENSITIVE_WORD + r")"
    r"(?P=q)[ \t]*[:=][ \t]*"
    r"(?:(?P<scheme>(?i:bearer|basic|digest|token|negotiate))[ \t]+)?"
    r"(?:\"(?P<v1>(?:[^\"\\\n]|\\.)*)\""
    r"|\\\"(?P<v2>(?:(?!\\\").)*)\\\""
    r"|'(?P<v3>[^'\n]*)'"
    r"|(?![{\[(<])(?P<v4>[^\s\"',;&}\]]+))"
)
MEMO_CHARS = 128  # texts up to this length are remembered with their redaction
MEMO_TEXTS = 8192  # at most this many; the memo starts again when full
_KV_HINTS = ("pass", "pwd", "secret", "token", "key", "authorization", "credential")
# one C-level scan of the lowered text instead of a generator over the hints
_KV_HINT = re.compile("|".join(_KV_HINTS))
_NOT_A_VALUE = frozenset({"null", "none", "true", "false", "nil", "undefined", ""})
_SCHEMES = frozenset({"bearer", "basic", "digest", "token", "negotiate"})

_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])(?<!://)[A-Za-z0-9._%+-]+@"
    r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![A-Za-z0-9-])"
)
# 13-19 digits, contiguous or grouped as printed on cards (4-4-4-4[-3], 4-6-5, 4-6-4).
_CARD = re.compile(
    r"(?<![\w.-])(?:\d{13,19}"
    r"|\d{4}(?P<s>[ -])\d{4}(?P=s)\d{4}(?P=s)\d{4}(?:(?P=s)\d{3})?"
    r"|\d{4}(?P<t>[ -])\d{6}(?P=t)\d{4,5})"
    r"(?!\w|[.-]\d)"
)
# Every layout above contains this; cheaper than the full pattern, and like it
# skips digits glued to a word (blk_-6952295868487656571), the common case in logs.
# It opens with the digit, the boundary checked behind it, so a search skips to digits.
_CARD_HINT = re.compile(r"\d(?<![\w.-]\d)\d{3}[ -]?\d{4,6}[ -]?\d{4}")

# Mapping keys whose value is replaced whole (normalized: snake_case, lower).
_SENSITIVE_KEY = re.compile(
    r"(?:^|_)(?:password|passwd|pwd|pass|passphrase|secret|token|api_?key|access_?key"
    r"|private_?key|client_?secret|authorization|credentials?)$"
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

# Opaque tokens: 20+ characters of the base64 / base64url alphabets, padding allowed.
_OPAQUE = re.compile(r"(?<![A-Za-z0-9+/_=-])[A-Za-z0-9+/_-]{20,}={0,2}(?![A-Za-z0-9+/_=-])")
_HEX_ID = re.compile(r"[0-9A-Fa-f-]+")  # hashes, git SHAs, UUIDs, trace ids
_NOTHING: dict[str, int] = {}  # the counts of a text with nothing found (shared, read only)
_WORD_RUN = re.compile(r"[a-z]{4,}")
OPAQUE_MIN_LENGTH = 20
CARD_FLOOR = 10**12  # the smallest 13-digit number: any int below in size is no card
# Measured on 4,000 random base64 tokens of 20-64 characters: about 97% are caught
# (the misses start with "/" or happen to read like words); in the 33,011 long
# tokens of the third-party logs used for tests, only JWT parts and three random
# session values matched.
_ENTROPY_SHARE = 0.8  # of the most a token of its length could have (log2 of it, up to 64)
_MIN_CLASS_CHANGES = 0.3  # share of neighbours of different classes (upper/lower/digit/other)
_MAX_WORDY = 0.45  # share of characters in lowercase runs of 4+, as in CamelCaseWords


def _entropy(text: str) -> float:
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def _char_class(ch: str) -> int:
    return 0 if ch.isupper() else 1 if ch.islower() else 2 if ch.isdigit() else 3


@lru_cache(maxsize=8192)  # logs repeat their ids: each is judged once
def looks_random(token: str) -> bool:
    """Whether a base64-alphabet token looks like a generated secret, not an id or a word.

    Ids stay: hex (hashes, git SHAs, UUIDs), single-case text, paths, CamelCase names,
    identifiers such as ``DFSClient_NONMAPREDUCE_1537864556_1``.
    """
    core = token.rstrip("=")
    n = len(core)
    if n < OPAQUE_MIN_LENGTH or _HEX_ID.fullmatch(core) or core.startswith("/") or "//" in core:
        return False
    if core.lower() == core or core.upper() == core:
        return False
    if n < 32 and not any(ch.isdigit() or ch in "+/" for ch in core):
        return False
    if sum(len(r) for r in _WORD_RUN.findall(core)) / n > _MAX_WORDY:
        return False
    if _entropy(core) < _ENTROPY_SHARE * math.log2(min(n, 64)):
        return False
    classes = [_char_class(ch) for ch in core]
    return sum(a != b for a, b in pairwise(classes)) / (n - 1) >= _MIN_CLASS_CHANGES


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum every payment card number satisfies."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _issuer_ok(digits: str) -> bool:
    """Visa 4, Mastercard 51-55/2221-2720, Amex/Diners/JCB 3x, Discover/Maestro/UnionPay 5-6."""
    first = digits[0]
    if first in "456":
        return True
    if first == "3":
        return digits[1] in "0456789"
    if first == "2":
        prefix = int(digits[:4])
        return 2221 <= prefix <= 2720 or 2200 <= prefix <= 2204
    return False


def is_card_number(candidate: str) -> bool:
    """True for 13-19 digits (separators ignored) that look like a real card number."""
    digits = candidate.replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and digits.isdigit() and _issuer_ok(digits) and luhn_ok(digits)


@lru_cache(maxsize=4096)
def _kind_for_key(key: str, scheme: str | None = None) -> RedactionKind | None:
    """The redaction kind for a sensitive key name, None when the key is not sensitive."""
    norm = _CAMEL.sub("_", key).lower().replace("-", "_").replace(".", "_").replace(" ", "_")
    if not _SENSITIVE_KEY.search(norm):
        return None
    if "authorization" in norm:
        low = (scheme or "").lower()
        if low == "bearer":
            return "bearer_token"
        return "password" if low == "basic" else "secret"
    if "pass" in norm or "pwd" in norm:
        return "password"
    if "private" in norm:
        return "private_key"
    if norm.endswith(("api_key", "apikey", "access_key", "accesskey")):
        return "api_key"
    return "secret"


def _is_masked(value: str) -> bool:
    """Values that are already hidden ("****", a placeholder) or empty."""
    return value.lower() in _NOT_A_VALUE or value.startswith(_PREFIX) or set(value) <= {"*", "•"}


class Redactor:
    """Replace secrets and personal data with typed placeholders, counting each kind.

    Safe to share between threads: the compiled patterns are module-level, and the
    only state is a bounded memo of short texts (logs repeat their attribute values,
    hosts and status lines), whose dict operations are atomic.
    """

    __slots__ = ("_allow", "_memo", "_opaque")

    def __init__(self, *, allow: Sequence[str] = (), opaque_tokens: bool = True) -> None:
        """``allow``: regexes of tokens that are ids, not secrets, though they look
        random (a whole token must match); ``opaque_tokens`` False turns the shape
        rule off (named keys, known formats and the rest still apply)."""
        self._allow = re.compile("|".join(f"(?:{a})" for a in allow)) if allow else None
        self._opaque = opaque_tokens
        self._memo: dict[str, tuple[str, dict[str, int]]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> Redactor:
        """The redactor the settings describe (RETRO_CLEAN__REDACT_*)."""
        c = settings.clean
        return cls(allow=c.redact_allow, opaque_tokens=c.redact_opaque_tokens)

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        """Return ``text`` with every finding replaced, and the number of findings per kind."""
        if not text:
            return text, {}
        if len(text) > MEMO_CHARS:
            return self._redact(text)
        hit = self._remembered(text)
        return hit[0], dict(hit[1])  # the caller may add to its counts

    def _remembered(self, text: str) -> tuple[str, dict[str, int]]:
        """The memo's entry for a short non-empty text; its counts are shared, read only."""
        hit = self._memo.get(text)
        if hit is None:
            if _HEX_ID.fullmatch(text) and _CARD_HINT.match(text) is None:
                # a hex id (trace and span ids, hashes, UUIDs), new on almost every record:
                # no rule finds anything in one but a card number at its start (every
                # later digit follows a word character or "-", where a card cannot begin)
                return text, _NOTHING
            if len(self._memo) >= MEMO_TEXTS:
                self._memo.clear()
            hit = self._memo[text] = self._redact(text)
        return hit

    def _redact(self, text: str) -> tuple[str, dict[str, int]]:
        counts: dict[str, int] = {}
        if "-----BEGIN" in text:
            text = _sub(_PEM, text, counts, "private_key")
        if "eyJ" in text:
            text = _sub(_JWT, text, counts, "jwt")
        lower = text.lower()
        if "bearer" in lower:
            text = _sub(_BEARER, text, counts, "bearer_token", keep_group=True)
        if "://" in text:
            text = _sub(_URL_PASSWORD, text, counts, "password", keep_group=True)
        if _API_KEY_HINT.search(text):
            text = _sub(_API_KEY, text, counts, "api_key")
        if _KV_HINT.search(lower):
            text = _KV.sub(lambda m: _replace_kv(m, counts), text)
        if "@" in text:
            text = _sub(_EMAIL, text, counts, "email")
        if _CARD_HINT.search(text):
            text = _CARD.sub(lambda m: _replace_card(m, counts), text)
        if self._opaque:  # one scan finds and replaces: a search first scanned twice
            text = self._redact_opaque(text, counts)
        return text, counts

    def _redact_opaque(self, text: str, counts: dict[str, int]) -> str:
        """Replace the random-looking tokens; the text is rebuilt only when one is found."""
        parts: list[str] = []
        done = 0
        for m in _OPAQUE.finditer(text):
            token = m.group(0)
            if not looks_random(token) or (
                    self._allow is not None and self._allow.fullmatch(token)):
                continue
            parts += (text[done:m.start()], placeholder("opaque_token"))
            done = m.end()
        if not parts:
            return text
        counts["opaque_token"] = counts.get("opaque_token", 0) + len(parts) // 2
        return "".join(parts) + text[done:]

    def redact_mapping(self, attrs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
        """Redact a (nested) mapping: values under sensitive keys are replaced whole.

        Returns a new mapping; the input is not modified.
        """
        counts: dict[str, int] = {}
        return self._redact_dict(attrs, counts), counts

    def _redact_dict(self, attrs: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        memo = self._memo
        for key, value in attrs.items():
            kind = _kind_for_key(key) if isinstance(key, str) else None
            if kind is None:  # the common values inline, as _redact_value takes them
                cls = type(value)
                if cls is int and -CARD_FLOOR < value < CARD_FLOOR:
                    out[key] = value
                    continue
                if cls is str and value and len(value) <= MEMO_CHARS:
                    hit = memo.get(value)
                    if hit is None:
                        hit = self._remembered(value)
                    if hit[1]:  # seldom: most values hold nothing to count
                        for found, n in hit[1].items():
                            counts[found] = counts.get(found, 0) + n
                    out[key] = hit[0]
                    continue
                out[key] = self._redact_value(value, counts)
            elif _has_secret(value):
                if kind == "secret" and isinstance(value, str):
                    kind = _kind_for_key(key, value.split(" ", 1)[0])  # "Bearer ...", "Basic ..."
                out[key] = placeholder(kind or "secret")
                counts[kind or "secret"] = counts.get(kind or "secret", 0) + 1
            else:
                out[key] = self._redact_value(value, counts)
        return out

    def _redact_value(self, value: Any, counts: dict[str, int]) -> Any:
        cls = type(value)
        if cls is str:  # JSON's own types first, by exact type: no isinstance chain
            if not value:
                return value
            text, found = (self._remembered(value) if len(value) <= MEMO_CHARS
                           else self._redact(value))
            if found:
                for kind, n in found.items():
                    counts[kind] = counts.get(kind, 0) + n
            return text
        if cls is int:
            if -CARD_FLOOR < value < CARD_FLOOR:  # fewer than 13 digits: never a card
                return value
        elif cls is dict:
            return self._redact_dict(value, counts)
        elif cls is float or cls is bool or value is None:
            return value
        if isinstance(value, str):
            text, found = self.redact(value)
            for kind, n in found.items():
                counts[kind] = counts.get(kind, 0) + n
            return text
        if isinstance(value, dict):
            return self._redact_dict(value, counts)
        if isinstance(value, list | tuple):
            redact = self._redact_value
            return [redact(v, counts) for v in value]
        if isinstance(value, int) and not isinstance(value, bool) and is_card_number(str(value)):
            counts["card_number"] = counts.get("card_number", 0) + 1
            return placeholder("card_number")
        return value


def _has_secret(value: Any) -> bool:
    """A sensitive key with nothing in it (None, '', '****') has nothing to hide."""
    if value is None or isinstance(value, bool):
        return False
    if isinstance(value, str):
        return not _is_masked(value.strip())
    if isinstance(value, dict | list | tuple):
        return len(value) > 0
    return True


def _sub(
    pattern: re.Pattern[str],
    text: str,
    counts: dict[str, int],
    kind: RedactionKind,
    *,
    keep_group: bool = False,
) -> str:
    """Replace every match by the placeholder (after group 1 when ``keep_group``)."""
    repl = (r"\g<1>" if keep_group else "") + placeholder(kind)
    new, n = pattern.subn(repl, text)
    if n:
        counts[kind] = counts.get(kind, 0) + n
    return new


def _replace_kv(m: re.Match[str], counts: dict[str, int]) -> str:
    name = next(g for g in ("v1", "v2", "v3", "v4") if m.group(g) is not None)
    value = m.group(name)
    if _is_masked(value) or (name == "v4" and value.lower() in _SCHEMES):
        return m.group(0)  # nothing to hide, or a type label ("Token: Token { kind: ... }")
    kind = _kind_for_key(m.group("key"), m.group("scheme"))
    if kind is None:  # the text pattern is broader than the key rule: keep the value
        return m.group(0)
    counts[kind] = counts.get(kind, 0) + 1
    start, end = m.start(name) - m.start(0), m.end(name) - m.start(0)
    whole = m.group(0)
    return whole[:start] + placeholder(kind) + whole[end:]


def _replace_card(m: re.Match[str], counts: dict[str, int]) -> str:
    if not is_card_number(m.group(0)):
        return m.group(0)
    counts["card_number"] = counts.get("card_number", 0) + 1
    return placeholder("card_number")
