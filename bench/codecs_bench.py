"""What each Kafka codec costs a worker on the messages it sends most: the lanes.

Clean runs on the generated sample (as in ``steps_bench.py``); its lane messages are
cut into batches of ``--batch-kib`` (the stage producer's batch size) and each codec
compresses and reads every batch as aiokafka does (``aiokafka.codec``, the functions
its record batches call, at their default levels). Printed per codec: CPU µs a lane
message to compress and to read, and compressed bytes / raw bytes.

Run: ``.venv/bin/python bench/codecs_bench.py [--records 20000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import add_tag_argument, table, write_result
from aiokafka import codec
from steps_bench import as_records, drive, raw_messages

from streams.clean.cleaner import Cleaner
from streams.clean.step import CleanStep
from streams.metrics import Metrics
from streams.runtime.memory import Part
from streams.settings import Settings

CODECS: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
    "gzip": (codec.gzip_encode, codec.gzip_decode),
    "snappy": (codec.snappy_encode, codec.snappy_decode),
    "lz4": (codec.lz4_encode, codec.lz4_decode),
    "zstd": (codec.zstd_encode, codec.zstd_decode),
}


async def lane_messages(settings: Settings, records: int) -> list[bytes]:
    metrics = Metrics()
    with tempfile.TemporaryDirectory() as tmp:
        raw = raw_messages(records, Path(tmp))
    _, run = await drive(CleanStep(settings, Cleaner.from_settings(settings, metrics=metrics),
                                   metrics), raw, [Part("raw", 0)])
    lanes = as_records(run.sent, {settings.topics.fast, settings.topics.slow})
    return [m.value for m in lanes if m.value is not None]


def batches(values: list[bytes], size: int) -> list[bytes]:
    """Values joined into batches of about ``size`` bytes, as the producer fills them."""
    out: list[bytes] = []
    current: list[bytes] = []
    filled = 0
    for value in values:
        current.append(value)
        filled += len(value)
        if filled >= size:
            out.append(b"".join(current))
            current, filled = [], 0
    if current:
        out.append(b"".join(current))
    return out


def cpu_of(fn: Callable[[bytes], bytes], items: list[bytes]) -> tuple[float, list[bytes]]:
    started = time.process_time()
    results = [fn(item) for item in items]
    return time.process_time() - started, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-kib", type=int, default=256)
    add_tag_argument(parser)
    args = parser.parse_args()
    values = asyncio.run(lane_messages(Settings(), args.records))
    chunks = batches(values, args.batch_kib * 1024)
    raw_bytes = sum(map(len, chunks))
    result: dict[str, dict[str, float]] = {}
    for name, (encode, decode) in CODECS.items():
        write, read = [], []
        for _ in range(args.repeat):
            seconds, packed = cpu_of(encode, chunks)
            write.append(seconds)
            read.append(cpu_of(decode, packed)[0])
        result[name] = {"write_us": statistics.median(write) / len(values) * 1e6,
                        "read_us": statistics.median(read) / len(values) * 1e6,
                        "ratio": sum(map(len, packed)) / raw_bytes}
    print(f"{len(values)} lane messages, {raw_bytes:,} bytes in {len(chunks)} batches of "
          f"~{args.batch_kib} KiB; median of {args.repeat}")
    print(table(["codec", "compress µs/msg", "read µs/msg", "bytes / raw"],
                [[n, round(r["write_us"], 2), round(r["read_us"], 2), round(r["ratio"], 3)]
                 for n, r in result.items()]))
    write_result("codecs", {"messages": len(values), "raw_bytes": raw_bytes,
                            "codecs": result}, args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
