"""Leading-timestamp recognition and the rules that complete partial timestamps.

Logs rarely say everything: syslog has no year, most app logs have no zone, some
only a time of day. Rather than guess silently, :class:`TimeResolver` fills the
gap with a stated rule (``year-assumed:2026``, ``zone-assumed:UTC``) that travels
with the record as ``timestamp_rule``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from streams.errors import ConfigError

MONTHS = {
    m: i
    for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_FRAC = r"(?:(?P<fsep>[.,:])(?P<frac>\d{1,9}))?"
_ZONE = r"(?:\s?(?P<zone>Z|[+-]\d{2}:?\d{2})(?![\d:])|\s(?P<zname>UTC|GMT)\b)?"
_HMS = r"(?P<H>\d{1,2}):(?P<M>\d{2}):(?P<S>\d{2})"

# Digit-first layouts, tried in order. Each has named groups y/mo/d (date) and H/M/S.
_ISO = re.compile(
    r"(?P<y>\d{4})(?P<sep>[-/.])(?P<mo>\d{1,2})(?P=sep)(?P<d>\d{1,2})"
    r"(?:[T _-](?P<H>\d{1,2})[:.](?P<M>\d{2})[:.](?P<S>\d{2})" + _FRAC + r")?" + _ZONE
)
_COMPACT = re.compile(  # 20171223-22:15:29:606, also with an unpadded clock 20171223-23:7:6:86
    r"(?P<y>\d{4})(?P<mo>\d{2})(?P<d>\d{2})[-T ](?P<H>\d{1,2}):(?P<M>\d{1,2}):(?P<S>\d{1,2})(?!\d)"
    + _FRAC
    + _ZONE
)
_BASIC = re.compile(  # ISO 8601 basic: 20171223T221529Z
    r"(?P<y>\d{4})(?P<mo>\d{2})(?P<d>\d{2})T?(?P<H>\d{2})(?P<M>\d{2})(?P<S>\d{2})(?!\d)"
    + _FRAC
    + _ZONE
)
_YYMMDD = re.compile(
    r"(?P<yy>\d{2})(?P<mo>\d{2})(?P<d>\d{2}) (?P<H>\d{2})(?P<M>\d{2})(?P<S>\d{2})(?!\d)"
)
_DMY = re.compile(
    r"(?P<d>\d{1,2})[/ -](?P<mon>" + _MON + r")[/ -](?P<y>\d{4})[: ]" + _HMS + _FRAC + _ZONE
)
_TOD = re.compile(_HMS + r"(?:[.,](?P<frac>\d{1,9}))?(?![\d:])")
# Letter-first layouts.
_CTIME = re.compile(  # Sun Dec 04 04:47:44 2005 (Apache, asctime)
    _DAY
    + r" (?P<mon>"
    + _MON
    + r") +(?P<d>\d{1,2}) "
    + _HMS
    + _FRAC
    + r"(?: (?P<zname>UTC|GMT|[A-Z]{3}))? (?P<y>\d{4})"
)
_RFC2822 = re.compile(  # Sun, 04 Dec 2005 04:47:44 +0000
    _DAY + r", (?P<d>\d{1,2}) (?P<mon>" + _MON + r") (?P<y>\d{4}) " + _HMS + _FRAC + _ZONE
)
_SYSLOG = re.compile(  # Jun 14 15:16:01 (RFC 3164: no year, no zone)
    r"(?P<mon>" + _MON + r") +(?P<d>\d{1,2})(?: (?P<y>\d{4}))? " + _HMS + _FRAC + r"(?= |$)"
)
MAX_OFFSET = timedelta(hours=18)  # what datetime.timezone accepts, with margin
QUARTER = timedelta(minutes=15)  # every UTC offset in use is a whole number of these
EARLIEST_OFFSET, LATEST_OFFSET = timedelta(hours=-12), timedelta(hours=14)  # UTC-12 .. UTC+14
# how much later than the line a shipper may stamp it (read, batch, flush) and how much
# earlier (another host's clock) for the gap between both to still name the line's zone
SHIPPER_LAG = timedelta(seconds=60)
CLOCK_SKEW = timedelta(seconds=2)
_DIGIT_LAYOUTS = (_ISO, _COMPACT, _BASIC, _YYMMDD, _DMY, _TOD)
_LETTER_LAYOUTS = (_SYSLOG, _CTIME, _RFC2822)
# the letters a month name (_SYSLOG) or a day name (_CTIME, _RFC2822) starts with: a
# word starting otherwise ("time=", "level", "INFO") is no timestamp, without a regex
_LETTER_STARTS = frozenset("JFMASONDTW")


class Stamp(NamedTuple):
    """The fields a leading timestamp stated; ``None`` means the text did not say.

    A named tuple rather than a frozen dataclass: as immutable, and built with one
    call instead of a guarded attribute store per field (a stamp is made per record).
    """

    year: int | None
    month: int | None
    day: int | None
    hour: int
    minute: int
    second: int
    microsecond: int
    offset: timedelta | None  # stated UTC offset
    end: int  # index just after the timestamp in the text


def _micro(frac: str | None, sep: str | None = ".") -> int:
    """Microseconds of a fraction; up to 3 digits after a colon count milliseconds (H:M:S:ms)."""
    if not frac:
        return 0
    if sep == ":" and len(frac) <= 3:
        return int(frac) * 1000
    return int((frac + "000000")[:6])


def _offset(zone: str | None, zname: str | None) -> timedelta | None:
    if zone:
        if zone == "Z":
            return timedelta(0)
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        return sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    if zname in ("UTC", "GMT"):
        return timedelta(0)
    return None


def _stamp(m: re.Match[str]) -> Stamp | None:
    g = m.groupdict()
    hour_text = g.get("H")
    if hour_text is None:  # a bare date: midnight
        hour = minute = second = 0
    else:
        hour, minute, second = int(hour_text), int(g["M"]), int(g["S"])
    yy = g.get("yy")
    if yy is not None:
        short = int(yy)
        year: int | None = 2000 + short if short < 70 else 1900 + short
    else:
        y = g.get("y")
        year = int(y) if y else None
    mon = g.get("mon")
    if mon:
        month: int | None = MONTHS[mon.lower()]
    else:
        mo = g.get("mo")
        month = int(mo) if mo else None
    d = g.get("d")
    day = int(d) if d else None
    if hour > 23 or minute > 59 or second > 60 or (month is not None and not 1 <= month <= 12):
        return None
    if day is not None and not 1 <= day <= 31:
        return None
    zone, zname = g.get("zone"), g.get("zname")
    offset = _offset(zone, zname) if zone or zname else None
    if offset is not None and abs(offset) > MAX_OFFSET:
        return None
    frac = g.get("frac")
    return Stamp(
        year,
        month,
        day,
        hour,
        minute,
        min(second, 59),
        _micro(frac, g.get("fsep")) if frac else 0,
        offset,
        m.end(),
    )


def match_leading(text: str, pos: int = 0) -> Stamp | None:
    """The timestamp starting at ``text[pos]`` in any known layout, else ``None``."""
    if pos >= len(text):
        return None
    first = text[pos]
    layouts = (_DIGIT_LAYOUTS if first.isdigit()
               else _LETTER_LAYOUTS if first in _LETTER_STARTS else ())
    for layout in layouts:
        m = layout.match(text, pos)
        if m is not None:
            stamp = _stamp(m)
            if stamp is not None:
                return stamp
    return None


# a whole ISO-8601 instant with its zone, as JSON loggers and shippers write their time;
# ASCII digits only, the cheaper test: datetime.fromisoformat refuses any other digit
_EXACT_ISO = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})", re.ASCII)


def exact_instant(text: str) -> tuple[Stamp, datetime] | None:
    """``text`` read as one whole zoned ISO-8601 instant: its stamp and UTC time, as
    ``match_leading`` and ``TimeResolver.resolve`` read it (no rule: nothing is
    assumed), by the C parser at a fraction of their cost; None for any other text."""
    if _EXACT_ISO.fullmatch(text) is None:
        return None
    try:
        dt = datetime.fromisoformat(text)
        utc = dt.astimezone(UTC)
    except (ValueError, OverflowError):  # hour 24, day 32, out of range in UTC
        return None
    offset = dt.utcoffset()
    if offset is None or abs(offset) > MAX_OFFSET:
        return None
    return Stamp(dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second, dt.microsecond,
                 offset, len(text)), utc


def time_of_day_at(text: str, pos: int = 0) -> bool:
    """True if ``text[pos]`` starts a bare time of day (``12:46:51``, ``17:26:32.809``)."""
    return _TOD.match(text, pos) is not None


def from_number(value: float) -> datetime | None:
    """A Unix time in s, ms, µs or ns (JSON ``ts`` fields), picked by magnitude."""
    if value != value or value <= 0:  # NaN or not a time
        return None
    if value >= 1e17:
        seconds = value / 1e9
    elif value >= 1e14:
        seconds = value / 1e6
    elif value >= 1e11:
        seconds = value / 1e3
    else:
        seconds = value
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


ONE_DAY = timedelta(days=1)
_FIXED_ZONES: dict[timedelta, timezone] = {}  # offsets in use are few: one zone object each


def _fixed_zone(offset: timedelta) -> timezone:
    zone = _FIXED_ZONES.get(offset)
    if zone is None:
        if len(_FIXED_ZONES) >= 256:
            _FIXED_ZONES.clear()
        zone = _FIXED_ZONES[offset] = timezone(offset)
    return zone


def load_zone(name: str) -> tzinfo:
    """The zone for timestamps that name none; a clear error for a typo."""
    if name.upper() in ("UTC", "Z", "GMT"):
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(
            f"unknown time zone {name!r} for RETRO_CLEAN__DEFAULT_TIMEZONE; "
            "use an IANA name such as UTC or Europe/Paris"
        ) from exc


class TimeResolver:
    """Turns a :class:`Stamp` into an aware UTC datetime plus the rule that completed it."""

    def __init__(
        self,
        *,
        default_year: int | None,
        default_timezone: str,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._default_year = default_year
        self._zone = load_zone(default_timezone)
        self._zone_name = "UTC" if self._zone is UTC else default_timezone
        self._zone_rule = f"zone-assumed:{self._zone_name}"
        self._clock = clock or (lambda: datetime.now(UTC))

    def resolve(self, stamp: Stamp) -> tuple[datetime | None, str | None]:
        """UTC datetime and rule; ``(None, None)`` if the stamp names no date (time of day)."""
        if stamp.month is None or stamp.day is None:
            return None, None
        offset = stamp.offset
        tz = self._zone if offset is None else _fixed_zone(offset)
        year = stamp.year
        if year is None:
            year = self._default_year if self._default_year is not None else self._clock().year
        try:  # the date as stated, else the walk back of _build
            local: datetime | None = datetime(year, *stamp[1:7])
        except ValueError:
            local = self._build(year, stamp)
            if local is None:
                return None, None
        try:
            dt = local.replace(tzinfo=tz).astimezone(UTC)
        except OverflowError:  # year 1 or 9999 pushed out of range by the offset
            return None, None
        if stamp.year is None:
            # "This year" must not put a record in the future: Dec 31 read on Jan 1.
            if self._default_year is None and dt > self._clock() + ONE_DAY:
                earlier = self._build(local.year - 1, stamp)
                if earlier is not None:
                    local, dt = earlier, earlier.replace(tzinfo=tz).astimezone(UTC)
            rule = f"year-assumed:{local.year}"
            return dt, rule if offset is not None else f"{rule},{self._zone_rule}"
        return dt, self._zone_rule if offset is None else None

    @staticmethod
    def _build(year: int, stamp: Stamp) -> datetime | None:
        # Feb 29 without a year: walk back to the last leap year rather than drop the time.
        assert stamp.month is not None and stamp.day is not None
        for y in range(year, year - (8 if stamp.year is None else 1), -1):
            try:
                return datetime(
                    y,
                    stamp.month,
                    stamp.day,
                    stamp.hour,
                    stamp.minute,
                    stamp.second,
                    stamp.microsecond,
                )
            except ValueError:
                continue
        return None

    def on_wrapper_date(self, stamp: Stamp, wrapper: datetime) -> tuple[datetime, str]:
        """Complete an inner time (of day, or zone-less) from a wrapper's exact UTC time.

        The wrapper (Docker ``time``) is exact; the inner clock has the app's precision
        and local zone. The zone is the quarter-hour offset between both clocks, and
        the date is the one that puts the inner time nearest the wrapper's.
        """
        inner_tod = timedelta(
            hours=stamp.hour,
            minutes=stamp.minute,
            seconds=stamp.second,
            microseconds=stamp.microsecond,
        )
        outer_tod = wrapper - wrapper.replace(hour=0, minute=0, second=0, microsecond=0)
        quarters = round((inner_tod - outer_tod) / timedelta(minutes=15)) % 96
        if quarters > 56:  # offsets run from -12:00 to +14:00
            quarters -= 96
        offset = timedelta(minutes=15 * quarters)
        local_day = (wrapper + offset).date()
        if stamp.month is not None and stamp.day is not None and stamp.year is not None:
            with contextlib.suppress(ValueError):
                local_day = date(stamp.year, stamp.month, stamp.day)
        candidate = datetime.combine(local_day, datetime.min.time(), UTC) + inner_tod - offset
        for shift in (timedelta(days=-1), timedelta(days=1)):
            if abs(candidate + shift - wrapper) < abs(candidate - wrapper):
                candidate += shift
        has_date = stamp.year is not None and stamp.month is not None
        rule = "zone-from-wrapper" if has_date else "date-from-wrapper"
        return candidate, rule

    def on_envelope(self, stamp: Stamp, exact: datetime) -> tuple[datetime, list[str]] | None:
        """Complete a zone-less line time from a shipper's exact UTC time, with what was
        taken from it (``date-from``, ``year-from``, ``zone-from``); None if nothing fits.

        A time of day takes the envelope's date and quarter-hour offset: it has no other
        source. A date is only completed when the envelope names its zone: the shipper's
        time is the line's wall time shifted by a whole number of quarter hours (an offset
        in use, UTC-12 to UTC+14) plus a short shipping lag. Any other gap is a read
        delay (a backlog, a restarted shipper), which says nothing about the zone.
        """
        if stamp.offset is not None:
            return None
        if stamp.month is None or stamp.day is None:
            when, _ = self.on_wrapper_date(stamp, exact)
            return when, ["date-from"]
        utc_wall = exact.astimezone(UTC).replace(tzinfo=None)
        years = [stamp.year] if stamp.year is not None else [
            utc_wall.year - 1, utc_wall.year, utc_wall.year + 1]
        walls = [wall for year in years if (wall := _wall(year, stamp)) is not None]
        if not walls:
            return None
        wall = min(walls, key=lambda w: abs(w - utc_wall))  # a missing year: the nearest
        offset = round((wall - utc_wall) / QUARTER) * QUARTER
        if not EARLIEST_OFFSET <= offset <= LATEST_OFFSET:
            return None
        when = (wall - offset).replace(tzinfo=UTC)
        if not -CLOCK_SKEW <= exact - when <= SHIPPER_LAG:
            return None
        return when, (["zone-from"] if stamp.year is not None else ["year-from", "zone-from"])


def _wall(year: int, stamp: Stamp) -> datetime | None:
    """The stamp's wall-clock time in ``year`` (naive), if that date exists."""
    assert stamp.month is not None and stamp.day is not None
    try:
        return datetime(year, stamp.month, stamp.day, stamp.hour, stamp.minute, stamp.second,
                        stamp.microsecond)
    except ValueError:
        return None
