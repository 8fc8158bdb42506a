"""The offline ``rules`` analyzer: the embedded default "model".

It answers a prompt payload (see ``streams.batch.prompt``) without any network model, so
the pipeline produces useful post-mortem fragments offline, and the simulated
provider answers with real analysis. Groups are keyed by (service, incident
signature); the signature comes from the rule table in ``streams.gateway.rules.table``,
else from the Java/Python exception class in the examples. Groups with no signal
fold into one routine fragment per service; other unmatched WARN/ERROR groups get a
fragment per template. Pure and deterministic: same payload, same answer.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from streams.batch.prompt import extract_payload
from streams.gateway.rules.language import affirmed, in_option
from streams.gateway.rules.rollup import summarize_incident
from streams.gateway.rules.table import Rule, Severity, build_rules

SEVERITIES: tuple[Severity, ...] = ("info", "low", "medium", "high", "critical")
HEAVY_ERROR_COUNT = 100  # ERROR/FATAL events in one fragment that raise severity a step
# templates and examples whose rule is remembered, and the longest remembered: a memo
# holds 8M characters at most
CACHED_PIECES, CACHED_PIECE_CHARS = 4096, 2048

_LEVEL_RANK = {"TRACE": 0, "DEBUG": 1, "INFO": 2, "NOTICE": 2, "WARN": 3, "ERROR": 4, "FATAL": 5}
_LEVEL_ALIASES = {
    "WARNING": "WARN",
    "ERR": "ERROR",
    "SEVERE": "ERROR",
    "CRITICAL": "FATAL",
    "CRIT": "FATAL",
    "EMERG": "FATAL",
    "ALERT": "FATAL",
    "PANIC": "FATAL",
    "FINE": "DEBUG",
    "FINER": "TRACE",
    "FINEST": "TRACE",
}
_LEVEL_FLOOR: dict[str, Severity] = {"WARN": "low", "ERROR": "medium", "FATAL": "high"}

_QUALIFIED_EXC = re.compile(r"\b((?:[a-z_][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error|Throwable))\b")
_SIMPLE_EXC = re.compile(r"\b([A-Z][A-Za-z0-9]*(?:Exception|Error))\b")
_CAUSED_BY = re.compile(r"Caused by:\s*([\w$.]+)")
_JAVA_FRAME = re.compile(r"^\s*at\s+([\w$.<>/-]+\([^)\n]*\))", re.MULTILINE)
_PY_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([\w<>]+)')
_HTTP_STATUS = re.compile(
    r"(?:status[:=]?[ \t]*|HTTP/\d(?:\.\d)?\"?[ \t]+|\bcode[:=][ \t]*)([1-5]\d\d)\b"
)
_ERROR_SIGNAL = re.compile(
    r"\b(?:errors?|fail(?:ed|ure|s)?|exception|fatal|critical|refused|denied|unable|cannot"
    r"|can't|abort(?:ed)?|panic|corrupt(?:ed|ion)?|unreachable)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class _Group:
    index: int
    ref: Any
    service: str
    level: str | None
    template: str
    count: int
    examples: tuple[str, ...]
    first_seen: str | None
    last_seen: str | None

    @property
    def text(self) -> str:
        return "\n".join((self.template, *self.examples))

    @property
    def rank(self) -> int:
        return _LEVEL_RANK.get(self.level or "INFO", 2)


@dataclass(slots=True)
class _Bucket:
    service: str
    signature: str
    rule: Rule | None
    groups: list[_Group]
    subjects: list[str]


@functools.cache
def _rules() -> tuple[tuple[Rule, tuple[str, ...] | None], ...]:
    """The rule table, each rule with the lowercase literals one of which a match needs."""
    return tuple((rule, _needles(rule.pattern)) for rule in build_rules())


def _needles(pattern: re.Pattern[str]) -> tuple[str, ...] | None:
    """Why: 60 case-insensitive regexes cost ~25 us each per line; a substring test on
    the lowered line skips almost all of them. None (always run the regex) when the
    pattern has no required literal of 3+ characters or cannot be parsed."""
    try:
        from re import _parser  # stdlib's own parser; any surprise falls back to None

        return _required(list(_parser.parse(pattern.pattern, pattern.flags)), _parser)
    except Exception:
        return None


def _required(items: list[Any], sre: Any) -> tuple[str, ...] | None:
    candidates: list[tuple[str, ...]] = []
    run = ""
    for op, av in [*items, (None, None)]:
        if op is sre.LITERAL:
            run += chr(av)
            continue
        if op is sre.AT:  # \b, ^, $ consume nothing: the run goes on
            continue
        if len(run) >= 3:
            candidates.append((run.lower(),))
        run = ""
        if op is sre.BRANCH:
            alternatives = [_required(list(branch), sre) for branch in av[1]]
            if all(alternatives):
                candidates.append(tuple(n for alt in alternatives if alt for n in alt))
        elif op is sre.SUBPATTERN and (inner := _required(list(av[3]), sre)):
            candidates.append(inner)
    return max(candidates, key=lambda c: (min(map(len, c)), -len(c)), default=None)


def analyze(payload: dict[str, Any]) -> dict[str, Any]:
    """Answer a payload: every ref of ``payload["groups"]`` lands in exactly one fragment.

    A roll-up payload (``streams.report.analysis.rollup``) is answered with
    ``{"summary": ...}`` instead.
    """
    if payload.get("kind") == "rollup":  # streams.report.analysis.rollup.ROLLUP_KIND
        return summarize_incident(payload)
    detailed = payload.get("detail") == "detailed"
    buckets: dict[tuple[str, str], _Bucket] = {}
    for group in _parse_groups(payload.get("groups")):
        signature, rule, subject = _classify(group)
        bucket = buckets.setdefault(
            (group.service, signature), _Bucket(group.service, signature, rule, [], [])
        )
        bucket.groups.append(group)
        if subject and subject not in bucket.subjects:
            bucket.subjects.append(subject)
    built = [(b.groups[0].index, _fragment(b, detailed)) for b in buckets.values()]
    built.sort(key=lambda x: (-SEVERITIES.index(x[1]["severity"]), x[1]["service"], x[0]))
    return {"fragments": [fragment for _, fragment in built]}


def analyze_messages(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Answer a chat request whose last user message embeds a payload."""
    return analyze(extract_payload(messages))


def _parse_groups(raw_groups: Any) -> list[_Group]:
    """Tolerate sloppy payloads: skip entries without a usable ref, keep the first of dupes."""
    groups: list[_Group] = []
    seen: set[Any] = set()
    for raw in raw_groups if isinstance(raw_groups, list) else []:
        if not isinstance(raw, dict):
            continue
        ref = raw.get("ref")
        if not isinstance(ref, str | int) or isinstance(ref, bool) or ref in seen:
            continue
        seen.add(ref)
        count = raw.get("count")
        examples = raw.get("examples")
        groups.append(
            _Group(
                index=len(groups),
                ref=ref,
                service=str(raw.get("service") or "unknown"),
                level=_normalize_level(raw.get("level")),
                template=str(raw.get("template") or ""),
                count=count if isinstance(count, int) and count >= 0 else 1,
                examples=tuple(e for e in examples if isinstance(e, str))
                if isinstance(examples, list)
                else (),
                first_seen=_opt_str(raw.get("first_seen")),
                last_seen=_opt_str(raw.get("last_seen")),
            )
        )
    return groups


def _normalize_level(level: Any) -> str | None:
    if not isinstance(level, str):
        return None
    upper = level.strip().upper()
    upper = _LEVEL_ALIASES.get(upper, upper)
    return upper if upper in _LEVEL_RANK else None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _classify(group: _Group) -> tuple[str, Rule | None, str | None]:
    """(signature, rule, subject) of one group; the first rule a line asserts wins.

    A rule whose words a line negates or ends well ("no configuration change required",
    "reconnect succeeded") leaves the line to the rules after it. Rules come first, then
    lines: the first rule any line asserts, found in the first line asserting it, which
    is the least of each line's own first rule (ties to the earlier line).
    """
    pieces = (group.template, *group.examples)
    best: tuple[int, str | None] | None = None
    for piece in pieces:
        hit = _first_rule(piece)
        if hit is not None and (best is None or hit[0] < best[0]):
            best = hit
    if best is not None:
        rule = _rules()[best[0]][0]
        return rule.name, rule, best[1]
    text = group.text
    exception = _exception_class(text)
    if exception:
        return f"exception:{exception}", None, None
    if group.rank <= _LEVEL_RANK["INFO"] and not any(map(_error_signal, pieces)):
        return "routine", None, None
    return f"unclassified:{group.level or 'INFO'}:{group.template}", None, None


def _first_rule(piece: str) -> tuple[int, str | None] | None:
    """The index in ``_rules()`` of the first rule ``piece`` asserts and the subject it
    names, or None. Remembered: a template is asked again in every batch its lines
    reach, and routine examples repeat (94 pieces in 100 on a TrainTicket day)."""
    if len(piece) <= CACHED_PIECE_CHARS:
        return _first_rule_memo(piece)
    return _first_rule_of(piece)


def _first_rule_of(piece: str) -> tuple[int, str | None] | None:
    """``_first_rule`` without the memo."""
    lowered = piece.lower()
    for index, (rule, needles) in enumerate(_rules()):
        if needles is not None:
            for needle in needles:  # a loop, not any(genexpr): rules x pieces per group
                if needle in lowered:
                    break
            else:
                continue
        match = affirmed(rule.pattern, piece, rule.sense)
        if match:
            return index, match.groupdict().get("subject")
    return None


def _error_signal(piece: str) -> bool:
    """``piece`` asserts an error word: a line with one is never routine."""
    if len(piece) <= CACHED_PIECE_CHARS:
        return _error_signal_memo(piece)
    return _error_signal_of(piece)


def _error_signal_of(piece: str) -> bool:
    return affirmed(_ERROR_SIGNAL, piece, "failure") is not None


_first_rule_memo = functools.lru_cache(maxsize=CACHED_PIECES)(_first_rule_of)
_error_signal_memo = functools.lru_cache(maxsize=CACHED_PIECES)(_error_signal_of)


def _exception_class(text: str) -> str | None:
    if "Exception" not in text and "Error" not in text and "Throwable" not in text:
        return None  # cheap gate: the class regexes scan every word
    for pattern in (_QUALIFIED_EXC, _SIMPLE_EXC):
        for match in pattern.finditer(text):
            if not in_option(text, match.start(1)):  # -XX:+HeapDumpOnOutOfMemoryError
                return match.group(1)
    return None


def _exception_message(text: str, exception: str) -> str | None:
    """The text after ``Class:`` on the same line, e.g. the message of an IOException."""
    match = re.search(re.escape(exception) + r":\s*([^\n\]]{1,160})", text)
    return _clip(match.group(1), 160) if match else None


def _frames(groups: list[_Group]) -> list[str]:
    """Top stack frames from the examples: Java's first ``at`` lines, Python's innermost."""
    frames: list[str] = []
    for group in groups:
        for example in group.examples:
            found = _JAVA_FRAME.findall(example)
            py = _PY_FRAME.findall(example)
            found += [f"{fn} ({path}:{line})" for path, line, fn in reversed(py)]
            for frame in (_clip(f, 160) for f in found):
                if frame not in frames:
                    frames.append(frame)
    return frames


def _fragment(bucket: _Bucket, detailed: bool) -> dict[str, Any]:
    groups = bucket.groups
    sig = bucket.signature
    if bucket.rule is not None:
        rule = bucket.rule
        event = rule.event + (f" ({', '.join(bucket.subjects[:3])})" if bucket.subjects else "")
        cause, suggestion, base = rule.cause, rule.suggestion, rule.severity
    elif sig.startswith("exception:"):
        event, cause, suggestion, base = _exception_texts(sig.split(":", 1)[1], groups)
    elif sig == "routine":
        event, suggestion, base = "Routine activity", "No action needed", "info"
        cause = "routine activity with no error signals"
    else:
        level = groups[0].level or "INFO"
        event = f"Unclassified {level} events"
        cause = f"unclassified {level} events: {_clip(groups[0].template, 200)}"
        suggestion = "Review these events and add an analyzer rule if they matter"
        base = _LEVEL_FLOOR.get(level, "low")
    evidence = _evidence(bucket, detailed)
    return {
        "refs": [g.ref for g in groups],
        "service": bucket.service,
        "event": event,
        "cause": f"{cause}. {evidence}" if evidence else f"{cause}.",
        "suggestion": suggestion + ".",
        "severity": _severity(base, groups),
    }


def _exception_texts(exception: str, groups: list[_Group]) -> tuple[str, str, str, Severity]:
    simple = exception.rsplit(".", 1)[-1]
    frames = _frames(groups)
    where = f" at {frames[0]}" if frames else ""
    if simple == "NullPointerException":
        cause = f"a null reference was dereferenced: {exception} thrown{where}"
        suggestion = f"Add a null check or validate the input{where or ' in the failing code'}"
    else:
        cause = f"{exception} thrown{where}"
        suggestion = (
            f"Inspect the code{where or ''} and the conditions that raise {simple}; "
            "the first stack frame is where to start"
        )
    return f"{simple} raised", cause, suggestion, "medium"


def _evidence(bucket: _Bucket, detailed: bool) -> str:
    """Levels, exception and top frame always; templates, frames, window, example if detailed.

    No counts: a cause is shared by every batch of an incident, and the report counts
    records exactly from coverage, so a batch's own count here would mislead.
    """
    groups = bucket.groups
    if bucket.signature == "routine" and not detailed:
        return ""
    levels = {g.level or "UNLEVELLED" for g in groups}
    by_rank = sorted(levels, key=lambda lvl: (-_LEVEL_RANK.get(lvl, 2), lvl))
    parts = [f"Evidence: levels {', '.join(by_rank)}"]
    text = "\n".join(g.text for g in groups)
    exception = _exception_class(text)
    frames = _frames(groups)
    if exception:
        message = _exception_message(text, exception)
        if not bucket.signature.startswith("exception:"):
            parts.append(exception + (f" at {frames[0]}" if frames else ""))
        if message:
            parts.append(f"message '{message}'")
    root = _CAUSED_BY.findall(text)
    if root and root[-1] != exception:
        parts.append(f"root cause {root[-1]}")
    if bucket.signature.startswith("http-"):
        codes = Counter(c for g in groups for e in g.examples for c in _HTTP_STATUS.findall(e))
        if codes:
            parts.append(
                "statuses in examples: " + ", ".join(f"{c} x{n}" for c, n in sorted(codes.items()))
            )
    if detailed:
        top = sorted(groups, key=lambda g: (-g.count, g.index))[:5]
        shown = (f"'{_clip(g.template, 120)}'" for g in top)
        parts.append("templates: " + "; ".join(shown))
        if len(frames) > 1:
            parts.append("top frames: " + "; ".join(frames[:3]))
        firsts = sorted(g.first_seen for g in groups if g.first_seen)
        lasts = sorted(g.last_seen for g in groups if g.last_seen)
        if firsts or lasts:
            start = firsts[0] if firsts else "?"
            parts.append(f"window {start} .. {lasts[-1] if lasts else '?'}")
        example = next((e for g in groups for e in g.examples), None)
        if example:
            parts.append(f"example: '{_clip(example.splitlines()[0], 240)}'")
    return "; ".join(parts) + "."


def _severity(base: Severity, groups: list[_Group]) -> Severity:
    """Rule severity, raised to the level's floor, one step more when ERROR/FATAL heavy."""
    rank = SEVERITIES.index(base)
    for g in groups:
        floor = _LEVEL_FLOOR.get(g.level or "")
        if floor:
            rank = max(rank, SEVERITIES.index(floor))
    errors = sum(g.count for g in groups if g.rank >= _LEVEL_RANK["ERROR"])
    if errors >= HEAVY_ERROR_COUNT:
        rank += 1
    return SEVERITIES[min(rank, len(SEVERITIES) - 1)]


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
