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
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.clean.templates import TemplateMiner, template_id

from helpers import shared_file

REPO = Path(__file__).resolve().parents[2]

# Measured with the masks in streams/clean/templates.py (ids as match() returns them,
# line by line, no second pass): HDFS 1.000, Apache 1.000, Zookeeper 0.967,
# HealthApp 0.9005. Thresholds sit a little below, so a regression shows.
THRESHOLDS = {"HDFS": 0.97, "Apache": 0.97, "Zookeeper": 0.93, "HealthApp": 0.87}


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


def test_variable_tokens_generalize_into_one_template() -> None:
    miner = TemplateMiner()
    a = miner.match("user alice logged in from web")
    miner.match("user bob logged in from web")
    c = miner.match("user carol logged in from web")
    assert c[1] == "user <*> logged in from web"
    assert a[0] != c[0]  # the first line saw the template before it generalized


def test_ids_are_the_same_in_another_process() -> None:
    lines = [
        "PacketResponder 1 for block blk_38865049064139660 terminating",
        "Verification succeeded for blk_-6952295868487656571",
    ]
    miner = TemplateMiner()
    here = [miner.match(line)[0] for line in lines]
    code = (
        "import sys\n"
        "from streams.clean.templates import TemplateMiner\n"
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
    for text in ["0" * 64_000 + "g", "/a" * 32_000 + "/", "1.2.3." * 10_000, "blk_1 " * 10_000]:
        start = time.perf_counter()
        miner.match(text)
        assert time.perf_counter() - start < 1.0


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789abcdefABCDEFxX-.:/_ blk,=")),
               max_size=80))
def test_hinted_masks_mask_exactly_as_their_plain_patterns(text: str) -> None:
    """The hints only skip substitutions that could not match."""
    from drain3.masking import MaskingInstruction

    from streams.clean.templates import MASKS, HintedMask

    hinted = plain = text
    for pattern, name, hints in MASKS:
        hinted = HintedMask(pattern, name, hints).mask(hinted, "<", ">")
        plain = MaskingInstruction(pattern, name).mask(plain, "<", ">")
    assert hinted == plain
