"""Which template covers which: one event's texts from before and after its drain3
cluster generalised, and from two workers' miners."""

from __future__ import annotations

import itertools
import json

import pytest

from streams.batch.covering import canonical_templates, covers, most_general

ROOT_T = "Failed password for root from <IP> port <NUM> ssh2"
ADMIN_T = "Failed password for admin from <IP> port <NUM> ssh2"
ANY_T = "Failed password for <*> from <IP> port <NUM> ssh2"
WIDER_T = "Failed <*> for <*> from <IP> port <NUM> ssh2"
KEY_T = "Accepted publickey for deploy from <IP> port <NUM> ssh2"


@pytest.mark.parametrize(("general", "specific", "expected"), [
    (ANY_T, ROOT_T, True),
    (ROOT_T, ANY_T, False),
    (ROOT_T, ROOT_T, True),
    (WIDER_T, ROOT_T, True),  # through two positions
    (WIDER_T, ANY_T, True),
    (ANY_T, KEY_T, False),  # a literal differs: "password" / "publickey"
    (ROOT_T, ADMIN_T, False),
    ("Disk <*> full", "Disk <NUM> full", True),
    ("Disk <NUM> full", "Disk 3 full", True),  # a mask covers a literal value
    ("Disk <NUM> full", "Disk <*> full", False),  # ... not the wider placeholder
    ("Disk <NUM> full", "Disk <IP> full", False),  # ... nor another mask
    ("Disk <*> full", "Disk <*> full now", False),  # token counts differ
    ("Disk   <*>  full", "Disk 3 full", True),  # whitespace runs are one separator
])
def test_covers(general: str, specific: str, expected: bool) -> None:
    assert covers(general, specific) is expected


def test_canonical_templates_are_a_function_of_the_set() -> None:
    family = [ROOT_T, ADMIN_T, ANY_T, WIDER_T, KEY_T, "Connection closed by <IP>"]
    results = {json.dumps(canonical_templates(p), sort_keys=True)
               for p in itertools.permutations(family)}
    assert len(results) == 1
    resolved = canonical_templates(family)
    assert {t: resolved[t] for t in (ROOT_T, ADMIN_T, ANY_T, WIDER_T)} == dict.fromkeys(
        (ROOT_T, ADMIN_T, ANY_T, WIDER_T), WIDER_T)
    assert resolved[KEY_T] == KEY_T
    # neither specific text covers the other: no canonical one among just the two
    assert canonical_templates([ROOT_T, ADMIN_T]) == {ROOT_T: ROOT_T, ADMIN_T: ADMIN_T}
    assert most_general([ROOT_T, ADMIN_T]) is None
    assert most_general([ADMIN_T, ANY_T, ROOT_T]) == ANY_T


def test_a_template_with_two_incomparable_generalisers_goes_to_the_more_general() -> None:
    one_wildcard = "Failed password for <*> from <IP> port <NUM> ssh2"
    other = "Failed <*> for root from <IP> port <NUM> ssh2"
    two = "<*> <*> for root from <IP> port <NUM> ssh2"
    assert not covers(one_wildcard, other) and not covers(other, one_wildcard)
    resolved = canonical_templates([ROOT_T, one_wildcard, other])
    # equal weight: the order falls back to length, then text, never to arrival
    assert resolved[ROOT_T] == min(one_wildcard, other, key=lambda t: (len(t), t))
    assert canonical_templates([ROOT_T, one_wildcard, two])[ROOT_T] == two


def _canonical_uncached(templates: list[str]) -> dict[str, str]:
    """The mapping as it was computed before sets were remembered."""
    from streams.batch.covering import _rank

    roots: list[str] = []
    out: dict[str, str] = {}
    for template in sorted(set(templates), key=_rank):
        root = next((r for r in roots if covers(r, template)), None)
        if root is None:
            roots.append(template)
            root = template
        out[template] = root
    return out


def test_a_remembered_set_answers_as_a_fresh_one_and_hands_out_its_own_dict() -> None:
    family = [ROOT_T, ADMIN_T, ANY_T, WIDER_T, KEY_T, "Connection closed by <IP>",
              "Disk <NUM> full", "Disk <*> full", "Disk 3 full", "  Disk   4 full "]
    for size in range(len(family) + 1):
        for subset in itertools.combinations(family, size):
            expected = _canonical_uncached(list(subset))
            for _ in range(2):  # computed, then remembered
                got = canonical_templates(subset)
                assert list(got.items()) == list(expected.items())  # same order too
                got.clear()  # a caller may change its copy: the next answer is whole
