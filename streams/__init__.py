"""retro-stream: raw logs in, continuously updated AI post-mortems out.

Packages, in flow order::

    ingest/   files or stdin -> logical records -> the raw topic (retro produce)
    clean/    formats, timestamps, redaction, templates, tokens, lanes -> fast | slow | dead letter
    batch/    token-budget windows per lane, prompts, answer checks -> fragments | review
    gateway/  model calls within a provider's limits: AIMD, RPM/TPM buckets, retries, cache
    report/   fragments merged into reports, the post-mortem, views, the audit (retro audit)
    notify/   incidents to Alertmanager and a chat webhook as they open, escalate and end
    kafka/    connecting, topics, reading topics outside the stage loops, batching, lag,
              stall and broker health
    runtime/  the one loop every stage runs on: fetch, step, send, commit
    worker/   each stage's step on the runtime, and the HTTP views
    dev/      local broker, simulated provider, sample and fault generators, demo

Below them all sits the shared vocabulary (records, settings, errors, intervals, metrics,
schemas, clock); app.py builds a worker, runner.py runs it, cli.py holds the commands.
Nothing happens at import time: build a :class:`streams.settings.Settings` and pass it down.
"""

__version__ = "0.1.0"
