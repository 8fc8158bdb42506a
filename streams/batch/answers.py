"""Turn a model answer into Fragments, or say precisely why it cannot be trusted.

The model names groups by ref only; coverage (which raw records a fragment speaks
for) is computed here from the batch, never taken from the answer. So whatever a
log line asks the model to say, a fragment can only cover records of its batch,
and every record of the batch is covered exactly once or the batch goes back:

- malformed JSON              -> MalformedOutput (the gateway tries one repair)
- schema / unknown / duplicate -> ValidationFailed (the batch goes to review)
- refs missing                -> Truncated, reason "missing_records" (split the batch)
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cache, lru_cache
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import jsonschema

import streams
from streams.batch.callees import named_services
from streams.batch.entities import count_entities, top_entities, worth_counting
from streams.batch.window import Batch, TemplateGroup, epoch_of, time_key
from streams.errors import MalformedOutput, Truncated, ValidationFailed
from streams.intervals import Coverage
from streams.records import (
    FAILING_LEVELS,
    AnyRecord,
    Evidence,
    Fragment,
    Review,
    TimeWindow,
    count_minutes,
    failing_traces,
    first_in_minutes,
    highest_level,
    service_of,
)

logger = logging.getLogger(__name__)

_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)
_MAX_CANDIDATES = 50  # "{" positions tried in prose before giving up
_MAX_LISTED = 10  # offenders named in an error message
_MESSAGE = attrgetter("message")


# failing messages whose named services are remembered, up to this length: a failure
# repeats (a stack trace per retry), and its four regexes scan the whole message
CACHED_MESSAGES = 1024
CACHED_MESSAGE_CHARS = 8192


def named_callees(records: Iterable[AnyRecord]) -> dict[str, int]:
    """Per service name its failing records give as called, how many records gave it."""
    named: Counter[str] = Counter()
    for r in records:
        if r.level in FAILING_LEVELS:
            message = r.message
            named.update(_named_in(message) if len(message) <= CACHED_MESSAGE_CHARS
                         else named_services([message], urls=True))
    return dict(named)


@lru_cache(maxsize=CACHED_MESSAGES)
def _named_in(message: str) -> tuple[str, ...]:
    return tuple(named_services([message], urls=True))
_TIMESTAMP = attrgetter("timestamp")
_FIRST = itemgetter(0)
_LAST = itemgetter(1)


# --- parsing --------------------------------------------------------------------


def parse_answer(text: str) -> dict[str, Any]:
    """The JSON object in a model reply, tolerating code fences and prose around it."""
    if not isinstance(text, str) or not text.strip():
        raise MalformedOutput("the model answer is empty")
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    for candidate in candidates:
        stripped = candidate.strip()
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
        start = stripped.find("{")
        for _ in range(_MAX_CANDIDATES):
            if start < 0:
                break
            try:
                value, _end = decoder.raw_decode(stripped, start)
            except json.JSONDecodeError:
                value = None
            if isinstance(value, dict):
                if "fragments" in value:
                    return value
                found.append(value)
            start = stripped.find("{", start + 1)
    if found:
        return found[0]
    preview = text.strip()[:120].replace("\n", " ")
    raise MalformedOutput(f"no JSON object in the model answer (starts: {preview!r})")


# --- validation -----------------------------------------------------------------


@cache
def _answer_schema() -> Any:
    """schemas/answer.schema.json with its references inlined, loaded once (on first use,
    not at import)."""
    path = Path(streams.__file__).resolve().parents[1] / "schemas" / "answer.schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    return _inline_refs(schema, schema.get("$defs", {}))


@cache
def _answer_validator() -> Any:
    """The full validator: it decides what ``_answer_accepts`` cannot show valid."""
    return jsonschema.Draft202012Validator(_answer_schema())


_Accepts = Callable[[Any], bool]
_ANNOTATIONS = frozenset(("$schema", "$id", "$defs", "$comment", "title", "description",
                          "default", "examples"))  # keywords that check nothing
_KEYWORDS = _ANNOTATIONS | {"type", "minLength", "maxLength", "pattern", "minItems", "items",
                            "enum", "required", "properties", "allOf"}
_TYPES: dict[str, type] = {"string": str, "array": list, "object": dict}  # as jsonschema's


@cache
def _answer_accepts() -> _Accepts | None:
    """``_accepts`` of the answer schema; None when it uses a keyword ``_accepts`` lacks."""
    return _accepts(_answer_schema())


def _accepts(node: Any) -> _Accepts | None:
    """A check that is True only for values the schema ``node`` accepts, for the few
    keywords the answer schema uses (read as Draft 2020-12 reads them); None when
    ``node`` uses any other.

    False means "not shown valid": the full validator then decides and words the
    errors, so a valid answer costs a few comparisons per fragment instead of a walk
    through jsonschema's keyword functions.
    """
    if not isinstance(node, dict) or not _KEYWORDS.issuperset(node):
        return None
    kind: type = object
    if "type" in node:
        named = node["type"]
        if not isinstance(named, str) or named not in _TYPES:
            return None
        kind = _TYPES[named]
    low, high, min_items = node.get("minLength", 0), node.get("maxLength"), node.get("minItems", 0)
    enum, required = node.get("enum"), node.get("required", [])
    if not (isinstance(low, int) and isinstance(min_items, int)
            and (high is None or isinstance(high, int))
            and (enum is None or (isinstance(enum, list) and all(isinstance(e, str) for e in enum)))
            and isinstance(required, list) and all(isinstance(r, str) for r in required)):
        return None  # other values (an enum of numbers compares by jsonschema's own rules)
    pattern = re.compile(node["pattern"]).search if "pattern" in node else None
    items = _accepts(node["items"]) if "items" in node else None
    every = [_accepts(sub) for sub in node.get("allOf", [])]
    properties = {key: _accepts(sub) for key, sub in node.get("properties", {}).items()}
    if ("items" in node and items is None) or None in every or None in properties.values():
        return None

    def accepts(value: Any) -> bool:
        if not isinstance(value, kind):
            return False
        if isinstance(value, str):
            if len(value) < low or (high is not None and len(value) > high):
                return False
            if pattern is not None and pattern(value) is None:
                return False
        elif isinstance(value, list):
            if len(value) < min_items or (items is not None and not all(map(items, value))):
                return False
        elif isinstance(value, dict):
            for key in required:
                if key not in value:
                    return False
            for key, check in properties.items():
                if key in value and not check(value[key]):  # type: ignore[misc]
                    return False
        if enum is not None and not (isinstance(value, str) and value in enum):
            return False
        return all(check(value) for check in every)  # type: ignore[misc]

    return accepts


def _inline_refs(node: Any, defs: dict[str, Any], depth: int = 0) -> Any:
    """``node`` with each ``{"$ref": "#/$defs/x", ...}`` replaced by the definition itself
    (``allOf`` beside the ref's own keywords, in its place): the same checks and error
    messages, without resolving a reference for every fragment of every answer."""
    if depth > 32:  # a definition that refers to itself keeps its references
        return node
    if isinstance(node, list):
        return [_inline_refs(item, defs, depth) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        ref = value if key == "$ref" and isinstance(value, str) else None
        name = ref.removeprefix("#/$defs/") if ref is not None else None
        if name is not None and ref != name and name in defs:
            target = _inline_refs(defs[name], defs, depth + 1)
            if len(node) == 1:
                return target
            out["allOf"] = [target]
        else:
            out[key] = _inline_refs(value, defs, depth) if key != "$defs" else value
    return out


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f" and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def _check_schema(answer: Any) -> None:
    accepts = _answer_accepts()
    if accepts is not None and accepts(answer):
        return
    errors = sorted(_answer_validator().iter_errors(answer), key=lambda e: list(e.absolute_path))
    if errors:
        problems = [
            f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message[:200]}"
            for e in errors
        ]
        raise ValidationFailed(
            f"answer does not match schemas/answer.schema.json: {_listed(problems)}",
            reason="schema",
        )


def _check_refs(batch: Batch, answer: dict[str, Any]) -> None:
    known = {g.ref for g in batch.groups}
    uses = Counter(ref for item in answer["fragments"] for ref in item["refs"])
    unknown = sorted(ref for ref in uses if ref not in known)
    if unknown:
        raise ValidationFailed(
            f"answer names refs that are not in the batch: {_listed(unknown)}",
            reason="unknown_ref",
        )
    duplicate = sorted((ref for ref, n in uses.items() if n > 1), key=_ref_order)
    if duplicate:
        raise ValidationFailed(
            f"answer covers refs more than once: {_listed(duplicate)}", reason="duplicate_ref"
        )
    missing = sorted((ref for ref in known if ref not in uses), key=_ref_order)
    if missing:
        raise Truncated(
            f"answer leaves {len(missing)} of {len(known)} groups uncovered "
            f"({_listed(missing)}); split the batch",
            reason="missing_records",
        )


def _ref_order(ref: str) -> tuple[int, str]:
    digits = ref[1:]
    return (int(digits), ref) if digits.isdigit() else (1 << 30, ref)


def validate_answer(
    batch: Batch, answer: dict[str, Any], *, model: str, prompt_version: str
) -> list[Fragment]:
    """Fragments from a parsed answer; every record of the batch is covered exactly once.

    An answer that is not even shaped like ours (no ``fragments`` list) is malformed
    output, which earns one repair request, rather than a validation failure.
    """
    if not isinstance(answer, dict) or not isinstance(answer.get("fragments"), list):
        raise MalformedOutput("the answer has no 'fragments' list")
    _check_schema(answer)
    _check_refs(batch, answer)
    by_ref = {g.ref: g for g in batch.groups}
    position = {g.ref: i for i, g in enumerate(batch.groups)}
    fragments = []
    for item in answer["fragments"]:
        groups = [by_ref[ref] for ref in sorted(item["refs"], key=position.__getitem__)]
        fragments.append(_fragment(batch, groups, item, model=model, prompt_version=prompt_version))
    return fragments


def _service(groups: list[TemplateGroup], named: str) -> str:
    """The answer's service when it is one of the groups'; else the groups' most common."""
    services = Counter[str]()
    for g in groups:
        services[g.service] += g.count
    if named.strip() in services:
        return named.strip()
    return min(services.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def _first_time(records: list[AnyRecord]) -> str | None:
    """The time of the earliest timed record (None when none has a time)."""
    timed = [r for r in records if epoch_of(r.timestamp) is not None]
    return min(timed, key=time_key).timestamp if timed else None


def _window(groups: list[TemplateGroup]) -> TimeWindow:
    """The earliest and latest timed record of the groups (each group knows its own)."""
    firsts = [g.span[0] for g in groups if g.span[0] is not None]
    if not firsts:
        return TimeWindow()
    lasts = [g.span[1] for g in groups if g.span[1] is not None]
    return TimeWindow(
        start=min(firsts, key=time_key).timestamp, end=max(lasts, key=time_key).timestamp
    )


def _fragment(
    batch: Batch,
    groups: list[TemplateGroup],
    item: dict[str, Any],
    *,
    model: str,
    prompt_version: str,
) -> Fragment:
    # the union of the groups' coverages, built from their entries at once
    covered = groups[0].coverage if len(groups) == 1 else Coverage.from_entries(
        chain.from_iterable(g.entries for g in groups))
    covered_json = covered.to_json()
    window = _window(groups)
    who = worth_counting(item["severity"], item["event"], item["cause"])
    return Fragment(
        id=_fragment_id_of(batch.lane, model, prompt_version, covered_json),
        lane=batch.lane,
        window=window,
        service=_service(groups, item["service"]),
        timestamp=window.start,
        event=item["event"].strip(),
        cause=item["cause"].strip(),
        suggestion=item["suggestion"].strip(),
        severity=item["severity"],
        evidence=[
            Evidence(
                template=g.template,
                count=g.count,
                examples=list(g.examples),
                covered=g.coverage.to_json(),
                entities=top_entities(count_entities(map(_MESSAGE, g.records)))
                if who else {},
                minutes=count_minutes(map(_TIMESTAMP, g.records)),
                traces=failing_traces(g.records),
                level=highest_level(g.records),
                named=named_callees(g.records),
                first_seen=g.span[0].timestamp if g.span[0] is not None else None,
                starts=first_in_minutes(g.records),
            )
            for g in groups
        ],
        covered=covered_json,
        record_count=sum(g.count for g in groups),
        model=model,
        prompt_version=prompt_version,
    )


# --- a fragment per report: where each record belongs is a function of the record ----


Place = Callable[[AnyRecord], str]


def place_fragments(
    fragments: list[Fragment], by_coord: Mapping[tuple[str, int], AnyRecord],
    place: Place,
) -> list[Fragment]:
    """Each fragment cut into one fragment per report its records belong to.

    ``place`` names a record's report from the record alone (its own time and
    fields), so a replay, a re-batching after a crash or a rebalance, or an
    overlapping re-run puts every record in the same report, where the merge's
    coverage check makes counting it twice impossible. Each part gets
    ``report_id`` and an id derived from its own coverage. ``by_coord``: the batch's
    records by their ledger entries (``Batch.by_coord``).
    """
    out: list[Fragment] = []
    for fragment in fragments:
        coords = list(_coords(fragment.covered))
        try:
            covered = list(map(by_coord.__getitem__, coords))  # in C, no step per record
        except KeyError:
            coord = next(c for c in coords if c not in by_coord)
            raise ValueError(
                f"fragment {fragment.id} covers {coord}, which is not in its batch") from None
        places = list(map(place, covered))
        if len(set(places)) == 1:  # the common case: the whole fragment is one report's
            out.append(_part(fragment, places[0], covered, whole=True))
            continue
        parts: dict[str, list[AnyRecord]] = {}
        for report_id, record in zip(places, covered, strict=True):
            parts.setdefault(report_id, []).append(record)
        for report_id in sorted(parts):
            out.append(_part(fragment, report_id, parts[report_id], whole=False))
    return out


def _coords(covered: dict[str, list[list[int]]]) -> Iterator[tuple[str, int]]:
    """Every (ledger key, value) a coverage holds, as ``RawCoord.ledger_entry`` names them
    (built by iterators in C: a fragment covers hundreds of records)."""
    return chain.from_iterable(
        zip(repeat(key), chain.from_iterable(
            map(range, map(_FIRST, ranges), map((1).__add__, map(_LAST, ranges)))))
        for key, ranges in covered.items())


def _part(
    fragment: Fragment, report_id: str, records: list[AnyRecord], *, whole: bool
) -> Fragment:
    if whole:
        return fragment.model_copy(update={"report_id": report_id})
    coverage = Coverage.from_entries(r.raw.ledger_entry() for r in records)
    messages = [r.message for r in records]
    evidence = []
    for ev in fragment.evidence:
        part = Coverage.from_json(ev.covered).intersection(coverage) if ev.covered else coverage
        if not part:
            continue
        mine = [ex for ex in ev.examples if any(m.startswith(_stem(ex)) for m in messages)]
        # counted again over this report's records of the template, found by coordinates:
        # a group's records may carry older texts than the template it shows
        at = set(_coords(part.to_json()))
        own = [r for r in records if r.raw.ledger_entry() in at]
        entities = top_entities(count_entities(map(_MESSAGE, own))) if ev.entities else {}
        evidence.append(ev.model_copy(update={
            "count": len(part), "covered": part.to_json(), "examples": mine or ev.examples[:1],
            "entities": entities, "minutes": count_minutes(map(_TIMESTAMP, own)),
            "traces": failing_traces(own), "level": highest_level(own),
            "named": named_callees(own), "first_seen": _first_time(own),
            "starts": first_in_minutes(own)}))
    timed = [r for r in records if epoch_of(r.timestamp) is not None]
    window = TimeWindow(
        start=min(timed, key=time_key).timestamp if timed else None,
        end=max(timed, key=time_key).timestamp if timed else None,
    )
    services = Counter(service_of(r) for r in records)
    service = fragment.service if fragment.service in services else min(
        services.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    covered = coverage.to_json()
    return fragment.model_copy(update={
        "id": _fragment_id_of(fragment.lane, fragment.model, fragment.prompt_version, covered),
        "report_id": report_id, "window": window, "timestamp": window.start,
        "service": service, "evidence": evidence, "covered": covered,
        "record_count": len(coverage)})


def _stem(example: str) -> str:
    """The start of an example, without the marker a cut example ends with."""
    return example[:40]


# --- ids and review ---------------------------------------------------------------


def _digest(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:20]


def fragment_id(
    *, lane: str, model: str, prompt_version: str, covered: dict[str, list[list[int]]]
) -> str:
    """Same lane, model, prompt version and covered records => same id, across re-runs."""
    canonical = Coverage.from_json(covered).to_json()
    return _fragment_id_of(lane, model, prompt_version, canonical)


def _fragment_id_of(lane: str, model: str, prompt_version: str,
                    canonical: dict[str, list[list[int]]]) -> str:
    """``fragment_id`` of a ``Coverage.to_json`` output, which is canonical already."""
    return "f-" + _digest(lane, model, prompt_version, canonical)


def review_id(*, covered: dict[str, list[list[int]]], reason: str) -> str:
    return "r-" + _digest(Coverage.from_json(covered).to_json(), reason)


def review_for(
    batch: Batch,
    *,
    reason: str,
    detail: str,
    model: str,
    prompt_version: str,
    output: str | None,
) -> Review:
    """A review entry for a batch whose answer could not be trusted.

    ``detail`` is for the person reading it: what went wrong and what to look at.
    """
    covered = batch.coverage.to_json()
    return Review(
        id=review_id(covered=covered, reason=reason),
        lane=batch.lane,
        reason=reason,
        detail=detail,
        covered=covered,
        record_ids=[r.id for r in batch.records],
        model=model,
        prompt_version=prompt_version,
        output=output,
    )
