"""Token-budget batching windows, one per lane (and partition).

A batch is sent to the model as *condensed groups*: one entry per (service,
template) with a count, first/last time and a few distinct examples. Records that
share a template cost almost nothing after the first, so the budget is spent on
what differs, and one call covers hundreds of records instead of a handful.

Costs are estimated on the prompt the model will actually see (JSON-escaped
template and examples plus a fixed allowance per group), never below it: the
window flushes before the estimate would pass the budget, and the budget leaves
room in the context for the reserved output.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from streams.batch.covering import most_general
from streams.batch.prompt import prompt_overhead_tokens
from streams.batch.prompt_tokens import (
    EXAMPLE_SEPARATOR_TOKENS,
    GROUP_OVERHEAD_TOKENS,
    MARKER_RESERVE,
    MIN_CUT_TOKENS,
    TokenCounterLike,
    cut_to_cap_tokens,
    group_cost,
    group_cost_of,
    json_tokens,
    message_tokens,
    message_tokens_bound,
)
from streams.intervals import Coverage
from streams.records import AnyRecord, Lane, service_of
from streams.tokens import PieceCounter

logger = logging.getLogger(__name__)

# why a batch closed; a metric label (retro_batches_total{trigger})
Trigger = Literal["budget", "count", "wait", "oversize", "split", "drain"]

_LEVEL_RANK = {"TRACE": 0, "DEBUG": 1, "INFO": 2, "NOTICE": 3, "WARN": 4, "ERROR": 5, "FATAL": 6}


# --- ordering -------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def epoch_of(timestamp: str | None) -> float | None:
    """Seconds since the epoch, or None; ISO strings do not sort by text alone.

    Cached: a batch sorts and groups by time several times, and neighbouring records
    share timestamps."""
    if not timestamp:
        return None
    try:
        parsed = datetime.fromisoformat(timestamp)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def time_key(record: AnyRecord) -> tuple[int, float, str, int, int]:
    """Time order; records without a time go last, ties in arrival (offset) order."""
    epoch = epoch_of(record.timestamp)
    return (epoch is None, epoch or 0.0, record.raw.topic, record.raw.partition, record.raw.offset)


def record_key(record: AnyRecord) -> tuple[str, bool, float, str, int, int]:
    """Batch order: by service, then ``time_key`` order within it, as one flat tuple
    (a sort builds one tuple a record)."""
    epoch = epoch_of(record.timestamp)
    raw = record.raw
    return (service_of(record), epoch is None, epoch or 0.0, raw.topic, raw.partition,
            raw.offset)


def _time_span(records: Sequence[AnyRecord]) -> tuple[AnyRecord | None,
                                                               AnyRecord | None]:
    """The records ``min`` and ``max`` by ``time_key`` pick among the timed ``records``
    (None, None without any), for ``records`` already in ``time_key`` order: the first
    timed one, and the first of the last timed key (the undated ones come last)."""
    last = len(records) - 1
    while last >= 0 and epoch_of(records[last].timestamp) is None:
        last -= 1
    if last < 0:
        return None, None
    key = time_key(records[last])
    while last > 0 and time_key(records[last - 1]) == key:
        last -= 1
    return records[0], records[last]


# --- values -----------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateGroup:
    """Records of one (service, template) in a batch, shown to the model as one entry."""

    ref: str
    service: str
    level: str | None
    template_id: str
    template: str
    records: tuple[AnyRecord, ...]  # in time_key order (build_batch sorts them)
    examples: tuple[str, ...]
    truncated: bool

    @property
    def count(self) -> int:
        return len(self.records)

    @functools.cached_property
    def span(self) -> tuple[AnyRecord | None, AnyRecord | None]:
        """(first, last) timed record, computed once: prompts, answers and fragments ask."""
        return _time_span(self.records)

    @property
    def first_seen(self) -> str | None:
        first = self.span[0]
        return None if first is None else first.timestamp

    @property
    def last_seen(self) -> str | None:
        last = self.span[1]
        return None if last is None else last.timestamp

    @functools.cached_property
    def entries(self) -> tuple[tuple[str, int], ...]:
        """Each record's ledger entry, in ``records`` order, computed once: the coverage
        and the placing of fragments in reports both read them."""
        return tuple([r.raw.ledger_entry() for r in self.records])

    @functools.cached_property
    def coverage(self) -> Coverage:
        """Computed once (a fragment asks for its union and for its evidence); immutable."""
        return Coverage.from_entries(self.entries)


@dataclass(frozen=True)
class Batch:
    """One model call's worth of records, grouped by template, ordered by service and time.

    The counter and caps are kept so ``split`` can rebuild each half the same way.
    """

    lane: Lane
    groups: tuple[TemplateGroup, ...]
    estimated_input_tokens: int
    trigger: Trigger
    max_examples: int = 3
    max_example_tokens: int | None = None
    max_template_tokens: int | None = None
    counter: TokenCounterLike | None = field(default=None, compare=False, repr=False)
    overhead_tokens: int | None = field(default=None, compare=False, repr=False)
    # the records in record_key order when build_batch knows it (no two share a key)
    presorted: tuple[AnyRecord, ...] | None = field(default=None, compare=False,
                                                           repr=False)

    @property
    def records(self) -> list[AnyRecord]:
        return list(self._ordered)

    @functools.cached_property
    def _ordered(self) -> tuple[AnyRecord, ...]:
        """Sorted once per batch; ties in record_key keep the groups' order."""
        if self.presorted is not None:
            return self.presorted
        return tuple(sorted((r for g in self.groups for r in g.records), key=record_key))

    @property
    def record_count(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def coverage(self) -> Coverage:
        return Coverage.from_entries(e for g in self.groups for e in g.entries)

    def by_coord(self) -> dict[tuple[str, int], AnyRecord]:
        """Each record by its ledger entry, from the entries its groups know already."""
        return {e: r for g in self.groups for e, r in zip(g.entries, g.records, strict=True)}

    def split(self) -> tuple[Batch, Batch]:
        """Halve by records in service/time order; a one-record batch cannot be split."""
        records = self.records
        if len(records) < 2:
            raise ValueError("a batch of one record cannot be split; send it to review")
        if self.counter is None:
            raise ValueError("this batch was built without a token counter; rebuild it")
        mid = len(records) // 2
        halves = (records[:mid], records[mid:])
        first, second = (
            build_batch(
                half,
                lane=self.lane,
                counter=self.counter,
                max_examples=self.max_examples,
                max_example_tokens=self.max_example_tokens,
                max_template_tokens=self.max_template_tokens,
                trigger="split",
                overhead_tokens=self.overhead_tokens,
            )
            for half in halves
        )
        return first, second


def build_batch(
    records: Iterable[AnyRecord],
    *,
    lane: Lane,
    counter: TokenCounterLike,
    max_examples: int = 3,
    max_example_tokens: int | None,
    trigger: Trigger,
    max_template_tokens: int | None = None,
    overhead_tokens: int | None = None,
) -> Batch:
    """Group records by (service, template) in service/time order.

    A group shows its most general template text (``group_template``). Examples are
    the first ``max_examples`` distinct messages in time order; an example (or
    template) over its cap is cut and marked `` …[cut: N tokens]``.
    ``max_template_tokens`` defaults to ``max_example_tokens``; None means no cap.
    """
    given = list(records)
    keys = [record_key(r) for r in given]
    at = sorted(range(len(given)), key=keys.__getitem__)  # stable: ties keep arrival order
    ordered = [given[i] for i in at]
    if not ordered:
        raise ValueError("cannot build a batch of no records")
    if max_examples < 1:
        raise ValueError(f"max_examples must be at least 1, got {max_examples}")
    template_cap = max_template_tokens if max_template_tokens is not None else max_example_tokens
    overhead = overhead_tokens if overhead_tokens is not None else prompt_overhead_tokens(counter)

    buckets: dict[tuple[str, str], list[AnyRecord]] = {}
    for i in at:
        buckets.setdefault((keys[i][0], given[i].template_id), []).append(given[i])
    # the groups' concatenation sorts to ``ordered`` unless two records share a key
    distinct = all(keys[a] != keys[b] for a, b in itertools.pairwise(at))

    def order(item: tuple[tuple[str, str], list[AnyRecord]]) -> tuple:
        (service, template_id), members = item
        return (service, time_key(members[0])[:2], template_id)

    groups: list[TemplateGroup] = []
    estimate = overhead
    for n, ((service, template_id), members) in enumerate(sorted(buckets.items(), key=order), 1):
        truncated = False
        template = group_template(members)
        # each text is costed once: cutting it to its cap counts what it keeps
        if template_cap is not None:
            template, cut, template_tokens = cut_to_cap_tokens(counter, template, template_cap)
            truncated |= cut
        else:
            template_tokens = json_tokens(counter, template)
        examples: list[str] = []
        example_costs = 0
        seen: set[str] = set()
        for record in members:
            if record.message in seen:
                continue
            seen.add(record.message)
            example = record.message
            if max_example_tokens is not None:
                example, cut, tokens = cut_to_cap_tokens(counter, example, max_example_tokens)
                truncated |= cut
            else:
                tokens = json_tokens(counter, example)
            examples.append(example)
            example_costs += tokens + EXAMPLE_SEPARATOR_TOKENS
            if len(examples) == max_examples:
                break
        levels = [r.level for r in members if r.level]
        level = max(levels, key=lambda lv: _LEVEL_RANK.get(lv, -1)) if levels else None
        estimate += group_cost_of(counter, service, template_tokens, example_costs)
        groups.append(
            TemplateGroup(
                ref=f"g{n}",
                service=service,
                level=level,
                template_id=template_id,
                template=template,
                records=tuple(members),
                examples=tuple(examples),
                truncated=truncated,
            )
        )
    return Batch(
        lane=lane,
        groups=tuple(groups),
        estimated_input_tokens=estimate,
        trigger=trigger,
        max_examples=max_examples,
        max_example_tokens=max_example_tokens,
        max_template_tokens=max_template_tokens,
        counter=counter,
        overhead_tokens=overhead,
        presorted=tuple(ordered) if distinct else None,
    )


def group_template(members: list[AnyRecord]) -> str:
    """The template text a group of one template id shows: the one covering all the
    others, else the latest record's by offset.

    A template id is given at a drain3 cluster's birth and kept while its template
    generalises, so a group can hold older, narrower texts ("for root") beside the
    newer one ("for <*>"); the general one names every record of the group.
    """
    texts = {r.template for r in members}
    if len(texts) == 1:
        return members[0].template
    general = most_general(texts)
    if general is not None:
        return general
    latest = max(members, key=lambda r: (r.raw.offset, -1 if r.raw.index is None else r.raw.index))
    return latest.template


# --- the window ---------------------------------------------------------------------


@dataclass
class _GroupCost:
    """Running cost of one group: the k costliest distinct messages bound any k examples."""

    base: int  # overhead + service + the costliest template text seen in the group
    templates: set[str] = field(default_factory=set)
    top: list[tuple[int, str]] = field(default_factory=list)  # (cost, message), costliest first
    top_cost: int = 0  # the costs in ``top`` added up, kept with it (not summed per record)

    @property
    def total(self) -> int:
        return self.base + self.top_cost

    def settled(self, cost: int, k: int) -> bool:
        """True when a message costing at most ``cost`` leaves the top as it is."""
        top = self.top
        return len(top) >= k and cost <= top[-1][0]

    def with_message(self, cost: int, message: str, k: int) -> list[tuple[int, str]]:
        # the cheap test first: most messages cost no more than the k-th costliest
        top = self.top
        if len(top) >= k and cost <= top[-1][0]:
            return top
        for _, seen in top:  # a loop, not any(genexpr): this runs for most records
            if seen == message:
                return top
        return sorted([*top, (cost, message)], key=lambda cm: -cm[0])[:k]


class TokenWindow:
    """Accumulates one lane's records until the token budget, the count cap or the wait.

    ``effective_budget`` is ``min(input_budget, floor(context_window / (1 + output_reserve)))``
    so the prompt plus its reserved answer always fits the model context.
    """

    def __init__(
        self,
        *,
        lane: Lane,
        input_budget: int,
        context_window: int,
        output_reserve: float,
        max_records: int,
        max_wait_seconds: float,
        counter: TokenCounterLike,
        max_examples: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if output_reserve < 0:
            raise ValueError(f"output_reserve must not be negative, got {output_reserve}")
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        if max_wait_seconds < 0:
            raise ValueError(f"max_wait_seconds must not be negative, got {max_wait_seconds}")
        if max_examples < 1:
            raise ValueError(f"max_examples must be at least 1, got {max_examples}")
        self.lane: Lane = lane
        self.max_records = max_records
        self.max_wait_seconds = max_wait_seconds
        self.max_examples = max_examples
        self._counter = counter
        self._pieces = PieceCounter.of(counter)  # escaped messages counted by their pieces
        self._clock = clock
        self.effective_budget = min(input_budget, math.floor(context_window / (1 + output_reserve)))
        self.overhead_tokens = prompt_overhead_tokens(counter)
        # what a group's template and example may take when one record fills a batch alone
        self._room = self.effective_budget - self.overhead_tokens - GROUP_OVERHEAD_TOKENS
        minimum = 2 * (MIN_CUT_TOKENS + MARKER_RESERVE) + EXAMPLE_SEPARATOR_TOKENS
        if self._room < minimum:
            raise ValueError(
                f"{lane} lane: an input budget of {self.effective_budget} tokens (from "
                f"input_budget={input_budget}, context_window={context_window}, "
                f"output_reserve={output_reserve}) cannot hold the {self.overhead_tokens}-token "
                f"prompt plus one record; raise input_budget or context_window to at least "
                f"{self.overhead_tokens + GROUP_OVERHEAD_TOKENS + minimum}"
            )
        self._records: list[AnyRecord] = []
        self._groups: dict[tuple[str, str], _GroupCost] = {}
        self._estimate = self.overhead_tokens
        self._started: float | None = None

    # -- state --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._records)

    def pending_records(self) -> list[AnyRecord]:
        return list(self._records)

    @property
    def estimated_tokens(self) -> int:
        """Upper bound of the prompt tokens of the batch the window would flush now."""
        return self._estimate

    def due(self) -> bool:
        """True once the first record in the window has waited ``max_wait_seconds``."""
        wait = self.seconds_until_due()
        return wait is not None and wait <= 0

    def seconds_until_due(self) -> float | None:
        """How long a quiet partition may sleep before ``flush("wait")``; None when empty."""
        if self._started is None:
            return None
        return max(0.0, self._started + self.max_wait_seconds - self._clock())

    # -- adding -------------------------------------------------------------------

    def add(self, record: AnyRecord) -> list[Batch]:
        """Add one record; return the batches this closes (0, 1 or 2), oldest first."""
        out: list[Batch] = []
        key = (service_of(record), record.template_id)
        group = self._groups.get(key)
        message_cost: int | None = None
        if group is None:
            group = _GroupCost(base=self._group_base(key[0], record.template),
                               templates={record.template})
            known = False
        else:
            known = True
        base = group.base
        if record.template not in group.templates:
            # the batch shows one of the group's texts (group_template): the costliest bounds it
            base = max(base, self._group_base(key[0], record.template))
        # an escaped message is costed by its bound, not encoded again: the estimate stays
        # an upper bound of the prompt, a few tokens looser on quoted lines
        bound = message_tokens_bound(self._counter, record)
        new_top_cost = group.top_cost
        if bound is not None and group.settled(bound + EXAMPLE_SEPARATOR_TOKENS,
                                               self.max_examples):
            # no cost up to the bound changes the top: the message need not be costed
            new_top = group.top
            marginal = base - group.base
        else:
            cost = bound if bound is not None else message_tokens(
                self._counter, record, self._pieces)
            message_cost = cost + EXAMPLE_SEPARATOR_TOKENS
            new_top = group.with_message(message_cost, record.message, self.max_examples)
            if new_top is not group.top:  # with_message hands back the same list unchanged
                new_top_cost = sum(c for c, _ in new_top)
            grown = base + new_top_cost
            marginal = grown - (group.total if known else 0)

        if self._estimate + marginal > self.effective_budget:
            if message_cost is None:
                message_cost = (message_tokens(self._counter, record, self._pieces)
                                + EXAMPLE_SEPARATOR_TOKENS)
            alone = self.overhead_tokens + self._group_base(key[0], record.template) + message_cost
            if self._records:
                out.append(self._flush("budget"))
            if alone > self.effective_budget:
                out.append(self._oversize(record))
                return out
            return out + self.add(record)  # fits an empty window: no further recursion

        if not known:
            self._groups[key] = group
        group.base = base
        group.templates.add(record.template)
        group.top = new_top
        group.top_cost = new_top_cost
        self._estimate += marginal
        self._records.append(record)
        if self._started is None:
            self._started = self._clock()
        if len(self._records) >= self.max_records:
            out.append(self._flush("count"))
        return out

    def flush(self, trigger: Trigger = "wait") -> Batch | None:
        """Close the window now (wait, drain on shutdown or rebalance); None when empty."""
        if not self._records:
            return None
        return self._flush(trigger)

    # -- internals ----------------------------------------------------------------

    def _group_base(self, service: str, template: str) -> int:
        return group_cost(self._counter, service, template, 0)

    def _flush(self, trigger: Trigger) -> Batch:
        batch = build_batch(
            self._records,
            lane=self.lane,
            counter=self._counter,
            max_examples=self.max_examples,
            max_example_tokens=self._room,
            trigger=trigger,
            overhead_tokens=self.overhead_tokens,
        )
        logger.debug(
            "%s lane: flushed %s records in %s groups, ~%s tokens (%s)",
            self.lane,
            batch.record_count,
            len(batch.groups),
            batch.estimated_input_tokens,
            trigger,
        )
        self._records = []
        self._groups = {}
        self._estimate = self.overhead_tokens
        self._started = None
        return batch

    def _oversize(self, record: AnyRecord) -> Batch:
        """One record over the budget alone: its template and example are cut to fit."""
        room = self._room - json_tokens(self._counter, service_of(record))
        room -= EXAMPLE_SEPARATOR_TOKENS
        template_tokens = json_tokens(self._counter, record.template)
        if template_tokens <= room // 2:
            template_cap, example_cap = template_tokens, room - template_tokens
        else:
            template_cap = example_cap = room // 2
        template_cap = max(template_cap, MIN_CUT_TOKENS + MARKER_RESERVE)
        example_cap = max(example_cap, MIN_CUT_TOKENS + MARKER_RESERVE)
        batch = build_batch(
            [record],
            lane=self.lane,
            counter=self._counter,
            max_examples=self.max_examples,
            max_example_tokens=example_cap,
            max_template_tokens=template_cap,
            trigger="oversize",
            overhead_tokens=self.overhead_tokens,
        )
        # one line per record would flood a post-mortem's stderr on a log of stack traces;
        # retro_batches_total{trigger="oversize"} counts them
        logger.debug(
            "%s lane: record %s alone exceeds the %s-token budget; sent cut to ~%s tokens",
            self.lane,
            record.id,
            self.effective_budget,
            batch.estimated_input_tokens,
        )
        return batch
