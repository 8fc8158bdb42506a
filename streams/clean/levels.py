"""Log levels from every dialect mapped onto the seven levels of ``records.Level``.

One table so that ``warning``, ``WARN`` and syslog severity 4 are the same level
everywhere (batch grouping and reports key on it).
"""

from __future__ import annotations

from streams.records import Level

_WORDS: dict[str, Level] = {
    "trace": "TRACE",
    "finest": "TRACE",
    "finer": "TRACE",
    "debug": "DEBUG",
    "dbug": "DEBUG",
    "fine": "DEBUG",
    "verbose": "DEBUG",
    "info": "INFO",
    "information": "INFO",
    "informational": "INFO",
    "notice": "NOTICE",
    "note": "INFO",  # MySQL [Note]
    "warn": "WARN",
    "warning": "WARN",
    "err": "ERROR",
    "error": "ERROR",
    "severe": "ERROR",
    "crit": "FATAL",
    "critical": "FATAL",
    "alert": "FATAL",
    "emerg": "FATAL",
    "emergency": "FATAL",
    "fatal": "FATAL",
    "panic": "FATAL",
    "failure": "FATAL",  # IBM Blue Gene RAS severities: INFO ... FATAL, FAILURE
    # common abbreviations (zerolog, zap consoles, Serilog, PostgreSQL's LOG)
    "trc": "TRACE",
    "dbg": "DEBUG",
    "inf": "INFO",
    "log": "INFO",
    "wrn": "WARN",
    "eror": "ERROR",
    "crt": "FATAL",
    "ftl": "FATAL",
}
# one-letter levels, trusted only where a whole column of a source holds them
# (Android logcat V/D/I/W/E/F/A, glog/klog I/W/E/F): see streams.clean.infer
LETTERS: dict[str, Level] = {
    "V": "DEBUG",
    "D": "DEBUG",
    "I": "INFO",
    "W": "WARN",
    "E": "ERROR",
    "F": "FATAL",
    "A": "FATAL",
}

# RFC 5424 severities 0..7
_SYSLOG: tuple[Level, ...] = ("FATAL", "FATAL", "FATAL", "ERROR", "WARN", "NOTICE", "INFO", "DEBUG")
# bunyan / pino numeric levels: 10 trace ... 60 fatal
_BUNYAN: dict[int, Level] = {
    10: "TRACE",
    20: "DEBUG",
    30: "INFO",
    40: "WARN",
    50: "ERROR",
    60: "FATAL",
}

# Upper-case level words as they appear bare in text headers ("... WARN [main] ...").
# Lower-case words are only trusted in brackets or structured fields: "error" as the
# first word of a message is prose, "ERROR" after a timestamp is a level.
BARE_LEVEL_PATTERN = (
    "(?:" + "|".join(sorted((w.upper() for w in _WORDS), key=len, reverse=True)) + ")"
)


def syslog_severity(severity: int) -> Level | None:
    """RFC 5424 severity (PRI % 8) to a level."""
    return _SYSLOG[severity] if 0 <= severity <= 7 else None


def normalize_level(value: object) -> Level | None:
    """A level from a word (any case), a syslog severity 0-7 or a bunyan/pino number."""
    if isinstance(value, str):
        word = value.strip().lower()
        found = _WORDS.get(word)
        if found is None and word.isdigit():
            return normalize_level(int(word))
        if found is None and word[:5] == "debug" and word[5:].isdigit():
            return "DEBUG"  # PostgreSQL DEBUG1..DEBUG5
        return found
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if 0 <= value <= 7:
            return _SYSLOG[value]
        if 10 <= value <= 69:
            return _BUNYAN.get(value // 10 * 10)
    return None
