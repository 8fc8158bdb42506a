"""The result of parsing one record, shared by every format parser."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from streams.clean.timestamps import Stamp
from streams.records import Level, LogFormat


@dataclass(slots=True)
class Parsed:
    """What a parser understood of a record; the cleaner turns it into a NormalizedRecord."""

    format: LogFormat
    message: str
    timestamp: datetime | None = None  # aware, UTC
    timestamp_rule: str | None = None  # how a missing year/zone/date was filled
    level: Level | None = None
    service: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    stamp: Stamp | None = field(default=None, repr=False, compare=False)  # for wrappers
