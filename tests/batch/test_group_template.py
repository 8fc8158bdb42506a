"""A group's template: one template id can hold texts from before and after its drain3
cluster generalised; the batch (and so the fragment's evidence) shows the general one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from streams.batch.answers import place_fragments, validate_answer
from streams.batch.window import Batch, TokenWindow, build_batch, group_template
from streams.records import NormalizedRecord

from helpers import WordCounter, iso_z, make_record

ROOT_T = "Failed password for root from <IP> port <NUM> ssh2"
ANY_T = "Failed password for <*> from <IP> port <NUM> ssh2"
OTHER_T = "Failed <*> for root from <IP> port <NUM> ssh2"  # covers not ANY_T, nor it this


def auth(offset: int, template: str, user: str = "root", *, seconds: float | None = None,
         partition: int = 0) -> NormalizedRecord:
    """A failed login of ``user``, its template as the miner gave it then (one birth id)."""
    return make_record(offset, message=f"Failed password for {user} from 10.0.0.9 port 22 ssh2",
                       service="sshd", template_id="t-birth", template=template, level="ERROR",
                       seconds=seconds, partition=partition, topic="raw")


def batch_of(records: list[NormalizedRecord]) -> Batch:
    return build_batch(records, lane="fast", counter=WordCounter(), max_example_tokens=None,
                       trigger="wait")


def test_the_group_shows_the_template_that_covers_the_others() -> None:
    early = [auth(o, ROOT_T) for o in range(3)]  # before the miner met a second user
    late = [auth(o, ANY_T, user) for o, user in ((3, "admin"), (4, "root"))]
    (group,) = batch_of([*early, *late]).groups
    assert group.template == ANY_T and group.count == 5
    # time order is not offset order: the general text still wins, not the earliest record's
    shuffled = [auth(0, ANY_T, "admin", seconds=50), auth(1, ROOT_T, seconds=10)]
    assert batch_of(shuffled).groups[0].template == ANY_T
    assert group_template(shuffled) == group_template(list(reversed(shuffled))) == ANY_T


def test_without_a_covering_text_the_latest_record_by_offset_names_the_group() -> None:
    # two processes gave one birth id to clusters that generalised apart
    records = [auth(5, ANY_T, seconds=1), auth(9, OTHER_T, seconds=0), auth(7, ROOT_T)]
    assert group_template(records) == OTHER_T
    assert batch_of(records).groups[0].template == OTHER_T


def test_fragment_evidence_carries_the_general_template_and_counts_every_record() -> None:
    records = [auth(0, ROOT_T), auth(1, ROOT_T), auth(2, ANY_T, "bob"), auth(3, ANY_T, "eve")]
    batch = batch_of(records)
    answer = {"fragments": [{"refs": [g.ref for g in batch.groups], "service": "sshd",
                             "event": "Authentication failures", "cause": "Guessing",
                             "suggestion": "Block", "severity": "high"}]}
    (fragment,) = validate_answer(batch, answer, model="m", prompt_version="v1")
    (evidence,) = fragment.evidence
    assert (evidence.template, evidence.count) == (ANY_T, 4)
    assert evidence.entities == {"user root": 2, "ip 10.0.0.9": 4, "user bob": 1,
                                 "user eve": 1}


def test_a_fragment_cut_between_reports_counts_entities_of_older_texts_too() -> None:
    day = datetime(2026, 3, 30, 23, 59, tzinfo=UTC)
    records = [
        auth(0, ROOT_T).model_copy(update={"timestamp": iso_z(day)}),
        auth(1, ROOT_T).model_copy(update={"timestamp": iso_z(day + timedelta(minutes=2))}),
        auth(2, ANY_T, "bob").model_copy(update={"timestamp": iso_z(day + timedelta(minutes=3))}),
    ]
    batch = batch_of(records)
    answer = {"fragments": [{"refs": [g.ref for g in batch.groups], "service": "sshd",
                             "event": "Authentication failures", "cause": "Guessing",
                             "suggestion": "Block", "severity": "high"}]}
    found = validate_answer(batch, answer, model="m", prompt_version="v1")
    parts = place_fragments(found, batch.by_coord(), lambda r: (r.timestamp or "")[:10])
    by_day = {f.report_id: f.evidence[0] for f in parts}
    assert set(by_day) == {"2026-03-30", "2026-03-31"}
    # the next day's share holds one record of the narrow text: its entities are still there
    assert by_day["2026-03-31"].template == ANY_T
    assert by_day["2026-03-31"].entities == {"ip 10.0.0.9": 2, "user bob": 1, "user root": 1}
    assert by_day["2026-03-30"].entities == {"ip 10.0.0.9": 1, "user root": 1}


class CharCounter:
    """One token per character: "<*>" costs more than a two-letter user name."""

    def count(self, text: str) -> int:
        return len(text)

    def truncate(self, text: str, max_tokens: int) -> tuple[str, int]:
        return text[:max_tokens], max(0, len(text) - max_tokens)


def test_the_window_estimate_bounds_a_group_whose_text_changed() -> None:
    """The window's running estimate stays an upper bound of what it flushes when a later
    record of the same template id brings a costlier (more general) text."""
    narrow = ANY_T.replace("<*>", "al")
    w = TokenWindow(lane="fast", input_budget=100_000, context_window=200_000,
                    output_reserve=0.3, max_records=500, max_wait_seconds=2.0,
                    counter=CharCounter())
    w.add(auth(0, narrow, "al"))
    w.add(auth(1, ANY_T, "al"))  # the same message: only the template's cost can grow
    estimate = w.estimated_tokens
    batch = w.flush("drain")
    assert batch is not None and batch.groups[0].template == ANY_T
    assert estimate >= batch.estimated_input_tokens
