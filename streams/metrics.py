"""Prometheus metrics, built on an explicit registry (nothing registers at import).

Names follow Prometheus conventions: base units, ``_total`` for counters,
``_seconds`` for durations, and only low-cardinality labels (lane, stage, reason,
format, kind, status).
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

LANES = ("fast", "slow")
# Label values known up front: their series start at 0 so no panel shows "No data".
CALL_STATUSES = ("ok", "rate_limited", "error", "timeout", "context", "truncated")
RETRY_REASONS = ("rate_limited", "timeout", "server_error", "connection", "malformed_output")
REVIEW_REASONS = ("model_unavailable", "retry_budget_exhausted", "malformed_output",
                  "validation_failed")
SPLIT_REASONS = ("context_length", "truncated")
# Dead letters a worker counts, by stage: the clean stage's (streams/clean/cleaner.py and
# the RecordError reasons of streams/errors.py) and a lane message that is no record.
DEADLETTER_REASONS = {
    "clean": ("undecodable", "binary", "too_large", "bad_envelope", "empty_envelope",
              "parse_error", "clean_error", "bad_record"),
    "batch": ("bad_record",),
}
QUOTA_KINDS = ("requests", "tokens")  # the provider's x-ratelimit-* kinds
NOTIFY_SINKS = ("alertmanager", "webhook")
NOTIFY_OUTCOMES = ("sent", "retried", "failed", "rejected", "dropped")
# OpenTelemetry GenAI semantic conventions (gen_ai.client.*), in Prometheus form.
GENAI_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
GENAI_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                          20.48, 40.96, 81.92)


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
        self.records_by_envelope = Counter(
            "retro_records_envelope_total",
            "Cleaned records that came in a shipper's envelope, by envelope (lines that "
            "came bare are not counted)", ["envelope"], registry=r,
        )
        self.deadletters = Counter(
            "retro_deadletter_total", "Records sent to the dead letter", ["stage", "reason"],
            registry=r,
        )
        self.trace_marks = Counter(
            "retro_trace_marks_total",
            "Trace marks the trace stage read: timed (their trace's hops were sent), late "
            "(their trace had closed), unreadable",
            ["outcome"], registry=r,
        )
        self.offset_rereads = Counter(
            "retro_offset_rereads_total",
            "Partitions re-read from their committed offset: a stage loop rejoined (an "
            "output not delivered, a record held too long)", ["topic"],
            registry=r,
        )
        self.redactions = Counter(
            "retro_redactions_total", "Secrets and PII replaced by placeholders", ["kind"],
            registry=r,
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
            "retro_model_rate_limited_total",
            "429 answers from the model provider by the limit they name", ["lane", "limit"],
            # limit: requests | tokens | gateway (a proxy's own "no deployments available")
            # | unknown; the count is requests_total's
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
        self.redriven_records = Counter(
            "retro_review_redriven_records_total",
            "Parked records sent to the lanes again by the re-drive loop", ["reason"],
            registry=r,
        )
        self.redrive_probes_failed = Counter(
            "retro_review_redrive_probes_failed_total",
            "Provider probes that failed before a re-drive (each one waits a backoff)",
            registry=r,
        )
        self.redrive_probes = Counter(
            "retro_review_redrive_probes_total",
            "One-token provider probes the re-drive loop sent (through the RPM/TPM buckets, "
            "at most one in flight and one per backoff step)", ["result"],
            registry=r,  # result: healthy | unhealthy
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
        self.leader_changes = Counter(
            "retro_partition_leader_changes_total",
            "Input partitions whose leader broker changed between two lag measurements (a "
            "broker failed or took its partitions back)", registry=r,
        )
        self.worker_roles = Gauge(
            "retro_worker_role_info",
            "1 for each role this worker runs: clean, batch, compactor (all three in the "
            "all-in-one worker)", ["worker_role"], registry=r,
        )
        self.consumer_lag = Gauge(
            "retro_consumer_lag_messages",
            "Messages behind the log end, as the worker measures it (kafka-exporter's "
            "kafka_consumergroup_lag survives a dead worker; this is the supplement)",
            ["consumergroup", "topic", "partition"], registry=r,
        )
        self.committed_offset = Gauge(
            "retro_consumer_committed_offset",
            "A group's committed offset, as the worker reads it (kafka-exporter: "
            "kafka_consumergroup_current_offset)", ["consumergroup", "topic", "partition"],
            registry=r,
        )
        self.oldest_age = Gauge(
            "retro_consumer_oldest_unprocessed_age_seconds",
            "Age of the oldest record a group has not committed yet, per topic (0: no lag)",
            ["consumergroup", "topic"], registry=r,
        )
        self.quota_share = Gauge(
            "retro_model_quota_share",
            "This pod's share of the provider quota (its lane partitions / all)", registry=r,
        )
        self.quota_limit = Gauge(
            "retro_model_quota_limit_per_minute",
            "This pod's client-side limit: requests or tokens per minute", ["kind"], registry=r,
        )
        self.rate_limit = Gauge(
            "retro_model_rate_limit_per_minute",
            "The provider quota the buckets divide among pods, requests or tokens per minute: "
            "the lower of RETRO_MODEL__RPM/TPM (source configured) and what the provider or "
            "proxy advertises in x-ratelimit-limit-* (source advertised)", ["kind", "source"],
            registry=r,
        )
        self.bucket_available = Gauge(
            "retro_model_bucket_available",
            "What the client-side RPM/TPM bucket holds right now", ["kind"], registry=r,
        )
        self.provider_remaining = Gauge(
            "retro_model_provider_remaining",
            "The provider's x-ratelimit-remaining-* on its last answer", ["kind"], registry=r,
        )
        self.provider_limit = Gauge(
            "retro_model_provider_limit",
            "The provider's x-ratelimit-limit-* on its last answer", ["kind"], registry=r,
        )
        self.genai_tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens per model call (OpenTelemetry gen_ai.client.token.usage)",
            ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model",
             "gen_ai_token_type"], registry=r, buckets=GENAI_TOKEN_BUCKETS,
        )
        self.genai_duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "Model call duration by outcome (OpenTelemetry gen_ai.client.operation.duration; "
            "error_type empty on success)",
            ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model",
             "error_type"], registry=r, buckets=GENAI_DURATION_BUCKETS,
        )
        self.build_info = Gauge(
            "retro_build_info", "Always 1; the running version", ["version", "python"],
            registry=r,
        )
        self.build_info.labels(_version(), platform.python_version()).set(1)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.report_updates = Counter(
            "retro_report_updates_total", "Fragments merged into reports", ["result"],
            registry=r,  # result: applied | duplicate | partial
        )
        self.notifications = Counter(
            "retro_notifications_total",
            "Incident notifications by sink and outcome: sent (a request taken), retried (an "
            "attempt that failed and is tried again), failed (given up for this round), "
            "rejected (refused for good, not sent again), dropped (the send queue was full)",
            ["sink", "outcome"], registry=r,
        )
        self.start_at_zero()

    def start_at_zero(self) -> None:
        """Create the labelled series whose values are known up front, at 0.

        A series is born on first use, so a rare event (a cache hit, a split, a retry
        refusal) showed as "No data" until it happened; at 0 it is a flat line.
        """
        for lane in LANES:
            for status in CALL_STATUSES:
                self.model_calls.labels(lane, status)
            for kind in ("prompt", "completion"):
                self.tokens.labels(lane, kind)
            for limit in (*QUOTA_KINDS, "gateway", "unknown"):
                self.rate_limited.labels(lane, limit)
            for reason in RETRY_REASONS:
                self.retries.labels(lane, reason)
            for reason in REVIEW_REASONS:
                self.reviews.labels(lane, reason)
            for reason in SPLIT_REASONS:
                self.splits.labels(lane, reason)
            for result in ("hit", "miss"):
                self.cache.labels(lane, result)
            self.retry_budget_exhausted.labels(lane)
            self.fragments.labels(lane)
            self.concurrency_limit.labels(lane)
            self.in_flight.labels(lane)
            self.model_latency.labels(lane)
        for kind in QUOTA_KINDS:
            self.quota_limit.labels(kind)
            self.bucket_available.labels(kind)
        for result in ("healthy", "unhealthy"):
            self.redrive_probes.labels(result)
        # increase() needs a sample before the first dead letter, or it reads 0
        for stage, reasons in DEADLETTER_REASONS.items():
            for reason in reasons:
                self.deadletters.labels(stage, reason)
        for result in ("applied", "duplicate", "partial"):
            self.report_updates.labels(result)
        for sink in NOTIFY_SINKS:
            for outcome in NOTIFY_OUTCOMES:
                self.notifications.labels(sink, outcome)


class Series:
    """A labelled metric's children, each looked up once: ``labels()`` validates and
    locks on every call, too much to pay per record."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


def _version() -> str:
    try:
        return metadata.version("retro-stream")
    except metadata.PackageNotFoundError:
        return "unknown"
