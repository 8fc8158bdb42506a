"""Messages cut where a person would cut them: header layouts learned per source.

Each case is a layout family written from its general shape (the lines are made up,
not copied from any dataset): the learner must find where the header ends and
which column names the component, so that the mined text is the message alone.
"""

from __future__ import annotations

import random

from streams.clean.formats import FormatParser, Parsed
from streams.clean.infer import learn
from streams.clean.timestamps import TimeResolver

EPOCH = 1_700_000_000


def _parse_all(lines: list[str]) -> list[Parsed]:
    parser = FormatParser(default_year=2024, default_timezone="UTC")
    return [parser.parse(line, source="s") for line in lines]


def test_a_syslog_program_given_as_a_path_is_named_by_its_file_name() -> None:
    lines = [
        f"- {EPOCH + i} 2024.01.02 node{i % 3} Jan 2 10:00:{i % 60:02d} node{i % 3}/node{i % 3} "
        + ("/opt/tools/v1.2/sbin/collectd[42]: read plugin timed out after 5 s" if i % 2
           else f"crond[{100 + i}]: job {i} finished")
        for i in range(40)
    ]
    results = _parse_all(lines)
    tail = results[20:]
    assert {p.service for p in tail} == {"collectd", "crond"}
    assert all(
        p.message == "read plugin timed out after 5 s" for p in tail if p.service == "collectd")
    assert all(p.attributes.get("pid") == 42 for p in tail if p.service == "collectd")


def test_rfc3164_syslog_with_a_path_program() -> None:
    parser = FormatParser(default_year=2024, default_timezone="UTC")
    p = parser.parse("Jan  2 10:00:01 host1 /usr/sbin/cron[77]: (root) CMD (run-parts)")
    assert (p.service, p.attributes["pid"], p.message) == ("cron", 77, "(root) CMD (run-parts)")


def test_fixed_columns_before_an_epoch_and_a_flag_after_it_are_header() -> None:
    # id, node, component, state, epoch, flag, text: space-separated, no level, no tag
    rng = random.Random(3)
    texts = ["Link error on port 3 reported", "Component State Change: fan is in the ok state",
             "boot (command 12)", "Node temperature above limit"]
    components = ["sys.hw", "node", "action"]
    lines = [
        f"{rng.randrange(10**5, 10**6)} host-{rng.randrange(500)} {components[i % 3]} "
        f"state.{rng.choice(['up', 'down'])} {EPOCH + i} {rng.choice([0, 1])} {texts[i % 4]}"
        for i in range(40)
    ]
    results = _parse_all(lines)
    for line, p in zip(lines[20:], results[20:], strict=True):
        assert p.message == texts[lines.index(line) % 4]
        assert p.service == components[lines.index(line) % 3]
        assert p.timestamp is not None


def test_a_constant_name_colon_inside_the_text_is_not_a_tag() -> None:
    times = TimeResolver(default_year=2024, default_timezone="UTC")
    lines = [f"{i} h{i} {EPOCH + i} 1 Component State Change: item {i} is ok" for i in range(20)]
    assert learn(lines, times, min_share=0.6).tag is None


def test_a_comma_after_the_time_then_level_and_padded_component() -> None:
    # "%d, %-20p %-6c %m": a comma after the time, padded level and component columns
    words = ["Info", "Warning", "Error"]
    comps = ["CBS", "CSI", "DISM"]
    texts = ["Loaded servicing stack v6.1, with core: C:\\x", "Session: 30 initialized",
             "Ending, TrustedInstaller finalization"]
    lines = [f"2024-09-28 04:30:{i % 60:02d}, {words[i % 3]:<20}{comps[i % 3]:<7}{texts[i % 3]}"
             for i in range(45)]
    results = _parse_all(lines)
    tail = results[20:]
    assert [p.message for p in tail] == [texts[i % 3] for i in range(20, 45)]
    assert [p.service for p in tail] == [comps[i % 3] for i in range(20, 45)]
    assert {p.format for p in tail} == {"text"}  # one reading per source, whatever the commas


def test_a_bracketed_time_then_name_dash_message() -> None:
    programs = ["browser.exe", "mail.exe", "sync-agent"]
    lines = [f"[10.30 16:49:{i % 60:02d}] {programs[i % 3]} - host{i}.example.org:443 open "
             f"through proxy p.example.org:5070 HTTPS" for i in range(40)]
    results = _parse_all(lines)
    for i, p in enumerate(results[20:], 20):
        assert p.service == programs[i % 3]
        assert p.message.startswith(f"host{i}.example.org:443 open")


def test_a_learned_time_alone_is_cut_from_the_message() -> None:
    lines = [f"[10.30 16:49:{i % 60:02d}] job {i} done in {i} ms" for i in range(30)]
    results = _parse_all(lines)
    assert [p.message for p in results[20:]] == [f"job {i} done in {i} ms" for i in range(20, 30)]
