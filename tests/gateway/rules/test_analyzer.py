"""The offline rules analyzer: contract (every ref once), determinism, and real signals."""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.batch.prompt import embed_payload
from streams.gateway.rules.analyzer import SEVERITIES, analyze, analyze_messages

from helpers import SHARED_DATA

NPE_TRACE = (
    "Failed to process request /orders/42\n"
    'java.lang.NullPointerException: Cannot invoke "Order.getId()" because "order" is null\n'
    "\tat com.acme.orders.OrderService.load(OrderService.java:87)\n"
    "\tat com.acme.orders.OrderController.get(OrderController.java:31)\n"
    "\tat sun.reflect.GeneratedMethodAccessor12.invoke(Unknown Source)"
)
KAFKA_NOT_LEADER = (
    "[2016-12-19 20:41:02,118] ERROR [ReplicaFetcherThread-0-1], Error for partition "
    "[__consumer_offsets,7] to broker 1:org.apache.kafka.common.errors."
    "NotLeaderForPartitionException: This server is not the leader for that topic-partition. "
    "(kafka.server.ReplicaFetcherThread)"
)


def group(ref: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "ref": ref,
        "service": "orders",
        "level": "INFO",
        "template": "Request served in <*> ms",
        "count": 1,
        "first_seen": "2026-01-02T03:04:05.000Z",
        "last_seen": "2026-01-02T03:04:09.000Z",
        "examples": [],
        "truncated": False,
    }
    base.update(fields)
    return base


def payload(*groups: dict[str, Any], detail: str = "brief") -> dict[str, Any]:
    return {"lane": "fast", "detail": detail, "groups": list(groups)}


def refs_of(answer: dict[str, Any]) -> list[Any]:
    return [ref for fragment in answer["fragments"] for ref in fragment["refs"]]


def fragment_with(answer: dict[str, Any], ref: str) -> dict[str, Any]:
    (found,) = [f for f in answer["fragments"] if ref in f["refs"]]
    return found


# --- contract -----------------------------------------------------------------------

_words = st.sampled_from(
    [
        "Connection refused",
        "timed out",
        "OutOfMemoryError",
        "user <*> logged in",
        "Order not found",
        "NotLeaderForPartitionException",
        "status: 503",
        "java.lang.IllegalStateException: boom",
        "\tat a.b.C.d(C.java:1)",
        "No space left on device",
        "heartbeat ok",
        "<*>",
        "",
    ]
)
_text = st.lists(st.one_of(_words, st.text(max_size=30)), max_size=4).map(" ".join)
_group = st.fixed_dictionaries(
    {
        "service": st.one_of(st.none(), st.sampled_from(["api", "db", "kafka", "hdfs"])),
        "level": st.one_of(
            st.none(),
            st.sampled_from(["TRACE", "DEBUG", "INFO", "NOTICE", "WARN", "ERROR", "FATAL"]),
            st.sampled_from(["warning", "severe", "bogus"]),
        ),
        "template": _text,
        "count": st.integers(min_value=0, max_value=10_000),
        "examples": st.lists(_text, max_size=3),
        "first_seen": st.one_of(st.none(), st.just("2026-01-02T03:04:05.000Z")),
    }
)


@settings(max_examples=150, deadline=None)
@given(groups=st.lists(_group, max_size=25), detail=st.sampled_from(["brief", "detailed"]))
def test_every_ref_lands_in_exactly_one_fragment(groups: list[dict[str, Any]], detail: str) -> None:
    raw = payload(*[dict(g, ref=f"g{i + 1}") for i, g in enumerate(groups)], detail=detail)
    answer = analyze(copy.deepcopy(raw))

    assert Counter(refs_of(answer)) == Counter(g["ref"] for g in raw["groups"])
    for fragment in answer["fragments"]:
        assert fragment["refs"], "no empty fragments"
        assert fragment["severity"] in SEVERITIES
        for key in ("service", "event", "cause", "suggestion"):
            assert isinstance(fragment[key], str) and fragment[key].strip()
    assert analyze(copy.deepcopy(raw)) == answer  # deterministic
    json.dumps(answer)  # serialisable as a model answer


def test_sloppy_groups_are_skipped_and_duplicate_refs_kept_once() -> None:
    raw = {
        "groups": [
            group("g1"),
            "not a group",
            {"template": "no ref"},
            group("g1", level="ERROR"),
            group("g2", count="many", examples="oops", level=7),
        ]
    }
    assert sorted(refs_of(analyze(raw))) == ["g1", "g2"]
    assert analyze({}) == {"fragments": []}


def test_same_payload_gives_same_answer_and_stable_order() -> None:
    raw = payload(
        group("g1", level="ERROR", template="Connection refused to db:5432"),
        group("g2", level="WARN", template="Slow ReadProcessor read fields took 120ms"),
        group("g3"),
        group("g4", service="api", level="ERROR", examples=[NPE_TRACE]),
    )
    first = analyze(copy.deepcopy(raw))
    assert analyze(copy.deepcopy(raw)) == first
    ranks = [SEVERITIES.index(f["severity"]) for f in first["fragments"]]
    assert ranks == sorted(ranks, reverse=True)


# --- signals -------------------------------------------------------------------------


def test_java_exception_names_class_and_top_frame() -> None:
    raw = payload(
        group("g1", level="ERROR", template="Failed to process request <*>", examples=[NPE_TRACE])
    )
    fragment = fragment_with(analyze(raw), "g1")
    assert "java.lang.NullPointerException" in fragment["cause"]
    assert "com.acme.orders.OrderService.load(OrderService.java:87)" in fragment["cause"]
    assert "NullPointerException" in fragment["event"]
    assert fragment["severity"] in ("medium", "high", "critical")


def test_other_exceptions_are_keyed_by_class() -> None:
    ise = NPE_TRACE.replace("NullPointerException", "IllegalStateException")
    raw = payload(
        group("g1", level="ERROR", template="a <*>", examples=[NPE_TRACE]),
        group("g2", level="ERROR", template="b <*>", examples=[ise]),
        group("g3", level="ERROR", template="c <*>", examples=[NPE_TRACE]),
    )
    answer = analyze(raw)
    assert fragment_with(answer, "g1") is fragment_with(answer, "g3")
    assert fragment_with(answer, "g2")["refs"] == ["g2"]
    assert "java.lang.IllegalStateException" in fragment_with(answer, "g2")["cause"]


def test_python_traceback_gives_innermost_frame() -> None:
    trace = (
        "Traceback (most recent call last):\n"
        '  File "app/main.py", line 10, in handle\n'
        '  File "app/db.py", line 99, in fetch\n'
        "KeyError: 'user'"
    )
    fragment = analyze(payload(group("g1", level="ERROR", template="x", examples=[trace])))[
        "fragments"
    ][0]
    assert "KeyError" in fragment["cause"]
    assert "fetch (app/db.py:99)" in fragment["cause"]


def test_kafka_not_leader_maps_to_the_leadership_rule() -> None:
    raw = payload(
        group(
            "g1",
            service="kafka",
            level="ERROR",
            template=re.sub(r"\d+", "<*>", KAFKA_NOT_LEADER),
            count=7,
            examples=[KAFKA_NOT_LEADER],
        )
    )
    fragment = fragment_with(analyze(raw), "g1")
    assert fragment["event"] == "Partition leadership moved"
    assert fragment["severity"] == "high"
    assert "NotLeaderForPartitionException" in fragment["cause"]
    assert "not the leader for that topic-partition" in fragment["cause"]


def test_routine_info_groups_fold_into_one_fragment_per_service() -> None:
    raw = payload(
        group("g1", template="Rolled new log segment for <*>"),
        group("g2", level="DEBUG", template="Heartbeat from <*>"),
        group("g3", service="db", template="Checkpoint complete"),
        group("g4", level=None, template="Request served in <*> ms"),
        group("g5", service="db", template="Vacuum finished"),
        group("g6", level="ERROR", template="Connection refused to <*>"),
    )
    answer = analyze(raw)
    routine = [f for f in answer["fragments"] if f["event"] == "Routine activity"]
    assert {f["service"]: f["refs"] for f in routine} == {
        "orders": ["g1", "g2", "g4"],
        "db": ["g3", "g5"],
    }
    assert all(f["severity"] == "info" for f in routine)
    assert fragment_with(answer, "g6")["event"] == "Connection failures"


def test_unmatched_warn_and_error_get_a_fragment_per_template() -> None:
    raw = payload(
        group("g1", level="WARN", template="Frobnicator is grumpy"),
        group("g2", level="ERROR", template="Widget count drifted"),
        group("g3", level="INFO", template="Sync step failed, will retry"),
    )
    answer = analyze(raw)
    warn, err, info = (fragment_with(answer, r) for r in ("g1", "g2", "g3"))
    assert warn["cause"].startswith("unclassified WARN events: Frobnicator is grumpy")
    assert warn["severity"] == "low"
    assert err["cause"].startswith("unclassified ERROR events: Widget count drifted")
    assert err["severity"] == "medium"
    assert info["event"] != "Routine activity"  # an error signal keeps it out of routine


def test_severity_escalates_with_levels_and_error_volume() -> None:
    base = {"template": "Connection reset by peer", "service": "orders"}  # rule severity: medium
    few = fragment_with(analyze(payload(group("g1", level="WARN", count=3, **base))), "g1")
    heavy = fragment_with(analyze(payload(group("g1", level="ERROR", count=5000, **base))), "g1")
    fatal = fragment_with(analyze(payload(group("g1", level="FATAL", count=1, **base))), "g1")
    assert few["severity"] == "medium"
    assert heavy["severity"] == "high"
    assert fatal["severity"] == "high"


def test_detailed_payload_adds_evidence() -> None:
    groups = [
        group("g1", level="ERROR", template="Failed <*>", count=3, examples=[NPE_TRACE]),
        group("g2", level="ERROR", template="Failed again <*>", count=9, examples=[NPE_TRACE]),
    ]
    brief = analyze(payload(*copy.deepcopy(groups)))["fragments"][0]["cause"]
    detailed = analyze(payload(*copy.deepcopy(groups), detail="detailed"))["fragments"][0]["cause"]
    assert len(detailed) > len(brief)
    assert "'Failed again <*>'" in detailed
    assert " x9" not in detailed  # batch counts would mislead once merged into a report
    assert "com.acme.orders.OrderController.get(OrderController.java:31)" in detailed
    assert "2026-01-02T03:04:05.000Z" in detailed


def test_http_statuses_are_counted_from_examples() -> None:
    line = '10.0.0.1 "GET /v2/servers HTTP/1.1" status: {} len: 10 time: 0.1'
    raw = payload(
        group("g1", template="<*> status: <*>", examples=[line.format(503), line.format(500)])
    )
    fragment = fragment_with(analyze(raw), "g1")
    assert fragment["event"] == "HTTP 5xx server errors"
    assert "500 x1" in fragment["cause"] and "503 x1" in fragment["cause"]


def test_subject_of_a_rule_is_quoted_in_the_event() -> None:
    line = (
        "Request processing failed; nested exception is java.lang.IllegalStateException: "
        "No instances available for ts-seat-service] with root cause"
    )
    fragment = analyze(payload(group("g1", level="ERROR", template=line)))["fragments"][0]
    assert fragment["event"].endswith("(ts-seat-service)")
    assert "java.lang.IllegalStateException" in fragment["cause"]


def test_analyze_messages_reads_the_embedded_payload() -> None:
    raw = payload(group("g1", level="ERROR", template="Connection refused"))
    messages = [
        {"role": "system", "content": "You are a log analyst."},
        {"role": "user", "content": embed_payload("Analyse these groups.", raw)},
    ]
    assert analyze_messages(messages) == analyze(copy.deepcopy(raw))


# --- rule coverage on real logs -----------------------------------------------------

_LEVEL = re.compile(r"\b(TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|FATAL|notice|error)\b")
_MASK = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-f]{8,}\b|\d+")
_CONTINUATION = re.compile(r"^(?:\s|Caused by|[\w.$]+(?:Exception|Error)\b)")


def _records(path: Path) -> list[str]:
    """Messages of a real file; Java stack lines are joined to the line they belong to."""
    lines = path.read_text(errors="replace").splitlines()
    if path.name.endswith(".docker-json.log"):
        out = []
        for line in lines:
            try:
                out.append(json.loads(line)["log"].rstrip("\n"))
            except (ValueError, KeyError):
                continue
        return out
    records: list[str] = []
    for line in lines:
        if records and _CONTINUATION.match(line):
            records[-1] += "\n" + line
        else:
            records.append(line)
    return records


def real_payload(path: Path, service: str) -> dict[str, Any]:
    """One group per (level, first 60 masked chars), two examples each."""
    groups: dict[tuple[str | None, str], dict[str, Any]] = {}
    for record in _records(path):
        first = record.split("\n", 1)[0]
        match = _LEVEL.search(first)
        level = match.group(1).upper() if match else None
        message = re.sub(r"TraceID: \S+ SpanID: \S+ ", "", first[match.end() :] if match else first)
        key = (level, _MASK.sub("#", message).strip()[:60])
        entry = groups.setdefault(
            key,
            {
                "ref": f"g{len(groups) + 1}",
                "service": service,
                "level": level,
                "template": _MASK.sub("<*>", message).strip(),
                "count": 0,
                "examples": [],
            },
        )
        entry["count"] += 1
        if len(entry["examples"]) < 2:
            entry["examples"].append(record)
    return payload(*groups.values())


def _real_files() -> list[Path]:
    return sorted(
        [
            *SHARED_DATA.glob("kafka-broker-incident/*.log"),
            *SHARED_DATA.glob("nezha-trainticket/*.docker-json.log"),
            *SHARED_DATA.glob("loghub/*/*_2k.log"),
        ]
    )


def _answer(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    raw = real_payload(path, path.name.split("_")[0].split("-")[0])
    return raw, analyze(copy.deepcopy(raw))


@pytest.mark.parametrize("path", _real_files() or [None], ids=lambda p: p.name if p else "none")
def test_real_logs_are_mostly_classified(path: Path | None) -> None:
    if path is None:
        pytest.skip("no real logs under shared/data")
    raw, answer = _answer(path)
    counts = {g["ref"]: g["count"] for g in raw["groups"]}
    assert Counter(refs_of(answer)) == Counter(counts.keys())
    unclassified = sum(
        counts[r]
        for f in answer["fragments"]
        if f["event"].startswith("Unclassified")
        for r in f["refs"]
    )
    # Not 5%: a bound that tight is only met by rules written for each file. The
    # post-mortem judges unclassified templates by anomaly, so a share of them is fine.
    assert unclassified <= 0.15 * sum(counts.values()), path.name


def _events(name: str) -> dict[str, str]:
    files = [p for p in _real_files() if name in p.name]
    if not files:
        pytest.skip(f"{name} logs are not under shared/data")
    events: dict[str, str] = {}
    for path in files:
        for fragment in _answer(path)[1]["fragments"]:
            events[fragment["event"]] = fragment["severity"]
    return events


def test_kafka_incident_logs_yield_the_broker_incident() -> None:
    events = _events("server.log")
    assert events["Partition leadership moved"] == "high"
    assert events["Replica fetcher cannot fetch from the leader"] == "high"
    assert "Broker ZooKeeper session expired; broker re-registered" in events
    assert "Follower logs truncated after a leadership change" in events


def test_trainticket_logs_yield_the_service_discovery_incident() -> None:
    """A general rule (service discovery) finds it; the benchmark's own business messages
    (orders, seats, prices) have no rules: rules must not be written for one dataset."""
    events = _events("trainticket")
    key = "Service discovery: no instances of a downstream service (ts-seat-service)"
    assert events[key] == "high"
    assert not any("Order" in event for event in events)


# lines a rule matches, written here so the prefilter check runs without ../shared/data
PREFILTER_PIECES = (
    NPE_TRACE,
    KAFKA_NOT_LEADER,
    "kernel panic - not syncing: Fatal exception",
    "Connection is not available, request timed out after 30000ms",
    "deploy v1.42.0 started",
    "rollback v1.42.0 -> v1.41.3",
    "why was I charged twice?",
    "LOOKING",
    "Connection request from old client /10.0.0.1:2181; will be dropped",
    "java.lang.OutOfMemoryError: Java heap space",
    "write failed: No space left on device",
    "[Partition t-0 broker=1] Shrinking ISR from 1,2,3 to 1",
    "Expiring session 0x15a, timeout of 30000ms exceeded",
    "PacketResponder 2 for block blk_-160 Interrupted.",
    "Failed password for invalid user admin from 10.0.0.9 port 22 ssh2",
    "java.net.ConnectException: Connection refused (Connection refused)",
    "upstream: HTTP/1.1\" 503 Service Unavailable",
    "No instances available for ts-seat-service",
    "SSLHandshakeException: PKIX path building failed",
    "eth0: e1000_watchdog: NIC Link is Up 1000 Mbps Full Duplex",
    "AirPort: Link Down on en0",
    "probe of vesafb0 failed with error -6",
    "stat=Deferred: Connection refused by [127.0.0.1]",
    "Failed to connect (view) outlet from (NSApplication) to (NSView)",
    "Connection to node 2 was disconnected before the response was read",
)


def _assert_prefilter_keeps_matches(pieces: list[str]) -> int:
    """Every piece a rule's regex matches contains one of that rule's literals."""
    from streams.gateway.rules.analyzer import _rules

    checked = 0
    for rule, needles in _rules():
        if needles is None:
            continue
        for piece in pieces:
            if rule.pattern.search(piece):
                checked += 1
                assert any(n in piece.lower() for n in needles), (rule.name, piece[:120])
    return checked


def test_literal_prefilter_never_hides_a_match() -> None:
    """The analyzer skips a rule's regex when none of its required literals occurs."""
    # most pieces match some rule (14 rule/piece pairs today), so the check is not vacuous
    assert _assert_prefilter_keeps_matches(list(PREFILTER_PIECES)) >= 12


def test_literal_prefilter_never_hides_a_match_on_real_logs() -> None:
    files = _real_files()
    if not files:
        pytest.skip("no real logs under shared/data")
    pieces: list[str] = []
    for path in files:
        for group_ in real_payload(path, "x")["groups"][:150]:
            pieces += [group_["template"], *group_["examples"][:1]]
    assert _assert_prefilter_keeps_matches(pieces) > 5


def _first_rule_over_the_group(pieces: tuple[str, ...]) -> tuple[str, str | None] | None:
    """The rule loop as it ran before each line's first rule was remembered: rules
    first, then lines; the first affirmed match wins."""
    from streams.gateway.rules.analyzer import _rules
    from streams.gateway.rules.language import affirmed

    for rule, _needles in _rules():
        for piece in pieces:
            match = affirmed(rule.pattern, piece, rule.sense)
            if match:
                return rule.name, match.groupdict().get("subject")
    return None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PREFILTER_PIECES) | st.text(max_size=30)
                | st.sampled_from(PREFILTER_PIECES).map(lambda p: p + " " + "x" * 2048),
                min_size=1, max_size=4))
def test_a_group_gets_the_first_rule_any_of_its_lines_asserts(pieces: list[str]) -> None:
    """Lines' own first rules, remembered, give the rule a rule-by-rule scan gives, and
    the subject of the first line asserting it."""
    from streams.gateway.rules.analyzer import _classify, _Group

    group_ = _Group(index=0, ref="g1", service="s", level="ERROR", template=pieces[0], count=1,
                    examples=tuple(pieces[1:]), first_seen=None, last_seen=None)
    expected = _first_rule_over_the_group(tuple(pieces))
    for _ in range(2):  # worked out, then remembered
        _signature, rule, subject = _classify(group_)
        if expected is None:
            assert rule is None
        else:
            assert rule is not None and (rule.name, subject) == expected


# --- roll-up payloads (streams/report/analysis/rollup.py) --------------------------------------


def rollup(**incident: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "key": "k1",
        "event": "Disk full on datanode",
        "cause": "No space left on /data.",
        "severity": "high",
        "services": ["hdfs", "yarn"],
        "count": 1234,
        "first_seen": "2026-11-29T10:00:00.000Z",
        "last_seen": "2026-11-29T11:30:00.000Z",
        "templates": [{"template": "No space left on <*>", "count": 1200, "examples": []}],
        "suggestions": ["Free disk space on the datanodes", "Add disk alerts"],
    }
    base.update(incident)
    return {"kind": "rollup", "report": "2026-11-29/all", "incident": base}


def test_a_rollup_payload_gets_a_deterministic_summary_of_the_incident() -> None:
    answer = analyze(rollup())
    assert set(answer) == {"summary"}
    summary = answer["summary"]
    assert summary == analyze(copy.deepcopy(rollup()))["summary"]
    assert summary.startswith("Disk full on datanode (high severity): 1,234 log records")
    assert "hdfs, yarn" in summary
    assert "between 2026-11-29T10:00:00.000Z and 2026-11-29T11:30:00.000Z" in summary
    assert "Likely cause: No space left on /data." in summary  # one period, not two
    assert "Next step: Free disk space on the datanodes." in summary
    assert "Add disk alerts" not in summary  # the top suggestion only
    assert 2 <= summary.count(". ") + 1 <= 4
    # through a chat prompt, like every backend reads it
    messages = [{"role": "user", "content": embed_payload("Summarise.", rollup())}]
    assert analyze_messages(messages) == answer


def test_rollup_summaries_follow_the_incident_fields() -> None:
    one = analyze(rollup(count=1, services=[], first_seen=None, last_seen=None))["summary"]
    assert "1 log record." in one and "between" not in one and " from " not in one
    other = analyze(rollup(event="Broker down", count=7))["summary"]
    assert other.startswith("Broker down") and "7 log records" in other
    no_tip = analyze(rollup(suggestions=[]))["summary"]
    assert "Next step: review the log evidence" in no_tip and "No space left on <*>" in no_tip


@pytest.mark.parametrize(
    "sloppy",
    [
        {"kind": "rollup"},
        {"kind": "rollup", "incident": "not an object"},
        rollup(event=None, count="many", services="hdfs", suggestions=[3, None], templates=[1]),
    ],
)
def test_a_sloppy_rollup_payload_still_gets_a_summary(sloppy: dict[str, Any]) -> None:
    summary = analyze(sloppy)["summary"]
    assert summary.startswith("An unnamed incident") and summary.endswith(".")
    assert "unknown number of log records" in summary and " from " not in summary


def test_a_java_trace_tail_is_not_a_kernel_register_dump() -> None:
    """'... 12 more' closes many Java traces; it is no kernel failure."""
    trace = ("java.lang.NullPointerException: stock is null\n"
             "\tat com.shop.inventory.StockService.reserve(StockService.java:88)\n\t... 12 more")
    answer = analyze(payload(group("g1", level="ERROR", template="Reservation failed <*>",
                                   examples=[trace])))
    assert all("Kernel" not in f["event"] for f in answer["fragments"])
    panic = analyze(payload(group("g1", level="FATAL", template="Kernel panic - not syncing",
                                  examples=["Kernel panic - not syncing: Fatal exception"])))
    assert any("Kernel" in f["event"] for f in panic["fragments"])


@pytest.mark.parametrize(
    ("level", "line", "event"),
    [
        ("INFO", "deploy of checkout v2.3.0 completed", "Deploy"),
        ("WARN", "rolling back checkout to v2.2.9", "Rollback"),
        ("INFO", "configuration reloaded from /etc/app.yaml", "Configuration change"),
        ("INFO", "scaled out: replicas 3 -> 6", "Scaling"),
        ("WARN", "[FIRING:1] HighErrorRate alert firing for api", "Alert fired"),
        ("ERROR", "Timeout waiting for connection from pool", "Connection pool exhausted"),
        ("WARN", "Back-off restarting failed container api in pod api-7d9f", "Crash loop"),
        ("INFO", "why was I charged twice for one order?", "Users report problems"),
        # a failure line that mentions a deploy is a failure, not a change
        ("ERROR", "deploy hook timed out after 30s", "Timeouts"),
        # "I/O" is no person speaking
        ("ERROR", "I/O error on device sda", "Unclassified ERROR events"),
    ],
)
def test_general_failure_modes_and_change_events(level: str, line: str, event: str) -> None:
    answer = analyze(payload(group("g1", level=level, template=line, examples=[line])))
    assert fragment_with(answer, "g1")["event"].startswith(event)


# --- language: what a line says, not which words it holds --------------------------------


@pytest.mark.parametrize(
    ("level", "says", "similar", "event"),
    [
        # a negated change is no change
        ("INFO", "configuration reloaded from /etc/app.yaml",
         "[ib_sm_sweep.c:1482]: No configuration change required", "Configuration change"),
        ("INFO", "configuration reloaded from /etc/app.yaml",
         "configuration change required before the next upgrade", "Configuration change"),
        # a failure that ended well is no failure
        ("WARN", "Connection refused by db:5432",
         "reconnect to db:5432 succeeded after Connection refused", "Connection failures"),
        ("WARN", "Connection reset by peer", "Connection reset by peer; connection restored",
         "Connections dropped"),
        # a network link coming up is no restart; the same words of a process are
        ("INFO", "broker 2 restarted", "eth0: e1000_watchdog: NIC Link is Up 1000 Mbps Full Duplex",
         "Restarts"),
        # a session its user closed is routine; a connection lost under a call is a drop
        ("WARN", "Connection to node 2 was disconnected before the response was read",
         "Received disconnect from 10.0.0.9: 11: disconnected by user", "Connections dropped"),
        ("WARN", "peer 10.0.0.9 disconnected unexpectedly", "client 10.0.0.9 disconnected",
         "Connections dropped"),
        # a device or a callback named after a disconnect is no connection drop
        ("WARN", "peer 10.0.0.9 disconnected unexpectedly",
         "[BluetoothHIDDeviceController] EventServiceDisconnectedCallback", "Connections dropped"),
        # "connect" of a UI binding is no network connection
        ("ERROR", "Failed to connect to 10.0.0.5:5432",
         "Failed to connect (titleField) outlet from (RowView) to (NSTextField): missing setter",
         "Connection failures"),
        # a mail server's deferral is a queued retry, not a failed connection
        ("INFO", "connect to 127.0.0.1:25: Connection refused",
         "jA9J1UvC004306: to=root, mailer=relay, relay=[127.0.0.1], dsn=4.0.0, "
         "stat=Deferred: Connection refused by [127.0.0.1]", "Connection failures"),
        # a keyword inside a setting's name reports nothing
        ("WARN", "java.net.SocketTimeoutException: Read timed out",
         "consumer settings: socketTimeoutMs=30000 maxPollRecords=500", "Timeouts"),
        ("INFO", "java.lang.OutOfMemoryError: Java heap space",
         "jvm args: -Xmx1g -XX:+HeapDumpOnOutOfMemoryError", "Memory exhausted"),
        # a kernel driver probe at boot is no health probe of a service
        ("WARN", "health probe of web1 failed: Connection refused",
         "probe of vesafb0 failed with error -6", "Connection failures"),
    ],
)
def test_a_line_is_read_for_what_it_says(level: str, says: str, similar: str, event: str) -> None:
    """This line says ``event``; the similar one shares its words but does not."""
    answer = analyze(payload(group("g1", level=level, template=says, examples=[says]),
                             group("g2", level=level, template=similar, examples=[similar])))
    assert fragment_with(answer, "g1")["event"].startswith(event), says
    assert not fragment_with(answer, "g2")["event"].startswith(event), similar


@pytest.mark.parametrize(
    ("line", "event", "severity"),
    [
        ("eth0: e1000_watchdog: NIC Link is Up 1000 Mbps Full Duplex", "Network link up", "info"),
        ("AirPort: Link Down on en0. Reason 8 (Disassociated)", "Network link down", "low"),
        ("probe of vesafb0 failed with error -6", "Device probes failed", "low"),
        ("Wait for ready failed before probe !", "Device probes failed", "low"),
        ("to=root, relay=[127.0.0.1], stat=Deferred: Connection refused by [127.0.0.1]",
         "Mail delivery deferred", "low"),
        ("postfix/smtp: to=<a@b.c>, status=deferred (connect to mx.b.c[1.2.3.4]:25: timed out)",
         "Mail delivery deferred", "low"),
        ("Failed to connect (view) outlet from (NSApplication) to (NSColorPickerGridView)",
         "UI bindings not connected", "low"),
    ],
)
def test_links_probes_deferrals_and_ui_bindings(line: str, event: str, severity: str) -> None:
    fragment = analyze(payload(group("g1", level="INFO", template=line, examples=[line])))
    assert fragment["fragments"][0]["event"] == event
    assert fragment["fragments"][0]["severity"] == severity


@pytest.mark.parametrize(
    ("says", "routine"),
    [
        ("batch finished with 3 errors", "batch finished with 0 errors"),
        ("batch finished with errors", "batch finished without errors"),
        ("login failure for user bob", "metrics: auth.failure.count=12 auth.success.count=40"),
        ("session error on pts/0", "session closed for user bob"),
        ("import done: 98 succeeded, 2 failed", "import done: 100 succeeded, 0 failed"),
    ],
)
def test_error_words_negated_counted_zero_or_inside_names_leave_a_line_routine(
    says: str, routine: str
) -> None:
    answer = analyze(payload(group("g1", template=says, examples=[says]),
                             group("g2", template=routine, examples=[routine])))
    assert fragment_with(answer, "g1")["event"] != "Routine activity", says
    assert fragment_with(answer, "g2")["event"] == "Routine activity", routine
