"""Whether a line asserts what a keyword names: pairs of lines, one that does, one that doesn't."""

from __future__ import annotations

import re

import pytest

from streams.gateway.rules.language import Sense, affirmed, good_outcome, inside_identifier

FAILURE = re.compile(r"\bfail(?:ed|ure|s)?\b|\berrors?\b|Connection refused", re.IGNORECASE)
CHANGE = re.compile(r"\bconfig(?:uration)? change\b|\brestart(?:ed)?\b|\bdeploy", re.IGNORECASE)


@pytest.mark.parametrize(
    ("says", "does_not"),
    [
        # a negation in front of the word, in its clause
        ("sync of shard 3 failed", "sync of shard 3 has not failed"),
        ("finished with errors", "finished without errors"),
        # a zero count, but not a thing numbered 0
        ("3 passed, 2 failed", "3 passed, 0 failed"),
        ("batch done: 4 errors", "batch done: 0 errors"),
        ("keystone finished: errors=2", "keystone finished: errors=0"),
        ("open failed, error: no such file or directory", "retry done, error: none"),
        # a good outcome anywhere in the line ends the failure
        ("sync failed, retry not successful", "sync failed, retry succeeded"),
        ("request failed: success=false", "request failed earlier, now succeeded"),
        ("Connection refused; will retry", "reconnect to db recovered after Connection refused"),
        # "resolved" as name resolution, "SUCCESS" as one field's value, end nothing
        ("connect failed after it resolved db to 10.0.0.5", "connect failed; issue is resolved"),
        ("pipeline error; ack status: SUCCESS", "pipeline error; pipeline recovered"),
        # a close its user asked for is routine
        ("session error on tty1", "session error on tty1: closed by user"),
    ],
)
def test_a_failure_is_taken_back_by_negation_zero_counts_and_good_outcomes(
    says: str, does_not: str
) -> None:
    assert affirmed(FAILURE, says, "failure"), says
    assert not affirmed(FAILURE, does_not, "failure"), does_not


def test_a_counted_failure_is_not_undone_by_a_success_beside_it() -> None:
    assert affirmed(FAILURE, "2 of 3 replicas failed; 1 succeeded", "failure")
    assert affirmed(FAILURE, "processed 100 items: 98 succeeded, 2 failed", "failure")
    assert not affirmed(FAILURE, "replica sync failed; retry succeeded", "failure")


def test_the_reach_of_a_negation_stops_at_a_verb_and_a_clause() -> None:
    assert affirmed(FAILURE, "heartbeat not received, sync failed", "failure")
    assert affirmed(FAILURE, "heartbeat not received sync failed", "failure")
    assert affirmed(FAILURE, "job 0 failed", "failure")  # 0 names the job
    assert not affirmed(FAILURE, "it has not yet been failed over", "failure")


@pytest.mark.parametrize(
    ("says", "does_not"),
    [
        ("configuration change applied", "[ib_sm_sweep.c:1482]: No configuration change required"),
        ("configuration change applied by ops", "Configuration change required before upgrade"),
        ("broker 2 restarted", "broker 2 was not restarted"),
        ("broker 2 restarted", "restart needed to load the new certificate"),
        ("deployment of v2 finished", "deployment of v2 skipped"),
        ("Scheduling restart of crashed service com.example/.Sync",
         "cleanUpApplicationRecordLocked, pid: 5769, restart: false"),
    ],
)
def test_a_change_is_taken_back_by_negation_and_by_a_verdict(says: str, does_not: str) -> None:
    assert affirmed(CHANGE, says, "change"), says
    assert not affirmed(CHANGE, does_not, "change"), does_not


def test_a_change_that_went_well_is_still_a_change_and_a_state_ignores_outcomes() -> None:
    assert affirmed(CHANGE, "deploy of v2 completed successfully", "change")
    up = re.compile(r"\blink (?:is )?up\b", re.IGNORECASE)
    assert affirmed(up, "eth0: NIC Link is Up 1000 Mbps, sync succeeded", "state")
    assert not affirmed(up, "eth0: no link up yet", "state")


def _span(text: str, word: str) -> tuple[int, int]:
    start = text.index(word)
    return start, start + len(word)


@pytest.mark.parametrize(
    ("text", "word", "inside"),
    [
        # a keyword inside someone's identifier is no event
        ("connectTimeoutMs=5000", "connect", True),
        ("connect timeout after 5000 ms", "connect", False),
        ("[BluetoothHIDDeviceController] EventServiceDisconnectedCallback", "Disconnected", True),
        ("device Disconnected: keyboard", "Disconnected", False),
        ("reconnect_delay=5", "connect", True),
        ("auth.failure.count=0", "failure", True),
        ("auth failure count 3", "failure", False),
        ("consumer: socketTimeoutMs=30000", "socketTimeout", True),
        ("consumer: socketTimeout = 30000", "socketTimeout", True),
        ("loaded config.yaml", "config", True),
        # what stays an event: a class thrown, its package only qualifies it
        ("java.net.SocketTimeoutException: Read timed out", "SocketTimeout", False),
        ("org.apache.http.conn.HttpHostConnectException: refused", "ConnectException", False),
        ("(ImportBailout.Error:1331) asked to exit", "Error", False),
        # an error code that goes on, an id after the keyword, an inflection, a key's value
        ("error code NOT_LEADER_FOR_PARTITION", "NOT_LEADER", False),
        ("Got exception while serving blk_-3544583377 to /10.0.0.1", "blk", False),
        ("deployment of v2", "deploy", False),
        ('upstream_status=502 request="GET /"', "status=502", False),
        ("generating core.2275", "core", False),
        # an option of a command line is a setting, even one named after an error
        ("java.lang.OutOfMemoryError: Java heap space", "OutOfMemory", False),
        ("jvm args: -Xmx1g -XX:+HeapDumpOnOutOfMemoryError", "OutOfMemory", True),
    ],
)
def test_whole_words_and_not_words_inside_identifiers(text: str, word: str, inside: bool) -> None:
    assert inside_identifier(text, *_span(text, word)) is inside


@pytest.mark.parametrize(
    ("ends_well", "does_not"),
    [
        ("Received disconnect from 10.0.0.9: 11: disconnected by user", "disconnected by peer"),
        ("Closed due to user request.", "Closed due to timeout."),
        ("user bob logged out", "user bob logged in"),
        ("link is up", "link is not up"),
        ("problem resolved.", "resolved host db to 10.0.0.5"),
        ("transfer completed successfully", "transfer completed with errors"),
        ("login successful", "login successful: no"),
    ],
)
def test_good_outcomes(ends_well: str, does_not: str) -> None:
    assert good_outcome(ends_well), ends_well
    assert not good_outcome(does_not), does_not


@pytest.mark.parametrize("sense", ["failure", "change", "state"])
def test_no_match_is_no_match_in_any_sense(sense: Sense) -> None:
    assert affirmed(FAILURE, "all good here", sense) is None
