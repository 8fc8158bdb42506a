"""retro-stream: raw logs in, continuously updated AI post-mortems out.

Data flow (one subpackage or module per stage)::

    ingest/     files -> logical records -> retro.logs.raw
    clean/      detect format, normalize, redact, count tokens, cost -> fast | slow | dead letter
    batching.py token-budget windows per lane
    gateway/    model calls: AIMD concurrency, RPM/TPM buckets, retries, splitting, cache
    fragments.py validated retro fragments -> retro.fragments | retro.review
    compactor.py idempotent merge of fragments into reports -> retro.reports

Nothing happens at import time: build a :class:`streams.settings.Settings` and pass it down.
"""

__version__ = "0.1.0"
