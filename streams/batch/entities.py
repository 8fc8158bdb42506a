"""Who a group of log lines is about: addresses, users, hosts and pods, counted.

An engineer reading "Authentication failures (1,477 records)" next asks which source
addresses sent them. The batch stage sees every record, so it counts the entities
over all of a template's records (not only the few examples a report keeps) on
incidents where they matter: errors and security events.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping

MAX_KEPT = 10  # entities kept per template: the most frequent, counts exact for those

_ENTITY = re.compile(
    r"(?P<ip>\b(?:\d{1,3}\.){3}\d{1,3}\b)"
    r"|\b(?:user(?:name)?[=: ]+|for (?:invalid user )?(?=\S+ from ))(?P<user>[A-Za-z_][\w.-]{1,31})"
    r"|\bhost(?:name)?[=: ]+(?P<host>[\w.-]{2,63})"
    r"|(?P<pod>\b[a-z][a-z0-9-]*-[a-z0-9]{8,10}-[a-z0-9]{5}\b)"
)
# events where who and from where matter even below medium severity
SECURITY = re.compile(r"auth|login|log in|password|denied|forbidden|unauthori[sz]|ssh|"
                      r"credential|token|brute|intrusion|invalid user", re.IGNORECASE)
_IGNORED_ADDRESSES = ("0.", "127.")
_NAMES = ("ip", "user", "host", "pod")  # _ENTITY's groups, in order: exactly one matches


def count_entities(texts: Iterable[str]) -> Counter[str]:
    """``"ip 10.0.0.7"``, ``"user alice"``, ``"host db-1"``, ``"pod api-7d9f8c6b5-x2x9q"``
    occurrences in ``texts`` (redacted values and loopback addresses left out)."""
    # each distinct text scanned once (a template's records repeat their messages), the
    # texts that repeat equally often in one findall over them joined by line breaks,
    # which no entity spans; so Python steps once per distinct entity, not per match
    by_times: dict[int, list[str]] = {}
    for text, times in Counter(texts).items():
        by_times.setdefault(times, []).append(text)
    counts = Counter[str]()
    for times, same in by_times.items():
        for found, n in Counter(_ENTITY.findall("\n".join(same))).items():
            name, value = next(item for item in zip(_NAMES, found, strict=True) if item[1])
            if "REDACTED" in value or (name == "ip" and value.startswith(_IGNORED_ADDRESSES)):
                continue
            counts[f"{name} {value}"] += n * times
    return counts


def top_entities(counts: Mapping[str, int], limit: int = MAX_KEPT) -> dict[str, int]:
    """The ``limit`` most frequent, ties by name, as an ordered dict."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    return dict(ranked)


def worth_counting(severity: str, *texts: str) -> bool:
    """Entities are counted on errors and on security events, where a person acts on them."""
    return severity in ("medium", "high", "critical") or any(SECURITY.search(t) for t in texts)
