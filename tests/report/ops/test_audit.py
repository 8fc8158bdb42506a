"""The audit's reconciliation: missing and double-counted raw coordinates."""

from __future__ import annotations

from streams.intervals import Coverage
from streams.report.ops.audit import reconcile


def cov(part: str, *ranges: tuple[int, int]) -> Coverage:
    return Coverage.from_json({part: [list(r) for r in ranges]})


RAW = cov("raw/0", (0, 99)).union(cov("raw/1", (0, 9)))


def test_everything_claimed_once_is_clean() -> None:
    result = reconcile(RAW, {
        "reports": [cov("raw/0", (0, 49)), cov("raw/0", (50, 89))],
        "review": [cov("raw/0", (90, 97))],
        "deadletter": [cov("raw/0", (98, 99)), cov("raw/1", (0, 9))],
    })
    assert result.ok
    assert result.claimed == {"reports": 90, "review": 8, "deadletter": 12}
    assert result.raw_records == 110


def test_missing_records_are_listed_by_partition() -> None:
    result = reconcile(RAW, {"reports": [cov("raw/0", (0, 99))], "review": [],
                             "deadletter": [cov("raw/1", (0, 4))]})
    assert not result.ok
    assert result.missing == {"raw/1": [[5, 9]]}
    assert result.double_counted == {}


def test_a_record_in_two_reports_is_double_counted() -> None:
    result = reconcile(RAW, {
        "reports": [cov("raw/0", (0, 60)), cov("raw/0", (55, 99)).union(cov("raw/1", (0, 9)))],
        "review": [],
        "deadletter": [],
    })
    assert not result.ok
    assert result.double_counted == {"raw/0": [[55, 60]]}
    assert result.missing == {}


def test_a_report_takes_records_out_of_review() -> None:
    """Parked, then re-analysed (re-drive, or a re-batch after a crash): analysed once."""
    result = reconcile(RAW, {
        "reports": [RAW],
        "review": [cov("raw/0", (90, 99))],
        "deadletter": [],
    }, ["model_unavailable"])
    assert result.ok
    assert result.claimed == {"reports": 110, "review": 0, "deadletter": 0}
    assert result.parked_by_reason == {}


def test_two_reviews_of_one_record_are_one_parked_record() -> None:
    result = reconcile(RAW, {
        "reports": [cov("raw/0", (0, 89)), cov("raw/1", (0, 9))],
        "review": [cov("raw/0", (90, 99)), cov("raw/0", (95, 99))],
        "deadletter": [],
    }, ["retry_budget_exhausted", "schema"])
    assert result.ok and result.double_counted == {}
    assert result.claimed["review"] == 10
    # each parked record counts once, under its latest review's reason
    assert result.parked_by_reason == {"retry_budget_exhausted": 5, "schema": 5}


def test_a_partly_re_analysed_review_keeps_only_the_rest_parked() -> None:
    result = reconcile(RAW, {
        "reports": [cov("raw/0", (0, 94)), cov("raw/1", (0, 9))],
        "review": [cov("raw/0", (90, 99))],
        "deadletter": [],
    }, ["model_unavailable"])
    assert result.ok
    assert result.claimed == {"reports": 105, "review": 5, "deadletter": 0}
    assert result.parked_by_reason == {"model_unavailable": 5}


def test_a_dead_letter_in_a_report_or_review_is_double_counted() -> None:
    result = reconcile(RAW, {
        "reports": [cov("raw/0", (0, 89))],
        "review": [cov("raw/0", (90, 95))],
        "deadletter": [cov("raw/0", (89, 89)), cov("raw/0", (95, 99)), cov("raw/1", (0, 9))],
    })
    assert not result.ok
    assert result.double_counted == {"raw/0": [[89, 89], [95, 95]]}
    assert result.missing == {}


def test_two_dead_letters_of_one_record_are_double_counted() -> None:
    result = reconcile(RAW, {
        "reports": [cov("raw/0", (0, 99))],
        "deadletter": [cov("raw/1", (0, 9)), cov("raw/1", (3, 3))],
    })
    assert result.double_counted == {"raw/1": [[3, 3]]}


def test_the_summary_names_analysed_parked_and_dead_lettered() -> None:
    from streams.report.ops.audit import summary_line

    result = reconcile(RAW, {
        "reports": [cov("raw/0", (0, 89))],
        "review": [cov("raw/0", (90, 97))],
        "deadletter": [cov("raw/0", (98, 99)), cov("raw/1", (0, 9))],
    }, ["model_unavailable"])
    assert summary_line(result) == (
        "110 raw records: 90 analysed, 8 parked in review (model_unavailable 8), "
        "12 dead-lettered, 0 missing, 0 double-counted")
    assert result.to_json()["parked_by_reason"] == {"model_unavailable": 8}


def test_claims_outside_the_raw_topic_are_reported_but_not_double() -> None:
    result = reconcile(RAW, {"reports": [RAW, cov("raw/0", (100, 120))], "review": [],
                             "deadletter": []})
    assert result.ok
    assert result.foreign == {"raw/0": [[100, 120]]}


def test_missing_records_come_with_a_hint_about_the_worker() -> None:
    from streams.report.ops.audit import missing_hint

    clean = reconcile(RAW, {"reports": [RAW]})
    assert missing_hint(clean) is None
    result = reconcile(RAW, {"reports": [cov("raw/0", (0, 89))]})
    hint = missing_hint(result)
    assert hint is not None and hint.startswith("20 raw records are not accounted for")
    assert "retro worker" in hint and "--wait" in hint


# --- messages carrying many log records ----------------------------------------------------

MSGS = cov("otlp/0", (0, 2))  # three messages; the one at offset 1 carries three records


def test_a_multi_record_message_counts_its_records() -> None:
    result = reconcile(MSGS, {
        "reports": [cov("otlp/0", (0, 0), (2, 2)), cov("otlp/0@1:3", (0, 1))],
        "deadletter": [cov("otlp/0@1:3", (2, 2))],
    })
    assert result.ok, result.to_json()
    assert (result.raw_records, result.raw_messages) == (5, 3)
    assert result.claimed == {"reports": 4, "review": 0, "deadletter": 1}


def test_a_partly_claimed_message_lists_its_missing_indices() -> None:
    result = reconcile(MSGS, {"reports": [cov("otlp/0", (0, 0), (2, 2)),
                                          cov("otlp/0@1:3", (0, 0), (2, 2))]})
    assert not result.ok
    assert result.missing == {"otlp/0@1:3": [[1, 1]]}
    assert result.raw_records == 5


def test_an_unread_message_is_one_missing_record() -> None:
    result = reconcile(MSGS, {"reports": [cov("otlp/0", (0, 0))]})
    assert result.missing == {"otlp/0": [[1, 2]]}
    assert result.raw_records == 3  # N is unknown until a worker read the message


def test_a_record_claimed_twice_and_a_message_claimed_whole_and_by_record() -> None:
    twice = reconcile(MSGS, {"reports": [cov("otlp/0", (0, 0), (2, 2)),
                                         cov("otlp/0@1:3", (0, 2))],
                             "deadletter": [cov("otlp/0@1:3", (1, 1))]})
    assert twice.double_counted == {"otlp/0@1:3": [[1, 1]]}
    both = reconcile(MSGS, {"reports": [cov("otlp/0", (0, 2)), cov("otlp/0@1:3", (0, 2))]})
    assert both.double_counted == {"otlp/0": [[1, 1]]}
    assert not both.foreign


def test_indices_outside_the_message_or_messages_outside_raw_are_foreign() -> None:
    result = reconcile(MSGS, {"reports": [cov("otlp/0", (0, 0), (2, 2)),
                                          cov("otlp/0@1:3", (0, 3)), cov("otlp/0@9:2", (0, 1))]})
    assert result.foreign == {"otlp/0@1:3": [[3, 3]], "otlp/0@9:2": [[0, 1]]}
    assert result.ok  # every raw record claimed once; the extra claims are reported apart


def test_a_missing_or_empty_input_is_never_ok() -> None:
    result = reconcile(RAW, {"reports": [RAW]},
                       problems=["input topic app-logs holds no records"])
    assert not result.ok and not result.missing
    assert result.to_json()["problems"] == ["input topic app-logs holds no records"]
