"""HTTP access logs (NCSA common / combined, as Apache httpd and nginx write them).

``host ident user [day/Mon/year:H:M:S zone] "request" status size ["referrer" "agent"]``,
optionally after a virtual-host field (Apache ``%v``). The time is not at the start,
and there is no level: the status class stands in for one (5xx ERROR, 4xx WARN,
everything else INFO), so failing requests surface like failing log lines.
"""

from __future__ import annotations

import re

from streams.clean.parsed import Parsed
from streams.clean.timestamps import TimeResolver, match_leading
from streams.records import Level

_ACCESS = re.compile(
    r"(?:(?P<vhost>\S+) )?(?P<client>\S+) (?P<ident>\S+) (?P<user>\S+) "
    r"\[(?P<time>[^\]]{10,40})\] "
    r'"(?P<request>(?:[^"\\]|\\.)*)" (?P<status>\d{3}) (?P<size>\d+|-)'
    r'(?: "(?P<referrer>(?:[^"\\]|\\.)*)" "(?P<agent>(?:[^"\\]|\\.)*)")?'
)


def status_level(status: int) -> Level:
    """The level an HTTP status stands for: 5xx ERROR, 4xx WARN, else INFO."""
    if status >= 500:
        return "ERROR"
    if status >= 400:
        return "WARN"
    return "INFO"


def parse_access(line: str, times: TimeResolver) -> Parsed | None:
    """One access-log line, or ``None`` when the line is not one."""
    if '"' not in line or "[" not in line:
        return None
    m = _ACCESS.match(line)
    if m is None:
        return None
    stamp = match_leading(m["time"])
    if stamp is None or stamp.month is None:
        return None
    status = int(m["status"])
    parsed = Parsed("text", f'"{m["request"]}" {status} {m["size"]}', level=status_level(status))
    parsed.stamp = stamp
    parsed.timestamp, parsed.timestamp_rule = times.resolve(stamp)
    attrs = parsed.attributes
    attrs["client"] = m["client"]
    if m["vhost"]:
        attrs["vhost"] = m["vhost"]
    if m["user"] != "-":
        attrs["user"] = m["user"]
    attrs["request"] = m["request"]
    attrs["status"] = status
    if m["size"] != "-":
        attrs["size"] = int(m["size"])
    if m["referrer"] is not None:
        attrs["referrer"] = m["referrer"]
        attrs["agent"] = m["agent"]
    rest = line[m.end() :].strip()
    if rest:
        attrs["extra"] = rest  # e.g. nginx's request time or upstream fields
    return parsed
