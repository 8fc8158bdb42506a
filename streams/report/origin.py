"""Which service failed first, and which only suffered from it (pure: no I/O, no clock).

When a service fails, its callers log the failure too, often more loudly than the
service itself: "no instances available for X", "connection refused to X", "X
returned 503". Those records are **impact**; X is the **suspected origin**. The rule:

1. every failure names the services it calls, from its title's subjects and from its
   texts (the phrasings below: service discovery, refused or timed-out connections,
   5xx answers, failed calls);
2. a named service is matched to a service that logged, by the words of their names
   (``ts-basic-service`` and ``f.m.s.BasicServiceImpl`` share ``basic``; words such
   as ``service``, ``impl`` or ``controller`` and one-letter package parts say
   nothing);
3. the origin is a named service that has failures of its own, else the one named
   by the most failing records of *other* services; with none named, the service of
   the earliest error;
4. its first anomaly time is its own earliest failure, or, when it logged none (it
   crashed silently), the first caller record that named it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# generic parts of service names: they appear in every name, so they match anything
GENERIC_NAME_WORDS = frozenset({
    "service", "services", "svc", "impl", "controller", "server", "api", "app", "application",
    "backend", "frontend", "client", "worker", "handler", "manager", "deployment", "pod",
    "default", "prod", "production", "staging", "main", "the", "internal", "http", "https",
    "com", "org", "net", "io", "log", "json", "docker", "stdout", "stderr",
})
_NAME_WORD = re.compile(r"[A-Za-z]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NAMED = re.compile(
    r"(?:no (?:available )?(?:instances?|endpoints?|servers?|hosts?|replicas?|upstreams?)"
    r"(?: available)?(?: for| of| in)?(?: service)?"
    r"|(?:connection|connect) (?:refused|reset|timed out|failed|error)"
    r"(?: (?:to|for|from|when connecting to|while connecting to))?"
    r"|(?:could not|cannot|can't|unable to|failed to) (?:connect|reach|resolve|call)(?: to)?"
    r"|(?:timed out|timeout)(?: after \d+ ?[a-z]*)? (?:calling|connecting to|waiting for|from)"
    r"|(?:call|request|rpc) (?:to|for) \S+ failed|(?:error|exception) (?:calling|from)"
    r"|upstream|downstream)"
    r"\s*[:=]?\s*['\"\[(<]?(?:https?://)?(?P<name>[A-Za-z][\w.-]{2,62})",
    re.IGNORECASE,
)
_CALL_FAILED = re.compile(  # "request to X timed out", "calls to X failed"
    r"\b(?:requests?|calls?|rpcs?|connections?) (?:to|for) (?:https?://)?"
    r"(?P<name>[A-Za-z][\w.-]{2,62})\S* (?:timed out|failed|was refused|refused|reset)",
    re.IGNORECASE,
)
_FAILED_CALL = re.compile(  # "X returned 503", "503 from X", "X: 502 Bad Gateway"
    r"(?:(?:https?://)?(?P<a>[A-Za-z][\w-]{2,62})(?:[.:/][\w./:-]*)?\s+(?:returned|responded"
    r"(?: with)?|answered|gave)\s+(?:http\s*|status\s*)?5\d\d\b)"
    r"|(?:\b5\d\d\b\s+(?:from|by)\s+(?:https?://)?(?P<b>[A-Za-z][\w-]{2,62}))",
    re.IGNORECASE,
)


class CauseLike(Protocol):
    """The parts of a post-mortem cause this module reads."""

    title: str
    services: list[str]
    subjects: list[str]
    count: int
    first_seen: str | None
    severity: str


@dataclass(frozen=True, slots=True)
class Origin:
    """The suspected origin of an episode and the callers that suffered from it."""

    service: str
    first_seen: str | None
    callers: tuple[str, ...] = ()  # services whose failures named it
    reason: str = ""
    logged: bool = True  # the origin has failures of its own in the logs


@dataclass(slots=True)
class _Named:
    records: int = 0
    callers: set[str] = field(default_factory=set)
    first_seen: str | None = None


def name_words(name: str) -> frozenset[str]:
    """The words of a service name that tell it apart: ``f.m.s.BasicServiceImpl`` ->
    {basic}; ``ts-basic-service-5dc8d4`` -> {basic}."""
    spaced = _CAMEL.sub(" ", name)
    words = {w.lower() for w in _NAME_WORD.findall(spaced)}
    return frozenset(w for w in words if len(w) > 2 and w not in GENERIC_NAME_WORDS)


def same_service(a: str, b: str) -> bool:
    """Two names of one service: their telling words overlap."""
    return bool(name_words(a) & name_words(b))


def named_services(texts: Iterable[str]) -> list[str]:
    """Services a failure names as the one it called, in order of appearance."""
    out: list[str] = []
    for text in texts:
        for m in _NAMED.finditer(text):
            out.append(m["name"].rstrip(".-"))
        for m in _CALL_FAILED.finditer(text):
            out.append(m["name"].rstrip(".-"))
        for m in _FAILED_CALL.finditer(text):
            out.append((m["a"] or m["b"]).rstrip(".-"))
    return [n for n in dict.fromkeys(out) if name_words(n)]


def find_origin(causes: Sequence[CauseLike], texts: dict[int, list[str]],
                is_failure: dict[int, bool]) -> Origin | None:
    """The suspected origin among ``causes`` (indexes into ``texts``: each cause's title,
    subjects, templates and examples; ``is_failure``: an error, not a warning)."""
    failing = [i for i, _ in enumerate(causes) if is_failure.get(i)]
    if not failing:
        return None
    named: dict[str, _Named] = {}
    for i in failing:
        cause = causes[i]
        for name in dict.fromkeys([*cause.subjects, *named_services(texts.get(i, []))]):
            if any(same_service(name, s) for s in cause.services):
                continue  # a service naming itself is no caller
            entry = named.setdefault(name, _Named())
            entry.records += cause.count
            entry.callers.update(cause.services)
            if cause.first_seen and (entry.first_seen is None
                                     or cause.first_seen < entry.first_seen):
                entry.first_seen = cause.first_seen
    if named:
        merged = _merge_names(named)

        def own_of(name: str) -> list[CauseLike]:
            return [causes[i] for i in failing
                    if any(same_service(name, s) for s in causes[i].services)]

        # a named service that failed itself is the strongest lead; then the most
        # complaints, then the earliest
        name, entry = min(merged.items(), key=lambda kv: (
            not own_of(kv[0]), -kv[1].records, kv[1].first_seen or "~", kv[0]))
        own = own_of(name)
        callers = tuple(sorted(entry.callers))
        if own:
            service = _most_records(own, name)
            first = min((c.first_seen for c in own if c.first_seen), default=entry.first_seen)
            return Origin(service, first, callers,
                          f"named by failures in {len(callers)} calling service(s)", True)
        return Origin(name, entry.first_seen, callers,
                      f"named by failures in {len(callers)} calling service(s); it logged "
                      "no failure of its own", False)
    earliest = min((causes[i] for i in failing),
                   key=lambda c: (c.first_seen is None, c.first_seen or "", -c.count))
    service = _most_records([earliest], None)
    return Origin(service, earliest.first_seen, (), "the earliest error", True)


def _merge_names(named: dict[str, _Named]) -> dict[str, _Named]:
    """Spellings of one service (``ts-basic-service``, ``basic``) counted together."""
    merged: dict[str, _Named] = {}
    for name in sorted(named, key=lambda n: (-named[n].records, n)):
        home = next((m for m in merged if same_service(m, name)), None)
        entry = named[name]
        if home is None:
            merged[name] = _Named(entry.records, set(entry.callers), entry.first_seen)
            continue
        held = merged[home]
        held.records += entry.records
        held.callers |= entry.callers
        if entry.first_seen and (held.first_seen is None or entry.first_seen < held.first_seen):
            held.first_seen = entry.first_seen
    return merged


def _most_records(causes: Sequence[CauseLike], like: str | None) -> str:
    """The service of ``causes`` with the most records (matching ``like`` if given)."""
    records = Counter[str]()
    for c in causes:
        for s in c.services:
            if like is None or same_service(like, s):
                records[s] += c.count
    return min(records, key=lambda s: (-records[s], s))
