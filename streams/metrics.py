"""Prometheus metrics, built on an explicit registry (nothing registers at import).

Names follow Prometheus conventions: base units, ``_total`` for counters,
``_seconds`` for durations, and only low-cardinality labels (lane, stage, reason,
format, kind, status).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """Every metric of the service; pass one instance to whoever records."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.records_in = Counter(
            "retro_records_consumed_total", "Records consumed by a stage", ["stage"], registry=r
        )
        self.records_out = Counter(
            "retro_records_routed_total",
            "Records routed by the clean stage",
            ["lane"],  # fast | slow | deadletter
            registry=r,
        )
        self.records_by_format = Counter(
            "retro_records_format_total", "Cleaned records by detected format", ["format"],
            registry=r,
        )
        self.deadletters = Counter(
            "retro_deadletter_total", "Records sent to the dead letter", ["stage", "reason"],
            registry=r,
        )
        self.offset_rereads = Counter(
            "retro_offset_rereads_total",
            "Partitions re-read from their committed offset because a record never reached "
            "an agent", ["topic"], registry=r,
        )
        self.redactions = Counter(
            "retro_redactions_total", "Secrets and PII replaced by placeholders", ["kind"],
            registry=r,
        )
        self.clean_seconds = Histogram(
            "retro_clean_duration_seconds", "Time to clean one record", registry=r,
            buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1),
        )
        self.batches = Counter(
            "retro_batches_total", "Batches flushed", ["lane", "trigger"], registry=r
        )
        self.batch_records = Histogram(
            "retro_batch_records", "Records per flushed batch", ["lane"], registry=r,
            buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000),
        )
        self.batch_tokens = Histogram(
            "retro_batch_input_tokens", "Estimated prompt tokens per batch", ["lane"],
            registry=r, buckets=(250, 500, 1000, 2000, 4000, 8000, 16000),
        )
        self.tokens = Counter(
            "retro_model_tokens_total", "Tokens reported by the provider", ["lane", "kind"],
            registry=r,  # kind: prompt | completion
        )
        self.model_calls = Counter(
            "retro_model_requests_total", "Model requests by outcome", ["lane", "status"],
            registry=r,  # status: ok | rate_limited | error | timeout | context | truncated
        )
        self.model_latency = Histogram(
            "retro_model_request_duration_seconds", "Model request latency", ["lane"],
            registry=r, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
        )
        self.rate_limited = Counter(
            "retro_model_rate_limited_total", "429 answers from the model provider", ["lane"],
            registry=r,
        )
        self.retries = Counter(
            "retro_model_retries_total", "Model request retries", ["lane", "reason"], registry=r
        )
        self.retry_budget_exhausted = Counter(
            "retro_model_retry_budget_exhausted_total",
            "Retries refused because the global retry budget was empty", ["lane"], registry=r,
        )
        self.splits = Counter(
            "retro_batch_splits_total", "Batches split in half", ["lane", "reason"], registry=r
        )
        self.concurrency_limit = Gauge(
            "retro_model_concurrency_limit", "Current AIMD concurrency limit", ["lane"],
            registry=r,
        )
        self.in_flight = Gauge(
            "retro_model_requests_in_flight", "Model requests in flight", ["lane"], registry=r
        )
        self.cache = Counter(
            "retro_model_cache_total", "Model answer cache lookups", ["lane", "result"],
            registry=r,  # result: hit | miss
        )
        self.fragments = Counter(
            "retro_fragments_total", "Fragments produced", ["lane"], registry=r
        )
        self.reviews = Counter(
            "retro_review_total", "Batches sent to review", ["lane", "reason"], registry=r
        )
        self.partitions_stalled = Gauge(
            "retro_partitions_stalled",
            "Owned input partitions with lag whose commit has not moved for RETRO_STALL_SECONDS",
            registry=r,
        )
        self.broker_reachable = Gauge(
            "retro_broker_reachable",
            "1 while a Kafka bootstrap server accepts connections, 0 while none has for a "
            "few seconds (readiness fails then)", registry=r,
        )
        self.consumer_lag = Gauge(
            "retro_consumer_lag_messages", "Messages behind the log end", ["topic", "partition"],
            registry=r,
        )
        self.report_updates = Counter(
            "retro_report_updates_total", "Fragments merged into reports", ["result"],
            registry=r,  # result: applied | duplicate | partial
        )
