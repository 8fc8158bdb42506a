"""Logical records from byte streams: joining, line numbers, odd input, gzip."""

from __future__ import annotations

import gzip
import io
import os
import sys
from pathlib import Path

import pytest

from streams.errors import InputError
from streams.ingest.reader import (
    WEAK_ALLOWANCE,
    check_inputs,
    is_record_start,
    iter_records,
    open_source,
)


def records(data: bytes, **kwargs: int) -> list[tuple[int, bytes]]:
    return list(iter_records(io.BytesIO(data), **kwargs))


JAVA = b"""2024-01-02 03:04:05,678 INFO [main] com.acme.App: starting
2024-01-02 03:04:06,000 ERROR [main] com.acme.App: request failed
java.lang.IllegalStateException: boom
\tat com.acme.App.handle(App.java:42)
\tat com.acme.App.main(App.java:7)
Caused by: java.io.IOException: disk gone
\tat com.acme.Disk.read(Disk.java:9)
\t... 2 more
2024-01-02 03:04:07,000 INFO [main] com.acme.App: recovered
"""


def test_java_stack_trace_joins_into_the_record_before_it() -> None:
    got = records(JAVA)
    assert [n for n, _ in got] == [1, 2, 9]
    trace = got[1][1]
    assert trace.startswith(b"2024-01-02 03:04:06,000 ERROR")
    assert trace.endswith(b"\t... 2 more")
    assert trace.count(b"\n") == 6  # seven physical lines
    assert b"Caused by: java.io.IOException" in trace


def test_bracketed_timestamps_start_records_and_exception_lines_continue() -> None:
    data = (
        b"[2016-12-19 20:39:48,918] WARN fetch failed (kafka.server.ReplicaFetcherThread)\n"
        b"java.io.IOException: Connection to 2 was disconnected\n"
        b"\tat kafka.utils.NetworkClientBlockingOps.recursivePoll(NCBO.scala:137)\n"
        b"[2016-12-19 20:39:50,730] INFO Rolled new log segment (kafka.log.Log)\n"
    )
    got = records(data)
    assert len(got) == 2
    assert got[0][1].count(b"\n") == 2
    assert got[1][0] == 4


def test_bare_text_without_any_record_start_is_one_record_per_line() -> None:
    data = b"first line of prose\nsecond line\n  indented third\nfourth\n"
    got = records(data)
    assert [r for _, r in got] == [
        b"first line of prose",
        b"second line",
        b"  indented third",
        b"fourth",
    ]
    assert [n for n, _ in got] == [1, 2, 3, 4]


def test_a_stray_level_word_in_bare_text_does_not_swallow_the_rest() -> None:
    lines = [b"ERROR something happened"] + [b"prose line %d" % i for i in range(40)]
    got = records(b"\n".join(lines))
    # a few lines may join the stray start, the rest stay their own records
    assert len(got[0][1].split(b"\n")) <= 1 + WEAK_ALLOWANCE + 4
    assert len(got) >= 40 - WEAK_ALLOWANCE - 4
    assert sum(r.count(b"\n") + 1 for _, r in got) == 41  # nothing lost


def test_lines_before_the_first_start_stay_separate() -> None:
    data = b"banner text\n\n2024-01-02T03:04:05Z INFO up\n  detail\n"
    got = records(data)
    assert got == [(1, b"banner text"), (3, b"2024-01-02T03:04:05Z INFO up\n  detail")]


def test_crlf_missing_final_newline_and_empty_lines() -> None:
    data = (
        b"\r\n2024-01-02 03:04:05 INFO a\r\n\r\n\r\n2024-01-02 03:04:06 INFO b\r\n"
        b"   more\r\n\n2024-01-02 03:04:07 INFO c"
    )
    got = records(data)
    assert got == [
        (2, b"2024-01-02 03:04:05 INFO a"),
        (5, b"2024-01-02 03:04:06 INFO b\n   more"),
        (8, b"2024-01-02 03:04:07 INFO c"),
    ]


def test_a_byte_order_mark_does_not_hide_the_first_record_start() -> None:
    data = b"\xef\xbb\xbf2024-01-02 03:04:05 INFO a\nmore\n"
    assert records(data) == [(1, b"2024-01-02 03:04:05 INFO a\nmore")]


def test_empty_input_yields_nothing() -> None:
    assert records(b"") == []
    assert records(b"\n\n  \n") == []


def test_invalid_utf8_bytes_pass_through_untouched() -> None:
    data = b"2024-01-02 03:04:05 INFO caf\xe9 \xff\xfe\n"
    assert records(data) == [(1, data.rstrip(b"\n"))]


def test_very_long_line_is_kept_whole_without_a_cap() -> None:
    long_line = b"2024-01-02 03:04:05 INFO " + b"x" * (3 << 20)
    got = records(long_line + b"\n2024-01-02 03:04:06 INFO next\n")
    assert got[0] == (1, long_line)
    assert got[1] == (2, b"2024-01-02 03:04:06 INFO next")


def test_a_cap_keeps_one_byte_over_the_limit_and_reading_goes_on() -> None:
    long_line = b"2024-01-02 03:04:05 INFO " + b"y" * (3 << 20)
    data = long_line + b"\n\tat more\n2024-01-02 03:04:06 INFO next\n"
    got = records(data, max_record_bytes=1000)
    assert len(got) == 2
    assert len(got[0][1]) == 1001  # over the limit: the cleaner dead-letters it
    assert got[0][1] == long_line[:1001]
    assert got[1] == (3, b"2024-01-02 03:04:06 INFO next")


def test_a_cap_also_bounds_records_built_from_many_lines() -> None:
    data = (
        b"2024-01-02 03:04:05 ERROR x\n" + b"\tat frame\n" * 10_000 + b"2024-01-02 03:04:06 INFO y"
    )
    got = records(data, max_record_bytes=500)
    assert len(got) == 2
    assert len(got[0][1]) == 501
    assert got[1][0] == 10_002


def test_json_lines_and_pretty_printed_json() -> None:
    data = b'{"a": 1}\n{"a": 2}\n{\n  "a": 3,\n  "b": [1, 2]\n}\n{"a": 4}\n'
    got = records(data)
    assert [n for n, _ in got] == [1, 2, 3, 7]
    assert got[2][1] == b'{\n  "a": 3,\n  "b": [1, 2]\n}'


@pytest.mark.parametrize(
    "line",
    [
        b"2015-10-18 18:01:47,978 INFO [main] x: y",
        b"[2016-12-19 20:39:48,918] WARN x",
        b"[Sun Dec 04 04:47:44 2005] [notice] x",
        b"081109 203615 148 INFO dfs.DataNode: x",
        b"- 1117838570 2005.06.03 R02-M1 2005-06-03-15.42.50.675872 R02 RAS KERNEL INFO x",
        b"KERNDTLB 1118536327 2005.06.11 R30-M0 2005-06-11-17.32.07.581048 R30 RAS KERNEL FATAL x",
        b"nova-api.log.1.2017-05-16_13:53:08 2017-05-16 00:00:00.008 25746 INFO nova.x y",
        b"20171223-22:15:29:606|Step_LSC|30002312|x",
        b"20171223-23:7:6:86|Step_LSC|30002312|x",
        b"Jun 14 15:16:01 combo sshd(pam_unix)[19939]: x",
        b"<34>Oct 11 22:14:15 host su: x",
        b"17:26:48.079 WARN  o.s.OrderServiceImpl#361 x",
        b'{"log": "x"}',
        b"INFO starting",
        b"[ERROR] failed",
        b"ts=2024-01-01T00:00:00Z level=info msg=x",
        b"I0129 17:26:48.079123 1234 server.go:1] x",
    ],
)
def test_record_starts(line: bytes) -> None:
    assert is_record_start(line)


@pytest.mark.parametrize(
    "line",
    [
        b"java.io.IOException: Connection to 2 was disconnected",
        b"Caused by: java.lang.NullPointerException",
        b"Traceback (most recent call last):",
        b"ValueError: bad value",
        b"}",
        b"Error while reading the file",
    ],
)
def test_continuations_are_not_starts(line: bytes) -> None:
    assert not is_record_start(line)


def test_open_source_detects_gzip_by_magic_bytes_not_suffix(tmp_path: Path) -> None:
    payload = b"2024-01-02 03:04:05 INFO a\n2024-01-02 03:04:06 INFO b\n"
    disguised = tmp_path / "app.log"  # no .gz suffix
    disguised.write_bytes(gzip.compress(payload))
    with open_source(str(disguised)) as stream:
        assert [r for _, r in iter_records(stream)] == payload.splitlines()
    plain = tmp_path / "plain.gz"  # .gz suffix, not gzip
    plain.write_bytes(payload)
    with open_source(str(plain)) as stream:
        assert stream.read() == payload


def test_open_source_dash_reads_stdin_including_gzip(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = b"2024-01-02 03:04:05 INFO from stdin\n"

    class FakeStdin:
        def __init__(self, data: bytes) -> None:
            self.buffer = io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]

        def fileno(self) -> int:
            raise io.UnsupportedOperation("no fd under test")

    monkeypatch.setattr(sys, "stdin", FakeStdin(payload))
    assert open_source("-").read() == payload
    monkeypatch.setattr(sys, "stdin", FakeStdin(gzip.compress(payload)))
    assert open_source("-").read() == payload


def test_check_inputs_names_the_first_unusable_path(tmp_path: Path) -> None:
    good = tmp_path / "a.log"
    good.write_text("x\n")
    check_inputs([str(good), "-"])  # files and stdin are fine
    with pytest.raises(InputError, match=r"nope\.log: no such file"):
        check_inputs([str(good), str(tmp_path / "nope.log"), str(tmp_path)])
    with pytest.raises(InputError, match="is a folder"):
        check_inputs([str(tmp_path)])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_check_inputs_rejects_an_unreadable_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret.log"
    secret.write_text("x\n")
    secret.chmod(0)
    with pytest.raises(InputError, match="not readable"):
        check_inputs([str(secret)])


# --- records over the cap: whole size and hash, never silently cut -------------------
def raw_records(data: bytes, cap: int) -> list:
    from streams.ingest.reader import iter_raw_records

    return list(iter_raw_records(io.BytesIO(data), max_record_bytes=cap))


def test_a_one_megabyte_line_under_the_cap_is_kept_whole() -> None:
    line = b"2026-11-28T10:00:00Z ERROR " + b"x" * 1_000_000
    got = raw_records(line + b"\r\n" + b"2026-11-28T10:00:01Z INFO next\n", cap=1_040_000)
    assert got[0].data == line and got[0].size == len(line) and not got[0].cut
    assert got[0].sha256 is None
    assert got[1].data == b"2026-11-28T10:00:01Z INFO next" and got[1].line == 2


def test_a_line_over_the_cap_keeps_its_first_bytes_whole_size_and_hash() -> None:
    import hashlib

    line = b"2026-11-28T10:00:00Z ERROR " + bytes(range(32, 127)) * 30_000  # ~2.8 MB
    got = raw_records(line + b"\r\n" + b"2026-11-28T10:00:01Z INFO next\n", cap=100_000)
    big = got[0]
    assert big.cut and big.size == len(line)
    assert big.data == line[:100_001]
    assert big.sha256 == hashlib.sha256(line).hexdigest()
    assert got[1].data == b"2026-11-28T10:00:01Z INFO next"


def test_a_joined_record_over_the_cap_hashes_every_line_of_it() -> None:
    import hashlib

    head = b"2024-01-02 03:04:06,000 ERROR [main] boom"
    trace = [b"\tat com.acme.Frame.call(Frame.java:%d)" % i for i in range(3000)]
    long_cont = b"\t" + b"y" * (3 << 20)  # a continuation line longer than READ_CHUNK
    whole = b"\n".join([head, *trace, long_cont, b"\t... 2 more"])
    got = raw_records(whole + b"\n2024-01-02 03:04:07,000 INFO ok\n", cap=50_000)
    assert len(got) == 2
    assert got[0].size == len(whole) and got[0].data == whole[:50_001]
    assert got[0].sha256 == hashlib.sha256(whole).hexdigest()
    assert got[1].line == len(trace) + 4


def test_iter_records_still_caps_at_one_byte_over_the_limit() -> None:
    got = records(b"INFO " + b"z" * 5000 + b"\nINFO short\n", max_record_bytes=100)
    assert [len(r) for _, r in got] == [101, 10]
