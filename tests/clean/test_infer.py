"""Learning a source's structure from a sample of its lines (streams.clean.infer).

The generated layouts (streams.dev.layouts) state their time and level, so each case
checks both what was learned and what every record came out with.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.clean.formats import FormatParser
from streams.clean.infer import LevelSpot, SourceLearner, StampSpot, Structure, learn
from streams.clean.timestamps import TimeResolver
from streams.dev.layouts import LAYOUTS, Layout, generate
from streams.records import DeadLetter, NormalizedRecord, RawCoord, iso_utc

from helpers import make_cleaner

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
START = datetime(2026, 3, 17, 16, 13, 38, tzinfo=UTC)
LINES = 60

# What each layout needs the learner for; None: per-record detection already gets
# the time and the level, so the source is never sampled.
EXPECTED: dict[str, Structure | None] = {
    "logcat": Structure(StampSpot(0, "", "month-day"), LevelSpot(2, "letter"), tag=3),
    "apache-combined": None,  # streams.clean.access
    "nginx-error": None,
    "go-log": Structure(StampSpot(0, "", "known"), None, None),  # no level in Go's log
    "glog": None,
    "python-logging": None,
    "postgresql": None,
    "redis": Structure(StampSpot(1, "", "known"), None, None),  # after "pid:role"
    "mysql-error": None,
    "journald-short-iso": Structure(StampSpot(0, "", "known"), None, tag=1),
    "log4j-iso-zone": None,
    # the name column before the level becomes the service (hosts here)
    "epoch-seconds": Structure(StampSpot(0, "", "epoch"), LevelSpot(1, "word"), None, 0),
    "epoch-millis": Structure(StampSpot(1, "", "epoch"), LevelSpot(0, "word"), None),
    "csv-time-column": Structure(StampSpot(0, ",", "known"), LevelSpot(0, "word"), None),
}


def make_parser(**learner: int) -> FormatParser:
    times = TimeResolver(default_year=None, default_timezone="UTC", clock=lambda: NOW)
    return FormatParser(
        default_year=None,
        default_timezone="UTC",
        clock=lambda: NOW,
        learner=SourceLearner(times, **learner) if learner else None,
    )


def test_every_generated_layout_has_an_expectation() -> None:
    assert {layout.name for layout in LAYOUTS} == set(EXPECTED)
    assert len(LAYOUTS) >= 12


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_layout_is_learned_and_every_record_gets_its_time_and_level(layout: Layout) -> None:
    parser = make_parser()
    lines = generate(layout, LINES, start=START)
    results = [parser.parse(line.text, source=layout.name) for line in lines]
    assert parser.learner.structure(layout.name) == EXPECTED[layout.name]
    for line, parsed in zip(lines, results, strict=True):
        assert parsed.timestamp is not None, line.text
        assert iso_utc(parsed.timestamp) == line.time, line.text
    decided = list(zip(lines, results, strict=True))[20:]  # after the sample decided
    for line, parsed in decided:
        assert parsed.level == line.level, line.text
    # before the first 5 lines agree, one line alone trusts only upper-case level words
    early_ok = sum(p.level == line.level for line, p in zip(lines, results, strict=True))
    assert early_ok >= LINES - 4


def test_logcat_record_reads_pid_tid_tag_and_message() -> None:
    parser = make_parser()
    line = "03-17 16:13:38.811  1702  2395 D WindowManager: focus moved to window 42"
    parsed = parser.parse(line, source="phone")
    assert (iso_utc(parsed.timestamp), parsed.level, parsed.service) == (  # type: ignore[arg-type]
        "2026-03-17T16:13:38.811Z",
        "DEBUG",
        "WindowManager",
    )
    assert parsed.timestamp_rule == "year-assumed:2026,zone-assumed:UTC"
    assert parsed.message == "focus moved to window 42"
    assert parsed.attributes["header"] == "1702 2395"


def test_a_year_less_time_after_the_read_date_is_last_year() -> None:
    times = TimeResolver(
        default_year=None,
        default_timezone="UTC",
        clock=lambda: datetime(2027, 1, 2, tzinfo=UTC),
    )
    parser = FormatParser(
        default_year=None,
        default_timezone="UTC",
        clock=lambda: datetime(2027, 1, 2, tzinfo=UTC),
        learner=SourceLearner(times),
    )
    parsed = parser.parse("12-31 23:59:59.000  1  2 I Boot: done", source="s")
    assert iso_utc(parsed.timestamp) == "2026-12-31T23:59:59.000Z"  # type: ignore[arg-type]
    assert parsed.timestamp_rule == "year-assumed:2026,zone-assumed:UTC"


def test_the_default_year_setting_wins_for_year_less_layouts() -> None:
    times = TimeResolver(default_year=2019, default_timezone="UTC", clock=lambda: NOW)
    parser = FormatParser(
        default_year=2019, default_timezone="UTC", clock=lambda: NOW, learner=SourceLearner(times)
    )
    parsed = parser.parse("03-17 16:13:38.811  1  2 W Net: slow", source="s")
    assert iso_utc(parsed.timestamp).startswith("2019-03-17")  # type: ignore[arg-type]
    assert parsed.timestamp_rule == "year-assumed:2019,zone-assumed:UTC"


def test_without_a_source_nothing_is_learned() -> None:
    parser = make_parser()
    for _ in range(30):
        parsed = parser.parse("03-17 16:13:38.811  1  2 W Net: slow")
    assert parsed.timestamp is None and parsed.level is None
    assert len(parser.learner) == 0


def test_a_line_that_does_not_fit_falls_back_to_per_record_detection() -> None:
    parser = make_parser()
    for line in generate(LAYOUTS[0], 30, start=START):  # logcat
        parser.parse(line.text, source="phone")
    odd = parser.parse("--------- beginning of main", source="phone")
    assert (odd.timestamp, odd.level, odd.message) == (None, None, "--------- beginning of main")
    iso = parser.parse("2026-03-18T10:00:00Z ERROR disk full", source="phone")
    assert (iso_utc(iso.timestamp), iso.level) == ("2026-03-18T10:00:00.000Z", "ERROR")  # type: ignore[arg-type]


def test_a_source_that_changes_layout_is_learned_again() -> None:
    parser = make_parser(relearn_misses=5)
    logcat, epoch = (next(x for x in LAYOUTS if x.name == n) for n in ("logcat", "epoch-seconds"))
    for line in generate(logcat, 30, start=START):
        parser.parse(line.text, source="s")
    assert parser.learner.structure("s") == EXPECTED["logcat"]
    later = generate(epoch, 40, start=START)
    results = [parser.parse(line.text, source="s") for line in later]
    learned = parser.learner.structure("s")
    expected = EXPECTED["epoch-seconds"]
    assert learned is not None and expected is not None
    assert (learned.stamp, learned.level) == (expected.stamp, expected.level)
    # the 5 lines that missed the old layout are parsed per record (no time); then all are
    assert all(p.timestamp is None for p in results[:5])
    for parsed, line in zip(results[5:], later[5:], strict=True):
        assert iso_utc(parsed.timestamp) == line.time  # type: ignore[arg-type]


def test_unanimous_early_lines_decide_before_the_full_sample() -> None:
    parser = make_parser(sample_lines=20, early_lines=5)
    logcat = next(x for x in LAYOUTS if x.name == "logcat")
    lines = generate(logcat, 5, start=START)
    for line in lines[:4]:
        parser.parse(line.text, source="s")
    assert parser.learner.structure("s") is None
    parser.parse(lines[4].text, source="s")
    assert parser.learner.structure("s") == EXPECTED["logcat"]


def test_sources_are_bounded_least_recently_used_first() -> None:
    parser = make_parser(max_sources=2)
    line = "03-17 16:13:38.811  1  2 W Net: slow"
    for source in ("a", "b", "a", "c"):
        parser.parse(line, source=source)
    assert len(parser.learner) == 2
    assert "b" not in parser.learner and "a" in parser.learner and "c" in parser.learner


def test_a_code_column_of_one_letter_is_not_a_level() -> None:
    times = TimeResolver(default_year=None, default_timezone="UTC", clock=lambda: NOW)
    lines = [f"2026-03-17 16:13:{i:02d} A job {i} done" for i in range(20)]
    assert learn(lines, times, min_share=0.6).level is None
    letters = [f"2026-03-17 16:13:{i:02d} {'IWE'[i % 3]} job {i} done" for i in range(20)]
    assert learn(letters, times, min_share=0.6).level == LevelSpot(0, "letter")


def test_prose_level_words_in_a_minority_of_lines_are_not_a_column() -> None:
    times = TimeResolver(default_year=None, default_timezone="UTC", clock=lambda: NOW)
    lines = [f"1710692018 worker {'error' if i < 5 else 'done'} item {i}" for i in range(20)]
    structure = learn(lines, times, min_share=0.6)
    assert structure.stamp == StampSpot(0, "", "epoch") and structure.level is None


def test_numbers_outside_the_epoch_range_are_not_times() -> None:
    times = TimeResolver(default_year=None, default_timezone="UTC", clock=lambda: NOW)
    lines = [f"9999999999 order {i} shipped" for i in range(20)]
    assert learn(lines, times, min_share=0.6).stamp is None


def test_learner_rejects_impossible_sample_sizes() -> None:
    times = TimeResolver(default_year=None, default_timezone="UTC", clock=lambda: NOW)
    with pytest.raises(ValueError, match="early_lines"):
        SourceLearner(times, sample_lines=5, early_lines=10)
    with pytest.raises(ValueError, match="max_sources"):
        SourceLearner(times, max_sources=0)


def _cut_line(index: int, seed: int, cut: int) -> str:
    """A generated line of any layout, cut anywhere: headers that stop half-way."""
    return generate(LAYOUTS[index], 1, start=START, seed=seed)[0].text[:cut]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=120),
            st.builds(
                _cut_line,
                st.integers(0, len(LAYOUTS) - 1),
                st.integers(0, 1000),
                st.integers(0, 200),
            ),
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from(["a", "b"]),
)
def test_learning_never_loses_a_record(lines: list[str], source: str) -> None:
    cleaner = make_cleaner(NOW, max_record_bytes=64 * 1024)
    for offset, line in enumerate(lines):
        raw = line.encode("utf-8", "surrogatepass")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        [out] = cleaner.clean(raw, RawCoord(topic="t", partition=0, offset=offset), source)
        if isinstance(out, DeadLetter):  # only text that is not text may be refused
            assert out.reason == "binary", (line, out.reason, out.detail)
        else:
            assert isinstance(out, NormalizedRecord) and out.id == f"t/0/{offset}"


def _learned_source(lines: list[str]) -> tuple[FormatParser, list]:  # type: ignore[type-arg]
    parser = make_parser()
    return parser, [parser.parse(line, source="s") for line in lines]


def test_padded_bracket_levels_after_a_bracketed_time() -> None:
    # Elasticsearch's "[%d{ISO8601}][%-5p][%-25c{1.}] [%node_name] %m"
    words = ("INFO", "WARN", "ERROR", "DEBUG")
    lines = [
        f"[2026-03-17T16:13:{i:02d},811][{words[i % 4]:<5}][o.e.c.r.a.DiskMonitor] [n1] disk {i}"
        for i in range(25)
    ]
    parser, results = _learned_source(lines)
    assert parser.learner.structure("s") == Structure(
        StampSpot(0, "[", "known"), LevelSpot(0, "bracket"), None, None
    )
    assert [p.level for p in results] == [
        {"INFO": "INFO", "WARN": "WARN", "ERROR": "ERROR", "DEBUG": "DEBUG"}[words[i % 4]]
        for i in range(25)
    ]


def test_a_level_before_the_time_is_learned() -> None:
    lines = [f"<{'IWE'[i % 3]}> 2026-03-17 16:13:{i:02d} app: started {i}" for i in range(25)]
    parser, results = _learned_source(lines)
    structure = parser.learner.structure("s")
    assert structure is not None and structure.level == LevelSpot(0, "bracket", before=True)
    assert [p.level for p in results[:3]] == ["INFO", "WARN", "ERROR"]
    assert (results[0].service, results[0].message) == ("app", "started 0")


def test_a_time_far_into_the_line_is_found() -> None:
    # uWSGI's default request line: the time in brackets after eleven other tokens
    lines = [
        f"[pid: 12|app: 0|req: {i}/{i}] 192.0.2.1 () {{38 vars in 512 bytes}} "
        f"[Tue Mar 17 16:13:{i:02d} 2026] GET /x => generated 12 bytes in 3 msecs (HTTP/1.1 200)"
        for i in range(25)
    ]
    parser, results = _learned_source(lines)
    structure = parser.learner.structure("s")
    assert structure is not None and structure.stamp == StampSpot(11, "[", "known")
    assert [iso_utc(p.timestamp) for p in results[:2]] == [  # type: ignore[arg-type]
        "2026-03-17T16:13:00.000Z",
        "2026-03-17T16:13:01.000Z",
    ]


def test_two_digit_year_in_iso_order() -> None:
    # log4j "%d{yy/MM/dd HH:mm:ss} %p %c{1}: %m"
    words = ("INFO", "WARN", "ERROR")
    lines = [
        f"26/03/17 16:13:{i:02d} {words[i % 3]} storage.BlockManager: put {i}" for i in range(25)
    ]
    parser, results = _learned_source(lines)
    structure = parser.learner.structure("s")
    assert structure is not None and structure.stamp == StampSpot(0, "", "short-ymd")
    assert iso_utc(results[0].timestamp) == "2026-03-17T16:13:00.000Z"  # type: ignore[arg-type]
    assert (results[0].timestamp_rule, results[0].level) == ("zone-assumed:UTC", "INFO")
    warn = results[1]
    assert (warn.level, warn.attributes.get("logger")) == ("WARN", "storage.BlockManager")


def test_year_less_dotted_date_in_brackets() -> None:
    lines = [f"[03.17 16:13:{i:02d}] agent.exe - proxy.example:8080 open" for i in range(25)]
    parser, results = _learned_source(lines)
    structure = parser.learner.structure("s")
    assert structure is not None and structure.stamp == StampSpot(0, "[", "month-day")
    assert iso_utc(results[3].timestamp) == "2026-03-17T16:13:03.000Z"  # type: ignore[arg-type]
    assert results[3].timestamp_rule == "year-assumed:2026,zone-assumed:UTC"


def test_level_word_after_a_comma_and_blanks() -> None:
    words = ("Info", "Warning", "Error")
    lines = [
        f"2026-03-17 16:13:{i:02d}, {words[i % 3]:<20} SVC    step {i} done" for i in range(25)
    ]
    _, results = _learned_source(lines)
    # mixed-case words count once five lines agree; one line alone trusts only "INFO"
    assert [p.level for p in results[:4]] == [None] * 4
    assert [p.level for p in results[6:9]] == ["INFO", "WARN", "ERROR"]


def test_a_tag_with_a_parenthesised_part_after_an_epoch() -> None:
    lines = [
        f"- 17{i:08d} 2026.03.17 node{i % 3} cron(pam_unix)[{100 + i}]: session opened"
        for i in range(25)
    ]
    parser, results = _learned_source(lines)
    structure = parser.learner.structure("s")
    assert structure is not None and structure.tag == 2
    assert (results[5].service, results[5].attributes["pid"]) == ("cron(pam_unix)", 105)
    assert results[5].message == "session opened"
