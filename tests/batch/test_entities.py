"""Entities (addresses, users, hosts, pods) counted over all of a template's records."""

from __future__ import annotations

from streams.batch.answers import validate_answer
from streams.batch.entities import count_entities, top_entities, worth_counting
from streams.batch.window import build_batch
from streams.records import Evidence
from streams.report.state.merge import merge

from helpers import WordCounter, make_fragment, make_record

AUTH = "Failed password for <*> from <*> port <*> ssh2"


def _auth_lines() -> list[str]:
    lines = [f"Failed password for root from 203.0.113.9 port {4000 + i} ssh2"
             for i in range(580)]
    lines += [f"Failed password for invalid user admin from 198.51.100.{i % 7} port 22 ssh2"
              for i in range(20)]
    return lines


def test_counts_each_kind_and_skips_loopback_and_redacted_values() -> None:
    counts = count_entities([
        "accepted from 10.1.2.3 user=alice host=db-1", "from 127.0.0.1 user=[REDACTED:x]",
        "pod api-7d9f8c6b5d-x2x9q restarted", "again 10.1.2.3"])
    assert counts == {"ip 10.1.2.3": 2, "user alice": 1, "host db-1": 1,
                      "pod api-7d9f8c6b5d-x2x9q": 1}
    assert list(top_entities({"b": 2, "a": 2, "c": 5}, limit=2)) == ["c", "a"]


def test_texts_repeated_unequally_count_as_one_scan_of_each_text_would() -> None:
    texts = (["user=alice from 10.0.0.7", "host=db-1 user=bob"] * 3
             + ["for invalid user eve from 10.0.0.7 port 22", "user=alice"]
             + ["multi\nline user=alice\nhost=db-1"] * 2)
    assert count_entities(texts) == {"ip 10.0.0.7": 4, "user alice": 6, "host db-1": 5,
                                     "user bob": 3, "user eve": 1}


def test_counted_on_errors_and_security_events_only() -> None:
    assert worth_counting("high", "Disk full")
    assert worth_counting("low", "Authentication failures", "invalid user")
    assert not worth_counting("info", "Routine activity", "requests served")


def test_a_fragment_counts_entities_over_every_record_not_the_examples() -> None:
    """SSH logs: 'Authentication failures (1,477 records)' is right but not actionable
    without the one address that sent most of them."""
    records = [make_record(i, message=m, service="sshd", template_id="auth", template=AUTH)
               for i, m in enumerate(_auth_lines())]
    batch = build_batch(records, lane="fast", counter=WordCounter(), max_example_tokens=None,
                        trigger="wait")
    ref = batch.groups[0].ref
    answer = {"fragments": [{"refs": [ref], "service": "sshd", "severity": "medium",
                             "event": "Authentication failures", "cause": "password guessing",
                             "suggestion": "block the source"}]}
    (fragment,) = validate_answer(batch, answer, model="m", prompt_version="v1")
    (evidence,) = fragment.evidence
    assert len(evidence.examples) <= 3
    assert evidence.entities["ip 203.0.113.9"] == 580
    assert evidence.entities["user root"] == 580
    assert evidence.entities["user admin"] == 20


def test_merge_sums_new_records_entities_and_a_replay_adds_none() -> None:
    def frag(fid: str, covered: list[list[int]], ip_count: int):
        ev = Evidence(template=AUTH, count=covered[0][1] - covered[0][0] + 1, examples=["x"],
                      covered={"raw/0": covered}, entities={"ip 203.0.113.9": ip_count})
        return make_fragment(fid, {"raw/0": covered}, evidence=[ev])

    report, _ = merge(None, frag("a", [[0, 99]], 90), report_id="2026-11-29/all", now="t1")
    report, _ = merge(report, frag("b", [[100, 199]], 50), report_id="2026-11-29/all", now="t2")
    report, _ = merge(report, frag("b", [[100, 199]], 50), report_id="2026-11-29/all", now="t3")
    (incident,) = report.incidents
    assert incident.evidence[0].entities == {"ip 203.0.113.9": 140}
    # half of this fragment is already in the report: its counts are scaled to the new half
    report, _ = merge(report, frag("c", [[150, 249]], 100), report_id="2026-11-29/all",
                      now="t4")
    assert report.incidents[0].evidence[0].entities == {"ip 203.0.113.9": 190}
