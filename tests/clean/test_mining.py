"""Template mining: loghub grouping accuracy, stable ids, bounded memory, no side doors."""

from __future__ import annotations

import csv
import logging
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from streams.clean.mining import WORD_ESCAPE, TemplateMiner, template_id

from helpers import shared_file

REPO = Path(__file__).resolve().parents[2]

# Measured on the labelled message parts (ids as match() returns them, line by line,
# no second pass): Apache 1.000, BGL 0.990, HDFS 1.000, Hadoop 0.970, HealthApp 1.000,
# Linux 0.879, OpenStack 0.979, Zookeeper 0.989 (plain drain3: OpenStack 0.298, Linux
# 0.684, HealthApp 0.576). Thresholds sit a little below, so a regression shows.
THRESHOLDS = {"Apache": 0.97, "BGL": 0.96, "HDFS": 0.97, "Hadoop": 0.94, "HealthApp": 0.97,
              "Linux": 0.85, "OpenStack": 0.95, "Zookeeper": 0.96}


def grouping_accuracy(predicted: list[str], truth: list[str]) -> float:
    """Loghub's metric: share of lines whose predicted group is exactly one true event."""
    members: dict[str, list[int]] = defaultdict(list)
    for i, group in enumerate(predicted):
        members[group].append(i)
    event_sizes = Counter(truth)
    correct = 0
    for idx in members.values():
        events = {truth[i] for i in idx}
        if len(events) == 1 and event_sizes[truth[idx[0]]] == len(idx):
            correct += len(idx)
    return correct / len(truth)


def load_structured(name: str) -> list[dict[str, str]]:
    path = shared_file("loghub", name, f"{name}_2k.log_structured.csv")
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_grouping_accuracy_metric() -> None:
    assert grouping_accuracy(["a", "a", "b"], ["E1", "E1", "E2"]) == 1.0
    assert grouping_accuracy(["a", "a", "a"], ["E1", "E1", "E2"]) == 0.0  # merged
    assert grouping_accuracy(["a", "b", "c"], ["E1", "E1", "E2"]) == pytest.approx(1 / 3)  # split


@pytest.mark.parametrize("name", sorted(THRESHOLDS))
def test_loghub_grouping_accuracy(name: str) -> None:
    rows = load_structured(name)
    miner = TemplateMiner()
    ids = [miner.match(row["Content"])[0] for row in rows]
    accuracy = grouping_accuracy(ids, [row["EventId"] for row in rows])
    print(f"{name}: grouping accuracy {accuracy:.4f} over {len(rows)} lines, {len(set(ids))} ids")
    assert accuracy >= THRESHOLDS[name]


def test_hdfs_templates_read_like_the_ground_truth() -> None:
    rows = load_structured("HDFS")
    miner = TemplateMiner()
    templates = {miner.match(row["Content"])[1] for row in rows}
    assert "PacketResponder <NUM> for block <BLK> terminating" in templates
    assert "Receiving block <BLK> src: /<IP> dest: /<IP>" in templates
    assert all("blk_-" not in t and "10.25" not in t for t in templates)


def test_match_returns_id_of_the_returned_template() -> None:
    miner = TemplateMiner()
    tid, template = miner.match("Connection to 10.0.0.1:9092 refused after 3 tries")
    assert template == "Connection to <IP> refused after <NUM> tries"
    assert tid == template_id(template)
    assert tid.startswith("t") and len(tid) == 11
    assert miner.match("Connection to 10.9.9.9:9093 refused after 12 tries") == (tid, template)


def test_short_events_that_differ_by_one_word_stay_apart() -> None:
    """Plain Drain gives these one template ("VM <*> (Lifecycle Event)"): 5 of 6 tokens agree."""
    miner = TemplateMiner()
    uuid = "96abccce-8d1f-4e07-b6d1-4b2ab87e23b4"
    found = {}
    for _ in range(3):
        for state in ("Started", "Paused", "Resumed", "Stopped"):
            found.setdefault(state, set()).add(
                miner.match(f"[instance: {uuid}] VM {state} (Lifecycle Event)"))
    assert all(len(results) == 1 for results in found.values())
    assert len({next(iter(results))[0] for results in found.values()}) == 4
    assert found["Paused"] == {(template_id("[instance: <UUID>] VM Paused (Lifecycle Event)"),
                                "[instance: <UUID>] VM Paused (Lifecycle Event)")}
    get = miner.match('10.0.0.1 "GET /v2/a/servers HTTP/1.1" status: 200 len: 1893 time: 0.24')
    post = miner.match('10.0.0.1 "POST /v2/a/servers HTTP/1.1" status: 202 len: 733 time: 0.5')
    assert get[0] != post[0]


def test_a_user_name_generalises_once_it_names_a_user_in_two_events() -> None:
    """A word seen in two templates is a name (user, host), and the id is kept."""
    miner = TemplateMiner()
    first = miner.match("session opened for user cyrus by (uid=0)")
    miner.match("session closed for user cyrus")
    tid, template = miner.match("session opened for user news by (uid=0)")
    assert template == "session opened for user <*> by (uid=<NUM>)"
    assert tid == first[0] == template_id("session opened for user cyrus by (uid=<NUM>)")
    assert miner.match("session opened for user test by (uid=509)") == (tid, template)


def test_a_free_text_word_generalises_after_enough_distinct_words() -> None:
    """A position that keeps changing word is a variable even if no word repeats elsewhere."""
    miner = TemplateMiner()
    names = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan",
             "judy", "mallory", "oscar"][:WORD_ESCAPE + 2]
    results = [miner.match(f"user {name} logged in from web") for name in names]
    assert len({tid for tid, _ in results[:WORD_ESCAPE + 1]}) == WORD_ESCAPE + 1
    assert results[-1] == (results[0][0], "user <*> logged in from web")
    assert miner.cluster_count == WORD_ESCAPE + 1


def test_numbers_and_masked_variables_generalise_at_once() -> None:
    miner = TemplateMiner()
    a = miner.match("db.example.com:5432 connection reset after 3 retries")
    b = miner.match("cache.example.org:6379 connection reset after 12 retries")
    assert b == (a[0], "<*> connection reset after <NUM> retries")


def test_a_date_inside_the_message_is_one_variable() -> None:
    miner = TemplateMiner()
    a = miner.match("connection from 10.1.2.3 () at Sun Jul  3 13:52:21 2005")
    b = miner.match("connection from 10.9.8.7 () at Fri Jun 24 07:57:30 2005")
    c = miner.match("backup done at 2005-07-03 13:52:21,123 in 4s")
    assert a[1] == "connection from <IP> () at <DATE>"
    assert b == a
    assert c[1] == "backup done at <DATE> in <NUM>"


def test_a_list_of_addresses_is_one_variable() -> None:
    miner = TemplateMiner()
    one = miner.match('10.11.10.1 "GET /v2/a/servers/detail HTTP/1.1" status: 200 len: 1893')
    two = miner.match(
        '10.11.21.122,10.11.10.1 "GET /v2/a/servers/detail HTTP/1.1" status: 200 len: 264')
    assert one == two
    assert one[1] == '<IP> "GET <PATH> HTTP/<NUM>" status: <NUM> len: <NUM>'


def test_ids_are_the_same_in_another_process() -> None:
    lines = [
        "PacketResponder 1 for block blk_38865049064139660 terminating",
        "Verification succeeded for blk_-6952295868487656571",
    ]
    miner = TemplateMiner()
    here = [miner.match(line)[0] for line in lines]
    code = (
        "import sys\n"
        "from streams.clean.mining import TemplateMiner\n"
        "m = TemplateMiner()\n"
        "print(' '.join(m.match(line)[0] for line in sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, *lines],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.split() == here


def test_cluster_count_is_bounded() -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    lines = [  # 25 word counts x 7 spellings: many clusters
        " ".join(words[j % len(words)] + "x" * (i % 7) for j in range(i % 25 + 1))
        for i in range(200)
    ]
    bounded, unbounded = TemplateMiner(max_clusters=10), TemplateMiner(max_clusters=100_000)
    for line in lines:
        bounded.match(line)
        unbounded.match(line)
    assert unbounded.cluster_count > 50
    assert bounded.cluster_count <= 10
    assert bounded.id_count == bounded.cluster_count  # evicted clusters' ids are dropped
    assert unbounded.id_count == unbounded.cluster_count


def test_what_the_word_rule_remembers_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import streams.clean.mining as mining

    monkeypatch.setattr(mining, "MAX_WORDS", 50)
    miner = TemplateMiner(max_clusters=10)
    for i in range(300):  # a new first word each time: a new cluster, refused a word
        name = "".join(chr(97 + int(d)) for d in str(i))
        miner.match(f"{name} state up{name}")
        miner.match(f"{name} state down{name}")
    drain = miner._drain
    assert drain.clusters_counter == 600
    assert len(drain._word_templates) <= 50 + 3  # one template's words past the bound
    assert set(drain._refused) <= set(drain.id_to_cluster)  # evicted clusters forgotten
    assert miner.id_count == miner.cluster_count <= 10


def test_an_evicted_cluster_is_born_again_with_its_id() -> None:
    miner = TemplateMiner(max_clusters=2)
    first = miner.match("disk sda is full")
    miner.match("fan speed 3000 rpm on board 1")
    miner.match("link eth0 is down since boot")  # evicts the least recently used
    assert miner.cluster_count == 2
    assert miner.match("disk sda is full") == first


def test_a_line_seen_again_joins_its_cluster_as_it_stands_now() -> None:
    miner = TemplateMiner()
    tid, template = miner.match("user 12 logged in on node7")
    assert template == "user <NUM> logged in on node7"
    assert miner.match("user 12 logged in on node8")[0] == tid  # the cluster generalises
    assert miner.match("user 12 logged in on node7") == (tid, "user <NUM> logged in on <*>")
    (cluster,) = miner._drain.id_to_cluster.values()
    assert cluster.size == 3


def test_lines_remembered_with_their_cluster_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import streams.clean.mining as mining

    monkeypatch.setattr(mining, "JOINED_LINES", 5)
    monkeypatch.setattr(mining, "JOINED_MAX_CHARS", 30)
    miner = TemplateMiner()
    first = miner.match("job alpha started")
    for word in ["beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]:
        miner.match(f"job {word} started")
        assert len(miner._joined) <= 5
    miner.match("job " + "x" * 40 + " started")  # too long to remember
    assert all(len(line) <= 30 for line in miner._joined)
    assert miner.match("job alpha started")[0] == first[0]  # forgotten, found by Drain again


def test_no_config_file_is_read_from_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "drain3.ini").write_text(
        "[DRAIN]\nsim_th = 0.99\n[MASKING]\n"
        'masking = [{"regex_pattern": "hello", "mask_with": "HI"}]\n'
    )
    monkeypatch.chdir(tmp_path)
    miner = TemplateMiner()
    _, template = miner.match("hello world 42")
    assert template == "hello world <NUM>"
    assert list(tmp_path.iterdir()) == [tmp_path / "drain3.ini"]  # no snapshot written either


def test_drain3_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        miner = TemplateMiner()
        for i in range(50):
            miner.match(f"event {i} type{i % 5} happened")
    assert [r for r in caplog.records if r.name.startswith("drain3")] == []


def test_empty_message_does_not_crash() -> None:
    tid, template = TemplateMiner().match("")
    assert template == ""
    assert tid == template_id("")


def test_bad_parameters_are_rejected() -> None:
    with pytest.raises(ValueError):
        TemplateMiner(sim_th=1.5)
    with pytest.raises(ValueError):
        TemplateMiner(depth=2)
    with pytest.raises(ValueError):
        TemplateMiner(max_clusters=0)


@pytest.mark.timeout(20)
def test_pathological_long_lines_stay_fast() -> None:
    miner = TemplateMiner()
    for text in ["0" * 64_000 + "g", "/a" * 32_000 + "/", "1.2.3." * 10_000, "blk_1 " * 10_000,
                 "x " + "a" * 64_000 + " y", "x " + "b" * 64_000 + " y", "a" * 64_000 + "1"]:
        start = time.perf_counter()
        miner.match(text)
        assert time.perf_counter() - start < 1.0
