"""mask() skips substitutions by prefilter and memo, and must mask exactly as the plain
patterns do: every one of MASKS applied in order, none skipped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.clean.mining import _IP, MASKS, MEMO_MAX_CHARS, mask
from streams.dev.sample import write_sample

from helpers import shared_file

_PLAIN = tuple((re.compile(pattern), f"<{name}>") for pattern, name, _ in MASKS)

# the masks MASKS writes with the boundary checked behind their first character (so a
# search skips to that character), in their plain spelling: boundary first, no
# possessive quantifier; by their place in MASKS
PLAIN_SPELLINGS = {
    1: ("BLK", r"(?<![\w/])blk_-?\d+(?:[ ,]+blk_-?\d+)*"),
    3: ("IP", r"(?<![\w.])" + _IP + r"(?:,[ ]?" + _IP + r")*(?![\w.])"),
    5: ("PATH", r"(?<![\w/<>*])(?:/[\w.\-]+){2,}/?"),
    6: ("HEX", r"(?<![A-Za-z0-9_])0[xX][0-9a-fA-F]+(?![A-Za-z0-9_])"),
    8: ("NUM", r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:ms|us|ns|s|[KMGT]i?B|B)?(?![\w.])"),
}
_SPELLED = [(re.compile(MASKS[i][0]), re.compile(plain), f"<{name}>")
            for i, (name, plain) in PLAIN_SPELLINGS.items()]

# each one at the edge of a prefilter: a match its prefilter must not miss, or a near
# miss that no mask may take
TRICKY = [
    "",
    "   ",
    "at Sun Jul  3 13:52:21 2005 done",
    "Jun 3 12:00:00 host up",
    "June  3, 2024 10:00:01 2024",
    "Sept 3 10:00 x",
    "Sun, Jul 3 2005",
    "Tuesday September 10 11:12:13 CEST 2024",
    "Nov\t5 01:02 tab",
    "Mar\u20035 01:02:03 em space",
    "28/Nov/2026:09:29:40 +0000",
    "Nov 5",
    "NovX 5 1:02",
    "2024-01-02T03:04:05.123Z",
    "2024-01-02 03:04:05+01:00 and 2024-01-02",
    "12024-01-02",
    "2024-01-02.5",
    "x2024-01-02",
    "blk_-123 blk_456,blk_789 /blk_1",
    "123e4567-e89b-12d3-a456-426614174000",
    "ABCDEFAB-CDEF-ABCD-EFAB-CDEFABCDEFAB no digit",
    "x123e4567-e89b-12d3-a456-426614174000",
    "10.0.0.1:8080 1.2.3.4, 5.6.7.8,9.9.9.9",
    "1.2.3.4.5 v1.2.3.4 1.2.3",
    "\u0663.\u0664.\u0665.\u0666 Jan \u0663",
    "00:1A:2b:3C:4d:5E aa:bb:cc:dd:ee:ff:00 12:34:56",
    "ab:cd:ef:ab:cd:ef",
    "/var/log/x.log /a/b/ </a/b> */a/b a/b/c",
    "0x1F 0XdeadBEEF x0x1 0x",
    "deadbeef01 deadbeef 12345678 DEADBEEF9",
    "-12.5ms +3KiB 7B 1.2.3 4.5.",
    "Jul 3 12:00:00 2005 blk_1 0x1f 10.0.0.1 /a/b deadbeef01 42 00:11:22:33:44:55",
    "2024-01-02 10.0.0.1/24 /srv/2024-01-02/a.log",
    "0" * 64 + "g",
    "a1-b2c3-" * 40 + " 10.1.2.3",
    "Oct 1 " * 60 + "x",
    "/a" * 200 + " deadbeef01 " + "1.2.3.4 " * 20,
]


def plain_mask(text: str) -> str:
    """The reference: every pattern in order, with no prefilter and no memo."""
    for regex, replacement in _PLAIN:
        text = regex.sub(replacement, text)
    return text


def assert_masked_plainly(lines: list[str]) -> None:
    """Every line masks as the plain patterns do, the second time (a memo hit) too."""
    for line in lines:
        expected = plain_mask(line)
        assert mask(line) == expected, line
        assert mask(line) == expected, line


def assert_spelled_plainly(lines: list[str]) -> None:
    """Each mask written for speed substitutes exactly as its plain spelling."""
    for line in lines:
        for fast, plain, replacement in _SPELLED:
            assert fast.sub(replacement, line) == plain.sub(replacement, line), (replacement, line)


def test_masks_written_for_speed_are_their_plain_spellings() -> None:
    assert [MASKS[i][1] for i in PLAIN_SPELLINGS] == [n for n, _ in PLAIN_SPELLINGS.values()]
    assert_spelled_plainly(TRICKY)


def test_tricky_lines_mask_as_the_plain_patterns() -> None:
    assert any(len(line) > MEMO_MAX_CHARS for line in TRICKY)  # past the memo too
    assert_masked_plainly(TRICKY)


def test_sample_lines_mask_as_the_plain_patterns(tmp_path: Path) -> None:
    lines = [line for path in write_sample(tmp_path)
             for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    assert len(lines) > 3000
    assert_masked_plainly(lines)
    assert_spelled_plainly(lines)


def test_loghub_lines_mask_as_the_plain_patterns() -> None:
    paths = sorted(shared_file("loghub").glob("*/*_2k.log"))
    if not paths:
        pytest.skip("no loghub *_2k.log in the shared data")
    lines = [line for path in paths
             for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    assert_masked_plainly(lines)
    assert_spelled_plainly(lines)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789abcdefABCDEFxX-.:/_ \t,=blkJulSunNovMr")),
               max_size=80))
def test_prefiltered_masks_mask_exactly_as_their_plain_patterns(text: str) -> None:
    """The prefilters only skip substitutions that could not match."""
    assert mask(text) == plain_mask(text)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789+-.:/,_ <>*xXaBfKiGTmsblk")),
               max_size=60))
def test_masks_written_for_speed_match_as_their_plain_spellings(text: str) -> None:
    """Signs, dots, slashes and word characters around digits: the boundary behind the
    first character and the possessive digits find what the plain spellings find."""
    assert_spelled_plainly([text])
