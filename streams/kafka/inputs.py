"""The input topics: the listed ones (``RETRO_TOPICS__RAW``) plus those matching
``RETRO_TOPICS__RAW_PATTERN``, as users have them (created by someone else, any
partition count).

The pattern never matches the pipeline's own topics or faust's internal ones: a
pattern as broad as ``.*`` must not feed the lanes back into the clean stage.
"""

from __future__ import annotations

import re
from typing import Any

from streams.settings import Settings


def own_topics(settings: Settings) -> list[str]:
    t = settings.topics
    return [t.fast, t.slow, t.deadletter, t.fragments, t.traces, t.review, t.reports]


def input_pattern(settings: Settings) -> str:
    """One regex (``re.match`` semantics, as aiokafka's ``subscribe(pattern=)``) for every
    input: the listed topics or the pattern, never our own or faust's topics."""
    own = "|".join(re.escape(n) for n in own_topics(settings))
    listed = "|".join(re.escape(n) for n in settings.topics.raw_topics)
    internal = re.escape(settings.app_id)  # faust's changelogs and assignor topics
    wanted = f"(?:{listed})$"
    if settings.topics.raw_pattern:
        wanted = f"(?:{wanted}|(?:{settings.topics.raw_pattern}))"
    return f"(?!(?:{own})$)(?!{internal}-)(?!__){wanted}"


def matching(settings: Settings, names: list[str] | set[str]) -> list[str]:
    """The input topics among ``names`` (a cluster's topic list)."""
    regex = re.compile(input_pattern(settings))
    return sorted(n for n in names if regex.match(n))


async def input_topics(settings: Settings, consumer: Any) -> list[str]:
    """Every input topic the cluster has now (listed topics missing from it excluded)."""
    return matching(settings, await consumer.topics())
