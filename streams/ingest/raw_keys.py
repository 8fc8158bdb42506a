"""Message keys of ``retro.logs.raw``: the source name, optionally spread.

Key = source keeps one source's records in one partition, in order. A single busy
source then cannot use more than one partition, so ``retro produce --spread N`` keys
records ``<source>~<i mod N>``: N partitions share the source (the batcher orders
records by time anyway). The clean step strips the suffix back off.
"""

from __future__ import annotations

SPREAD_SEPARATOR = "~"


def raw_key(source: str, record_number: int, spread: int = 1) -> bytes:
    if spread <= 1:
        return source.encode()
    return f"{source}{SPREAD_SEPARATOR}{record_number % spread}".encode()


def source_of_key(key: bytes | None) -> str:
    if not key:
        return "unknown"
    text = key.decode("utf-8", "replace")
    base, sep, suffix = text.rpartition(SPREAD_SEPARATOR)
    return base if sep and base and suffix.isdigit() else text
